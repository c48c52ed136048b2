"""Named model sizes for `transformer.Config.named`, and their published parameter totals.

Each preset is the architecture of a released checkpoint (from its config.json), so
`hf.load` of that checkpoint produces the same Config. `tiny` is for tests and CPU smoke runs.

`PUBLISHED_PARAMS` holds the total parameter count each release reports (safetensors
metadata / model card), counting a tied embedding once. Notes on the few that need one:
  qwen3-1.7b: the release's 2,031,739,904 stores the tied lm_head a second time; the tied
    model has 2,031,739,904 - 151,936 * 2048 = 1,720,574,976.
  gemma-3-4b: the release (4.30B) includes the 0.42B SigLIP vision tower; the text decoder
    alone (Gemma3ForCausalLM, 7.76 GB in bf16) has 3,880,263,168.
"""

# The Config fields that tell presets apart besides the family (which every Config has).
ARCHITECTURE = ("width", "depth", "heads", "kv_heads", "head_dim", "mlp")

_SMOLLM2 = dict(family="llama", vocab=49152, head_dim=64, norm_eps=1e-5, max_len=8192)
_QWEN25 = dict(family="qwen2", vocab=151936, head_dim=128, qkv_bias=True, rope_theta=1e6,
               norm_eps=1e-6, max_len=32768)
_QWEN3 = dict(family="qwen3", vocab=151936, head_dim=128, qk_norm=True, rope_theta=1e6,
              norm_eps=1e-6, max_len=40960)
_LLAMA3 = dict(family="llama", vocab=128256, rope_theta=500000.0, rope_scaling="llama3",
               rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
               rope_original_max_len=8192, norm_eps=1e-5, max_len=131072)
_GEMMA = dict(family="gemma", vocab=256000, head_dim=256, act="gelu_tanh", norm_plus_one=True,
              embed_scale=True, norm_eps=1e-6, max_len=8192)
_GEMMA2 = dict(_GEMMA, family="gemma2", post_norms=True, attn_logit_softcap=50.0,
               final_logit_softcap=30.0, query_pre_attn_scalar=256.0, sliding_window=4096,
               sliding_window_pattern=2)
_GEMMA3 = dict(_GEMMA, family="gemma3", vocab=262144, post_norms=True, qk_norm=True,
               rope_theta=1e6, rope_local_theta=10000.0, query_pre_attn_scalar=256.0,
               sliding_window=512, sliding_window_pattern=6, max_len=32768)

PRESETS = {
    # Compiles in about a second on CPU; used by unit tests and smoke runs.
    "tiny": dict(vocab=512, width=64, depth=2, heads=4, kv_heads=2, head_dim=16, mlp=128,
                 max_len=1024, param_dtype="float32", dtype="float32"),
    "smollm2-135m": dict(_SMOLLM2, width=576, depth=30, heads=9, kv_heads=3, mlp=1536,
                         rope_theta=100000.0),
    "smollm2-360m": dict(_SMOLLM2, width=960, depth=32, heads=15, kv_heads=5, mlp=2560,
                         rope_theta=100000.0),
    "smollm2-1.7b": dict(_SMOLLM2, width=2048, depth=24, heads=32, kv_heads=32, mlp=8192,
                         rope_theta=130000.0),
    "qwen2.5-0.5b": dict(_QWEN25, width=896, depth=24, heads=14, kv_heads=2, head_dim=64,
                         mlp=4864),
    "qwen2.5-1.5b": dict(_QWEN25, width=1536, depth=28, heads=12, kv_heads=2, mlp=8960),
    "qwen2.5-7b": dict(_QWEN25, vocab=152064, width=3584, depth=28, heads=28, kv_heads=4,
                       mlp=18944, tie_embeddings=False),
    "qwen3-0.6b": dict(_QWEN3, width=1024, depth=28, heads=16, kv_heads=8, mlp=3072),
    "qwen3-1.7b": dict(_QWEN3, width=2048, depth=28, heads=16, kv_heads=8, mlp=6144),
    "qwen3-4b": dict(_QWEN3, width=2560, depth=36, heads=32, kv_heads=8, mlp=9728),
    "qwen3-8b": dict(_QWEN3, width=4096, depth=36, heads=32, kv_heads=8, mlp=12288,
                     tie_embeddings=False),
    "llama-3.2-1b": dict(_LLAMA3, width=2048, depth=16, heads=32, kv_heads=8, head_dim=64,
                         mlp=8192, rope_factor=32.0),
    "llama-3.2-3b": dict(_LLAMA3, width=3072, depth=28, heads=24, kv_heads=8, head_dim=128,
                         mlp=8192, rope_factor=32.0),
    "llama-3.1-8b": dict(_LLAMA3, width=4096, depth=32, heads=32, kv_heads=8, head_dim=128,
                         mlp=14336, rope_factor=8.0, tie_embeddings=False),
    "gemma-2b": dict(_GEMMA, width=2048, depth=18, heads=8, kv_heads=1, mlp=16384),
    "gemma-7b": dict(_GEMMA, width=3072, depth=28, heads=16, kv_heads=16, mlp=24576),
    "gemma-2-2b": dict(_GEMMA2, width=2304, depth=26, heads=8, kv_heads=4, mlp=9216),
    "gemma-2-9b": dict(_GEMMA2, width=3584, depth=42, heads=16, kv_heads=8, mlp=14336),
    "gemma-3-270m": dict(_GEMMA3, width=640, depth=18, heads=4, kv_heads=1, mlp=2048),
    "gemma-3-1b": dict(_GEMMA3, width=1152, depth=26, heads=4, kv_heads=1, mlp=6912),
    "gemma-3-4b": dict(_GEMMA3, vocab=262208, width=2560, depth=34, heads=8, kv_heads=4,
                       mlp=10240, sliding_window=1024, rope_scaling="linear", rope_factor=8.0,
                       max_len=131072),
}

PUBLISHED_PARAMS = {
    "smollm2-135m": 134_515_008,
    "smollm2-360m": 361_821_120,
    "smollm2-1.7b": 1_711_376_384,
    "qwen2.5-1.5b": 1_543_714_304,
    "qwen2.5-7b": 7_615_616_512,
    "qwen3-0.6b": 596_049_920,
    "qwen3-1.7b": 1_720_574_976,
    "qwen3-4b": 4_022_468_096,
    "qwen3-8b": 8_190_735_360,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "llama-3.1-8b": 8_030_261_248,
    "gemma-2b": 2_506_172_416,
    "gemma-7b": 8_537_680_896,
    "gemma-2-2b": 2_614_341_888,
    "gemma-2-9b": 9_241_705_984,
    "gemma-3-270m": 268_098_176,
    "gemma-3-1b": 999_885_952,
    "gemma-3-4b": 3_880_263_168,
}

# Model cards that only publish rounded totals (billions, total and non-embedding).
PUBLISHED_PARAMS_ROUNDED = {
    "qwen2.5-0.5b": (0.49, 0.36),
}
