# pylint: disable=invalid-name
"""Sharded == single-device on 8 host CPU devices, and a two-process run (agentrl.sharding).

The tiny transformer on a (data, fsdp, tensor) = (2, 2, 2) mesh must give the same logits,
log-probs (also through the vocab-parallel op), loss and Adam update as on one device
(<= 1e-5); and two local processes (4 CPU devices each, gloo collectives over loopback,
started by agentrl.distributed) must see one 8-device mesh. The op alone is tested in
kernels/logprob/vocab_parallel_test.py, launcher detection in agentrl/distributed_test.py.
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import pathlib  # pylint: disable=g-import-not-at-top,wrong-import-position
import re
import socket
import subprocess
import sys
import textwrap

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
from jax.sharding import AxisType, PartitionSpec as P
import jax.numpy as jnp
import numpy as np
import optax

from agentrl.losses import aggregation
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from agentrl.models import transformer
from agentrl import sharding
from agentrl import types
from kernels import logprob

jax.config.update("jax_numpy_rank_promotion", "raise")
ROOT = pathlib.Path(__file__).resolve().parents[1]
TOL = 1e-5
RULES = [("embed", "fsdp"), ("mlp", "tensor"), ("heads", "tensor"), ("kv_heads", "tensor"),
         ("vocab", "tensor"), ("batch", ("data", "fsdp"))]  # config style: the rest replicate
LAUNCHER_VARS = ("SLURM_NTASKS", "SLURM_STEP_NODELIST", "OMPI_COMM_WORLD_SIZE",
                 "TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES", "JAX_COORDINATOR_ADDRESS",
                 "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def _max_diff(a, b) -> float:
  """Largest |a - b| over matching leaves (metadata such as nnx sharding names ignored)."""
  a, b = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(a) == len(b), (len(a), len(b))
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(a, b))


class MeshTest(parameterized.TestCase):

  def test_shapes_and_axis_types(self):
    mesh = sharding.make_mesh((2, 2, 2))
    self.assertEqual(dict(mesh.shape), {"data": 2, "fsdp": 2, "tensor": 2})
    self.assertEqual(mesh.axis_types, (AxisType.Auto,) * 3)
    self.assertEqual(dict(sharding.make_mesh({"data": -1, "tensor": 2}).shape),
                     {"data": 4, "fsdp": 1, "tensor": 2})
    self.assertEqual(sharding.make_mesh({"fsdp": 4}).devices.size, 4)
    explicit = sharding.make_mesh((-1, 1, 1), axis_types=(AxisType.Explicit,) * 3)
    self.assertEqual(explicit.axis_types, (AxisType.Explicit,) * 3)
    self.assertEqual(explicit.devices.size, 8)

  @parameterized.named_parameters(
      ("two_minus_one", (-1, -1, 2), "more than one -1"),
      ("unknown_axis", {"data": 2, "model": 4}, "'model'"),
      ("wrong_length", (2, 4), "must have 3 entries"),
      ("not_dividing", (3, 1, 1), "multiple of 3 devices, but there are 8"),
      ("not_dividing_minus_one", (-1, 3, 1), "multiple of 3 devices"),
      ("zero", (0, 1, 1), "'data' has size 0"),
  )
  def test_bad_shapes_are_named(self, shape, message):
    with self.assertRaisesRegex(ValueError, re.escape(message)):
      sharding.make_mesh(shape)

  def test_axis_types_need_one_per_axis(self):
    with self.assertRaisesRegex(ValueError, "one AxisType per axis"):
      sharding.make_mesh((2, 2, 2), axis_types=(AxisType.Auto,))


class RulesTest(absltest.TestCase):

  def test_complete_rules_replicates_unnamed_axes(self):
    rules = dict(sharding.complete_rules([("embed", "fsdp"), ("batch", ["data", "fsdp"])]))
    self.assertEqual(rules["batch"], ("data", "fsdp"))
    self.assertIsNone(rules["layers"])
    self.assertIsNone(rules["vocab"])
    self.assertEqual(set(rules), set(sharding.LOGICAL_AXES))

  def test_bad_rules_and_indivisible_dims_are_named(self):
    mesh = sharding.make_mesh((2, 2, 2))
    abstract = nnx.state(nnx.eval_shape(lambda: transformer.Transformer(
        transformer.Config.named("tiny", mlp=129), rngs=nnx.Rngs(0))))
    with self.assertRaisesRegex(ValueError, r"mlp.*_L(DF|FD).*129 is not a multiple of 2"):
      sharding.tree_shardings(abstract, mesh, RULES)
    with self.assertRaisesRegex(ValueError, r"\('mlp', 'model'\) names mesh axis 'model'"):
      sharding.tree_shardings(abstract, mesh, [("mlp", "model")])

    class Experts(nnx.Module):

      def __init__(self):
        self.w_E = transformer.logical_param(jnp.zeros((4,)), ("experts",))

    with self.assertRaisesRegex(ValueError, r"w_E.*\['experts'\] with no sharding rule"):
      sharding.tree_shardings(nnx.state(nnx.eval_shape(Experts)), mesh, RULES)


def _batch(cfg, b: int, t: int) -> types.Batch:
  rng = np.random.default_rng(0)
  tokens_BT = rng.integers(0, cfg.vocab, (b, t)).astype(np.int32)
  input_mask_BT = np.ones((b, t), bool)
  input_mask_BT[::2, -2:] = False  # right padding on half the rows
  loss_mask_BT = (np.arange(t)[None] >= t // 2) & input_mask_BT
  return types.Batch(
      tokens_BT=tokens_BT,
      positions_BT=np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy(),
      input_mask_BT=input_mask_BT, loss_mask_BT=loss_mask_BT.astype(np.float32),
      adv_BT=np.repeat(rng.normal(size=(b, 1)), t, 1).astype(np.float32),
      old_logp_BT=(-6.0 + 0.1 * rng.normal(size=(b, t))).astype(np.float32))


def _vocab_parallel_logp(model, batch: types.Batch, mesh):
  """[B, T] log-probs with column 0 = 0, as policy.token_logprobs, via the vocab-parallel op."""
  b, t = batch.tokens_BT.shape
  h_BTD = model.hidden(batch.tokens_BT, batch.positions_BT, batch.input_mask_BT)
  logp_N = logprob.vocab_parallel_token_logprobs(
      h_BTD[:, :-1].reshape(b * (t - 1), -1), model.unembed_DV(),
      batch.tokens_BT[:, 1:].reshape(-1), mesh=mesh)
  return jnp.pad(logp_N.reshape(b, t - 1), ((0, 0), (1, 0)))


def _make_update_step(graphdef, tx, logp_fn):
  """A GRPO-style step: PPO-clip surrogate, seq-mean-token-mean, Adam (docs/style.md C3)."""

  def loss_fn(params, batch: types.Batch):
    logp_BT = logp_fn(nnx.merge(graphdef, params), batch)
    pg_BT, _ = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, batch.loss_mask_BT)
    return aggregation.aggregate(pg_BT, batch.loss_mask_BT, "seq-mean-token-mean")

  def update_step(state: types.TrainState, batch: types.Batch):
    loss, grads = jax.value_and_grad(loss_fn)(state.params, batch)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads)}
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  return update_step


class ShardedModelTest(absltest.TestCase):
  """The tiny model on a 2x2x2 mesh against the same params on one device.

  One jitted program per side runs the forward, the log-probs and an update step, so the
  suite compiles the model twice; the tests check different parts of the results.
  """

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cfg = transformer.Config.named("tiny")
    cls.mesh = mesh = sharding.make_mesh((2, 2, 2))
    tx = optax.adam(1e-3)
    graphdef, cls.params = sharding.create_sharded(
        lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(0)), mesh, RULES)
    cls.state, state_shardings = sharding.create_train_state(cls.params, tx, mesh, RULES)
    batch = _batch(cfg, b=8, t=8)
    policy_logp = lambda m, b: policy_lib.token_logprobs(m, b.tokens_BT, b.positions_BT,
                                                         b.input_mask_BT)

    def program(logp_fn, vocab_parallel):
      update_step = _make_update_step(graphdef, tx, logp_fn)

      def run(state, batch):
        model = nnx.merge(graphdef, state.params)
        outputs = {"logits": model(batch.tokens_BT, batch.positions_BT, batch.input_mask_BT),
                   "logp": policy_logp(model, batch)}
        if vocab_parallel:
          outputs["logp_vocab_parallel"] = _vocab_parallel_logp(model, batch, mesh)
        return update_step(state, batch) + (outputs,)
      return run

    one_device = jax.devices()[0]
    ref_state = jax.device_put(jax.device_get(cls.state), one_device)
    cls.ref = jax.jit(program(policy_logp, False))(ref_state, jax.device_put(batch, one_device))
    step = jax.jit(program(lambda m, b: _vocab_parallel_logp(m, b, mesh), True),
                   in_shardings=(state_shardings, sharding.batch_sharding(mesh)),
                   out_shardings=(state_shardings, None, None), donate_argnums=0)
    new_state = jax.tree.map(jnp.copy, cls.state)
    with jax.set_mesh(mesh):
      cls.got = step(new_state, sharding.shard_batch(batch, mesh))

  def test_params_and_optimizer_state_are_born_sharded(self):
    specs = jax.tree.map(lambda x: x.sharding.spec, nnx.to_pure_dict(self.params))
    self.assertEqual(specs["embedding_VD"], P("tensor", "fsdp"))
    self.assertEqual(specs["layers"]["mlp"]["up_LDF"], P(None, "fsdp", "tensor"))
    self.assertEqual(specs["layers"]["attn"]["k_LDHK"], P(None, "fsdp", "tensor", None))
    self.assertEqual(specs["layers"]["attn"]["o_LHKD"], P(None, "tensor", None, "fsdp"))
    self.assertEqual(specs["layers"]["pre_attn_norm_LD"], P(None, "fsdp"))
    mu = nnx.to_pure_dict(self.state.opt_state[0].mu)
    self.assertEqual(mu["embedding_VD"].sharding.spec, P("tensor", "fsdp"))
    self.assertEqual(self.state.step.sharding.spec, P())

  def test_forward_and_logprobs_match_single_device(self):
    got, ref = self.got[2], self.ref[2]
    self.assertLess(_max_diff(got["logits"], ref["logits"]), TOL)
    self.assertLess(_max_diff(got["logp"], ref["logp"]), TOL)
    self.assertLess(_max_diff(got["logp_vocab_parallel"], ref["logp"]), TOL)
    self.assertGreater(float(jnp.abs(ref["logp"][:, 1:]).min()), 1.0)  # not trivially 0

  def test_loss_and_update_step_match_single_device(self):
    (state, metrics), (ref_state, ref_metrics) = self.got[:2], self.ref[:2]
    self.assertLess(_max_diff(metrics, ref_metrics), TOL)
    self.assertGreater(float(ref_metrics["grad_norm"]), 1e-3)
    self.assertLess(_max_diff(state.params, ref_state.params), TOL)
    self.assertLess(_max_diff(state.opt_state, ref_state.opt_state), TOL)
    self.assertGreater(_max_diff(state.params, self.params), 5e-4)  # the update moved the params
    self.assertEqual(int(state.step), 1)
    up = nnx.to_pure_dict(state.params)["layers"]["mlp"]["up_LDF"]
    self.assertEqual(up.sharding.spec, P(None, "fsdp", "tensor"))


class BatchAndReshardTest(absltest.TestCase):

  def test_shard_batch_splits_rows_and_keeps_none_fields(self):
    mesh = sharding.make_mesh((2, 2, 2))
    batch = sharding.shard_batch(_batch(transformer.Config.named("tiny"), 8, 4), mesh)
    self.assertEqual(batch.tokens_BT.sharding.spec, P(("data", "fsdp")))
    self.assertEqual(batch.tokens_BT.addressable_shards[0].data.shape, (2, 4))
    self.assertIsNone(batch.ref_logp_BT)
    with self.assertRaisesRegex(ValueError, r"tokens_BT has 6 rows, not a multiple of the 4"):
      sharding.shard_batch(_batch(transformer.Config.named("tiny"), 6, 4), mesh)

  def test_reshard_between_learner_and_sampler_meshes(self):
    learner = sharding.make_mesh((2, 2, 2))
    sampler = sharding.make_mesh((1, 1, 8))
    x = jax.device_put(jnp.arange(64.0).reshape(8, 8),
                       jax.sharding.NamedSharding(learner, P(("data", "fsdp"), "tensor")))
    y = sharding.reshard({"x": x}, {"x": jax.sharding.NamedSharding(sampler, P(None, "tensor"))})
    self.assertEqual(y["x"].sharding.mesh.shape["tensor"], 8)
    self.assertEqual(y["x"].addressable_shards[0].data.shape, (8, 1))
    np.testing.assert_array_equal(y["x"], np.arange(64.0).reshape(8, 8))


_WORKER = textwrap.dedent("""
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from agentrl import distributed, sharding, types
    from kernels import logprob

    pid = int(sys.argv[2])
    assert distributed.initialize_distributed(sys.argv[1], 2, pid, initialization_timeout=60)
    mesh = sharding.make_mesh({"data": -1, "tensor": 2})
    x = jax.make_array_from_process_local_data(
        NamedSharding(mesh, P(sharding.MESH_AXES)), np.arange(4.0) + 4 * pid)
    total = jax.shard_map(lambda x: jax.lax.psum(x, sharding.MESH_AXES), mesh=mesh,
                          in_specs=P(sharding.MESH_AXES), out_specs=P())(x)
    rows = np.full((4, 3), pid, np.int32)
    batch = sharding.shard_batch(types.Batch(rows, rows, rows, rows.astype(np.float32)), mesh)
    rows_sum = jax.jit(lambda b: b.tokens_BT.sum())(batch)
    rng = np.random.default_rng(0)  # the same global arrays in both processes
    h, w, y = rng.normal(size=(8, 16)), rng.normal(size=(16, 64)), rng.integers(0, 64, 8)
    put = lambda a, spec: jax.make_array_from_callback(
        a.shape, NamedSharding(mesh, spec), lambda i: a[i])
    with jax.set_mesh(mesh):
      logp = jax.jit(lambda *a: logprob.vocab_parallel_token_logprobs(*a, mesh=mesh),
                     out_shardings=NamedSharding(mesh, P()))(
          put(h.astype(np.float32), P(sharding.ROWS)), put(w.astype(np.float32), P(None, "tensor")),
          put(y.astype(np.int32), P(sharding.ROWS)))
    ref = logprob.token_logprobs_reference(jnp.asarray(h, jnp.float32),
                                           jnp.asarray(w, jnp.float32), y)
    err = float(np.abs(np.asarray(logp.addressable_data(0)) - np.asarray(ref)).max())
    print("RESULT", jax.process_count(), jax.device_count(), float(total.addressable_data(0)[0]),
          batch.tokens_BT.shape[0], int(rows_sum), err)
""")


class MultiProcessTest(absltest.TestCase):

  def test_two_local_processes_share_one_mesh(self):
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS + ("XLA_FLAGS",)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, f"127.0.0.1:{port}", str(i)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    try:
      outputs = [p.communicate(timeout=150)[0] for p in procs]
    finally:
      for p in procs:
        if p.poll() is None:
          p.kill()
    for p, out in zip(procs, outputs):
      self.assertEqual(p.returncode, 0, out[-3000:])
      result = [line for line in out.splitlines() if line.startswith("RESULT")]
      self.assertLen(result, 1, out[-3000:])
      _, procs_n, devices, total, rows, rows_sum, err = result[0].split()
      self.assertEqual((procs_n, devices, total, rows, rows_sum), ("2", "8", "28.0", "8", "12"))
      self.assertLess(float(err), TOL)


if __name__ == "__main__":
  absltest.main()
