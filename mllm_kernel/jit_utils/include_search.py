"""Which headers a build saw, and whether the same ``#include`` would find the same file now.

The compilers report every header they opened (``-MD``). What the cache records
about each depends on who owns it:

* **Toolchain headers** (under the C++ compiler's built-in include directories,
  the CUDA toolkit's include directories, or tvm-ffi's): keyed by the identity of
  the compiler, nvcc + CUDA version and tvm-ffi version (see :mod:`.cache_key`),
  and fingerprinted by their stat and content (see :mod:`.build_inputs`), so that a
  libc or ``/usr/local/include`` upgrade without a compiler upgrade also rebuilds.
* **Every other header** (the package's, the user's, anything from ``-I``,
  ``-isystem``, ``extra_include_paths`` or ``CPATH``): hashed (sha256).

Editing a file is not the only way to change a build: a new file of the same name
in a directory searched earlier (``-I a -I b``, ``b/x.h`` included, then ``a/x.h``
created) shadows the recorded one. So each build records, for every header, the
names under which the search path could reach it and the first directory that
held each name; a lookup re-resolves those names (a directory listing per
directory and subdirectory, cached, no compiler spawned) and rebuilds when any
resolves elsewhere.

Two lookups are not in the compilers' dependency output, so the sources and
headers outside the toolchain are read for them (:func:`directives`):

* ``#include "x.h"`` looks first in the directory of the file that includes it: a
  ``x.h`` created there later shadows the one the search path found. Each such
  directory gets a search of its own, itself first (:func:`record_includers`).
* ``__has_include(<x.h>)`` probes a name that may not exist at build time: the
  names it probes are recorded with the rest, found or not, so a header created
  later rebuilds.

The search path is modelled as the compilers build it: the sources' own
directories (for ``#include "..."``), ``-iquote``, ``-I`` (the package's include
dir first), ``CPATH``, the CUDA toolkit's include dirs for ``.cu`` units,
``-isystem``, ``CPLUS_INCLUDE_PATH``, the compiler's built-in dirs, ``-idirafter``.
"""

from __future__ import annotations

import functools
import os
import re
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
    """Directories whose headers belong to the toolchain (fingerprinted, see above)."""
    return toolchain_dirs_of(cuda=spec.device == "cuda")


def toolchain_dirs_of(*, cuda: bool) -> list[str]:
    """The C++ compiler's built-in dirs, tvm-ffi's, and with ``cuda`` the toolkit's."""
    dirs = [*builtin_dirs(), *(_normal(p) for p in paths.tvm_ffi_include_dirs())]
    return dirs + _cuda_dirs() if cuda else dirs


def search_path(spec: BuildSpec, unit: Path) -> list[str]:
    """The directories an ``#include`` in ``unit`` (a generated unit of ``spec``) is
    looked up in, in order."""
    is_cuda = unit.suffix == ".cu"
    return search_path_of(
        source_dirs=[p.parent for p in (spec.cuda_files if is_cuda else spec.cpp_files)],
        flags=spec.cuda_flags if is_cuda else spec.cxx_flags,
        include_paths=[paths.include_dir(), *spec.include_paths],
        is_cuda=is_cuda,
        tvm_ffi=True,
    )


