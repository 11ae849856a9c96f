"""The CLI layer: every command has --help, bad usage exits 2, --json parses, output
has no colour off a terminal, and show-config lists kernels and unclaimed modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mllm_kernel.__main__ import main
from mllm_kernel.cli.output import paint, table, use_colour
from mllm_kernel.jit_utils import cache, cache_admin, toolchain

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


def test_show_config_says_why_the_arch_is_unknown_once(no_cuda_arch, capsys):
    assert main(["show-config"]) == 0
    out = capsys.readouterr().out
    assert out.count("No CUDA GPU is visible") == 1
    assert "CUDA arch       unknown: No CUDA GPU is visible" in out
    *cuda_rows, hint = _section(out, "CUDA kernels").splitlines()[1:]
    assert cuda_rows and all('no CUDA arch (see "CUDA arch" above)' in r for r in cuda_rows)
    assert hint == "  (pass --arch LIST, e.g. --arch 9.0a, to compute CUDA statuses for an arch)"


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
