"""The rollout engine against the per-turn loop it replaces, on real multi-turn envs.

A tiny float32 transformer plays the hidden-rule game (chat template) and the calculator tool
task (raw text). With greedy decoding the engine's trajectories equal the per-turn reference's
(`agent_loop.run_per_turn`) token for token, whatever the slot count (including runs that
compact the cache); its log-probs are the trainer's (also in rows filled by copying a group's shared prefill); sampled runs are the
same for any slot count and env latency; a hung env times out without stalling the others.
"""
import random
import threading
import time
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np

from agentrl.envs import registry
from agentrl.harness import recipe
from agentrl.models import lora
from agentrl.models import policy
from agentrl.models import transformer
from agentrl.rollout import agent_loop
from agentrl.rollout import engine as engine_lib
from agentrl.rollout import engine_programs
from agentrl.rollout import sampler as sampler_lib

TOK = recipe.task_tokenizer(mlc.ConfigDict(dict(name="hidden_rule", family="mixed",
                                                max_turns=3)))
CFG = transformer.Config(vocab=TOK.vocab_size, width=32, depth=2, heads=4, kv_heads=2,
                         head_dim=8, mlp=64, dtype=jnp.float32)
GRAPHDEF, PARAMS = nnx.split(transformer.Transformer(CFG, rngs=nnx.Rngs(0)))
ENVS = {
    "hidden_rule": (lambda: registry.make("hidden_rule", family="mixed", max_turns=3), True),
    "calculator": (lambda: registry.make("calculator", max_turns=3), False),
}
KW = dict(max_turns=3, max_new_tokens=8, max_len=420)
SEEDS = list(range(5))


class _Slow:
  """An env that sleeps a random few milliseconds per step (completion order varies)."""

  def __init__(self, env, rng):
    self.env, self.rng = env, rng

  def __getattr__(self, name):  # system_prompt, max_turns, ...: the wrapped env's
    return getattr(self.env, name)

  def reset(self, seed):
    time.sleep(self.rng.random() * 0.01)
    return self.env.reset(seed)

  def step(self, action):
    time.sleep(self.rng.random() * 0.01)
    return self.env.step(action)


def _run_engine(name, *, slots, chunk=3, envs=None, **kwargs):
  make, chat = ENVS[name]
  engine = engine_lib.Engine(GRAPHDEF, pad_id=TOK.pad_id, slots=slots, chunk=chunk)
  return engine.run(PARAMS, TOK, envs or [make() for _ in SEEDS], SEEDS, chat_template=chat,
                    **KW, **kwargs)


