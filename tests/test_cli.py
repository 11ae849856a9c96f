"""The CLI layer: every command has --help, bad usage exits 2, --json parses, output
has no colour off a terminal, and show-config lists kernels and unclaimed modules."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mllm_kernel.__main__ import main
from mllm_kernel.cli import output
from mllm_kernel.cli.output import paint, table, use_colour
from mllm_kernel.jit_utils import cache, cache_admin, paths, registry, toolchain
from mllm_kernel.jit_utils.cuda_arch import ArchSupport
from mllm_kernel.jit_utils.kernel_module import KernelModule

REPO = Path(__file__).resolve().parent.parent
COMMANDS = ["show-env", "show-config", "show-clangd-recommend-config", "clear-cache", "precompile"]


def run_cli(*args: str, cache_dir: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if cache_dir is not None:
        env["MLLM_KERNEL_CACHE_DIR"] = str(cache_dir)
    return subprocess.run(
        [sys.executable, "-m", "mllm_kernel", *args], capture_output=True, text=True, env=env
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert f"usage: mllm_kernel {command}" in capsys.readouterr().out


def test_every_option_has_help_and_says_its_default():
    import argparse

    from mllm_kernel.cli import build_parser

    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for command, parser in commands.choices.items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            option = f"{command} {'/'.join(action.option_strings)}"
            assert action.help, f"{option} has no help text"
            if action.default not in (None, False):
                assert "default" in action.help, f"{option} does not say its default"


def test_top_level_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and all(command in out for command in COMMANDS)


def test_unknown_command_and_no_command_exit_2():
    unknown = run_cli("frobnicate")
    assert unknown.returncode == 2
    assert "invalid choice: 'frobnicate'" in unknown.stderr
    assert run_cli().returncode == 2


@pytest.mark.parametrize("command", ["show-env", "show-config"])
def test_bad_flag_exits_2(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, "--no-such-flag"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_show_env_subprocess_text_and_json(fresh_cache):
    text = run_cli("show-env", cache_dir=fresh_cache)
    assert text.returncode == 0, text.stderr
    assert "\033[" not in text.stdout
    assert "apache-tvm-ffi" in text.stdout and str(fresh_cache) in text.stdout
    data = json.loads(run_cli("show-env", "--json", cache_dir=fresh_cache).stdout)
    assert data["cache_root"] == str(fresh_cache)
    assert data["python"]["executable"] == sys.executable


def test_show_env_without_any_tool(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nowhere"))
    monkeypatch.delenv("CXX", raising=False)
    toolchain.reset()
    try:
        assert main(["show-env"]) == 0
    finally:
        toolchain.reset()
    out = capsys.readouterr().out
    for field in ("nvcc", "nvidia-smi", "C++ compiler"):
        assert any(
            line.split() and field in line and "not found" in line for line in out.splitlines()
        )


def test_show_config_lists_builtin_kernels_before_any_call(fresh_cache, monkeypatch):
    for name in ("MLLM_KERNEL_CUDA_ARCH_LIST", "TORCH_CUDA_ARCH_LIST"):
        monkeypatch.delenv(name, raising=False)
    result = run_cli("show-config", "--json", cache_dir=fresh_cache)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    kernels = {(k["device"], k["name"]): k for k in data["kernels"]}
    add_constant = kernels[("cpu", "add_constant")]
    assert [v["template_args"] for v in add_constant["variants"]] == [
        ["1"],
        ["2"],
        ["4"],
        ["8"],
        ["16"],
    ]
    assert {v["status"] for v in add_constant["variants"]} == {"not built"}
    assert data["env"]["cache_root"] == str(fresh_cache)
    text = run_cli("show-config", "--device", "cpu", cache_dir=fresh_cache)
    assert text.returncode == 0 and "CPU kernels" in text.stdout and "\033[" not in text.stdout
    assert "add_constant" in text.stdout and "not built" in text.stdout


def test_show_config_cuda_statuses_unknown_without_an_arch(monkeypatch, capsys):
    import torch

    for name in ("MLLM_KERNEL_CUDA_ARCH_LIST", "TORCH_CUDA_ARCH_LIST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    report = cache_admin.config_report(device="cuda")
    statuses = [s for k in report.kernels for s in k.variants]
    assert all(s.status == "unknown" and s.detail for s in statuses)
    with pytest.raises(SystemExit) as exc:
        main(["show-config", "--arch", "banana"])
    assert "cannot parse CUDA arch" in str(exc.value.code)


@pytest.fixture
def no_cuda_arch(monkeypatch):
    """No GPU and no arch list: CUDA variants cannot be keyed here."""
    import torch

    for name in ("MLLM_KERNEL_CUDA_ARCH_LIST", "TORCH_CUDA_ARCH_LIST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _section(out: str, title: str) -> str:
    """The lines under ``title`` up to the next blank line."""
    return out.split(f"{title}\n", 1)[1].split("\n\n", 1)[0]


@pytest.mark.parametrize(("device", "other"), [("cpu", "cuda"), ("cuda", "cpu")])
def test_show_config_device_says_the_other_is_not_shown(device, other, no_cuda_arch, capsys):
    assert main(["show-config", "--device", device]) == 0
    out = capsys.readouterr().out
    assert _section(out, f"{other.upper()} kernels").strip() == f"not shown (--device {device})"
    assert "add_constant" in _section(out, f"{device.upper()} kernels")


def test_a_footnote_stands_under_its_own_device_table(no_cuda_arch, capsys):
    # A user kernel loaded in this process (no builder): its status is unknown, and the
    # reason is printed under the CPU table, not after the CUDA one.
    from mllm_kernel.jit_utils import registry
    from mllm_kernel.jit_utils.spec import BuildSpec, Wrapper

    spec = BuildSpec("footnoted", "cpu", ("1",), cpp_wrappers=(Wrapper("f", "ns::f<1>"),))
    registry.record_loaded(spec)
    try:
        assert main(["show-config", "--device", "cpu"]) == 0
    finally:
        registry.unregister("footnoted", "cpu")
    out = capsys.readouterr().out
    cpu = _section(out, "CPU kernels")
    assert "see [1] below" in cpu and "[1] loaded in this process, no registered builder" in cpu
    assert _section(out, "CUDA kernels").strip() == "not shown (--device cpu)"


def test_show_config_says_why_the_arch_is_unknown_once(no_cuda_arch, monkeypatch, capsys):
    # An arch list that does not parse: every CUDA variant points at the one reason.
    monkeypatch.setenv("MLLM_KERNEL_CUDA_ARCH_LIST", "banana")
    assert main(["show-config"]) == 0
    out = capsys.readouterr().out
    assert out.count("cannot parse CUDA arch") == 1
    assert "CUDA arch       unknown: $MLLM_KERNEL_CUDA_ARCH_LIST: cannot parse" in out
    *cuda_rows, hint = _section(out, "CUDA kernels").splitlines()[1:]
    assert cuda_rows and all('no CUDA arch (see "CUDA arch" above)' in r for r in cuda_rows)
    assert hint == "  (pass --arch LIST, e.g. --arch 9.0a, to compute CUDA statuses for an arch)"


def test_show_config_without_a_gpu_is_one_line_per_cuda_kernel(no_cuda_arch, capsys):
    # Before: ~90 CUDA rows "unknown ... no CUDA arch", and a summary telling a CPU-only
    # machine to set an arch as if something were wrong.
    report = cache_admin.config_report()
    cuda_kernels = [k for k in report.kernels if k.device == "cuda"]
    assert sum(len(k.variants) for k in cuda_kernels) > len(cuda_kernels)  # collapsed below
    assert main(["show-config"]) == 0
    out = capsys.readouterr().out
    note, header, *rows = _section(out, "CUDA kernels").splitlines()
    assert "not built on this machine (no GPU, and no arch named)" in note
    assert "`show-config --arch 9.0a` shows each variant's cache status" in note
    assert header.split() == ["kernel", "exports", "variants", "runs", "on"]
    assert [r.split()[0] for r in rows] == [k.name for k in cuda_kernels]
    gemm = next(r for r in rows if r.split()[0] == "gemm")
    gemm_variants = len(next(k for k in cuda_kernels if k.name == "gemm").variants)
    assert gemm.split()[-3:] == [str(gemm_variants), "sm_90a", "only"]
    stream = next(r for r in rows if r.split()[0] == "gptq_marlin_gemm")
    assert stream.endswith("sm_80 and newer")
    # (The CPU section may hold user kernels of other tests in this process, whose
    # variants are unknown: only the CUDA parts are asserted on.)
    cuda_part = _section(out, "CUDA kernels")
    assert "unknown" not in cuda_part and "no CUDA arch" not in cuda_part
    assert "set MLLM_KERNEL_CUDA_ARCH_LIST" not in out and "No CUDA GPU is visible" not in out
    (arch_line,) = [line for line in out.splitlines() if line.startswith("CUDA arch")]
    assert arch_line.split(None, 2)[2] == output.NO_GPU_ARCH
    # One line per kernel (the whole output's length depends on what else the cache and
    # the registry hold: user kernels of other tests in this process, say).
    assert len(_section(out, "CUDA kernels").splitlines()) == 2 + len(cuda_kernels)
    # With --arch, every variant's status is computed again.
    assert main(["show-config", "--device", "cuda", "--arch", "9.0a"]) == 0
    rows = _section(capsys.readouterr().out, "CUDA kernels").splitlines()[1:]
    assert len(rows) == sum(max(len(k.variants), 1) for k in cuda_kernels)


def test_show_config_lists_every_export_under_its_module(no_cuda_arch, capsys):
    import mllm_kernel.cpu.jit

    report = cache_admin.config_report()
    exports = {(k.device, k.name): k.exports for k in report.kernels}
    assert exports[("cpu", "rmsnorm")] == ("rmsnorm", "fused_add_rmsnorm", "rmsnorm_backward")
    # Known without a GPU or an arch: the exports do not depend on the arch.
    assert "fused_add_rmsnorm" in exports[("cuda", "rmsnorm")]
    # Every public CPU op shows up in show-config.
    cpu_exports = {e for (device, _), names in exports.items() if device == "cpu" for e in names}
    assert set(mllm_kernel.cpu.jit.__all__) <= cpu_exports
    assert main(["show-config", "--device", "cpu"]) == 0
    (row,) = [r for r in capsys.readouterr().out.splitlines() if "fused_add_rmsnorm" in r]
    assert row.split()[:4] == ["rmsnorm", "rmsnorm,", "fused_add_rmsnorm,", "rmsnorm_backward"]
    assert main(["show-config", "--device", "cuda", "--json"]) == 0
    kernels = json.loads(capsys.readouterr().out)["kernels"]
    norm = next(k for k in kernels if k["name"] == "rmsnorm")
    assert "fused_add_rmsnorm" in norm["exports"]


def test_show_config_says_the_archs_each_cuda_op_runs_on(no_cuda_arch, capsys):
    """Per op, the union of its modules' archs, then each module's own: read from the
    modules' declarations, with or without a GPU or an arch."""
    assert main(["show-config", "--device", "cuda"]) == 0
    section = _section(capsys.readouterr().out, "CUDA ops and the archs they run on")
    header, *rows = section.splitlines()
    assert " ".join(header.split()) == "op runs on kernel module its archs because it uses"
    at = rows.index(next(r for r in rows if r.split()[0] == "gemm"))
    assert rows[at].split() == [
        *("gemm", "sm_80", "and", "newer", "gemm", "sm_90a", "only", "wgmma", "and", "TMA"),
    ]
    assert rows[at + 1].split() == [
        *("gemm_sm80", "sm_80", "and", "newer", "mma.sync,", "ldmatrix", "and", "cp.async"),
    ]
    (norm,) = [r for r in rows if r.split()[0] == "rmsnorm"]
    assert norm.split() == ["rmsnorm", "every", "arch", "rmsnorm", "every", "arch", "-"]
    # One row per CUDA module.
    assert len(rows) == len(registry.kernels("cuda"))
    assert main(["show-config", "--device", "cuda", "--json"]) == 0
    ops = {op["op"]: op for op in json.loads(capsys.readouterr().out)["cuda_ops"]}
    assert ops["int8_scaled_mm"] == {
        "op": "int8_scaled_mm",
        "runs_on": "sm_80 and newer",
        "modules": [
            {"name": "int8_scaled_mm", "runs_on": "sm_90a only", "uses": "wgmma and TMA"},
            {
                "name": "int8_scaled_mm_sm80",
                "runs_on": "sm_80 and newer",
                "uses": "mma.sync, ldmatrix and cp.async",
            },
        ],
    }
    assert main(["show-config", "--device", "cpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cuda_ops"] == []
    assert main(["show-config", "--device", "cpu"]) == 0
    assert "CUDA ops and the archs they run on" not in capsys.readouterr().out


def test_show_config_gives_a_module_that_cannot_run_on_the_arch_one_row(no_cuda_arch, capsys):
    """For sm_80 the wgmma modules have no build to look for: one row saying so and what
    the op has there, where each variant was "unknown" with a footnote."""
    assert main(["show-config", "--device", "cuda", "--arch", "8.0"]) == 0
    out = capsys.readouterr().out
    rows = _section(out, "CUDA kernels").splitlines()[1:]
    (gemm,) = [r for r in rows if r.split()[0] == "gemm"]
    variants = len(next(e for e in registry.kernels("cuda") if e.name == "gemm").variants)
    assert re.search(rf" {variants} variants +not for sm_80 ", gemm)
    assert gemm.endswith(
        "it runs on sm_90a only (it uses wgmma and TMA); op gemm has gemm_sm80 here"
    )
    (wgmma,) = [r for r in rows if r.split()[0] == "gptq_marlin_gemm_wgmma"]
    assert wgmma.endswith("op gptq_marlin_gemm has gptq_marlin_dequantize, gptq_marlin_gemm here")
    sm80 = [r for r in rows if r.split()[0] == "gemm_sm80"]
    assert len(sm80) == len(
        next(e for e in registry.kernels("cuda") if e.name == "gemm_sm80").variants
    )
    assert "unknown" not in _section(out, "CUDA kernels")
    # An arch list where the module runs on one of the archs: each variant again.
    assert main(["show-config", "--device", "cuda", "--arch", "8.0;9.0a"]) == 0
    rows = _section(capsys.readouterr().out, "CUDA kernels").splitlines()[1:]
    assert len([r for r in rows if r.split()[0] == "gemm"]) == variants


def test_show_config_lists_the_exports_of_a_module_that_cannot_run_on_the_arch(
    no_cuda_arch, capsys
):
    """Its row is collapsed, and still says what it exports: they are read from its spec
    for an arch it runs on, where "-" stood."""
    report = cache_admin.config_report(device="cuda", arch="7.5")
    exports = {k.name: k.exports for k in report.kernels}
    assert exports["gptq_marlin_dequantize"] == ("dequantize",)
    assert exports["gemm"] == ("gemm",)
    assert main(["show-config", "--device", "cuda", "--arch", "7.5"]) == 0
    rows = _section(capsys.readouterr().out, "CUDA kernels").splitlines()[1:]
    (stream,) = [r for r in rows if r.split()[0] == "gptq_marlin_gemm"]
    assert stream.split()[1:3] == ["stream", "44"] and " not for sm_75 " in stream


@pytest.mark.parametrize("arch", [None, "7.5", "9.0a"])
def test_show_config_reads_exports_for_an_arch_the_module_runs_on(no_cuda_arch, arch):
    """A module for one arch the stand-in (9.0a) is not: read for that arch, with no arch
    set as with one it does not run on."""
    module = KernelModule(
        "sm100a_only_kernel",
        device="cuda",
        sources=["softmax.cu"],
        exports=["only_on_sm100a"],
        builtin=False,
        archs=ArchSupport(arch_specific=(10, 0), uses="tcgen05"),
    )
    try:
        report = cache_admin.config_report(device="cuda", arch=arch)
    finally:
        registry.unregister(module.name, "cuda")
    (kernel,) = [k for k in report.kernels if k.name == module.name]
    assert kernel.exports == ("only_on_sm100a",)


def test_show_config_lists_unclaimed_modules(fresh_cache, capsys):
    directory = fresh_cache / "my_user_kernel_cpu_3_0123456789abcdef"
    directory.mkdir(parents=True)
    (directory / "my_user_kernel.so").write_bytes(b"\0" * 2048)
    cache.Manifest(
        name="my_user_kernel",
        device="cpu",
        template_args=["3"],
        key_hash="0" * 64,
        artifact="my_user_kernel.so",
        artifact_size=2048,
        artifact_sha256="0" * 64,
        deps={},
        exports=["f"],
        built_at=time.time(),
        build_seconds=1.0,
    ).write(directory)
    report = cache_admin.config_report(device="cpu")
    assert [m.name for m in report.unclaimed] == ["my_user_kernel"]
    assert main(["show-config", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    section = out.split("Other cached modules")[1]
    assert "my_user_kernel" in section and str(directory) in section
    assert main(["show-config", "--device", "cpu", "--json"]) == 0
    (module,) = json.loads(capsys.readouterr().out)["unclaimed_modules"]
    assert module["name"] == "my_user_kernel" and module["template_args"] == ["3"]


def _user_module(root: Path, name: str, source: Path, key: str) -> Path:
    """A cached build of user kernel ``name``<3> from ``source`` (its manifest lists the
    package header it includes too)."""
    directory = root / f"{name}_cpu_3_{key * 16}"
    directory.mkdir(parents=True)
    (directory / f"{name}.so").write_bytes(b"\0" * 2048)
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text("// a user kernel\n")
    header = Path(paths.include_dir()) / "mllm_kernel" / "utils.hpp"
    cache.Manifest(
        name=name,
        device="cpu",
        template_args=["3"],
        key_hash=key * 64,
        artifact=f"{name}.so",
        artifact_size=2048,
        artifact_sha256="0" * 64,
        deps={str(source): "0" * 64, str(header): "0" * 64},
        exports=[name],
        built_at=time.time(),
        build_seconds=1.0,
    ).write(directory)
    return directory


def test_show_config_tells_two_user_kernels_of_one_name_apart(fresh_cache, tmp_path, capsys):
    # The README's my_kernel<3> and the example's: before, two rows that differ only in
    # the hash of their cache directory.
    readme = tmp_path / "project" / "my_kernel.cpp"
    example = tmp_path / "examples" / "custom_kernel" / "my_kernel.cpp"
    first = _user_module(fresh_cache, "my_kernel", readme, "a")
    second = _user_module(fresh_cache, "my_kernel", example, "b")
    report = cache_admin.config_report(device="cpu")
    assert {m.path: m.sources for m in report.unclaimed} == {
        first: (str(readme),),
        second: (str(example),),
    }
    assert main(["show-config", "--device", "cpu"]) == 0
    section = capsys.readouterr().out.split("Other cached modules")[1]
    header, *rows = section.splitlines()[1:]
    assert header.split() == ["name", "device", "variant", "size", "built", "from", "path"]
    assert any(str(readme) in r and str(first) in r for r in rows)
    assert any(str(example) in r and str(second) in r for r in rows)
    assert main(["show-config", "--device", "cpu", "--json"]) == 0
    modules = json.loads(capsys.readouterr().out)["unclaimed_modules"]
    assert sorted(m["sources"] for m in modules) == sorted([[str(readme)], [str(example)]])


def test_a_registered_user_kernel_says_its_sources_and_its_namesakes_are_listed(
    fresh_cache, tmp_path, capsys
):
    from mllm_kernel.jit_utils.loader import cpu_spec

    example = tmp_path / "examples" / "twin.cpp"
    example.parent.mkdir()
    example.write_text("// the registered one\n")
    other = tmp_path / "project" / "twin.cpp"
    other_build = _user_module(fresh_cache, "twin", other, "c")

    def spec(scale: int):
        return cpu_spec("twin", str(scale), cpp_files=[example], cpp_wrappers=[("twin", "f")])

    registry.register_kernel(
        "twin", device="cpu", variants=[(3,)], builtin=False, spec_function=spec
    )(spec)
    try:
        report = cache_admin.config_report(device="cpu")
        assert main(["show-config", "--device", "cpu"]) == 0
    finally:
        registry.unregister("twin", "cpu")
    (twin,) = [k for k in report.kernels if k.name == "twin"]
    assert twin.sources == (str(example),)
    # Another program's kernel of the same name is not "another arch or toolchain".
    assert [m.path for m in report.unclaimed] == [other_build] and report.other_builds == 0
    out = capsys.readouterr().out
    assert f"  twin (user) is built from {example}" in _section(out, "CPU kernels")
    assert str(other) in out.split("Other cached modules")[1]


def _unusable_root(monkeypatch, tmp_path) -> tuple[Path, Path]:
    """MLLM_KERNEL_CACHE_DIR under /proc (cannot be created), HOME a fresh directory:
    ``(the root set, the private fallback)``."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("MLLM_KERNEL_CACHE_DIR", "/proc/x")
    return Path("/proc/x"), home / ".cache" / "mllm_kernel"


def test_show_config_and_show_env_state_the_cache_root_fallback(
    tmp_path, monkeypatch, no_cuda_arch, capsys
):
    # Before: "cache root  /proc/x", as if it were used.
    root, fallback = _unusable_root(monkeypatch, tmp_path)
    assert main(["show-config", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("cache root")]
    assert line.split(None, 2)[2].startswith(
        f"{fallback} (MLLM_KERNEL_CACHE_DIR={root} is not used: cannot create {root}: "
        "No such file or directory (ENOENT). Fix: "
    )
    assert main(["show-env", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["cache_root"] == str(root) and info["cache_root_in_use"] == str(fallback)
    assert "ENOENT" in info["cache_root_problem"]
    assert main(["show-env"]) == 0
    (row,) = [r for r in capsys.readouterr().out.splitlines() if r.split()[:1] == ["root"]]
    assert row.split(None, 1)[1].startswith(f"{fallback} (MLLM_KERNEL_CACHE_DIR={root} is not used")


@pytest.fixture
def tiny_user_kernel(tmp_path):
    """A registered user kernel with one variant that compiles in a second."""
    from mllm_kernel.jit_utils import cache_once, load_cpu_jit

    source = tmp_path / "tiny.cpp"
    source.write_text("namespace tiny { int f() { return 1; } }\n")

    @cache_once
    def build():
        return load_cpu_jit("tiny", cpp_files=[str(source)], cpp_wrappers=[("f", "tiny::f")])

    registry.register_kernel("tiny", device="cpu", variants=[()], builtin=False)(build)
    yield "tiny"
    registry.unregister("tiny", "cpu")


def test_precompile_states_the_cache_root_fallback(tmp_path, monkeypatch, tiny_user_kernel, capsys):
    # Before: "tiny<> (cpu): [Errno 2] No such file or directory: '/proc/x'", exit 1.
    root, fallback = _unusable_root(monkeypatch, tmp_path)
    assert main(["precompile", "--kernel", tiny_user_kernel]) == 0
    out = capsys.readouterr().out
    assert "1 built" in out and "0 failed" in out
    assert f"note: built into {fallback} (MLLM_KERNEL_CACHE_DIR={root} is not used: " in out
    assert [m.name for m in cache_admin.cached_modules(fallback)] == [tiny_user_kernel]


def test_precompile_without_any_usable_root_is_one_error(
    tmp_path, monkeypatch, tiny_user_kernel, capsys
):
    not_a_home = tmp_path / "home_is_a_file"
    not_a_home.write_text("")
    monkeypatch.setenv("HOME", str(not_a_home))
    monkeypatch.setenv("MLLM_KERNEL_CACHE_DIR", "/proc/x")
    assert main(["precompile", "--kernel", tiny_user_kernel]) == 1
    err = capsys.readouterr().err
    assert err.startswith("mllm_kernel precompile: error: no cache root can be used: ")
    assert "/proc/x" in err and str(not_a_home) in err and len(err.splitlines()) == 1


def test_colour_only_on_a_terminal(monkeypatch):
    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert use_colour(Tty())
    assert not use_colour(open(os.devnull, "w"))  # noqa: SIM115
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_colour(Tty())
    assert paint("x", "red", enabled=True) == "\033[31mx\033[0m"
    assert paint("x", "red", enabled=False) == "x"


def test_table_aligns_columns_ignoring_colour():
    text = table(("a", "bb"), [("\033[31mlong\033[0m", "1"), ("x", "22")])
    lines = [line.replace("\033[31m", "").replace("\033[0m", "") for line in text.splitlines()]
    assert lines == ["  a     bb", "  long  1", "  x     22"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["precompile", "-j", "0"], "expected a positive integer, got '0'"),
        (["precompile", "-j", "1.5"], "expected a positive integer, got '1.5'"),
        (["clear-cache", "--older-than", "-1"], "expected a number of days >= 0, got '-1'"),
        (["clear-cache", "--older-than", "nan"], "expected a number of days >= 0, got 'nan'"),
        (["clear-cache", "--older-than", "week"], "expected a number of days >= 0, got 'week'"),
    ],
)
def test_bad_numbers_exit_2_saying_what_was_expected(argv, expected, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert expected in capsys.readouterr().err
