"""agentrl: JAX-native RL post-training of language-model policies and agents."""
import setuptools

# Both supported stacks are pinned with environment markers: NNX sharding metadata and JAX
# mesh defaults change between releases.
INSTALL_REQUIRES = [
    "jax==0.10.2; python_version < '3.12'",
    "flax==0.12.8; python_version < '3.12'",
    "jax>=0.12,<0.13; python_version >= '3.12'",
    "flax==0.12.12; python_version >= '3.12'",
    "optax==0.2.8",
    "chex==0.1.92",
    "orbax-checkpoint",
    "ml_collections",
    "absl-py",
    "numpy",
    "scipy",           # Kuhn-Munkres matching (agentrl.credit.matchtir); also a jax dependency
    "matplotlib",      # learning curves and study plots (PNG, Agg backend)
    "tensorboardX",    # TensorBoard event files without TensorFlow
]

HF = ["safetensors", "gguf", "tokenizers", "sentencepiece", "jinja2"]
# textworld[pddl] + alfworld: ALFWorld-style household problems, generated locally (the
# fast-downward planner builds from source, ~1-2 min on 2 cores).
# rank-bm25 (pure Python + numpy) indexes envs.search's corpus; bm25s would import jax and run
# an op at import time, which env worker processes must not do.
ENVS = ["reasoning-gym", "math-verify", "textworld[pddl]", "alfworld", "tensorflow-datasets",
        "importlib_resources", "rank-bm25"]
# The OpenAI-compatible server (agentrl.serve): Starlette on uvicorn, which parses HTTP with
# httptools when it is installed (its pure-Python h11 otherwise). openai is the client the
# example agents and the tests use.
SERVE = ["starlette", "uvicorn", "httptools", "openai"]
# playwright drives the system Chromium in the viewer's browser test (no browser download).
TEST = ["pytest", "pytest-xdist", "playwright", "httpx"] + HF + ENVS + SERVE
# libtpu for scripts/plan_pod.py: compiles for TPU topologies with no TPU attached. Not in TEST:
# with it installed every JAX process first tries (and fails) to start a TPU runtime.
TPU_PLAN = ["jax[tpu]==0.10.2; python_version < '3.12'",
            "jax[tpu]>=0.12,<0.13; python_version >= '3.12'"]
# The CUDA PJRT plugin for scripts/plan_pod.py's GPU targets (8xh100, ...), without its
# `with-cuda` extra: compiling for a GPU needs none of NVIDIA's libraries (GBs), running on one
# does (jax[cuda12]). Not in TEST: installed without them, it logs a failed start in every JAX
# process that does not set JAX_PLATFORMS=cpu.
GPU_PLAN = ["jax-cuda12-plugin==0.10.2; python_version < '3.12'",
            "jax-cuda12-plugin>=0.12,<0.13; python_version >= '3.12'"]

setuptools.setup(
    name="agentrl",
    version="0.1.0",
    description="JAX-native RL post-training for language-model policies and agents.",
    packages=setuptools.find_packages(include=["agentrl", "agentrl.*", "kernels", "kernels.*",
                                               "experiments", "experiments.*"]),
    python_requires=">=3.11",
    install_requires=INSTALL_REQUIRES,
    extras_require={"hf": HF, "envs": ENVS, "test": TEST, "serve": SERVE, "tpu-plan": TPU_PLAN,
                    "gpu-plan": GPU_PLAN, "wandb": ["wandb"], "tensorboard": ["tensorboard"]},
)
