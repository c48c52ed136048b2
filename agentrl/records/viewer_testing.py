"""Test helper: a small run directory with trajectory records written by the library
(`trajectories.make_rows` + `write_step`) and a metrics.jsonl with one alarm firing.

Two record steps (1 and 3) of two groups of three rows each. Every row is a two-turn episode:
a prompt, a model turn, the env's reply, a second model turn. Row 0 of each group is rewarded
(success, positive advantages), row 1 is not (failure, negative advantages) and its second
turn holds markup that must stay text ("</script><img ...>"), row 2 is in between. Rows 0 and
1 differ in their second model turn, so their diff has inserted and deleted tokens.
"""
import json
import os

import numpy as np

from agentrl.records import metrics as metrics_lib
from agentrl.records import trajectories
from agentrl.rollout import agent_loop

HOSTILE = "</script><img src=x onerror=alert(1)>"
VOCAB = ["<pad>", "<s>", "Guess", " the", " number", ":", " 50", " higher", " 75", " 62", "!",
         HOSTILE, " correct", " wrong", "\n"]
GROUP_SIZE = 3
STEPS = (1, 3)
ALARM = "reward_divergence"
ALARM_STEPS = (2, 3)         # step 2 is not a record step: its link goes to step 1
# (tokens, role per token: p prompt, m model, e env) of each row of a group; T = 12.
_PROMPT = [1, 2, 3, 4, 5]
_ROWS = (
    (_PROMPT + [6, 10, 7, 8, 12, 10], "pppppmmemmm"),   # Guess the number: 50! higher 75 correct!
    (_PROMPT + [6, 10, 7, 9, 11, 13], "pppppmmemmm"),   # ... 62 </script>... wrong
    (_PROMPT + [6, 10, 7, 8, 13], "pppppmmemm"),        # ... 75 wrong
)
_REWARDS = (1.0, 0.0, 0.5)
_ADVS = (1.0, -1.5, 0.25)    # per row; the second group's are halved


def decode(ids) -> str:
  return "".join(VOCAB[i] for i in ids)


def _batch(step: int) -> tuple[dict[str, np.ndarray], list[agent_loop.Trajectory]]:
  """Two groups of the three rows above, right-padded to T = 12."""
  B, T = 2 * GROUP_SIZE, 12
  batch = {k: np.zeros((B, T), np.float32) for k in (
      "input_mask_BT", "loss_mask_BT", "sampler_logp_BT", "old_logp_BT", "adv_BT",
      "entropy_BT")}
  batch["tokens_BT"] = np.zeros((B, T), np.int32)
  batch["turn_BT"] = np.full((B, T), -1, np.int32)
  batch["reward_B"] = np.zeros(B, np.float32)
  batch["version_B"] = np.full(B, step - 1, np.int32)
  batch["truncated_B"] = np.zeros(B, bool)
  trajs = []
  for r in range(B):
    g, k = divmod(r, GROUP_SIZE)
    tokens, roles = _ROWS[k]
    n = len(tokens)
    model = np.array([c == "m" for c in roles], np.float32)
    turn = np.cumsum([c == "m" and (i == 0 or roles[i - 1] != "m") for i, c in enumerate(roles)])
    turn = np.where(np.array([c == "p" for c in roles]), -1, turn - 1)
    batch["tokens_BT"][r, :n] = tokens
    batch["input_mask_BT"][r, :n] = 1
    batch["loss_mask_BT"][r, :n] = model
    batch["turn_BT"][r, :n] = turn
    logp = -0.1 - 0.3 * np.arange(n) / n
    batch["sampler_logp_BT"][r, :n] = logp * model
    batch["old_logp_BT"][r, :n] = logp + 0.05 * model  # trainer slightly above the sampler
    batch["adv_BT"][r, :n] = _ADVS[k] / (1 + g) * model
    batch["entropy_BT"][r, :n] = np.linspace(0.1, 2.0, n)
    batch["reward_B"][r] = _REWARDS[k]
    trajs.append(agent_loop.Trajectory(
        tokens=np.asarray(tokens, np.int32), loss_mask=model, turn=turn.astype(np.int32),
        sampler_logp=logp * model, turn_rewards=[0.0, _REWARDS[k]], reward=_REWARDS[k],
        done=True, truncated=False, prompt_len=len(_PROMPT),
        infos=[{"success": False}, {"success": _REWARDS[k] == 1.0, "note": HOSTILE}]))
  return batch, trajs


def write_run(run_dir: str) -> dict[int, list[dict]]:
  """Writes the records of STEPS and metrics.jsonl into `run_dir`; returns the rows by step."""
  by_step = {}
  for step in STEPS:
    batch, trajs = _batch(step)
    rows = trajectories.make_rows(batch, range(len(trajs)), group_size=GROUP_SIZE,
                                  trajectories=trajs, decode=decode)
    trajectories.write_step(run_dir, step, rows, {"rows_in_batch": len(trajs),
                                                  "group_size": GROUP_SIZE})
    by_step[step] = rows
  with open(os.path.join(run_dir, metrics_lib.JSONL), "w") as f:
    for step in range(1, max(STEPS) + 1):
      record = {"step": step, "reward": 0.5, "success": 1 / 3, "entropy": 1.0, "loss": 0.1,
                f"alarm/{ALARM}": float(step in ALARM_STEPS), "alarm/entropy_collapse": 0.0}
      f.write(json.dumps(record) + "\n")
  return by_step
