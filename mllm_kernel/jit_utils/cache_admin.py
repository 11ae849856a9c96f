"""Inspecting and clearing the cache: what is built, for which kernel, and removing it safely.

Only the cache root's direct children are ever touched: module directories (named as
entries: a root shared with other files loses none of them), leftovers under
``.staging/`` and logs under ``.logs/``. Symlinks are never
followed (nor removed), and a module whose build lock is held is skipped: a
build in progress is never pulled from under its builder.

>>> report = clear_cache(kernel="add_constant", dry_run=True)
>>> report.count, report.bytes  # doctest: +SKIP
(5, 81920)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mllm_kernel.jit_utils import cache, env, paths, prebuilt, registry, trust
from mllm_kernel.jit_utils.cache_key import ModuleKey
from mllm_kernel.jit_utils.cache_names import (
    LOGS_DIR,
    STAGING_DIR,
    belongs_to,
    entry_of,
    is_entry_name,
)
from mllm_kernel.jit_utils.cuda_arch import (
    ArchSupport,
    CudaArch,
    UnsupportedArchError,
    cuda_arch_override,
)
from mllm_kernel.jit_utils.errors import CacheRootError, CudaArchError
from mllm_kernel.jit_utils.registry import KernelEntry, VariantStatus
from mllm_kernel.jit_utils.status import CacheState, VariantState

_DAY = 86400.0
# Any arch the module runs on would do: it only lets a kernel's spec be read (to list its
# exports) without a GPU, or where the arch in use is not one of the module's.
_STAND_IN_ARCH = CudaArch(9, 0, "a")


@dataclass(frozen=True)
class CachedModule:
    """One module directory under the cache root, with its manifest if readable."""

    path: Path
    manifest: cache.Manifest | None
    size_bytes: int
    built_at: float
    error: str = ""

    @property
    def name(self) -> str | None:
        return self.manifest.name if self.manifest else None

    @property
    def device(self) -> str | None:
        return self.manifest.device if self.manifest else None

    @property
    def sources(self) -> tuple[str, ...]:
        """The files it was built from that are not the package's own (a user kernel's
        sources and headers), from its manifest: what tells two user kernels of one name
        and template arguments apart."""
        if self.manifest is None:
            return ()
        return tuple(p for p in sorted(self.manifest.deps) if not paths.anchored(p).startswith("@"))


def tree_size(path: Path) -> int:
    """Bytes under ``path`` (symlinks count as themselves, never followed)."""
    try:
        top = path.lstat()
    except OSError:
        return 0
    if not stat.S_ISDIR(top.st_mode):
        return top.st_size
    total = 0
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        for name in (*filenames, *dirnames):
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(dirpath, name))
                if not stat.S_ISDIR(info.st_mode):
                    total += info.st_size
    return total


def _module_dirs(root: Path) -> Iterator[Path]:
    """The entry directories directly under ``root``: named as an entry
    (:func:`.cache_names.is_entry_name`), not links; whatever else the root holds is
    never listed, so never removed."""
    if not root.is_dir():
        return
    with os.scandir(root) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if is_entry_name(entry.name) and entry.is_dir(follow_symlinks=False):
                yield Path(entry.path)


def root_in_use() -> Path:
    """The cache root builds go to (:func:`.trust.choose_root`: ``MLLM_KERNEL_CACHE_DIR``,
    or the private default when that one cannot be used); raises CacheRootError when
    neither can."""
    return trust.choose_root().root


def cached_modules(root: Path | None = None) -> list[CachedModule]:
    """Every module directory in the cache (``root`` defaults to :func:`root_in_use`)."""
    root = root_in_use() if root is None else root
    found = []
    for directory in _module_dirs(root):
        try:
            manifest: cache.Manifest | None = cache.Manifest.read(directory)
            error = ""
            built_at = manifest.built_at
        except (OSError, ValueError, TypeError) as exc:
            manifest, error = None, f"no readable manifest ({exc})"
            built_at = directory.lstat().st_mtime
        found.append(CachedModule(directory, manifest, tree_size(directory), built_at, error))
    return found


# ---------------------------------------------------------------------------
# show-config: registered kernels, their variants' status, and unclaimed modules
# ---------------------------------------------------------------------------
@dataclass
class KernelReport:
    """A registered kernel, the ops its module exports and the cache status of each of
    its variants (one module can export several ops: ``rmsnorm`` and ``fused_add_rmsnorm``)."""

    name: str
    device: str
    builtin: bool
    variants: list[VariantStatus]
    exports: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()  # a user kernel's source files (the package's: empty)
    archs: str = ""  # a CUDA kernel's archs (ArchSupport.describe(): "sm_90a only")


@dataclass
class ConfigReport:
    """What ``show-config`` shows: kernels by device, and cached modules no kernel claims.

    ``other_builds`` counts cached builds of registered kernels that match none
    of this environment's keys (another arch, toolchain or package version).
    ``device`` is the device the report was limited to (None: both).
    """

    arch: str | None
    kernels: list[KernelReport]
    unclaimed: list[CachedModule]
    other_builds: int
    device: str | None = None


def _variant_list(entry: KernelEntry) -> list[tuple[Any, ...]]:
    variants = list(entry.variants)
    # A user kernel seen loaded (no builder): report what was loaded, by its template args.
    return variants if entry.builder is not None else sorted(entry.loaded)


def _status(entry: KernelEntry, variant: tuple[Any, ...]) -> VariantStatus:
    if entry.builder is None:
        return VariantStatus(
            entry.name,
            entry.device,
            tuple(variant),
            VariantState.UNKNOWN,
            detail="loaded in this process, no registered builder",
        )
    found = _served_by_prebuilt(entry, variant) or registry.variant_status(entry, variant)
    if found.status == VariantState.UNKNOWN:
        return _cached_without_toolchain(entry, variant) or found
    return found


def _cached_without_toolchain(entry: KernelEntry, variant: tuple[Any, ...]) -> VariantStatus | None:
    """``cached`` for a variant whose key cannot be computed because its compiler is gone,
    where a build made before is valid (the loader loads it:
    :func:`.cache.lookup_without_toolchain`), else None."""
    try:
        spec = entry.spec(variant)
    except Exception:  # no spec: variant_status says why
        return None
    found = cache.lookup_without_toolchain(spec)
    if found.status is not CacheState.HIT:
        return None
    detail = "built by a compiler no longer found; loads without it"
    return _found(entry, spec, VariantState.CACHED, found.artifact, detail)


def _found(
    entry: KernelEntry, spec: Any, state: VariantState, artifact: Path, detail: str
) -> VariantStatus:
    """The status of a variant whose build ``artifact`` was found."""
    return VariantStatus(
        entry.name,
        entry.device,
        spec.template_args,
        state,
        path=artifact.parent,
        size_bytes=artifact.stat().st_size,
        detail=detail,
    )


def _served_by_prebuilt(entry: KernelEntry, variant: tuple[Any, ...]) -> VariantStatus | None:
    """``prebuilt`` with the entry and the read-only cache that serves ``variant``
    (``MLLM_KERNEL_CACHE_PATH`` or an installed cache package: the loader looks there
    first), or None."""
    origins = {c.root: c.origin for c in prebuilt.read_only_caches()}
    if not origins:
        return None
    try:
        spec = entry.spec(variant)
        found = prebuilt.find(spec)
    except Exception:  # no spec: variant_status says why
        return None
    if found is None:
        return None
    origin = origins[found.artifact.parent.parent]  # which setting or package named it
    return _found(entry, spec, VariantState.PREBUILT, found.artifact, origin)


def _stand_in_arch(support: ArchSupport) -> CudaArch:
    """An arch ``support`` admits: :data:`_STAND_IN_ARCH` where it does, else the one
    arch of an arch-specific module or the oldest of the others."""
    if support.supports(_STAND_IN_ARCH):
        return _STAND_IN_ARCH
    if support.arch_specific is not None:
        return CudaArch(*support.arch_specific, "a")
    return CudaArch(*support.minimum)


def _module_facts(entry: KernelEntry) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(exports, sources)`` of ``entry``'s module, from its first variant's spec: the
    functions it exports and, for a user kernel, its source files. Empty where it cannot
    be described (a user kernel with no builder, sources not installed)."""
    if entry.builder is None or not entry.variants:
        return (), ()
    try:
        try:
            spec = entry.spec(entry.variants[0])
        except (CudaArchError, UnsupportedArchError):
            # No arch, or none the module runs on (show-config --arch 7.5 for an sm_80
            # module): neither fact depends on the arch; a spec only needs one it admits.
            with cuda_arch_override((_stand_in_arch(entry.archs),)):
                spec = entry.spec(entry.variants[0])
    except Exception:  # whatever stops the spec, variant_status reports it per variant
        return (), ()
    sources = () if entry.builtin else tuple(map(str, (*spec.cpp_files, *spec.cuda_files)))
    return spec.exports, sources


