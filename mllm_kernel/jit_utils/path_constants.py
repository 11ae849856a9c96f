"""The original mllm-kernel's ``MLLM_KERNEL_*_PATH`` / ``MLLM_KERNEL_*_DIR`` constants.

Each is computed once, at import, from :mod:`mllm_kernel.jit_utils.paths` (the one
place that knows where things are), so they agree with what the loader uses:

=================================  ============================================
``MLLM_KERNEL_TOP_PATH``           the ``mllm_kernel`` package directory
``MLLM_KERNEL_INCLUDE_DIR``        the ``-I`` directory of ``mllm_kernel/*.hpp``
``MLLM_KERNEL_<DEV>_PATH``         ``mllm_kernel/<dev>``
``MLLM_KERNEL_<DEV>_CSRC_DIR``     the kernel sources of ``<dev>`` (``csrc/`` in a
                                   checkout, ``sources/`` in an installed wheel)
``MLLM_KERNEL_<DEV>_INCLUDE_DIR``  the headers of ``<dev>`` (``mllm_kernel/<dev>/``
                                   under the include directory)
=================================  ============================================

``<DEV>`` is ``CPU``, ``CUDA`` or ``ASCEND``. A tree this install does not have (any
ASCEND one; a device's sources in a wheel built without it) is where it would be, as
in the original: test ``.is_dir()`` before relying on one.
"""

from __future__ import annotations

from pathlib import Path

from mllm_kernel.jit_utils import paths
from mllm_kernel.jit_utils.spec import DEVICES

# Where a device's sources go in this layout: named like those of a device we have.
_SOURCE_DIR_NAME = next(
    (found.name for found in map(paths.kernel_source_dir, DEVICES) if found),
    "sources",
)


def _include_dir() -> Path:
    try:
        return paths.include_dir()
    except FileNotFoundError:  # headers missing: where an installed wheel keeps them
        return paths.PACKAGE_DIR / "include"


def _source_dir(device: str) -> Path:
    found = paths.kernel_source_dir(device) if device in DEVICES else None
    return found or paths.PACKAGE_DIR / device / _SOURCE_DIR_NAME


MLLM_KERNEL_TOP_PATH = paths.PACKAGE_DIR
MLLM_KERNEL_INCLUDE_DIR = _include_dir()

MLLM_KERNEL_CPU_PATH = MLLM_KERNEL_TOP_PATH / "cpu"
MLLM_KERNEL_CUDA_PATH = MLLM_KERNEL_TOP_PATH / "cuda"
MLLM_KERNEL_ASCEND_PATH = MLLM_KERNEL_TOP_PATH / "ascend"

MLLM_KERNEL_CPU_CSRC_DIR = _source_dir("cpu")
MLLM_KERNEL_CUDA_CSRC_DIR = _source_dir("cuda")
MLLM_KERNEL_ASCEND_CSRC_DIR = _source_dir("ascend")

MLLM_KERNEL_CPU_INCLUDE_DIR = MLLM_KERNEL_INCLUDE_DIR / "mllm_kernel" / "cpu"
MLLM_KERNEL_CUDA_INCLUDE_DIR = MLLM_KERNEL_INCLUDE_DIR / "mllm_kernel" / "cuda"
MLLM_KERNEL_ASCEND_INCLUDE_DIR = MLLM_KERNEL_INCLUDE_DIR / "mllm_kernel" / "ascend"

__all__ = [
    "MLLM_KERNEL_ASCEND_CSRC_DIR",
    "MLLM_KERNEL_ASCEND_INCLUDE_DIR",
    "MLLM_KERNEL_ASCEND_PATH",
    "MLLM_KERNEL_CPU_CSRC_DIR",
    "MLLM_KERNEL_CPU_INCLUDE_DIR",
    "MLLM_KERNEL_CPU_PATH",
    "MLLM_KERNEL_CUDA_CSRC_DIR",
    "MLLM_KERNEL_CUDA_INCLUDE_DIR",
    "MLLM_KERNEL_CUDA_PATH",
    "MLLM_KERNEL_INCLUDE_DIR",
    "MLLM_KERNEL_TOP_PATH",
]
