"""Settings and outputs a user names wrongly get an error that says what to do (issue 30,
second trial): a bad log level, a clangd --output that is a directory or cannot be
written, a precompile --output that is a file or cannot be created."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mllm_kernel.__main__ import main

REPO = Path(__file__).resolve().parent.parent


def test_an_unknown_log_level_warns_and_keeps_info():
    env = {**os.environ, "MLLM_KERNEL_LOG_LEVEL": "bogus", "PYTHONPATH": str(REPO)}
    code = "import logging, mllm_kernel.cpu.jit; print(logging.getLogger('mllm_kernel').level)"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "20"  # INFO
    assert "MLLM_KERNEL_LOG_LEVEL='BOGUS' is not a level" in run.stderr
    assert "Traceback" not in run.stderr


def test_clangd_output_that_is_a_directory_is_refused_and_nothing_is_left(tmp_path, capsys):
    target = tmp_path / "adir"
    target.mkdir()
    assert main(["show-clangd-recommend-config", "--output", str(target), "--force"]) == 1
    err = capsys.readouterr().err
    assert f"cannot write {target}: it is a directory" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"]  # no stray .tmp


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through directory permissions")
def test_clangd_output_that_cannot_be_written_names_it(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    target = locked / ".clangd"
    assert main(["show-clangd-recommend-config", "--output", str(target)]) == 1
    err = capsys.readouterr().err
    assert f"cannot write {target}: Permission denied; give another --output" in err
    assert ".tmp" not in err


def test_clangd_output_on_a_pseudo_filesystem_names_the_path(capsys):
    assert main(["show-clangd-recommend-config", "--output", "/proc/x.clangd"]) == 1
    err = capsys.readouterr().err
    assert "cannot write /proc/x.clangd:" in err and ".tmp" not in err


@pytest.mark.parametrize("kind", ["file", "uncreatable"])
def test_precompile_output_that_cannot_hold_a_cache_is_one_error(tmp_path, capsys, kind):
    if kind == "file":
        output = tmp_path / "afile"
        output.write_text("mine")
        expected = f"--output {output} is a file: give a directory"
    else:
        output = Path("/proc/mllm_kernel_test_output")
        expected = f"--output {output}: cannot create the directory"
    code = main(
        ["precompile", "--device", "cpu", "--kernel", "add_constant", "--output", str(output)]
    )
    out, err = capsys.readouterr()
    assert code == 1
    assert err.count("error:") == 1 and expected in err
    assert "prebuilt cache:" not in out
    if kind == "file":
        assert output.read_text() == "mine"
