# pylint: disable=invalid-name
r"""Supervised fine-tuning (SFT) of a tiny from-scratch model on reversed-digit addition.

The warm start of the main job (experiments/grpo.py): RL needs a policy that already solves a
few percent of the task, otherwise every group has reward 0 and GRPO has nothing to learn from
(offline_resources.md §9: at ~1% greedy accuracy GRPO made no progress; at 13-50% it gained
30+ points). SFT stops as soon as greedy exact-match on a validation set reaches
`target_success`, so the warm start lands in that window whatever the machine's speed.

  python -m experiments.sft                                    # default CPU run (~1 min)
  python -m experiments.sft --config=experiments/sft.py:smoke --workdir=/tmp/sft

Greedy exact-match is measured by teacher forcing: the greedy decode of a prompt equals the
answer (+ EOS) iff the argmax at every answer position is the answer token, so one forward
pass over the gold sequence gives the same number as decoding.

Loss: mean negative log-likelihood of the answer tokens and EOS (the prompt is context).
"""
import json
import os
import time

from absl import app
from absl import flags
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc
from ml_collections import config_flags
import numpy as np
import optax

from agentrl import checkpoint
from agentrl import configs
from agentrl import metrics as metrics_lib
from agentrl import sharding
from agentrl import types
from agentrl.data import generators
from agentrl.envs import arithmetic
from agentrl.models import policy as policy_lib
from agentrl.models import tokenizer as tokenizer_lib
from agentrl.models import transformer

# Disjoint seed ranges: RL prompts come from [0, HELDOUT_START), the held-out test set
# (reported before/after RL) from HELDOUT_START on, SFT data and its stopping set above both.
EVAL_SEED_BASE = generators.HELDOUT_START
SFT_SEED_BASE = 2**31
VALID_SEED_BASE = 2**31 + 2**30


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


# The `sft` sub-config; experiments/grpo.py embeds the same dict.
SCHEMA_SFT = {
    "steps_max": configs.Key(int, min=1),
    "target_success": configs.Key(float, min=0.0, max=1.0),
    "batch_size": configs.Key(int, min=1),
    "lr": configs.Key(float, min=0.0),
    "b2": configs.Key(float, min=0.0, max=1.0),
    "clip_norm": configs.Key(float, min=0.0),
    "eval_every": configs.Key(int, min=1),
    "eval_problems": configs.Key(int, min=1),
}

SCHEMA = {
    "seed": configs.Key(int, min=0),
    "task.digits": configs.Key(int, min=1, max=9),
    "model.variant": configs.Key(str),
    "model.width": configs.Key(int, min=8),
    "model.depth": configs.Key(int, min=1),
    "model.heads": configs.Key(int, min=1),
    "model.kv_heads": configs.Key(int, min=1),
    "model.head_dim": configs.Key(int, min=2),
    "model.mlp": configs.Key(int, min=1),
    "model.logprob_impl": configs.Key(str, choices=("auto", "xla", "reference", "pallas")),
    "mesh": configs.Key(dict),
    "sharding_rules": configs.Key(list),
    **{f"sft.{key}": spec for key, spec in SCHEMA_SFT.items()},
}


# ---------------------------------------------------------------------------------------------
# Task, tokenizer and model: shared with experiments/grpo.py.
# ---------------------------------------------------------------------------------------------
def build_tokenizer(digits: int) -> tokenizer_lib.Tokenizer:
  """A character-level sentencepiece vocabulary (digits, '+', '=', '-', specials)."""
  lines = [_gold_text(arithmetic.make_problem(SFT_SEED_BASE + i, digits=digits))
           for i in range(500)] + ["-"]
  return tokenizer_lib.train_sentencepiece(
      lines, 32, model_type="char", add_dummy_prefix=False, byte_fallback=False,
      user_defined_symbols=())


def _gold_text(problem) -> str:
  return problem["prompt"] + problem["answer"]


def model_config(mc, vocab: int) -> transformer.Config:
  """The typed transformer Config for config.model and a tokenizer of `vocab` ids."""
  return transformer.Config.named(
      mc.variant, vocab=vocab, width=mc.width, depth=mc.depth, heads=mc.heads,
      kv_heads=mc.kv_heads, head_dim=mc.head_dim, mlp=mc.mlp)


def encode_gold(tok, problems, length: int) -> dict[str, np.ndarray]:
  """[B, length] right-padded BOS + prompt + answer + EOS; loss_mask on answer and EOS."""
  B = len(problems)
  tokens = np.full((B, length), tok.pad_id, np.int32)
  loss_mask = np.zeros((B, length), np.float32)
  input_mask = np.zeros((B, length), bool)
  for i, p in enumerate(problems):
    prompt = tok.encode(p["prompt"], add_bos=True)
    ids = prompt + tok.encode(p["answer"]) + [tok.eos_id]
    if len(ids) > length:
      raise ValueError(f"problem {p['prompt']!r} needs {len(ids)} tokens > {length}")
    tokens[i, :len(ids)] = ids
    input_mask[i, :len(ids)] = True
    loss_mask[i, len(prompt):len(ids)] = 1.0
  positions = np.broadcast_to(np.arange(length, dtype=np.int32), (B, length)).copy()
  return dict(tokens_BT=tokens, positions_BT=positions, input_mask_BT=input_mask,
              loss_mask_BT=loss_mask)


def sequence_length(tok, digits: int) -> int:
  """Tokens of the longest gold sequence for `digits`-digit operands."""
  p = arithmetic.make_problem(0, digits=digits)
  return 1 + len(tok.encode(p["prompt"])) + len(tok.encode(p["answer"])) + 1


