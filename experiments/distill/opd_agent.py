# pylint: disable=invalid-name
r"""Multi-turn on-policy distillation on the hidden-rule game: OPD (G-OPD / ExOPD, arXiv
2602.12125), OPSD (arXiv 2601.18734), PW-OPSD (arXiv 2605.21606) and TCOD's turn curriculum
(arXiv 2604.24005), with KEPO's gate (arXiv 2602.00400).

  python -m experiments.agents.agent --workdir=runs/agent                # the teacher (cpu)
  python -m experiments.distill.opd_agent --workdir=runs/opd_agent        # OPD (default cpu)
  python -m experiments.distill.opd_agent --config.loss.method=opsd      # privileged self-teacher
  python -m experiments.distill.opd_agent --config.loss.method=pw_opsd
  python -m experiments.distill.opd_agent --config.loss.tcod=f2b         # TCOD, front to back
  python -m experiments.distill.opd_agent --config.loss.tcod=b2f         # TCOD, back to front
  python -m experiments.distill.opd_agent --config=experiments/distill/opd_agent.py:smoke \
      --config.teacher.run_dir=DIR

The student is the game's SFT warm start (`rl_config.hidden_rule_study`: the warm start
agent.py's cpu runs share) and plays whole episodes with the agent loop; only its own sampled
tokens are distilled (env and replayed tokens have loss mask 0). loss.method:

  opd      the teacher is a finished experiments.agents.agent run (`teacher.run_dir`: its
           config.json rebuilds it, its newest checkpoint or `teacher.step` holds the weights;
           `saved_run.load_teacher`, which refuses another tokenizer). The score step computes
           the student's and the teacher's log-probs of the sampled tokens in one jitted call;
           r_t = lam (log pi_T - log pi_ref) - (log pi_theta - log pi_ref) is PPO's advantage
           (`loss.form=ppo`) or trains -sg(r_t) log pi_theta (`reinforce`), as opd.py.
  opsd     the teacher is the student's own model (`loss.opsd_teacher`: "frozen", the warm
           start, as OPSD's --fixed_teacher; or "current", the params being trained, under a
           stop-gradient) with privileged context: its prompt is `loss.opsd_context` with
           {obs} the game's first observation and {answer} its secret ("... the secret is 31"),
           rendered as the rollout renders prompts; the student's turns (and the env's replies)
           follow it (`distill.privileged_teacher_inputs(keep_prompt=False)`,
           `align_to_student`). Loss: the full-vocabulary forward KL(p_T || p_S) at every
           sampled token (`kernels.logprob.kl.distill_kl`, `distill.distill_kl_loss`),
           optionally on the teacher's top-k (`loss.kl_top_k`).
  pw_opsd  OPSD with PW-OPSD's `position_weights` (loss.pw_min, pw_tau, pw_s; k and L count
           the row's policy tokens over all its turns [INF]).

loss.tcod (any method): "f2b" caps the turns the student plays at `tcod_turn_cap(step - 1,
every=loss.tcod_every, max_turns=task.max_turns)` (the episode stops at the cap, truncated;
evaluation plays every turn); "b2f" replays `tcod_b2f_start(step - 1, E, every=loss.b2f_every)`
expert turns of an E-turn expert episode before the student takes over
(`continuations.replay_then_rollout`). [INF] The expert turns are the game's scripted expert
(`hidden_rule.demonstration`, noise 0: binary search in `guess`), not a teacher model's turns
(TCOD replays an expert trajectory; the game has an exact one). [INF] every = 6 (f2b) and 5
(b2f) are TCOD's ALFWorld values, for 30-turn episodes; the game has 7 turns.
loss.gate is KEPO's row gate on the episode's reward, for every method. loss.agg "auto" is
each paper's: token-mean for OPD and OPSD, seq-mean-token-mean for PW-OPSD and with TCOD.

Presets: `cpu` (default; the teacher is agent.py's cpu run in runs/agent), `pod` (agent.py's
pod task at scale; give teacher.run_dir), `smoke` (seconds; give teacher.run_dir).
This file is the fork unit; the building blocks come from agentrl.harness.recipe, loop,
rollout.agent_loop, continuations, pack and losses.distill.
"""
import random

