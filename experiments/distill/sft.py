# pylint: disable=invalid-name
r"""Supervised fine-tuning (SFT) of a tiny from-scratch model on reversed-digit addition.

The warm start of the from-scratch RL runs, as a binary of its own: `agentrl.harness.sft.warm_start`
trains on gold answers (answer-token NLL) until greedy exact-match on a validation set reaches
`sft.target_success` or `sft.steps_max` steps have run, and says which one stopped it.

  python -m experiments.distill.sft                                    # default CPU run
  python -m experiments.distill.sft --config=experiments/distill/sft.py:smoke --workdir=/tmp/sft

Writes config.json, metrics.jsonl (one record per validation), summary.json and a params
checkpoint in <workdir>/ckpt.
"""
import json
import os

from absl import app
from flax import nnx
import ml_collections as mlc

from agentrl import checkpoint
from agentrl import configs
from agentrl import distributed
from agentrl.envs import arithmetic
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.harness import sft
from agentrl.models import transformer
from agentrl.records import metrics as metrics_lib
from agentrl.records import rundir
from agentrl import sharding


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, smoke=False)
  c = mlc.ConfigDict()
  c.seed = 0
  c.task = dict(digits=3)                  # a+b with `digits`-digit operands, answer reversed
  c.model = dict(variant="tiny", width=64, depth=2, heads=8, kv_heads=8, head_dim=8, mlp=256,
                 logprob_impl="xla")
  # steps_max is an upper bound: SFT stops once validation greedy exact-match >= target.
  c.sft = dict(steps_max=2000, target_success=0.2, batch_size=64, lr=1e-3, b2=0.99,
               clip_norm=1.0, eval_every=25, eval_problems=512)
  c.mesh = dict(data=1, fsdp=1, tensor=1)
  c.sharding_rules = list(sharding.DEFAULT_RULES)
  if arg.smoke:  # Seconds on CPU; run by tests/experiments_smoke_test.py.
    c.sft.update(steps_max=2, batch_size=8, eval_every=1, eval_problems=8)
  return c


SCHEMA = {
    "seed": rl_config.RL_SCHEMA["seed"],
    "task.digits": rl_config.RL_SCHEMA["task.digits"],
    **{k: v for k, v in rl_config.RL_SCHEMA.items()
       if k.startswith("sft.") or k in ("mesh", "sharding_rules")},
    **{f"model.{k}": rl_config.RL_SCHEMA[f"model.{k}"]
       for k in ("variant", "width", "depth", "heads", "kv_heads", "head_dim", "mlp",
                 "logprob_impl")},
}


def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """SFT from scratch; writes metrics.jsonl, a params checkpoint and summary.json."""
  configs.validate(config, SCHEMA)
  rundir.write_config(config, workdir, experiment="sft")
  tok = arithmetic.build_tokenizer(config.task.digits)
  mesh = sharding.make_mesh(config.mesh)
  cfg = recipe.model_config(config.model, tok.vocab_size)
  graphdef, params = sharding.create_sharded(
      lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(config.seed)), mesh,
      config.sharding_rules)
  params, info = sft.warm_start(graphdef, params, tok, mesh=mesh, rules=config.sharding_rules,
                                digits=config.task.digits, logprob_impl=config.model.logprob_impl,
                                **config.sft)
  writer = metrics_lib.Writer(workdir, total_steps=info["steps"], console=False)
  for record in info["history"]:
    writer.write(record["step"], {k: v for k, v in record.items() if k != "step"})
  writer.close()
  ckpt = checkpoint.Checkpointer(os.path.join(workdir, "ckpt"), save_every=1, keep=1)
  ckpt.save(info["steps"], {"params": params}, {"success": info["success"]}, force=True)
  ckpt.close()
  summary = {k: info[k] for k in ("steps", "success", "seconds", "stopped")}
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  print(f"SFT: {info['steps']} steps (stopped: {info['stopped']}), validation greedy success "
        f"{info['success']:.1%}, {info['seconds']:.1f}s -> {workdir}")
  return summary


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
