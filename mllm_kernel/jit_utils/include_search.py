"""Which headers a build saw, and whether the same ``#include`` would find the same file now.

The compilers report every header they opened (``-MD``). What the cache records
about each depends on who owns it:

* **Toolchain headers** (under the C++ compiler's built-in include directories,
  the CUDA toolkit's include directories, or tvm-ffi's): keyed by the identity of
  the compiler, nvcc + CUDA version and tvm-ffi version (see :mod:`.cache_key`),
  and fingerprinted by size and mtime (one ``stat``, no read), so that a libc or
  ``/usr/local/include`` upgrade without a compiler upgrade also rebuilds.
* **Every other header** (the package's, the user's, anything from ``-I``,
  ``-isystem``, ``extra_include_paths`` or ``CPATH``): hashed (sha256).

Editing a file is not the only way to change a build: a new file of the same name
in a directory searched earlier (``-I a -I b``, ``b/x.h`` included, then ``a/x.h``
created) shadows the recorded one. So each build records, for every header, the
names under which the search path could reach it and the first directory that
held each name; a lookup re-resolves those names (a directory listing per
directory and subdirectory, cached, no compiler spawned) and rebuilds when any
resolves elsewhere.

The search path is modelled as the compilers build it: the sources' own
directories (for ``#include "..."``), ``-iquote``, ``-I`` (the package's include
dir first), ``CPATH``, the CUDA toolkit's include dirs for ``.cu`` units,
``-isystem``, ``CPLUS_INCLUDE_PATH``, the compiler's built-in dirs, ``-idirafter``.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

from mllm_kernel.jit_utils import env, paths, toolchain
from mllm_kernel.jit_utils.spec import BuildSpec

# Option -> the group of the search path it adds to; nvcc's long spellings included.
_DIR_OPTIONS = {
    "-iquote": "quote",
    "-I": "include",
    "--include-path": "include",
    "-isystem": "system",
    "--system-include": "system",
    "-idirafter": "after",
}
# Longest first, so that "-isystem" is not read as "-i" + "system".
_JOINED_OPTIONS = sorted(_DIR_OPTIONS, key=len, reverse=True)


def _normal(path: str | Path) -> str:
    return os.path.normpath(os.path.abspath(path))


def directories_in_flags(flags: Sequence[str]) -> dict[str, list[str]]:
    """Absolute include directories named by ``flags``, by group.

    >>> directories_in_flags(["-O3", "-I", "/a", "-isystem/b", "--include-path=/c"])["include"]
    ['/a', '/c']
    """
    groups: dict[str, list[str]] = {"quote": [], "include": [], "system": [], "after": []}
    tokens = iter(flags)
    for token in tokens:
        for option in _JOINED_OPTIONS:
            if token == option:
                value = next(tokens, "")
            elif token.startswith(option + "=") and option.startswith("--"):
                value = token[len(option) + 1 :]
            elif token.startswith(option) and not option.startswith("--"):
                value = token[len(option) :]
            else:
                continue
            # Relative dirs would be relative to the throw-away staging directory.
            if os.path.isabs(value):
                groups[_DIR_OPTIONS[option]].append(_normal(value))
            break
    return groups


def _split_variable(name: str) -> list[str]:
    value = env.include_path_variables().get(name, "")
    return [_normal(p) for p in value.split(os.pathsep) if p and os.path.isabs(p)]


@functools.cache
def _builtin_dirs(compiler: str, identity: str) -> tuple[str, ...]:
    """The compiler's own ``#include <...>`` directories (spawns it: builds only)."""
    del identity  # part of the memo key: an upgraded compiler is asked again
    clean_env = {k: v for k, v in os.environ.items() if k not in env.INCLUDE_PATH_VARIABLES}
    proc = subprocess.run(
        [compiler, "-x", "c++", "-E", "-v", "-", "-o", os.devnull],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=clean_env,
        timeout=60,
        check=False,
    )
    dirs, inside = [], False
    for line in proc.stderr.splitlines():
        if line.startswith("#include <...> search starts here"):
            inside = True
        elif line.startswith("End of search list"):
            break
        elif inside:
            dirs.append(_normal(line.strip().removesuffix("(framework directory)").strip()))
    return tuple(dirs)


def builtin_dirs() -> tuple[str, ...]:
    cxx = toolchain.find_cxx()
    return _builtin_dirs(str(cxx.path), cxx.identity)


def _cuda_dirs() -> list[str]:
    home = toolchain.find_cuda().home
    found = [home / "include", *sorted(home.glob("targets/*/include"))]
    return [_normal(p) for p in found if p.is_dir()]


def toolchain_dirs(spec: BuildSpec) -> list[str]:
    """Directories whose headers belong to the toolchain (not hashed, see above)."""
    dirs = [*builtin_dirs(), *(_normal(p) for p in paths.tvm_ffi_include_dirs())]
    if spec.device == "cuda":
        dirs += _cuda_dirs()
    return dirs


