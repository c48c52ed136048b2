"""An agent program written only against the OpenAI chat API: it plays one of agentrl's
environments (its world) through chat requests; experiments.agents.openai_agent's default
program (`config.agent.module`), and the template of one.

  async def agent(client, task) -> float
  def make_task(task_config, seed) -> dict

The program knows nothing of agentrl's models, tokens or rollout engine: it sends the
environment's system prompt and first observation as chat messages, sends each reply's text to
the environment, and appends the environment's answer as the next user message, until the
episode ends or `max_turns` replies were made; it returns the episode's total reward. Any
program with that signature trains the same way (experiments/agents/README.md): a search
agent, a tool-calling loop with `tools=[...]`, an agent built on an SDK that takes an
`openai.AsyncOpenAI` client.

Because the messages are the environment's own texts, the engine renders them to the same ids
as a rollout of the environment itself (agentrl/rollout/agent_loop.py, Renderer), so an SFT
warm start on the environment's demonstrations (recipe.warm_start) carries over unchanged.
"""
import asyncio

from agentrl.envs import registry


def make_task(task_config, seed: int) -> dict:
  """The task of `seed`: the environment's config (a plain dict) and the seed."""
  return {"env": dict(task_config), "seed": int(seed)}


async def agent(client, task: dict) -> float:
  """Plays `task` through `client`; returns the episode's total reward."""
  env = registry.factory(task["env"])()
  observation = await asyncio.to_thread(env.reset, task["seed"])
  messages = [{"role": "system", "content": env.system_prompt}] if env.system_prompt else []
  messages.append({"role": "user", "content": observation})
  total = 0.0
  for _ in range(task["env"]["max_turns"]):
    reply = await client.chat.completions.create(model=task.get("model", "policy"),
                                                 messages=messages)
    text = reply.choices[0].message.content or ""
    messages.append({"role": "assistant", "content": text})
    observation, reward, done, _ = await asyncio.to_thread(env.step, text)
    total += reward
    if done:
      break
    messages.append({"role": "user", "content": observation})
  return total
