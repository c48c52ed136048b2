r"""The OpenAI-compatible server's overhead: agent programs through it vs the engine directly.

  python scripts/bench_serve.py                    # 1, 8 and 32 sessions, tiny model, ~1 min
  python scripts/bench_serve.py --model=smollm2 --repeats=1   # SmolLM2-135M (the GGUF)

The workload is the hidden-rule game played greedily, so both paths sample exactly the same
tokens (checked) and only the path differs: `--model=tiny` a randomly initialized tiny model on
experiments.agents.agent's cpu task (7 turns of up to 6 tokens, plain text), `--model=smollm2`
SmolLM2-135M-Instruct on its full-text game through the chat template (7 turns of up to 16
tokens).

  engine   `Engine.run` over the game's envs: the rollout every other experiment makes;
  server   `programs.rollout`: one `agentrl.serve.env_agent` program per episode (in the
           runner's process) sends the same messages through `openai.AsyncOpenAI` to the
           local server (agentrl/serve/app.py) whose backend is the same engine
           (agentrl/serve/sessions.py);
  http     the HTTP floor: the same programs and requests against a backend that answers each
           at once with the text the engine sampled for it: what the HTTP stack and the
           `openai` client cost with no model behind them. `server CPU ms/req` is this
           process's CPU time per request meanwhile (the server's share: uvicorn, Starlette,
           the backend); the rest of the floor is the programs' processes (`--processes`).

Each row is the fastest of `--repeats` timed runs after one that compiles. `requests/s` counts
model turns (one chat completion each), `tokens/s` the sampled tokens; the overhead is the
server's extra wall time over the engine's, and the HTTP floor's is the same for the floor.
"""
import resource
import time

from absl import app
from absl import flags
import jax

from agentrl.envs import registry
from agentrl.harness import recipe
from agentrl.models import hf
from agentrl.models import testing
from agentrl.models import transformer
from agentrl.records import metrics as metrics_lib
from agentrl.rollout import engine as engine_lib
from agentrl.serve import app as app_lib
from agentrl.serve import env_agent
from agentrl.serve import programs
from agentrl.serve import protocol
from agentrl.serve import sessions

_MODEL = flags.DEFINE_enum("model", "tiny", ["tiny", "smollm2"], "The policy (module doc).")
_SESSIONS = flags.DEFINE_list("sessions", ["1", "8", "32"], "Concurrent sessions per row.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs per row (the fastest is kept).")
_PROCESSES = flags.DEFINE_integer("processes", 1, "The agent programs' processes "
                                  "(programs.AgentRunner).")


class Recorded:
  """An env that keeps the texts it was sent (the model's turns)."""

  def __init__(self, env):
    self.env, self.actions = env, []

  def __getattr__(self, name):
    return getattr(self.env, name)

  def reset(self, seed):
    return self.env.reset(seed)

  def step(self, action):
    self.actions.append(action)
    return self.env.step(action)


class Replay:
  """A backend that answers turn k of session "replay-i" at once with actions[i][k]."""
  model_names = ("policy",)

  def __init__(self, actions):
    self.actions = actions

  async def chat(self, request):
    turn = sum(m["role"] == "assistant" for m in request.messages)
    text = self.actions[int(request.session.split("-")[1])][turn]
    return protocol.Completion(choices=(protocol.Choice(0, text),), prompt_tokens=0,
                               completion_tokens=0)


class NoSessions:
  """The runner's hub for the HTTP floor: there are no engine sessions to end."""

  def finish(self, session_id, reward):
    del session_id, reward

  def drop(self, session_id, why):
    raise RuntimeError(f"a floor program failed ({session_id}): {why}")


