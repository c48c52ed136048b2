"""An example agent program: a calculator tool loop written against the OpenAI chat API alone.

  python -m experiments.agents.openai_agent --config=experiments/agents/openai_agent.py:calculator

`agent(client, task)` is what an agent written for any OpenAI-compatible endpoint looks like:
it sends a system message, `task["examples"]` solved episodes as earlier messages (the question,
an assistant message whose `tool_calls` call the calculator, the `tool` message with its result,
the final answer), then the question, with `tools=[TOOL]`. It runs each reply's tool calls
itself and answers them with `tool` messages (by tool_call_id); a reply with <answer>N</answer>
ends the episode, reward 1.0 if N is the task's answer, else 0.0; a reply with neither gets a
user message saying how to go on; `task["max_turns"]` replies without an answer, or a
transcript past the run's length budget (the server's 400 context_length_exceeded), score 0.0.

Nothing of agentrl's models, tokens or rollout reaches `agent`: the server renders `tools` into
the prompt in the run's tool format and parses calls out of the sampled text (agentrl/serve/
sessions.py). What `agent` uses of agentrl is the calculator env's `evaluate` (and
`format_number`), which parses an expression with `ast` and walks the tree, accepting only
numbers, parentheses and + - * / // % **: the model's text is never `eval`ed
(agentrl/envs/calculator.py). `make_task` builds tasks from the registry's task config.

`make_task(task_config, seed)` is the calculator env's problem of `seed` (config.task, name
"calculator": num_ops operators on numbers up to max_operand), so every seed, a training one
or a held-out one, is the same problem as in experiments.agents.agent's runs of that task, and
the demonstrations are the problems of the few-shot seeds (envs/few_shot.py), as there.
"""
import json
import re
from typing import Any, Mapping

import openai

from agentrl import configs
from agentrl.envs import calculator
from agentrl.envs import few_shot
from agentrl.envs import registry

# The calculator env's own words and tag (<calc>), which SmolLM2 was shown to copy (docs/usage.md
# §6): rendered in the tags format, the prompt is the env's but for its notes line.
SYSTEM = "You can use a calculator."
NAME = "calc"
TOOL = {"type": "function", "function": {
    "name": NAME,
    "description": "A calculator: evaluates numbers with + - * / // % ** and parentheses.",
    "parameters": {"type": "object",
                   "properties": {"expression": {"type": "string",
                                                 "description": "the expression, e.g. 2*(3+4)"}},
                   "required": ["expression"]}}}
NUDGE = "Call the calculator, or write the final answer as <answer>number</answer>."
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def make_task(task_config: Mapping[str, Any], seed: int) -> dict:
  """The JSON-able task of `seed`: question, answer, max_turns and the demonstrations (module
  docstring). ConfigError unless task_config is a calculator task."""
  if task_config["name"] != "calculator":
    raise configs.ConfigError(f"config.task.name={task_config['name']!r}: the program "
                              "agentrl.serve.calculator_agent plays the calculator task; set "
                              "--config.task.name=calculator")
  kwargs = registry.constructor_kwargs(task_config)
  size = dict(num_ops=kwargs["num_ops"], max_operand=kwargs["max_operand"])
  problem = calculator.make_problem(int(seed), **size)
  shown = [calculator.make_problem(few_shot.SEED_BASE + k, **size)
           for k in range(task_config.get("few_shot", 0))]
  return {"question": problem["prompt"], "answer": problem["answer"], "seed": int(seed),
          "max_turns": int(kwargs["max_turns"]),
          "examples": [{"question": p["prompt"], "expression": p["expression"],
                        "answer": p["answer"]} for p in shown]}


def run_tool(arguments: str) -> str:
  """The calculator's reply to a call's JSON arguments: the value, or why there is none."""
  try:
    return calculator.format_number(calculator.evaluate(json.loads(arguments)["expression"]))
  except (TypeError, KeyError, ValueError) as e:   # calculator.CalcError is a ValueError
    return f"error: {e}"


def score(content: str | None, answer: str) -> float | None:
  """1.0 / 0.0 for a reply with <answer>N</answer> (N right or not), None without one."""
  found = _ANSWER.search(content or "")
  if found is None:
    return None
  numbers = _NUMBER.findall(found.group(1))
  if not numbers:
    return 0.0
  return float(abs(float(numbers[-1].replace(",", "")) - float(answer)) < 1e-6)


def demonstration(k: int, example: dict) -> list[dict]:
  """One solved episode as chat messages: the question, the call, its result, the answer."""
  call = {"id": f"call_example_{k}", "type": "function",
          "function": {"name": NAME,
                       "arguments": json.dumps({"expression": example["expression"]})}}
  return [{"role": "user", "content": example["question"]},
          {"role": "assistant", "content": None, "tool_calls": [call]},
          {"role": "tool", "tool_call_id": call["id"], "content": example["answer"]},
          {"role": "assistant", "content": f"<answer>{example['answer']}</answer>"}]


async def agent(client, task: dict) -> float:
  """Plays `task` through `client` (an openai.AsyncOpenAI); returns the reward (module doc)."""
  messages = [{"role": "system", "content": SYSTEM}]
  for k, example in enumerate(task["examples"]):
    messages += demonstration(k, example)
  messages.append({"role": "user", "content": task["question"]})
  for _ in range(task["max_turns"]):
    try:
      reply = await client.chat.completions.create(model=task.get("model", "policy"),
                                                   messages=messages, tools=[TOOL])
    except openai.BadRequestError as e:
      if e.code == "context_length_exceeded":   # out of tokens before an answer: a failure
        return 0.0
      raise
    message = reply.choices[0].message
    reward = score(message.content, task["answer"])
    if reward is not None:
      return reward
    calls = message.tool_calls or []
    # The reply goes back as it came, calls and all: the session's history must match it.
    sent = {"role": "assistant", "content": message.content}
    if calls:
      sent["tool_calls"] = [{"id": c.id, "type": "function", "function": {
          "name": c.function.name, "arguments": c.function.arguments}} for c in calls]
    messages.append(sent)
    for call in calls:
      result = (run_tool(call.function.arguments) if call.function.name == NAME
                else f"error: there is no tool {call.function.name!r}")
      messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    if not calls:
      messages.append({"role": "user", "content": NUDGE})
  return 0.0
