"""The on-disk cache: manifests, validation, the build lock and atomic installs.

Layout under the cache root (the names are made by :mod:`.cache_names`)::

    <dirname>/                  one module: <name>.so + manifest.json
    .staging/<dirname>.<pid>.*  builds in progress (never loaded from here by others)
    .locks/<dirname>.lock       cross-process build lock (+ .owner: who holds it)
    .logs/<dirname>.log         the full log of the last failed build

A module directory only ever appears by an atomic rename of a complete,
verified staging directory, so a reader sees all of a build or none of it.
Nothing is loaded or written that another local user could have written or
redirected: see :mod:`.trust` for the rule, checked before every load. Nothing
stops a lookup either: only regular files are read (a FIFO or a device where a
manifest, an artifact or a recorded source should be is corrupt or stale, never
opened for reading), a manifest is read up to MANIFEST_MAX_BYTES, and one that
cannot be parsed (deeply nested JSON included) is corrupt: the entry is rebuilt.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import reprlib
import shutil
import socket
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mllm_kernel.jit_utils import build_inputs, env, trust
from mllm_kernel.jit_utils.cache_key import ModuleKey, toolchain_free_hash
from mllm_kernel.jit_utils.cache_names import (
    LOCKS_DIR,
    LOGS_DIR,
    STAGING_DIR,
    entry_dirname,
    entry_of,
    lock_name,
    log_name,
    owner_name,
    replaced_dirname,
    staging_dirname,
)
from mllm_kernel.jit_utils.errors import CacheLockTimeout, CacheRootError
from mllm_kernel.jit_utils.logging_setup import get_logger
from mllm_kernel.jit_utils.spec import CACHE_FORMAT, DEVICES, BuildSpec
from mllm_kernel.jit_utils.status import CacheState

MANIFEST = "manifest.json"
# The largest manifests (CUDA kernels: every toolkit header they include) are ~100 KB;
# a bound keeps a planted giant from being read into memory.
MANIFEST_MAX_BYTES = 16 << 20
_OWNER_MAX_BYTES = 4096
_logger = get_logger()


class CorruptManifest(ValueError):
    """A manifest that is not valid JSON of the schema below: the entry is rebuilt."""


# Values quoted in CorruptManifest messages: bounded in length and depth, so that the
# message of a deeply nested field can neither recurse too deep nor be huge.
_quote = reprlib.Repr()
_quote.maxstring = _quote.maxother = 80


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
    "toolchain_free_hash": (lambda v: isinstance(v, str), "a string"),
}
# Fields a manifest may lack: those of older builds (still valid, as before).
# toolchain_free_hash: an entry without it is only found with the compiler that built it.
_OPTIONAL = frozenset({"toolchain_free_hash"})


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
    deps: dict[str, str]  # path as opened -> sha256, sources and non-toolchain headers
    exports: list[str]
    built_at: float
    build_seconds: float
    # path -> "size:mtime:ctime:inode:sha256" (build_inputs.fingerprint)
    toolchain_deps: dict[str, str] = field(default_factory=dict)
    include_search: list[dict] = field(default_factory=list)  # per unit: include_search.record()
    toolchain: dict[str, str] = field(default_factory=dict)
    cuda_archs: list[str] = field(default_factory=list)
    format: int = CACHE_FORMAT
    # cache_key.toolchain_free_hash: how the entry is found once its compiler is gone.
    toolchain_free_hash: str = ""

    def inputs(self) -> build_inputs.BuildInputs:
        """What the build read (see :mod:`.build_inputs`)."""
        return build_inputs.BuildInputs(self.deps, self.toolchain_deps, self.include_search)

    def write(self, directory: Path) -> None:
        trust.write_file(directory / MANIFEST, json.dumps(asdict(self), indent=1, sort_keys=True))

    @classmethod
    def read(cls, directory: Path) -> Manifest:
        """The manifest of ``directory``; CorruptManifest unless it matches the schema
        exactly, or is too large to be one (OSError if it cannot be read: missing, a
        symlink, or not a regular file, which is never opened for reading)."""
        fd, info = trust.open_regular(directory / MANIFEST)
        try:
            return cls.parse(_read_at_most(fd, info, directory / MANIFEST, MANIFEST_MAX_BYTES))
        finally:
            os.close(fd)

    @classmethod
    def parse(cls, text: str | bytes) -> Manifest:
        """A manifest from its JSON text (CorruptManifest as for :meth:`read`)."""
        try:
            data = json.loads(text)
        except ValueError as exc:  # UnicodeDecodeError included
            raise CorruptManifest(f"not JSON ({exc})") from None
        except RecursionError:  # 1200 nested "[" are enough: never a crash
            raise CorruptManifest("JSON nested deeper than Python can parse") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: object) -> Manifest:
        """``data`` (parsed JSON) as a Manifest, after checking it against the schema."""
        if not isinstance(data, dict):
            raise CorruptManifest(f"expected a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(_SCHEMA))
        missing = sorted(set(_SCHEMA) - set(data) - _OPTIONAL)
        if unknown or missing:
            raise CorruptManifest(f"fields missing {missing}, unknown {unknown}")
        for name, value in data.items():
            check, expected = _SCHEMA[name]
            if not check(value):
                raise CorruptManifest(f"{name!r} must be {expected}, got {_quote.repr(value)}")
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


def lookup(key: ModuleKey, *, any_owner: bool = False, toolchain_free: bool = False) -> Lookup:
    """Validates ``key``'s directory without spawning anything.

    Trust comes first (:mod:`.trust`; ``any_owner``: the read-only-cache rule): the
    root, the entry, the manifest and the artifact are each checked by one stat, the
    last two on the descriptors their content is then read from, so what was checked
    is what is hashed. Only regular files are read (a FIFO or a device is corrupt, a
    manifest past MANIFEST_MAX_BYTES too), so a lookup neither blocks nor crashes.

    ``toolchain_free``: ``key.hash`` is the entry's :func:`.cache_key.toolchain_free_hash`
    and, as for a prebuilt entry, the toolchain's own headers and the include search are
    not checked (see :func:`lookup_without_toolchain`).
    """
    directory = key.path
    reason = trust.check_root(key.root, any_owner=any_owner)
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
        text, untrusted = _read_trusted(directory / MANIFEST, any_owner, MANIFEST_MAX_BYTES)
        if untrusted is not None:
            return Lookup(CacheState.UNTRUSTED, reason=untrusted)
        manifest = Manifest.parse(text)
    except FileNotFoundError:
        return Lookup(CacheState.CORRUPT, reason=f"{MANIFEST} is missing")
    except (OSError, ValueError) as exc:
        return Lookup(CacheState.CORRUPT, reason=f"unreadable manifest ({exc})")
    recorded = manifest.toolchain_free_hash if toolchain_free else manifest.key_hash
    if recorded != key.hash:
        return Lookup(
            CacheState.CORRUPT, reason="manifest belongs to another key", manifest=manifest
        )
    artifact = directory / manifest.artifact
    try:
        fd, info = trust.open_regular(artifact)
    except trust.UntrustedPath as exc:
        return Lookup(CacheState.UNTRUSTED, reason=str(exc), manifest=manifest)
    except trust.NotRegularFile as exc:
        return Lookup(CacheState.CORRUPT, reason=str(exc), manifest=manifest)
    except OSError:
        return Lookup(CacheState.CORRUPT, reason=f"{artifact.name} is missing", manifest=manifest)
    try:
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
        if build_inputs.fd_digest(fd) != manifest.artifact_sha256:
            return Lookup(
                CacheState.CORRUPT,
                reason=f"{artifact.name} content does not match its checksum",
                manifest=manifest,
            )
    finally:
        os.close(fd)
    verdict = build_inputs.check(manifest.inputs(), toolchain=not toolchain_free)
    if verdict.reason:
        return Lookup(CacheState.STALE, reason=verdict.reason, manifest=manifest)
    if verdict.refreshed is not None and not any_owner:
        _record_refreshed(key, manifest, verdict.refreshed)
    return Lookup(CacheState.HIT, artifact=artifact, manifest=manifest)


def _record_refreshed(
    key: ModuleKey, manifest: Manifest, refreshed: build_inputs.BuildInputs
) -> None:
    """Writes the stats of unchanged inputs back into ``key``'s manifest (a reinstall of
    the same toolchain headers: see :mod:`.build_inputs`), so that later lookups neither
    hash nor list again. Only while the entry's lock is free, and only into the entry
    that was checked (same artifact); otherwise the next lookup does the work again."""
    held = try_module_lock(key, purpose="recording unchanged inputs")
    if held is None:
        return
    with held, contextlib.suppress(OSError, ValueError):
        if Manifest.read(key.path).artifact_sha256 != manifest.artifact_sha256:
            return  # rebuilt meanwhile
        manifest.toolchain_deps = refreshed.toolchain_deps
        manifest.include_search = refreshed.include_search
        manifest.write(key.path)


def lookup_without_toolchain(spec: BuildSpec, root: Path | None = None) -> Lookup:
    """The newest valid entry of ``spec`` in the writable cache ``root`` (default: the
    one builds go to), found without the toolchain its key needs: for a process whose
    compiler was removed since the build.

    Entries are matched by their manifest's ``toolchain_free_hash`` (the key without the
    compilers' identity) and checked as a prebuilt entry is: trust, the artifact's size
    and sha256, and every source and header outside the toolchain; the toolchain's
    headers and the include search only change what a compiler would see, and none runs.
    Otherwise MISSING, or why the matching entry cannot be loaded (STALE: a source
    changed, which only a build can fix).
    """
    if root is None:
        root = _existing_writable_root()
        if root is None:
            return Lookup(CacheState.MISSING)
    key_hash = toolchain_free_hash(spec)
    prefix = entry_dirname(spec, "")  # <name>_<device>_<args>_, before the key hash
    try:
        names = sorted(n for n in os.listdir(root) if n.startswith(prefix))
    except OSError:
        return Lookup(CacheState.MISSING)
    best = Lookup(CacheState.MISSING)
    for name in names:
        if "_" in name[len(prefix) :]:  # the entry of longer template arguments
            continue
        found = lookup(ModuleKey(key_hash, name, root), toolchain_free=True)
        if found.manifest is None or found.manifest.toolchain_free_hash != key_hash:
            continue  # another variant's, or an entry that cannot say whose it is
        if found.status is CacheState.HIT:
            newer = best.manifest is None or found.manifest.built_at > best.manifest.built_at
            if best.status is not CacheState.HIT or newer:
                best = found  # several compilers built it: the newest build
        elif best.status is CacheState.MISSING:
            best = found  # why it cannot be loaded, unless another entry can
    return best


def _existing_writable_root() -> Path | None:
    """The writable cache root, where one exists: a load that cannot build must not
    create one (:func:`.trust.choose_root` creates what it picks)."""
    if not (env.cache_root().is_dir() or env.default_cache_root().is_dir()):
        return None
    try:
        return trust.writable_root()
    except CacheRootError:
        return None


def _read_at_most(fd: int, info: os.stat_result, path: Path, limit: int) -> bytes:
    """The content of the regular file open at ``fd`` (``info``: its fstat); ValueError
    past ``limit`` bytes, read no further (the file may grow after the fstat)."""
    too_large = ValueError(f"{path.name} is larger than {limit} bytes")
    if info.st_size > limit:
        raise too_large
    chunks, size = [], 0
    while chunk := os.read(fd, min(limit + 1 - size, 1 << 20)):
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def _read_trusted(path: Path, any_owner: bool, limit: int) -> tuple[bytes, str | None]:
    """``path``'s bytes (at most ``limit``: ValueError past it), and why it may not be
    trusted (None: it may), from one descriptor opened without following a symlink; a
    path that is not a regular file raises NotRegularFile, unread."""
    try:
        fd, info = trust.open_regular(path)
    except trust.UntrustedPath as exc:
        return b"", str(exc)
    try:
        untrusted = trust.problem(info, any_owner=any_owner)
        if untrusted is not None:
            return b"", trust.explain(path, info, untrusted)
        return _read_at_most(fd, info, path, limit), None
    finally:
        os.close(fd)


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
        text, untrusted = _read_trusted(owner_file, any_owner=False, limit=_OWNER_MAX_BYTES)
        if untrusted is not None:
            return "another process"
        data = json.loads(text)
        since = time.strftime("%H:%M:%S", time.localtime(data["since"]))
        return f"pid {data['pid']} on {data['host']} ({data['purpose']}, since {since})"
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
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
