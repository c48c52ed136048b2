"""The experiment harness: the RL config (rl_config), the building blocks an experiment's
train() composes (recipe), its command line (cli), the supervised warm start (sft) and
host-relabelled group rollouts (relabel)."""
