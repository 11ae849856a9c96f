"""What the ops ask of a GPU before they launch on it, read once per device index.

:func:`device_facts` reads ``torch.cuda.get_device_properties`` the first time an
index is asked for and keeps the answer for the process (a GPU does not change
under it), so an op's hot path pays a dict lookup. On top of it,
:func:`matmul_path` is the one rule that picks between the GEMMs' kernels (``gemm``,
``int8_scaled_mm``): wgmma on sm_90 with sm_90a code, mma.sync elsewhere from sm_80 on;
:func:`require_hopper` admits what runs on sm_90a only.

The raw runtime's :func:`mllm_kernel.cuda.runtime.device_info` reports every
property through the CUDA runtime itself, without torch (and builds its launcher
module to do so): that is for showing a GPU; this is for the torch ops.

>>> device_facts(0).sm_count  # doctest: +SKIP
132
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from mllm_kernel.jit_utils.cuda_arch import (
    AMPERE_OR_NEWER,
    HOPPER_ONLY,
    CudaArch,
    choose_cuda_archs,
    resolve_cuda_archs,
)
from mllm_kernel.jit_utils.cuda_driver import require_torch_cuda
from mllm_kernel.jit_utils.logging_setup import get_logger

_logger = get_logger()


@dataclass(frozen=True)
class DeviceFacts:
    """GPU ``index`` as torch reports it: ``capability`` ``(9, 0)`` for an H100."""

    index: int
    name: str
    capability: tuple[int, int]
    sm_count: int


_facts: dict[int, DeviceFacts] = {}
# GPU indices already found to be sm_90 with sm_90a in this build's archs.
_sm90a_ready: set[int] = set()
# GPU index -> MatmulPath, decided once (tests that change the arch list clear it).
_matmul_paths: dict[int, MatmulPath] = {}


def device_facts(index: int) -> DeviceFacts:
    """The facts of GPU ``index`` (``torch.cuda`` numbering, so after
    ``CUDA_VISIBLE_DEVICES``); TypeError for an index that is not an int, ValueError
    for one no visible GPU has, GpuUnavailableError where torch sees no GPU at all.

    >>> device_facts(0).capability  # doctest: +SKIP
    (9, 0)
    """
    facts = _facts.get(index)
    if facts is not None:
        return facts
    if isinstance(index, bool) or not isinstance(index, int):
        raise TypeError(f"device index must be an int (0 for cuda:0), got {index!r}")
    require_torch_cuda("device_facts")
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f", CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
        raise ValueError(
            f"no GPU has index {index}: torch sees {count} (cuda:0 to cuda:{count - 1}{where}); "
            "pass the index of one of them, e.g. tensor.device.index"
        )
    props = torch.cuda.get_device_properties(index)
    facts = DeviceFacts(
        index=index,
        name=str(props.name),
        capability=(int(props.major), int(props.minor)),
        sm_count=int(props.multi_processor_count),
    )
    return _facts.setdefault(index, facts)  # one answer per index, should threads race


def require_hopper(index: int, op: str) -> DeviceFacts:
    """The facts of GPU ``index`` once it is known to run ``op``'s sm_90a code:
    NotImplementedError naming ``op`` unless the GPU has compute capability 9.0 and the
    archs this process builds for include sm_90a (checked once per index).

    >>> require_hopper(0, "gemm").sm_count  # doctest: +SKIP
    132
    """
    facts = device_facts(index)
    if facts.capability != (9, 0):
        major, minor = facts.capability
        raise NotImplementedError(
            f"{op} needs a GPU of compute capability 9.0 (Hopper: H100, H200; it uses TMA "
            f"and wgmma); cuda:{index} has compute capability {major}.{minor}"
        )
    if index not in _sm90a_ready:
        if CudaArch(9, 0, "a") not in resolve_cuda_archs(index):
            raise NotImplementedError(
                f"{op} needs code built for sm_90a (wgmma exists only there): include 9.0a in "
                "MLLM_KERNEL_CUDA_ARCH_LIST / TORCH_CUDA_ARCH_LIST, or unset them"
            )
        _sm90a_ready.add(index)
    return facts


@dataclass(frozen=True)
class MatmulPath:
    """Which of the GEMMs' kernels GPU ``facts.index`` runs: ``wgmma`` (TMA + wgmma,
    ``csrc/gemm.cu``) or the sm_80 kernels (cp.async + mma.sync, ``csrc/gemm_sm80.cu``)."""

    facts: DeviceFacts
    wgmma: bool


def matmul_path(index: int, op: str) -> MatmulPath:
    """The kernels ``op`` (``gemm``, ``int8_scaled_mm``) runs on GPU ``index``, decided
    once per index: the wgmma kernels where the GPU is sm_90 and the archs this process
    builds for include sm_90a; else the sm_80 kernels (mma.sync exists on every GPU from
    sm_80 on: Ampere, Ada, Orin, Blackwell, and Hopper without sm_90a code, as when
    ``MLLM_KERNEL_CUDA_ARCH_LIST=8.0+PTX`` runs them there: an INFO line says so, once
    for that GPU, since they are slower there than the wgmma kernels).
    NotImplementedError naming ``op``, the GPU's arch and the supported ones below sm_80.

    >>> matmul_path(0, "gemm").wgmma  # doctest: +SKIP
    True
    """
    path = _matmul_paths.get(index)
    if path is not None:
        return path
    facts = device_facts(index)
    major, minor = facts.capability
    if not AMPERE_OR_NEWER.supports(CudaArch(major, minor)):
        raise NotImplementedError(
            f"{op} runs on {AMPERE_OR_NEWER.describe()} ({AMPERE_OR_NEWER.why}; the wgmma "
            f"kernels on {HOPPER_ONLY.describe()}); cuda:{index} ({facts.name}) is "
            f"sm_{major}{minor} "
            f"(compute capability {major}.{minor})"
        )
    if (major, minor) != (9, 0):
        return _matmul_paths.setdefault(index, MatmulPath(facts, wgmma=False))
    archs, source = choose_cuda_archs(index)
    path = MatmulPath(facts, wgmma=any((a.major, a.minor, a.suffix) == (9, 0, "a") for a in archs))
    decided = _matmul_paths.setdefault(index, path)
    if decided is path and not path.wgmma:  # logged by the thread whose decision holds
        _logger.info(
            "cuda:%d (%s) is sm_90 but the archs built for (%s, from %s) have no sm_90a "
            "code: gemm and int8_scaled_mm run their sm_80 kernels (mma.sync) there, not "
            "the wgmma ones; add 9.0a to the arch list to run those",
            index,
            facts.name,
            ";".join(map(str, archs)),
            source,
        )
    return decided
