"""The compiled module of an op for the GPU a tensor lives on.

A CUDA module is compiled for one arch, which ``load_cuda_jit`` takes from the
current GPU. The first call per (builder, arguments, device) builds under that
device, so a tensor on ``cuda:1`` gets code for ``cuda:1`` whatever device is
current. A tensor that is not on a GPU (index -1: CPU, meta) raises ValueError
before an arch is chosen or anything compiles; the op's ``op_inputs.explain``
names the argument. Later calls are two dict lookups keyed on ``tensor.get_device()``: this
runs on every decode call, where building a ``torch.device`` and a tuple key took
0.40 us against 0.23 us now (timeit, this repo's 2-core dev box).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from mllm_kernel.jit_utils import op_inputs

# builder -> {device index, or (device index, *args): module}
_modules: dict[Callable[..., Any], dict[Any, Any]] = {}
_NONE: dict[Any, Any] = {}
_lock = threading.Lock()


def module_for(builder: Callable[..., Any], tensor: torch.Tensor, *args: Any) -> Any:
    """``builder(*args)`` (a ``cache_once`` module builder) compiled for ``tensor``'s GPU;
    ValueError if ``tensor`` is not on a GPU.

    >>> module_for(_norm_module, x).rmsnorm(out, x, weight, 1e-6)  # doctest: +SKIP
    """
    index = tensor.get_device()
    key = (index, *args) if args else index
    module = _modules.get(builder, _NONE).get(key)
    if module is not None:
        return module
    if index < 0:  # not a CUDA tensor: refuse before choosing an arch or compiling
        op_inputs.not_on_device(tensor, "cuda")
    with _lock:
        built = _modules.setdefault(builder, {})
        module = built.get(key)
        if module is None:
            with torch.cuda.device(index):
                # uncached: cache_once keys on args alone, which would hand a module
                # built for one GPU's arch to a GPU of another.
                module = builder.uncached(*args)
            built[key] = module
    return module
