r"""One decode step of a model preset compiled for a TPU chip without a TPU, per
`Config.decode_attention`: the chip's temporary memory and the cache-sized copies in it.

  JAX_PLATFORMS=cpu python scripts/aot_decode_attention.py --topology=v5e:2x2 \
      --model=smollm2-135m --batch=16 --slots=2048

Needs libtpu (`pip install -e '.[tpu-plan]'`), whose compiler builds the program for the
topology's first chip (the technique of scripts/plan_pod.py), bfloat16 weights and a stacked
`[L, B, G, S, K]` cache, as `Transformer.decode` runs one new token per row. A "copy" is an
HLO copy whose shape holds the cache's `B, G, S, K`: XLA changing the cache's layout, which
reads and writes all S slots whatever the attention reads.
"""
import argparse
import re
import time

import jax
import jax.numpy as jnp
import numpy as np


def _parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--topology", default="v5e:2x2", help="a TPU topology name, e.g. v5p:2x2x1")
  p.add_argument("--model", default="smollm2-135m", help="a models/presets.py name")
  p.add_argument("--batch", type=int, default=16, help="cache rows B")
  p.add_argument("--slots", type=int, default=2048, help="cache slots S")
  p.add_argument("--impls", default="xla,pallas", help="Config.decode_attention values")
  return p.parse_args(argv)


def compile_decode_step(cfg, batch: int, slots: int, device):
  """The compiled executable of one T = 1 decode step (cache donated) on `device`."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from agentrl.models import transformer  # pylint: disable=g-import-not-at-top
  mesh = jax.sharding.Mesh(np.array([device]), ("chip",))
  chip = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  on_chip = lambda tree: jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=chip), tree)
  graphdef, params = nnx.split(
      nnx.eval_shape(lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(0))))
  cache = jax.eval_shape(lambda: transformer.init_cache(cfg, batch, slots))

  def step(params, cache, tokens_B, positions_B, index):
    model = nnx.merge(graphdef, params)
    return model.decode(tokens_B[:, None], positions_B[:, None], None, cache, index)

  row = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=chip)
  index = jax.ShapeDtypeStruct((), jnp.int32, sharding=chip)
  return jax.jit(step, donate_argnums=(1,)).lower(
      on_chip(params), on_chip(cache), row, row, index).compile()


def main(argv=None):
  args = _parse(argv)
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  from agentrl.models import transformer  # pylint: disable=g-import-not-at-top
  device = topologies.get_topology_desc(platform="tpu", topology_name=args.topology).devices[0]
  print(f"{args.model}, {args.topology} ({device.device_kind}), B={args.batch}, "
        f"S={args.slots}, bfloat16, one new token per row")
  print("| decode_attention | temporaries MiB | cache-sized copies | compile s |")
  print("|---|---:|---:|---:|")
  for impl in args.impls.split(","):
    cfg = transformer.Config.named(args.model, dtype="bfloat16", param_dtype="bfloat16",
                                   decode_attention=impl)
    start = time.perf_counter()
    compiled = compile_decode_step(cfg, args.batch, args.slots, device)
    seconds = time.perf_counter() - start
    dims = rf"{args.batch},{cfg.kv_heads},{args.slots},{cfg.head_dim}\]"
    copies = len(re.findall(rf"bf16\[(\d+,)?{dims}\S* copy\(", compiled.as_text()))
    temp = compiled.memory_analysis().temp_size_in_bytes / 2**20
    print(f"| {impl} | {temp:.1f} | {copies} | {seconds:.1f} |")


if __name__ == "__main__":
  main()
