"""Choosing the CUDA architectures a module is compiled for.

Order: an active :func:`cuda_arch_override` (``precompile --arch``), then
``MLLM_KERNEL_CUDA_ARCH_LIST``, then ``TORCH_CUDA_ARCH_LIST``, then the
compute capability of the GPU in use. Never a silent default: with no GPU and
nothing set, :class:`CudaArchError` says what to set.

Capability 9.0 and newer get the ``a`` suffix (``sm_90a``): Hopper's wgmma,
TMA and setmaxnreg exist only in arch-specific code.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterator
from dataclasses import dataclass

from mllm_kernel.jit_utils import env
from mllm_kernel.jit_utils.errors import CudaArchError

_ARCH = re.compile(r"(?:sm_|compute_)?(\d+)\.?(\d)?([af]?)(\+ptx)?", re.IGNORECASE)

_override: contextvars.ContextVar[tuple[CudaArch, ...] | None] = contextvars.ContextVar(
    "mllm_kernel_cuda_arch_override", default=None
)


@dataclass(frozen=True, order=True)
class CudaArch:
    """One target: ``CudaArch(9, 0, "a")`` is sm_90a; ``ptx`` also embeds PTX."""

    major: int
    minor: int
    suffix: str = ""
    ptx: bool = False

    @property
    def number(self) -> str:
        return f"{self.major}{self.minor}{self.suffix}"

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}" + ("+PTX" if self.ptx else "")

    def gencode(self) -> list[str]:
        flags = [f"-gencode=arch=compute_{self.number},code=sm_{self.number}"]
        if self.ptx:
            flags.append(f"-gencode=arch=compute_{self.number},code=compute_{self.number}")
        return flags


def parse_arch_list(text: str) -> tuple[CudaArch, ...]:
    """Parses ``"9.0a"``, ``"90a"``, ``"sm_90a"``, ``"8.0;9.0a"``, ``"8.6 9.0+PTX"``."""
    archs = []
    for item in re.split(r"[;,\s]+", text.strip()):
        if not item:
            continue
        match = _ARCH.fullmatch(item)
        if not match:
            raise CudaArchError(
                f"cannot parse CUDA arch {item!r} in {text!r}: use forms like 9.0a, 90a or sm_90a"
            )
        digits, minor, suffix, ptx = match.groups()
        if minor is None:  # "90a": last digit is the minor version
            if len(digits) < 2:
                raise CudaArchError(f"cannot parse CUDA arch {item!r}: write it as 9.0 or 90")
            digits, minor = digits[:-1], digits[-1]
        archs.append(CudaArch(int(digits), int(minor), suffix.lower(), bool(ptx)))
    if not archs:
        raise CudaArchError(f"empty CUDA arch list {text!r}")
    return tuple(sorted(set(archs)))


def arch_for_capability(major: int, minor: int) -> CudaArch:
    """The arch to build for a GPU of compute capability ``major.minor``."""
    return CudaArch(major, minor, "a" if major >= 9 else "")


@contextlib.contextmanager
def cuda_arch_override(archs: str | tuple[CudaArch, ...]) -> Iterator[tuple[CudaArch, ...]]:
    """Builds inside the block target ``archs`` regardless of the GPU (or its absence)."""
    parsed = parse_arch_list(archs) if isinstance(archs, str) else tuple(archs)
    token = _override.set(parsed)
    try:
        yield parsed
    finally:
        _override.reset(token)


def describe_source() -> str:
    """Where :func:`resolve_cuda_archs` would take the archs from (for show-config)."""
    if _override.get() is not None:
        return "override (--arch)"
    from_env = env.cuda_arch_list()
    if from_env:
        return f"${from_env[1]}"
    return "the current GPU"


def resolve_cuda_archs(device_index: int | None = None) -> tuple[CudaArch, ...]:
    """The archs to compile for now; see the module docstring for the order."""
    overridden = _override.get()
    if overridden is not None:
        return overridden
    from_env = env.cuda_arch_list()
    if from_env:
        value, name = from_env
        try:
            return parse_arch_list(value)
        except CudaArchError as exc:
            raise CudaArchError(f"${name}: {exc}") from None
    import torch

    if not torch.cuda.is_available():
        raise CudaArchError(
            "No CUDA GPU is visible and no arch was given: set MLLM_KERNEL_CUDA_ARCH_LIST "
            "(for example 9.0a for H100/H200) to compile without a GPU."
        )
    index = torch.cuda.current_device() if device_index is None else device_index
    return (arch_for_capability(*torch.cuda.get_device_capability(index)),)


def gencode_flags(archs: tuple[CudaArch, ...]) -> list[str]:
    return [flag for arch in archs for flag in arch.gencode()]
