# pylint: disable=invalid-name
r"""Train an agent program written against the OpenAI chat API, unchanged.

  python -m experiments.agents.openai_agent --workdir=runs/openai_agent      # cpu: minutes
  python -m experiments.agents.openai_agent --config.agent.module=my_pkg.my_agent
  python -m experiments.agents.openai_agent --config=experiments/agents/openai_agent.py:calculator
  python -m experiments.agents.openai_agent --config=experiments/agents/openai_agent.py:pod \
      --config.model.path=/ckpt/Qwen3-8B --workdir=gs://bucket/openai_agent    # accelerators

The rollout phase of each step starts P x G episodes of the program `config.agent.module`
(`async def agent(client, task) -> float`, agentrl/serve/programs.py), each with an
`openai.AsyncOpenAI` client pointed at a local OpenAI-compatible server (agentrl/serve/app.py,
loopback) and bound to its own session. The server's backend is the rollout engine
(agentrl/serve/sessions.py): every request of a session continues one engine episode, whose KV
cache is kept and whose trajectory is the exact sequence of sampled and fed-back token ids, so
the trainer's log-probs match the sampler's as in every other experiment. The weights the
server samples from are the current ones at each step. Turns are the program's assistant
messages; its return value is the episode's reward. A program that raises, or whose client
waits longer than `agent.session_timeout_s`, is dropped: its row trains nothing (and counts
as reward 0 in its group's baseline [INF]).

The loss is GRPO's: the group-normalized outcome on every sampled token of the episode, the
PPO clip and `loss.agg`. The default program, `agentrl.serve.env_agent`, plays
the task's environment through chat messages (the hidden-rule game of experiments.agents.agent's
`cpu` preset), so the SFT warm start on that environment's demonstrations applies and the run
can be compared with `experiments.agents.agent --config.loss.credit=grpo` step for step.

Presets (`rl_config.agent_study`): `cpu` (default; tiny scratch model, the hidden-rule game),
`textworld` (the long-horizon coin collector), `pod` (agent.py's pod scale), with `smoke`; and
`calculator`: the example program `agentrl.serve.calculator_agent` (a tool loop with
`tools=[...]` and `tool_calls`, on the openai client alone) trains SmolLM2-135M-Instruct's LoRA
adapters on agent.py's `smollm2` task at its scale (rl_config.smollm2_calculator_study;
docs/usage.md §9 has the measured run).
"""
import dataclasses

from absl import app
from flax import nnx
import jax
import ml_collections as mlc
import numpy as np

from agentrl.advantages import estimators
from agentrl import configs
from agentrl import distributed
from agentrl.envs import registry
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.losses import aggregation
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from agentrl.rollout import collect
from agentrl.rollout import engine as engine_lib
from agentrl.rollout import pack
from agentrl.records import rundir
from agentrl.serve import app as app_lib
from agentrl.serve import programs
from agentrl.serve import sessions
from agentrl import sharding
from agentrl.train import loop
from agentrl import types

