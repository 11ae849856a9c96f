"""The on-disk cache: manifests, validation, the build lock and atomic installs.

Layout under the cache root (the names are made by :mod:`.cache_names`)::

    <dirname>/                  one module: <name>.so + manifest.json
    .staging/<dirname>.<pid>.*  builds in progress (never loaded from here by others)
    .locks/<dirname>.lock       cross-process build lock (+ .owner: who holds it)
    .logs/<dirname>.log         the full log of the last failed build

A module directory only ever appears by an atomic rename of a complete,
verified staging directory, so a reader sees all of a build or none of it.
Nothing is loaded or written that another local user could have written or
redirected: see :mod:`.trust` for the rule, checked before every load.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import socket
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mllm_kernel.jit_utils import env, include_search, paths, trust
from mllm_kernel.jit_utils.cache_key import ModuleKey
from mllm_kernel.jit_utils.cache_names import (
    LOCKS_DIR,
    LOGS_DIR,
    STAGING_DIR,
    entry_of,
    lock_name,
    log_name,
    owner_name,
    replaced_dirname,
    staging_dirname,
)
from mllm_kernel.jit_utils.errors import CacheLockTimeout
from mllm_kernel.jit_utils.logging_setup import get_logger
from mllm_kernel.jit_utils.spec import CACHE_FORMAT, DEVICES
from mllm_kernel.jit_utils.status import CacheState

MANIFEST = "manifest.json"
_logger = get_logger()


def file_digest(path: Path) -> str:
    with path.open("rb") as handle:
        return _digest(handle.fileno())


def _digest(fd: int) -> str:
    digest = hashlib.sha256()
    for chunk in iter(lambda: os.read(fd, 1 << 20), b""):
        digest.update(chunk)
    return digest.hexdigest()


class CorruptManifest(ValueError):
    """A manifest that is not valid JSON of the schema below: the entry is rebuilt."""


def _is_str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_str_dict(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _is_str_int_dict(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and type(v) is int for k, v in value.items()
    )


def _is_include_search(value: object) -> bool:
    """A list of include_search.record() results."""
    return isinstance(value, list) and all(
        isinstance(unit, dict)
        and set(unit) == {"dirs", "names", "listed"}
        and _is_str_list(unit["dirs"])
        and _is_str_int_dict(unit["names"])
        and all(-1 <= v < len(unit["dirs"]) for v in unit["names"].values())
        and _is_str_int_dict(unit["listed"])
        for unit in value
    )


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_plain_file_name(value: object) -> bool:
    """A name of a file directly inside the entry (no ``/``, ``..`` or NUL)."""
    return (
        isinstance(value, str)
        and value not in ("", ".", "..")
        and "/" not in value
        and "\\" not in value
        and "\0" not in value
    )


# The manifest schema: field -> (check, what it must be). One place, used by read().
_SCHEMA = {
    "name": (lambda v: isinstance(v, str), "a string"),
    "device": (lambda v: v in DEVICES, f"one of {DEVICES}"),
    "template_args": (_is_str_list, "a list of strings"),
    "key_hash": (lambda v: isinstance(v, str), "a string"),
    "artifact": (_is_plain_file_name, "a file name inside the entry"),
    "artifact_size": (lambda v: type(v) is int and v >= 0, "an int >= 0"),
    "artifact_sha256": (lambda v: isinstance(v, str), "a string"),
    "deps": (_is_str_dict, "an object of path -> sha256 strings"),
    "toolchain_deps": (_is_str_dict, "an object of path -> fingerprint strings"),
    "include_search": (_is_include_search, 'a list of {"dirs", "names", "listed"}'),
    "exports": (_is_str_list, "a list of strings"),
    "built_at": (_is_number, "a number"),
    "build_seconds": (_is_number, "a number"),
    "toolchain": (_is_str_dict, "an object of strings"),
    "cuda_archs": (_is_str_list, "a list of strings"),
    "format": (lambda v: v == CACHE_FORMAT, f"{CACHE_FORMAT}"),
}


@dataclass
class Manifest:
    """What a module directory holds and what it was built from."""

    name: str
    device: str
    template_args: list[str]
    key_hash: str
    artifact: str
    artifact_size: int
    artifact_sha256: str
    deps: dict[str, str]  # absolute path -> sha256, sources and non-toolchain headers
    exports: list[str]
    built_at: float
    build_seconds: float
    toolchain_deps: dict[str, str] = field(default_factory=dict)  # path -> "size:mtime_ns"
    include_search: list[dict] = field(default_factory=list)  # per unit: include_search.record()
    toolchain: dict[str, str] = field(default_factory=dict)
    cuda_archs: list[str] = field(default_factory=list)
    format: int = CACHE_FORMAT

    def write(self, directory: Path) -> None:
        trust.write_file(directory / MANIFEST, json.dumps(asdict(self), indent=1, sort_keys=True))

    @classmethod
    def read(cls, directory: Path) -> Manifest:
        """The manifest of ``directory``; CorruptManifest unless it matches the schema
        exactly (OSError if it cannot be read)."""
        return cls.parse((directory / MANIFEST).read_text())

    @classmethod
    def parse(cls, text: str) -> Manifest:
        """A manifest from its JSON text (CorruptManifest as for :meth:`read`)."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise CorruptManifest(f"not JSON ({exc})") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: object) -> Manifest:
        """``data`` (parsed JSON) as a Manifest, after checking it against the schema."""
        if not isinstance(data, dict):
            raise CorruptManifest(f"expected a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(_SCHEMA))
        missing = sorted(set(_SCHEMA) - set(data))
        if unknown or missing:
            raise CorruptManifest(f"fields missing {missing}, unknown {unknown}")
        for name, (check, expected) in _SCHEMA.items():
            if not check(data[name]):
                raise CorruptManifest(f"{name!r} must be {expected}, got {data[name]!r:.80}")
        return cls(**data)


@dataclass(frozen=True)
class Lookup:
    """The state of a module in the cache.

    ``status`` says what was found (:class:`.status.CacheState`): only a ``HIT`` has an
    ``artifact`` to load. ``reason`` says why an entry is not a hit (for ``UNTRUSTED``:
    the path, its owner and mode, and the fix).
    """

    status: CacheState
    artifact: Path | None = None
    reason: str = ""
    manifest: Manifest | None = None


def lookup(key: ModuleKey, *, any_owner: bool = False) -> Lookup:
    """Validates ``key``'s directory without spawning anything.

    Trust comes first (:mod:`.trust`; ``any_owner``: the read-only-cache rule): the
    root, the entry, the manifest and the artifact are each checked by one stat, the
    last two on the descriptors their content is then read from, so what was checked
    is what is hashed.
    """
    directory = key.path
    reason = trust.check_dir(key.root, any_owner=any_owner, follow=True)
    if reason is not None:
        return Lookup(CacheState.UNTRUSTED, reason=reason)
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        return Lookup(CacheState.MISSING)
    untrusted = trust.problem(info, any_owner=any_owner)
    if untrusted is not None:
        return Lookup(CacheState.UNTRUSTED, reason=trust.explain(directory, info, untrusted))
    if not stat.S_ISDIR(info.st_mode):
        return Lookup(CacheState.CORRUPT, reason=f"{directory} is not a directory")
    try:
        text, untrusted = _read_trusted(directory / MANIFEST, any_owner)
        if untrusted is not None:
            return Lookup(CacheState.UNTRUSTED, reason=untrusted)
        manifest = Manifest.parse(text.decode())
    except FileNotFoundError:
        return Lookup(CacheState.CORRUPT, reason=f"{MANIFEST} is missing")
    except (OSError, ValueError) as exc:
        return Lookup(CacheState.CORRUPT, reason=f"unreadable manifest ({exc})")
    if manifest.key_hash != key.hash:
        return Lookup(
            CacheState.CORRUPT, reason="manifest belongs to another key", manifest=manifest
        )
    artifact = directory / manifest.artifact
    try:
        fd = trust.open_nofollow(artifact, os.O_RDONLY)
    except trust.UntrustedPath as exc:
        return Lookup(CacheState.UNTRUSTED, reason=str(exc), manifest=manifest)
    except OSError:
        return Lookup(CacheState.CORRUPT, reason=f"{artifact.name} is missing", manifest=manifest)
    try:
        info = os.fstat(fd)
        untrusted = trust.problem(info, any_owner=any_owner)
        if untrusted is not None:
            return Lookup(
                CacheState.UNTRUSTED,
                reason=trust.explain(artifact, info, untrusted),
                manifest=manifest,
            )
        if info.st_size != manifest.artifact_size:
            return Lookup(
                CacheState.CORRUPT,
                reason=f"{artifact.name} is {info.st_size} bytes, not {manifest.artifact_size} "
                "(truncated?)",
                manifest=manifest,
            )
        if _digest(fd) != manifest.artifact_sha256:
            return Lookup(
                CacheState.CORRUPT,
                reason=f"{artifact.name} content does not match its checksum",
                manifest=manifest,
            )
    finally:
        os.close(fd)
    reason = _changed_input(manifest)
    if reason:
        return Lookup(CacheState.STALE, reason=reason, manifest=manifest)
    return Lookup(CacheState.HIT, artifact=artifact, manifest=manifest)


def _read_trusted(path: Path, any_owner: bool) -> tuple[bytes, str | None]:
    """``path``'s bytes, and why it may not be trusted (None: it may), from one
    descriptor opened without following a symlink."""
    try:
        fd = trust.open_nofollow(path, os.O_RDONLY)
    except trust.UntrustedPath as exc:
        return b"", str(exc)
    try:
        info = os.fstat(fd)
        untrusted = trust.problem(info, any_owner=any_owner)
        if untrusted is not None:
            return b"", trust.explain(path, info, untrusted)
        chunks = []
        for chunk in iter(lambda: os.read(fd, 1 << 20), b""):
            chunks.append(chunk)
        return b"".join(chunks), None
    finally:
        os.close(fd)


def _changed_input(manifest: Manifest) -> str | None:
    """Why the build's inputs differ from the recorded ones (None: they do not)."""
    for dep, fingerprint in manifest.toolchain_deps.items():
        try:
            if include_search.toolchain_fingerprint(dep) != fingerprint:
                return f"{dep} changed"
        except OSError:
            return f"{dep} no longer exists"
    for unit in manifest.include_search:
        reason = include_search.shadowed(unit)
        if reason:
            return reason
    for dep, digest in manifest.deps.items():
        try:  # a prebuilt entry names the package's files by anchor (paths.anchored)
            if file_digest(paths.unanchored(dep)) != digest:
                return f"{dep} changed"
        except OSError:
            return f"{dep} no longer exists"
    return None


# ---------------------------------------------------------------------------
# Locking: a thread lock (threads of one process) plus flock() on a file in the
# private .locks directory (processes). flock() locks die with their process, so a
# killed builder never blocks others. The lock file is opened without following a
# symlink and never truncated; the owner note is replaced, never written through.
# ---------------------------------------------------------------------------
_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()
_POLL_SECONDS = 0.05


class _FileLock:
    """An exclusive flock() on ``path``, held through one descriptor."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        fd = trust.open_nofollow(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return True

    def acquire(self, timeout: float) -> bool:
        """Polls until the lock is held (True) or ``timeout`` seconds passed (False)."""
        deadline = time.monotonic() + timeout
        while not self.try_acquire():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(_POLL_SECONDS, left))
        return True

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _locks_dir(root: Path) -> Path:
    return trust.private_dir(root / LOCKS_DIR)


def _owner_text(owner_file: Path) -> str:
    try:
        text, untrusted = _read_trusted(owner_file, any_owner=False)
        if untrusted is not None:
            return "another process"
        data = json.loads(text)
        since = time.strftime("%H:%M:%S", time.localtime(data["since"]))
        return f"pid {data['pid']} on {data['host']} ({data['purpose']}, since {since})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


@contextlib.contextmanager
def module_lock(key: ModuleKey, purpose: str, timeout: float | None = None) -> Iterator[None]:
    """Holds the build lock of ``key``; while waiting, logs who holds it."""
    timeout = env.lock_timeout() if timeout is None else timeout
    trust.private_dir(key.root, follow=True)
    owner_file = _locks_dir(key.root) / owner_name(key.dirname)
    with _thread_locks_guard:
        thread_lock = _thread_locks.setdefault(key.dirname, threading.Lock())
    deadline = time.monotonic() + timeout  # inf stays inf: wait forever
    # Lock.acquire rejects timeouts above TIMEOUT_MAX (OverflowError); -1 blocks.
    thread_timeout = -1 if timeout >= threading.TIMEOUT_MAX else max(timeout, 0)
    if not thread_lock.acquire(timeout=thread_timeout):
        raise CacheLockTimeout(f"waited {timeout:.0f}s for another thread building {key.dirname}")
    try:
        lock = _FileLock(owner_file.with_name(lock_name(key.dirname)))
        next_report = 0.0
        while not lock.acquire(timeout=min(2.0, max(deadline - time.monotonic(), 0))):
            now = time.monotonic()
            if now >= deadline:
                raise CacheLockTimeout(
                    f"waited {timeout:.0f}s for the build lock of {key.dirname}, held by "
                    f"{_owner_text(owner_file)}; raise MLLM_KERNEL_LOCK_TIMEOUT or stop that "
                    "process"
                )
            if now >= next_report:
                _logger.info("waiting for %s: held by %s", key.dirname, _owner_text(owner_file))
                next_report = now + 30.0
        try:
            owner = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "purpose": purpose,
                "since": time.time(),
            }
            trust.write_file(owner_file, json.dumps(owner))
            yield
        finally:
            with contextlib.suppress(OSError):
                owner_file.unlink()
            lock.release()
    finally:
        thread_lock.release()


def try_module_lock(key: ModuleKey, purpose: str) -> contextlib.AbstractContextManager | None:
    """The lock of ``key`` if it is free right now, else None (a build is running, or its
    lock file cannot be trusted)."""
    del purpose  # only a held module_lock writes an owner note
    lock_file = key.root / LOCKS_DIR / lock_name(key.dirname)
    if not lock_file.exists():
        return contextlib.nullcontext()
    lock = _FileLock(lock_file)
    try:
        if trust.check_dir(lock_file.parent) is not None or not lock.try_acquire():
            return None
    except OSError:
        return None

    @contextlib.contextmanager
    def held() -> Iterator[None]:
        try:
            yield
        finally:
            lock.release()

    return held()


# ---------------------------------------------------------------------------
# Staging and installing. Callers hold module_lock(key).
# ---------------------------------------------------------------------------
def _remove(path: Path) -> None:
    """Removes ``path``: a directory tree, or a file or symlink (never followed)."""
    if path.is_symlink() or not path.is_dir():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


def new_staging_dir(key: ModuleKey) -> Path:
    """A fresh, empty, private staging directory for ``key``, after clearing dead ones."""
    staging_root = trust.private_dir(key.root / STAGING_DIR)
    # We hold the lock, so any other staging dir of this key was left by a killed build.
    for leftover in staging_root.iterdir():
        if entry_of(leftover.name) == key.dirname:
            _logger.info("removing an interrupted build: %s", leftover)
            _remove(leftover)
    path = staging_root / staging_dirname(key.dirname)
    path.mkdir(mode=trust.PRIVATE_DIR_MODE)
    return path


def install(staging: Path, key: ModuleKey) -> Path:
    """Moves a verified staging directory to ``key.path`` atomically (whatever was there,
    a symlink included, is moved aside and removed, never followed)."""
    trust.drop_group_other_write(staging)
    final = key.path
    if os.path.lexists(final):
        trash = key.root / STAGING_DIR / replaced_dirname(key.dirname)
        os.replace(final, trash)
        os.replace(staging, final)
        _remove(trash)
    else:
        os.replace(staging, final)
    return final


def failure_log_path(key: ModuleKey) -> Path:
    """Where the log of a failed build of ``key`` goes, in the private ``.logs``; whatever
    was at that path (an old log, a symlink) is removed first, so the log is a new file."""
    log = trust.private_dir(key.root / LOGS_DIR) / log_name(key.dirname)
    with contextlib.suppress(FileNotFoundError):
        log.unlink()
    return log