def config_report(
    device: str | None = None, arch: str | None = None, root: Path | None = None
) -> ConfigReport:
    """Statuses of every registered kernel variant, and the cache's unclaimed modules.

    ``arch`` (e.g. ``"9.0a"``) computes CUDA statuses for that arch, as if
    building there; without it a machine with no GPU reports them ``unknown``.
    ``root``: the cache to list, by default :func:`root_in_use` (the one set where
    neither is usable, as the statuses then say).

    A cached build of a package kernel that no variant claims (another arch, toolchain
    or version) is counted in ``other_builds``; one of a user kernel is listed in
    ``unclaimed``, with its sources: another program's kernel of the same name may
    well be a different kernel.
    """
    if root is None:
        try:
            root = root_in_use()
        except CacheRootError:
            root = env.cache_root()
    override = cuda_arch_override(arch) if arch else contextlib.nullcontext()
    with override:
        reports = [
            KernelReport(
                e.name,
                e.device,
                e.builtin,
                [_status(e, v) for v in _variant_list(e)],
                *_module_facts(e),
                archs=e.archs.describe() if e.device == "cuda" else "",
            )
            for e in registry.kernels(device)
        ]
    claimed_paths = {s.path for r in reports for s in r.variants if s.path is not None}
    builtin = {(e.name, e.device) for e in registry.kernels() if e.builtin}
    unclaimed, other = [], 0
    for module in cached_modules(root):
        if module.path in claimed_paths or device not in (None, module.device):
            continue
        if (module.name, module.device) in builtin:
            other += 1
        else:
            unclaimed.append(module)
    return ConfigReport(arch, reports, unclaimed, other, device)


