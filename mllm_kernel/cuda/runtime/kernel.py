"""Loaded modules and launchable kernels: :func:`compile_kernel`, :func:`load_cubin`,
:func:`load_ptx`, :class:`CudaModule` and :class:`CompiledKernel`.

>>> add = compile_kernel(SOURCE, "vector_add", block=256)  # doctest: +SKIP
>>> add(x, y, out, n, grid=(n + 255) // 256)  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mllm_kernel.cuda.runtime import host_arrays
from mllm_kernel.cuda.runtime.binary_cache import compile_cached
from mllm_kernel.cuda.runtime.compile_request import CompileRequest
from mllm_kernel.cuda.runtime.compiler import read_source, resolve_arch
from mllm_kernel.cuda.runtime.native import native_module
from mllm_kernel.cuda.runtime.signature import Param, kernel_params, parse_signature
from mllm_kernel.jit_utils.cuda_driver import require_gpu

Dims = int | Sequence[int] | None

_ELF_MAGIC = b"\x7fELF"
_FATBIN_MAGIC = b"\x50\xed\x55\xba"
# The longest file name (NAME_MAX on Linux and macOS), in bytes.
_NAME_MAX = 255


class CompiledKernel:
    """An ``extern "C"`` kernel ready to launch: ``kernel(*args, grid=, block=, ...)``.

    Arguments follow the kernel's C parameters:

    - a pointer takes a CUDA tensor from torch or any DLPack producer (CuPy, JAX),
      zero-copy, on the GPU the kernel runs on; ``None`` passes a null pointer. The
      kernel gets the data pointer (strides are the kernel's business). A pointer to a
      known scalar type (``float*``, ``half*``, ...) checks the tensor's dtype;
      ``void*`` and ``char*`` take any. A NumPy array is copied to the GPU before the
      launch and, for a non-const pointer, copied back after the kernel finished: such
      a call synchronises.
    - a scalar takes a Python or NumPy int/float/bool, converted to the C type with a
      range check (OverflowError names the parameter).

    Launch configuration: ``grid`` and ``block`` are an int or 1-3 ints, ``shared_mem``
    the dynamic shared memory in bytes (above 48 KiB the kernel is opted in for you),
    ``stream`` a torch stream, any ``__cuda_stream__`` object, a ``cudaStream_t`` int,
    or None: torch's current stream on the tensors' GPU (for CuPy or JAX arrays alone,
    the default stream). Values given when compiling are the defaults; per-call values
    override them.

    Errors: TypeError for a wrong number or kind of arguments, ValueError for a tensor
    on the wrong device or a missing configuration, OverflowError for a scalar out of
    range, RuntimeError (with the CUDA error name and the configuration) when the
    launch fails.
    """

    def __init__(
        self,
        module: CudaModule,
        name: str,
        params: Sequence[Param],
        *,
        grid: Dims = None,
        block: Dims = None,
        shared_mem: int = 0,
    ) -> None:
        self.name = name
        self.params = tuple(params)
        self.module = module
        self._launch = native_module().get_kernel(
            module.library,
            name,
            [p.kind for p in self.params],
            [p.label for p in self.params],
            grid,
            block,
            shared_mem,
        )
        self._device: int | None = None
        # The native module takes stream=None from the call's torch tensors; a kernel that takes
        # none is given torch's current stream here.
        self._tensorless = not any(p.is_pointer for p in self.params)

    def __call__(
        self,
        *args: Any,
        grid: Dims = None,
        block: Dims = None,
        shared_mem: int | None = None,
        stream: Any = None,
    ) -> None:
        if stream is None and self._tensorless:
            stream = torch.cuda.current_stream().cuda_stream
        try:
            self._device = self._launch(grid, block, shared_mem, stream, *args)
        except (TypeError, ValueError, BufferError):
            # NumPy values or a stream object the native module does not take: convert, retry.
            staged = host_arrays.stage(args, self.params, stream)
            if staged is None:
                raise
            self._device = self._launch(grid, block, shared_mem, staged.stream, *staged.args)
            if staged.copy_back:
                self.synchronize()
                staged.finish()
            elif staged.uploads and staged.stream is not None:
                # The copies go back to torch's allocator as this returns, for its current
                # stream's next use, while the kernel on this other stream may read them.
                self.synchronize(staged.stream)

    def synchronize(self, stream: Any = None) -> None:
        """Waits for ``stream`` (a stream object or ``cudaStream_t`` int), or with None for
        all work on the GPU this kernel last ran on; a fault in the kernel raises here."""
        device = self._device if self._device is not None else torch.cuda.current_device()
        handle = host_arrays.stream_handle(stream)
        native_module().synchronize(device, handle or 0, handle is None)

    def __repr__(self) -> str:
        params = ", ".join(p.ctype + (f" {p.name}" if p.name else "") for p in self.params)
        return f"<CompiledKernel {self.name}({params})>"


class CudaModule:
    """A loaded CUBIN or PTX image; :meth:`get_function` gives its kernels.

    Loading needs a GPU: the image is loaded through tvm-ffi's CubinModule into each
    GPU's primary context on first use there.
    """

    def __init__(
        self, image: bytes, *, kind: str, source: str | None = None, where: str = ""
    ) -> None:
        self.kind = kind
        self._source = source
        self._where = where or "<module>"
        # The driver reads PTX as a NUL-terminated string.
        self.library = native_module().load_image(image + b"\0" if kind == "ptx" else image)

    def get_function(
        self,
        name: str,
        signature: str | None = None,
        *,
        grid: Dims = None,
        block: Dims = None,
        shared_mem: int = 0,
    ) -> CompiledKernel:
        """Kernel ``name``, its parameter types read from ``signature``
        (``"const float*, float*, int"``) or, for a module compiled here, from its source."""
        if signature is not None:
            params = parse_signature(signature)
        elif self._source is not None:
            params = kernel_params(self._source, name, self._where)
        else:
            raise ValueError(
                f"a {self.kind.upper()} has no source to read the parameter types of {name!r} "
                "from: pass signature=, e.g. get_function(name, signature='const float*, "
                "float*, int')"
            )
        return CompiledKernel(self, name, params, grid=grid, block=block, shared_mem=shared_mem)


def _request(
    source: str | os.PathLike[str],
    kind: str,
    arch: str | None,
    options: Sequence[str],
    backend: str,
    label: str,
) -> tuple[CompileRequest, str]:
    if isinstance(options, str) or not all(isinstance(o, str) for o in options):
        raise TypeError(f"options must be a sequence of flags like ['-lineinfo'], got {options!r}")
    text, path = read_source(source)
    request = CompileRequest(
        source=text,
        source_path=path,
        label=path.stem if path else label,
        kind=kind,
        arch=resolve_arch(arch),
        options=tuple(options),
        backend=backend,
    )
    return request, str(path) if path else "<source>"


def compile_to_cubin(
    source: str | os.PathLike[str],
    arch: str | None = None,
    options: Sequence[str] = (),
    *,
    backend: str = "nvcc",
    cache_dir: str | Path | None = None,
    verbose: bool = False,
) -> bytes:
    """CUDA source (text or a path) compiled to a CUBIN for ``arch`` (default: what the
    JIT targets, e.g. ``sm_90a`` on Hopper), cached. Needs no GPU.

    >>> cubin = compile_to_cubin(source, arch="sm_90a")  # doctest: +SKIP
    """
    request, _ = _request(source, "cubin", arch, options, backend, "kernel")
    return compile_cached(request, cache_dir=cache_dir, verbose=verbose)


def compile_to_ptx(
    source: str | os.PathLike[str],
    arch: str | None = None,
    options: Sequence[str] = (),
    *,
    backend: str = "nvcc",
    cache_dir: str | Path | None = None,
    verbose: bool = False,
) -> str:
    """Like :func:`compile_to_cubin`, giving PTX text for ``compute_<arch>``."""
    request, _ = _request(source, "ptx", arch, options, backend, "kernel")
    return compile_cached(request, cache_dir=cache_dir, verbose=verbose).decode()


def compile_kernel(
    source: str | os.PathLike[str],
    name: str,
    *,
    arch: str | None = None,
    options: Sequence[str] = (),
    backend: str = "nvcc",
    grid: Dims = None,
    block: Dims = None,
    shared_mem: int = 0,
    cache_dir: str | Path | None = None,
    verbose: bool = False,
    signature: str | None = None,
) -> CompiledKernel:
    """Compiles (or finds in the cache) the ``extern "C" __global__`` kernel ``name`` of
    ``source`` and loads it.

    ``source`` is CUDA C++ text or a path to a .cu file; ``arch`` defaults to the current
    GPU's (``sm_90a`` on Hopper; ``MLLM_KERNEL_CUDA_ARCH_LIST`` overrides); ``options``
    are extra compiler flags; ``backend="nvrtc"`` compiles in-process with NVRTC
    (``pip install mllm-kernel[nvrtc]``); ``grid``/``block``/``shared_mem`` are the default
    launch configuration; ``cache_dir`` overrides the cache root; ``verbose`` prints the
    command, the time and the register/spill report. Parameter types come from the
    kernel's declaration (see :class:`CompiledKernel` for the arguments it takes), or
    from ``signature`` (``"const float*, float*, int"``) where a macro hides it or the
    preprocessor picks among declarations.

    Raises ValueError for a kernel the runtime cannot launch (not found, a template,
    an overload, a parameter type it cannot pass) before compiling, and
    KernelBuildError (leading with ``file:line: message``) when compiling fails.

    >>> source = '''
    ... extern "C" __global__ void scale(const float* x, float* y, float a, int n) {
    ...   int i = blockIdx.x * blockDim.x + threadIdx.x;
    ...   if (i < n) y[i] = a * x[i];
    ... }'''
    >>> scale = compile_kernel(source, "scale", block=256)  # doctest: +SKIP
    >>> scale(x, y, 2.0, n, grid=(n + 255) // 256)  # doctest: +SKIP
    """
    require_gpu("compile_kernel")  # it loads what it compiles: say so before compiling
    request, where = _request(source, "cubin", arch, options, backend, name)
    # before compiling: fails fast
    if signature is not None:
        params = parse_signature(signature)
    else:
        params = kernel_params(request.source, name, where)
    image = compile_cached(request, cache_dir=cache_dir, verbose=verbose)
    module = CudaModule(image, kind="cubin", source=request.source, where=where)
    return CompiledKernel(module, name, params, grid=grid, block=block, shared_mem=shared_mem)


def _could_name_a_file(text: str) -> bool:
    return "\n" not in text and all(
        len(os.fsencode(name)) <= _NAME_MAX for name in text.split(os.sep)
    )


def _read(path: str | os.PathLike[str], caller: str, what: str) -> bytes:
    """The bytes of file ``path``; an empty str (``Path("")`` is the current directory)
    is refused by name."""
    if isinstance(path, str) and not path.strip():
        raise ValueError(
            f"{caller}: an empty string is neither {what} nor the path of a file: pass the "
            "image's contents or a file's path"
        )
    return Path(path).read_bytes()


def load_cubin(path_or_bytes: bytes | str | os.PathLike[str]) -> CudaModule:
    """A CUBIN (or fatbin) from a file or bytes, loaded; kernels through
    ``module.get_function(name, signature="const float*, float*, int")``."""
    if isinstance(path_or_bytes, bytes | bytearray | memoryview):
        image = bytes(path_or_bytes)
    else:
        image = _read(path_or_bytes, "load_cubin", "a CUBIN")
    if not image.startswith((_ELF_MAGIC, _FATBIN_MAGIC)):
        raise ValueError(
            "not a CUBIN or fatbin (no ELF or fatbin header): compile one with "
            "compile_to_cubin() or nvcc -cubin; for PTX use load_ptx()"
        )
    require_gpu("load_cubin")
    return CudaModule(image, kind="cubin")


def load_ptx(path_or_text: str | bytes | os.PathLike[str]) -> CudaModule:
    """PTX from a file or text, JIT-compiled by the driver for the GPU it runs on.

    A str is PTX text when it holds a ``.version`` directive (all PTX does) or cannot be a
    path (several lines, a name longer than a file name may be), else a file's path: the
    text alone decides, so text is never looked up on disk."""
    if isinstance(path_or_text, bytes):
        text = path_or_text.decode()
    elif isinstance(path_or_text, str) and (
        ".version" in path_or_text or not _could_name_a_file(path_or_text)
    ):
        text = path_or_text
    else:
        text = _read(path_or_text, "load_ptx", "PTX").decode()
    if ".version" not in text or ".target" not in text:
        raise ValueError(
            "not PTX (no .version / .target directive): compile it with compile_to_ptx() "
            "or nvcc -ptx"
        )
    require_gpu("load_ptx")
    return CudaModule(text.encode(), kind="ptx")
