#!/bin/bash
# Run on branch s29 (main + wip/deep-16-32). First device call: wip/deep-16-32's GPU tests and timings (cherry-picked on
# branch s29), the cluster scheduling policy probe, host cost per eager GEMM call, the
# decoder layer.
R=$PWD
[ -d /tmp/site/tvm_ffi ] || pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl $(compgen -G "_peers/pbwheel/*.whl")
export PYTHONPATH=/tmp/site:$R MLLM_KERNEL_CACHE_DIR=/tmp/c1 MLLM_KERNEL_TEST_KEEP_CACHE=1 PYTHONUNBUFFERED=1
left() { local t=$(( ${1} - SECONDS )); [ $t -lt 5 ] && t=5; echo $t; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
nvcc -arch=sm_90a -std=c++17 -o /tmp/placement _peers/placement.cu && timeout 30 /tmp/placement > $OUT/placement.txt 2>&1; cat $OUT/placement.txt
python -m mllm_kernel precompile --device cuda -j 16 --kernel gemm --kernel int8_scaled_mm --kernel softmax --kernel rmsnorm --kernel gemm_sm80 > $OUT/pre.txt 2>&1; tail -1 $OUT/pre.txt
T="-o addopts= -p no:cacheprovider -p no:logging --tb=short -q"
timeout $(left 110) python -m pytest $T -m cuda tests/test_cuda_gemm.py tests/test_cuda_int8_gemm.py tests/test_cuda_softmax.py tests/test_cuda_backward.py -k "deep or every_tile or choice or tiny_temperature or bad_inputs or backward_empty" > $OUT/tests.txt 2>&1; tail -4 $OUT/tests.txt
U=include/mllm_kernel/utils.cuh; cp $U /tmp/utils.orig && cp _peers/utils_policy.cuh $U
MLLM_KERNEL_CACHE_DIR=/tmp/c2 timeout $(left 280) python _peers/policy_probe.py 1,16 > $OUT/policy.txt 2>&1; grep "M=" $OUT/policy.txt; grep -v "^M=" $OUT/policy.txt | tail -3
cp /tmp/utils.orig $U
timeout $(left 390) python benchmarks/bench_gemm_stages.py --m 1,16 --jobs 16 > $OUT/stages.txt 2>&1; grep "^- " $OUT/stages.txt | cut -c1-330
timeout $(left 430) python _peers/host_prof.py > $OUT/prof.txt 2>&1; grep "==" $OUT/prof.txt
timeout $(left 560) python benchmarks/bench_decoder_layer.py --batch 1,16,64 --figure $OUT/decoder_layer.svg > $OUT/layer.txt 2>&1; tail -14 $OUT/layer.txt
echo "ended at $SECONDS s"