def search_path(spec: BuildSpec, unit: Path) -> list[str]:
    """The directories an ``#include`` in ``unit`` is looked up in, in order."""
    is_cuda = unit.suffix == ".cu"
    flags = directories_in_flags(spec.cuda_flags if is_cuda else spec.cxx_flags)
    sources = spec.cuda_files if is_cuda else spec.cpp_files
    ordered = [
        *(_normal(p.parent) for p in sources),
        *flags["quote"],
        _normal(paths.include_dir()),
        *(_normal(p) for p in spec.include_paths),
        *flags["include"],
        *_split_variable("CPATH"),
        *(_cuda_dirs() if is_cuda else []),
        *(_normal(p) for p in paths.tvm_ffi_include_dirs()),
        *flags["system"],
        *_split_variable("CPLUS_INCLUDE_PATH"),
        *builtin_dirs(),
        *flags["after"],
    ]
    return list(dict.fromkeys(ordered))  # a directory searched twice counts at its first place


class _Listings:
    """Directory listings, each read once; a subdirectory is only read when its
    parent's listing has it (most (directory, subdirectory) pairs do not exist).

    ``mtimes`` records each directory read (its mtime, taken before the read; -1
    where it could not be read): a name can only resolve differently once one of
    them changed, since creating, removing or renaming an entry changes the mtime
    of its directory.
    """

    def __init__(self) -> None:
        self._memo: dict[tuple[str, str], frozenset[str]] = {}
        self.mtimes: dict[str, int] = {}

    def of(self, directory: str, subdir: str) -> frozenset[str]:
        key = (directory, subdir)
        entries = self._memo.get(key)
        if entries is None:
            up, _, last = subdir.rpartition(os.sep)
            entries = frozenset()
            if not subdir or last in self.of(directory, up):
                path = os.path.join(directory, subdir) if subdir else directory
                try:
                    self.mtimes[path] = os.stat(path).st_mtime_ns
                    entries = frozenset(os.listdir(path))
                except OSError:  # missing, not a directory, unreadable: holds nothing
                    self.mtimes.setdefault(path, -1)
            self._memo[key] = entries
        return entries


def _resolve(dirs: Sequence[str], names: Iterable[str]) -> tuple[dict[str, int], dict[str, int]]:
    """Each name -> the index of the first of ``dirs`` holding it (-1: none), and the
    mtimes of the directories read (see :class:`_Listings`).

    Directory listings and set intersections, not a stat per (directory, name):
    ~600 names over ~10 directories (a libstdc++ kernel) take about a millisecond.
    """
    listings = _Listings()
    by_parent: dict[str, set[str]] = {}
    for name in names:
        parent, _, base = name.rpartition(os.sep)
        by_parent.setdefault(parent, set()).add(base)
    found: dict[str, int] = {}
    for parent, remaining in by_parent.items():
        prefix = parent + os.sep if parent else ""
        for index, directory in enumerate(dirs):
            if not remaining:
                break
            hits = remaining.intersection(listings.of(directory, parent))
            for base in hits:
                found[prefix + base] = index
            remaining -= hits
        for base in remaining:
            found[prefix + base] = -1
    return found, listings.mtimes


def record(dirs: Sequence[str], headers: Iterable[str], toolchain: Sequence[str] = ()) -> dict:
    """What a lookup needs to tell whether ``headers`` would still be found where
    they were: ``{"dirs", "names", "listed"}``, recorded right after a build.

    ``names``: every name under which ``dirs`` reach one of ``headers`` -> the
    index of the first directory holding it. A toolchain header (under one of
    ``toolchain``) is named only relative to the deepest directory holding it
    (``vector``, not also ``c++/12/vector`` from ``/usr/include``): that is how it
    is included, and it halves the listings. ``listed``: the directories read,
    with their mtimes.
    """
    owned_by_toolchain = tuple(d + os.sep for d in toolchain)
    names = set()
    for header in headers:
        header = _normal(header)
        found = [header[len(d) + 1 :] for d in dirs if header.startswith(d + os.sep)]
        if found and header.startswith(owned_by_toolchain):
            found = [min(found, key=len)]
        names.update(found)
    resolved, listed = _resolve(dirs, names)
    return {"dirs": list(dirs), "names": resolved, "listed": listed}


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1


def shadowed(recorded: dict) -> str | None:
    """Why a recorded name now resolves elsewhere, or None if none does.

    Stats the listed directories first (~50, a tenth of a millisecond); only when
    one changed are the names resolved again.
    """
    if all(_mtime(path) == mtime for path, mtime in recorded["listed"].items()):
        return None
    dirs, names = recorded["dirs"], recorded["names"]
    now, _ = _resolve(dirs, names)
    for name, index in names.items():
        if now[name] != index:
            if now[name] < 0:
                return f"{name} is no longer found in the include path"
            return f"{os.path.join(dirs[now[name]], name)} now shadows the {name} the build used"
    return None


def toolchain_fingerprint(path: str) -> str:
    """Size and mtime of a toolchain header (a stat, no read)."""
    stat = os.stat(path)
    return f"{stat.st_size}:{stat.st_mtime_ns}"