from absl import app
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np

from agentrl import configs
from agentrl import distributed
from agentrl.envs import registry
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.harness import saved_run
from agentrl.losses import aggregation
from agentrl.losses import distill
from agentrl.losses import policy as pg
from agentrl.models import lora
from agentrl.models import policy as policy_lib
from agentrl.records import rundir
from agentrl.rollout import agent_loop
from agentrl.rollout import collect
from agentrl.rollout import continuations
from agentrl.rollout import pack
from agentrl import sharding
from agentrl.train import loop
from agentrl import types
from kernels.logprob import kl as kl_lib

METHODS = ("opd", "opsd", "pw_opsd")
OPSD = ("opsd", "pw_opsd")
TCOD = ("none", "f2b", "b2f")


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  if arg.preset not in ("cpu", "pod"):
    raise configs.ConfigError(f"unknown opd_agent preset {arg.preset!r}; use cpu (default), "
                              "pod or smoke")
  c = rl_config.agent_study(arg, experiment="opd_agent", names=registry.NAMES)
  # The teacher of method opd: a finished experiments.agents.agent run on the same task and
  # tokenizer; step "latest", "warm_start" or a saved step number.
  c.teacher = dict(run_dir="runs/agent" if arg.preset == "cpu" and not arg.smoke else "",
                   step="latest")
  # method, tcod: the module docstring. form, lam, eps_*: opd's reward and loss (opd.py).
  # opsd_teacher: "frozen" (the warm start) or "current"; opsd_context: the privileged
  # teacher's prompt, {obs} the first observation, {answer} the secret; kl_top_k: 0 = the
  # full vocabulary; pw_*: PW-OPSD's "Moderate" schedule (w_min, tau, s); tcod_every,
  # b2f_every: TCOD's curriculum steps [INF: its ALFWorld values].
  c.loss = dict(method="opd", form="ppo", lam=1.0, eps_low=0.2, eps_high=0.2, agg="auto",
                gate="none", gate_tau=1.0, opsd_teacher="frozen",
                opsd_context="{obs} the secret is {answer}", kl_top_k=0, pw_min=0.25,
                pw_tau=0.30, pw_s=0.10, tcod="none", tcod_every=6, b2f_every=5)
  return c


SCHEMA = {
    **{k: v for k, v in rl_config.RL_SCHEMA.items() if not k.startswith("task.")},
    **registry.schema(registry.NAMES),
    "sft.demo_noise": configs.Key(float, min=0.0, max=1.0),
    "teacher.run_dir": configs.Key(str),
    "teacher.step": configs.Key(str),
    "loss.method": configs.Key(str, choices=METHODS),
    "loss.form": configs.Key(str, choices=("ppo", "reinforce")),
    "loss.lam": configs.Key(float, min=0.0),
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.agg": configs.Key(str, choices=("auto",) + tuple(
        m for m in aggregation.MODES if m != "seq-mean")),
    "loss.gate": configs.Key(str, choices=("none", "success", "failure")),
    "loss.gate_tau": configs.Key(float),
    "loss.opsd_teacher": configs.Key(str, choices=("frozen", "current")),
    "loss.opsd_context": configs.Key(str),
    "loss.kl_top_k": configs.Key(int, min=0),
    "loss.pw_min": configs.Key(float, min=0.0, max=1.0),
    "loss.pw_tau": configs.Key(float),
    "loss.pw_s": configs.Key(float, min=0.0),
    "loss.tcod": configs.Key(str, choices=TCOD),
    "loss.tcod_every": configs.Key(int, min=1),
    "loss.b2f_every": configs.Key(int, min=1),
}


