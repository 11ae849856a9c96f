"""Which cache paths may be loaded: only what the current user (or root) could have written.

A cache entry is a shared library that runs code in the loading process, so an
entry another local user could have planted or edited must never be loaded. The
rule, checked before any dlopen:

* **writable cache** (``MLLM_KERNEL_CACHE_DIR``, default ``~/.cache/mllm_kernel``):
  the cache root, the entry directory, its manifest and its artifact are owned by
  the current user or root, and none is writable by group or others. The entry,
  the manifest and the artifact are not symlinks (the root may be one: it is the
  user's own setting). A root that fails the rule, or that this process cannot
  create (a missing parent on a read-only or pseudo filesystem, a file in the way,
  EACCES, EROFS), is not used at all: one WARNING names
  ``MLLM_KERNEL_CACHE_DIR``, the path, what is wrong and the fix, and the process
  builds into the private default root under the user's home instead
  (:func:`choose_root`; CacheRootError naming both when that fails too).
* **read-only caches** (``MLLM_KERNEL_CACHE_PATH`` and installed cache packages,
  searched first): the owner may be anyone (a prebuilt cache installed by an image
  build or by pip is owned by whoever installed it, and naming the directory or
  installing the package is the user's decision, as with ``PATH``), but nothing on
  the way may be writable by group or others.

What the package creates is private: directories 0700, files with the process
umask but never group- or world-writable, written without following a symlink.
What it reads is a regular file, checked on the descriptor before a byte is read
(:func:`open_regular`): a FIFO or a device planted in the cache is never read from.

The checks are one ``stat`` per path (four per warm load: root, entry, manifest,
artifact), on descriptors the loader opens anyway where it can.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import stat
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from mllm_kernel.jit_utils import env
from mllm_kernel.jit_utils.errors import CacheRootError
from mllm_kernel.jit_utils.logging_setup import get_logger

_logger = get_logger()
_GROUP_OR_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH
_WRITERS = {
    stat.S_IWGRP: "its group",
    stat.S_IWOTH: "everyone",
    _GROUP_OR_OTHER_WRITE: "group and others",
}
PRIVATE_DIR_MODE = 0o700
FILE_MODE = 0o644  # further narrowed by the umask, never widened


class UntrustedPath(PermissionError):
    """A cache path another local user could have written (or a symlink where none may be).

    The message names the path, its owner and mode, and the fix.
    """

    def __init__(self, message: str, path: Path) -> None:
        super().__init__(errno.EACCES, message, str(path))
        self.message = message

    def __str__(self) -> str:
        return self.message


def owner_name(uid: int) -> str:
    """``"name (uid N)"``, or ``"uid N"`` for a uid with no passwd entry."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def describe(info: os.stat_result) -> str:
    """``"owner alice (uid 1000), mode 0777"``."""
    return f"owner {owner_name(info.st_uid)}, mode {stat.S_IMODE(info.st_mode):04o}"


def problem(info: os.stat_result, *, any_owner: bool = False) -> str | None:
    """Why a path with this ``lstat`` result may not be trusted, or None if it may.

    ``any_owner``: the read-only-cache rule (the owner is not checked).
    """
    if stat.S_ISLNK(info.st_mode):
        return "is a symlink"
    if not any_owner and info.st_uid not in (os.geteuid(), 0):
        return f"is owned by {owner_name(info.st_uid)}, not by you or root"
    writable = info.st_mode & _GROUP_OR_OTHER_WRITE
    if writable:
        return f"is writable by {_WRITERS[writable]}"
    return None


def fix_for(path: Path, reason: str) -> str:
    """The commands that make ``path`` trusted, for a ``reason`` from :func:`problem`."""
    private = "or point MLLM_KERNEL_CACHE_DIR at a directory only you can write"
    if reason.startswith("is owned by"):
        return f"remove it (rm -rf {path}) or take it over (chown -R $USER {path}), {private}"
    if reason.startswith("is writable"):
        return f"chmod -R go-w {path}, {private}"
    return f"remove it (rm {path}), {private}"


