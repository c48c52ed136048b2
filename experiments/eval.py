# pylint: disable=invalid-name
r"""Held-out success rate and pass@k of any checkpoint of any RL experiment's run.

  python -m experiments.eval                                   # the main job's last checkpoint
  python -m experiments.eval --config.run_dir=runs/dapo --config.step=50 --workdir=runs/eval
  python -m experiments.eval --config=experiments/eval.py:smoke --config.run_dir=/tmp/grpo

Reads <run_dir>/config.json (every RL experiment writes it with `rundir.write_config`),
rebuilds the tokenizer and model, reads only the policy's params of checkpoint `step`
("latest", a step number, or "warm_start" for the SFT policy before RL) read-only, so neither
the run's optimizer nor its extra state (a critic, a replay batch) is needed and a live run is
never disturbed (agentrl/harness/saved_run.py, which `python -m agentrl.serve` shares), and
evaluates on the held-out seeds (recipe.EVAL_SEED_BASE + i, disjoint from
every training seed), with as many turns as the run's task allows:

  greedy success   one argmax decode per problem;
  pass@k           n samples per problem at `temperature`, scored with the unbiased estimator
                   pass@k = 1 - C(n - c, k) / C(n, k) averaged over problems (Chen et al. 2021,
                   "Evaluating Large Language Models Trained on Code", eq. 1), c = # correct.

PRM verification: `--config.prm=DIR` (the --workdir of an experiments.preference.prm run on the
run's model and task; another model or tokenizer, or a DIR without prm/, is an error naming
both) scores every model turn of the n samples with that PRM (agentrl/harness/saved_prm.py),
aggregates a sample's turn scores into its solution score (`--config.prm_agg`: min, the
Math-Shepherd verifier's and the default; prod; last) and adds, for each k in ks, over each
problem's first k samples (docs/algorithms.md §15.5):

  prm_best@k       success of the highest-scored sample (ties: the earliest);
  prm_vote@k       PRM-weighted majority vote: argmax_a sum_i [a_i = a] score_i (`weighted_vote`);
  majority@k       the plain majority vote (self-consistency), for scale.

A vote is correct when a sample that gave the voted answer succeeded; ties go to the answer seen
first, and a problem where no sample gave an answer counts as wrong. The voted answer is the
task's final answer: the completion as the task reads it on a single-turn task
(`relabel.final_answer`), the last model turn's command on a multi-turn env whose registry row
has `parse_action` (the hidden-rule games, TextWorld: "guess 37"). Other multi-turn envs
(calculator, tool_use, search, alfworld) expose no final answer: the votes are skipped, the
output's `vote` says why, and only prm_best@k is reported.

  python -m experiments.eval --config.run_dir=runs/prm_rl --config.prm=runs/prm
  python -m experiments.eval --config.run_dir=runs/agent --config.prm=runs/prm \
      --config.prm_agg=prod --config.samples=16 --config.ks=1,4,16

HF-exported weights: `--config.export_hf=DIR` also writes the evaluated params as a
transformers-loadable directory (config.json, model.safetensors, generation_config.json with our
stop ids, a tokenizer that encodes exactly as ours, BOS included) and prints what it wrote, and
`--config.model_path=DIR` (an HF directory or a .gguf) evaluates those weights, in the run's
dtype, instead of a checkpoint of run_dir; run_dir still supplies the task and rollout lengths,
and its tokenizer when DIR has none. An export evaluates exactly as its checkpoint. A LoRA run
(`lora.rank` > 0) is evaluated and exported merged: W + (alpha / rank) A B in each projection.
DIR is written whole (a new directory renamed into place) with agentrl_export.json naming the
run and step; a non-empty DIR that is not an export of the same run is refused unless
`--config.export_overwrite=True` (which replaces it whole), and a run's workdir, or a
directory inside one, always is.

  python -m experiments.eval --config.export_hf=runs/grpo_hf      # checkpoint -> HF dir
  python -m experiments.eval --config.model_path=runs/grpo_hf     # evaluate the HF dir

Writes <workdir>/eval_<run>-<hash>_<step>.json (one file per evaluated checkpoint; <hash> tells
apart runs of one name in different directories; the workdir defaults to runs/eval) and prints
a table. A run keeps its newest `log.keep` checkpoints and those of its
evaluation steps (every `eval.every`), so the default run's steps 25, 50, ..., 150 can be
evaluated; a step that was not kept is an error that lists the ones that were. pass@k:
`--config.ks=1,4` (or `'[1,4]'`), each k <= `samples`. With `--config.prm` the file and the
table also hold prm_best@k, prm_vote@k and majority@k (or `vote`, why there are no votes).
"""
import hashlib
import json
import math
import os
import shutil

