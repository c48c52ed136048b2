"""A run's policy read back for evaluation or serving: its config and one checkpoint's params.

  run = saved_run.load_run("runs/grpo", "latest")   # tok, graphdef, params, step, config
  engine = recipe.rollout_engine(run.config, run.graphdef, run.tok)
  teacher = saved_run.load_teacher("runs/grpo", "latest", tok, mesh=mesh)  # + same tokenizer

`load_run` reads <run_dir>/config.json (every RL experiment writes it with
`rundir.write_config`), rebuilds the tokenizer and model (`recipe.build_policy`) and reads only
the policy's params of checkpoint `step` ("latest", a step number, or "warm_start" for the SFT
policy before RL), read-only: neither the run's optimizer nor its extra state (a critic, a
replay batch) is needed, and a live run is never disturbed. A LoRA policy comes back merged,
W + (alpha / rank) A B in each projection. With `model_path` (an HF directory or a .gguf) the
weights come from there instead, in the run's dtype; the run still supplies the task, the
rollout settings, and its tokenizer when the path has none.

The errors a user can fix (not a run directory, a damaged config.json, no checkpoint, a step
that was not kept, a missing model_path) are one ConfigError each, raised before the model is
built and naming the setting as `prefix` + "run_dir", "step" or "model_path" ("config." for
experiments.eval's keys, "--" for the flags of `python -m agentrl.serve`).

`load_teacher` is `load_run` for an on-policy distillation teacher (experiments/distill/): an
empty run_dir names the command that makes one, and a teacher whose tokenizer is not the
student's, token by token, is refused (token-level log-probs of one vocabulary mean nothing in
another).
"""
import dataclasses
import os
from typing import Any, NamedTuple

from flax import nnx
import ml_collections as mlc

from agentrl import configs
from agentrl import sharding
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.models import hf
from agentrl.models import lora
from agentrl.records import rundir

# The run config keys a reader uses with no default (an older run may lack others).
RUN_KEYS = ("task.name", "task.chat_template", "model.init", "model.dtype",
            "rollout.max_new_tokens", "rollout.max_len", "mesh", "sharding_rules")


class SavedRun(NamedTuple):
  """A run's policy as `load_run` read it.

  Attributes:
    tok: its tokenizer.
    graphdef, params: the policy (LoRA merged), params sharded on the run's mesh.
    step: the checkpoint read ("12", "warm_start"), or "hf:<model_path>".
    config: the run's config.json (`read_config`).
  """
  tok: Any
  graphdef: nnx.GraphDef
  params: nnx.State
  step: str
  config: mlc.ConfigDict


def read_config(run_dir: str) -> mlc.ConfigDict:
  """The run's config.json, its keys checked against the shared RL schema (any task), so a
  damaged or hand-edited file fails in one line naming it and the key, before anything is
  built. No experiment imports another, so a method's own keys are not checked here; no reader
  uses them. Methods tighten or relax the shared bounds (MSSR runs groups of one), so only
  RUN_KEYS keep theirs; the others are checked for their type."""
  schema = {k: v if k.startswith(RUN_KEYS) else dataclasses.replace(v, min=None, max=None)
            for k, v in rl_config.RL_SCHEMA.items()}
  schema["task.name"] = configs.Key(str, choices=rl_config.TASKS)
  return rundir.read_config(run_dir, schema, required=RUN_KEYS)


def load_hf(path: str, run_tok, run_config, mesh):
  """(tokenizer, graphdef, params) of an HF directory or GGUF, sharded like the run's policy.

  The tokenizer is path's own, or the run's when it has none; either is refused when it has
  more ids than the model has rows (`hf.load_with_tokenizer`).
  """
  # Computed in the run's dtype (hf.load's default is bfloat16), so an exported checkpoint
  # scores exactly as the checkpoint itself.
  tok, _, graphdef, params = hf.load_with_tokenizer(path, fallback=run_tok,
                                                    dtype=run_config.model.dtype)
  rules = run_config.sharding_rules
  return tok, graphdef, sharding.reshard(params, sharding.tree_shardings(params, mesh, rules))


def check_args(run_dir: str, step: str, *, model_path: str = "",
               prefix: str = "config.") -> None:
  """ConfigError unless run_dir holds a run's config.json, step is 'latest', 'warm_start' or a
  step number, and model_path (if given) exists."""
  configs.require(not model_path or os.path.exists(model_path),
                  f"{prefix}model_path={model_path!r} does not exist; give an HF model "
                  "directory (config.json + safetensors) or a .gguf file")
  configs.require(os.path.isfile(os.path.join(run_dir, "config.json")),
                  f"{prefix}run_dir={run_dir!r} is not a run directory (it has no "
                  "config.json); give the --workdir of an experiment's run")
  configs.require(step in ("latest", "warm_start") or step.isdigit(),
                  f"{prefix}step must be 'latest', 'warm_start' or a step number, got {step!r}")


def load_run(run_dir: str, step: str = "latest", *, model_path: str = "",
             prefix: str = "config.", mesh=None) -> SavedRun:
  """The policy of checkpoint `step` of the run in `run_dir` (module docstring), sharded on
  `mesh` (None: a mesh of the run's own config.mesh)."""
  check_args(run_dir, step, model_path=model_path, prefix=prefix)
  run_config = read_config(run_dir)
  if not model_path:
    rundir.saved_step(run_dir, step, flag=f"{prefix}step")   # fails before the build
  mesh = sharding.make_mesh(run_config.mesh) if mesh is None else mesh
  tok, graphdef, params = recipe.build_policy(run_config, mesh)
  if model_path:
    tok, graphdef, params = load_hf(model_path, tok, run_config, mesh)
    step = f"hf:{model_path}"
  else:
    params, step = rundir.load_params(run_dir, step, params, flag=f"{prefix}step")
  if lora.has_adapters(params):
    graphdef, params = lora.merge(graphdef, params)
  return SavedRun(tok, graphdef, params, step, run_config)


def same_tokenizer(a, b) -> bool:
  """Whether tokenizers a and b have the same vocabulary, id by id (decoded pieces)."""
  return a.vocab_size == b.vocab_size and all(a.decode([i]) == b.decode([i])
                                              for i in range(a.vocab_size))


def load_teacher(run_dir: str, step: str, tok, *, mesh=None, prefix: str = "config.teacher.",
                 make: str = "python -m experiments.policy.grpo --workdir=runs/grpo"
                 ) -> SavedRun:
  """An on-policy distillation teacher: `load_run(run_dir, step)` on the student's `mesh`,
  refused unless its tokenizer is the student's `tok`. `make` is the command that makes a
  teacher run, named when run_dir is empty (errors name `prefix` + run_dir / step)."""
  configs.require(bool(run_dir), f"{prefix}run_dir is empty: give the --workdir of a finished "
                  f"run, e.g. run {make} first")
  configs.require(os.path.isfile(os.path.join(run_dir, "config.json")),
                  f"{prefix}run_dir={run_dir!r} has no config.json; run the teacher first "
                  f"({make}, with --workdir={run_dir}) or point it at another run's --workdir")
  teacher = load_run(run_dir, step, prefix=prefix, mesh=mesh)
  configs.require(same_tokenizer(teacher.tok, tok),
                  f"{prefix}run_dir={run_dir!r}: the teacher's tokenizer "
                  f"({teacher.tok.vocab_size} tokens) is not the student's ({tok.vocab_size}); "
                  "on-policy distillation compares log-probs token by token, so a "
                  "cross-tokenizer teacher is not supported")
  print(f"Teacher: {run_dir} step {teacher.step} ({teacher.config.model.variant}).", flush=True)
  return teacher
