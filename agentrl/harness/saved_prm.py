# pylint: disable=invalid-name
"""A trained process reward model read back: checked against a run, loaded, and scoring turns.

  saved_prm.check("runs/prm", run_config, flag="config.prm", run="runs/grpo")
  logits_fn, prm_params = saved_prm.load("runs/prm", graphdef, params)
  score_BU, mask_BU = saved_prm.step_scores(logits_fn, prm_params, trajs, max_steps=U,
                                             max_len=T, pad_id=tok.pad_id, batch_size=32)

An experiments.preference.prm run leaves <workdir>/prm, a checkpoint of {"backbone", "head"}:
its warm-started policy's params and a `heads.StepHead`. The backbone is rebuilt from the
evaluated or trained run's own policy (its graph and params are the restore template), so the
PRM must share that run's model and tokenizer (`check`). Steps are model turns, as the PRM
experiment trains them (`rewards.process.step_ends`); a step's score is sigmoid of its logit at
the step's last sampled token. Used by experiments/agents/prm_rl.py (dense turn rewards) and
experiments/eval.py (best-of-n and PRM-weighted voting).
"""
import os

import jax
import numpy as np

from agentrl import checkpoint
from agentrl import configs
from agentrl.envs import registry
from agentrl.harness import recipe
from agentrl.models import heads
from agentrl.records import rundir
from agentrl.rewards import process
from agentrl.rollout import pack

PRM_SUBDIR = "prm"   # where experiments.preference.prm saves its PRM inside its workdir


def _model_differences(prm_model, run_model) -> list[tuple[str, object, object]]:
  """(key, PRM value, run value) of every config.model key whose values differ."""
  prm_model, run_model = prm_model.to_dict(), run_model.to_dict()
  return [(f"model.{k}", prm_model.get(k), run_model.get(k))
          for k in sorted(set(prm_model) | set(run_model)) if prm_model.get(k) != run_model.get(k)]


def same_tokens(tok_a, tok_b) -> bool:
  """Whether two tokenizers have the same ids, each decoding to the same text."""
  n = tok_a.vocab_size
  return n == tok_b.vocab_size and all(tok_a.decode([i]) == tok_b.decode([i]) for i in range(n))


def _tokenizer_differs(prm_config, run_config) -> bool:
  """Whether a scratch model's task tokenizers differ. It is built from the env's own texts
  (`recipe.task_tokenizer`), so the same constructor arguments give the same tokenizer; other
  arguments are compared by building both."""
  if prm_config.model.init != "scratch":
    return False   # a pretrained model's tokenizer is its model.path's, compared with the model
  if registry.constructor_kwargs(prm_config.task) == registry.constructor_kwargs(
      run_config.task):
    return False
  return not same_tokens(recipe.task_tokenizer(prm_config.task),
                         recipe.task_tokenizer(run_config.task))


def check(prm_dir: str, run_config, *, flag: str, run: str = "this run") -> None:
  """ConfigError unless `prm_dir` is a finished PRM run on `run_config`'s model and tokenizer.

  Args:
    prm_dir: the --workdir of an experiments.preference.prm run.
    run_config: the config of the run whose token ids the PRM will score.
    flag: the setting that named prm_dir ("config.prm"), for the messages.
    run: what run_config belongs to, for the messages ("runs/grpo").
  """
  configs.require(bool(prm_dir), f"{flag} is empty: give the --workdir of an "
                  "experiments.preference.prm run (python -m experiments.preference.prm "
                  "--workdir=DIR)")
  configs.require(os.path.isdir(os.path.join(prm_dir, PRM_SUBDIR)),
                  f"{flag}={prm_dir!r} has no {PRM_SUBDIR}/ checkpoint; run "
                  f"python -m experiments.preference.prm --workdir={prm_dir} first")
  prm_config = rundir.read_config(prm_dir)
  diffs = _model_differences(prm_config.model, run_config.model)
  if prm_config.task.name != run_config.task.name:
    diffs.insert(0, ("task.name", prm_config.task.name, run_config.task.name))
  elif not diffs and _tokenizer_differs(prm_config, run_config):
    diffs.append(("task (its scratch tokenizer)", dict(prm_config.task), dict(run_config.task)))
  configs.require(not diffs, f"{flag}={prm_dir!r} was trained with another model or tokenizer "
                  f"than {run}: " + "; ".join(f"{k} {a!r} (PRM) vs {b!r} ({run})"
                                              for k, a, b in diffs)
                  + ". The PRM's backbone reads the run's token ids: train a PRM on the run's "
                  "model and task (the same config.model and task)")


def load(prm_dir: str, graphdef, params, *, seed: int = 0, flag: str = "prm"):
  """(logits_fn, prm params) of the PRM saved in <prm_dir>/prm.

  `graphdef` and `params` (the run's policy, LoRA merged) are the backbone's graph and restore
  template; logits_fn(params, tokens_BT, positions_BT, input_mask_BT, step_end_BU,
  step_mask_BU) -> [B, U] is `heads.policy_prm_logits`. A checkpoint whose shapes do not fit the
  template is a ConfigError naming `flag` and both sides.
  """
  head_graphdef, head_params = heads.policy_step_head(graphdef, params, seed=seed)
  ckpt = checkpoint.Checkpointer(os.path.join(prm_dir, PRM_SUBDIR), save_every=1, keep=1)
  try:
    tree, info = ckpt.restore({"params": {"backbone": params, "head": head_params}})
  except checkpoint.CheckpointError as e:
    raise configs.ConfigError(f"{flag}={prm_dir!r}: its PRM does not fit the run's policy "
                              f"({e})") from None
  finally:
    ckpt.close()
  print(f"PRM: {prm_dir} ({info.get('steps')} steps, held-out step accuracy "
        f"{info.get('held_out_step_accuracy')}).", flush=True)
  return heads.policy_prm_logits(graphdef, head_graphdef), tree["params"]


def step_scores(logits_fn, prm_params, trajs, *, max_steps: int, max_len: int, pad_id: int,
                batch_size: int):
  """The PRM's probability of each model turn of each trajectory, float32 [B, U], and its mask.

  Rows go through one compiled shape, `batch_size` at a time (the last chunk padded by
  repeating its last row, dropped after); a turn ending past max_len (the pack cut) is masked,
  and masked turns score 0.
  """
  batch = pack.pack_numpy(trajs, max_len=max_len, pad_id=pad_id, min_len=max_len)
  ends, masks = zip(*(process.step_ends(t.turn[None], t.loss_mask[None], max_steps=max_steps)
                      for t in trajs))
  end_BU = np.concatenate(ends)
  mask_BU = np.concatenate(masks) * (end_BU < batch.tokens_BT.shape[1])
  data = (np.asarray(batch.tokens_BT), np.asarray(batch.positions_BT),
          np.asarray(batch.input_mask_BT), end_BU, mask_BU)
  probs = jax.jit(lambda p, *xs: jax.nn.sigmoid(logits_fn(p, *xs)))
  b, chunks = len(trajs), []
  for lo in range(0, b, batch_size):
    index = np.minimum(np.arange(lo, lo + batch_size), b - 1)
    chunks.append(np.asarray(jax.device_get(probs(prm_params, *(x[index] for x in data)))))
  return (np.concatenate(chunks)[:b] * mask_BU).astype(np.float32), mask_BU