from absl import app
from flax import nnx
import jax
import ml_collections as mlc
import numpy as np

from agentrl import configs
from agentrl.credit import probes
from agentrl import distributed
from agentrl.envs import registry
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import relabel
from agentrl.harness import saved_prm
from agentrl.harness import saved_run
from agentrl.models import hf
from agentrl.models import hf_tokenizer
from agentrl.rollout import collect
from agentrl.records import metrics as metrics_lib
from agentrl.records import rundir
from agentrl.rewards import process


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, smoke=False)
  c = mlc.ConfigDict()
  c.run_dir = "runs/grpo"
  c.step = "latest"              # "latest", "warm_start" or a step number as a string
  c.num_problems = 1000
  c.samples = 8                  # n per problem for pass@k (sampled at `temperature`)
  c.ks = "1,4,8"                 # pass@k for these k (each <= samples): "1,4" or "[1,4]"
  c.temperature = 1.0
  c.seed = 0
  c.model_path = ""              # HF directory or .gguf to evaluate instead of a checkpoint
  c.export_hf = ""               # also write the evaluated params here as an HF directory
  c.export_overwrite = False     # replace export_hf whole even if it holds something else
  c.prm = ""                     # an experiments.preference.prm workdir: best-of-n and votes
  c.prm_agg = "min"              # a sample's score from its turn scores: min, prod or last
  c.prm_batch_size = 32          # samples per PRM forward pass
  if arg.smoke:  # Seconds on CPU; run by tests/experiments_smoke_test.py.
    c.num_problems, c.samples, c.ks = 4, 2, "1,2"
  return c


