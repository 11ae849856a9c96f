#!/usr/bin/env bash
# GPU check, for a machine with an NVIDIA GPU (the lent H100/H200 or your own):
# installs what the image lacks from wheels in .whl/ (fetch them first, on a
# machine with a network, with scripts/device_wheels.sh), runs the cuda-marked
# tests and the benchmarks, and writes a results table.
#
#   bash scripts/gpu_check.sh [OUT_DIR]        # default: gpu_results/
#   GPU_CHECK_TESTS=0 / GPU_CHECK_BENCH=0      # skip a part
#   GPU_CHECK_PRECOMPILE=0                     # skip building every kernel up front (a run
#                                                of a few benchmarks builds what they call)
#   A cache wheel in .whl/ (built here without a GPU: `python -m mllm_kernel precompile
#   --device cuda --arch 9.0a --output DIR --wheel .whl`) is installed with the rest, and
#   the precompile step builds only what it does not serve (sources changed since).
#   GPU_CHECK_PYTEST_ARGS="-k rmsnorm"         # narrow the tests
#   GPU_CHECK_MARKERS="cuda or nvcc"           # which markers to run (default: cuda)
#   GPU_CHECK_BENCHES="bench_gemm bench_runtime"  # which benchmarks (default: all)
#   GPU_CHECK_SM80=1                           # also the gemm and int8_scaled_mm grids again
#                                                through their sm_80 kernels alone, as compute_80
#                                                PTX (MLLM_KERNEL_CUDA_ARCH_LIST=8.0+PTX)
#   GPU_CHECK_BENCH_ARGS="--m 1,16"            # extra arguments, passed to every benchmark
#                                                (so pick ones that all accept: here, with
#                                                GPU_CHECK_BENCHES=bench_quant_gemm)
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-$repo/gpu_results}" && cd "${1:-$repo/gpu_results}" && pwd)
cd "$repo"
export PYTHONUNBUFFERED=1

# Installed once per machine: reinstalling rewrites tvm-ffi's headers, whose new
# timestamps would make every cached kernel build again.
if [ ! -d /tmp/site/tvm_ffi ] && compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl $(compgen -G ".fla/*.whl") || exit 1
fi
[ -d /tmp/site ] && export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
export PYTHONPATH="$repo:${PYTHONPATH:-}"
export MLLM_KERNEL_CACHE_DIR="${MLLM_KERNEL_CACHE_DIR:-/tmp/mllm_kernel_cache}"
# Tests and benchmarks share one cache, filled up front by a parallel precompile.
export MLLM_KERNEL_TEST_KEEP_CACHE=1

# The device machine gets the working tree without .git: the caller passes GIT_COMMIT.
export GIT_COMMIT="${GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
{
  echo "# GPU check: $(date -u +%Y-%m-%dT%H:%MZ), commit $GIT_COMMIT"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/- GPU: /'
  python3 -c 'import torch, tvm_ffi; print(f"- torch {torch.__version__}, tvm_ffi {tvm_ffi.__version__}, GPUs {torch.cuda.device_count()}")'
} | tee "$out/summary.md"

status=0
# The CLI's GPU parts: GPUs, driver and arch as the tools see them.
python3 -m mllm_kernel show-env > "$out/show-env.txt" 2>&1 || status=1
python3 -m mllm_kernel show-clangd-recommend-config --output "$out/clangd.yaml" > /dev/null 2>&1 || status=1
if [ "${GPU_CHECK_PRECOMPILE:-1}" = 1 ]; then
  python3 -m mllm_kernel precompile --device cuda -j "$(nproc)" 2>&1 | tail -n 3 | tee -a "$out/summary.md"
fi
python3 -m mllm_kernel show-config > "$out/show-config.txt" 2>&1 || status=1
if [ "${GPU_CHECK_TESTS:-1}" = 1 ]; then
  # shellcheck disable=SC2086
  # Serially (-o addopts= drops pyproject's -n auto): the GPU tests share one GPU, and
  # the image has no pytest-xdist.
  timeout "${GPU_CHECK_TEST_TIMEOUT:-480}" python3 -m pytest tests -q -m "${GPU_CHECK_MARKERS:-cuda}" \
    -o addopts= -p no:cacheprovider -rs ${GPU_CHECK_PYTEST_ARGS:-} 2>&1 | tee "$out/pytest.txt"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || status=$rc
  echo "- tests (${GPU_CHECK_MARKERS:-cuda}): $(tail -n 1 "$out/pytest.txt")" >> "$out/summary.md"
fi
if [ "${GPU_CHECK_SM80:-0}" = 1 ]; then
  # The GEMM tests' sm80 cases (the gemm_path fixture's, and the sm_80 tiles') switch the
  # arch list to 8.0+PTX themselves: the driver JIT-compiles the Ampere kernels here.
  MLLM_KERNEL_CUDA_ARCH_LIST=8.0+PTX python3 -m mllm_kernel precompile --device cuda \
    -j "$(nproc)" --kernel gemm_sm80 --kernel int8_scaled_mm_sm80 2>&1 | tail -n 1
  timeout "${GPU_CHECK_TEST_TIMEOUT:-480}" python3 -m pytest tests/test_cuda_gemm.py \
    tests/test_cuda_int8_gemm.py -q -m cuda -k sm80 -o addopts= -p no:cacheprovider -rs \
    2>&1 | tee "$out/pytest_sm80.txt"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || status=$rc
  echo "- sm_80 path (compute_80 PTX): $(tail -n 1 "$out/pytest_sm80.txt")" >> "$out/summary.md"
fi
if [ "${GPU_CHECK_BENCH:-1}" = 1 ]; then
  for name in ${GPU_CHECK_BENCHES:-bench_cuda bench_backward bench_jit bench_gemm bench_quant_gemm bench_runtime bench_decoder_layer}; do
    bench="benchmarks/$name.py"
    [ -f "$bench" ] || continue
    extra=()  # the decoder layer also draws its figure (benchmarks/decoder_layer.svg's kind)
    [ "$name" = bench_decoder_layer ] && extra=(--figure "$out/decoder_layer.svg")
    # shellcheck disable=SC2086
    python3 "$bench" ${GPU_CHECK_BENCH_ARGS:-} ${extra[@]+"${extra[@]}"} --out "$out/$name.md" 2>&1 \
      | tee "$out/$name.log"
    rc=${PIPESTATUS[0]}
    [ "$rc" = 0 ] || status=$rc
    echo "- $name: exit $rc, table in $name.md" >> "$out/summary.md"
  done
fi
cat "$out/summary.md"
exit "$status"
