"""Each CUDA module declares the archs its kernels run on (issue 30): it is built only
for those, refused for an arch list it supports none of, and precompile skips it there
with a note; the wgmma sources refuse another device target at compile time too, so
no build of them that does nothing can exist."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from mllm_kernel.jit_utils import KernelBuildError, build, precompile
from mllm_kernel.jit_utils.cuda_arch import (
    AMPERE_OR_NEWER,
    EVERY_ARCH,
    HOPPER_ONLY,
    CudaArch,
    UnsupportedArchError,
    cuda_arch_override,
    parse_arch_list,
)
from mllm_kernel.jit_utils.status import BuildOutcome

# The package binds the op functions over their modules' names: import the modules.
gemm_module, gemm_sm80, gptq_marlin, int8_scaled_mm = (
    importlib.import_module(f"mllm_kernel.cuda.jit.{name}")
    for name in ("gemm", "gemm_sm80", "gptq_marlin", "int8_scaled_mm")
)
HOPPER_MODULES = [gemm_module._GEMM, int8_scaled_mm._INT8_GEMM, gptq_marlin._FUSED]
SM80_MODULES = [gemm_sm80._GEMM_SM80, gemm_sm80._INT8_SM80]
AMPERE_MODULES = [gptq_marlin._STREAM, gptq_marlin._DEQUANTIZE, *SM80_MODULES]


@pytest.mark.parametrize(
    ("support", "arch", "expected"),
    [
        (HOPPER_ONLY, "9.0a", True),
        (HOPPER_ONLY, "9.0", False),
        (HOPPER_ONLY, "10.0a", False),
        (HOPPER_ONLY, "8.0", False),
        (AMPERE_OR_NEWER, "7.5", False),
        (AMPERE_OR_NEWER, "8.0", True),
        (AMPERE_OR_NEWER, "8.7", True),
        (AMPERE_OR_NEWER, "9.0a", True),
        (EVERY_ARCH, "7.5", True),
    ],
)
def test_supports(support, arch, expected):
    assert support.supports(parse_arch_list(arch)[0]) is expected


@pytest.mark.parametrize("module", HOPPER_MODULES, ids=lambda m: m.name)
def test_a_hopper_module_is_refused_for_sm90_without_the_a(module):
    with cuda_arch_override("9.0"), pytest.raises(UnsupportedArchError) as info:
        module.spec(*module.variants[0])
    message = str(info.value)
    assert f"{module.name} cannot be built for sm_90: it runs on sm_90a only" in message
    assert "MLLM_KERNEL_CUDA_ARCH_LIST=9.0a" in message
    assert isinstance(info.value, NotImplementedError)


@pytest.mark.parametrize("module", HOPPER_MODULES + AMPERE_MODULES, ids=lambda m: m.name)
def test_a_mixed_arch_list_builds_only_the_supported_archs(module):
    with cuda_arch_override("7.5;8.0;9.0;9.0a"):
        spec = module.spec(*module.variants[0])
    wanted = ["9.0a"] if module.archs is HOPPER_ONLY else ["8.0", "9.0", "9.0a"]
    assert [str(arch) for arch in spec.cuda_archs] == wanted


@pytest.mark.parametrize("module", AMPERE_MODULES, ids=lambda m: m.name)
def test_an_ampere_module_is_refused_below_sm80(module):
    with cuda_arch_override("7.5"), pytest.raises(UnsupportedArchError, match="sm_80 and newer"):
        module.spec(*module.variants[0])


def test_precompile_skips_what_cannot_run_with_a_note(fresh_cache, monkeypatch):
    """sm_90 without the a: the wgmma kernels are skipped with a note; the ops' sm_80
    kernels (mma.sync) are what such a build runs, and are built."""
    built = []

    def run_job(job, *args):
        built.append(job.entry.name)
        return precompile.JobResult(job, BuildOutcome.BUILT, 0.0)

    monkeypatch.setattr(precompile, "run_job", run_job)
    monkeypatch.setattr(precompile, "cuda_unavailable_reason", lambda: None)
    report = precompile.precompile(device="cuda", arch="9.0", kernels=["gemm", "int8_scaled_mm"])
    assert set(built) == {"gemm_sm80", "int8_scaled_mm_sm80"}
    assert len(built) == len(SM80_MODULES[0].variants) + len(SM80_MODULES[1].variants)
    assert report.skipped == [
        "gemm: skipped for sm_90: it runs on sm_90a only",
        "int8_scaled_mm: skipped for sm_90: it runs on sm_90a only",
    ]


def test_precompile_notes_the_archs_a_kernel_leaves_out(monkeypatch):
    built = []

    def run_job(job, *args):
        built.append(job)
        return precompile.JobResult(job, BuildOutcome.BUILT, 0.0)

    monkeypatch.setattr(precompile, "run_job", run_job)
    monkeypatch.setattr(precompile, "cuda_unavailable_reason", lambda: None)
    report = precompile.precompile(device="cuda", arch="8.0;9.0a", kernels=["gemm"])
    assert "gemm: not built for sm_80: it runs on sm_90a only" in report.skipped
    assert len(built) == len(gemm_module._GEMM.variants) + len(SM80_MODULES[0].variants)


@pytest.mark.nvcc
@pytest.mark.parametrize("module", [gemm_module._GEMM, gptq_marlin._FUSED], ids=lambda m: m.name)
def test_the_wgmma_sources_do_not_compile_for_sm90(fresh_cache, tmp_path, module):
    """Even a build that bypasses the declaration (the module's spec with its archs
    replaced) cannot produce kernels with empty bodies: the source refuses the target."""
    with cuda_arch_override("9.0a"):
        spec = dataclasses.replace(module.spec(*module.variants[0]), cuda_archs=(CudaArch(9, 0),))
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(KernelBuildError, match="run on sm_90a only"):
        build.build(spec, staging, tmp_path / "build.log")