SCHEMA = {
    "run_dir": configs.Key(str),
    "step": configs.Key(str),
    "num_problems": configs.Key(int, min=1),
    "samples": configs.Key(int, min=1),
    "ks": configs.Key(str, min=1),
    "temperature": configs.Key(float, min=1e-3),
    "seed": configs.Key(int, min=0),
    "model_path": configs.Key(str),
    "export_hf": configs.Key(str),
    "export_overwrite": configs.Key(bool),
    "prm": configs.Key(str),
    "prm_agg": configs.Key(str, choices=process.REDUCES),
    "prm_batch_size": configs.Key(int, min=1),
}
EXPORT_MARKER = "agentrl_export.json"  # {"run_dir", "step"}: the run an export directory holds


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021, eq. 1)."""
  if n - c < k:
    return 1.0
  return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def parse_ks(text: str, samples: int) -> list[int]:
  """"1,4", "[1, 4]" or "(1,4)" -> [1, 4]; ConfigError unless each k is an int in [1, samples]."""
  parts = [p.strip() for p in text.strip().strip("[]()").split(",") if p.strip()]
  ks = []
  for part in parts:
    configs.require(part.isdigit() and 1 <= int(part) <= samples,
                    f"config.ks={text!r}: each k must be an integer in [1, config.samples="
                    f"{samples}], got {part!r}")
    ks.append(int(part))
  configs.require(bool(ks), f"config.ks={text!r}: give at least one k, e.g. --config.ks=1,4")
  return sorted(set(ks))


def validate(config) -> None:
  configs.validate(config, SCHEMA)
  parse_ks(config.ks, config.samples)
  saved_run.check_args(config.run_dir, config.step, model_path=config.model_path)
  if config.export_hf:
    check_export_dir(config.export_hf, config.run_dir, overwrite=config.export_overwrite)
  if config.prm:  # before the model is built: the PRM must share the run's model and tokenizer
    saved_prm.check(config.prm, saved_run.read_config(config.run_dir), flag="config.prm",
                    run=config.run_dir)


def voted_answers(trajs, tok, task) -> tuple[list[str | None] | None, str]:
  """(each sample's final answer, "") for voting, or (None, why not) (module docstring)."""
  row = registry.check(task)
  if "max_turns" not in row.fields:
    return relabel.answers(trajs, tok, task.name), ""
  if row.parse_action is not None:
    return probes.final_answers(trajs, tok, row.parse_action), ""
  return None, (f"skipped: task.name={task.name!r} is multi-turn and its env exposes no final "
                "answer (no registry parse_action); prm_best@k only")


def verification(config, run_config, tok, make_env, sampled, success_PN, prm) -> dict:
  """PRM best-of-k, PRM-weighted and plain majority votes for each k (module docstring)."""
  logits_fn, prm_params = prm
  score_BU, mask_BU = saved_prm.step_scores(
      logits_fn, prm_params, sampled, max_steps=make_env().max_turns,
      max_len=run_config.rollout.max_len, pad_id=tok.pad_id, batch_size=config.prm_batch_size)
  score_PN = process.solution_scores(score_BU, mask_BU, reduce=config.prm_agg).reshape(
      success_PN.shape)
  answers, why = voted_answers(sampled, tok, run_config.task)
  result = {"prm": config.prm, "prm_agg": config.prm_agg}
  ks = parse_ks(config.ks, config.samples)
  for k in ks:
    result[f"prm_best@{k}"] = process.best_of_n_accuracy(score_PN, success_PN, k=k)
  if answers is None:
    return result | {"vote": why}
  n = config.samples
  answers_PN = [answers[i:i + n] for i in range(0, len(answers), n)]
  for k in ks:
    result[f"prm_vote@{k}"] = process.vote_accuracy(answers_PN, score_PN, success_PN, k=k)
  for k in ks:
    result[f"majority@{k}"] = process.vote_accuracy(answers_PN, np.ones_like(score_PN),
                                                    success_PN, k=k)
  return result


def evaluate(config, run_config, engine, tok, make_env, params, prm=None) -> dict:
  """Greedy success and unbiased pass@k over the held-out problems; with `prm` (logits_fn,
  params of `saved_prm.load`) also its best-of-k and votes (`verification`)."""
  rc = run_config.rollout
  seeds = [recipe.EVAL_SEED_BASE + i for i in range(config.num_problems)]
  common = dict(max_turns=run_config.task.get("max_turns", 1),
                max_new_tokens=rc.max_new_tokens, max_len=rc.max_len,
                chat_template=run_config.task.chat_template)
  greedy, _ = engine.run(params, tok, [make_env() for _ in seeds], seeds,
                         rng=jax.random.key(config.seed), greedy=True, **common)
  rows = [s for s in seeds for _ in range(config.samples)]
  sampled, _ = engine.run(params, tok, [make_env() for _ in rows], rows,
                          rng=jax.random.key(config.seed + 1), temperature=config.temperature,
                          **common)
  success_PN = np.asarray([collect.trajectory_success(t) for t in sampled]).reshape(
      config.num_problems, config.samples)
  correct = success_PN.sum(1)
  result = {"greedy_success": float(np.mean([collect.trajectory_success(t) for t in greedy]))}
  for k in parse_ks(config.ks, config.samples):
    result[f"pass@{k}"] = float(np.mean([pass_at_k(config.samples, int(c), k) for c in correct]))
  if prm is not None:
    result |= verification(config, run_config, tok, make_env, sampled, success_PN, prm)
  return result


def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """Evaluates the checkpoint; `train` by name so the smoke test treats every binary alike."""
  validate(config)
  # A LoRA policy comes back merged: evaluated and exported with W + (alpha / rank) A B.
  tok, graphdef, params, step, run_config = saved_run.load_run(
      config.run_dir, config.step, model_path=config.model_path)
  if config.export_hf:
    export(nnx.merge(graphdef, params).cfg, params, tok, config.export_hf, step,
           run_dir=config.run_dir, overwrite=config.export_overwrite)
  engine = recipe.rollout_engine(run_config, graphdef, tok)
  prm = (saved_prm.load(config.prm, graphdef, params, seed=config.seed, flag="config.prm")
         if config.prm else None)
  result = {"run_dir": config.run_dir, "step": step, "num_problems": config.num_problems,
            "samples": config.samples,
            **evaluate(config, run_config, engine, tok, recipe.make_task(run_config.task), params,
                       prm=prm)}
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, result_name(config.run_dir, step))
  rundir.atomic_write(path, json.dumps(result, indent=2))
  rows = [[k, f"{v:.1%}"] for k, v in result.items() if k == "greedy_success" or "@" in k]
  print(metrics_lib.format_table([f"{config.run_dir} @ {step}", "held-out"], rows))
  if "vote" in result:
    print(f"PRM votes {result['vote']}")
  print(f"wrote {path}")
  return result


def result_name(run_dir: str, step: str) -> str:
  """eval_<run>-<hash>_<step>.json: one file per evaluated checkpoint, so none overwrites another.

  <hash> (8 hex digits of the run directory's real path, and of the model_path for an "hf:"
  step) tells apart runs of one name, e.g. sweepA/seed0 and sweepB/seed0.
  """
  what = (f"hf-{os.path.basename(os.path.normpath(step[3:]))}" if step.startswith("hf:")
          else step)
  where = os.path.realpath(run_dir) + ("\0" + os.path.realpath(step[3:])
                                       if step.startswith("hf:") else "")
  digest = hashlib.sha256(where.encode()).hexdigest()[:8]
  name = f"eval_{os.path.basename(os.path.normpath(run_dir))}-{digest}_{what}.json"
  return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def _export_of(directory: str) -> str | None:
  """The run directory an earlier export into `directory` recorded; None if none did."""
  try:
    with open(os.path.join(directory, EXPORT_MARKER)) as f:
      run_dir = json.load(f).get("run_dir")
  except (OSError, ValueError, AttributeError):
    return None
  return run_dir if isinstance(run_dir, str) else None


