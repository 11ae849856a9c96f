"""The CUDA softmax runs on every arch, as its module declares: the shared tier's copies
into shared memory are cp.async from sm_80 on and plain loads before (cp.async does not
exist there), so a build for sm_75 (T4) assembles. No GPU needed."""

from __future__ import annotations

import importlib

import pytest

from mllm_kernel.jit_utils.build import build
from mllm_kernel.jit_utils.cuda_arch import EVERY_ARCH, cuda_arch_override

softmax = importlib.import_module("mllm_kernel.cuda.jit.softmax")

# One nvcc build (~20 s on two cores): with the other compile-everything tests.
pytestmark = [pytest.mark.nvcc, pytest.mark.compile_grid]


def test_softmax_builds_for_sm75(tmp_path):
    assert softmax._SOFTMAX.archs is EVERY_ARCH
    with cuda_arch_override("7.5"):
        spec = softmax._SOFTMAX.spec()
    assert [str(arch) for arch in spec.cuda_archs] == ["7.5"]
    # Before the guard: ptxas "Feature 'cp.async' requires .target sm_80 or higher".
    result = build(spec, tmp_path, tmp_path / "build.log")
    assert result.artifact.is_file()
