"""HF config.json and GGUF metadata <-> `transformer.Config`.

Reads transformers 4.x (`rope_theta`, `rope_scaling`, `rope_local_base_freq`,
`sliding_window_pattern`) and 5.x (`rope_parameters`, per-layer-type `rope_parameters`,
`layer_types`) spellings, and writes both so either version loads the export.
"""
from typing import Any

from agentrl.models import decoder_math
from agentrl.models import gguf_file
from agentrl.models import transformer

# Every error about a config.json or GGUF names the file; the CLI prints it as one line.
ModelFileError = gguf_file.ModelFileError

# family -> (HF architecture, model_type)
HF_ARCHS = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "gemma": ("GemmaForCausalLM", "gemma"),
    "gemma2": ("Gemma2ForCausalLM", "gemma2"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
}
_FAMILY_OF = {model_type: family for family, (_, model_type) in HF_ARCHS.items()}
_GGUF_ARCHS = ("llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3")

# The flags each family's HF class hard-codes; any other value cannot be exported to it.
_FLAG_DEFAULTS = dict(act="silu", norm_plus_one=False, embed_scale=False, post_norms=False,
                      qkv_bias=False, qk_norm=False)
_GEMMA_FLAGS = dict(act="gelu_tanh", norm_plus_one=True, embed_scale=True)
FAMILY_FLAGS = {
    "llama": {},
    "qwen2": dict(qkv_bias=True),
    "qwen3": dict(qk_norm=True),
    "gemma": _GEMMA_FLAGS,
    "gemma2": dict(_GEMMA_FLAGS, post_norms=True),
    "gemma3": dict(_GEMMA_FLAGS, post_norms=True, qk_norm=True),
}
# Gemma3TextConfig defaults: multimodal Gemma 3 configs leave most text_config keys out.
_GEMMA3_TEXT_DEFAULTS = dict(
    vocab_size=262208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
    num_attention_heads=8, num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256,
    sliding_window=4096, rms_norm_eps=1e-6, max_position_embeddings=131072,
    sliding_window_pattern=6)
_ACTS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
         "gelu": "gelu"}
_NO_DEFAULT = object()


def _family_fields(family: str) -> dict[str, Any]:
  return {"family": family, **_FLAG_DEFAULTS, **FAMILY_FLAGS[family]}


def _pattern(types: list[str], where: str) -> int:
  """The period p with layer i global iff (i + 1) % p == 0 that reproduces `layer_types`."""
  for p in range(1, len(types) + 2):
    if all((t == "full_attention") == ((i + 1) % p == 0) for i, t in enumerate(types)):
      return p
  raise ModelFileError(f"{where}: layer_types {types} is not a periodic sliding/full pattern, "
                       "which transformer.Config cannot express.")


def _rope(hf: dict, family: str, where: str) -> dict[str, Any]:
  params = hf.get("rope_parameters") or {}
  legacy = hf.get("rope_scaling") or {}
  out = {}
  if family == "gemma3":
    full = params.get("full_attention", params)
    local = params.get("sliding_attention", {})
    out["rope_local_theta"] = float(local.get("rope_theta", hf.get("rope_local_base_freq",
                                                                   10000.0)))
  else:
    full = params
  # transformers 5.x also prefers the legacy keys when a file has both.
  theta = hf.get("rope_theta", full.get("rope_theta", 1e6 if family == "gemma3" else 10000.0))
  scaling = legacy or full
  kind = scaling.get("rope_type", scaling.get("type", "default"))
  if kind not in transformer.ROPE_SCALINGS:
    raise ModelFileError(f"{where}: RoPE type {kind!r} is not supported (supported: "
                         f"{transformer.ROPE_SCALINGS}).")
  out.update(rope_theta=float(theta), rope_scaling=kind)
  if kind != "default":
    out["rope_factor"] = float(scaling["factor"])
  if kind == "llama3":
    out.update(rope_low_freq_factor=float(scaling["low_freq_factor"]),
               rope_high_freq_factor=float(scaling["high_freq_factor"]),
               rope_original_max_len=int(scaling["original_max_position_embeddings"]))
  return out