def check_export_dir(directory: str, run_dir: str | None, *, overwrite: bool) -> None:
  """Raises ConfigError unless `export` may write `directory`.

  It may write a new or empty directory, an earlier export of the same run, or (with
  `overwrite`) any other directory, which it replaces whole: files left beside a new export
  (a sharded model's index, another tokenizer's maps) would be loaded with it. Never a run's
  workdir or a directory inside one: the export's config.json would replace the run's.
  """
  path = os.path.realpath(directory)
  parent = path
  while True:
    if rundir.is_run_dir(parent):
      where = "the" if parent == path else "inside the"
      raise configs.ConfigError(f"config.export_hf={directory!r} is {where} run directory "
                                f"{parent}; an export there would replace the run's "
                                "config.json. Choose a directory outside every run's workdir")
    if os.path.dirname(parent) == parent:
      break
    parent = os.path.dirname(parent)
  if not os.path.isdir(path):
    configs.require(not os.path.exists(path), f"config.export_hf={directory!r} is a file; "
                    "give a directory")
    return
  names = sorted(os.listdir(path))
  same_run = run_dir is not None and _export_of(path) == os.path.realpath(run_dir)
  if not names or overwrite or same_run:
    return
  holds = (f"an export of {_export_of(path)}" if _export_of(path) else
           f"files that are not an export of a run ({', '.join(names[:3])}"
           f"{', ...' if len(names) > 3 else ''})")
  raise configs.ConfigError(f"config.export_hf={directory!r} is not empty: it holds {holds}, "
                            f"not an export of {run_dir}. Choose a new or empty directory, or "
                            "pass --config.export_overwrite=True to replace it whole")


def _replace_dir(directory: str, write) -> None:
  """Calls write(tmp) on a new directory beside `directory`, then puts it in its place whole.

  A reader sees the old directory or the new one, never a mix; a failed write leaves the old
  one as it was.
  """
  path = os.path.realpath(directory)
  tmp, old = f"{path}.tmp-{os.getpid()}", f"{path}.old-{os.getpid()}"
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  try:
    write(tmp)
    if os.path.isdir(path) and os.listdir(path):
      os.rename(path, old)
      os.rename(tmp, path)
      shutil.rmtree(old)
    else:
      os.replace(tmp, path)  # replaces an empty directory too
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def export(model_cfg, params, tok, directory: str, step: str, *, run_dir: str | None = None,
           overwrite: bool = False) -> None:
  """Writes an HF directory (weights, config, stop ids, tokenizer) and says what it wrote.

  The directory is written whole, with EXPORT_MARKER naming `run_dir` and `step`; see
  `check_export_dir` for which directories it refuses.
  """
  check_export_dir(directory, run_dir, overwrite=overwrite)
  written = {}

  def write(tmp: str) -> None:
    hf.save(model_cfg, params, tmp)
    written["tokenizer"] = [os.path.basename(p) for p in hf_tokenizer.save(tok, tmp)]
    written["generation"] = os.path.basename(hf_tokenizer.save_generation_config(tok, tmp))
    with open(os.path.join(tmp, EXPORT_MARKER), "w") as f:
      json.dump({"run_dir": run_dir and os.path.realpath(run_dir), "step": step}, f)

  _replace_dir(directory, write)
  leaves = jax.tree.leaves(params)
  dtypes = "/".join(sorted({str(x.dtype) for x in leaves}))
  print(f"Exported step {step} to {directory}: {sum(x.size for x in leaves):,} parameters "
        f"({dtypes}), {tok.vocab_size} token ids")
  for name in ["config.json", "model.safetensors", written["generation"], *written["tokenizer"]]:
    kind = ("tokenizer" if name in written["tokenizer"] else
            "generate: stop ids" if name == written["generation"] else "model")
    print(f"  {name:24s} {os.path.getsize(os.path.join(directory, name)):>14,} bytes  ({kind})")
  if tok.bos_id is not None:  # transformers' default add_special_tokens=True = our plain prompts
    print(f"  tok(text) prepends BOS {tok.bos_token!r} as our plain-text prompts do; "
          "apply_chat_template adds none, as ours")
  print(f"  load: python -c \"from transformers import AutoModelForCausalLM, AutoTokenizer; "
        f"model = AutoModelForCausalLM.from_pretrained('{directory}'); "
        f"tok = AutoTokenizer.from_pretrained('{directory}')\"")


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
