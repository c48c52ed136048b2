"""Turn-level credit assignment for multi-turn agents: one module per published method.

Each module turns per-turn signals (an information gain, a counterfactual policy shift, a
semantic-outcome potential, ...) into turn rewards `[B, U]` and a group-normalised advantage,
following the authors' released code; `agentrl.advantages.estimators.broadcast_turn_to_tokens`
carries a turn value to the turn's policy tokens. Rows [i*G, (i+1)*G) are prompt i's G trajectories
and valid turns are a prefix of each row. The math and defaults are in docs/algorithms.md §5.
Branching rollouts: `tree` turns forked trajectories into a rollout tree and a training batch;
`treerl`, `spo_tree`, `latr` and `restart` (R3L, CSO) are the methods built on it (§5.9).
"""
