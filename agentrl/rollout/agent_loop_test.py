"""Tests for agentrl.rollout.agent_loop with the tiny transformer and a character tokenizer."""
from absl.testing import absltest
from flax import nnx
import jax
import numpy as np

from agentrl.models import transformer
from agentrl.rollout import agent_loop
from agentrl.rollout import engine as engine_lib
from agentrl.rollout import pack
from agentrl.rollout import sampler as sampler_lib

MAX_LEN = 64


class CharTokenizer:
  """Deterministic test tokenizer: specials, printable ASCII, and lossy aliases.

  Ids 0-6 are special tokens, 7-101 printable ASCII, 102-127 aliases that decode to 'a'-'z'
  like ids for 'a'-'z' do, and every id >= 128 decodes to some printable character. So
  encode(decode(ids)) != ids for most sampled ids: re-tokenizing would change the actions.
  """
  SPECIALS = ["<pad>", "<bos>", "<eos>", "<eot>", "<sys>", "<user>", "<asst>"]
  ROLES = {"system": "<sys>", "user": "<user>", "assistant": "<asst>"}

  def __init__(self):
    self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
    self.end_of_turn_ids = [3]
    self.vocab_size = 128
    self.encoded = []          # every text passed to encode, in order

  def encode(self, text, add_bos=False):
    self.encoded.append(text)
    ids, i = ([self.bos_id] if add_bos else []), 0
    while i < len(text):
      special = next((s for s in self.SPECIALS if text.startswith(s, i)), None)
      if special:
        ids.append(self.SPECIALS.index(special))
        i += len(special)
      else:
        ids.append(7 + ord(text[i]) - 32)
        i += 1
    return ids

  def decode(self, ids):
    chars = []
    for t in ids:
      t = int(t)
      if t < 7:
        continue
      if t < 102:
        chars.append(chr(t - 7 + 32))
      elif t < 128:
        chars.append(chr(ord("a") + t - 102))
      else:
        chars.append(chr(32 + t % 95))
    return "".join(chars)

  def apply_chat_template(self, messages, add_generation_prompt=True):
    text = "".join(f"{self.ROLES[m['role']]}{m['content']}<eot>" for m in messages)
    return text + ("<asst>" if add_generation_prompt else "")


class ScriptedEnv:
  """Three-step episode: observation 'o' * obs_len, reward k on step k, done after step 3.

  Follows the Env contract for empty actions: an error observation, reward 0, no progress.
  """
  system_prompt = ""
  max_turns = 10

  def __init__(self, obs_len=5, fail_on_step=None, fail_on_reset=False):
    self.obs_len, self.fail_on_step, self.fail_on_reset = obs_len, fail_on_step, fail_on_reset
    self.actions = []

  def reset(self, seed):
    if self.fail_on_reset:
      raise RuntimeError("reset failed")
    self.actions = []
    return f"start {seed}"

  def step(self, action):
    if not action.strip():
      return "Error: empty", 0.0, False, {"error": "empty action"}
    self.actions.append(action)
    k = len(self.actions)
    if k == self.fail_on_step:
      raise RuntimeError("step failed")
    return "o" * self.obs_len, float(k), k == 3, {"k": k}


class SpySampler:
  """Wraps a Sampler and records every call's prompts and outputs."""

  def __init__(self, sampler):
    self.sampler, self.calls = sampler, []

  def generate(self, params, prompts, **kw):
    out = self.sampler.generate(params, prompts, **kw)
    self.calls.append(([list(p) for p in prompts], out))
    return out


class AgentLoopTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.graphdef, cls.params = nnx.split(
        transformer.Transformer(transformer.Config.named("tiny"), rngs=nnx.Rngs(0)))
    # One bucket for every call (batch 4, prompt 64, new 16): a single compiled program.
    cls.sampler = sampler_lib.Sampler(cls.graphdef, pad_id=0, min_batch_bucket=4,
                                      min_prompt_bucket=MAX_LEN)

  def _run(self, envs, tok=None, **kw):
    tok = tok or CharTokenizer()
    spy = SpySampler(self.sampler)
    kw = dict(dict(max_turns=3, max_new_tokens=6, max_len=MAX_LEN), **kw)
    if "rng" not in kw:
      kw["rng"] = jax.random.key(0)
    trajs, metrics = agent_loop.run_per_turn(spy, self.params, tok, envs,
                                             list(range(len(envs))), **kw)
    return trajs, metrics, spy, tok

  def test_multi_turn_token_in_token_out(self):
    trajs, metrics, spy, tok = self._run([ScriptedEnv(), ScriptedEnv()])
    rerendered_differs = False
    for prompts, out in spy.calls:
      for j, prompt in enumerate(prompts):
        traj = next(t for t in trajs if list(t.tokens[:len(prompt)]) == prompt)
        n = out.lengths_B[j]
        seg = slice(len(prompt), len(prompt) + n)
        # The transcript holds exactly the sampled ids, their log-probs, loss_mask 1.
        np.testing.assert_array_equal(traj.tokens[seg], out.tokens_BN[j, :n])
        np.testing.assert_array_equal(traj.sampler_logp[seg], out.logp_BN[j, :n])
        np.testing.assert_array_equal(traj.loss_mask[seg], 1.0)
        ids = list(out.tokens_BN[j, :n])
        rerendered_differs |= CharTokenizer().encode(CharTokenizer().decode(ids)) != ids
    self.assertTrue(rerendered_differs)    # re-tokenizing would have changed the actions
    for t in trajs:
      self.assertEqual(int(t.loss_mask.sum()), sum(
          int(out.lengths_B[j]) for prompts, out in spy.calls for j, p in enumerate(prompts)
          if list(t.tokens[:len(p)]) == p))
      np.testing.assert_array_equal(t.turn[:t.prompt_len], -1)
      np.testing.assert_array_equal(t.sampler_logp[t.loss_mask == 0], 0.0)
      self.assertTrue(np.all(t.sampler_logp[t.loss_mask == 1] < 0))
      self.assertEqual(t.reward, sum(t.turn_rewards))
    # Only the prompts and the observation renders were ever encoded.
    allowed = {"<user>start 0<eot><asst>", "<user>start 1<eot><asst>",
               "<eot><user>ooooo<eot><asst>",
               "<eot><user>Error: empty<eot><asst>"}
    self.assertTrue(set(tok.encoded) <= allowed, set(tok.encoded) - allowed)
    self.assertLen(spy.calls, 3)
    self.assertEqual(metrics["env/env_errors"], 0)

  def test_turn_layout_of_a_completed_episode(self):
    trajs, _, _, _ = self._run([ScriptedEnv(), ScriptedEnv()], max_new_tokens=3)
    self.assertTrue(any(t.done for t in trajs))
    for t in trajs:
      if t.done:
        self.assertEqual(t.turn_rewards, [1.0, 2.0, 3.0])
        self.assertEqual(t.reward, 6.0)
        self.assertFalse(t.truncated)
        np.testing.assert_array_equal(np.unique(t.turn[t.prompt_len:]), [0, 1, 2])
      else:
        self.assertTrue(t.truncated)

  def test_empty_generation_gets_error_observation_and_zero_reward(self):
    class EmptyDecode(CharTokenizer):
      def decode(self, ids):
        return "  "
    envs = [ScriptedEnv(), ScriptedEnv()]
    trajs, metrics, _, tok = self._run(envs, tok=EmptyDecode())
    self.assertEqual(metrics["env/empty_actions"], 6)         # 2 rows x 3 turns, no crash
    for env, t in zip(envs, trajs):
      self.assertEqual(env.actions, [])                        # the env made no progress
      self.assertEqual(t.turn_rewards, [0.0, 0.0, 0.0])
      self.assertTrue(t.truncated)                             # the turn budget ended it
    self.assertIn("<eot><user>Error: empty<eot><asst>", tok.encoded)

  def test_tool_results_take_the_tool_role_where_the_template_has_one(self):
    class ToolEnv(ScriptedEnv):
      def step(self, action):
        obs, reward, done, info = super().step(action)
        return obs, reward, done, {**info, "tool_results": ["oo", "ooo"]}   # parts of "ooooo"

    class ToolTokenizer(CharTokenizer):
      chat_template = "{% if message.role == 'tool' %}...{% endif %}"   # names the role
      ROLES = {**CharTokenizer.ROLES, "tool": "<user>[tool]"}

    self.assertFalse(agent_loop.has_tool_role(CharTokenizer()))
    self.assertTrue(agent_loop.has_tool_role(ToolTokenizer()))
    trajs, _, spy, tok = self._run([ToolEnv()], tok=ToolTokenizer(), max_turns=2)
    self.assertIn("<eot><user>[tool]oo<eot><user>[tool]ooo<eot><asst>", tok.encoded)
    self.assertNotIn("<eot><user>ooooo<eot><asst>", tok.encoded)
    _, _, _, plain = self._run([ToolEnv()], max_turns=2)     # no tool role: the text, as user
    self.assertIn("<eot><user>ooooo<eot><asst>", plain.encoded)
    # The sampled ids stay as sampled; the tool messages are context (loss_mask 0).
    n = int(spy.calls[0][1].lengths_B[0])
    t = trajs[0]
    np.testing.assert_array_equal(t.tokens[t.prompt_len:t.prompt_len + n],
                                  spy.calls[0][1].tokens_BN[0, :n])
    self.assertEqual(t.loss_mask.sum(), sum(int(out.lengths_B[0]) for _, out in spy.calls))

  def test_few_shot_examples_sit_between_system_and_task(self):
    class ShotEnv(ScriptedEnv):
      system_prompt = "sys"
      examples = ({"role": "user", "content": "t1"}, {"role": "assistant", "content": "c1"},
                  {"role": "user", "content": "r1", "tool_results": ["r1"]},
                  {"role": "assistant", "content": "a1"})

    class ToolTokenizer(CharTokenizer):
      ROLES = {**CharTokenizer.ROLES, "tool": "<user>[tool]"}

    trajs, _, spy, tok = self._run([ShotEnv()], max_turns=1)
    want = ("<sys>sys<eot><user>t1<eot><asst>c1<eot><user>r1<eot><asst>a1<eot><user>start 0"
            "<eot><asst>")
    self.assertEqual(tok.encoded[0], want)
    t = trajs[0]
    self.assertEqual(list(t.tokens[:t.prompt_len]), CharTokenizer().encode(want))
    self.assertEqual(t.loss_mask[:t.prompt_len].sum(), 0)   # the examples are prompt
    self.assertEqual(t.loss_mask.sum(), int(spy.calls[0][1].lengths_B[0]))
    render = agent_loop.Renderer(ToolTokenizer(), chat_template=True, system_prompt=None,
                                 tool_role=True)
    render.prompt("q", "", ShotEnv.examples)
    self.assertIn("<user>[tool]r1<eot>", render.tok.encoded[-1])
    # Plain: BOS, each message's text, EOS after an assistant's (a sampled turn's stop), the
    # system prompt left out, as a raw-text transcript of those turns.
    plain = agent_loop.Renderer(CharTokenizer(), chat_template=False, system_prompt=None)
    enc = CharTokenizer().encode
    self.assertEqual(plain.prompt("q", "sys", ShotEnv.examples),
                     enc("t1", add_bos=True) + enc("c1") + [2] + enc("r1") + enc("a1") + [2]
                     + enc("q"))
    self.assertEqual(plain.prompt("q", "sys"), enc("q", add_bos=True))

  def test_raising_env_is_contained(self):
    envs = [ScriptedEnv(fail_on_step=1), ScriptedEnv(fail_on_reset=True), ScriptedEnv()]
    trajs, metrics, _, _ = self._run(envs)
    self.assertEqual(metrics["env/env_errors"], 2)
    self.assertEqual(trajs[0].turn_rewards[-1], 0.0)
    self.assertIn("step failed", trajs[0].infos[-1]["error"])
    self.assertEqual(trajs[1].loss_mask.sum(), 0)               # never sampled
    self.assertGreater(len(trajs[1].tokens), 0)                 # error prompt keeps real tokens
    self.assertGreater(len(trajs[2].turn_rewards), 1)           # the healthy row went on

  def test_observation_longer_than_budget(self):
    trajs, metrics, _, _ = self._run([ScriptedEnv(obs_len=200)])
    self.assertEqual(metrics["rollout/obs_overflow"], 1)
    self.assertTrue(trajs[0].truncated)
    self.assertLess(len(trajs[0].tokens), MAX_LEN)
    self.assertEqual(trajs[0].turn_rewards, [1.0])

  def test_run_is_the_engine_and_a_sampler_still_runs_with_a_warning(self):
    engine = engine_lib.Engine(self.graphdef, pad_id=0, slots=4)
    kw = dict(rng=jax.random.key(0), max_turns=2, max_new_tokens=6, max_len=MAX_LEN,
              greedy=True, chat_template=False)
    envs = lambda: [ScriptedEnv(), ScriptedEnv()]
    via_run, _ = agent_loop.run(engine, self.params, CharTokenizer(), envs(), [1, 2], **kw)
    direct, _ = engine.run(self.params, CharTokenizer(), envs(), [1, 2], **kw)
    with self.assertWarnsRegex(DeprecationWarning, "pass a rollout engine"):
      old, _ = agent_loop.run(self.sampler, self.params, CharTokenizer(), envs(), [1, 2], **kw)
    for a, b, c in zip(via_run, direct, old):
      np.testing.assert_array_equal(a.tokens, b.tokens)
      np.testing.assert_array_equal(a.tokens, c.tokens)

  def test_groups_are_contiguous_with_greedy_baseline(self):
    def rollout(seed):
      engine = engine_lib.Engine(self.graphdef, pad_id=0, slots=4)
      return agent_loop.rollout_groups(
          engine, self.params, CharTokenizer(), ScriptedEnv, [7, 8], group_size=2,
          greedy_baseline=True, rng=jax.random.key(seed), max_turns=1, max_new_tokens=6,
          max_len=MAX_LEN)
    a, b = rollout(0), rollout(1)
    self.assertLen(a.trajectories, 4)
    self.assertLen(a.baseline, 2)
    prompts = [list(t.tokens[:t.prompt_len]) for t in a.trajectories]
    self.assertEqual(prompts[0], prompts[1])
    self.assertEqual(prompts[2], prompts[3])
    self.assertNotEqual(prompts[1], prompts[2])
    self.assertEqual(list(a.baseline[1].tokens[:a.baseline[1].prompt_len]), prompts[2])
    self.assertTrue(all(t.greedy for t in a.baseline))
    for x, y in zip(a.baseline, b.baseline):                # greedy ignores the rng
      np.testing.assert_array_equal(x.tokens, y.tokens)
    self.assertFalse(all(np.array_equal(x.tokens, y.tokens)  # sampled rows do not
                         for x, y in zip(a.trajectories, b.trajectories)))

  def test_raw_text_mode_appends_plain_observations(self):
    tok = CharTokenizer()
    trajs, _, spy, _ = self._run([ScriptedEnv(obs_len=3)], tok=tok, chat_template=False,
                                 max_turns=2)
    t = trajs[0]
    self.assertEqual(list(t.tokens[:t.prompt_len]),
                     [tok.bos_id] + CharTokenizer().encode("start 0"))
    self.assertEqual(tok.encoded, ["start 0", "ooo"])
    n = int(spy.calls[0][1].lengths_B[0])
    np.testing.assert_array_equal(t.tokens[t.prompt_len + n:t.prompt_len + n + 3], [7 + 79] * 3)

  def test_scripted_trajectory_is_the_rollout_that_sampled_those_actions(self):
    actions = ["ab", "cd", "ef", "never used: the env is done after three"]

    class Replay:
      """A sampler whose policy samples encode(action) then a stop id, turn by turn."""

      def __init__(self, stop):
        self.turn, self.stop = 0, stop

      def generate(self, params, prompts, **kw):
        del params, kw
        ids = CharTokenizer().encode(actions[self.turn]) + [self.stop]
        self.turn += 1
        B, N = len(prompts), len(ids)
        return sampler_lib.SampleOutput(
            tokens_BN=np.tile(np.asarray(ids, np.int32), (B, 1)),
            logp_BN=np.zeros((B, N), np.float32), lengths_B=np.full((B,), N, np.int32),
            stopped_B=np.ones((B,), bool), num_steps=N)

    for chat_template, stop in ((True, 3), (False, 2)):   # <eot> with the template, else EOS
      tok = CharTokenizer()
      got = agent_loop.scripted(tok, ScriptedEnv(obs_len=2), 5, actions,
                                chat_template=chat_template)
      want, _ = agent_loop.run_per_turn(Replay(stop), None, tok, [ScriptedEnv(obs_len=2)], [5],
                                        rng=jax.random.key(0), max_turns=5, max_new_tokens=8,
                                        max_len=MAX_LEN, chat_template=chat_template)
      for field in ("tokens", "loss_mask", "turn"):
        np.testing.assert_array_equal(getattr(got, field), getattr(want[0], field), field)
      self.assertEqual((got.turn_rewards, got.done, got.prompt_len),
                       (want[0].turn_rewards, want[0].done, want[0].prompt_len))
      # loss_mask is 1 on the actions' ids and their stop ids only: 3 x (2 + 1).
      self.assertEqual(got.loss_mask.sum(), 9)
      self.assertEqual(list(got.tokens[got.loss_mask > 0][2::3]), [stop] * 3)

  def test_pack_of_rollout_keeps_masks_under_transfer_guard(self):
    rng = jax.random.key(0)
    with jax.transfer_guard("disallow"):     # only explicit device_put/device_get allowed
      trajs, _, _, _ = self._run([ScriptedEnv(), ScriptedEnv()], rng=rng)
      batch = pack.pack(trajs, max_len=MAX_LEN, pad_id=0)
    T = pack.padded_length([len(t.tokens) for t in trajs], max_len=MAX_LEN)
    self.assertEqual(batch.tokens_BT.shape, (2, T))
    np.testing.assert_array_equal(np.asarray(batch.loss_mask_BT).sum(-1),
                                  [t.loss_mask.sum() for t in trajs])


if __name__ == "__main__":
  absltest.main()