def problems(seed_base: int, n: int, digits: int):
  return [arithmetic.make_problem(seed_base + i, digits=digits) for i in range(n)]


# ---------------------------------------------------------------------------------------------
# Update and eval steps.
# ---------------------------------------------------------------------------------------------
def make_update_step(config, graphdef, tx):
  """update_step(state, batch) -> (state, metrics): answer-token NLL. Jit it in train()."""
  return _update_step(graphdef, tx, logprob_impl=config.model.logprob_impl)


def _update_step(graphdef, tx, *, logprob_impl: str):
  impl = logprob_impl

  def loss_fn(params, batch):
    model = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(model, batch["tokens_BT"], batch["positions_BT"],
                                        batch["input_mask_BT"], impl=impl)
    mask_BT = batch["loss_mask_BT"]
    return -(logp_BT * mask_BT).sum() / jnp.maximum(mask_BT.sum(), 1.0)

  def update_step(state: types.TrainState, batch):
    loss, grads = jax.value_and_grad(loss_fn)(state.params, batch)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return (state.replace(step=state.step + 1, params=params, opt_state=opt_state),
            {"loss": loss, "grad_norm": optax.tree.norm(grads)})

  return update_step


def make_eval_step(graphdef):
  """eval_step(params, batch) -> success_B: greedy decoding would reproduce the gold answer."""

  def eval_step(params, batch):
    model = nnx.merge(graphdef, params)
    logits_BTV = model(batch["tokens_BT"], batch["positions_BT"], batch["input_mask_BT"])
    # Logits at t predict token t + 1.
    hit_BT = jnp.argmax(logits_BTV[:, :-1], axis=-1) == batch["tokens_BT"][:, 1:]
    need_BT = batch["loss_mask_BT"][:, 1:] > 0
    return jnp.all(hit_BT | ~need_BT, axis=-1)

  return eval_step


def warm_start(graphdef, params, tok, *, mesh, rules, digits: int, logprob_impl: str,
               steps_max: int, target_success: float, batch_size: int, lr: float, b2: float,
               clip_norm: float, eval_every: int, eval_problems: int,
               log=print) -> tuple[nnx.State, dict]:
  """Runs SFT from `params` until `target_success` or `steps_max`; returns (params, info)."""
  length = sequence_length(tok, digits)
  tx = optax.chain(optax.clip_by_global_norm(clip_norm), optax.adam(lr, b2=b2))
  state, state_shardings = sharding.create_train_state(params, tx, mesh, rules)
  # Pinned output shardings keep every call on the first call's compiled program.
  update_step = jax.jit(_update_step(graphdef, tx, logprob_impl=logprob_impl),
                        donate_argnames="state", out_shardings=(state_shardings, None))
  eval_step = jax.jit(make_eval_step(graphdef))
  rows = sharding.batch_sharding(mesh)
  valid = jax.device_put(encode_gold(tok, problems(VALID_SEED_BASE, eval_problems, digits),
                                     length), rows)
  evaluate = lambda p: float(jax.device_get(eval_step(p, valid)).mean())
  history, success, step, start = [], evaluate(state.params), 0, time.perf_counter()
  while success < target_success and step < steps_max:
    batch = jax.device_put(encode_gold(
        tok, problems(SFT_SEED_BASE + step * batch_size, batch_size, digits), length), rows)
    state, m = update_step(state, batch)
    step += 1
    if step % eval_every == 0 or step == steps_max:
      success = evaluate(state.params)
      loss = float(jax.device_get(m["loss"]))
      history.append({"step": step, "loss": loss, "success": success})
      log(f"sft step {step}/{steps_max} | loss {loss:.3f} | validation greedy success "
          f"{success:.1%}")
  info = {"steps": step, "success": success, "seconds": time.perf_counter() - start,
          "history": history}
  return state.params, info


def init_model(config, tok, mesh, rules) -> tuple[nnx.GraphDef, nnx.State]:
  """(graphdef, params) of a fresh tiny transformer for `tok`, created sharded on mesh."""
  cfg = model_config(config.model, tok.vocab_size)
  return sharding.create_sharded(lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(config.seed)),
                                 mesh, rules)


def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """SFT from scratch; writes metrics.jsonl, a params checkpoint and summary.json."""
  configs.validate(config, SCHEMA)
  tok = build_tokenizer(config.task.digits)
  mesh = sharding.make_mesh(config.mesh)
  graphdef, params = init_model(config, tok, mesh, config.sharding_rules)
  params, info = warm_start(graphdef, params, tok, mesh=mesh, rules=config.sharding_rules,
                            digits=config.task.digits, logprob_impl=config.model.logprob_impl,
                            **config.sft)
  writer = metrics_lib.Writer(workdir, total_steps=info["steps"], console=False)
  for record in info["history"]:
    writer.write(record["step"], {k: v for k, v in record.items() if k != "step"})
  writer.close()
  ckpt = checkpoint.Checkpointer(os.path.join(workdir, "ckpt"), save_every=1, keep=1)
  ckpt.save(info["steps"], {"params": params}, {"success": info["success"]}, force=True)
  ckpt.close()
  summary = {k: info[k] for k in ("steps", "success", "seconds")}
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  print(f"SFT: {info['steps']} steps, validation greedy success {info['success']:.1%}, "
        f"{info['seconds']:.1f}s -> {workdir}")
  return summary


def main(argv):
  del argv
  sharding.initialize_distributed()  # no-op unless launched multi-process
  train(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", __file__, lock_config=True)
  _WORKDIR = flags.DEFINE_string("workdir", "runs/sft", "Output directory.")
  app.run(main)