def search_path_of(
    *,
    source_dirs: Iterable[str | Path],
    flags: Sequence[str],
    include_paths: Iterable[str | Path],
    is_cuda: bool,
    tvm_ffi: bool,
) -> list[str]:
    """The search path the compilers build: the sources' own directories (for
    ``#include "..."``), ``-iquote``, ``include_paths`` (our ``-I``), the ``-I`` of
    ``flags``, ``CPATH``, the CUDA toolkit's dirs (``is_cuda``), tvm-ffi's dirs
    (``tvm_ffi``: passed as ``-isystem``), ``-isystem``, ``CPLUS_INCLUDE_PATH``, the C++
    compiler's built-in dirs, ``-idirafter``."""
    groups = directories_in_flags(flags)
    ordered = [
        *(_normal(p) for p in source_dirs),
        *groups["quote"],
        *(_normal(p) for p in include_paths),
        *groups["include"],
        *_split_variable("CPATH"),
        *(_cuda_dirs() if is_cuda else []),
        *((_normal(p) for p in paths.tvm_ffi_include_dirs()) if tvm_ffi else ()),
        *groups["system"],
        *_split_variable("CPLUS_INCLUDE_PATH"),
        *builtin_dirs(),
        *groups["after"],
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


def record(
    dirs: Sequence[str],
    headers: Iterable[str],
    toolchain: Sequence[str] = (),
    probed: Iterable[str] = (),
) -> dict:
    """What a lookup needs to tell whether ``headers`` would still be found where
    they were: ``{"dirs", "names", "listed"}``, recorded right after a build.

    ``names``: every name under which ``dirs`` reach one of ``headers`` -> the
    index of the first directory holding it, and each name of ``probed`` (the
    ``<...>`` names the sources include or probe with ``__has_include``; -1 where
    none holds it). A toolchain header (under one of ``toolchain``) is named only
    relative to the deepest directory holding it (``vector``, not also
    ``c++/12/vector`` from ``/usr/include``): that is how it is included, and it
    halves the listings. ``listed``: the directories read, with their mtimes.
    """
    owned_by_toolchain = tuple(d + os.sep for d in toolchain)
    names = {name for name in probed if _is_relative_name(name)}
    for header in headers:
        header = _normal(header)
        found = [header[len(d) + 1 :] for d in dirs if header.startswith(d + os.sep)]
        if found and header.startswith(owned_by_toolchain):
            found = [min(found, key=len)]
        names.update(found)
    resolved, listed = _resolve(dirs, names)
    return {"dirs": list(dirs), "names": resolved, "listed": listed}


def record_includers(dirs: Sequence[str], quoted: dict[str, set[str]]) -> list[dict]:
    """One :func:`record` per directory of ``quoted`` (a directory holding sources or
    headers -> the ``"..."`` names they include or probe): its search is that
    directory first, then ``dirs``, as for an ``#include "..."`` written there."""
    units = []
    for directory, names in sorted(quoted.items()):
        own = [_normal(directory), *(d for d in dirs if d != _normal(directory))]
        units.append(record(own, (), probed=names))
    return units


# `#include "x.h"`, `#include <x.h>`, `#include_next <x.h>`, `__has_include(<x.h>)`,
# `__has_include_next("x.h")`: the delimiter and the name. A macro (`#include FOO_H`)
# is not read: what it named is in the compiler's dependency output, if it was found.
_DIRECTIVE = re.compile(
    rb"(?:^[ \t]*#[ \t]*include(?:_next)?[ \t]*|__has_include(?:_next)?[ \t]*\([ \t]*)"
    rb'(?:"([^"\n]+)"|<([^>\n]+)>)',
    re.MULTILINE,
)


def directives(text: bytes) -> tuple[set[str], set[str]]:
    r"""The ``("..." names, <...> names)`` that ``text`` includes or probes with
    ``__has_include``, in any branch of an ``#if`` (a name that is never included
    only costs a rebuild when a file of that name appears).

    >>> directives(b'#include "a.h"\n#if __has_include(<b.h>)\n# include <b.h>\n#endif')
    ({'a.h'}, {'b.h'})
    """
    quoted, angled = set(), set()
    for match in _DIRECTIVE.finditer(text):
        if match[1] is not None:
            quoted.add(match[1].decode(errors="replace").strip())
        else:
            angled.add(match[2].decode(errors="replace").strip())
    return quoted, angled


def _is_relative_name(name: str) -> bool:
    """A name an include search resolves (an absolute one is opened as it is)."""
    return bool(name) and not os.path.isabs(name) and "\0" not in name


def _mtime(path: str, memo: dict[str, int]) -> int:
    mtime = memo.get(path)
    if mtime is None:
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            mtime = -1
        memo[path] = mtime
    return mtime


def shadowed(recorded: dict, mtimes: dict[str, int] | None = None) -> tuple[str | None, dict]:
    """``(why a recorded name now resolves elsewhere or None, the listed directories'
    listed now)``; these differ from the recorded ones only where a directory
    changed without changing what any name resolves to (a reinstall, say): the
    caller may record them, so the next lookup skips the resolving again.

    Stats the listed directories first (~50, a tenth of a millisecond; ``mtimes``
    memoizes the stats across the units of one lookup); only when one changed are the
    names resolved again.
    """
    memo = {} if mtimes is None else mtimes
    listed = recorded["listed"]
    now_listed = {path: _mtime(path, memo) for path in listed}
    if now_listed == listed:
        return None, listed
    dirs, names = recorded["dirs"], recorded["names"]
    now, relisted = _resolve(dirs, names)
    for name, index in names.items():
        if now[name] != index:
            if now[name] < 0:
                return f"{name} is no longer found in the include path", listed
            found = os.path.join(dirs[now[name]], name)
            if index < 0:
                return f"{found} now exists (the build found no {name})", listed
            return f"{found} now shadows the {name} the build used", listed
    # Read again: a directory created since (a new subdirectory) is listed now.
    return None, relisted
