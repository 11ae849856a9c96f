"""Choosing the CUDA architectures a module is compiled for: one order for every user.

The loader, precompile, show-config, show-env and the clangd config all ask
:func:`choose_cuda_archs` (or :func:`resolve_cuda_archs`, its archs alone), which
takes the first of:

1. an active :func:`cuda_arch_override` (``precompile --arch``, ``show-config --arch``);
2. ``MLLM_KERNEL_CUDA_ARCH_LIST``;
3. ``TORCH_CUDA_ARCH_LIST``;
4. the compute capability of the GPU in use (``device_index``, else torch's current
   device), as torch sees it.

Never a silent default: with no GPU and nothing set, :class:`CudaArchError` says
what to set (only the clangd config, which needs some arch to parse CUDA files,
falls back to one, and says so).

Capability 9.0 and newer get the ``a`` suffix (``sm_90a``): Hopper's wgmma,
TMA and setmaxnreg exist only in arch-specific code.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

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


def choose_cuda_archs(device_index: int | None = None) -> tuple[tuple[CudaArch, ...], str]:
    """``(archs, where they came from)``, in the order of the module docstring: the
    source reads ``override (--arch)``, ``$MLLM_KERNEL_CUDA_ARCH_LIST``,
    ``$TORCH_CUDA_ARCH_LIST`` or ``GPU 0 (compute capability 9.0)``."""
    overridden = _override.get()
    if overridden is not None:
        return overridden, "override (--arch)"
    from_env = env.cuda_arch_list()
    if from_env:
        value, name = from_env
        try:
            return parse_arch_list(value), f"${name}"
        except CudaArchError as exc:
            raise CudaArchError(f"${name}: {exc}") from None
    import torch

    if not torch.cuda.is_available():
        raise CudaArchError(
            "No CUDA GPU is visible and no arch was given: to compile without a GPU, name "
            "one (9.0a for H100/H200): --arch 9.0a (precompile, show-config), arch='9.0a' "
            "(compile_to_cubin, compile_to_ptx), or MLLM_KERNEL_CUDA_ARCH_LIST=9.0a "
            "(everything, load_cuda_jit included)."
        )
    index = torch.cuda.current_device() if device_index is None else device_index
    major, minor = torch.cuda.get_device_capability(index)
    return (arch_for_capability(major, minor),), f"GPU {index} (compute capability {major}.{minor})"


def resolve_cuda_archs(device_index: int | None = None) -> tuple[CudaArch, ...]:
    """The archs to compile for now (:func:`choose_cuda_archs` without the source)."""
    return choose_cuda_archs(device_index)[0]


class UnsupportedArchError(NotImplementedError):
    """A module asked to be built for archs none of which its kernels run on."""


@dataclass(frozen=True)
class ArchSupport:
    """The archs a module's kernels run on, declared once with the module: built for
    the archs of the list that it supports, refused (:class:`UnsupportedArchError`) when
    there are none, so that no build of it for another arch exists. ``minimum``: the
    oldest compute capability; ``arch_specific``: only ``major.minor`` with the ``a``
    suffix (wgmma, TMA and setmaxnreg exist only in arch-specific code). ``uses``: the
    features that need it (``"wgmma and TMA"``), for the messages and show-config.

    >>> HOPPER_ONLY.supports(CudaArch(9, 0)), HOPPER_ONLY.supports(CudaArch(9, 0, "a"))
    (False, True)
    """

    minimum: tuple[int, int] = (0, 0)
    arch_specific: tuple[int, int] | None = None
    uses: str = ""

    @property
    def why(self) -> str:
        """``"it uses wgmma and TMA"``, or ``""`` where nothing is named."""
        return f"it uses {self.uses}" if self.uses else ""

    def supports(self, arch: CudaArch) -> bool:
        """Whether these kernels run on ``arch``."""
        if self.arch_specific is not None:
            return (arch.major, arch.minor) == self.arch_specific and arch.suffix == "a"
        return (arch.major, arch.minor) >= self.minimum

    def describe(self) -> str:
        """``"sm_90a only"`` / ``"sm_80 and newer"`` / ``"every arch"``."""
        if self.arch_specific is not None:
            return f"sm_{self.arch_specific[0]}{self.arch_specific[1]}a only"
        if self.minimum > (0, 0):
            return f"sm_{self.minimum[0]}{self.minimum[1]} and newer"
        return "every arch"

    def explain(self) -> str:
        """:meth:`describe` with :attr:`why`: ``"sm_90a only (it uses wgmma and TMA)"``."""
        return f"{self.describe()} ({self.why})" if self.why else self.describe()

    def select(self, archs: tuple[CudaArch, ...], module: str) -> tuple[CudaArch, ...]:
        """The archs of ``archs`` this module is built for; UnsupportedArchError naming
        ``module``, the archs and the supported ones when none is."""
        chosen = tuple(arch for arch in archs if self.supports(arch))
        if chosen:
            return chosen
        wanted = ", ".join(f"sm_{arch.number}" for arch in archs)
        fix = (
            f"; build for {self.arch_specific[0]}.{self.arch_specific[1]}a (e.g. "
            f"MLLM_KERNEL_CUDA_ARCH_LIST={self.arch_specific[0]}.{self.arch_specific[1]}a)"
            if self.arch_specific is not None
            else ""
        )
        raise UnsupportedArchError(
            f"{module} cannot be built for {wanted}: it runs on {self.explain()}{fix}"
        )


EVERY_ARCH = ArchSupport()
HOPPER_ONLY = ArchSupport(arch_specific=(9, 0), uses="wgmma and TMA")
AMPERE_OR_NEWER = ArchSupport(minimum=(8, 0), uses="mma.sync, ldmatrix and cp.async")


@dataclass(frozen=True)
class OpArchs:
    """The archs one CUDA op runs on, read from the declarations of the kernel modules
    that serve it (``modules``: ``(name, ArchSupport)`` pairs): the op runs on an arch
    where one of its modules does.

    >>> gemm = OpArchs("gemm", (("gemm", HOPPER_ONLY), ("gemm_sm80", AMPERE_OR_NEWER)))
    >>> gemm.describe(), gemm.modules_for(CudaArch(8, 9)), gemm.modules_for(CudaArch(7, 5))
    ('sm_80 and newer', ('gemm_sm80',), ())
    """

    op: str
    modules: tuple[tuple[str, ArchSupport], ...]

    def modules_for(self, arch: CudaArch) -> tuple[str, ...]:
        """The op's modules whose kernels run on ``arch``."""
        return tuple(name for name, support in self.modules if support.supports(arch))

    def describe(self) -> str:
        """The union of its modules' archs: ``"sm_80 and newer"``, ``"sm_90a only"``,
        ``"every arch"``; an arch-specific one beyond the others' range is listed too
        (``"sm_90a, sm_100 and newer"``)."""
        supports = [support for _, support in self.modules]
        floors = [s.minimum for s in supports if s.arch_specific is None]
        lowest = min(floors, default=None)
        specific = sorted(
            {
                s.arch_specific
                for s in supports
                if s.arch_specific is not None and (lowest is None or s.arch_specific < lowest)
            }
        )
        names = [f"sm_{major}{minor}a" for major, minor in specific]
        if lowest is None:
            return ", ".join(names) + " only"
        return ", ".join([*names, ArchSupport(minimum=lowest).describe()])


def op_archs(entries: Iterable[Any]) -> list[OpArchs]:
    """The CUDA kernel modules ``entries`` (registry entries: ``name``, ``op``, ``archs``;
    ``registry.kernels("cuda")``) grouped by the op they serve (``op``, else their own
    name), sorted by op, each op's modules by name: the one table precompile's notes and
    show-config read."""
    grouped: dict[str, list[tuple[str, ArchSupport]]] = {}
    for entry in entries:
        grouped.setdefault(entry.op or entry.name, []).append((entry.name, entry.archs))
    return [OpArchs(op, tuple(sorted(grouped[op], key=lambda m: m[0]))) for op in sorted(grouped)]


def gencode_flags(archs: tuple[CudaArch, ...]) -> list[str]:
    return [flag for arch in archs for flag in arch.gencode()]
