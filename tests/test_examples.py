"""The examples run as a user would run them (so they cannot rot)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import mllm_kernel

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.skipif(not EXAMPLES.is_dir(), reason="needs the source checkout's examples/")
def test_custom_kernel_example(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(mllm_kernel.__file__).resolve().parents[1]),
        "MLLM_KERNEL_CACHE_DIR": str(tmp_path / "cache"),
    }
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "custom_kernel" / "run.py")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "scale(x, 3) matches x * 3" in result.stdout
    assert "float64 input: argument 'x': expected dtype in {float32} but got float64" in (
        result.stdout
    )
