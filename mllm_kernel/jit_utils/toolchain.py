"""Finding the compilers and the CUDA toolkit, and naming them without running them.

A compiler's *identity* (its real path, size and mtime) goes into the cache key:
it changes when the compiler is upgraded, and reading it spawns nothing, so a
warm load never runs a compiler. The version text (which does spawn one) is
only read for builds and for ``show-env``.

The CUDA versions are read here only: :attr:`CudaToolkit.version` from the toolkit's
``version.json`` (no process: it joins the key), :meth:`CudaToolkit.nvcc_version` from
``nvcc --version``, and :meth:`CudaToolkit.release`, the first of the two that is known.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from mllm_kernel.jit_utils import env
from mllm_kernel.jit_utils.errors import ToolchainError

_DEFAULT_CUDA_HOME = Path("/usr/local/cuda")
# A shell wrapper such as /usr/local/bin/nvcc: `exec /usr/local/cuda-13.0/bin/nvcc "$@"`.
_EXEC_LINE = re.compile(r"^\s*exec\s+(\"[^\"]+\"|'[^']+'|\S+)", re.MULTILINE)
# nvcc --version ends with "Cuda compilation tools, release 13.0, V13.0.88".
_NVCC_RELEASE = re.compile(r"release ([\d.]+), (V[\d.]+)")


@dataclass(frozen=True)
class Tool:
    """An executable, by the path to call and the real file behind it."""

    path: Path
    real_path: Path

    @property
    def identity(self) -> str:
        """``real path:size:mtime``; ToolchainError once the file is gone (found
        earlier in this process, removed since)."""
        try:
            stat = self.real_path.stat()
        except OSError as exc:
            raise ToolchainError(
                f"{self.path} (the file {self.real_path}) can no longer be read: "
                f"{exc.strerror}. Reinstall it, or point CXX (the C++ compiler) or CUDA_HOME "
                "(nvcc) at one that exists."
            ) from None
        return f"{self.real_path}:{stat.st_size}:{stat.st_mtime_ns}"

    def version(self) -> str:
        """The first line of ``--version`` (spawns the tool)."""
        lines = _version_lines(self.path)
        return lines[0] if isinstance(lines, list) else lines


@dataclass(frozen=True)
class NvccVersion:
    """What ``nvcc --version`` says: ``text`` (``"13.0, V13.0.88"``, or its last line
    where it is worded otherwise) and ``release`` (``"13.0"``, or None)."""

    text: str
    release: str | None


@dataclass(frozen=True)
class CudaToolkit:
    """A CUDA toolkit: its root, nvcc, and the directory holding libcudart."""

    home: Path
    nvcc: Tool
    lib_dir: Path

    @property
    def version(self) -> str | None:
        """The toolkit version from ``version.json`` (no process spawned)."""
        try:
            data = json.loads((self.home / "version.json").read_text())
            return str(data["cuda"]["version"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    @property
    def identity(self) -> str:
        return f"{self.nvcc.identity}|cuda={self.version}"

    def nvcc_version(self) -> NvccVersion:
        """nvcc's own version (spawns nvcc)."""
        lines = _version_lines(self.nvcc.path)
        if not isinstance(lines, list):
            return NvccVersion(lines, None)
        match = _NVCC_RELEASE.search("\n".join(lines))
        if match:
            return NvccVersion(f"{match.group(1)}, {match.group(2)}", match.group(1))
        return NvccVersion(lines[-1], None)  # nvcc says its version last

    def release(self) -> str | None:
        """The CUDA release, ``"13.0"``: :attr:`version`, else nvcc's (spawning it only
        then)."""
        return self.version or self.nvcc_version().release


