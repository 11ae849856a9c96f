"""Finding the compilers and the CUDA toolkit, and naming them without running them.

A compiler's *identity* goes into the cache key. It names the compiler as the user
names it, then every file that call runs through, in order:

- the path as named (``$CXX``, or what PATH gives): the same binary may act by its
  name (``clang`` / ``clang++``, a ccache masquerade link);
- each wrapper script on the way (a ``#!`` file whose ``exec`` line is followed): the
  sha256 of its bytes, so editing a wrapper's flags changes the key;
- the real executable: its resolved path, size and mtime, which change when it is
  upgraded;
- where that executable is a compiler launcher (ccache, sccache, distcc), the identity
  of the compiler it runs, found as the launcher finds it: the name it was called by
  (``/usr/lib/ccache/g++`` -> ccache runs the next ``g++`` on PATH that is not ccache),
  or the first argument of a wrapper's ``exec ccache g++ "$@"``.

Computing it spawns nothing, so a warm load never runs a compiler; each script is
read once per process and version of the file (its stat). Not followed: an ``exec``
line naming its program through a variable, a script that changes PATH before its
``exec``, a launcher's compiler chosen by its own settings (``CCACHE_PATH``,
``ccache.conf``): the scripts' bytes are still in the key. The version text (which
does spawn one) is only read for builds and for ``show-env``.

The CUDA versions are read here only: :attr:`CudaToolkit.version` from the toolkit's
``version.json`` (no process: it joins the key), :meth:`CudaToolkit.nvcc_version` from
``nvcc --version``, and :meth:`CudaToolkit.release`, the first of the two that is known.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from mllm_kernel.jit_utils import env
from mllm_kernel.jit_utils.errors import ToolchainError

_DEFAULT_CUDA_HOME = Path("/usr/local/cuda")
_CPUINFO = Path("/proc/cpuinfo")
# The /proc/cpuinfo fields that name an Arm core (AArch64's -march=native reads them).
_ARM_CORE_FIELDS = ("CPU implementer", "CPU variant", "CPU part")
# A shell wrapper such as /usr/local/bin/nvcc: `exec /usr/local/cuda-13.0/bin/nvcc "$@"`;
# the program and its first argument (the compiler, where the program is ccache).
_WORD = r"(\"[^\"]+\"|'[^']+'|\S+)"
_EXEC_LINE = re.compile(rf"^[ \t]*exec[ \t]+{_WORD}(?:[ \t]+{_WORD})?", re.MULTILINE)
# Programs that run the compiler named by how they were called, or by their first argument.
_LAUNCHERS = frozenset({"ccache", "sccache", "distcc"})
# Wrappers of wrappers (and launchers of compilers), but never loop forever.
_MAX_LINKS = 8
# A "#!" file larger than this is keyed like a binary (size, mtime): scripts are small.
_MAX_SCRIPT_BYTES = 1 << 20
# nvcc --version ends with "Cuda compilation tools, release 13.0, V13.0.88".
_NVCC_RELEASE = re.compile(r"release ([\d.]+), (V[\d.]+)")


@dataclass(frozen=True)
class Tool:
    """An executable, by the path to call and the real file behind it (for display:
    :attr:`identity` follows the chain again, as it is now)."""

    path: Path
    real_path: Path

    @property
    def identity(self) -> str:
        """The called path, each wrapper script (sha256), the real file (path:size:mtime)
        and a launcher's compiler (see the module docstring). ToolchainError once a file
        of the chain is gone (found earlier in this process, removed since)."""
        try:
            return _identity(self.path, depth=0)
        except OSError as exc:
            raise ToolchainError(
                f"{self.path} (the file {exc.filename or self.real_path}) can no longer be "
                f"read: {exc.strerror}. Reinstall it, or point CXX (the C++ compiler) or "
                "CUDA_HOME (nvcc) at one that exists."
            ) from None

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
        """nvcc's :attr:`Tool.identity` and the toolkit version (nvcc's ``-ccbin``, the
        C++ compiler, is keyed as ``find_cxx().identity`` beside it)."""
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


@dataclass(frozen=True)
class _Script:
    """A ``#!`` file: the sha256 of its bytes, and its ``exec`` line's program and first
    argument as written (None where it has none)."""

    digest: str
    program: str | None
    argument: str | None


@dataclass(frozen=True)
class _Link:
    """One file a call runs through: its resolved ``path``, the name it was ``called`` by
    (its argv[0]'s last part: a launcher acts on it), its stat and, for a script, what
    it holds."""

    path: Path
    called: str
    stat: os.stat_result
    script: _Script | None

    def describe(self) -> str:
        """A script by its bytes (touching it changes nothing), a binary by path:size:mtime
        (hashing a compiler on every load would cost more than the load)."""
        if self.script is not None:
            return f"{self.path}#sha256:{self.script.digest}"
        return f"{self.path}:{self.stat.st_size}:{self.stat.st_mtime_ns}"


# What each version of a file is (script or not), by its stat: a warm load reads nothing.
_scripts: dict[tuple[int, ...], _Script | None] = {}


def _script_at(path: Path, stat: os.stat_result) -> _Script | None:
    """:func:`_read_script`, once per process for each version of the file: the stat
    signature changes when the file is rewritten, replaced or touched."""
    signature = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if signature not in _scripts:
        _scripts[signature] = _read_script(path, stat.st_size)
    return _scripts[signature]


def _read_script(path: Path, size: int) -> _Script | None:
    """The script at ``path``, or None for a binary (or a file we may run but not read,
    which is keyed as a binary)."""
    if size > _MAX_SCRIPT_BYTES:
        return None
    try:
        with path.open("rb") as handle:
            if handle.read(2) != b"#!":
                return None  # a binary: its first bytes say so, the rest is not read
            data = b"#!" + handle.read()
    except OSError:
        return None
    match = _EXEC_LINE.search(data.decode("utf-8", "replace"))
    program, argument = (
        (word.strip("\"'") if word else None for word in match.groups()) if match else (None, None)
    )
    return _Script(hashlib.sha256(data).hexdigest(), program, argument)


def _exec_target(script: _Script | None) -> Path | None:
    """The program a wrapper script ``exec``s, where it names one we can find without
    running the script (a literal path, or a name on PATH)."""
    if script is None or not script.program or any(c in script.program for c in "$`"):
        return None
    if os.path.isabs(script.program):
        return Path(script.program)
    found = shutil.which(script.program)
    return Path(found) if found else None


def _chain(named: Path, strict: bool) -> list[_Link]:
    """The files a call of ``named`` runs through: each wrapper script, then the real
    executable. ``strict``: a file that cannot be stat'ed raises its OSError (a compiler
    gone); else the chain stops before it (:func:`follow_wrapper`'s best effort)."""
    links: list[_Link] = []
    target: Path | None = named
    while target is not None and len(links) < _MAX_LINKS:
        real = target.resolve()
        try:
            stat = real.stat()
        except OSError as exc:
            if strict:
                raise OSError(exc.errno, exc.strerror, str(real)) from None
            break
        script = _script_at(real, stat)
        links.append(_Link(real, target.name, stat, script))
        target = _exec_target(script)
    return links


def _launched_name(links: list[_Link]) -> str | None:
    """The compiler a launcher at the end of the chain runs, as it names it: the name it
    was called by where that is not its own (``g++ -> ccache``), else the first argument
    of the wrapper that ran it (``exec ccache g++ "$@"``); None where it is no launcher or
    the compiler comes from the command line."""
    last = links[-1]
    if last.path.name not in _LAUNCHERS:
        return None
    if last.called != last.path.name:
        return last.called
    before = links[-2].script if len(links) > 1 else None
    argument = before.argument if before is not None else None
    if not argument or argument.startswith("-") or any(c in argument for c in "$`"):
        return None
    return argument


def _launched_compiler(name: str, launcher: Path) -> Path | None:
    """Where a launcher finds ``name``: a path as given, else the first executable of
    that name on PATH that is not the launcher itself (its masquerade link)."""
    if os.sep in name:
        return Path(name)
    for directory in os.get_exec_path():
        candidate = Path(directory, name)
        if (
            candidate.is_file()
            and os.access(candidate, os.X_OK)
            and candidate.resolve() != launcher
        ):
            return candidate
    return None


def _identity(named: Path, depth: int) -> str:
    """:attr:`Tool.identity` of ``named``; OSError naming the file of the chain that is
    gone."""
    links = _chain(named, strict=True)
    text = " -> ".join([os.path.abspath(named), *(link.describe() for link in links)])
    name = _launched_name(links)
    if name is None:
        return text
    compiler = _launched_compiler(name, links[-1].path)
    if compiler is None:
        return f"{text} runs {name} (not found on PATH)"
    if depth + 1 >= _MAX_LINKS:
        return f"{text} runs {compiler}"
    return f"{text} runs [{_identity(compiler, depth + 1)}]"


def follow_wrapper(path: Path) -> Path:
    """The real executable behind ``path``, following symlinks and `exec` wrapper scripts
    (the last file that exists, where one on the way is gone)."""
    links = _chain(path, strict=False)
    return links[-1].path if links else path.resolve()


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
    """The host CPU's instruction-set fingerprint, for keys of ``-march=native`` builds:
    ``<machine>:<words>``, the words sorted. x86: /proc/cpuinfo's ``flags``. AArch64: its
    ``Features`` and one ``core=<implementer>/<variant>/<part>`` word per distinct core,
    as GCC's ``-march=native`` there takes the architecture version from the core and
    only the extensions from the features. Only the machine where /proc/cpuinfo says
    neither.

    >>> host_isa()  # doctest: +SKIP
    'aarch64:aes asimd asimdhp core=0x41/0x1/0xd0c crc32 fp fphp pmull sha1 sha2'
    """
    machine = platform.machine()
    try:
        text = _CPUINFO.read_text()
    except OSError:
        return machine
    flags: list[str] | None = None
    cores = set()
    for block in text.split("\n\n"):  # one block per processor
        fields = {}
        for line in block.splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
        found = fields.get("flags", fields.get("Features"))
        if flags is None and found is not None:
            flags = found.split()
        if any(field in fields for field in _ARM_CORE_FIELDS):
            cores.add("core=" + "/".join(fields.get(field, "?") for field in _ARM_CORE_FIELDS))
    if flags is None and not cores:
        return machine
    return f"{machine}:{' '.join(sorted([*(flags or ()), *cores]))}"


def reset() -> None:
    """Forget what was found and read (tests that change PATH / CUDA_HOME call this)."""
    global _cxx, _cuda
    _cxx = None
    _cuda = None
    _scripts.clear()


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
