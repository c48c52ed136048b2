# pylint: disable=invalid-name
"""Low-rank adapters (LoRA; Hu et al. 2021, arXiv:2106.09685) on the transformer's projections.

  y = x W + (alpha / rank) * dropout(x) A B        A: [in, R] random,  B: [R, out] zero

for any of the attention (q, k, v, o) and MLP (gate, up, down) projections of every layer; R is
the rank. The adapters are stacked on the layers' leading L axis and scanned with them. Choices
follow PEFT (huggingface/peft, src/peft/tuners/lora/layer.py): A ~ U(-1/sqrt(in), 1/sqrt(in))
(`kaiming_uniform_(a=sqrt(5))`, nn.Linear's default) and B = 0, so an untrained adapter is the
base model exactly; the scale is alpha / rank (no rsLoRA); dropout (inverted, independent per
projection and layer) acts on the adapter's input only; adapters are stored in float32 whatever
the base's dtype (PEFT's `autocast_adapter_dtype=True`). [INF] They are computed in the model's
`dtype`, like the base matmuls (PEFT upcasts x to the adapter's float32); the same in float32.
The config defaults are verl's (verl/trainer/config/model/hf_model.yaml: lora_rank 0 = off,
lora_alpha 16, target_modules all-linear, i.e. all seven projections); PEFT's dropout default 0.

Params. `attach` turns a `transformer.Transformer`'s (graphdef, params) and an `Adapters`' into
those of a `LoraTransformer`, whose params are {"base": the Transformer's, "lora": adapters}.
It has the Transformer's interface (`cfg`, `hidden`, `logits`, `unembed_DV`, `decode`), so
every user of (graphdef, params) runs it unchanged. Training touches the adapters only:

  trainable(tree)        `tree` (params, grads or a TrainState) without the frozen bases: what
                         the optimizer, its state and the checkpoints hold
  combine(tree, t)       `tree` with its trainable part replaced by `t` (bases kept as they are)
  with_base(params, b)   LoRA params on another base (e.g. after an SFT warm start of it)
  base_model(model)      the frozen base with the adapters off: the KL reference (as verl's
                         `ref_in_actor`), no copy of the weights
  merge(graphdef, p)     a plain Transformer with W + (alpha / rank) A B folded in (HF export)

The forward stops gradients at the base weights, so their gradients are exactly zero even for
code that differentiates the whole params tree (agentrl.train.loop then skips them). Dropout applies
only inside `dropout_key(key)`, which `agentrl.train.loop.gradient_step` enters; scoring, rollouts
and evaluation run without it.

Why not qwix (Tunix's LoRA): qwix 0.1.8 intercepts einsum/dot_general and creates the adapter
variables on the calling module at the first call; inside this model's layer `lax.scan` that
raises flax's TraceContextError ("Cannot mutate 'Transformer' from different trace level"; on
flax 0.12.8 / jax 0.10.2 and flax 0.12.12 / jax 0.12), and its adapters would be per call site
rather than stacked [L, ...]. This module is tested on both of those version pairs.
"""
from collections.abc import Mapping
import contextlib
import contextvars
import dataclasses
import functools
import math
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp

from agentrl.models import transformer

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
RANK_AXIS = "lora_rank"  # logical axis name of R (sharding.DEFAULT_RULES replicates it)
# Each target's base weight in the `transformer.Layers` state, and how many of its axes after
# L are inputs (o contracts heads and head_dim).
_WEIGHTS = {"q": ("attn", "q_LDHK", 1), "k": ("attn", "k_LDHK", 1), "v": ("attn", "v_LDHK", 1),
            "o": ("attn", "o_LHKD", 2), "gate": ("mlp", "gate_LDF", 1),
            "up": ("mlp", "up_LDF", 1), "down": ("mlp", "down_LFD", 1)}


def _adapter_names(target: str) -> tuple[str, str]:
  """("q_a_LDR", "q_b_LRHK"): A's and B's attribute names, shape suffix from the base weight."""
  _, weight, n_in = _WEIGHTS[target]
  axes = weight.split("_")[-1]
  return f"{target}_a_L{axes[1:1 + n_in]}R", f"{target}_b_LR{axes[1 + n_in:]}"


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """Rank R, alpha (scale alpha / R), target projections and input dropout. Hashable."""
  rank: int
  alpha: float = 16.0
  targets: tuple[str, ...] = TARGETS
  dropout: float = 0.0

  def __post_init__(self):
    targets = (self.targets,) if isinstance(self.targets, str) else tuple(self.targets)
    object.__setattr__(self, "targets", targets)
    checks = [
        (isinstance(self.rank, int) and self.rank >= 1, f"rank={self.rank!r} must be >= 1"),
        (self.alpha > 0, f"alpha={self.alpha!r} must be > 0"),
        (bool(targets) and set(targets) <= set(TARGETS) and len(set(targets)) == len(targets),
         f"targets={targets!r} must be distinct names from {TARGETS}"),
        (0.0 <= self.dropout < 1.0, f"dropout={self.dropout!r} must be in [0, 1)"),
    ]
    for ok, message in checks:
      if not ok:
        raise ValueError(f"Invalid lora.LoraConfig: {message}.")

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