def _version_lines(path: Path | str) -> list[str] | str:
    """The non-empty lines ``path --version`` prints, or why there are none."""
    try:
        out = subprocess.run(
            [str(path), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    lines = [line.strip() for line in (out.stdout or out.stderr).splitlines() if line.strip()]
    return lines or "unknown"


def follow_wrapper(path: Path) -> Path:
    """The real executable behind ``path``, following symlinks and `exec` wrapper scripts."""
    real = path.resolve()
    for _ in range(8):  # wrappers of wrappers, but never loop forever
        try:
            with real.open("rb") as handle:
                head = handle.read(4096)
        except OSError:
            return real
        if not head.startswith(b"#!"):
            return real
        match = _EXEC_LINE.search(head.decode("utf-8", "replace"))
        if not match:
            return real
        target = Path(match.group(1).strip("\"'"))
        if not target.is_absolute():
            found = shutil.which(str(target))
            if not found:
                return real
            target = Path(found)
        if not target.exists():
            return real
        real = target.resolve()
    return real


def _tool(path: str | Path) -> Tool:
    path = Path(path)
    return Tool(path=path, real_path=follow_wrapper(path))


_cxx: Tool | None = None
_cuda: CudaToolkit | None = None


def find_cxx() -> Tool:
    """The host C++ compiler: ``$CXX``, else c++, g++ or clang++ on PATH."""
    global _cxx
    if _cxx is None:
        requested = env.cxx()
        candidates = [requested] if requested else ["c++", "g++", "clang++"]
        for name in candidates:
            found = shutil.which(name)
            if found:
                _cxx = _tool(found)
                break
        else:
            where = (
                f"$CXX={requested!r} is not an executable"
                if requested
                else ("none of c++, g++, clang++ is on PATH")
            )
            raise ToolchainError(
                f"No C++ compiler found: {where}. Install one (apt-get install g++) "
                "or set CXX to its path."
            )
    return _cxx


def _lib_dir(home: Path) -> Path | None:
    for name in ("lib64", "lib", "lib/x64", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
        candidate = home / name
        if any(candidate.glob("libcudart.so*")):
            return candidate
    return None


def _toolkit_at(home: Path, nvcc: Path | None = None) -> CudaToolkit | None:
    nvcc = nvcc or home / "bin" / "nvcc"
    if not nvcc.is_file():
        return None
    lib_dir = _lib_dir(home)
    if lib_dir is None:
        return None
    return CudaToolkit(home=home, nvcc=_tool(nvcc), lib_dir=lib_dir)


def cuda_toolkit_candidates() -> list[tuple[str, Path]]:
    """``(how found, toolkit root)`` in search order: CUDA_HOME/CUDA_PATH, nvcc on PATH
    (through any wrapper script), /usr/local/cuda."""
    found: list[tuple[str, Path]] = []
    from_env = env.cuda_home()
    if from_env:
        found.append((f"${from_env[1]}", Path(from_env[0])))
    on_path = shutil.which("nvcc")
    if on_path:
        real = follow_wrapper(Path(on_path))
        found.append((f"nvcc on PATH ({on_path})", real.parent.parent))
    found.append(("default", _DEFAULT_CUDA_HOME))
    return found


def find_cuda() -> CudaToolkit:
    """The CUDA toolkit to build with, or ToolchainError saying where we looked."""
    global _cuda
    if _cuda is None:
        looked = []
        for how, home in cuda_toolkit_candidates():
            toolkit = _toolkit_at(home)
            if toolkit is not None:
                _cuda = toolkit
                break
            if not (home / "bin" / "nvcc").is_file():
                looked.append(f"{home} ({how}): no bin/nvcc")
            else:
                looked.append(f"{home} ({how}): no libcudart.so in lib64/ or lib/")
            if how.startswith("$"):
                break  # an explicit CUDA_HOME that is wrong is an error, not a hint to guess
        if _cuda is None:
            raise ToolchainError(
                "CUDA toolkit not found (needed to build CUDA kernels): "
                + "; ".join(looked)
                + ". Install the CUDA toolkit or set CUDA_HOME to its root."
            )
    return _cuda


def host_isa() -> str:
    """The host CPU's instruction-set fingerprint, for keys of ``-march=native`` builds."""
    machine = os.uname().machine
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return machine
    for line in text.splitlines():
        key = line.split(":", 1)[0].strip().lower()
        if key in ("flags", "features"):
            return f"{machine}:{' '.join(sorted(line.split(':', 1)[1].split()))}"
    return machine


def reset() -> None:
    """Forget what was found (tests that change PATH / CUDA_HOME call this)."""
    global _cxx, _cuda
    _cxx = None
    _cuda = None


__all__ = [
    "CudaToolkit",
    "NvccVersion",
    "Tool",
    "cuda_toolkit_candidates",
    "find_cuda",
    "find_cxx",
    "follow_wrapper",
    "host_isa",
    "reset",
]