def check_method(config) -> None:
  """ConfigError for a method or curriculum the chosen task cannot serve."""
  lc, name = config.loss, config.task.name
  if lc.method in OPSD:
    configs.require(name == "hidden_rule", f"config.loss.method={lc.method!r} needs the "
                    f"secret of a hidden_rule game as privileged context; task.name={name!r} "
                    "has none (use method=opd)")
    configs.require("{answer}" in lc.opsd_context,
                    f"config.loss.opsd_context={lc.opsd_context!r} must contain {{answer}}, "
                    "where the secret goes")
  if lc.tcod == "b2f":
    configs.require(registry.check(config.task).sft == "demonstrations",
                    f"config.loss.tcod='b2f' replays the env's scripted expert turns; "
                    f"task.name={name!r} has no demonstrations (use tcod=f2b or none)")


def loss_agg(lc) -> str:
  """loss.agg, with "auto" resolved to the method's paper's (module docstring)."""
  if lc.agg != "auto":
    return lc.agg
  return ("seq-mean-token-mean" if lc.method == "pw_opsd" or lc.tcod != "none"
          else "token-mean")


# ---------------------------------------------------------------------------------------------
# The teachers, the score step, the advantage step and the loss: the part to fork.
# ---------------------------------------------------------------------------------------------
def self_teacher(graphdef, params, frozen_params, *, frozen: bool):
  """OPSD's teacher model: the frozen warm start (`frozen_params`; None: a LoRA policy's base
  with the adapters off) or the current params, under a stop-gradient either way."""
  if not frozen:
    return nnx.merge(graphdef, jax.lax.stop_gradient(params))
  if frozen_params is None:
    return lora.base_model(nnx.merge(graphdef, jax.lax.stop_gradient(params)))
  return nnx.merge(graphdef, jax.lax.stop_gradient(frozen_params))


def teacher_view(batch: types.Batch) -> distill.TeacherInputs:
  """The privileged teacher's rows for `batch` (its aux holds the context the rollout made)."""
  aux = batch.aux
  return distill.privileged_teacher_inputs(
      batch.tokens_BT, batch.input_mask_BT, aux["response_start_B"], aux["context_ids_BX"],
      aux["context_mask_BX"], keep_prompt=False)


def make_score_step(config, graphdef, teacher_graphdef=None):
  """score_step(params, ref_params, teacher_params, batch) -> (batch, metrics).

  The learner's score step (old_logp, ref_logp, the `kl` to the warm start) plus the
  teacher's log-probs of the sampled tokens in `batch.aux["teacher_logp_BT"]`: the teacher
  run's (opd) or the privileged self-teacher's, aligned to the student's columns (OPSD;
  `teacher_params` unused).
  """
  lc, temperature = config.loss, config.rollout.temperature
  impl = config.model.logprob_impl
  student_step = loop.make_score_step(graphdef, temperature=temperature, logprob_impl=impl,
                                      with_ref=True)

  def score_step(params, ref_params, teacher_params, batch: types.Batch):
    batch, metrics = student_step(params, ref_params, batch)
    if lc.method == "opd":
      teacher = nnx.merge(teacher_graphdef, teacher_params)
      teacher_logp_BT = policy_lib.token_logprobs(
          teacher, batch.tokens_BT, batch.positions_BT, batch.input_mask_BT,
          temperature=temperature, impl=impl)
    else:
      teacher = self_teacher(graphdef, params, ref_params, frozen=lc.opsd_teacher == "frozen")
      view = teacher_view(batch)
      logp_BT = policy_lib.token_logprobs(teacher, view.tokens_BT, view.positions_BT,
                                          view.input_mask_BT, temperature=temperature,
                                          impl=impl)
      teacher_logp_BT = distill.align_to_student(logp_BT, view.index_BT, view.aligned_BT)
    return batch.replace(aux={**(batch.aux or {}), "teacher_logp_BT": teacher_logp_BT}), metrics

  return score_step