MODEL_NAME = "policy"


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  if arg.preset not in (*rl_config.AGENT_STUDY_PRESETS, "calculator"):
    raise configs.ConfigError(f"unknown openai_agent preset {arg.preset!r}; use cpu (default), "
                              "calculator, textworld, pod or smoke")
  if arg.preset == "calculator":
    c = rl_config.rl_config("smollm2", smoke=arg.smoke)
    rl_config.smollm2_calculator_study(c, names=registry.NAMES, smoke=arg.smoke)
    c.sft.demo_noise = 0.0   # read by the smoke run's SFT warm start only
  else:
    c = rl_config.agent_study(arg, experiment="openai_agent", names=registry.NAMES)
  c.loss = dict(eps_low=0.2, eps_high=0.2, agg="seq-mean-token-mean")
  # module: the agent program (programs.load_program); session_timeout_s: how long a session
  # waits for its program's next request; success_reward: an episode whose reward reaches it
  # counts as a success; tool_format: how the server parses tool calls in the model's text
  # (envs/tool_calls.py); api_key: the server's bearer token ("": none; loopback only);
  # processes: the programs' processes (programs.AgentRunner; more where one core cannot keep
  # up with the programs' `openai` clients).
  c.agent = dict(module="agentrl.serve.env_agent", session_timeout_s=120.0, processes=1,
                 success_reward=1.0, tool_format="hermes", api_key="")
  # old_logp: pi_old from a learner forward ("learner", which logs logp_mismatch: the server's
  # log-probs against the learner's) or the sampler's own ("sampler", loop.sampler_score: no
  # scoring pass; float32 only).
  c.rollout.old_logp = "learner"
  if arg.preset == "calculator":
    # The example program (agentrl/serve/calculator_agent.py: `tools=[calc]`, one
    # demonstrated episode as messages) on agent.py's `smollm2` task and scale, as there with
    # GRPO, token-mean and pi_old from the sampler. Tags: the format SmolLM2 was shown to copy
    # (<calc>2+3</calc>); a hermes call of the same expression is 2.5x as long in a 48-token
    # turn, and its system prompt, with the tool's JSON schema, 4x (every row carries it).
    c.agent.update(module="agentrl.serve.calculator_agent", tool_format="tags")
    c.loss.agg = "token-mean"
    c.rollout.old_logp = "sampler"
  return c


SCHEMA = {
    **{k: v for k, v in rl_config.RL_SCHEMA.items() if not k.startswith("task.")},
    **registry.schema(registry.NAMES),
    "sft.demo_noise": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
    "rollout.old_logp": configs.Key(str, choices=("learner", "sampler")),
    "agent.module": configs.Key(str),
    "agent.session_timeout_s": configs.Key(float, min=1.0),
    "agent.success_reward": configs.Key(float),
    "agent.tool_format": configs.Key(str),
    "agent.api_key": configs.Key(str),
    "agent.processes": configs.Key(int, min=1),
}


# ---------------------------------------------------------------------------------------------
# The loss composition and the advantage step: the part to fork.
# ---------------------------------------------------------------------------------------------
def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train()."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature

  def loss_fn(params, batch: types.Batch):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    pg_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, batch.loss_mask_BT,
                                 eps_low=lc.eps_low, eps_high=lc.eps_high)
    loss = aggregation.aggregate(pg_BT, batch.loss_mask_BT, lc.agg)
    return loss, metrics | {"loss": loss}

  return loop.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """(batch, extras) -> (batch with adv_BT, metrics): GRPO's group-normalized outcome."""
  return estimators.grpo_step(config.rollout.group_size)


# ---------------------------------------------------------------------------------------------
# Rollouts and evaluation through the server.
# ---------------------------------------------------------------------------------------------
def program_rollout(config, engine, tok, hub, runner, program, params, seeds, *, rng,
                    greedy: bool) -> programs.ProgramRollout:
  """One episode of the program per seed (each repeated G times by the caller)."""
  rc, tc = config.rollout, config.task
  tasks = [{**program.make_task(tc, seed), "model": MODEL_NAME} for seed in seeds]
  return programs.rollout(engine, params, tok, hub, runner, program.agent, tasks, rng=rng,
                          max_turns=tc.max_turns, max_new_tokens=rc.max_new_tokens,
                          max_len=rc.max_len, temperature=rc.temperature,
                          chat_template=tc.chat_template, greedy=greedy,
                          timeout_s=config.agent.session_timeout_s)


