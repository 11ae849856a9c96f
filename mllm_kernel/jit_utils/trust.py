"""Which cache paths may be loaded: only what the current user (or root) could have written.

A cache entry is a shared library that runs code in the loading process, so an
entry another local user could have planted or edited must never be loaded. The
rule, checked before any dlopen:

* **writable cache** (``MLLM_KERNEL_CACHE_DIR``, default ``~/.cache/mllm_kernel``,
  and a ``build_directory``): the cache root, the entry directory, its manifest and
  its artifact are owned by the current user or root, and none is writable by group
  or others. The entry, the manifest and the artifact are not symlinks (the root may
  be one: it is the user's own setting). A root that fails the rule, or that this
  process cannot create (a missing parent on a read-only or pseudo filesystem, a file
  in the way, EACCES, EROFS), is not used at all: one WARNING names
  ``MLLM_KERNEL_CACHE_DIR``, the path, what is wrong and the fix, and the process
  builds into the private default root under the user's home instead
  (:func:`choose_root`; CacheRootError naming both when that fails too). A
  ``build_directory`` that fails is an error instead: it was asked for by name.
* **every directory the root's path passes through** (its parents as named, and the
  directories a symlink on the way leads through, up to ``/``) is owned by the user
  or root and not writable by group or others unless it has the sticky bit (``/tmp``,
  1777). Otherwise its owner, or anyone who can write it, can rename the root away
  and put a directory of their own in its place between the check and the
  ``dlopen``, which resolves the path again: no check of the root itself can close
  that race (:func:`check_root`). A symlink on the way that lies in a sticky
  directory others can write must be owned by the user or root, as the kernel's
  ``protected_symlinks`` asks. A root whose path passes is remembered for the
  process (a directory only the user or root can write cannot be changed by another
  user later), so a warm load stats the root alone.
* **read-only caches** (``MLLM_KERNEL_CACHE_PATH`` and installed cache packages,
  searched first): the same rule, root, entries and parents alike, except that the
  owners named in ``MLLM_KERNEL_TRUSTED_CACHE_OWNERS`` (user names or uids) are
  trusted as the user's own would be: a prebuilt cache installed by an image build or
  by pip as another user is used only when the user says they trust that user. What
  is writable by group or others is refused whoever owns it.

What the package creates is private: directories 0700, files with the process
umask but never group- or world-writable, written without following a symlink.
What it reads is a regular file, checked on the descriptor before a byte is read
(:func:`open_regular`): a FIFO or a device planted in the cache is never read from.

The checks are one ``stat`` per path (four per warm load: root, entry, manifest,
artifact, plus the root's parents once per process), on descriptors the loader opens
anyway where it can.
"""

from __future__ import annotations

import contextlib
import errno
import functools
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
ROOT_VARIABLE = "MLLM_KERNEL_CACHE_DIR"
TRUSTED_OWNERS_VARIABLE = "MLLM_KERNEL_TRUSTED_CACHE_OWNERS"
_MAX_SYMLINKS = 40  # the kernel's own limit (ELOOP) on symlinks in one path


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


def trusted_uids(*, read_only: bool = False) -> frozenset[int]:
    """The owners a cache path may have: the current user and root, and for a read-only
    cache (``read_only``) also the users named in ``MLLM_KERNEL_TRUSTED_CACHE_OWNERS``:
    a prebuilt cache made by another user (an image build, pip run as another user) is
    used only when the user says they trust that user."""
    own = frozenset((os.geteuid(), 0))
    return own | _named_uids(env.trusted_cache_owners()) if read_only else own


@functools.lru_cache(maxsize=16)  # keyed by the variable's value: resolved once per value
def _named_uids(names: tuple[str, ...]) -> frozenset[int]:
    """The uids of ``names`` (user names or numeric uids, which need no passwd entry: a
    container's build user often has none). An unknown name is left out with a WARNING
    rather than an error: trusting fewer owners is the safe side of a typo, and the
    refused entries' WARNINGs then say what is not used."""
    uids = set()
    for name in names:
        if name.isascii() and name.isdigit():
            uids.add(int(name))
            continue
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            warn_once(
                Path(TRUSTED_OWNERS_VARIABLE),
                f"{TRUSTED_OWNERS_VARIABLE}: no user named {name!r} on this machine, so "
                "caches it owns are not trusted. Fix: give user names from /etc/passwd or "
                f"numeric uids, comma-separated (e.g. {TRUSTED_OWNERS_VARIABLE}=builder,1001)",
            )
    return frozenset(uids)


