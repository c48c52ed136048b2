"""Tokenizers: sentencepiece `.model`, HF `tokenizer.json`, and vocabularies embedded in GGUF.

  tok = tokenizer.load("path/to/hf_dir")          # tokenizer.json (+ tokenizer_config.json)
  tok = tokenizer.load("m.model")                 # sentencepiece
  tok = tokenizer.load(hf.smollm2_path())         # the GGUF's own BPE vocabulary
  tok = tokenizer.train_sentencepiece(lines, 512) # in-process, for tiny experiments
  ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Hi"}]))

Special tokens written in the text (e.g. "<|im_start|>") encode to their ids. Chat templates are
Jinja, rendered in a sandbox (never `eval`); without a shipped template the ChatML one is used.
"""
import dataclasses
import datetime
import io
import json
import os
from typing import Any, Iterable, Sequence

from agentrl.models import gguf_file
from agentrl.models import safetensors_file

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# Tokens that close an assistant turn in common chat formats (ChatML, Gemma, Llama 3, Phi).
END_OF_TURN_TOKENS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>", "<|endoftext|>")
# tokenizer.ggml.pre -> split regex before byte-level BPE (as llama.cpp / transformers).
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GGUF_SPLITS = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT,
                "qwen2": _QWEN2_SPLIT}
_GGUF_GPT2_PRES = ("smollm", "gpt-2", "gpt2", "default")


@dataclasses.dataclass
class Tokenizer:
  """Text <-> token ids plus the special ids and chat template a policy needs."""
  backend: Any                      # _HfBackend or _SpBackend
  bos_id: int | None
  eos_id: int | None
  pad_id: int | None                # falls back to eos_id when the tokenizer has none
  chat_template: str
  bos_token: str = ""
  eos_token: str = ""
  special_ids: frozenset[int] = frozenset()
  end_of_turn_ids: tuple[int, ...] = ()
  source: str = ""                  # the file it was read from; "" if built in-process

  @property
  def vocab_size(self) -> int:
    """Largest id it can emit + 1 (added and special tokens included): the embedding rows it
    needs. Not the number of tokens, which is smaller when the ids leave gaps."""
    return self.backend.vocab_size()

  def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
    if not isinstance(text, str):
      raise TypeError(f"encode() takes a str, got {type(text).__name__}.")
    ids = self.backend.encode(text)
    if add_bos:
      if self.bos_id is None:
        raise ValueError("add_bos=True but this tokenizer has no BOS token.")
      ids = [self.bos_id] + ids
    return ids

  def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
    return self.backend.decode([int(i) for i in ids], skip_special)

  def token_to_id(self, token: str) -> int | None:
    return self.backend.token_to_id(token)

  def apply_chat_template(self, messages: Sequence[dict], *, add_generation_prompt: bool = True,
                          **template_kwargs) -> str:
    """Renders `messages` ([{"role", "content"}]) with the chat template (Jinja, sandboxed)."""
    for i, m in enumerate(messages):
      if not isinstance(m, dict) or "role" not in m or "content" not in m:
        raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {m!r}.")
    return _render(self.chat_template, messages=list(messages),
                   add_generation_prompt=add_generation_prompt, bos_token=self.bos_token,
                   eos_token=self.eos_token, **template_kwargs)


def _render(template: str, **context) -> str:
  import jinja2  # pylint: disable=g-import-not-at-top
  from jinja2 import sandbox  # pylint: disable=g-import-not-at-top

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)

  # The settings transformers uses, so shipped templates render identically.
  env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                              extensions=["jinja2.ext.loopcontrols"])
  env.filters["tojson"] = tojson
  env.globals["raise_exception"] = raise_exception
  env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
  return env.from_string(template).render(**context)


class _HfBackend:
  """A `tokenizers.Tokenizer` (from tokenizer.json or built from GGUF metadata)."""

  def __init__(self, tok):
    self.tok = tok
    self.id_limit = max(tok.get_vocab(with_added_tokens=True).values(), default=-1) + 1

  def vocab_size(self):
    return self.id_limit

  def encode(self, text):
    return self.tok.encode(text, add_special_tokens=False).ids

  def decode(self, ids, skip_special):
    return self.tok.decode(ids, skip_special_tokens=skip_special)

  def token_to_id(self, token):
    return self.tok.token_to_id(token)

  def special_ids(self):
    return {i for i, t in self.tok.get_added_tokens_decoder().items() if t.special}


