"""Prebuilt read-only caches: built once (in CI), loaded where no compiler exists.

The read-only caches, searched in order before the writable cache, are the
directories of ``MLLM_KERNEL_CACHE_PATH=dir1:dir2``, then the caches installed as
packages: a top-level package ``mllm_kernel_cache_<tag>`` on ``sys.path`` holding a
``cache/`` directory (``precompile --wheel`` makes one; see :mod:`.cache_wheel`), by
name. They are found by listing the ``sys.path`` directories, not through
``importlib.metadata``: scanning every installed distribution took 67 ms, a cold start
of its own. An entry there is found by its
:func:`~.cache_key.relocatable_key` (computed without any toolchain), validated
like any entry (manifest schema, the artifact's size and sha256, the sha256 of
every source and header it was built from) under the read-only trust rule (owned by
the user, root or an owner named in ``MLLM_KERNEL_TRUSTED_CACHE_OWNERS``, as is every
directory on the way, and nothing writable by group or others: :mod:`.trust`), and
loaded without writing anything: no lock, no log, no staging. A missing, stale or
untrusted entry is built in the writable cache as usual, with a WARNING saying why
(for an owner not trusted: who owns it, and the variable that would trust them).

``python -m mllm_kernel precompile --output DIR`` writes such a cache
(:func:`export`): each entry is built (and, where possible, loaded) in the
writable cache first, then copied into ``DIR`` under its relocatable key with
its manifest made relocatable (the package's files named by their place in the
package, the toolchain's fingerprints dropped).
"""

from __future__ import annotations

import dataclasses
import functools
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
# but its owner (whom that user trusts: MLLM_KERNEL_TRUSTED_CACHE_OWNERS, unless root).
_DIR_MODE = 0o755
_FILE_MODE = 0o644
# An installed cache is the package <CACHE_PACKAGE_PREFIX><tag>, its entries in CACHE_SUBDIR.
CACHE_PACKAGE_PREFIX = "mllm_kernel_cache_"
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


@functools.cache  # sys.path keys it: a listing per directory, once per process
def _installed_caches(search_path: tuple[str, ...]) -> tuple[ReadOnlyCache, ...]:
    found: dict[str, ReadOnlyCache] = {}
    for entry in search_path:
        directory = Path(entry or ".").absolute()
        try:
            names = sorted(os.listdir(directory))
        except OSError:  # a missing directory or a zip file on sys.path
            continue
        versions = {  # mllm_kernel_cache_cpu-0.1.0.dist-info: what pip installed
            package: version
            for package, _, version in (
                name.removesuffix(".dist-info").partition("-")
                for name in names
                if name.startswith(CACHE_PACKAGE_PREFIX) and name.endswith(".dist-info")
            )
        }
        for name in names:
            if not name.startswith(CACHE_PACKAGE_PREFIX) or not name.isidentifier():
                continue
            if name in found:  # the first on the path wins, as for imports
                continue
            root = directory / name / CACHE_SUBDIR
            if not root.is_dir():
                trust.warn_once(
                    root,
                    f"installed cache package {directory / name} has no {CACHE_SUBDIR}/ "
                    "directory; reinstall it",
                )
                continue
            origin = f"package {name.replace('_', '-')} {versions.get(name, '')}".rstrip()
            found[name] = ReadOnlyCache(root, origin)
    return tuple(found[name] for name in sorted(found))


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
        toolchain_free_hash="",  # key_hash is the relocatable key: no other is looked up
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