def _foreign_owner(uid: int, *, read_only: bool) -> str:
    """The :func:`problem` text for an owner outside :func:`trusted_uids`; for a read-only
    cache it names the variable that would trust them."""
    if read_only:
        trusted = f"not by you, root or an owner in {TRUSTED_OWNERS_VARIABLE}"
        return f"is owned by {owner_name(uid)}, {trusted}"
    return f"is owned by {owner_name(uid)}, not by you or root"


def problem(info: os.stat_result, *, any_owner: bool = False) -> str | None:
    """Why a path with this ``lstat`` result may not be trusted, or None if it may.

    ``any_owner``: the read-only-cache rule, under which the owners named in
    ``MLLM_KERNEL_TRUSTED_CACHE_OWNERS`` are trusted too (:func:`trusted_uids`). The
    keyword is the one :mod:`.cache` passes; it dates from when any owner was trusted.
    """
    if stat.S_ISLNK(info.st_mode):
        return "is a symlink"
    if info.st_uid not in trusted_uids(read_only=any_owner):
        return _foreign_owner(info.st_uid, read_only=any_owner)
    writable = info.st_mode & _GROUP_OR_OTHER_WRITE
    if writable:
        return f"is writable by {_WRITERS[writable]}"
    return None


def _trust_owner_fix(uid: int) -> str:
    """How to trust a read-only cache's owner: the variable, with their name or uid."""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return f"if you trust {owner_name(uid)}, set {TRUSTED_OWNERS_VARIABLE}={name}"


def fix_for(path: Path, reason: str, owner: int | None = None, *, shared: bool = False) -> str:
    """The commands that make ``path`` trusted, for a ``reason`` from :func:`problem`
    (``owner``: the path's uid, named in the fix for a read-only cache's owner;
    ``shared``: the path is a sticky directory such as /tmp, whose mode must stay)."""
    private = "or point MLLM_KERNEL_CACHE_DIR at a directory only you can write"
    if TRUSTED_OWNERS_VARIABLE in reason and owner is not None:
        return (
            f"{_trust_owner_fix(owner)} (comma-separated names or uids); otherwise take "
            "this cache out of MLLM_KERNEL_CACHE_PATH or uninstall its package"
        )
    if reason.startswith("is owned by"):
        return f"remove it (rm -rf {path}) or take it over (chown -R $USER {path}), {private}"
    if reason.startswith("is writable") and shared:
        return (
            f"leave {path} as it is (a directory every user shares, sticky as /tmp is) and "
            f"keep the cache in a directory of your own inside it (mkdir -m 700 {path}/$USER)"
        )
    if reason.startswith("is writable"):
        return f"chmod -R go-w {path}, {private}"
    return f"remove it (rm {path}), {private}"