class _SpBackend:
  """A sentencepiece processor."""

  def __init__(self, sp):
    self.sp = sp
    self.user_defined = _user_defined_ids(sp)

  def vocab_size(self):
    return self.sp.get_piece_size()

  def encode(self, text):
    return self.sp.encode(text)

  def decode(self, ids, skip_special):
    if skip_special:
      ids = [i for i in ids if not (self.sp.is_control(i) or i in self.user_defined)]
    # sentencepiece drops control pieces (<s>, </s>) when decoding; keep them visible.
    out, run = [], []
    for i in ids:
      if self.sp.is_control(i):
        out += [self.sp.decode(run), self.sp.id_to_piece(i)]
        run = []
      else:
        run.append(i)
    return "".join(out + [self.sp.decode(run)])

  def token_to_id(self, token):
    i = self.sp.piece_to_id(token)
    return None if i == self.sp.unk_id() and token != self.sp.id_to_piece(i) else i

  def special_ids(self):
    return {i for i in range(self.sp.get_piece_size()) if self.sp.is_control(i)} | set(
        self.user_defined)


def _user_defined_ids(sp) -> frozenset[int]:
  """Ids of USER_DEFINED pieces (e.g. <|im_end|>); the processor API does not expose them."""
  try:
    from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
    proto = sentencepiece_model_pb2.ModelProto.FromString(sp.serialized_model_proto())
  except ImportError:  # the proto module needs protobuf, which sentencepiece does not require
    return frozenset()
  user_defined = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
  return frozenset(i for i, p in enumerate(proto.pieces) if p.type == user_defined)


def _finish(backend, *, bos, eos, pad, chat_template) -> Tokenizer:
  """Resolves special token strings/ids and the end-of-turn set into a Tokenizer."""
  def as_id(x):
    return backend.token_to_id(x) if isinstance(x, str) else x

  bos_id, eos_id, pad_id = as_id(bos), as_id(eos), as_id(pad)
  pad_id = eos_id if pad_id is None else pad_id
  special = frozenset(backend.special_ids())
  eot = [backend.token_to_id(t) for t in END_OF_TURN_TOKENS]
  eot = tuple(dict.fromkeys([i for i in eot if i is not None and i in special]
                            + ([eos_id] if eos_id is not None else [])))
  token = lambda i: "" if i is None else backend.decode([i], False)
  return Tokenizer(backend=backend, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id,
                   chat_template=chat_template or CHATML_TEMPLATE, bos_token=token(bos_id),
                   eos_token=token(eos_id), special_ids=special, end_of_turn_ids=eot)


def _token_str(entry):
  return entry.get("content") if isinstance(entry, dict) else entry


def _bad(path: str, what: str) -> Exception:
  return gguf_file.ModelFileError(f"{path}: {what}; re-download or re-export the tokenizer.")


# The keys each tokenizers model needs in tokenizer.json.
_MODEL_KEYS = {"BPE": ("vocab", "merges"), "WordPiece": ("vocab",), "WordLevel": ("vocab",),
               "Unigram": ("vocab",)}


def _check_tokenizer_json(path: str) -> None:
  """ModelFileError for a tokenizer.json whose model lacks a part or has an empty vocabulary.

  The tokenizers library reports the first as "Missing vocab/merges at line 1 column 5572"
  and accepts the second, which then encodes every text to no tokens.
  """
  data = safetensors_file.read_json(path, "tokenizer.json")
  model = data.get("model") if isinstance(data, dict) else None
  if not isinstance(model, dict):
    raise _bad(path, "no 'model' object, so not a tokenizer.json of the tokenizers library")
  kind = model.get("type", "BPE" if "merges" in model else None)
  missing = [k for k in _MODEL_KEYS.get(kind, ()) if k not in model]
  if missing:
    raise _bad(path, f"model.{missing[0]} is missing (a {kind} model needs "
                     f"{' and '.join(_MODEL_KEYS[kind])})")
  if "vocab" in model and not model["vocab"]:
    raise _bad(path, "the vocabulary (model.vocab) is empty, so every text would encode to "
                     "no tokens")


