"""The on-disk cache: manifests, validation, the build lock and atomic installs.

Layout under the cache root::

    <dirname>/                  one module: <name>.so + manifest.json
    .staging/<dirname>.<pid>.*  builds in progress (never loaded from here by others)
    .locks/<dirname>.lock       cross-process build lock (+ .owner: who holds it)
    .logs/<dirname>.log         the full log of the last failed build

A module directory only ever appears by an atomic rename of a complete,
verified staging directory, so a reader sees all of a build or none of it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import filelock

from mllm_kernel.jit_utils import env, include_search
from mllm_kernel.jit_utils.cache_key import ModuleKey
from mllm_kernel.jit_utils.errors import CacheLockTimeout
from mllm_kernel.jit_utils.spec import CACHE_FORMAT
from mllm_kernel.logging_setup import get_logger

MANIFEST = "manifest.json"
_logger = get_logger()


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
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
    "device": (lambda v: v in ("cpu", "cuda"), '"cpu" or "cuda"'),
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
        tmp = directory / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1, sort_keys=True))
        os.replace(tmp, directory / MANIFEST)

    @classmethod
    def read(cls, directory: Path) -> Manifest:
        """The manifest of ``directory``; CorruptManifest unless it matches the schema
        exactly (OSError if it cannot be read)."""
        text = (directory / MANIFEST).read_text()
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

    ``status`` is ``hit`` (load ``artifact``), ``missing``, ``stale`` (a source or
    header changed: rebuild quietly) or ``corrupt`` (rebuild with a warning).
    """

    status: str
    artifact: Path | None = None
    reason: str = ""
    manifest: Manifest | None = None


def lookup(key: ModuleKey) -> Lookup:
    """Validates ``key``'s directory without spawning anything."""
    directory = key.path
    if not directory.is_dir():
        return Lookup("missing")
    try:
        manifest = Manifest.read(directory)
    except FileNotFoundError:
        return Lookup("corrupt", reason=f"{MANIFEST} is missing")
    except (OSError, ValueError) as exc:
        return Lookup("corrupt", reason=f"unreadable manifest ({exc})")
    if manifest.key_hash != key.hash:
        return Lookup("corrupt", reason="manifest belongs to another key", manifest=manifest)
    artifact = directory / manifest.artifact
    try:
        size = artifact.stat().st_size
    except OSError:
        return Lookup("corrupt", reason=f"{artifact.name} is missing", manifest=manifest)
    if size != manifest.artifact_size:
        return Lookup(
            "corrupt",
            reason=f"{artifact.name} is {size} bytes, not {manifest.artifact_size} (truncated?)",
            manifest=manifest,
        )
    if file_digest(artifact) != manifest.artifact_sha256:
        return Lookup(
            "corrupt",
            reason=f"{artifact.name} content does not match its checksum",
            manifest=manifest,
        )
    reason = _changed_input(manifest)
    if reason:
        return Lookup("stale", reason=reason, manifest=manifest)
    return Lookup("hit", artifact=artifact, manifest=manifest)


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
        try:
            if file_digest(Path(dep)) != digest:
                return f"{dep} changed"
        except OSError:
            return f"{dep} no longer exists"
    return None


# ---------------------------------------------------------------------------
# Locking: a thread lock (threads of one process) plus a file lock (processes).
# flock() locks die with their process, so a killed builder never blocks others.
# ---------------------------------------------------------------------------
_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


def _owner_text(owner_file: Path) -> str:
    try:
        data = json.loads(owner_file.read_text())
        since = time.strftime("%H:%M:%S", time.localtime(data["since"]))
        return f"pid {data['pid']} on {data['host']} ({data['purpose']}, since {since})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


@contextlib.contextmanager
def module_lock(key: ModuleKey, purpose: str, timeout: float | None = None) -> Iterator[None]:
    """Holds the build lock of ``key``; while waiting, logs who holds it."""
    timeout = env.lock_timeout() if timeout is None else timeout
    locks_dir = key.root / ".locks"
    locks_dir.mkdir(parents=True, exist_ok=True)
    owner_file = locks_dir / f"{key.dirname}.owner"
    with _thread_locks_guard:
        thread_lock = _thread_locks.setdefault(key.dirname, threading.Lock())
    deadline = time.monotonic() + timeout  # inf stays inf: wait forever
    # Lock.acquire rejects timeouts above TIMEOUT_MAX (OverflowError); -1 blocks.
    thread_timeout = -1 if timeout >= threading.TIMEOUT_MAX else max(timeout, 0)
    if not thread_lock.acquire(timeout=thread_timeout):
        raise CacheLockTimeout(f"waited {timeout:.0f}s for another thread building {key.dirname}")
    try:
        lock = filelock.FileLock(str(locks_dir / f"{key.dirname}.lock"), thread_local=False)
        next_report = 0.0
        while True:
            try:
                lock.acquire(timeout=min(2.0, max(deadline - time.monotonic(), 0)))
                break
            except filelock.Timeout:
                now = time.monotonic()
                if now >= deadline:
                    raise CacheLockTimeout(
                        f"waited {timeout:.0f}s for the build lock of {key.dirname}, held by "
                        f"{_owner_text(owner_file)}; raise MLLM_KERNEL_LOCK_TIMEOUT or stop that "
                        "process"
                    ) from None
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
            owner_file.write_text(json.dumps(owner))
            yield
        finally:
            with contextlib.suppress(OSError):
                owner_file.unlink()
            lock.release()
    finally:
        thread_lock.release()


def try_module_lock(key: ModuleKey, purpose: str) -> contextlib.AbstractContextManager | None:
    """The lock of ``key`` if it is free right now, else None (a build is running)."""
    lock_file = key.root / ".locks" / f"{key.dirname}.lock"
    if not lock_file.exists():
        return contextlib.nullcontext()
    lock = filelock.FileLock(str(lock_file), thread_local=False)
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
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
def new_staging_dir(key: ModuleKey) -> Path:
    """A fresh, empty staging directory for ``key``, after clearing dead ones."""
    staging_root = key.root / ".staging"
    staging_root.mkdir(parents=True, exist_ok=True)
    # We hold the lock, so any other staging dir of this key was left by a killed build.
    for leftover in staging_root.glob(f"{key.dirname}.*"):
        _logger.info("removing an interrupted build: %s", leftover)
        shutil.rmtree(leftover, ignore_errors=True)
    path = staging_root / f"{key.dirname}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    path.mkdir()
    return path


def install(staging: Path, key: ModuleKey) -> Path:
    """Moves a verified staging directory to ``key.path`` atomically."""
    final = key.path
    if final.exists():
        trash = key.root / ".staging" / f"{key.dirname}.old.{uuid.uuid4().hex[:8]}"
        os.replace(final, trash)
        os.replace(staging, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(staging, final)
    return final


def failure_log_path(key: ModuleKey) -> Path:
    logs = key.root / ".logs"
    logs.mkdir(parents=True, exist_ok=True)
    return logs / f"{key.dirname}.log"