def explain(path: Path, info: os.stat_result, reason: str) -> str:
    """One sentence for a WARNING or an error: path, what is wrong, owner, mode, fix."""
    return (
        f"{path} {reason} ({describe(info)}): another local user could have written it. "
        f"Fix: {fix_for(path, reason, info.st_uid, shared=bool(info.st_mode & stat.S_ISVTX))}"
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


# ---------------------------------------------------------------------------
# The directories a root's path passes through
# ---------------------------------------------------------------------------
def _insecure_dir(info: os.stat_result, trusted: frozenset[int], read_only: bool) -> str | None:
    """Why a directory on the way to a root lets another user swap what is below it, or
    None: owned by a trusted user, and writable by no one else unless sticky (in a
    sticky directory only an entry's owner can rename it)."""
    if info.st_uid not in trusted:
        return _foreign_owner(info.st_uid, read_only=read_only)
    writable = info.st_mode & _GROUP_OR_OTHER_WRITE
    if writable and not info.st_mode & stat.S_ISVTX:
        return f"is writable by {_WRITERS[writable]} and has no sticky bit"
    return None


def _ancestor_fix(directory: Path, info: os.stat_result, reason: str) -> str:
    """The fix for a ``reason`` from :func:`_insecure_dir`: close the directory, trust
    its owner (a read-only cache), or keep the cache elsewhere."""
    elsewhere = "keep the cache in a directory whose every parent only you or root can write"
    if reason.startswith("is writable"):
        return f"chmod go-w {directory} or chmod +t {directory} (as its owner), or {elsewhere}"
    if TRUSTED_OWNERS_VARIABLE in reason:
        return f"{_trust_owner_fix(info.st_uid)}, or {elsewhere}"
    return f"move the cache out of {directory}: {elsewhere}"


def _explain_ancestor(root: Path, directory: Path, info: os.stat_result, reason: str) -> str:
    """The :func:`check_root` text for an insecure directory on the way to ``root``."""
    return (
        f"the path to {root} passes through {directory}, which {reason} ({describe(info)}): "
        f"another local user could rename {root} away and put a directory of their own in "
        f"its place between the check and the load. Fix: {_ancestor_fix(directory, info, reason)}"
    )


def _explain_link(root: Path, link: Path, info: os.stat_result, directory: Path) -> str:
    return (
        f"the path to {root} passes through the symlink {link} ({describe(info)}) in "
        f"{directory}, which others can write: its owner could point it anywhere. Fix: "
        f"use the path it points to, or remove it (rm {link})"
    )


def _walk_ancestors(
    root: Path, trusted: frozenset[int], read_only: bool
) -> tuple[str | None, bool]:
    """``(why a directory resolving root passes through is insecure, or None; whether
    every name of the path exists)``. The path is resolved one name at a time as the
    kernel does, following symlinks, so every directory a name is looked up in is
    checked: the parents as named, and those of each symlink's target. The root itself
    is not (:func:`check_dir` holds it to the stricter rule). A missing name, a file on
    the way or a symlink loop ends the walk: the root's own check reports those."""
    pending = list(reversed(root.parts[1:]))  # root is absolute: parts[0] is "/"
    current, info = Path("/"), os.stat("/")
    checked: set[Path] = set()
    links = 0
    while pending:
        name = pending.pop()
        if name == "/":
            current, info = Path("/"), os.stat("/")
            continue
        if name == "..":
            current = current.parent
            info = os.stat(current)
            continue
        if not stat.S_ISDIR(info.st_mode):
            return None, False
        if current not in checked:
            reason = _insecure_dir(info, trusted, read_only)
            if reason is not None:
                return _explain_ancestor(root, current, info, reason), False
            checked.add(current)
        child = current / name
        try:
            child_info = os.lstat(child)
        except (FileNotFoundError, NotADirectoryError):
            return None, False
        if not stat.S_ISLNK(child_info.st_mode):
            current, info = child, child_info
            continue
        if info.st_mode & _GROUP_OR_OTHER_WRITE and child_info.st_uid not in trusted:
            return _explain_link(root, child, child_info, current), False
        links += 1
        if links > _MAX_SYMLINKS:
            return None, False
        pending.extend(reversed(Path(os.readlink(child)).parts))
    return None, True


_secure_paths: set[tuple[str, frozenset[int]]] = set()


def ancestors_problem(root: Path, *, read_only: bool = False) -> str | None:
    """Why a directory the path to ``root`` passes through lets another user swap the
    root (its owner, its mode, and the fix), or None. A passing path is remembered for
    the process, keyed by the owners trusted: directories only trusted users can write
    cannot change under us, so a warm load pays the stats once. A failing one, or one
    not yet created in full (a name could still be made by another user), is not."""
    trusted = trusted_uids(read_only=read_only)
    memo = (str(root), trusted)
    if memo in _secure_paths:
        return None
    reason, complete = _walk_ancestors(Path(root).absolute(), trusted, read_only)
    if reason is None and complete:
        _secure_paths.add(memo)
    return reason


def check_root(root: Path, *, any_owner: bool = False) -> str | None:
    """:func:`check_dir` of the cache root ``root`` through a symlink, after
    :func:`ancestors_problem` of the directories its path passes through: the text of
    the first that fails, or None (``any_owner``: the read-only-cache rule)."""
    return ancestors_problem(root, read_only=any_owner) or check_dir(
        root, any_owner=any_owner, follow=True
    )


def private_dir(path: Path, *, follow: bool = False) -> Path:
    """``path`` as a directory of ours: created 0700 (with any missing parents) or, if it
    exists, checked against the rule (``follow``: the root, through a symlink and with
    the directories its path passes through, checked before anything is created there;
    else a symlink fails). Raises UntrustedPath when it fails; a creation race lost to
    another user fails the check."""
    if follow and (reason := ancestors_problem(path)) is not None:
        raise UntrustedPath(reason, path)
    missing = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, PRIVATE_DIR_MODE)
    reason = check_root(path) if follow else check_dir(path)
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

    It must pass the trust rule (:func:`check_root`: through a symlink, with the
    directories on its path; the text says the fix) and be a directory, or one this
    process can create (the text is the OS error; see :func:`_unusable`).
    """
    try:
        reason = check_root(root)
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
