"""The README's snippets run as written (so what a new user copies works)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mllm_kernel

README = Path(__file__).resolve().parents[1] / "README.md"
pytestmark = pytest.mark.skipif(not README.is_file(), reason="needs the source checkout")


def code_blocks(heading: str, language: str) -> list[str]:
    """The ``language`` fenced blocks of the README section under ``heading`` (up to the
    next heading of its level or above; ``#`` lines inside code are not headings)."""
    level = len(heading.split()[0])
    lines = README.read_text().splitlines(keepends=True)
    start = lines.index(f"{heading}\n") + 1
    section, in_code = [], False
    for line in lines[start:]:
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and re.match(rf"#{{1,{level}}} ", line):
            break
        section.append(line)
    return re.findall(rf"```{language}\n(.*?)```", "".join(section), flags=re.DOTALL)


def run_python(code: str, tmp_path: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(mllm_kernel.__file__).resolve().parents[1]),
        "MLLM_KERNEL_CACHE_DIR": str(tmp_path / "cache"),
    }
    env.pop("MLLM_KERNEL_LOG_LEVEL", None)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_own_kernel_snippet_runs_from_another_directory(tmp_path):
    (cpp,) = code_blocks("### Your own kernel", "cpp")
    (python,) = code_blocks("### Your own kernel", "python")
    project = tmp_path / "project"
    project.mkdir()
    (project / "my_kernel.cpp").write_text(cpp)
    script = project / "my_kernel.py"
    script.write_text(python + "torch.testing.assert_close(out, x * 3)\nprint('ok')\n")
    elsewhere = tmp_path / "elsewhere"  # the program is started from another directory
    elsewhere.mkdir()
    result = run_python(f"import runpy; runpy.run_path({str(script)!r})", tmp_path, elsewhere)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.parametrize("import_ops_first", [False, True])
def test_logging_snippet_routes_records_to_the_application(tmp_path, import_ops_first):
    (snippet,) = code_blocks("## Logging", "python")
    ops = "import mllm_kernel.cpu.jit\n"
    probe = textwrap.dedent("""
        import logging
        import mllm_kernel.cpu.jit
        logging.getLogger("mllm_kernel").info("probe")
        logging.getLogger("mllm_kernel").debug("below the level")
    """)
    code = (ops if import_ops_first else "") + snippet + probe
    result = run_python(code, tmp_path, tmp_path)
    assert result.returncode == 0, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.endswith(" mllm_kernel INFO probe")  # the application's format, not ours
    assert "[mllm_kernel]" not in result.stderr


def test_without_the_snippet_the_logger_writes_to_stderr_itself(tmp_path):
    code = textwrap.dedent("""
        import logging
        logging.basicConfig(format="app %(message)s")
        import mllm_kernel.cpu.jit
        logging.getLogger("mllm_kernel").info("probe")
    """)
    result = run_python(code, tmp_path, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == ["[mllm_kernel] INFO probe"]