def make_advantage_fn(config):
  """(batch, extras) -> (batch, metrics): KEPO's gate on the loss mask, and for opd the
  reward r_t as adv_BT (OPSD's loss reads no advantage: adv_BT is 0)."""
  lc = config.loss

  def advantage_fn(batch: types.Batch, extras):
    del extras
    mask_BT, metrics = batch.loss_mask_BT, {}
    if lc.gate != "none":  # KEPO: rows outside the gate are not distilled at all
      gate_B = distill.quality_gate(batch.reward_B, tau=lc.gate_tau, keep=lc.gate)
      mask_BT = mask_BT * gate_B[:, None]
      metrics["gate_kept"] = gate_B.mean()
    teacher_logp_BT = batch.aux["teacher_logp_BT"]
    r_BT = distill.opd_advantage(batch.old_logp_BT, teacher_logp_BT, mask_BT,
                                 ref_logp_BT=batch.ref_logp_BT,
                                 lam=lc.lam if lc.method == "opd" else 1.0)
    metrics["opd_reward"] = aggregation.masked_mean(r_BT, mask_BT)
    metrics["opd_teacher_kl"] = aggregation.masked_mean(
        jnp.where(mask_BT > 0, batch.old_logp_BT - teacher_logp_BT, 0.0), mask_BT)
    adv_BT = r_BT if lc.method == "opd" else jnp.zeros_like(r_BT)
    metrics["adv_abs_mean"] = aggregation.masked_mean(jnp.abs(adv_BT), mask_BT)
    return batch.replace(adv_BT=adv_BT, loss_mask_BT=mask_BT), metrics

  return advantage_fn


def opsd_kl(config, graphdef, params, frozen_params, batch: types.Batch):
  """Per-token forward KL(p_T || p_S) `[B, T]` of OPSD's privileged self-teacher, in the
  student's columns (0 where the student column has no teacher column), and the aligned mask."""
  lc = config.loss
  student = nnx.merge(graphdef, params)
  h_BTD = student.hidden(batch.tokens_BT, batch.positions_BT, batch.input_mask_BT)
  # Column t holds the state that predicts token t (column 0 predicts nothing: masked).
  h_BTD = jnp.pad(h_BTD[:, :-1], ((0, 0), (1, 0), (0, 0)))
  teacher = self_teacher(graphdef, params, frozen_params, frozen=lc.opsd_teacher == "frozen")
  view = teacher_view(batch)
  ht_BTD = teacher.hidden(view.tokens_BT, view.positions_BT, view.input_mask_BT)
  ht_BTD = distill.align_to_student(ht_BTD, view.index_BT - 1, view.aligned_BT)
  B, T, D = h_BTD.shape
  kl_N = kl_lib.distill_kl(h_BTD.reshape(B * T, D), student.unembed_DV(),
                           ht_BTD.reshape(B * T, ht_BTD.shape[-1]), teacher.unembed_DV(),
                           kind="forward", top_k=lc.kl_top_k or None,
                           temperature=config.rollout.temperature)
  return jnp.where(view.aligned_BT, kl_N.reshape(B, T), 0.0), view.aligned_BT


def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch, frozen_params) -> (state, metrics); frozen_params is
  the warm start (OPSD's frozen teacher; None under LoRA or when unused), a non-donated
  argument. Pure; jit it in train()."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature
  agg = loss_agg(lc)

  def loss_fn(params, batch: types.Batch, frozen_params):
    mask_BT = batch.loss_mask_BT
    if lc.method in OPSD:
      kl_BT, aligned_BT = opsd_kl(config, graphdef, params, frozen_params, batch)
      mask_BT = mask_BT * aligned_BT
      weight_BT = (distill.position_weights(mask_BT, w_min=lc.pw_min, tau=lc.pw_tau, s=lc.pw_s)
                   if lc.method == "pw_opsd" else None)
      loss_BT, metrics = distill.distill_kl_loss(kl_BT, mask_BT, weight_BT=weight_BT)
    else:
      policy = nnx.merge(graphdef, params)
      logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                          batch.input_mask_BT, temperature=temperature,
                                          impl=impl)
      if lc.form == "ppo":
        loss_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT,
                                       eps_low=lc.eps_low, eps_high=lc.eps_high)
      else:  # -sg(r_t) log pi, r_t from the score-time log-probs
        loss_BT = jnp.where(mask_BT > 0, -jax.lax.stop_gradient(batch.adv_BT) * logp_BT, 0.0)
        metrics = {}
    loss = aggregation.aggregate(loss_BT, mask_BT, agg)
    return loss, metrics | {"loss": loss}

  def update_step(state, batch: types.Batch, frozen_params):
    step = loop.gradient_step(lambda p, b: loss_fn(p, b, frozen_params), tx)
    return loop.skip_nonfinite(step)(state, batch)

  return update_step


