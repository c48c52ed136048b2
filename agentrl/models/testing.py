"""Test helpers: random decoder parameters drawn with numpy (no XLA compilation), tiny tokenizers.

Building a `Transformer` eagerly compiles one small XLA program per distinct parameter shape,
which costs seconds on CPU; tests only need random values in the right tree.
"""
import json
import os

from flax import nnx
import jax
import numpy as np

from agentrl.models import transformer


def random_params(cfg: transformer.Config, seed: int = 0, noise: float = 0.3):
  """(graphdef, params) of a `Transformer(cfg)` with non-trivial random values.

  Matrices ~ N(0, 1 / width); norm scales, q/k norms and biases are their initial value
  (1, or 0 for (1 + w) norms) plus N(0, noise^2), so every parameter matters.
  """
  graphdef, state = nnx.split(
      nnx.eval_shape(lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(0))))
  rng = np.random.default_rng(seed)

  def draw(path, x):
    name = str(path[-1].key)
    z = rng.standard_normal(x.shape)
    if "norm" in name:
      z = (0.0 if cfg.norm_plus_one else 1.0) + noise * z
    elif "bias" in name:
      z = noise * z
    else:
      z = z / np.sqrt(cfg.width)
    return np.asarray(z, x.dtype)

  values = jax.tree_util.tree_map_with_path(draw, nnx.to_pure_dict(state))
  nnx.replace_by_pure_dict(state, values)
  return graphdef, state


def write_tokenizer(directory, ids: int, extra: dict[str, int] | None = None) -> str:
  """Writes a word-level tokenizer.json with words "w0".."w<ids-1>" and returns its path.

  `extra` adds words at chosen ids, which may leave a gap (ids a vocabulary never uses still
  need embedding rows below its largest id). "<s>" follows as an added special token.
  """
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import models, pre_tokenizers  # pylint: disable=g-import-not-at-top
  vocab = {f"w{i}": i for i in range(ids)} | (extra or {})
  tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="w0"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tok.add_special_tokens([tokenizers.AddedToken("<s>", special=True, normalized=False)])
  path = os.path.join(os.fspath(directory), "tokenizer.json")
  tok.save(path)
  return path
