"""Every registered CUDA kernel variant compiles and links for sm_90a, and every CUDA
module also for sm_80, which has no thread-block clusters (no GPU needed)."""

from __future__ import annotations

import time

import pytest

from mllm_kernel.jit_utils import cuda_arch_override, registry
from mllm_kernel.jit_utils.build import build

CUDA_VARIANTS = [
    pytest.param(entry, variant, id=f"{entry.name}-{'-'.join(map(str, variant)) or 'all'}")
    for entry in registry.kernels("cuda")
    for variant in entry.variants
]


@pytest.mark.nvcc
@pytest.mark.parametrize(("entry", "variant"), CUDA_VARIANTS)
def test_compiles_for_sm90a(entry, variant, tmp_path):
    with cuda_arch_override("9.0a"):
        spec = entry.plan(variant)
    assert [str(a) for a in spec.cuda_archs] == ["9.0a"]
    started = time.monotonic()
    result = build(spec, tmp_path, tmp_path / "build.log")
    print(f"{spec.describe()}: {time.monotonic() - started:.1f}s")
    assert result.artifact.is_file()


@pytest.mark.nvcc
@pytest.mark.parametrize(
    ("entry", "variant"),
    [pytest.param(e, e.variants[0], id=e.name) for e in registry.kernels("cuda")],
)
def test_compiles_for_sm80(entry, variant, tmp_path):
    with cuda_arch_override("8.0"):
        spec = entry.plan(variant)
    result = build(spec, tmp_path, tmp_path / "build.log")
    assert result.artifact.is_file()


def test_every_op_module_registers_a_variant():
    names = {entry.name for entry in registry.kernels("cuda")}
    assert {
        "norm",
        "activation",
        "rope",
        "softmax",
        "store_cache",
        "create_kv_indices",
        "add_constant",
        "add_constant_runtime",
    } <= names
