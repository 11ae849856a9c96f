"""Whether this process can run CUDA kernels at all: a driver, and a GPU it sees.

Compiling needs only the toolkit (nvcc), so the JIT never asks this; what loads or
launches a kernel does, before it compiles anything, so that a machine without a GPU
hears so at once and not after a compile fails to load: :func:`require_gpu`.

The answer comes from the driver library itself (``libcuda``), not from torch: a
CPU build of torch says "no CUDA" on a machine that has a GPU, and the raw runtime
(``compile_kernel``, ``load_cubin``, ``device_info``) needs no torch CUDA.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

_LIBRARY = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"


class GpuUnavailableError(RuntimeError):
    """No CUDA GPU can run kernels in this process; the message says why and what to do."""


@functools.cache  # the driver and its devices do not come and go within a process
def gpu_unavailable_reason() -> str | None:
    """Why no CUDA kernel can run here (no driver library, the driver refuses to start,
    no visible GPU), or None when at least one GPU is usable.

    >>> gpu_unavailable_reason()  # doctest: +SKIP
    'no NVIDIA driver is installed (libcuda.so.1 cannot be loaded)'
    """
    try:
        driver = ctypes.CDLL(_LIBRARY)
    except OSError:
        return f"no NVIDIA driver is installed ({_LIBRARY} cannot be loaded)"
    status = driver.cuInit(0)
    if status != 0:
        return f"the NVIDIA driver did not start: cuInit returned {_error_name(driver, status)}"
    count = ctypes.c_int(0)
    status = driver.cuDeviceGetCount(ctypes.byref(count))
    if status != 0:
        return f"the NVIDIA driver cannot count GPUs: {_error_name(driver, status)}"
    if count.value == 0:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        hidden = f" (CUDA_VISIBLE_DEVICES={visible!r} hides them?)" if visible is not None else ""
        return f"the NVIDIA driver sees no GPU{hidden}"
    return None


def _error_name(driver: ctypes.CDLL, status: int) -> str:
    name = ctypes.c_char_p()
    if driver.cuGetErrorName(status, ctypes.byref(name)) == 0 and name.value:
        return f"{name.value.decode()} ({status})"
    return f"error {status}"


def require_gpu(what: str) -> None:
    """Raises :class:`GpuUnavailableError` naming ``what`` (``"device_info"``) when no
    GPU can run kernels here; returns at once (a cached answer) when one can."""
    reason = gpu_unavailable_reason()
    if reason is not None:
        raise GpuUnavailableError(
            f"{what} needs an NVIDIA GPU, and {reason}. Run it on a machine with a GPU and "
            "its driver; without one, CUDA code can still be compiled (compile_to_cubin, "
            "compile_to_ptx, precompile --arch 9.0a) but not loaded or run"
        )


def require_torch_cuda(what: str) -> None:
    """Like :func:`require_gpu`, for code that moves data to the GPU through torch: also
    raises when this torch was built without CUDA (a CPU wheel), saying so."""
    import torch

    if torch.cuda.is_available():
        return
    require_gpu(what)
    raise GpuUnavailableError(
        f"{what} needs torch with CUDA, and this torch ({torch.__version__}) "
        + (
            "was built without CUDA: install the CUDA build of torch for your driver"
            if torch.version.cuda is None
            else "cannot use the GPU (torch.cuda.is_available() is False)"
        )
    )