# ---------------------------------------------------------------------------
# clear-cache
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Removal:
    """One thing removed (or, in a dry run, that would be): ``kind`` is ``module``,
    ``staging`` or ``log``."""

    kind: str
    path: Path
    size_bytes: int


@dataclass
class ClearReport:
    """What :func:`clear_cache` removed, and what it left and why."""

    root: Path
    dry_run: bool
    removed: list[Removal] = field(default_factory=list)
    busy: list[Path] = field(default_factory=list)  # a build holds the lock
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # (path, why)

    @property
    def count(self) -> int:
        return len(self.removed)

    @property
    def bytes(self) -> int:
        return sum(r.size_bytes for r in self.removed)


def _matches_kernel(
    dirname: str, kernels: frozenset[str] | None, manifest: cache.Manifest | None
) -> bool:
    if kernels is None:
        return True
    if manifest is not None:
        return manifest.name in kernels
    return belongs_to(dirname, kernels)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)  # removes links inside, never their targets
    else:
        path.unlink()


def _dirnames(root: Path) -> Iterator[str]:
    """The entry names of everything under ``root`` clear-cache may remove."""
    yield from (d.name for d in _module_dirs(root))
    for sub in (STAGING_DIR, LOGS_DIR):
        directory = root / sub
        if directory.is_dir() and not directory.is_symlink():
            yield from (entry_of(p.name) for p in directory.iterdir())