def make_rollout_fn(config, engine, tok, hub, server, runner, program, data, mesh):
  rc, ac = config.rollout, config.agent

  def rollout_fn(params, rng, step):
    del step
    http_before = server.stats
    seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
    out = program_rollout(config, engine, tok, hub, runner, program, params,
                          [s for s in seeds for _ in range(rc.group_size)], rng=rng,
                          greedy=False)
    trajs = []
    for traj, outcome in zip(out.trajectories, out.outcomes):
      # The program's reward is the episode's; a dropped episode trains nothing.
      mask = traj.loss_mask * (0.0 if outcome.dropped else 1.0)
      trajs.append(dataclasses.replace(traj, reward=outcome.reward, loss_mask=mask))
    batch = pack.pack(trajs, max_len=rc.max_len, pad_id=tok.pad_id, min_len=rc.max_len,
                      sharding=sharding.batch_sharding(mesh))
    http = {k: v - http_before[k] for k, v in server.stats.items()}  # the HTTP layer's counts
    host = {**out.metrics, **http, **collect.rollout_metrics(trajs),
            **collect.batch_metrics(trajs, batch),
            "success": float(np.mean([o.reward >= ac.success_reward and not o.dropped
                                      for o in out.outcomes]))}
    return loop.Rollout(batch=batch, metrics=host, trajectories=trajs, tokenizer=tok)

  return rollout_fn


def make_evaluator(config, engine, tok, hub, runner, program):
  """evaluate(params) -> {"success", "reward", "turns"}: the program's held-out greedy episodes."""

  def evaluate(params):
    seeds = [recipe.EVAL_SEED_BASE + i for i in range(config.eval.num_problems)]
    out = program_rollout(config, engine, tok, hub, runner, program, params, seeds,
                          rng=jax.random.key(0), greedy=True)
    rewards = [o.reward for o in out.outcomes]
    return {"success": float(np.mean([r >= config.agent.success_reward for r in rewards])),
            "reward": float(np.mean(rewards)),
            "turns": float(np.mean([len(t.turn_rewards) for t in out.trajectories]))}

  return evaluate


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """The program's RL end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  program = programs.load_program(config.agent.module)
  start = rundir.write_config(config, workdir, experiment="openai_agent")
  rc, ac, mesh = config.rollout, config.agent, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started on the task's demonstrations), optimizer.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok,
                                       engine=recipe.rollout_engine(config, graphdef, tok))
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  # ---- Jitted steps.
  score_step = jax.jit(loop.make_score_step(graphdef, temperature=rc.temperature,
                                            logprob_impl=config.model.logprob_impl))
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- The server: every open session holds an env worker while it waits for its program.
  sessions_at_once = max(rc.prompts_per_step * rc.group_size, config.eval.num_problems)
  engine = engine_lib.Engine(graphdef, pad_id=tok.pad_id, slots=rc.slots,
                             env_workers=sessions_at_once,
                             env_timeout_s=ac.session_timeout_s + 60.0)
  hub = sessions.SessionHub(tok, model_name=MODEL_NAME, tool_format=ac.tool_format,
                            max_sessions=sessions_at_once,
                            session_timeout_s=ac.session_timeout_s,
                            temperature=rc.temperature, max_new_tokens=rc.max_new_tokens,
                            max_turns=config.task.max_turns, max_len=rc.max_len)
  data = recipe.prompt_stream(make_env)
  # A session has at most one request in flight, but the server counts a request out only
  # after its response is sent, so a program's next request may briefly overlap it: twice the
  # sessions never refuses one of ours.
  app_ = app_lib.make_app(hub, api_key=ac.api_key or None, max_concurrent=2 * sessions_at_once)
  with app_lib.Server(app_) as server, \
      programs.AgentRunner(server.url, api_key=ac.api_key,
                           processes=ac.processes) as runner, jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=make_rollout_fn(config, engine, tok, hub, server, runner, program, data,
                                   mesh),
        score_fn=(loop.sampler_score if rc.old_logp == "sampler"
                  else lambda params, batch: score_step(params, None, batch)),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=make_evaluator(config, engine, tok, hub, runner, program),
        **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="OpenAI agent program", start=start,
                              sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