class Adapters(nnx.Module):
  """A [L, in..., R] (random) and B [L, R, out...] (zero) for each target, in float32.

  Each carries its base weight's logical axis names with R (`RANK_AXIS`) in place of the other
  side, so an adapter is sharded like its base matrix along the dimension it shares with it.
  """

  def __init__(self, cfg: transformer.Config, spec: LoraConfig, *, rngs: nnx.Rngs):
    self.spec = spec
    layers = nnx.state(nnx.eval_shape(lambda: transformer.Layers(cfg, rngs=nnx.Rngs(0))))
    for target in spec.targets:
      group, weight, n_in = _WEIGHTS[target]
      w = layers[group][weight]
      shape, names = w.shape, tuple(w.get_metadata()["out_sharding"])
      ins, outs = shape[1:1 + n_in], shape[1 + n_in:]
      bound = 1.0 / math.sqrt(math.prod(ins))  # kaiming_uniform_(a=sqrt(5)), fan_in = in
      a = jax.random.uniform(rngs.params(), (shape[0], *ins, spec.rank), jnp.float32,
                             -bound, bound)
      b = jnp.zeros((shape[0], spec.rank, *outs), jnp.float32)
      a_name, b_name = _adapter_names(target)
      setattr(self, a_name, transformer.logical_param(a, names[:1 + n_in] + (RANK_AXIS,)))
      setattr(self, b_name,
              transformer.logical_param(b, (names[0], RANK_AXIS) + names[1 + n_in:]))


# Dropout's key while a training forward is traced (None: no dropout).
_DROPOUT_KEY = contextvars.ContextVar("agentrl_lora_dropout_key", default=None)


@contextlib.contextmanager
def dropout_key(key: jax.Array | None):
  """LoRA forwards traced inside this block apply adapter dropout drawn from `key`."""
  token = _DROPOUT_KEY.set(key)
  try:
    yield
  finally:
    _DROPOUT_KEY.reset(token)


def _adapt(spec: LoraConfig, dtype, key, p, layer, name, x, y):
  """y + scale * dropout(x) A B for a target projection of one layer (p: that layer's A, B)."""
  if name not in spec.targets:
    return y
  a_name, b_name = _adapter_names(name)
  a, b = p[a_name].astype(dtype), p[b_name].astype(dtype)
  if key is not None and spec.dropout > 0.0:
    key = jax.random.fold_in(jax.random.fold_in(key, layer), TARGETS.index(name))
    keep = jax.random.bernoulli(key, 1.0 - spec.dropout, x.shape)
    x = jnp.where(keep, x / (1.0 - spec.dropout), 0.0).astype(x.dtype)
  h_BTR = jnp.tensordot(x, a, axes=a.ndim - 1)
  delta = jnp.tensordot(h_BTR, b, axes=1)
  return y + (spec.scale * delta).astype(y.dtype)


class LoraTransformer(nnx.Module):
  """A frozen `transformer.Transformer` (`base`) plus `Adapters` (`lora`), same interface."""

  def __init__(self, base: transformer.Transformer, lora: Adapters):
    self.base = base
    self.lora = lora

  @property
  def cfg(self) -> transformer.Config:
    return self.base.cfg

  def _frozen(self) -> transformer.Transformer:
    graphdef, params = nnx.split(self.base)
    return nnx.merge(graphdef, jax.tree.map(jax.lax.stop_gradient, params))

  def _adapter(self):
    params = nnx.to_pure_dict(nnx.state(self.lora, nnx.Param))
    return params, functools.partial(_adapt, self.lora.spec, self.cfg.dtype, _DROPOUT_KEY.get())

  def __call__(self, tokens_BT, positions_BT, input_mask_BT=None) -> jax.Array:
    return self.logits(self.hidden(tokens_BT, positions_BT, input_mask_BT))

  def hidden(self, tokens_BT, positions_BT, input_mask_BT=None) -> jax.Array:
    return self._frozen().hidden(tokens_BT, positions_BT, input_mask_BT,
                                 adapter=self._adapter())

  def unembed_DV(self) -> jax.Array:
    return self._frozen().unembed_DV()

  def logits(self, h_BTD) -> jax.Array:
    return self._frozen().logits(h_BTD)

  def decode(self, tokens_BT, positions_BT, input_mask_BT, cache: transformer.KVCache,
             cache_index, *, layers=None):
    # Adapters run on the scanned layers: `layers` (per-layer buffers) must stay None.
    return self._frozen().decode(tokens_BT, positions_BT, input_mask_BT, cache, cache_index,
                                 adapter=self._adapter(), layers=layers)


