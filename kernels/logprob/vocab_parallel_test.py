# pylint: disable=invalid-name
"""kernels.logprob.vocab_parallel on 8 host CPU devices: sharded == reference (docs/style.md C10).

Value and gradient w.r.t. hidden and W against `ops.token_logprobs_reference`, and the compiled
program never holds an array that spans the vocabulary. The two-process run of the same op is
in tests/sharding_test.py.
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import functools  # pylint: disable=g-import-not-at-top,wrong-import-position

from absl.testing import absltest
from absl.testing import parameterized
import jax
from jax.sharding import AxisType
import jax.numpy as jnp
import numpy as np

from kernels.logprob import ops
from kernels.logprob import vocab_parallel

jax.config.update("jax_numpy_rank_promotion", "raise")
TOL = 1e-5


def _mesh(shape, names):
  return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(names))


def _max_diff(a, b) -> float:
  a, b = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(a) == len(b), (len(a), len(b))
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(a, b))


def _inputs(n, d, v):
  rng = np.random.default_rng(1)
  h_ND = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)
  w_DV = jnp.asarray(rng.normal(size=(d, v)) / 4, jnp.float32)
  y_N = jnp.asarray(rng.integers(0, v, n), jnp.int32)
  a_N, b_N = (jnp.asarray(rng.normal(size=n), jnp.float32) for _ in range(2))
  return h_ND, w_DV, y_N, a_N, b_N


def _value_and_grad(fn, y_N, a_N, b_N, entropy, **kw):
  """d/d(h, W) of Σ a·logp + b·entropy, with (logp, entropy) as aux."""
  def f(h_ND, w_DV):
    out = fn(h_ND, w_DV, y_N, return_entropy=entropy, **kw)
    logp_N, ent_N = out if entropy else (out, jnp.zeros_like(out))
    return (a_N * logp_N + b_N * ent_N).sum(), (logp_N, ent_N)
  return jax.value_and_grad(f, argnums=(0, 1), has_aux=True)


class VocabParallelTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("xla", 1.0, None, False, "xla"),
      ("xla_temperature_softcap_entropy", 0.7, 5.0, True, "xla"),
      ("pallas_tpu_interpret", 1.0, None, False, "pallas_tpu"),  # check_vma=False path
  )
  def test_matches_reference_in_value_and_gradient(self, temperature, softcap, entropy, impl):
    n, d, v = 16, 32, 384  # v appears in no compiled shape unless the vocabulary is gathered
    h_ND, w_DV, y_N, a_N, b_N = _inputs(n, d, v)
    kw = dict(temperature=temperature, softcap=softcap)
    mesh = _mesh((2, 2, 2), ("data", "fsdp", "tensor"))  # the default axis names

    ref = _value_and_grad(ops.token_logprobs_reference, y_N, a_N, b_N, entropy, **kw)(h_ND, w_DV)
    with jax.set_mesh(mesh):
      fn = jax.jit(_value_and_grad(
          functools.partial(vocab_parallel.vocab_parallel_token_logprobs, mesh=mesh, impl=impl,
                            interpret=impl != "xla"), y_N, a_N, b_N, entropy, **kw))
      got = fn(h_ND, w_DV)
      hlo = fn.lower(h_ND, w_DV).compile().as_text()
    self.assertLess(_max_diff(got, ref), TOL)
    self.assertGreater(float(jnp.abs(ref[1][1]).max()), 1e-2)  # non-trivial dW
    shape = lambda dims: rf"\b[a-z]+\d*\[{dims}\]"  # an HLO array type such as f32[32,192]
    self.assertRegex(hlo, shape(rf"{d},{v // 2}"))  # W's local shard
    self.assertNotRegex(hlo, shape(rf"(\d+,)*{v}(,\d+)*"))  # nothing spans the vocabulary

  def test_axis_names_are_arguments(self):
    n, d, v = 8, 16, 256
    h_ND, w_DV, y_N, a_N, b_N = _inputs(n, d, v)
    mesh = _mesh((2, 4), ("rows", "vocab"))
    ref = _value_and_grad(ops.token_logprobs_reference, y_N, a_N, b_N, True)(h_ND, w_DV)
    with jax.set_mesh(mesh):
      got = jax.jit(_value_and_grad(
          functools.partial(vocab_parallel.vocab_parallel_token_logprobs, mesh=mesh,
                            row_axes="rows", vocab_axis="vocab", impl="xla"),
          y_N, a_N, b_N, True))(h_ND, w_DV)
    self.assertLess(_max_diff(got, ref), TOL)

  def test_bad_sizes_and_axis_names_are_named(self):
    mesh = _mesh((2, 2, 2), ("data", "fsdp", "tensor"))
    args = jnp.zeros((8, 4)), jnp.zeros((4, 7)), jnp.zeros((8,), jnp.int32)
    with self.assertRaisesRegex(ValueError, r"V=7 divisible by tensor=2"):
      vocab_parallel.vocab_parallel_token_logprobs(*args, mesh=mesh)
    with self.assertRaisesRegex(ValueError, r"N=6 divisible by data\*fsdp=4"):
      vocab_parallel.vocab_parallel_token_logprobs(
          jnp.zeros((6, 4)), jnp.zeros((4, 8)), jnp.zeros((6,), jnp.int32), mesh=mesh)
    with self.assertRaisesRegex(ValueError, r"mesh axes \['model'\] are not in the mesh"):
      vocab_parallel.vocab_parallel_token_logprobs(*args, mesh=mesh, vocab_axis="model")


if __name__ == "__main__":
  absltest.main()
