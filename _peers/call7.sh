#!/bin/bash
# Session 29's second device call (chain within 30 s of call6): ours against the original
# mllm-kernel's Marlin (its fp16 build made here: MLLM_ORIGINAL_PREBUILT), M = 1, 16, 64.
R=$PWD
[ -d /tmp/site/tvm_ffi ] || pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl $(compgen -G "_peers/pbwheel/*.whl")
export PYTHONPATH=/tmp/site:$R MLLM_KERNEL_CACHE_DIR=/tmp/c1 MLLM_KERNEL_TEST_KEEP_CACHE=1 PYTHONUNBUFFERED=1
left() { local t=$(( ${1} - SECONDS )); [ $t -lt 5 ] && t=5; echo $t; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
MLLM_ORIGINAL_PREBUILT=_peers/original-sm90 timeout $(left 580) python benchmarks/bench_quant_gemm.py --m 1,16,64 --original _peers/mllm-kernel > $OUT/quant.txt 2>&1; tail -40 $OUT/quant.txt
echo "ended at $SECONDS s"
