"""What a build read, as its manifest records it, and whether a build now would read the same.

The key covers what is known before compiling (flags, template arguments, the
compilers); the manifest keeps three records of what the compilers then read:

* ``deps``: every source and header outside the toolchain, by the path the compiler
  opened it under (as named: a symlink on the way stays in the path, so pointing it
  elsewhere is seen) -> the sha256 of its content, checked on every lookup.
* ``toolchain_deps``: the toolchain's headers (the compilers', CUDA's, tvm-ffi's:
  :func:`.include_search.toolchain_dirs`) -> ``size:mtime:ctime:inode:sha256``. A
  lookup stats them and hashes only a header whose stat differs. No user can set a
  ctime, so every edit is seen (one that puts the size and the mtime back too), and a
  reinstall of the same files (``pip --force-reinstall``) costs a hash per header and
  no rebuild; the lookup then records the new stats (:attr:`Verdict.refreshed`).
* ``include_search``: how each name resolved, per search path, including the names
  probed with ``__has_include`` and the ``"..."`` lookups next to each includer
  (:mod:`.include_search`).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mllm_kernel.jit_utils import include_search, paths, trust

_CHUNK = 1 << 20


def file_digest(path: str | Path) -> str:
    """The sha256 of the regular file ``path`` (a symlink is followed); NotRegularFile
    (an OSError) for a FIFO or a device, which could block or never end."""
    fd, _ = trust.open_regular(Path(path), follow=True)
    try:
        return fd_digest(fd)
    finally:
        os.close(fd)


def fd_digest(fd: int) -> str:
    """The sha256 of what is left to read at ``fd``."""
    digest = hashlib.sha256()
    for chunk in iter(lambda: os.read(fd, _CHUNK), b""):
        digest.update(chunk)
    return digest.hexdigest()


def _read(path: str) -> bytes:
    """The content of the regular file ``path`` (see :func:`file_digest`)."""
    fd, _ = trust.open_regular(Path(path), follow=True)
    try:
        return b"".join(iter(lambda: os.read(fd, _CHUNK), b""))
    finally:
        os.close(fd)


def _stat_part(info: os.stat_result) -> str:
    return f"{info.st_size}:{info.st_mtime_ns}:{info.st_ctime_ns}:{info.st_ino}"


def fingerprint(path: str) -> str:
    """``size:mtime:ctime:inode:sha256`` of a toolchain header: its stat and its content,
    from one descriptor."""
    fd, info = trust.open_regular(Path(path), follow=True)
    try:
        return f"{_stat_part(info)}:{fd_digest(fd)}"
    finally:
        os.close(fd)


@dataclass
class BuildInputs:
    """The manifest's records of what a build read (see the module docstring)."""

    deps: dict[str, str] = field(default_factory=dict)
    toolchain_deps: dict[str, str] = field(default_factory=dict)
    include_search: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class CompiledUnit:
    """One compiler run, as :func:`record` needs it: the files it opened (as it named
    them: relative ones joined to the directory it ran in, never resolved), its search
    path (in order), and the text of a unit that was not opened from a lasting file
    (generated, or source text), whose directives count too."""

    opened: Sequence[str]
    dirs: Sequence[str]
    text: bytes = b""


# The digest recorded for a file written while the compilers ran: it matches no content,
# so the next lookup finds the file changed and builds again (the build may have read the
# file before the edit, or half of it).
CHANGED_WHILE_COMPILING = "changed-while-compiling"


def record(
    units: Sequence[CompiledUnit], toolchain_dirs: Sequence[str], *, started_ns: int
) -> BuildInputs:
    """The records of a build, right after it (see the module docstring). ``started_ns``:
    the wall clock (``time.time_ns()``) before the compilers started; a file written
    since is recorded as :data:`CHANGED_WHILE_COMPILING`, not by its new content, which
    the build may not have read (:func:`_written_during`)."""
    owned_by_toolchain = tuple(d + os.sep for d in toolchain_dirs)
    inputs = BuildInputs()
    window = (started_ns, time.time_ns())
    for unit in units:
        quoted_by_dir: dict[str, set[str]] = {}
        quoted, angled = include_search.directives(unit.text)
        probed = quoted | angled  # the unit's own directory is thrown away: dirs only
        for path in unit.opened:
            if os.path.normpath(path).startswith(owned_by_toolchain):
                if path not in inputs.toolchain_deps:
                    # A stat no file has, so that the lookup hashes the header again.
                    inputs.toolchain_deps[path] = (
                        f"0:0:0:0:{CHANGED_WHILE_COMPILING}"
                        if _written_during(path, window)
                        else fingerprint(path)
                    )
                continue
            text = _read(path)
            inputs.deps[path] = (
                CHANGED_WHILE_COMPILING
                if _written_during(path, window)
                else hashlib.sha256(text).hexdigest()
            )
            quoted, angled = include_search.directives(text)
            # "..." is looked up next to the includer as the compiler named it.
            quoted_by_dir.setdefault(os.path.dirname(path), set()).update(quoted)
            probed |= angled
        inputs.include_search.append(
            include_search.record(unit.dirs, unit.opened, toolchain_dirs, probed=probed)
        )
        inputs.include_search += include_search.record_includers(unit.dirs, quoted_by_dir)
    return inputs