def explain(path: Path, info: os.stat_result, reason: str) -> str:
    """One sentence for a WARNING or an error: path, what is wrong, owner, mode, fix."""
    return (
        f"{path} {reason} ({describe(info)}): another local user could have written it. "
        f"Fix: {fix_for(path, reason)}"
    )


def check_dir(path: Path, *, any_owner: bool = False, follow: bool = False) -> str | None:
    """:func:`explain` text if directory ``path`` fails the rule, None if it passes or is
    missing. ``follow``: check what a symlink points at (the root only)."""
    try:
        info = os.stat(path) if follow else os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(info.st_mode) and not stat.S_ISLNK(info.st_mode):
        return f"{path} is not a directory ({describe(info)}). Fix: remove it (rm {path})"
    reason = problem(info, any_owner=any_owner)
    return None if reason is None else explain(path, info, reason)


def private_dir(path: Path, *, follow: bool = False) -> Path:
    """``path`` as a directory of ours: created 0700 (with any missing parents) or, if it
    exists, checked against the rule (``follow``: through a symlink, for the root; else a
    symlink fails). Raises UntrustedPath when it fails; a creation race lost to another
    user fails the check."""
    missing = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, PRIVATE_DIR_MODE)
    reason = check_dir(path, follow=follow)
    if reason is not None:
        raise UntrustedPath(reason, path)
    return path