def _load_tokenizer_json(path: str) -> Tokenizer:
  import tokenizers  # pylint: disable=g-import-not-at-top
  _check_tokenizer_json(path)
  try:
    backend = _HfBackend(tokenizers.Tokenizer.from_file(path))
  except Exception as e:  # pylint: disable=broad-except  # tokenizers raises bare Exception
    raise _bad(path, f"the tokenizers library cannot read it ({e})") from None
  config_path = os.path.join(os.path.dirname(path), "tokenizer_config.json")
  config = {}
  if os.path.isfile(config_path):
    config = safetensors_file.read_json(config_path, "tokenizer_config.json")
    if not isinstance(config, dict):
      raise _bad(config_path, f"a JSON {type(config).__name__}, not an object")
  template = config.get("chat_template")
  jinja_path = os.path.join(os.path.dirname(path), "chat_template.jinja")
  if template is None and os.path.isfile(jinja_path):
    with open(jinja_path) as f:
      template = f.read()
  if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}]
    named = {t["name"]: t["template"] for t in template}
    template = named.get("default", next(iter(named.values()), None))
  return _finish(backend, bos=_token_str(config.get("bos_token")),
                 eos=_token_str(config.get("eos_token")),
                 pad=_token_str(config.get("pad_token")), chat_template=template)


def _load_sentencepiece(path: str = "", model_proto: bytes | None = None) -> Tokenizer:
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  sp = spm.SentencePieceProcessor(model_file=path) if model_proto is None else (
      spm.SentencePieceProcessor(model_proto=model_proto))
  none_if_neg = lambda i: None if i < 0 else i
  return _finish(_SpBackend(sp), bos=none_if_neg(sp.bos_id()), eos=none_if_neg(sp.eos_id()),
                 pad=none_if_neg(sp.pad_id()), chat_template=None)