def _required(hf: dict, key: str, where: str):
  if hf.get(key) is None:
    raise ModelFileError(f"{where}: missing required key {key!r} for model_type "
                         f"{hf.get('model_type')!r}.")
  return hf[key]


def _optional(hf: dict, key: str, default):
  return default if hf.get(key) is None else hf[key]


def _attention_kind(hf: dict, family: str, depth: int, where: str) -> dict[str, Any]:
  types = hf.get("layer_types")
  if family not in ("gemma2", "gemma3"):
    if hf.get("use_sliding_window") or any(t != "full_attention" for t in types or []):
      raise ModelFileError(f"{where}: sliding-window attention is only supported for Gemma 2/3.")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
      raise ModelFileError(f"{where}: attention_bias/mlp_bias=true is not supported for "
                           f"{hf.get('model_type')!r}.")
    return {}
  if types is not None:
    pattern = _pattern(list(types), where)
  else:
    pattern = 2 if family == "gemma2" else hf.get("sliding_window_pattern",
                                                   hf.get("_sliding_window_pattern", 6))
  window = hf.get("sliding_window")
  out = dict(query_pre_attn_scalar=float(_required(hf, "query_pre_attn_scalar", where)),
             attn_logit_softcap=hf.get("attn_logit_softcapping"),
             final_logit_softcap=hf.get("final_logit_softcapping"))
  if window is not None and pattern <= depth:
    out.update(sliding_window=int(window), sliding_window_pattern=int(pattern))
  elif window is not None:  # every layer is local
    out.update(sliding_window=int(window), sliding_window_pattern=depth + 1)
  return out


