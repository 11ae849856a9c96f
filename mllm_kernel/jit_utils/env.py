"""Every environment variable the package reads, in one place.

=============================  ===================================================
``MLLM_KERNEL_CACHE_DIR``      cache root (default ``~/.cache/mllm_kernel``); one that
                               another user could write or swap (a parent they can
                               write), or that cannot be created or written, is not
                               used (see :mod:`.trust`): builds go to the default
                               instead, with a WARNING
``MLLM_KERNEL_CACHE_PATH``     read-only prebuilt caches, ``dir1:dir2``, searched in
                               order before the installed cache packages and the
                               cache root (``precompile --output`` writes one);
                               nothing is ever written there
``MLLM_KERNEL_TRUSTED_CACHE_OWNERS``
                               users (names or uids, comma-separated) whose read-only
                               caches, and the directories they are in, are trusted
                               as your own (see :mod:`.trust`); a name with no user
                               is left out with a WARNING
``MLLM_KERNEL_VERBOSE``        ``1``: log every compiler command
``MLLM_KERNEL_CUDA_ARCH_LIST`` CUDA archs to build for, e.g. ``9.0a`` or ``8.0;9.0a``
``TORCH_CUDA_ARCH_LIST``       honoured when the variable above is unset
``MLLM_KERNEL_LOCK_TIMEOUT``   seconds to wait for another process's build (900;
                               ``inf``: wait forever)
``MLLM_KERNEL_CHECK_BOUNDS``   ``1``: kernels that take indices check their range
                               (read once per process, at the first such call)
``MLLM_KERNEL_LOG_LEVEL``      level of the ``mllm_kernel`` logger (``INFO``)
``CUDA_HOME`` / ``CUDA_PATH``  the CUDA toolkit (else nvcc on PATH, /usr/local/cuda)
``CXX``                        the host C++ compiler (else c++, g++, clang++)
``CPATH``, ``CPLUS_INCLUDE_PATH``, ``C_INCLUDE_PATH``
                               honoured by the compilers; their values join the
                               cache key (they change which headers a build sees)
=============================  ===================================================

A malformed value raises ValueError naming the variable, at the first read (a
name in ``MLLM_KERNEL_TRUSTED_CACHE_OWNERS`` with no user is a WARNING: trusting
fewer owners is the safe side of a typo).
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path

_TRUE = {"1", "true", "yes", "on"}


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def default_cache_root() -> Path:
    """``~/.cache/mllm_kernel``: the cache root when none is set, and the private fallback
    when the one set cannot be trusted (see :mod:`.trust`)."""
    return Path.home() / ".cache" / "mllm_kernel"


def cache_root_variable() -> str | None:
    """``MLLM_KERNEL_CACHE_DIR`` as set, or None when it is unset or empty."""
    return os.environ.get("MLLM_KERNEL_CACHE_DIR") or None


def cache_root() -> Path:
    """The configured cache root: ``MLLM_KERNEL_CACHE_DIR`` or :func:`default_cache_root`.

    Builds go there only when it is usable: :func:`.trust.choose_root` says where they go.
    """
    value = cache_root_variable()
    if value:
        return Path(value).expanduser().absolute()
    return default_cache_root()


def cache_path() -> list[Path]:
    """The read-only caches of ``MLLM_KERNEL_CACHE_PATH`` (``os.pathsep``-separated), in
    order; empty items are ignored."""
    value = os.environ.get("MLLM_KERNEL_CACHE_PATH", "")
    return [Path(p).expanduser().absolute() for p in value.split(os.pathsep) if p.strip()]


def trusted_cache_owners() -> tuple[str, ...]:
    """The items of ``MLLM_KERNEL_TRUSTED_CACHE_OWNERS`` (comma-separated user names or
    uids), blanks stripped, empty items ignored; :func:`.trust.trusted_uids` resolves
    them."""
    value = os.environ.get("MLLM_KERNEL_TRUSTED_CACHE_OWNERS", "")
    return tuple(item.strip() for item in value.split(",") if item.strip())


def verbose() -> bool:
    return _flag("MLLM_KERNEL_VERBOSE")


@functools.cache
def check_bounds() -> bool:
    """``MLLM_KERNEL_CHECK_BOUNDS``, read once per process (``check_bounds.cache_clear()``
    re-reads it): store_cache and create_kv_indices consult it on every call, and reading
    an unset variable (a KeyError inside os.environ) costs a large part of a decode launch
    (benchmarks/RESULTS.md, "Measurements behind code choices")."""
    return _flag("MLLM_KERNEL_CHECK_BOUNDS")


def log_level() -> str:
    return os.environ.get("MLLM_KERNEL_LOG_LEVEL", "INFO").upper()


def _seconds(name: str, default: str) -> float:
    """A non-negative number of seconds from ``name``; ``inf`` means no limit."""
    value = os.environ.get(name, "").strip() or default
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(
            f"{name} must be a number of seconds >= 0 (or inf to wait forever), got {value!r}"
        )
    return seconds


def lock_timeout() -> float:
    """``MLLM_KERNEL_LOCK_TIMEOUT`` in seconds (900 when unset; ``math.inf``: no limit)."""
    return _seconds("MLLM_KERNEL_LOCK_TIMEOUT", "900")


# The compilers read these; a value that differs must give a different cache key.
INCLUDE_PATH_VARIABLES = ("CPATH", "CPLUS_INCLUDE_PATH", "C_INCLUDE_PATH")


def include_path_variables() -> dict[str, str]:
    """The include-path variables that are set, name -> value."""
    return {name: os.environ[name] for name in INCLUDE_PATH_VARIABLES if os.environ.get(name)}


# Other variables the compilers and the linker read that change the binary (flags nvcc
# adds to every command, where gcc finds its programs and libraries, clang's
# overrides): a value that differs must give a different cache key too.
COMPILER_VARIABLES = (
    "NVCC_APPEND_FLAGS",
    "NVCC_PREPEND_FLAGS",
    "COMPILER_PATH",
    "GCC_EXEC_PREFIX",
    "LIBRARY_PATH",
    "CCC_OVERRIDE_OPTIONS",
)


def compiler_variables() -> dict[str, str]:
    """The compiler variables (COMPILER_VARIABLES) that are set, name -> value."""
    return {name: os.environ[name] for name in COMPILER_VARIABLES if os.environ.get(name)}


def _first_set(*names: str) -> tuple[str, str] | None:
    """``(value, name)`` of the first of ``names`` set to something other than blanks."""
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            return value, name
    return None


def cuda_arch_list() -> tuple[str, str] | None:
    """``(value, variable name)`` of the arch list the user set, if any."""
    return _first_set("MLLM_KERNEL_CUDA_ARCH_LIST", "TORCH_CUDA_ARCH_LIST")


def cuda_home() -> tuple[str, str] | None:
    """``(path, variable name)`` from ``CUDA_HOME`` or ``CUDA_PATH``, if set."""
    return _first_set("CUDA_HOME", "CUDA_PATH")


def cxx() -> str | None:
    return os.environ.get("CXX", "").strip() or None
