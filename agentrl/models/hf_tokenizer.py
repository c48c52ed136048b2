"""Exports a `tokenizer.Tokenizer` as a transformers fast tokenizer that tokenizes exactly as we do.

`save(tok, directory)` writes tokenizer.json (+ tokenizer_config.json, and tokenizer.model for a
sentencepiece vocabulary) such that `AutoTokenizer.from_pretrained(directory)` gives:

  tok_hf(text).input_ids          == [bos] + tok.encode(text)   (our plain-text prompts add BOS)
  tok_hf(text, add_special_tokens=False).input_ids == tok.encode(text)
  tok_hf.apply_chat_template(msgs, tokenize=True)  == tok.encode(tok.apply_chat_template(msgs))

BOS comes from a TemplateProcessing post-processor, which transformers applies for
`add_special_tokens=True` (its default) and not inside `apply_chat_template`, the same split our
rollouts make (`agent_loop`: BOS on raw-text prompts, none on chat-templated ones).

A sentencepiece vocabulary is rebuilt in the `tokenizers` library: a "char" model as BPE without
merges, a "bpe" model as BPE with the merges recovered from the vocabulary
(each piece that is the concatenation of two pieces, ranked by the merged piece's id, as
transformers' own converter does), with sentencepiece's byte fallback and whitespace escape
("▁"). Other sentencepiece settings are refused with an error naming them.

One difference is left, in transformers only: it registers the bos/eos/pad tokens of
tokenizer_config.json as special, so the literal text "<s>" in a prompt encodes to BOS's id there,
whereas sentencepiece (and tokenizer.json read by `tokenizers`) spells it out as characters, as
every transformers conversion of a sentencepiece vocabulary does. No task prompt contains them.
"""
import json
import os

from agentrl.models import tokenizer as tokenizer_lib

_SPACE = "\u2581"


def _from_sentencepiece(sp):
  """A `tokenizers.Tokenizer` equivalent to a sentencepiece processor (char or BPE)."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, normalizers  # pylint: disable=g-import-not-at-top
  from sentencepiece import sentencepiece_model_pb2 as pb  # pylint: disable=g-import-not-at-top
  proto = pb.ModelProto.FromString(sp.serialized_model_proto())
  spec, norm = proto.trainer_spec, proto.normalizer_spec
  unsupported = []
  if norm.name not in ("identity", "") or norm.precompiled_charsmap:
    unsupported.append(f"normalization {norm.name!r}")
  if norm.add_dummy_prefix or norm.remove_extra_whitespaces or not norm.escape_whitespaces:
    unsupported.append("add_dummy_prefix/remove_extra_whitespaces/escape_whitespaces other than "
                       "False/False/True")
  kind = pb.TrainerSpec.ModelType.Name(spec.model_type)
  if kind not in ("CHAR", "BPE"):
    unsupported.append(f"model_type {kind}")
  if unsupported:
    raise ValueError(f"cannot export this sentencepiece tokenizer exactly ({'; '.join(unsupported)}"
                     "); export it as tokenizer.model only, or train it with "
                     "tokenizer.train_sentencepiece's defaults")
  vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
  unk = proto.pieces[sp.unk_id()].piece
  # A char model is BPE without merges: one id per character, runs of unknowns fused into one
  # <unk> as sentencepiece does.
  normal = {pb.ModelProto.SentencePiece.NORMAL, pb.ModelProto.SentencePiece.USER_DEFINED}
  pieces = {p.piece for p in proto.pieces if p.type in normal} if kind == "BPE" else set()
  merges = sorted(((vocab[piece], vocab[piece[:i]], vocab[piece[i:]]), (piece[:i], piece[i:]))
                  for piece in pieces for i in range(1, len(piece))
                  if piece[:i] in pieces and piece[i:] in pieces)
  tok = tokenizers.Tokenizer(models.BPE(vocab, [m for _, m in merges], unk_token=unk,
                                        byte_fallback=spec.byte_fallback, fuse_unk=True))
  tok.normalizer = normalizers.Replace(" ", _SPACE)
  # sentencepiece decodes <unk> as its unk_surface (" \u2047 " by default), not the piece name.
  tok.decoder = decoders.Sequence([decoders.Replace(unk, spec.unk_surface),
                                   decoders.Replace(_SPACE, " "), decoders.ByteFallback(),
                                   decoders.Fuse()])
  user = [p.piece for p in proto.pieces if p.type == pb.ModelProto.SentencePiece.USER_DEFINED]
  # User-defined pieces (e.g. <|im_start|>) match atomically in sentencepiece, like added tokens.
  tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                          for t in user])
  return tok


def to_hf(tok: tokenizer_lib.Tokenizer):
  """A `tokenizers.Tokenizer` that encodes like `tok` and adds BOS as a post-processor."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import processors  # pylint: disable=g-import-not-at-top
  backend = tok.backend
  if hasattr(backend, "sp"):
    out = _from_sentencepiece(backend.sp)
  else:
    out = tokenizers.Tokenizer.from_str(backend.tok.to_str())
  if tok.bos_id is not None:
    bos = out.id_to_token(tok.bos_id)
    out.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.bos_id)])
  return out


def save(tok: tokenizer_lib.Tokenizer, directory) -> list[str]:
  """Writes tokenizer.json and tokenizer_config.json (and tokenizer.model if sentencepiece).

  Returns the paths written. `tokenizer.load(directory)` reads tokenizer.json back.
  """
  directory = os.fspath(directory)
  os.makedirs(directory, exist_ok=True)
  written = []
  if hasattr(tok.backend, "sp"):
    written.append(tokenizer_lib.save(tok, directory))  # the original, for sentencepiece users
  hf_tok = to_hf(tok)
  path = os.path.join(directory, "tokenizer.json")
  hf_tok.save(path)
  name = lambda i: None if i is None else hf_tok.id_to_token(i)
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": name(tok.bos_id),
            "eos_token": name(tok.eos_id), "pad_token": name(tok.pad_id),
            "add_bos_token": tok.bos_id is not None, "add_eos_token": False,
            "clean_up_tokenization_spaces": False, "chat_template": tok.chat_template}
  config_path = os.path.join(directory, "tokenizer_config.json")
  with open(config_path, "w") as f:
    json.dump(config, f, indent=2)
  return written + [path, config_path]


def save_generation_config(tok: tokenizer_lib.Tokenizer, directory) -> str:
  """Writes generation_config.json, so transformers' `generate` stops where our rollouts stop.

  Our sampler stops at any end-of-turn id or EOS (`agent_loop`); without this file transformers
  knows no EOS for a config.json written by `hf.save` and generates past it. Returns the path.
  """
  stop = sorted(set(tok.end_of_turn_ids) | ({tok.eos_id} if tok.eos_id is not None else set()))
  config = {"bos_token_id": tok.bos_id, "eos_token_id": stop, "pad_token_id": tok.pad_id}
  directory = os.fspath(directory)
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, "generation_config.json")
  with open(path, "w") as f:
    json.dump(config, f, indent=2)
  return path
