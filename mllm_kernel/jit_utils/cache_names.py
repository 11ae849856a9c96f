"""The names of everything under a cache root, built and parsed in this module only.

::

    <entry>/                      entry_dirname(): <name>_<device>_<args>_<hash[:16]>,
                                  or binary_dirname(): cuda_<kind>_<label>_<target>_<hash[:16]>
    .staging/<entry>.<pid>.<hex>  staging_dirname(): a build in progress
    .staging/<entry>.old.<hex>    replaced_dirname(): an entry moved aside to be replaced
    .locks/<entry>.lock           lock_name(): the cross-process build lock
    .locks/<entry>.owner          owner_name(): who holds it
    .logs/<entry>.log             log_name(): the full log of the last failed build

:func:`entry_of` reads any of these back to its ``<entry>``, and :func:`belongs_to`
tells which kernel an entry name is of, for ``clear-cache --kernel`` where no
manifest says so.

>>> entry = "rmsnorm_cpu_fp32_t_0123456789abcdef"
>>> entry_of(staging_dirname(entry)) == entry_of(log_name(entry)) == entry
True
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterable

from mllm_kernel.jit_utils.spec import DEVICES, BuildSpec

STAGING_DIR = ".staging"
LOCKS_DIR = ".locks"
LOGS_DIR = ".logs"

_UNSAFE_IN_DIRNAME = re.compile(r"[^A-Za-z0-9_.+-]+")
_HASH_CHARS = 16
_MAX_ARGS_CHARS = 64
_MAX_LABEL_CHARS = 48
_FILE_SUFFIXES = (".lock", ".owner", ".log")
# What every entry name ends with: an underscore and the first 16 hex digits of its hash.
_ENTRY_SUFFIX = re.compile(rf"_[0-9a-f]{{{_HASH_CHARS}}}$")


def entry_dirname(spec: BuildSpec, key_hash: str) -> str:
    """A readable entry directory name: ``<name>_<device>_<args>_<hash[:16]>``."""
    args = _UNSAFE_IN_DIRNAME.sub("-", "_".join(spec.template_args)).strip("-_")
    parts = [spec.name, spec.device, *([args[:_MAX_ARGS_CHARS]] if args else [])]
    return "_".join([*parts, key_hash[:_HASH_CHARS]])


def binary_dirname(kind: str, label: str, target: str, key_hash: str) -> str:
    """The entry of one raw-runtime binary (:mod:`mllm_kernel.cuda.runtime`):
    ``cuda_<kind>_<label>_<target>_<hash[:16]>``, e.g. ``cuda_cubin_add_sm_90a_0123...``."""
    label = _UNSAFE_IN_DIRNAME.sub("-", label)[:_MAX_LABEL_CHARS]
    return f"cuda_{kind}_{label}_{target}_{key_hash[:_HASH_CHARS]}"


def is_entry_name(name: str) -> bool:
    """Whether ``name`` has the form of an entry directory (:func:`entry_dirname`,
    :func:`binary_dirname`: it ends in ``_`` and 16 hex digits of its key's hash). The
    cache's listing and clear-cache take nothing else under the root, so a root that
    also holds other things (``MLLM_KERNEL_CACHE_DIR=~/.cache``) loses none of them.

    >>> is_entry_name("rmsnorm_cpu_fp32_t_0123456789abcdef"), is_entry_name("huggingface")
    (True, False)
    """
    return _ENTRY_SUFFIX.search(name) is not None


def belongs_to(entry: str, kernels: Iterable[str]) -> bool:
    """Whether the entry name ``entry`` is of one of ``kernels`` (on any device)."""
    return any(entry.startswith(f"{kernel}_{device}_") for kernel in kernels for device in DEVICES)


def _unique() -> str:
    return uuid.uuid4().hex[:8]


def staging_dirname(entry: str) -> str:
    """A fresh name for a build of ``entry`` in progress: ``<entry>.<pid>.<hex>``."""
    return f"{entry}.{os.getpid()}.{_unique()}"


def replaced_dirname(entry: str) -> str:
    """A fresh name for ``entry``'s old directory while it is replaced: ``<entry>.old.<hex>``."""
    return f"{entry}.old.{_unique()}"


def lock_name(entry: str) -> str:
    return f"{entry}.lock"


def owner_name(entry: str) -> str:
    return f"{entry}.owner"


def log_name(entry: str) -> str:
    return f"{entry}.log"


def entry_of(name: str) -> str:
    """The entry a staging, replaced, lock, owner or log name was made for (a name of
    none of these forms is returned as it is)."""
    for suffix in _FILE_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    parts = name.rsplit(".", 2)
    return parts[0] if len(parts) == 3 else name