def workload():
  """(task config, engine.run's turn settings, tokenizer, graphdef, params) of --model."""
  if _MODEL.value == "tiny":
    task = registry.task_config("hidden_rule", names=registry.NAMES, family="guess",
                                max_turns=7, style="compact")
    tok = recipe.task_tokenizer(task)
    graphdef, params = testing.random_params(transformer.Config.named("tiny",
                                                                      vocab=tok.vocab_size))
    turn = dict(max_turns=7, max_new_tokens=6, max_len=64, temperature=1.0,
                chat_template=False)
    return task, turn, tok, graphdef, params
  task = registry.task_config("hidden_rule", names=registry.NAMES, family="guess",
                              max_turns=7, style="full", chat_template=True)
  tok, _, graphdef, params = hf.load_with_tokenizer(hf.smollm2_path(), dtype="float32")
  turn = dict(max_turns=7, max_new_tokens=16, max_len=1024, temperature=1.0,
              chat_template=True)
  return task, turn, tok, graphdef, params


def fastest(fn, repeats: int):
  fn()  # compiles
  best, out = float("inf"), None
  for _ in range(repeats):
    start = time.perf_counter()
    out = fn()
    best = min(best, time.perf_counter() - start)
  return best, out


def main(argv):
  del argv
  task, turn, tok, graphdef, params = workload()
  make_env = registry.factory(task)
  rows = []
  for n in map(int, _SESSIONS.value):
    engine = engine_lib.Engine(graphdef, pad_id=tok.pad_id, slots=max(n, 1), env_workers=n,
                               env_timeout_s=900.0)
    hub = sessions.SessionHub(tok, model_name="policy", max_sessions=n,
                              session_timeout_s=600.0, temperature=1.0,
                              max_new_tokens=turn["max_new_tokens"], max_turns=7,
                              max_len=turn["max_len"])
    seeds = list(range(n))

    envs = []

    def direct():
      envs[:] = [Recorded(make_env()) for _ in seeds]
      return engine.run(params, tok, envs, seeds, rng=jax.random.key(0), greedy=True,
                        **turn)[0]

    tasks = [env_agent.make_task(task, s) for s in seeds]
    t_engine, plain = fastest(direct, _REPEATS.value)
    with app_lib.Server(app_lib.make_app(hub, max_concurrent=2 * n)) as server, \
        programs.AgentRunner(server.url, processes=_PROCESSES.value) as runner:

      def served():
        return programs.rollout(engine, params, tok, hub, runner, env_agent.agent, tasks,
                                rng=jax.random.key(0), greedy=True, **turn).trajectories

      t_server, through = fastest(served, _REPEATS.value)
    replay = Replay([env.actions for env in envs])
    with app_lib.Server(app_lib.make_app(replay, max_concurrent=2 * n)) as server, \
        programs.AgentRunner(server.url, processes=_PROCESSES.value) as runner:

      def floor():
        futures = runner.start(env_agent.agent, [(f"replay-{i}", t) for i, t in
                                                 enumerate(tasks)], NoSessions())
        return [f.result() for f in futures]

      floor()   # starts the programs' processes
      cpu = resource.getrusage(resource.RUSAGE_SELF)
      t_floor, outcomes = fastest(floor, _REPEATS.value)
      now = resource.getrusage(resource.RUSAGE_SELF)
      server_cpu = (now.ru_utime + now.ru_stime - cpu.ru_utime - cpu.ru_stime) / (
          _REPEATS.value + 1)
    same = all(list(a.tokens) == list(b.tokens) for a, b in zip(plain, through)) and all(
        o.reward == t.reward for o, t in zip(outcomes, plain))
    turns = sum(len(t.turn_rewards) for t in plain)
    tokens = sum(int(t.loss_mask.sum()) for t in plain)
    rows.append([n, turns, tokens, f"{turns / t_engine:.1f}", f"{turns / t_server:.1f}",
                 f"{turns / t_floor:.1f}", f"{tokens / t_engine:.0f}",
                 f"{tokens / t_server:.0f}", f"{100 * (t_server / t_engine - 1):+.0f}%",
                 f"{100 * (t_floor / t_engine):.0f}%", f"{1e3 * server_cpu / turns:.2f}",
                 "yes" if same else "NO"])
  print(metrics_lib.format_table(
      ["sessions", "turns", "tokens", "engine req/s", "server req/s", "http req/s",
       "engine tok/s", "server tok/s", "overhead", "http floor", "server CPU ms/req",
       "same tokens"], rows))


if __name__ == "__main__":
  app.run(main)
