"""The raw runtime's native (C++) module, ``csrc/runtime_launcher.cu``, built by the JIT
like every module.

It loads CUBIN/PTX images through tvm-ffi's CubinModule, packs arguments and launches
their kernels, and reports device properties; see that file for its exports. It holds
no device code, so one build serves every GPU. Registered with the JIT registry (under
its source file's name) so ``show-config`` and ``precompile`` list it.
"""

from __future__ import annotations

from typing import Any

import tvm_ffi

from mllm_kernel.jit_utils import cache_once, load_cuda_jit, register_kernel

_EXPORTS = (
    "load_image",
    "get_kernel",
    "pack_arguments",
    "synchronize",
    "device_properties",
)

# The module raises OverflowError for an int that does not fit its parameter;
# tvm-ffi maps only the error kinds it was told about to Python classes.
tvm_ffi.register_error("OverflowError", OverflowError)


@register_kernel("cuda_runtime_launcher", device="cuda", variants=[()])
@cache_once
def native_module() -> Any:
    """The loaded native module (built on first use, then from the cache)."""
    namespace = "mllm_kernel::cuda::runtime"
    return load_cuda_jit(
        "cuda_runtime_launcher",
        cuda_files=["runtime_launcher.cu"],
        cuda_wrappers=[(name, f"{namespace}::{name}") for name in _EXPORTS],
    )