# ---------------------------------------------------------------------------------------------
# The rollout: whole episodes (TCOD's cap or expert prefix), the privileged context.
# ---------------------------------------------------------------------------------------------
def turn_cap(lc, step: int, max_turns: int) -> int:
  """Model turns the student may play at RL step `step` (1-based): TCOD-f2b's cap, or all."""
  if lc.tcod != "f2b":
    return max_turns
  return int(distill.tcod_turn_cap(step - 1, every=lc.tcod_every, max_turns=max_turns))


def expert_prefixes(make_env, seeds, step: int, every: int) -> list[list[str]]:
  """TCOD-b2f: per seed, the first `tcod_b2f_start(step - 1, E)` of the E actions of the
  game's scripted expert (noise 0), replayed before the student plays."""
  out = []
  for seed in seeds:
    demo = make_env().demonstration(seed, random.Random(seed), noise=0.0)
    out.append(list(demo[:int(distill.tcod_b2f_start(step - 1, len(demo), every=every))]))
  return out


def pad_rows(rows: list[np.ndarray], pad_id: int, min_width: int = 16):
  """Right-padded int32 ids and their mask, width the power of two >= the longest row."""
  width = max(min_width, 1 << (max(len(r) for r in rows) - 1).bit_length())
  ids = np.full((len(rows), width), pad_id, np.int32)
  mask = np.zeros((len(rows), width), bool)
  for i, r in enumerate(rows):
    ids[i, :len(r)], mask[i, :len(r)] = r, True
  return ids, mask


def privileged_context(trajs, seeds, make_env, render, template: str, *, group_size: int,
                       pad_id: int) -> dict[str, np.ndarray]:
  """OPSD's per-row teacher prompt (`template` with {obs} the first observation and {answer}
  the secret, rendered as the rollout renders prompts) and the column where each student row's
  own first prompt ends (its turns, and any replayed ones, are copied after the context)."""
  contexts, starts = [], []
  for i, seed in enumerate(seeds):
    env = make_env()
    obs = env.reset(seed)
    examples = getattr(env, "examples", ())
    prompt = render.prompt(obs, env.system_prompt, examples)
    text = template.format(obs=obs, answer=env.answer)
    contexts.append(np.asarray(render.prompt(text, env.system_prompt, examples), np.int32))
    if text not in render.tok.decode(contexts[-1]):   # e.g. a character the vocabulary lacks
      raise ValueError(f"config.loss.opsd_context={template!r}: the tokenizer cannot spell "
                       f"{text!r} (it decodes as {render.tok.decode(contexts[-1])!r})")
    starts.append(len(prompt))
    if any(list(t.tokens[:len(prompt)]) != prompt for t in trajs[i * group_size:][:group_size]):
      raise ValueError(f"seed {seed}: the rollout's prompt is not the rendered first "
                       "observation, so the privileged view would not align")
  ids, mask = pad_rows([c for c in contexts for _ in range(group_size)], pad_id)
  return {"context_ids_BX": ids, "context_mask_BX": mask,
          "response_start_B": np.repeat(np.asarray(starts, np.int32), group_size)}


