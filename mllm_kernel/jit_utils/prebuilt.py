"""Prebuilt read-only caches: built once (in CI), loaded where no compiler exists.

The read-only caches, searched in order before the writable cache, are the
directories of ``MLLM_KERNEL_CACHE_PATH=dir1:dir2``, then the caches installed as
packages (``precompile --wheel`` makes one: a wheel that declares its cache
directory in the :data:`ENTRY_POINT_GROUP` entry point group; see
:mod:`.cache_wheel`), by distribution name. An entry there is found by its
:func:`~.cache_key.relocatable_key` (computed without any toolchain), validated
like any entry (manifest schema, the artifact's size and sha256, the sha256 of
every source and header it was built from) under the read-only trust rule (any
owner, nothing writable by group or others: :mod:`.trust`), and loaded without
writing anything: no lock, no log, no staging. A missing, stale or untrusted
entry is built in the writable cache as usual.

``python -m mllm_kernel precompile --output DIR`` writes such a cache
(:func:`export`): each entry is built (and, where possible, loaded) in the
writable cache first, then copied into ``DIR`` under its relocatable key with
its manifest made relocatable (the package's files named by their place in the
package, the toolchain's fingerprints dropped).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
import os
import shutil
import stat
import sys
from pathlib import Path

from mllm_kernel.jit_utils import cache, cache_names, env, paths, trust
from mllm_kernel.jit_utils.cache_key import relocatable_key
from mllm_kernel.jit_utils.logging_setup import get_logger
from mllm_kernel.jit_utils.spec import BuildSpec
from mllm_kernel.jit_utils.status import CacheState

_logger = get_logger()
# A prebuilt cache is read by whichever user serves: readable by all, writable by none
# but its owner.
_DIR_MODE = 0o755
_FILE_MODE = 0o644
# Installed cache packages name their top-level module in this group; the cache is the
# module's ``cache/`` directory.
ENTRY_POINT_GROUP = "mllm_kernel.caches"
CACHE_SUBDIR = "cache"


@dataclasses.dataclass(frozen=True)
class ReadOnlyCache:
    """One read-only cache: its ``root`` and where it was named (``origin``, for
    show-config: ``$MLLM_KERNEL_CACHE_PATH`` or the installed distribution)."""

    root: Path
    origin: str


def read_only_caches() -> list[ReadOnlyCache]:
    """Every read-only cache, in search order: ``MLLM_KERNEL_CACHE_PATH``, then the
    installed cache packages (found on the current ``sys.path``)."""
    named = [ReadOnlyCache(root, "$MLLM_KERNEL_CACHE_PATH") for root in env.cache_path()]
    return named + list(_installed_caches(tuple(sys.path)))


@functools.cache  # scanning every installed distribution takes milliseconds
def _installed_caches(search_path: tuple[str, ...]) -> tuple[ReadOnlyCache, ...]:
    found: dict[str, ReadOnlyCache] = {}
    for dist in importlib.metadata.distributions(path=list(search_path)):
        name = dist.metadata["Name"]
        for entry_point in dist.entry_points.select(group=ENTRY_POINT_GROUP):
            if name in found:  # the first on the path wins, as for imports
                continue
            root = _package_dir(entry_point.value)
            if root is None:
                _logger.warning(
                    "installed cache %s names package %r, which cannot be found; reinstall it",
                    name,
                    entry_point.value,
                )
                continue
            found[name] = ReadOnlyCache(root / CACHE_SUBDIR, f"package {name} {dist.version}")
    return tuple(found[name] for name in sorted(found))


def _package_dir(module: str) -> Path | None:
    """Where the top-level package ``module`` is, found without running its code."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or ()) if spec else []
    return Path(locations[0]) if locations else None


def find(spec: BuildSpec) -> cache.Lookup | None:
    """The first valid entry of ``spec`` in the read-only caches (a ``hit`` Lookup), or
    None. Reads only; says at WARNING why an entry found there is not used."""
    roots = [c.root for c in read_only_caches()]
    if not roots:
        return None
    key = relocatable_key(spec, roots[0])
    for root in roots:
        found = cache.lookup(key.under(root), any_owner=True)
        if found.status is CacheState.HIT:
            return found
        if found.status is CacheState.UNTRUSTED:
            trust.warn_once(root, f"prebuilt cache entry not used: {found.reason}")
        elif found.status in (CacheState.CORRUPT, CacheState.STALE):
            trust.warn_once(
                key.under(root).path,
                f"prebuilt cache entry {key.under(root).path} not used ({found.status}: "
                f"{found.reason}); building {spec.describe()} instead",
            )
    return None


def export(spec: BuildSpec, built: Path, output: Path) -> Path:
    """Copies the valid entry ``built`` (of ``spec``, in the writable cache) into the
    prebuilt cache ``output`` under its relocatable key; returns the new entry.

    An entry already there is replaced atomically.
    """
    manifest = cache.Manifest.read(built)
    key = relocatable_key(spec, output.absolute())
    relocatable = dataclasses.replace(
        manifest,
        key_hash=key.hash,
        deps={paths.anchored(path): digest for path, digest in manifest.deps.items()},
        toolchain_deps={},
        include_search=[],
    )
    output.mkdir(parents=True, exist_ok=True)
    os.chmod(output, _DIR_MODE)
    # Hidden (dot) names: the cache's readers skip them.
    staging = output / f".{cache_names.staging_dirname(key.dirname)}"
    staging.mkdir(mode=_DIR_MODE)
    try:
        os.chmod(staging, _DIR_MODE)
        for item in built.iterdir():
            if item.name != cache.MANIFEST and stat.S_ISREG(item.lstat().st_mode):
                shutil.copyfile(item, staging / item.name, follow_symlinks=False)
        relocatable.write(staging)
        for item in staging.iterdir():
            os.chmod(item, _FILE_MODE)
        final = key.path
        if os.path.lexists(final):
            old = output / f".{cache_names.replaced_dirname(key.dirname)}"
            os.replace(final, old)
            os.replace(staging, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final