def attach(graphdef, params, adapters_graphdef, adapters_params):
  """(graphdef, params) of a LoraTransformer over a Transformer's and an Adapters'; no copy."""
  model = LoraTransformer(nnx.merge(graphdef, params),
                          nnx.merge(adapters_graphdef, adapters_params))
  return nnx.split(model)


def detach(graphdef, params):
  """(graphdef, params) of a LoraTransformer's frozen base Transformer; no copy."""
  return nnx.split(base_model(nnx.merge(graphdef, params)))


def with_base(params, base):
  """LoRA `params` whose frozen base is replaced by `base` (a Transformer's params)."""
  return _mapping(params, {"base": _raw(base), "lora": _raw(params)["lora"]})


def base_model(model) -> transformer.Transformer:
  """The base of a LoraTransformer with its adapters off (the KL reference policy)."""
  if not isinstance(model, LoraTransformer):
    raise ValueError(f"base_model needs a LoraTransformer (LoRA params, lora.rank > 0); got "
                     f"{type(model).__name__}. Without LoRA, pass the reference params.")
  return model.base


def merge(graphdef, params):
  """(graphdef, params) of the plain Transformer with each W + (alpha / rank) A B folded in.

  Computed in float32 and stored in W's dtype (PEFT's `merge_and_unload`); its logits equal the
  adapter forward's up to float rounding. For `hf.save` and evaluation.
  """
  model = nnx.merge(graphdef, params)
  base_def, base = nnx.split(base_model(model))
  spec, adapters = model.lora.spec, nnx.to_pure_dict(nnx.state(model.lora, nnx.Param))
  base = jax.tree.map(lambda x: x, base)  # new Variables: the caller's params stay as they are
  pure = nnx.to_pure_dict(base)
  for target in spec.targets:
    group, weight, _ = _WEIGHTS[target]
    a_name, b_name = _adapter_names(target)
    a, b, w = adapters[a_name], adapters[b_name], pure["layers"][group][weight]
    L, R = a.shape[0], a.shape[-1]
    delta = jnp.einsum("lir,lro->lio", a.reshape(L, -1, R).astype(jnp.float32),
                       b.reshape(L, R, -1).astype(jnp.float32)).reshape(w.shape)
    pure["layers"][group][weight] = (w.astype(jnp.float32) + spec.scale * delta).astype(w.dtype)
  nnx.replace_by_pure_dict(base, pure)
  return base_def, base


# ---------------------------------------------------------------------------------------------
# The trainable part of any tree holding LoRA params ({"base", "lora"} mappings): params,
# gradients, a TrainState (a dataclass), PPO's {"policy": ..., "value": ...}.
# ---------------------------------------------------------------------------------------------
def _is_lora_node(tree: Any) -> bool:
  return isinstance(tree, Mapping) and set(tree.keys()) == {"base", "lora"}


def _raw(tree: Mapping) -> Mapping:
  # An nnx.State keeps plain nested dicts and wraps them on access; the pytree is the dicts'.
  return tree.raw_mapping if isinstance(tree, nnx.State) else tree


def _mapping(like: Mapping, items: dict) -> Mapping:
  return (nnx.State if isinstance(like, nnx.State) else type(like))(items)


def _children(tree: Any):
  """(names, get(tree, name), rebuild(values)) of a Mapping or dataclass; None for a leaf."""
  if isinstance(tree, Mapping):
    names = list(_raw(tree))
    return (names, lambda t, n: _raw(t)[n],
            lambda values: _mapping(tree, dict(zip(names, values))))
  if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
    names = [f.name for f in dataclasses.fields(tree) if f.init]
    return names, getattr, lambda values: dataclasses.replace(tree, **dict(zip(names, values)))
  return None


def has_adapters(tree: Any) -> bool:
  """Whether `tree` holds LoRA params anywhere."""
  if _is_lora_node(tree):
    return True
  children = _children(tree)
  return children is not None and any(has_adapters(children[1](tree, n)) for n in children[0])


def trainable(tree: Any) -> Any:
  """`tree` without the frozen base of each LoRA params node; `tree` itself if it has none."""
  if not has_adapters(tree):
    return tree
  if _is_lora_node(tree):
    return _mapping(tree, {"lora": _raw(tree)["lora"]})
  names, get, rebuild = _children(tree)
  return rebuild([trainable(get(tree, n)) for n in names])


def combine(tree: Any, trained: Any) -> Any:
  """`tree` with its trainable part (as `trainable` gives it) replaced by `trained`."""
  if not has_adapters(tree):
    return trained
  if _is_lora_node(tree):
    return _mapping(tree, {n: _raw(tree if n == "base" else trained)[n] for n in _raw(tree)})
  names, get, rebuild = _children(tree)
  return rebuild([combine(get(tree, n), get(trained, n)) for n in names])
