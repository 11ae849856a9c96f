"""Compiling CUDA source to one CUBIN or PTX file, with nvcc (here) or NVRTC (:mod:`.nvrtc`).

A :class:`~.compile_request.CompileRequest` describes the compilation as data;
:func:`compile_in` runs it in a directory with its backend and returns the artifact, or
raises KernelBuildError leading with the compiler's first ``file:line: message``. Caching
is :mod:`.binary_cache`'s job.
"""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path

from mllm_kernel.cuda.runtime.compile_request import (
    CompileFailed,
    CompileOutput,
    CompileRequest,
    record_inputs,
    search_path,
)
from mllm_kernel.jit_utils import build, toolchain
from mllm_kernel.jit_utils.cuda_arch import (
    CudaArch,
    arch_for_capability,
    parse_arch_list,
    resolve_cuda_archs,
)
from mllm_kernel.jit_utils.errors import CudaArchError, KernelBuildError

# A str naming a source file ends in one of these; any other str is source text.
SOURCE_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".hh", ".inl")


def is_source_text(source: str) -> bool:
    """Whether a str is CUDA source text rather than a file name, decided from the text
    alone: looking text up on disk fails for a line longer than a file name may be
    (ENAMETOOLONG). A file name is one line ending in a :data:`SOURCE_SUFFIXES` suffix,
    without the braces and semicolons every kernel definition or declaration has.

    >>> is_source_text("kernels/add.cu"), is_source_text('#include "add.cuh"')
    (False, True)
    """
    return (
        not source.strip()
        or any(c in source for c in "\n\r{};")
        or not source.lower().endswith(SOURCE_SUFFIXES)
    )


def read_source(source: str | os.PathLike[str]) -> tuple[str, Path | None]:
    """``(text, path)``: a path (a PathLike, or a str naming a source file, see
    :func:`is_source_text`) is read; other text is the source itself (``path`` None).
    A file of another name is read when given as a ``pathlib.Path``."""
    if isinstance(source, str):
        if is_source_text(source):
            return source, None
        path = Path(source)
    elif isinstance(source, os.PathLike):
        path = Path(source)
    else:
        raise TypeError(f"source must be CUDA source text or a path, got {type(source).__name__}")
    if not path.is_file():
        raise FileNotFoundError(f"CUDA source file {str(path)!r} does not exist")
    return path.read_text(), path.absolute()


def resolve_arch(arch: str | None = None) -> CudaArch:
    """One target arch: ``arch`` (``"sm_90a"``, ``"9.0a"``, ``"90a"``), else what the JIT
    would build for (``MLLM_KERNEL_CUDA_ARCH_LIST``, else the current GPU). A CUBIN holds
    one arch, so a list of several picks the current GPU's or asks for ``arch=``."""
    if arch is not None:
        archs = parse_arch_list(str(arch))
        if len(archs) != 1:
            raise CudaArchError(f"arch must name one architecture, got {arch!r}")
        return archs[0]
    archs = resolve_cuda_archs()
    if len(archs) == 1:
        return archs[0]
    import torch

    if torch.cuda.is_available():
        mine = arch_for_capability(*torch.cuda.get_device_capability())
        for candidate in archs:
            if (candidate.major, candidate.minor) == (mine.major, mine.minor):
                return candidate
    listed = ";".join(map(str, archs))
    raise CudaArchError(
        f"a CUBIN or PTX holds one architecture, and the arch list is {listed}: pass arch= "
        "(for example arch='sm_90a')"
    )


def _opened(depfile: Path, staging: Path) -> list[str]:
    """The files nvcc opened, as it named them, less source text written to staging."""
    opened = [os.path.join(staging, dep) for dep in build.parse_depfile(depfile.read_text())]
    here = os.path.normpath(staging)
    return [p for p in opened if os.path.dirname(os.path.normpath(p)) != here]


def _build_error(request: CompileRequest, log: str, log_path: Path) -> KernelBuildError:
    error = build.first_error(log)
    hint = build.hint_for(log)
    message = f"{error}\n  while compiling {request.describe()}\n  full log: {log_path}" + (
        f"\n  hint: {hint}" if hint else ""
    )
    return KernelBuildError(
        message,
        module=request.label,
        template_args=(request.kind, request.target),
        first_error=error,
        log_path=str(log_path),
        hint=hint,
    )


def _compile_with_nvcc(request: CompileRequest, staging: Path) -> CompileOutput:
    cuda = toolchain.find_cuda()
    if request.source_path is None:
        unit = request.source_name  # relative, so messages say "vector_add.cu(3): ..."
        (staging / unit).write_text(request.source)
    else:
        unit = str(request.source_path)
    artifact = staging / f"{request.label}.{request.kind}"
    number = request.arch.number
    code = f"sm_{number}" if request.kind == "cubin" else f"compute_{number}"
    command = [
        str(cuda.nvcc.path),
        "-ccbin",
        str(toolchain.find_cxx().path),
        f"-{request.kind}",
        f"-gencode=arch=compute_{number},code={code}",
        # The register and spill report, kept in the log for verbose=True.
        *(["--resource-usage"] if request.kind == "cubin" else []),
        *request.options,
        # Every header opened, -isystem ones included (-MMD leaves those out).
        "-MD",
        "-MF",
        "deps.d",
        "-o",
        str(artifact),
        unit,
    ]
    started, started_ns = time.monotonic(), time.time_ns()
    ((code, output),) = build.run_compilers([command], staging)
    log = f"$ {shlex.join(command)}\n{output}"
    if code != 0 or not artifact.is_file():
        raise CompileFailed(log)
    return CompileOutput(
        artifact=artifact,
        log=log,
        seconds=time.monotonic() - started,
        inputs=record_inputs(
            request,
            _opened(staging / "deps.d", staging),
            search_path(request, request.options),
            started_ns,
        ),
        toolchain={"nvcc": cuda.nvcc_version().text},
    )


def compile_in(request: CompileRequest, staging: Path, log_path: Path) -> CompileOutput:
    """Compiles ``request`` inside ``staging``; on failure writes the log to ``log_path``
    and raises KernelBuildError."""
    try:
        if request.backend == "nvrtc":
            # The optional backend is imported on use, not by `import mllm_kernel.cuda`.
            from mllm_kernel.cuda.runtime import nvrtc

            return nvrtc.compile_with_nvrtc(request, staging)
        return _compile_with_nvcc(request, staging)
    except CompileFailed as failed:
        log_path.write_text(failed.log)
        raise _build_error(request, failed.log, log_path) from None


def compiler_identity(backend: str) -> dict[str, str]:
    """What identifies the compiler in a cache key, found without running it."""
    if backend == "nvrtc":
        from mllm_kernel.cuda.runtime import nvrtc

        return {"nvrtc": nvrtc.identity()}
    return {"nvcc": toolchain.find_cuda().identity, "cxx": toolchain.find_cxx().identity}