def _load_gguf(path: str) -> Tokenizer:
  """Byte-level BPE from tokenizer.ggml.{tokens,merges,token_type} (docs/offline.md §6)."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  # pylint: disable-next=g-import-not-at-top
  from tokenizers import decoders, models, pre_tokenizers
  field = gguf_file.GgufFile(path).fields.get
  kind, pre = field("tokenizer.ggml.model"), field("tokenizer.ggml.pre", "default")
  if kind != "gpt2":
    raise gguf_file.ModelFileError(
        f"{path}: GGUF tokenizer model {kind!r} is not supported (only byte-level BPE, "
        "'gpt2'); load the model's tokenizer.json or tokenizer.model instead.")
  tokens, types = field("tokenizer.ggml.tokens", []), field("tokenizer.ggml.token_type")
  if not tokens:
    raise _bad(path, "GGUF metadata key tokenizer.ggml.tokens is missing or empty, so every text "
                     "would encode to no tokens")
  control = {i for i, t in enumerate(types or []) if t == 3}  # 3 = CONTROL
  merged = any(len(t) > 1 for i, t in enumerate(tokens) if i not in control)
  if field("tokenizer.ggml.merges", None) is None and merged:
    raise _bad(path, "GGUF metadata key tokenizer.ggml.merges is missing; a byte-level BPE "
                     "vocabulary of multi-byte tokens cannot be applied without its merges")
  merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges", [])]
  try:
    tok = tokenizers.Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
  except Exception as e:  # pylint: disable=broad-except  # tokenizers raises bare Exception
    raise _bad(path, f"tokenizer.ggml.tokens/merges do not form a BPE vocabulary ({e})") from None
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=pre not in _GGUF_SPLITS)
  if pre in _GGUF_SPLITS:
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(_GGUF_SPLITS[pre]), behavior="isolated"),
        byte_level])
  elif pre in _GGUF_GPT2_PRES:
    # SmolLM's vocabulary was trained on single digits (as its tokenizer.json splits them).
    digits = [pre_tokenizers.Digits(individual_digits=True)] if pre == "smollm" else []
    tok.pre_tokenizer = pre_tokenizers.Sequence(digits + [byte_level])
  else:
    raise gguf_file.ModelFileError(f"{path}: tokenizer.ggml.pre {pre!r} is not supported "
                                   f"(supported: {sorted(_GGUF_SPLITS) + list(_GGUF_GPT2_PRES)}).")
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([tokenizers.AddedToken(tokens[i], special=True, normalized=False)
                          for i in sorted(control)])
  ids = lambda k: field(f"tokenizer.ggml.{k}")
  return _finish(_HfBackend(tok), bos=ids("bos_token_id"), eos=ids("eos_token_id"),
                 pad=ids("padding_token_id"), chat_template=field("tokenizer.chat_template"))


def load(path) -> Tokenizer:
  """A Tokenizer from a directory (tokenizer.json or tokenizer.model), .json, .model or .gguf."""
  path = os.fspath(path)
  if os.path.isdir(path):
    for name in ("tokenizer.json", "tokenizer.model"):
      if os.path.isfile(os.path.join(path, name)):
        return load(os.path.join(path, name))
    raise gguf_file.MissingFileError(f"{path} has neither tokenizer.json nor tokenizer.model.")
  if not os.path.isfile(path):
    raise gguf_file.MissingFileError(f"No tokenizer at {path!r}.")
  readers = {".json": _load_tokenizer_json, ".model": _load_sentencepiece, ".gguf": _load_gguf}
  for suffix, read in readers.items():
    if path.endswith(suffix):
      return dataclasses.replace(read(path), source=path)
  raise gguf_file.ModelFileError(f"Unrecognized tokenizer file {path!r}: expected "
                                 "tokenizer.json, a sentencepiece .model, a .gguf, or a directory "
                                 "holding one.")


def save(tok: Tokenizer, directory) -> str:
  """Writes `tok` next to an exported model so that `load(directory)` reads it back.

  A sentencepiece vocabulary goes to tokenizer.model; a `tokenizers` one to tokenizer.json plus
  tokenizer_config.json (bos/eos/pad tokens and the chat template), as transformers expects.
  Returns the path written.
  """
  directory = os.fspath(directory)
  os.makedirs(directory, exist_ok=True)
  if isinstance(tok.backend, _SpBackend):
    path = os.path.join(directory, "tokenizer.model")
    with open(path, "wb") as f:
      f.write(tok.backend.sp.serialized_model_proto())
    return path
  path = os.path.join(directory, "tokenizer.json")
  tok.backend.tok.save(path)
  token = lambda i: None if i is None else tok.backend.tok.id_to_token(i)
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump({"bos_token": token(tok.bos_id), "eos_token": token(tok.eos_id),
               "pad_token": token(tok.pad_id), "chat_template": tok.chat_template}, f, indent=2)
  return path


def train_sentencepiece(lines: Iterable[str], vocab_size: int, *, model_type: str = "bpe",
                        user_defined_symbols: Sequence[str] = ("<|im_start|>", "<|im_end|>"),
                        path: str | None = None, **trainer_kwargs) -> Tokenizer:
  """Trains a sentencepiece model in-process (docs/offline.md §8); ChatML-ready by default.

  Ids: pad 0, unk 1, bos 2, eos 3, then `user_defined_symbols`. `vocab_size` is a soft limit
  (a small corpus may yield fewer pieces) and must exceed ~290 (256 byte-fallback pieces plus
  the characters seen). Writes the .model file to `path` if given.
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  buf = io.BytesIO()
  options = dict(model_type=model_type, character_coverage=1.0, byte_fallback=True,
                 split_digits=True, pad_id=0, unk_id=1, bos_id=2, eos_id=3,
                 # Exact text round trips (token-in, token-out agents): no "▁" prepended to
                 # the text, whitespace and Unicode kept as written.
                 add_dummy_prefix=False, remove_extra_whitespaces=False,
                 normalization_rule_name="identity",
                 user_defined_symbols=list(user_defined_symbols), hard_vocab_limit=False,
                 num_threads=2, minloglevel=2)
  options.update(trainer_kwargs)
  spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf,
                                 vocab_size=vocab_size, **options)
  if path is not None:
    with open(path, "wb") as f:
      f.write(buf.getvalue())
  return _load_sentencepiece(model_proto=buf.getvalue())
