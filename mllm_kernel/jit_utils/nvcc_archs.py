"""Which CUDA archs exist: those the CUDA toolkit's nvcc compiles for, or a known set.

``parse_arch_list`` (:mod:`.cuda_arch`) accepts any number (``sm_999`` parses); an arch
given by hand is checked here against ``nvcc --list-gpu-arch`` when nvcc is found, else
against :data:`KNOWN_ARCHS`, so a typo is refused where it is typed.

>>> from mllm_kernel.jit_utils.cuda_arch import parse_arch_list
>>> check_known(parse_arch_list("9.0a")[0])  # doctest: +SKIP
CudaArch(major=9, minor=0, suffix='a', ptx=False)
"""

from __future__ import annotations

import functools
import re
import subprocess

from mllm_kernel.jit_utils import toolchain
from mllm_kernel.jit_utils.cuda_arch import CudaArch
from mllm_kernel.jit_utils.errors import CudaArchError, ToolchainError

# Every sm_XX some CUDA 11.x-13.x nvcc compiles for (sm_101 is CUDA 12.8-12.9's name of
# CUDA 13's sm_110): the set used where no nvcc can be asked.
KNOWN_ARCHS = frozenset(
    {35, 37, 50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 88, 89}
    | {90, 100, 101, 103, 110, 120, 121}
)
# The suffixed forms: "a" (arch-specific) from sm_90 on, "f" (family) from sm_100 on.
_SUFFIX_FROM = {"": 0, "a": 90, "f": 100}
_COMPUTE = re.compile(r"compute_(\d+)")


@functools.cache  # one nvcc per process (toolchain.find_cuda is cached too)
def _nvcc_list(nvcc: str) -> frozenset[int] | None:
    try:
        out = subprocess.run(
            [nvcc, "--list-gpu-arch"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = frozenset(int(n) for n in _COMPUTE.findall(out.stdout))
    return found if out.returncode == 0 and found else None


def known_archs() -> tuple[frozenset[int], str]:
    """``(arch numbers such as 90, where the list comes from)``: ``nvcc --list-gpu-arch``
    of the toolkit the loader uses, else :data:`KNOWN_ARCHS`."""
    try:
        cuda = toolchain.find_cuda()
    except ToolchainError:
        return KNOWN_ARCHS, "the archs CUDA 11-13 know (no nvcc found to ask)"
    listed = _nvcc_list(str(cuda.nvcc.path))
    if listed is None:
        return KNOWN_ARCHS, f"the archs CUDA 11-13 know ({cuda.nvcc.path} --list-gpu-arch failed)"
    return listed, f"{cuda.nvcc.path} --list-gpu-arch"


def check_known(arch: CudaArch, what: str = "CUDA arch") -> CudaArch:
    """``arch`` when nvcc (or the known set) has it, with its suffix allowed there; else
    CudaArchError naming it, what it was given as, and the archs there are."""
    numbers, source = known_archs()
    base = arch.major * 10 + arch.minor
    if base in numbers and base >= _SUFFIX_FROM[arch.suffix]:
        return arch
    listed = ", ".join(f"sm_{n}" for n in sorted(numbers))
    suffixes = "; 'a' suffix from sm_90, 'f' from sm_100" if arch.suffix else ""
    raise CudaArchError(
        f"{what} sm_{arch.number} is not one nvcc compiles for; known ({source}): "
        f"{listed}{suffixes}. Give one of those, e.g. 9.0a (H100/H200) or 8.0 (A100)"
    )
