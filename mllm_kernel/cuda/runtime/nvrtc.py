"""The NVRTC backend: compiles in-process through cuda-python's NVRTC bindings, no nvcc.

An optional dependency: ``pip install mllm-kernel[nvrtc]``. Only what the bindings need
is imported, and only when this backend is used.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from mllm_kernel.cuda.runtime.compile_request import (
    CompileFailed,
    CompileOutput,
    CompileRequest,
    record_inputs,
    search_path,
)
from mllm_kernel.jit_utils import build_inputs, include_search, toolchain
from mllm_kernel.jit_utils.errors import ToolchainError

_MISSING = (
    "backend='nvrtc' needs cuda-python's NVRTC bindings (cuda.bindings.nvrtc), which are not "
    "installed: pip install mllm-kernel[nvrtc] (or use backend='nvcc')"
)


def _bindings() -> Any:
    try:
        import cuda.bindings.nvrtc as nvrtc
    except ImportError as exc:
        raise ToolchainError(f"{_MISSING} ({exc})") from None
    return nvrtc


def _check(result: Any, what: str) -> None:
    nvrtc = _bindings()
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise ToolchainError(f"NVRTC {what} failed: {result}")


def identity() -> str:
    """The NVRTC version and the bindings' version (no compiler runs)."""
    nvrtc = _bindings()
    import cuda.bindings

    result, major, minor = nvrtc.nvrtcVersion()
    _check(result, "nvrtcVersion")
    return f"nvrtc {major}.{minor} (cuda-bindings {cuda.bindings.__version__})"


def _text(buffer: bytes) -> str:
    return buffer.rstrip(b"\0").decode("utf-8", "replace")


def _program_log(nvrtc: Any, program: Any) -> str:
    result, size = nvrtc.nvrtcGetProgramLogSize(program)
    _check(result, "nvrtcGetProgramLogSize")
    buffer = b" " * size
    (result,) = nvrtc.nvrtcGetProgramLog(program, buffer)
    _check(result, "nvrtcGetProgramLog")
    return _text(buffer)


def _options(request: CompileRequest) -> list[str]:
    options = [f"--gpu-architecture={request.target}"]
    if request.kind == "cubin":
        options.append("--ptxas-options=--verbose")  # the register and spill report
    if request.source_path is not None:  # quoted #includes next to the file
        options.append(f"-I{request.source_path.parent}")
    # Without a toolkit, NVRTC's built-in headers still cover most kernels.
    with contextlib.suppress(ToolchainError):
        options.append(f"-I{toolchain.find_cuda().home / 'include'}")
    return [*options, *request.options]


def compile_with_nvrtc(request: CompileRequest, staging: Path) -> CompileOutput:
    """Compiles ``request`` with NVRTC into ``staging``; CompileFailed carries the log."""
    nvrtc = _bindings()
    options = _options(request)
    started, started_ns = time.monotonic(), time.time_ns()
    # Messages name the file as nvcc's do: the path given, or "<label>.cu" for text.
    name = str(request.source_path) if request.source_path else request.source_name
    result, program = nvrtc.nvrtcCreateProgram(request.source.encode(), name.encode(), 0, [], [])
    _check(result, "nvrtcCreateProgram")
    try:
        (result,) = nvrtc.nvrtcCompileProgram(program, len(options), [o.encode() for o in options])
        log = f"nvrtc {' '.join(options)} {name}\n{_program_log(nvrtc, program)}"
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileFailed(log)
        get_size, get = (
            (nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN)
            if request.kind == "cubin"
            else (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX)
        )
        result, size = get_size(program)
        _check(result, get_size.__name__)
        buffer = b" " * size
        (result,) = get(program, buffer)
        _check(result, get.__name__)
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    artifact = staging / f"{request.label}.{request.kind}"
    # PTX comes NUL-terminated from NVRTC; the file holds the text alone, as nvcc's does.
    artifact.write_bytes(buffer.rstrip(b"\0") if request.kind == "ptx" else buffer)
    return CompileOutput(
        artifact=artifact,
        log=log,
        seconds=time.monotonic() - started,
        inputs=_inputs(request, options, started_ns),
        toolchain={"nvrtc": identity()},
    )


def _inputs(
    request: CompileRequest, options: list[str], started_ns: int
) -> build_inputs.BuildInputs:
    """What NVRTC read: it reports no dependencies, so the directives are read (every
    branch of an ``#if``; its built-in headers are not files and are left out)."""
    dirs = search_path(request, options)
    here = str(request.source_path.parent) if request.source_path else None
    toolchain_dirs = include_search.toolchain_dirs_of(cuda=True)
    opened = build_inputs.scan_includes(request.source.encode(), dirs, toolchain_dirs, here)
    if request.source_path is not None:
        opened.insert(0, str(request.source_path))
    return record_inputs(request, opened, dirs, started_ns)
