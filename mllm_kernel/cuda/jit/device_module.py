"""The compiled module of an op for the GPU a tensor lives on.

A CUDA module is compiled for one arch, which ``load_cuda_jit`` takes from the
current GPU. The first call per (builder, arguments, device) builds under that
device, so a tensor on ``cuda:1`` gets code for ``cuda:1`` whatever device is
current; later calls are one dict lookup.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

_modules: dict[tuple[Any, ...], Any] = {}
_lock = threading.Lock()


def module_for(builder: Callable[..., Any], device: torch.device, *args: Any) -> Any:
    """``builder(*args)`` (a ``cache_once`` module builder) compiled for ``device``.

    >>> module_for(_norm_module, x.device).rmsnorm(out, x, weight, 1e-6)  # doctest: +SKIP
    """
    key = (builder, device.index, *args)
    module = _modules.get(key)
    if module is not None:
        return module
    if device.type != "cuda":  # the kernel's own checks name the misplaced argument
        return builder(*args)
    with _lock:
        module = _modules.get(key)
        if module is None:
            with torch.cuda.device(device):
                # uncached: cache_once keys on args alone, which would hand a module
                # built for one GPU's arch to a GPU of another.
                module = builder.uncached(*args)
            _modules[key] = module
    return module
