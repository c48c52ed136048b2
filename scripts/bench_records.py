r"""What trajectory records cost a record step: writing them, and the viewer page.

  python scripts/bench_records.py                       # the three shapes below, ~1 minute

For each batch shape, a synthetic scored batch (random token ids, so the files compress as
badly as they can; 4-turn rows: a prompt, then model and env turns) is recorded the way the
loop records a step (`trajectories.record`: the rows' JSON with every token's text, then the
whole batch as .npz), and a 3-step run of such records is rendered by the viewer:

  agent cpu    256 rows of 64 tokens, 16 of 32 groups x 4 rows, the hidden-rule game's
               SentencePiece tokenizer (experiments/agents/agent.py's cpu preset)
  smollm2      64 rows of 1024 tokens, 16 groups x 4 rows, SmolLM2's byte-level BPE
  pod slice    512 rows of 2048 tokens, 16 groups x 4 rows, SmolLM2's tokenizer (a pod
               step's batch is several such slices: the whole-batch file grows with it)

Times are the fastest of `--repeats` (the machine may be shared).
"""
import json
import os
import tempfile
import time

from absl import app
from absl import flags
import jax
import numpy as np

from agentrl.envs import registry
from agentrl.harness import recipe
from agentrl.models import hf
from agentrl.models import tokenizer as tokenizer_lib
from agentrl.records import metrics as metrics_lib
from agentrl.records import trajectories
from agentrl.records import viewer
from agentrl import types

_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats per shape (the fastest is kept).")

SHAPES = (("agent cpu", 256, 64, 32, "hidden_rule"), ("smollm2", 64, 1024, 16, "smollm2"),
          ("pod slice", 512, 2048, 128, "smollm2"))


def tokenizer(name: str) -> tokenizer_lib.Tokenizer:
  if name == "smollm2":
    return tokenizer_lib.load(hf.smollm2_path())
  return recipe.task_tokenizer(registry.task_config("hidden_rule", names=registry.NAMES,
                                                    family="guess", max_turns=7,
                                                    style="compact"))


def synthetic_batch(B: int, T: int, vocab: int, seed: int = 0) -> types.Batch:
  """A scored batch of 4-turn rows: prompt T/4, then model / env turns of T/8 tokens."""
  rng = np.random.default_rng(seed)
  q = T // 8
  turn_T = np.concatenate([np.full(2 * q, -1), np.repeat(np.arange(3), 2 * q)])[:T]
  model_T = np.concatenate([np.zeros(2 * q)] + [np.r_[np.ones(q), np.zeros(q)]] * 3)[:T]
  ones = np.ones((B, T), np.float32)
  return types.Batch(
      tokens_BT=rng.integers(3, vocab, (B, T)).astype(np.int32),
      positions_BT=np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)),
      input_mask_BT=np.ones((B, T), bool), loss_mask_BT=ones * model_T,
      turn_BT=np.broadcast_to(turn_T.astype(np.int32), (B, T)),
      reward_B=rng.random(B).astype(np.float32),
      adv_BT=rng.normal(size=(B, T)).astype(np.float32) * model_T,
      old_logp_BT=-rng.exponential(size=(B, T)).astype(np.float32) * model_T,
      sampler_logp_BT=-rng.exponential(size=(B, T)).astype(np.float32) * model_T,
      entropy_BT=rng.exponential(size=(B, T)).astype(np.float32) * model_T,
      version_B=np.zeros(B, np.int32))


def fastest(fn, repeats: int) -> float:
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - start)
  return best


def measure(name: str, B: int, T: int, prompts: int, tok_name: str, repeats: int) -> list:
  tok = tokenizer(tok_name)
  batch = jax.device_put(synthetic_batch(B, T, tok.vocab_size))
  with tempfile.TemporaryDirectory() as run_dir:
    rows_only = trajectories.Settings(every=1, prompts_per_step=prompts, full_batch=False)
    whole = trajectories.Settings(every=1, prompts_per_step=prompts)
    t_rows = fastest(lambda: trajectories.record(run_dir, 1, batch, settings=rows_only,
                                                 tokenizer=tok), repeats)
    t_all = fastest(lambda: trajectories.record(run_dir, 1, batch, settings=whole,
                                                tokenizer=tok), repeats)
    for step in (2, 3):
      trajectories.record(run_dir, step, batch, settings=whole, tokenizer=tok)
    with open(os.path.join(run_dir, metrics_lib.JSONL), "w") as f:
      f.writelines(json.dumps({"step": s, "reward": 0.5}) + "\n" for s in (1, 2, 3))
    t_view = fastest(lambda: viewer.write(run_dir), repeats)
    size = lambda path: os.path.getsize(path) / 2**20
    return [name, f"{B} x {T}", len(trajectories.read_step(run_dir, 1)[1]),
            f"{t_rows:.2f}", f"{t_all - t_rows:.2f}",
            f"{size(trajectories.step_path(run_dir, 1)):.2f}",
            f"{size(trajectories.batch_path(run_dir, 1)):.1f}", f"{t_view:.2f}",
            f"{size(os.path.join(trajectories.directory(run_dir), 'viewer.html')):.1f}"]


def main(argv):
  del argv
  rows = [measure(*shape, repeats=_REPEATS.value) for shape in SHAPES]
  print(metrics_lib.format_table(
      ["shape", "batch", "rows kept", "rows + text (s)", "whole batch (s)", "jsonl.gz (MB)",
       "npz (MB)", "viewer, 3 steps (s)", "html (MB)"], rows))


if __name__ == "__main__":
  app.run(main)