def open_nofollow(path: Path, flags: int, mode: int = FILE_MODE) -> int:
    """``os.open`` that refuses a symlink at ``path`` (UntrustedPath, not ELOOP)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise UntrustedPath(
            f"{path} is a symlink where the cache keeps a file; not followed. Fix: remove it "
            f"(rm {path})",
            path,
        ) from None


class NotRegularFile(OSError):
    """A path the cache reads that is not a regular file: opening a FIFO blocks until a
    writer comes, and reading a device (``/dev/zero``) may never end, so neither is read."""

    def __init__(self, path: Path, info: os.stat_result) -> None:
        super().__init__(f"{path} is {_kind(info.st_mode)}, not a regular file")


_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((kind for test, kind in _KINDS if test(mode)), f"of type {stat.S_IFMT(mode):o}")


def open_regular(path: Path, *, follow: bool = False) -> tuple[int, os.stat_result]:
    """A read-only descriptor of the regular file ``path``, and its ``fstat``.

    The open does not block (``O_NONBLOCK``: a FIFO there would otherwise wait for a
    writer forever), and anything but a regular file raises NotRegularFile before a byte
    is read. ``follow``: through a symlink (a source or header named by a manifest);
    else a symlink raises UntrustedPath (a file the cache keeps).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK
    fd = os.open(path, flags | os.O_CLOEXEC) if follow else open_nofollow(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(path, info)
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def write_file(path: Path, text: str) -> None:
    """Writes ``text`` to ``path`` through a new file renamed over it: a symlink planted
    at ``path`` is replaced, never written through."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def drop_group_other_write(directory: Path) -> None:
    """Clears the group/other write bits of ``directory``'s files (a linker creates the
    artifact with the umask, which may be 002); links are left alone."""
    for entry in os.scandir(directory):
        info = entry.stat(follow_symlinks=False)
        if stat.S_ISREG(info.st_mode) and info.st_mode & _GROUP_OR_OTHER_WRITE:
            os.chmod(entry.path, stat.S_IMODE(info.st_mode) & ~_GROUP_OR_OTHER_WRITE)


_warned: set[tuple[str, str]] = set()
_warned_guard = threading.Lock()


def warn_once(path: Path, message: str) -> None:
    """Logs ``message`` as a WARNING the first time it is said about ``path``."""
    with _warned_guard:
        if (str(path), message) in _warned:
            return
        _warned.add((str(path), message))
    _logger.warning("%s", message)


ROOT_VARIABLE = "MLLM_KERNEL_CACHE_DIR"


@dataclass(frozen=True)
class RootChoice:
    """Which cache root builds go to: ``root``, and when that is not the ``configured`` one
    (``MLLM_KERNEL_CACHE_DIR``), the ``problem`` with it (what is wrong, and the fix)."""

    configured: Path
    root: Path
    problem: str | None = None

    @property
    def fallback(self) -> bool:
        return self.problem is not None

    def warning(self) -> str:
        """The WARNING a fallback logs: both roots, what is wrong, and the fix."""
        return (
            f"using {self.root} instead of the cache at {self.configured} "
            f"({ROOT_VARIABLE}): {self.problem}"
        )


def _os_error(exc: OSError) -> str:
    """``"No such file or directory (ENOENT)"``."""
    name = errno.errorcode.get(exc.errno or 0, f"errno {exc.errno}")
    return f"{exc.strerror or exc} ({name})"


def _file_in_the_way(root: Path) -> Path | None:
    """The nearest parent of ``root`` that exists and is not a directory, if any."""
    for parent in root.parents:
        if parent.exists() or parent.is_symlink():
            return None if parent.is_dir() else parent
    return None


def _unusable(root: Path) -> str | None:
    """Why this process cannot create the directory ``root`` (the OS error), or None when
    it exists or could be created (private, with its missing parents, as a build would).
    An existing root is not probed for writing: a read-only warm cache still serves its
    entries, and a build into it fails with its own clear error."""
    if root.is_dir():
        return None
    try:
        private_dir(root, follow=True)
    except UntrustedPath as exc:  # created, but by another user in a race
        return exc.message
    except NotADirectoryError as exc:
        in_the_way = _file_in_the_way(root)
        if in_the_way is None:
            return f"cannot create {root}: {_os_error(exc)}"
        return f"cannot create {root}: {in_the_way} is a file, not a directory (ENOTDIR)"
    except OSError as exc:
        failed = exc.filename or root
        creating = f" (creating {failed})" if str(failed) != str(root) else ""
        return f"cannot create {root}{creating}: {_os_error(exc)}"
    return None


def root_problem(root: Path) -> tuple[str, bool] | None:
    """``(why root cannot be the cache root builds go to, whether that text already
    says the fix)``, or None when it can be.

    It must pass the trust rule (:func:`check_dir`, through a symlink; the text says the
    fix) and be a directory, or one this process can create (the text is the OS error;
    see :func:`_unusable`).
    """
    try:
        reason = check_dir(root, follow=True)
    except NotADirectoryError:
        reason = None  # a file on the way: _unusable names it
    except OSError as exc:  # a parent that cannot be searched
        return f"cannot look at {root}: {_os_error(exc)}", False
    if reason is not None:
        return reason, True
    unusable = _unusable(root)
    return None if unusable is None else (unusable, False)


_USABLE = "a directory you can create and write"


def choose_root() -> RootChoice:
    """The cache root builds go to and why: ``env.cache_root()`` when
    :func:`root_problem` finds nothing wrong with it, else the private default root under
    the user's home (when that one is usable). Raises CacheRootError naming both roots,
    what is wrong with each and the fix, when neither is."""
    configured = env.cache_root()
    problem = root_problem(configured)
    if problem is None:
        return RootChoice(configured, configured)
    reason, says_fix = problem
    fallback = env.default_cache_root()
    if fallback == configured:
        fix = "" if says_fix else f". Fix: set {ROOT_VARIABLE} to {_USABLE}"
        raise CacheRootError(f"the cache root {configured} cannot be used: {reason}{fix}")
    fallback_problem = root_problem(fallback)
    if fallback_problem is not None:
        raise CacheRootError(
            f"no cache root can be used: {ROOT_VARIABLE}={configured}: {reason}; and the "
            f"default {fallback}, tried instead: {fallback_problem[0]}. Fix: point "
            f"{ROOT_VARIABLE} at {_USABLE}"
        )
    if not says_fix:
        reason += f". Fix: point {ROOT_VARIABLE} at {_USABLE}, or unset it to use {fallback}"
    return RootChoice(configured, fallback, reason)


def writable_root() -> Path:
    """The cache root builds go to (:func:`choose_root`): the configured one, or with a
    WARNING (once per root and reason) the private default under the user's home. Raises
    CacheRootError when neither can be used."""
    choice = choose_root()
    if choice.fallback:
        warn_once(choice.configured, choice.warning())
    return choice.root