def _written_during(path: str, window: tuple[int, int]) -> bool:
    """Whether ``path``'s mtime lies in ``window`` (start, end: wall-clock ns). A file's
    mtime comes from the kernel's coarse clock, a few ms behind the wall clock, so an
    edit that early in a build can pass unseen, and an edit before it never counts; an
    mtime past the end is clock skew (a file unpacked from a machine whose clock runs
    ahead), not an edit, and counts neither: it would rebuild on every lookup."""
    start, end = window
    return start < os.stat(path).st_mtime_ns <= end


def scan_includes(
    text: bytes, dirs: Sequence[str], toolchain_dirs: Sequence[str], directory: str | None = None
) -> list[str]:
    """The files ``text`` includes, directly or through headers outside the toolchain,
    found by reading the directives as a compiler resolves them (``"..."`` next to the
    includer, ``directory`` for ``text`` itself, then ``dirs``; ``<...>`` in ``dirs``):
    for a compiler that reports none (NVRTC). Every branch of an ``#if`` counts; a name
    found nowhere is left out (:func:`record` records it as missing)."""
    owned_by_toolchain = tuple(d + os.sep for d in toolchain_dirs)
    found: list[str] = []
    pending = [(text, directory)]
    while pending:
        text, here = pending.pop()
        quoted, angled = include_search.directives(text)
        for name, search in [
            *((n, [here, *dirs] if here else dirs) for n in sorted(quoted)),
            *((n, dirs) for n in sorted(angled)),
        ]:
            path = next(
                (os.path.join(d, name) for d in search if os.path.isfile(os.path.join(d, name))),
                None,
            )
            if path is None or path in found:
                continue
            found.append(path)
            if not os.path.normpath(path).startswith(owned_by_toolchain):
                pending.append((_read(path), os.path.dirname(path)))
    return found


@dataclass
class Verdict:
    """Whether a build's inputs are unchanged: ``reason`` says what changed (None:
    nothing did). ``refreshed``: the records to write back when nothing changed but
    some stats did (None: none did), so the next lookup skips the hashing."""

    reason: str | None = None
    refreshed: BuildInputs | None = None


def check(inputs: BuildInputs, *, toolchain: bool = True) -> Verdict:
    """Compares ``inputs`` (a manifest's records) with the files now. ``toolchain``:
    check the toolchain's headers and the include search too (a prebuilt entry skips
    them: no compiler runs here, see :mod:`.cache_key`)."""
    refreshed_deps: dict[str, str] = {}  # only the headers whose stat changed
    stats_changed = False
    for dep, recorded in inputs.toolchain_deps.items() if toolchain else ():
        try:
            if _stat_part(os.stat(dep)) == recorded.rpartition(":")[0]:
                continue
            now = fingerprint(dep)
        except trust.NotRegularFile as exc:
            return Verdict(str(exc))
        except OSError:
            return Verdict(f"{dep} no longer exists")
        if now.rpartition(":")[2] != recorded.rpartition(":")[2]:
            return Verdict(f"{dep} changed")
        refreshed_deps[dep], stats_changed = now, True
    searches = []
    mtimes: dict[str, int] = {}
    for unit in inputs.include_search if toolchain else ():
        reason, listed = include_search.shadowed(unit, mtimes)
        if reason:
            return Verdict(reason)
        stats_changed |= listed is not unit["listed"]
        searches.append({**unit, "listed": listed})
    for dep, digest in inputs.deps.items():
        try:  # a prebuilt entry names the package's files by anchor (paths.anchored)
            if file_digest(paths.unanchored(dep)) != digest:
                return Verdict(f"{dep} changed")
        except trust.NotRegularFile as exc:
            return Verdict(str(exc))
        except OSError:
            return Verdict(f"{dep} no longer exists")
    if not stats_changed:
        return Verdict()
    toolchain_deps = {**inputs.toolchain_deps, **refreshed_deps}
    return Verdict(refreshed=BuildInputs(inputs.deps, toolchain_deps, searches))