def make_rollout_fn(config, engine, tok, make_env, data, mesh):
  """rollout_fn(params, rng, step): G whole episodes per prompt (TCOD's cap or expert prefix),
  packed, with the privileged context in aux for OPSD."""
  rc, tc, lc = config.rollout, config.task, config.loss
  G, U, rows = rc.group_size, make_env().max_turns, sharding.batch_sharding(mesh)
  render = agent_loop.Renderer(tok, chat_template=tc.chat_template, system_prompt=None)

  def rollout_fn(params, rng, step):
    seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
    cap = turn_cap(lc, step, U)
    run = dict(group_size=G, rng=rng, max_turns=cap, max_new_tokens=rc.max_new_tokens,
               max_len=rc.max_len, temperature=rc.temperature, chat_template=tc.chat_template)
    if lc.tcod == "b2f":
      groups = continuations.replay_then_rollout(
          engine, params, tok, make_env, seeds, expert_prefixes(make_env, seeds, step,
                                                                lc.b2f_every), **run)
    else:
      groups = agent_loop.rollout_groups(engine, params, tok, make_env, seeds, **run)
    trajs = groups.trajectories
    host = pack.pack_numpy(trajs, max_len=rc.max_len, pad_id=tok.pad_id, min_len=rc.max_len)
    if lc.method in OPSD:
      host = host.replace(aux=privileged_context(trajs, seeds, make_env, render,
                                                 lc.opsd_context, group_size=G,
                                                 pad_id=tok.pad_id))
    metrics = {**groups.metrics, **collect.rollout_metrics(trajs),
               **collect.batch_metrics(trajs, host)}
    if lc.tcod == "f2b":
      metrics["tcod/turn_cap"] = float(cap)
    return loop.Rollout(batch=jax.device_put(host, rows), metrics=metrics,
                        trajectories=trajs, tokenizer=tok)

  return rollout_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """Multi-turn on-policy distillation end to end; returns the summary (summary.json)."""
  rl_config.validate(config, SCHEMA)
  check_method(config)
  start = rundir.write_config(config, workdir, experiment="opd_agent")
  lc, mesh = config.loss, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Student (warm-started), the teacher run (opd), the frozen warm start, optimizer.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  teacher = (saved_run.load_teacher(config.teacher.run_dir, config.teacher.step, tok,
                                    mesh=mesh, make="python -m experiments.agents.agent "
                                    "--workdir=runs/agent")
             if lc.method == "opd" else None)
  engine = recipe.rollout_engine(config, graphdef, tok)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok,
                                       engine=engine)
  ref_params = recipe.reference_params(params)  # a copy; None: LoRA's frozen base
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  # ---- Jitted steps.
  score_step = jax.jit(make_score_step(config, graphdef,
                                        teacher.graphdef if teacher else None))
  teacher_params = teacher.params if teacher else None
  update_step = jax.jit(make_update_step(config, graphdef, tx), donate_argnames="state",
                        out_shardings=(state_shardings, None))

  # ---- Data, held-out evaluation (every turn; the teacher run's too, on the same episodes).
  data = recipe.prompt_stream(make_env)
  evaluate = recipe.evaluator(config, engine, tok, make_env)
  extra = {}
  if teacher:
    with jax.set_mesh(mesh):
      teacher_engine = recipe.rollout_engine(teacher.config, teacher.graphdef, tok)
      extra["teacher_success"] = recipe.evaluator(config, teacher_engine, tok, make_env)(
          teacher.params)["success"]
    print(f"Teacher held-out greedy success: {extra['teacher_success']:.1%}", flush=True)

  # ---- The loop.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=make_rollout_fn(config, engine, tok, make_env, data, mesh),
        score_fn=lambda p, batch: score_step(p, ref_params, teacher_params, batch),
        advantage_fn=jax.jit(make_advantage_fn(config)),
        update_fn=lambda state, batch: update_step(state, batch, ref_params), data=data,
        evaluate=evaluate, **recipe.loop_options(config))
  name = {"opd": "OPD", "opsd": "OPSD", "pw_opsd": "PW-OPSD"}[lc.method]
  name += {"none": "", "f2b": " + TCOD-f2b", "b2f": " + TCOD-b2f"}[lc.tcod]
  return rundir.write_summary(workdir, result, name=f"{name} (multi-turn)", start=start,
                              sft_info=sft_info, extra=extra)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