def check_kernel_names(kernels: frozenset[str], root: Path) -> None:
    """Raises ValueError for names in ``kernels`` that are neither in the cache at
    ``root`` (a module's manifest, or an entry's directory name) nor a kernel registered
    in this process, listing the known names and the closest one to each."""
    cached = {m.name for m in cached_modules(root) if m.name}
    dirnames = list(_dirnames(root))
    unknown = [
        k for k in kernels if k not in cached and not any(belongs_to(d, [k]) for d in dirnames)
    ]
    if not unknown:
        return
    known = cached | {e.name for e in registry.kernels()}
    unknown = sorted(k for k in unknown if k not in known)
    if not unknown:
        return
    raise ValueError(
        f"unknown kernel(s) {registry.unknown_names(unknown, known)}: no cached module in "
        f"{root} and no "
        f"registered kernel has that name; nothing was removed. Known: {', '.join(sorted(known))}"
    )


def clear_cache(
    kernel: str | Sequence[str] | None = None,
    older_than_days: float | None = None,
    dry_run: bool = False,
    root: Path | None = None,
) -> ClearReport:
    """Removes cached modules (all, or those of ``kernel``: one name or several, or
    built more than ``older_than_days`` ago), interrupted builds in ``.staging``
    and failure logs.

    ``root`` defaults to :func:`root_in_use`. A ``kernel`` name that neither the cache
    nor the registry knows raises ValueError (:func:`check_kernel_names`) before anything
    is removed. A module or staging directory whose build lock is held is left alone
    and listed in ``busy``. With ``dry_run`` nothing is removed; the report says what
    would be.
    """
    root = (root_in_use() if root is None else root).absolute()
    report = ClearReport(root, dry_run)
    kernels = None if kernel is None else frozenset([kernel] if isinstance(kernel, str) else kernel)
    if kernels is not None:
        check_kernel_names(kernels, root)
    cutoff = None if older_than_days is None else time.time() - older_than_days * _DAY
    if not root.is_dir():
        return report

    def locked_remove(kind: str, path: Path, dirname: str) -> None:
        key = ModuleKey(hash="", dirname=dirname, root=root)
        lock = cache.try_module_lock(key, purpose="clear-cache")
        if lock is None:
            report.busy.append(path)
            return
        with lock:
            size = tree_size(path)
            if not dry_run:
                try:
                    _remove(path)
                except OSError as exc:
                    report.skipped.append((path, f"cannot remove: {exc}"))
                    return
            report.removed.append(Removal(kind, path, size))

    with os.scandir(root) as entries:
        for entry in entries:
            if entry.is_symlink() and is_entry_name(entry.name):
                report.skipped.append((Path(entry.path), "a symlink (never followed)"))
    for module in cached_modules(root):
        if not _matches_kernel(module.path.name, kernels, module.manifest):
            continue
        if cutoff is not None and module.built_at > cutoff:
            continue
        locked_remove("module", module.path, module.path.name)

    staging = root / STAGING_DIR
    if staging.is_dir() and not staging.is_symlink():
        for leftover in sorted(staging.iterdir()):
            dirname = entry_of(leftover.name)
            if leftover.is_symlink() or not _matches_kernel(dirname, kernels, None):
                continue
            if cutoff is not None and leftover.lstat().st_mtime > cutoff:
                continue
            locked_remove("staging", leftover, dirname)

    logs = root / LOGS_DIR
    if logs.is_dir() and not logs.is_symlink():
        for log in sorted(logs.iterdir()):
            if log.is_symlink() or not log.is_file():
                continue
            if not _matches_kernel(entry_of(log.name), kernels, None):
                continue
            if cutoff is not None and log.stat().st_mtime > cutoff:
                continue
            size = log.stat().st_size
            if not dry_run:
                log.unlink()
            report.removed.append(Removal("log", log, size))
    return report
