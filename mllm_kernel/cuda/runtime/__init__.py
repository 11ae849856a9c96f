"""The raw runtime: plain ``extern "C" __global__`` kernels compiled to CUBIN/PTX (nvcc
or NVRTC), cached like every module, loaded through tvm-ffi's CUBIN launcher and
launched from Python with an explicit grid, block, shared memory and stream.

Modules: :mod:`.signature` (parameter types from the declaration or a ``signature=``
string), :mod:`.compiler` and :mod:`.nvrtc` (the backends), :mod:`.binary_cache`
(the package cache: key, lock, staging, atomic install), :mod:`.native` (the C++
module, ``cuda/csrc/runtime_launcher.cu``, where images are loaded and arguments are
checked and packed), :mod:`.kernel` (modules and launchable kernels), :mod:`.host_arrays` (NumPy
values, the slow path), :mod:`.low_level` (``Kernel()``) and :mod:`.device_info`.

Importing this package neither needs a GPU nor initialises CUDA.

>>> from mllm_kernel.cuda import compile_kernel
>>> add = compile_kernel('''
... extern "C" __global__ void add(const float* a, const float* b, float* c, int n) {
...   int i = blockIdx.x * blockDim.x + threadIdx.x;
...   if (i < n) c[i] = a[i] + b[i];
... }''', "add", block=256)  # doctest: +SKIP
>>> add(a, b, c, n, grid=(n + 255) // 256)  # doctest: +SKIP
"""

from mllm_kernel.cuda.runtime.device_info import device_info
from mllm_kernel.cuda.runtime.kernel import (
    CompiledKernel,
    CudaModule,
    compile_kernel,
    compile_to_cubin,
    compile_to_ptx,
    load_cubin,
    load_ptx,
)
from mllm_kernel.cuda.runtime.low_level import Kernel

__all__ = [
    "CompiledKernel",
    "CudaModule",
    "Kernel",
    "compile_kernel",
    "compile_to_cubin",
    "compile_to_ptx",
    "device_info",
    "load_cubin",
    "load_ptx",
]
