"""precompile: builds registered variants in parallel, reports failures by their first error,
and builds CUDA kernels for an arch on a machine without a GPU (compile-only)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mllm_kernel.__main__ import main
from mllm_kernel.jit_utils import (
    cache,
    cache_once,
    load_cpu_jit,
    load_cuda_jit,
    loader,
    precompile,
    register_kernel,
    registry,
    toolchain,
)
from mllm_kernel.jit_utils.cache_key import module_key
from mllm_kernel.jit_utils.errors import ToolchainError

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def temp_kernels():
    """Registers kernels for one test and forgets them afterwards."""
    names: list[tuple[str, str]] = []

    def add(name: str, device: str, variants, builder):
        register_kernel(name, device=device, variants=variants)(builder)
        names.append((name, device))
        return builder

    yield add
    for name, device in names:
        registry.unregister(name, device)


@pytest.fixture
def no_arch_env(monkeypatch):
    for name in ("MLLM_KERNEL_CUDA_ARCH_LIST", "TORCH_CUDA_ARCH_LIST"):
        monkeypatch.delenv(name, raising=False)


def _cpu_kernel(temp_kernels, tmp_path: Path, name: str, body: str, variants=((1,), (2,))):
    source = tmp_path / f"{name}.cpp"
    source.write_text(body)

    @cache_once
    def builder(c: int):
        return load_cpu_jit(
            name,
            c,
            cpp_files=[source],
            cpp_wrappers=[(name, f"{name}_impl<{c}>")],
        )

    return temp_kernels(name, "cpu", list(variants), builder)


GOOD_CPP = "template <int C> int {name}_impl(int x) {{ return x + C; }}\n"
BAD_CPP = "template <int C> int {name}_impl(int x) {{\n  return x + C  // missing ';'\n}}\n"


def test_precompile_cpu_kernel_end_to_end():
    """The CLI in a subprocess: every add_constant variant, then all already cached.

    It builds into the session's cache, so the kernel tests reuse these builds
    (or this test theirs): the count of built + cached is what matters.
    """
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [
        sys.executable,
        "-m",
        "mllm_kernel",
        "precompile",
        "--kernel",
        "add_constant",
        "--device",
        "cpu",
    ]
    first = subprocess.run([*command, "-j", "2"], capture_output=True, text=True, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "\033[" not in first.stdout  # not a terminal: plain lines, no colour, no bar
    lines = [line for line in first.stdout.splitlines() if line.startswith("[")]
    assert len(lines) == 5 and all(" add_constant<" in line for line in lines)
    assert "precompiled 5 variant(s)" in first.stdout and "0 failed" in first.stdout
    again = subprocess.run(command, capture_output=True, text=True, env=env)
    assert again.returncode == 0 and "0 built, 5 already cached" in again.stdout


def test_precompile_library_statuses_and_callbacks(fresh_cache, temp_kernels, tmp_path):
    _cpu_kernel(temp_kernels, tmp_path, "pc_good", GOOD_CPP.format(name="pc_good"))
    started, seen = [], []
    report = precompile.precompile(
        kernels=["pc_good"], jobs=2, on_start=started.append, on_result=seen.append
    )
    assert started == [2] and len(seen) == 2
    assert [r.status for r in report.results] == ["built", "built"]
    assert [r.job.variant for r in report.results] == [(1,), (2,)]  # selection order
    for result in report.results:
        assert result.path.parent == fresh_cache
        assert cache.Manifest.read(result.path).name == "pc_good"
    entry = next(e for e in registry.kernels("cpu") if e.name == "pc_good")
    assert {registry.variant_status(entry, v).status for v in entry.variants} == {"cached"}
    again = precompile.precompile(kernels=["pc_good"])
    assert [r.status for r in again.results] == ["cached", "cached"]


def test_build_into_cache_without_loading(fresh_cache, temp_kernels, tmp_path):
    builder = _cpu_kernel(
        temp_kernels, tmp_path, "pc_noload", GOOD_CPP.format(name="pc_noload"), [(4,)]
    )
    spec = registry.builder_spec(builder, 4)
    assert loader.build_into_cache(spec) == "built"
    assert cache.lookup(module_key(spec)).status == "hit"
    assert loader.build_into_cache(spec) == "cached"
    assert not list((fresh_cache / ".staging").iterdir())
    # The loader takes the installed module as a valid cache hit.
    assert builder(4).pc_noload(1) == 5


def test_failing_kernel_reports_first_error(fresh_cache, temp_kernels, tmp_path, capsys):
    _cpu_kernel(temp_kernels, tmp_path, "pc_bad", BAD_CPP.format(name="pc_bad"), [(1,)])
    code = main(["precompile", "--kernel", "pc_bad", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "0 built, 0 already cached, 1 failed" in out
    assert "1 build(s) failed" in err
    assert "pc_bad<1> (cpu): " in err
    assert f"{tmp_path / 'pc_bad.cpp'}:2: expected" in err  # file:line of the first error
    assert "full log: " in err


def _progress_output(monkeypatch, rows: int, columns: int) -> str:
    """What precompile's progress writes to a pseudo-terminal of ``rows`` x ``columns``
    (its stdout) for two finished builds."""
    import fcntl
    import pty
    import struct
    import termios

    from mllm_kernel.cli.precompile import _Progress

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    with os.fdopen(slave, "w") as terminal:
        monkeypatch.setattr(sys, "stdout", terminal)  # tqdm sizes itself from sys.stdout
        progress = _Progress()
        entry = registry.KernelEntry("k", "cpu", builder=None, variants=[(1,), (2,)])
        progress.start(2)
        for variant in entry.variants:
            job = precompile.Job(entry, variant)
            progress.result(precompile.JobResult(job, "built", 1.5))
        progress.close()
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the terminal's other end is closed and drained
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return b"".join(chunks).decode()


def test_progress_on_a_terminal_of_size_0x0_prints_a_line_per_build(monkeypatch):
    out = _progress_output(monkeypatch, 0, 0)
    assert out.splitlines() == ["[1/2] built  k<1> (cpu) (1.5s)", "[2/2] built  k<2> (cpu) (1.5s)"]


def test_progress_on_a_sized_terminal_draws_a_bar(monkeypatch):
    out = _progress_output(monkeypatch, 24, 80)
    assert "precompile: 100%" in out and "2/2" in out and "[1/2]" not in out


def test_progress_off_a_terminal_prints_a_line_per_build(capsys):
    from mllm_kernel.cli.precompile import _Progress

    progress = _Progress()
    entry = registry.KernelEntry("k", "cpu", builder=None, variants=[(1,)])
    progress.start(1)
    progress.result(precompile.JobResult(precompile.Job(entry, (1,)), "failed", 2.0))
    progress.close()
    assert capsys.readouterr().out == "[1/1] failed k<1> (cpu) (2.0s)\n"


def test_an_ops_name_selects_the_helper_modules_that_serve_it():
    import mllm_kernel.cuda.jit  # noqa: F401  (registers the CUDA ops)

    jobs = precompile.select_jobs("cuda", ["gptq_marlin_gemm"])
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job.entry.name] = counts.get(job.entry.name, 0) + 1
    # the streaming kernel, the fused Hopper kernel and the dequantize step of the
    # dequantize + GEMM path; the GEMM itself is its own op
    assert counts == {
        "gptq_marlin_gemm": 44,
        "gptq_marlin_gemm_wgmma": 16,
        "gptq_marlin_dequantize": 8,
    }
    helpers = {e.name: e.op for e in registry.kernels("cuda") if e.op is not None}
    assert helpers == {
        "gptq_marlin_gemm_wgmma": "gptq_marlin_gemm",
        "gptq_marlin_dequantize": "gptq_marlin_gemm",
        "gemm_sm80": "gemm",
        "int8_scaled_mm_sm80": "int8_scaled_mm",
    }
    # a helper module can still be named on its own
    only = precompile.select_jobs("cuda", ["gptq_marlin_gemm_wgmma"])
    assert {job.entry.name for job in only} == {"gptq_marlin_gemm_wgmma"}


def test_unknown_kernel_exits_2(capsys):
    assert main(["precompile", "--kernel", "no_such_kernel"]) == 2
    assert "unknown kernel(s) 'no_such_kernel'; registered:" in capsys.readouterr().err
    assert main(["precompile", "--kernel", "rmsnrom"]) == 2
    assert "unknown kernel(s) 'rmsnrom' (did you mean 'rmsnorm'?)" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [["-j", "0"], ["--device", "tpu"], ["--arch"]])
def test_bad_flags_exit_2(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["precompile", *bad])
    assert exc.value.code == 2 and "error:" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# CUDA without a GPU
# ---------------------------------------------------------------------------
TINY_CU = """\
#include <cuda_runtime.h>
#include <tvm/ffi/function.h>
template <int C>
__global__ void tiny_kernel(int* x) { x[threadIdx.x] += C; }
template <int C>
int tiny_launch(int n) { return n + C; }  // host entry: enough to export and link
"""


def _cuda_kernel(temp_kernels, tmp_path: Path):
    source = tmp_path / "pc_tiny.cu"
    source.write_text(TINY_CU)

    @cache_once
    def builder(c: int):
        return load_cuda_jit(
            "pc_tiny_cuda",
            c,
            cuda_files=[source],
            cuda_wrappers=[("pc_tiny", f"tiny_launch<{c}>")],
        )

    return temp_kernels("pc_tiny_cuda", "cuda", [(1,)], builder)


@pytest.mark.nvcc
def test_precompile_cuda_for_an_arch_without_a_gpu(
    fresh_cache, temp_kernels, tmp_path, no_arch_env, capsys, monkeypatch
):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _cuda_kernel(temp_kernels, tmp_path)
    # Without an arch the variants are not listed one by one; with --arch they are.
    assert main(["show-config", "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "pc_tiny_cuda" in out and "not built on this machine" in out and "--arch 9.0a" in out

    code = main(["precompile", "--device", "cuda", "--arch", "9.0a", "--kernel", "pc_tiny_cuda"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "1 built" in out
    (module,) = [p for p in fresh_cache.iterdir() if p.name.startswith("pc_tiny_cuda_cuda_1_")]
    assert cache.Manifest.read(module).cuda_archs == ["9.0a"]

    assert main(["show-config", "--device", "cuda", "--arch", "9.0a", "--json"]) == 0
    import json

    data = json.loads(capsys.readouterr().out)
    (kernel,) = [k for k in data["kernels"] if k["name"] == "pc_tiny_cuda"]
    assert kernel["variants"][0]["status"] == "cached"
    assert kernel["variants"][0]["path"] == str(module)
    assert data["cuda_arch"] == {"archs": ["9.0a"], "source": "override (--arch)"}


def test_device_all_skips_cuda_without_an_arch(
    fresh_cache, temp_kernels, tmp_path, no_arch_env, monkeypatch
):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _cuda_kernel(temp_kernels, tmp_path)
    report = precompile.precompile(device="all", kernels=["pc_tiny_cuda"])
    assert report.results == []
    assert report.skipped and "CUDA kernels skipped" in report.skipped[0]


def test_device_cuda_without_a_toolkit_is_an_error(
    fresh_cache, temp_kernels, tmp_path, monkeypatch, capsys
):
    _cuda_kernel(temp_kernels, tmp_path)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no_cuda_here"))
    monkeypatch.setenv("PATH", str(tmp_path))
    toolchain.reset()
    try:
        with pytest.raises(ToolchainError):
            precompile.precompile(device="cuda", arch="9.0a", kernels=["pc_tiny_cuda"])
        code = main(["precompile", "--device", "cuda", "--arch", "9.0a"])
    finally:
        toolchain.reset()
    assert code == 1
    assert "CUDA toolkit not found" in capsys.readouterr().err