def config_from_hf(hf: dict, *, where: str = "config.json", **overrides) -> transformer.Config:
  """A Config from an HF config.json dict; `overrides` set any Config field (e.g. dtype)."""
  model_type = hf.get("model_type")
  if model_type == "gemma3" and "text_config" in hf:  # multimodal: keep the text decoder
    hf = {**hf["text_config"], "model_type": "gemma3_text",
          "tie_word_embeddings": hf.get("tie_word_embeddings", True)}
    model_type = "gemma3_text"
  if model_type not in _FAMILY_OF:
    raise ModelFileError(f"{where}: model_type {model_type!r} (architectures "
                         f"{hf.get('architectures')}) is not supported; supported model types: "
                         f"{sorted(_FAMILY_OF)}.")
  family = _FAMILY_OF[model_type]
  if family == "gemma3":
    hf = {**_GEMMA3_TEXT_DEFAULTS, **hf}

  def get(key, default=_NO_DEFAULT):
    return _required(hf, key, where) if default is _NO_DEFAULT else _optional(hf, key, default)

  width, heads = int(get("hidden_size")), int(get("num_attention_heads"))
  depth = int(get("num_hidden_layers"))
  fields = _family_fields(family)
  if family.startswith("gemma"):  # HF Gemma ignores hidden_act "gelu" and uses tanh-GELU
    act = get("hidden_activation", "gelu_pytorch_tanh")
  else:
    act = get("hidden_act", "silu")
  if act not in _ACTS:
    raise ModelFileError(f"{where}: activation {act!r} is not supported ({sorted(_ACTS)}).")
  fields.update(
      vocab=int(get("vocab_size")), width=width, depth=depth, heads=heads,
      kv_heads=int(get("num_key_value_heads", heads)),
      head_dim=int(get("head_dim", width // heads)), mlp=int(get("intermediate_size")),
      act=_ACTS[act], norm_eps=float(get("rms_norm_eps", 1e-6)),
      tie_embeddings=bool(get("tie_word_embeddings", family.startswith("gemma"))),
      max_len=int(get("max_position_embeddings", 8192)),
      **_rope(hf, family, where), **_attention_kind(hf, family, depth, where))
  return transformer.Config(**{**fields, **overrides})


def _check_exportable(cfg: transformer.Config) -> None:
  arch = HF_ARCHS[cfg.family][0]
  problems = [f"{k}={getattr(cfg, k)!r} (needs {v!r})"
              for k, v in {**_FLAG_DEFAULTS, **FAMILY_FLAGS[cfg.family]}.items()
              if getattr(cfg, k) != v and not (k == "act" and cfg.family in ("llama", "qwen2",
                                                                               "qwen3"))]
  if cfg.family not in ("gemma2", "gemma3"):
    problems += [f"{k}={getattr(cfg, k)!r} (needs None)"
                 for k in ("attn_logit_softcap", "final_logit_softcap", "sliding_window")
                 if getattr(cfg, k) is not None]
    if cfg.query_pre_attn_scalar not in (None, cfg.head_dim):
      problems.append(f"query_pre_attn_scalar={cfg.query_pre_attn_scalar} (needs head_dim)")
  if cfg.family != "gemma3" and cfg.rope_local_theta is not None:
    problems.append(f"rope_local_theta={cfg.rope_local_theta} (needs None)")
  if problems:
    raise ValueError(f"Config(family={cfg.family!r}) cannot be written as {arch}: "
                     + "; ".join(problems) + ". Pick the family whose features these are.")


def config_to_hf(cfg: transformer.Config) -> dict[str, Any]:
  """The config.json dict transformers needs to rebuild this decoder."""
  _check_exportable(cfg)
  arch, model_type = HF_ARCHS[cfg.family]
  act = {"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh", "gelu": "gelu"}[cfg.act]
  hf = dict(architectures=[arch], model_type=model_type, vocab_size=cfg.vocab,
            hidden_size=cfg.width, intermediate_size=cfg.mlp, num_hidden_layers=cfg.depth,
            num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
            head_dim=cfg.head_dim, rms_norm_eps=cfg.norm_eps, max_position_embeddings=cfg.max_len,
            tie_word_embeddings=cfg.tie_embeddings, hidden_act=act, attention_bias=False,
            rope_theta=cfg.rope_theta)
  scaling = {"rope_type": cfg.rope_scaling, "factor": cfg.rope_factor}
  if cfg.rope_scaling == "llama3":
    scaling.update(low_freq_factor=cfg.rope_low_freq_factor,
                   high_freq_factor=cfg.rope_high_freq_factor,
                   original_max_position_embeddings=cfg.rope_original_max_len)
  hf["rope_scaling"] = None if cfg.rope_scaling == "default" else scaling
  full = {"rope_type": "default", "rope_theta": cfg.rope_theta}
  if cfg.rope_scaling != "default":
    full.update(scaling)
  hf["rope_parameters"] = full
  if cfg.family.startswith("gemma"):
    hf["hidden_activation"] = act
  if cfg.family in ("gemma2", "gemma3"):
    types = ["sliding_attention" if local else "full_attention" for local in cfg.local_layers]
    scalar = cfg.query_pre_attn_scalar or cfg.head_dim
    # transformers 5 validates types strictly: this one must be an int when integral.
    hf.update(query_pre_attn_scalar=int(scalar) if float(scalar).is_integer() else scalar,
              attn_logit_softcapping=cfg.attn_logit_softcap,
              final_logit_softcapping=cfg.final_logit_softcap, layer_types=types,
              sliding_window=cfg.sliding_window or cfg.max_len)
  if cfg.family == "gemma3":
    local_theta = cfg.rope_local_theta or cfg.rope_theta
    hf.update(rope_local_base_freq=local_theta, sliding_window_pattern=cfg.sliding_window_pattern)
    hf["rope_parameters"] = {"full_attention": full, "sliding_attention": {
        "rope_type": "default", "rope_theta": local_theta}}
  return hf


# ------------------------------------------------------------------------------------------
# GGUF metadata.
# ------------------------------------------------------------------------------------------


def _field(reader, key: str, default=_NO_DEFAULT):
  if key not in reader.fields:
    if default is _NO_DEFAULT:
      raise ModelFileError(f"{reader.path}: GGUF metadata key {key!r} is missing.")
    return default
  return reader.fields[key]


def gguf_arch(reader) -> str:
  arch = _field(reader, "general.architecture")
  if arch not in _GGUF_ARCHS:
    raise ModelFileError(f"{reader.path}: GGUF architecture {arch!r} is not supported; "
                         f"supported: {_GGUF_ARCHS}.")
  return arch


def _uniform(value, key: str, where: str):
  if isinstance(value, list):
    if len(set(value)) != 1:
      raise ModelFileError(f"{where}: GGUF {key} varies per layer ({value}); not supported.")
    return value[0]
  return value


def _llama3_from_freqs(reader, theta: float, head_dim: int, where: str) -> dict[str, Any]:
  """Recovers Llama-3 rope scaling from llama.cpp's precomputed `rope_freqs` divisors."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  divisors = reader.tensors["rope_freqs.weight"].to_numpy().reshape(-1)
  fields = dict(rope_scaling="llama3", rope_factor=float(divisors.max()),
                rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_max_len=8192)
  probe = transformer.Config(vocab=1, width=head_dim, depth=1, heads=1, kv_heads=1,
                             head_dim=head_dim, mlp=1, rope_theta=theta, **fields)
  plain = transformer.Config(vocab=1, width=head_dim, depth=1, heads=1, kv_heads=1,
                             head_dim=head_dim, mlp=1, rope_theta=theta)
  ratio = decoder_math.rope_inv_freq(plain, False) / decoder_math.rope_inv_freq(probe, False)
  if not np.allclose(ratio, divisors, rtol=1e-3):
    raise ModelFileError(f"{where}: rope_freqs does not match Llama-3 scaling with "
                         "low_freq_factor=1, high_freq_factor=4, original context 8192.")
  return fields


def config_from_gguf(reader, *, where: str = "model.gguf", **overrides) -> transformer.Config:
  """A Config from a `gguf_file.GgufFile`'s metadata (llama.cpp key names) and shapes."""
  arch = gguf_arch(reader)
  key = lambda k, default=_NO_DEFAULT: _uniform(_field(reader, f"{arch}.{k}", default), k, where)
  names = {name: t.shape for name, t in reader.tensors.items()}
  width, heads = int(key("embedding_length")), int(key("attention.head_count"))
  head_dim = int(key("attention.key_length", width // heads))
  if int(key("rope.dimension_count", head_dim)) != head_dim:
    raise ModelFileError(f"{where}: partial rotary embeddings are not supported.")
  if "token_embd.weight" not in names:
    raise ModelFileError(f"{where} has no token_embd.weight tensor.")
  fields = _family_fields(arch)
  theta = float(key("rope.freq_base", 10000.0))
  depth = int(key("block_count"))
  fields.update(
      vocab=names["token_embd.weight"][0], width=width, depth=depth, heads=heads,
      kv_heads=int(key("attention.head_count_kv", heads)), head_dim=head_dim,
      mlp=int(key("feed_forward_length")), rope_theta=theta,
      # float32 in the file: 1e-5 reads as 9.9999997e-06.
      norm_eps=float(f"{float(key('attention.layer_norm_rms_epsilon', 1e-6)):.6g}"),
      tie_embeddings="output.weight" not in names, max_len=int(key("context_length", 8192)))
  scaling = key("rope.scaling.type", "none")
  if scaling == "linear":
    fields.update(rope_scaling="linear", rope_factor=float(key("rope.scaling.factor")))
  elif scaling not in ("none", ""):
    raise ModelFileError(f"{where}: rope scaling {scaling!r} is not supported.")
  if "rope_freqs.weight" in names:
    fields.update(_llama3_from_freqs(reader, theta, head_dim, where))
  if arch in ("gemma2", "gemma3"):
    # llama.cpp hard-codes these per architecture (27B models use width / heads).
    big = depth in (46, 62)
    pattern = key("attention.sliding_window_pattern", 2 if arch == "gemma2" else 6)
    if isinstance(pattern, list):  # newer files: one "uses the window" flag per layer
      pattern = _pattern(["sliding_attention" if s else "full_attention" for s in pattern], where)
    fields.update(query_pre_attn_scalar=float(width // heads if big else head_dim),
                  sliding_window=int(key("attention.sliding_window")),
                  sliding_window_pattern=int(pattern))
  if arch == "gemma2":
    fields.update(attn_logit_softcap=float(key("attn_logit_softcapping", 50.0)),
                  final_logit_softcap=float(key("final_logit_softcapping", 30.0)))
  if arch == "gemma3":
    fields["rope_local_theta"] = float(key("rope.freq_base_swa", 10000.0))
  return transformer.Config(**{**fields, **overrides})
