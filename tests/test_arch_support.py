"""Each CUDA module declares the archs its kernels run on (issues 30, 35): it is built
only for those, refused for an arch list it supports none of, and precompile skips it
there with one note per module and arch, saying what the op runs there instead; a GPU an
op does not run on is refused with NotImplementedError naming the op, the GPU's arch and
the archs it runs on; the wgmma sources refuse another device target at compile time
too, so no build of them that does nothing can exist."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from types import SimpleNamespace

import pytest

from mllm_kernel.__main__ import main
from mllm_kernel.cuda import device_facts
from mllm_kernel.jit_utils import KernelBuildError, build, kernel_module, precompile, registry
from mllm_kernel.jit_utils.cuda_arch import (
    AMPERE_OR_NEWER,
    EVERY_ARCH,
    HOPPER_ONLY,
    ArchSupport,
    CudaArch,
    OpArchs,
    UnsupportedArchError,
    arch_for_capability,
    cuda_arch_override,
    op_archs,
    parse_arch_list,
)
from mllm_kernel.jit_utils.errors import CudaArchError
from mllm_kernel.jit_utils.status import BuildOutcome

# The package binds the op functions over their modules' names: import the modules.
gdn_decode, gemm_module, gemm_sm80, gptq_marlin, int8_scaled_mm, rmsnorm = (
    importlib.import_module(f"mllm_kernel.cuda.jit.{name}")
    for name in ("gdn_decode", "gemm", "gemm_sm80", "gptq_marlin", "int8_scaled_mm", "rmsnorm")
)
# The template arguments after the dtype of gemm's first tile.
TILE_ARGS = gemm_module.TILES[0].shape_args
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


WGMMA = "it runs on sm_90a only (it uses wgmma and TMA)"


@pytest.fixture
def buildable(monkeypatch):
    """CUDA builds possible here whatever the machine has (nothing is built)."""
    monkeypatch.setattr(precompile, "cuda_unavailable_reason", lambda: None)


def test_precompile_skips_what_cannot_run_with_a_note(buildable, fresh_cache, monkeypatch):
    """sm_90 without the a: the wgmma kernels are skipped with a note; the ops' sm_80
    kernels (mma.sync) are what such a build runs, and are built."""
    built = []

    def run_job(job, *args):
        built.append(job.entry.name)
        return precompile.JobResult(job, BuildOutcome.BUILT, 0.0)

    monkeypatch.setattr(precompile, "run_job", run_job)
    report = precompile.precompile(device="cuda", arch="9.0", kernels=["gemm", "int8_scaled_mm"])
    assert set(built) == {"gemm_sm80", "int8_scaled_mm_sm80"}
    assert len(built) == len(SM80_MODULES[0].variants) + len(SM80_MODULES[1].variants)
    gemm_count, int8_count = (
        len(gemm_module._GEMM.variants),
        len(int8_scaled_mm._INT8_GEMM.variants),
    )
    assert report.skipped == []
    assert report.notes() == [
        f"skipped gemm ({gemm_count} variants) for 9.0: {WGMMA}; op gemm has gemm_sm80 for 9.0",
        f"skipped int8_scaled_mm ({int8_count} variants) for 9.0: {WGMMA}; op int8_scaled_mm "
        "has int8_scaled_mm_sm80 for 9.0",
    ]
    assert report.skipped_builds == gemm_count + int8_count


def test_each_variant_is_built_for_the_archs_its_module_runs_on(buildable):
    report = precompile.precompile(
        device="cuda", arch="8.0,8.7,8.9,9.0a", kernels=["gemm"], dry_run=True
    )
    assert report.results == []
    archs = {}
    for job in report.planned:
        archs.setdefault(job.entry.name, set()).add(job.arch)
    assert archs == {"gemm": {"9.0a"}, "gemm_sm80": {"8.0;8.7;8.9;9.0a"}}
    assert len(report.planned) == len(gemm_module._GEMM.variants) + len(SM80_MODULES[0].variants)
    # One note per module and arch, not one per variant.
    assert [(s.entry.name, str(s.arch), s.instead) for s in report.arch_skips] == [
        ("gemm", arch, ("gemm_sm80",)) for arch in ("8.0", "8.7", "8.9")
    ]
    assert report.skipped_builds == 3 * len(gemm_module._GEMM.variants)


def test_with_output_each_arch_is_its_own_entry_and_skip(buildable, tmp_path):
    report = precompile.precompile(
        device="cuda", arch="9.0a,8.0", kernels=["gemm"], output=tmp_path, dry_run=True
    )
    per_arch = sorted({(job.entry.name, job.arch) for job in report.planned})
    assert per_arch == [("gemm", "9.0a"), ("gemm_sm80", "8.0"), ("gemm_sm80", "9.0a")]
    assert [(s.entry.name, str(s.arch)) for s in report.arch_skips] == [("gemm", "8.0")]


def test_the_note_says_when_the_op_has_no_kernel_for_the_arch(buildable):
    report = precompile.precompile(device="cuda", arch="7.5", kernels=["gdn_decode"], dry_run=True)
    assert report.planned == []
    assert report.notes() == [
        "skipped gdn_decode (1 variant) for 7.5: it runs on sm_80 and newer (it uses "
        "cp.async); op gdn_decode has no kernel for 7.5"
    ]


def test_precompile_cli_counts_the_skips_in_its_summary(buildable, monkeypatch, capsys):
    def run_job(job, *args):
        return precompile.JobResult(job, BuildOutcome.BUILT, 0.0)

    monkeypatch.setattr(precompile, "run_job", run_job)
    gemm_count, sm80_count = len(gemm_module._GEMM.variants), len(SM80_MODULES[0].variants)
    assert main(["precompile", "--device", "cuda", "--arch", "8.0;9.0a", "--kernel", "gemm"]) == 0
    out = capsys.readouterr().out
    assert f"built  gemm<torch.bfloat16, {', '.join(map(str, TILE_ARGS))}> (cuda, 9.0a)" in out
    assert "gemm_sm80<" in out and "(cuda, 8.0;9.0a)" in out
    notes = [line for line in out.splitlines() if line.startswith("note: ")]
    assert notes == [
        f"note: skipped gemm ({gemm_count} variants) for 8.0: {WGMMA}; op gemm has gemm_sm80 "
        "for 8.0"
    ]
    assert out.splitlines()[-1].startswith(f"precompiled {gemm_count + sm80_count} variant(s)")
    assert out.splitlines()[-1].endswith(
        f"{gemm_count + sm80_count} built, 0 already cached, 0 failed, {gemm_count} skipped "
        "(archs their kernels do not run on: notes above)"
    )


def test_precompile_dry_run_builds_nothing(buildable, monkeypatch, capsys):
    def run_job(job, *args):
        raise AssertionError(f"{job.describe()} was built in a dry run")

    monkeypatch.setattr(precompile, "run_job", run_job)
    args = ["precompile", "--device", "cuda", "--arch", "8.9", "--kernel", "int8_scaled_mm"]
    assert main([*args, "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    sm80 = len(SM80_MODULES[1].variants)
    assert lines[:sm80] == [
        f"would build int8_scaled_mm_sm80<{', '.join(map(str, v))}> (cuda, 8.9)"
        for v in SM80_MODULES[1].variants
    ]
    skipped = len(int8_scaled_mm._INT8_GEMM.variants)
    assert lines[sm80:] == [
        f"note: skipped int8_scaled_mm ({skipped} variants) for 8.9: {WGMMA}; op "
        "int8_scaled_mm has int8_scaled_mm_sm80 for 8.9",
        f"would build {sm80} variant(s), {skipped} skipped (archs their kernels do not run "
        "on: notes above)",
    ]


@pytest.mark.nvcc
def test_an_arch_nvcc_does_not_compile_for_is_refused_once(capsys):
    """sm_30 (no CUDA 11-13 nvcc targets it): one error before any build, not a compiler
    failure per variant; with --device all, one note and the CPU kernels still build."""
    with pytest.raises(CudaArchError, match=r"sm_30 is not one nvcc compiles for"):
        precompile.precompile(device="cuda", arch="3.0", kernels=["rmsnorm"], dry_run=True)
    report = precompile.precompile(device="all", arch="3.0", kernels=["rmsnorm"], dry_run=True)
    assert [job.entry.device for job in report.planned] == ["cpu"]
    (note,) = report.notes()
    assert note.startswith("CUDA kernels skipped: CUDA arch sm_30 is not one nvcc compiles for")
    assert main(["precompile", "--device", "cuda", "--arch", "3.0", "--kernel", "rmsnorm"]) == 1
    assert "sm_30 is not one nvcc compiles for" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("modules", "expected"),
    [
        ([HOPPER_ONLY], "sm_90a only"),
        ([HOPPER_ONLY, AMPERE_OR_NEWER], "sm_80 and newer"),
        ([AMPERE_OR_NEWER, EVERY_ARCH], "every arch"),
        ([HOPPER_ONLY, ArchSupport(minimum=(10, 0))], "sm_90a, sm_100 and newer"),
        ([ArchSupport(arch_specific=(10, 0)), HOPPER_ONLY], "sm_90a, sm_100a only"),
    ],
)
def test_an_op_runs_where_one_of_its_modules_does(modules, expected):
    op = OpArchs("op", tuple((f"m{i}", support) for i, support in enumerate(modules)))
    assert op.describe() == expected


def test_the_ops_archs_are_read_from_the_module_declarations():
    ops = {op.op: op for op in op_archs(registry.kernels("cuda"))}
    modules = {op: dict(o.modules) for op, o in ops.items()}
    assert modules["gemm"] == {"gemm": HOPPER_ONLY, "gemm_sm80": AMPERE_OR_NEWER}
    assert modules["int8_scaled_mm"] == {
        "int8_scaled_mm": HOPPER_ONLY,
        "int8_scaled_mm_sm80": AMPERE_OR_NEWER,
    }
    assert modules["gptq_marlin_gemm"] == {
        "gptq_marlin_dequantize": AMPERE_OR_NEWER,
        "gptq_marlin_gemm": AMPERE_OR_NEWER,
        "gptq_marlin_gemm_wgmma": HOPPER_ONLY,
    }
    # Every CUDA module is in the table once, with the archs it was declared with.
    entries = registry.kernels("cuda")
    assert sorted(n for o in ops.values() for n, _ in o.modules) == sorted(e.name for e in entries)
    for entry in entries:
        assert modules[entry.op or entry.name][entry.name] is entry.archs
    assert ops["gemm"].modules_for(CudaArch(8, 9)) == ("gemm_sm80",)
    assert ops["gemm"].modules_for(CudaArch(9, 0, "a")) == ("gemm", "gemm_sm80")


# --- a call on a GPU the op does not run on ------------------------------------------

T4 = SimpleNamespace(name="Tesla T4", major=7, minor=5, multi_processor_count=40)
A100 = SimpleNamespace(name="NVIDIA A100", major=8, minor=0, multi_processor_count=108)
B200 = SimpleNamespace(name="NVIDIA B200", major=10, minor=0, multi_processor_count=148)


def _fake_gpu(monkeypatch, props):
    """GPU 0 is ``props`` (compute capability ``major.minor``); no arch list is set, so
    builds target that GPU's arch as they do on a machine with it."""
    import torch

    for name in ("MLLM_KERNEL_CUDA_ARCH_LIST", "TORCH_CUDA_ARCH_LIST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(device_facts, "_facts", {})
    monkeypatch.setattr(device_facts, "_matmul_paths", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(
        torch.cuda, "get_device_capability", lambda index=None: (props.major, props.minor)
    )


@pytest.mark.parametrize(
    ("op", "plan"), [("gemm", gemm_module._plan), ("int8_scaled_mm", int8_scaled_mm._plan)]
)
def test_the_gemms_refuse_a_gpu_before_sm80(monkeypatch, op, plan):
    _fake_gpu(monkeypatch, T4)
    with pytest.raises(NotImplementedError) as info:
        plan(16, 4096, 4096, 0)
    message = str(info.value)
    assert message.startswith(f"{op} runs on sm_80 and newer")
    assert "the wgmma kernels on sm_90a only" in message
    assert message.endswith("cuda:0 (Tesla T4) is sm_75 (compute capability 7.5)")


def test_gptq_marlin_gemm_refuses_a_gpu_before_sm80(monkeypatch):
    _fake_gpu(monkeypatch, T4)
    monkeypatch.setattr(gptq_marlin, "_devices", {})
    with pytest.raises(NotImplementedError) as info:
        gptq_marlin._device_facts(0)
    assert str(info.value) == (
        "gptq_marlin_gemm runs on sm_80 and newer (it uses mma.sync, ldmatrix and cp.async); "
        "cuda:0 (Tesla T4) is sm_75 (compute capability 7.5)"
    )
    assert gptq_marlin._devices == {}


def test_gptq_marlin_gemm_reads_the_gpus_it_runs_on_from_its_module(monkeypatch):
    """The streaming module's declaration is the one place: changed, the refusal follows."""
    _fake_gpu(monkeypatch, A100)
    monkeypatch.setattr(gptq_marlin, "_devices", {})
    monkeypatch.setattr(gptq_marlin._STREAM, "archs", ArchSupport(minimum=(9, 0), uses="X"))
    with pytest.raises(NotImplementedError) as info:
        gptq_marlin._device_facts(0)
    assert str(info.value) == (
        "gptq_marlin_gemm runs on sm_90 and newer (it uses X); cuda:0 (NVIDIA A100) is sm_80 "
        "(compute capability 8.0)"
    )


def test_gdn_decode_refuses_a_gpu_before_sm80(monkeypatch):
    """The op's lookup of its module (a memo miss) is refused before anything compiles,
    and nothing is remembered for that GPU. It needs sm_80 for cp.async alone."""
    _fake_gpu(monkeypatch, T4)
    memo = gdn_decode._GDN_DECODE
    monkeypatch.delitem(memo, 0, raising=False)
    with pytest.raises(NotImplementedError) as info:
        memo[0]
    assert str(info.value) == (
        "gdn_decode runs on sm_80 and newer (it uses cp.async); cuda:0 (Tesla T4) is sm_75 "
        "(compute capability 7.5)"
    )
    assert 0 not in memo


@contextlib.contextmanager
def _absent(memo, key):
    """``memo`` without ``key`` inside the block; as it was again after it."""
    saved = memo.pop(key, None)
    try:
        yield
    finally:
        memo.pop(key, None)
        if saved is not None:
            memo[key] = saved


@pytest.fixture
def loads(monkeypatch):
    """The specs the loader is asked to load (it loads a stand-in module, builds nothing)."""
    asked = []

    def load_spec(spec):
        asked.append(spec)
        return SimpleNamespace(get_function=lambda name: f"{spec.name}.{name}")

    monkeypatch.setattr(kernel_module.loader, "load_spec", load_spec)
    return asked


SM80_USES = "runs on sm_80 and newer (it uses mma.sync, ldmatrix and cp.async)"


@pytest.mark.parametrize(
    ("gpu", "arch_list", "module", "refused"),
    [
        # sm_80 modules on a T4 whose list also names 8.0: built for sm_80 alone, they
        # would load and then fail at launch with "no kernel image".
        (T4, "7.5;8.0", gptq_marlin._DEQUANTIZE, "gptq_marlin_gemm (module gptq_marlin_"
         f"dequantize) {SM80_USES}"),
        (T4, "7.5;8.0", gemm_sm80._GEMM_SM80, f"gemm (module gemm_sm80) {SM80_USES}"),
        (T4, "7.5;8.0", gdn_decode._GDN_DECODE, "gdn_decode runs on sm_80 and newer (it uses "
         "cp.async)"),
        # sm_90a code does not run on an sm_100 GPU.
        (B200, "9.0a;10.0a", gemm_module._GEMM, "gemm runs on sm_90a only (it uses "
         "wgmma and TMA)"),
        (A100, "7.5;8.0", gptq_marlin._DEQUANTIZE, None),
        (T4, "7.5;8.0", rmsnorm._RMSNORM, None),
    ],
    ids=lambda v: getattr(v, "name", None),
)  # fmt: skip
def test_a_module_is_refused_for_a_gpu_it_does_not_run_on_whatever_the_arch_list(
    monkeypatch, loads, gpu, arch_list, module, refused
):
    """The arch list alone does not decide: the GPU the tensor is on must be one the
    module's kernels run on, else NotImplementedError naming the op (and the module), the
    GPU and the archs, before anything is built and with nothing remembered."""
    _fake_gpu(monkeypatch, gpu)
    monkeypatch.setenv("MLLM_KERNEL_CUDA_ARCH_LIST", arch_list)
    key = (0, *module.variants[0]) if module.variants[0] else 0
    # The archs of the list the module runs on: what its spec alone would build for.
    wanted = tuple(a for a in parse_arch_list(arch_list) if module.archs.supports(a))
    assert wanted and module.spec(*module.variants[0], device_index=0).cuda_archs == wanted
    with _absent(module, key):
        if refused is None:
            assert module[key].module.get_function("f") == f"{module.name}.f"
            assert [spec.cuda_archs for spec in loads] == [wanted]
            return
        with pytest.raises(NotImplementedError) as info:
            module[key]
        assert key not in module
    assert str(info.value) == (
        f"{refused}; cuda:0 ({gpu.name}) is sm_{gpu.major}{gpu.minor} (compute capability "
        f"{gpu.major}.{gpu.minor})"
    )
    assert loads == []


@pytest.mark.parametrize("capability", [(7, 5), (8, 0), (8, 9), (9, 0), (10, 0), (12, 0)])
def test_every_cuda_module_builds_for_a_gpu_it_runs_on_and_refuses_the_others(
    monkeypatch, capability
):
    """What the loader builds for a GPU is the module's declaration and nothing else: its
    GPU's arch where the declaration admits it, else NotImplementedError naming the
    module, the arch and the archs it runs on."""
    gpu = SimpleNamespace(name="GPU", major=capability[0], minor=capability[1])
    _fake_gpu(monkeypatch, gpu)
    arch = arch_for_capability(*capability)
    for entry in registry.kernels("cuda"):
        if entry.builder is None or not entry.builtin:
            continue
        if entry.archs.supports(arch):
            assert entry.spec(entry.variants[0]).cuda_archs == (arch,), entry.name
            continue
        with pytest.raises(NotImplementedError) as info:
            entry.spec(entry.variants[0])
        assert str(info.value).startswith(
            f"{entry.name} cannot be built for sm_{arch.number}: it runs on "
            f"{entry.archs.describe()}"
        )


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
