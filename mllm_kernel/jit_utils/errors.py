"""Exceptions raised by the JIT core. Each message says what to fix."""

from __future__ import annotations


class ToolchainError(RuntimeError):
    """A compiler (C++ or nvcc) or the CUDA toolkit is missing or unusable.

    Raised before any build starts.
    """


class CudaArchError(RuntimeError):
    """No CUDA architecture could be chosen, or the one given is malformed."""


class KernelBuildError(RuntimeError):
    """A kernel module failed to compile or link.

    The message starts with the first compiler error as ``file:line: message``,
    names the module and its template arguments, gives the path of the full log
    and, for the common causes, a hint. The parts are also attributes.
    """

    def __init__(
        self,
        message: str,
        *,
        module: str,
        template_args: tuple[str, ...],
        first_error: str,
        log_path: str,
        hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.module = module
        self.template_args = template_args
        self.first_error = first_error
        self.log_path = log_path
        self.hint = hint


class CacheRootError(OSError):
    """No cache root can be used: neither the one ``MLLM_KERNEL_CACHE_DIR`` names nor the
    private default under the home directory can be trusted, created and written.

    The message names both roots, what is wrong with each (the OS error, or why it cannot
    be trusted) and what to set instead.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class CacheLockTimeout(TimeoutError):
    """Waited too long for another process to finish building the same module."""
