#!/usr/bin/env bash
# One accelerator session's measurements, each step in its own process and time limit, so one
# failure costs only its own table:
#
#   bash scripts/device_suite.sh [out_dir]           # on a GPU machine: python3 holds jax (with
#                                                    # its CUDA plugin), torch and transformers
#   SMOKE=1 bash scripts/device_suite.sh /tmp/suite  # the same steps at toy sizes, any machine
#
# For SmolLM2-135M and Qwen2.5-0.5B with random weights, in bfloat16: the learner step
# (scripts/bench_train_step.py: tokens/s and MFU, agentrl vs PyTorch/transformers), sampling
# (scripts/bench_sampler.py: tokens/s and decode bandwidth, agentrl vs transformers
# `generate`; then agentrl's alone with `--decode_attention=pallas`, the Pallas decode-attention
# kernel of kernels/attention, to compare with the first table's agentrl tokens/s) and the
# per-token log-prob op (scripts/bench_logprob.py: the naive head, the XLA path, the Pallas
# kernel, PyTorch). Each table lands in <out_dir>/<step>.txt, the steps'
# stderr in <out_dir>/stderr.log.
set -u
out=${1:-${OUT:-/tmp/device_suite}}
mkdir -p "$out"
python=${PYTHON:-python3}
hf_python=${HF_PYTHON-$python}
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$(pwd)
# The measured jax process and its torch worker share the GPU: jax takes at most 45% of it.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.45}

if [[ -n "${SMOKE:-}" ]]; then
  models=(tiny)
  train_args=(--batch=2 --seq=32 --rounds=2 --matmul_size=128)
  sample_args=(--batch_sizes=2 --new_tokens=8 --prompt_tokens=8)
  logprob_args=(--shapes=64x32x256 --impls=reference,xla --repeats=1)
  limit=300
else
  models=(smollm2-135m qwen2.5-0.5b)
  train_args=(--batch=8 --seq=1024 --rounds=5 --matmul_size=8192)
  sample_args=(--batch_sizes=16,128 --new_tokens=256 --prompt_tokens=128)
  logprob_args=(--shapes=4096x576x49152,4096x896x151936 --impls=reference,xla,pallas,torch
                --repeats=3 --inner=5 --torch_python="$hf_python")
  limit=120
fi

step() {  # step <name> <command...>: runs it under the time limit, its output in <name>.txt
  local name=$1
  shift
  echo "=== $name: $*"
  local start=$SECONDS
  timeout "$limit" "$@" >"$out/$name.txt" 2>"$out/$name.err"
  local rc=$?
  grep -v '^{' "$out/$name.txt" | tail -20
  [[ $rc == 0 ]] || grep -v '^[IW][0-9]' "$out/$name.err" | tail -8
  { echo "=== $name"; cat "$out/$name.err"; } >>"$out/stderr.log"
  rm "$out/$name.err"
  echo "=== $name: rc $rc, $((SECONDS - start)) s"
}

"$python" -c "import jax; print('jax', jax.__version__, jax.devices())"
for model in "${models[@]}"; do
  step "train_$model" "$python" scripts/bench_train_step.py --model="$model" --dtype=bfloat16 \
      "${train_args[@]}" --hf_python="$hf_python"
  step "sample_$model" "$python" scripts/bench_sampler.py --model="$model" --dtype=bfloat16 \
      "${sample_args[@]}" --hf_python="$hf_python"
  step "sample_pallas_$model" "$python" scripts/bench_sampler.py --model="$model" \
      --dtype=bfloat16 --decode_attention=pallas "${sample_args[@]}"
done
step logprob "$python" scripts/bench_logprob.py --dtype=bfloat16 --modes=fwd,fwd+bwd \
    "${logprob_args[@]}"