class EngineTest(parameterized.TestCase):

  @parameterized.parameters("hidden_rule", "calculator")
  def test_greedy_equals_the_per_turn_loop(self, name):
    make, chat = ENVS[name]
    sampler = sampler_lib.Sampler(GRAPHDEF, pad_id=TOK.pad_id)
    old, old_metrics = agent_loop.run_per_turn(
        sampler, PARAMS, TOK, [make() for _ in SEEDS], SEEDS, rng=jax.random.key(0),
        greedy=True, chat_template=chat, **KW)
    self.assertGreater(old_metrics["rollout/turns_mean"], 1.0)  # really multi-turn
    for slots in (2, 8):
      compactions = []
      original = engine_programs.compact

      def spy(cache, live, original=original, compactions=compactions):
        compactions.append(1)   # traced once per compiled cache size
        return original(cache, live)

      with mock.patch.object(engine_programs, "compact", spy):
        new, metrics = _run_engine(name, slots=slots, rng=jax.random.key(0), greedy=True)
      if slots == 2 and name == "hidden_rule":  # long transcripts: the pointer wraps
        self.assertNotEmpty(compactions, "the test should exercise cache compaction")
      for a, b in zip(old, new):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_array_equal(a.loss_mask, b.loss_mask)
        np.testing.assert_array_equal(a.turn, b.turn)
        np.testing.assert_allclose(a.sampler_logp, b.sampler_logp, atol=1e-5)
        self.assertEqual((a.reward, a.done, a.truncated), (b.reward, b.done, b.truncated))
      self.assertGreater(metrics.pop("rollout/prefill_tokens"), 0)
      self.assertEqual(metrics, old_metrics)

  def test_logprobs_are_the_trainers(self):
    trajs, _ = _run_engine("hidden_rule", slots=3, rng=jax.random.key(1), temperature=1.0)
    model = nnx.merge(GRAPHDEF, PARAMS)
    for t in trajs:
      T = len(t.tokens)
      logp = np.asarray(policy.token_logprobs(
          model, jnp.asarray(t.tokens)[None], jnp.arange(T)[None], jnp.ones((1, T), bool),
          temperature=1.0))[0]
      sampled = t.loss_mask > 0
      np.testing.assert_allclose(t.sampler_logp[sampled], logp[sampled], atol=1e-5)

  def test_lora_policy_decodes_over_merged_weights(self):
    adapters = lora.Adapters(CFG, lora.LoraConfig(rank=2, alpha=4.0), rngs=nnx.Rngs(1))
    graphdef, params = lora.attach(GRAPHDEF, PARAMS, *nnx.split(adapters))
    # Non-zero B (fresh adapters are the identity), so the adapters change the policy.
    params = jax.tree.map(lambda x: x, params)
    noise = iter(jax.random.split(jax.random.key(2), 64))
    ad = params["lora"]
    for name in list(ad.keys()):
      if "_b_" in name:
        ad[name][...] = 0.3 * jax.random.normal(next(noise), ad[name].shape)
    make, chat = ENVS["hidden_rule"]
    runs = {}
    for unroll in (True, False):  # merged per-layer weights vs the adapters in the layer scan
      engine = engine_lib.Engine(graphdef, pad_id=TOK.pad_id, slots=4, chunk=3,
                                 unroll_layers=unroll)
      runs[unroll] = engine.run(params, TOK, [make() for _ in SEEDS], SEEDS, chat_template=chat,
                                rng=jax.random.key(0), greedy=True, **KW)[0]
    base = _run_engine("hidden_rule", slots=4, rng=jax.random.key(0), greedy=True)[0]
    self.assertTrue(any(len(a.tokens) != len(b.tokens) or (a.tokens != b.tokens).any()
                        for a, b in zip(runs[True], base)), "the adapters should matter")
    model = nnx.merge(graphdef, params)
    for a, b in zip(runs[True], runs[False]):
      np.testing.assert_array_equal(a.tokens, b.tokens)
      T, sampled = len(a.tokens), a.loss_mask > 0
      logp = np.asarray(policy.token_logprobs(
          model, jnp.asarray(a.tokens)[None], jnp.arange(T)[None], jnp.ones((1, T), bool),
          temperature=1.0))[0]
      np.testing.assert_allclose(a.sampler_logp[sampled], logp[sampled], atol=1e-5)

  def test_sampling_does_not_depend_on_slots_or_env_latency(self):
    make, _ = ENVS["hidden_rule"]
    reference, _ = _run_engine("hidden_rule", slots=8, rng=jax.random.key(2))
    slow = [_Slow(make(), random.Random(i)) for i in SEEDS]
    other, _ = _run_engine("hidden_rule", slots=3, envs=slow, rng=jax.random.key(2))
    for a, b in zip(reference, other):
      np.testing.assert_array_equal(a.tokens, b.tokens)

  def test_episodes_arriving_mid_run_sample_as_if_given_up_front(self):
    make, _ = ENVS["hidden_rule"]
    flags = [i == 3 for i in SEEDS]
    reference, ref_metrics = _run_engine("hidden_rule", slots=8, rng=jax.random.key(2),
                                         greedy=flags)
    envs = [make() for _ in SEEDS]
    coming = [(envs[0], SEEDS[0]), (envs[1], SEEDS[1])] + [
        (envs[i], SEEDS[i], flags[i]) for i in SEEDS[2:]]
    polls, ended, sampled, decoded = [], {}, [], {i: [] for i in SEEDS}

    def arrivals(wait_s):
      polls.append(wait_s)
      if not coming:
        return None
      if len(polls) == 1:            # two at the start, then one every third round
        return [coming.pop(0), coming.pop(0)]
      return [coming.pop(0)] if len(polls) % 3 == 0 else []

    def watch(kind, env, traj):
      if kind == "ended":
        ended[envs.index(env)] = traj
      elif kind == "decoded":   # a chunk's new ids
        decoded[envs.index(env)] += traj.tolist()
      else:
        sampled.append(envs.index(env))

    engine = engine_lib.Engine(GRAPHDEF, pad_id=TOK.pad_id, slots=8, chunk=3)
    trajs, metrics = engine.run(PARAMS, TOK, [], [], rng=jax.random.key(2), arrivals=arrivals,
                                watch=watch, chat_template=True, **KW)
    self.assertEqual(trajs, [])      # they went to watch
    self.assertEqual(sorted(ended), list(SEEDS))
    for i, traj in ended.items():
      np.testing.assert_array_equal(traj.tokens, reference[i].tokens)
      np.testing.assert_allclose(traj.sampler_logp, reference[i].sampler_logp, atol=1e-5)
      self.assertEqual(decoded[i], traj.tokens[traj.loss_mask > 0].tolist())
    self.assertLen(sampled, sum(len(t.turn_rewards) for t in reference))
    for key in ("rollout/sampled_tokens", "env/steps", "env/resets"):
      self.assertEqual(metrics[key], ref_metrics[key])
    with self.assertRaisesRegex(ValueError, "pass watch="):
      engine.run(PARAMS, TOK, [], [], rng=jax.random.key(2), arrivals=arrivals, **KW)

  def test_a_group_shares_one_prefill(self):
    G = 3
    grouped = [s for s in SEEDS for _ in range(G)]
    make, _ = ENVS["hidden_rule"]
    engine = engine_lib.Engine(GRAPHDEF, pad_id=TOK.pad_id, slots=16, chunk=3)
    trajs, metrics = engine.run(PARAMS, TOK, [make() for _ in grouped], grouped,
                                rng=jax.random.key(3), max_turns=1, max_new_tokens=8,
                                max_len=420, chat_template=True)
    # One prefill per distinct prompt (some seeds of this game share theirs).
    prompt_tokens = sum(len(p) - 1 for p in {tuple(t.tokens[:t.prompt_len]) for t in trajs})
    self.assertEqual(metrics["rollout/prefill_tokens"], prompt_tokens)
    model = nnx.merge(GRAPHDEF, PARAMS)    # rows filled by copy sample the trainer's log-probs
    for t in trajs:
      T = len(t.tokens)
      logp = np.asarray(policy.token_logprobs(
          model, jnp.asarray(t.tokens)[None], jnp.arange(T)[None], jnp.ones((1, T), bool),
          temperature=1.0))[0]
      sampled = t.loss_mask > 0
      np.testing.assert_allclose(t.sampler_logp[sampled], logp[sampled], atol=1e-5)
    self.assertFalse(all(np.array_equal(a.tokens, b.tokens)       # each row draws its own
                         for a, b in zip(trajs[::G], trajs[1::G])))

  def test_adaptive_temperature(self):
    # tau = 0 samples exactly as the plain temperature; tau > 0 reports each token's log-prob
    # under its own entropy-adapted temperature, recomputed here from the trainer's logits.
    plain, _ = _run_engine("hidden_rule", slots=4, rng=jax.random.key(3), temperature=0.8)
    stats = (0.0, 1.0, 0.5, 0.7, 1.5, -2.0)   # tau, signed, m, s, pos_max, neg_min
    same, _ = _run_engine("hidden_rule", slots=4, rng=jax.random.key(3), temperature=0.8,
                          adaptive_temperature=stats)
    for a, b in zip(plain, same):
      np.testing.assert_array_equal(a.tokens, b.tokens)
    adapted, _ = _run_engine("hidden_rule", slots=4, rng=jax.random.key(3), temperature=0.8,
                             adaptive_temperature=(0.5,) + stats[1:])
    model = nnx.merge(GRAPHDEF, PARAMS)
    for t in adapted:
      T = len(t.tokens)
      logits_TV = model(jnp.asarray(t.tokens)[None], jnp.arange(T)[None],
                        jnp.ones((1, T), bool))[0]
      temp_T1 = sampler_lib.entropy_temperature(logits_TV, 0.8, jnp.asarray((0.5,) + stats[1:]))
      logp_TV = jax.nn.log_softmax(logits_TV / temp_T1, axis=-1)
      want_T = np.asarray(jnp.take_along_axis(logp_TV[:-1], jnp.asarray(t.tokens[1:])[:, None],
                                              axis=-1)[:, 0])
      sampled = t.loss_mask[1:] > 0
      np.testing.assert_allclose(t.sampler_logp[1:][sampled], want_T[sampled], atol=1e-5)
    with self.assertRaisesRegex(ValueError, "adaptive_temperature must be 6 finite floats"):
      _run_engine("hidden_rule", slots=4, rng=jax.random.key(3), adaptive_temperature=(1, 2))

  def test_top_k_one_is_greedy(self):
    greedy, _ = _run_engine("calculator", slots=8, rng=jax.random.key(0), greedy=True)
    top1, _ = _run_engine("calculator", slots=8, rng=jax.random.key(5), top_k=1,
                          temperature=0.7, logp_mode="truncated")
    for a, b in zip(greedy, top1):
      np.testing.assert_array_equal(a.tokens, b.tokens)
      np.testing.assert_allclose(b.sampler_logp, 0.0, atol=1e-6)  # truncated to one token

  def test_a_hung_env_times_out_and_the_rest_finish(self):
    make, _ = ENVS["calculator"]

    release = threading.Event()
    self.addCleanup(release.set)

    class Hung(_Slow):
      def step(self, action):
        release.wait()            # hangs until the test ends
        return self.env.step(action)

    envs = [Hung(make(), random.Random(0)) if i == 1 else make() for i in SEEDS]
    engine = engine_lib.Engine(GRAPHDEF, pad_id=TOK.pad_id, slots=4, chunk=3,
                               env_timeout_s=0.5)
    trajs, metrics = engine.run(PARAMS, TOK, envs, SEEDS, rng=jax.random.key(0),
                                chat_template=False, **KW)
    self.assertFalse(release.is_set())   # returned while the hung step still runs
    self.assertEqual(metrics["env/env_timeouts"], 1.0)
    hung = trajs[1]
    self.assertTrue(hung.done)
    self.assertEqual(hung.turn_rewards, [0.0])
    self.assertIn("did not answer within 0.5s", hung.infos[0]["error"])
    self.assertTrue(all(len(t.turn_rewards) >= 1 for t in trajs))

  def test_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, "slots, chunk and env_workers >= 1"):
      engine_lib.Engine(GRAPHDEF, pad_id=0, slots=0)
    with self.assertRaisesRegex(ValueError, "one seed per env"):
      _run_engine("hidden_rule", slots=2, envs=[ENVS["hidden_rule"][0]()],
                  rng=jax.random.key(0))
    with self.assertRaisesRegex(ValueError, "env_timeout_s must be > 0"):
      engine_lib.Engine(GRAPHDEF, pad_id=0, env_timeout_s=0)
    with self.assertRaisesRegex(ValueError, "top_p must be in"):
      _run_engine("hidden_rule", slots=2, rng=jax.random.key(0), top_p=0.0)


if __name__ == "__main__":
  absltest.main()
