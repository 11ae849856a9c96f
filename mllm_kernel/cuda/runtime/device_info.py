"""``device_info(device)``: what a GPU offers kernels, as the CUDA runtime reports it."""

from __future__ import annotations

from typing import Any

from mllm_kernel.cuda.runtime.native import native_module
from mllm_kernel.jit_utils.cuda_arch import resolve_cuda_archs
from mllm_kernel.jit_utils.cuda_driver import require_gpu


def theoretical_bandwidth_gbps(memory_clock_khz: int, bus_width_bits: int) -> float:
    """Peak DRAM bandwidth in GB/s: two transfers per memory clock (DDR, HBM) over the bus."""
    return 2 * memory_clock_khz * 1e3 * bus_width_bits / 8 / 1e9


def device_info(device: int = 0) -> dict[str, Any]:
    """GPU ``device``'s properties as a dict.

    ``name``, ``compute_capability`` (``"9.0"``), ``sm_count``, ``warp_size``,
    ``max_threads_per_block``, ``max_threads_per_sm``, ``shared_memory_per_block``
    (without opting in), ``shared_memory_per_block_optin``, ``shared_memory_per_sm``,
    ``registers_per_block``, ``registers_per_sm``, ``l2_cache_bytes``,
    ``total_memory_bytes``, ``memory_clock_khz``, ``memory_bus_width_bits``,
    ``memory_bandwidth_gbps`` (theoretical, from the clock and bus width),
    ``cluster_launch`` (thread-block clusters supported) and ``jit_arch``: what the JIT
    compiles for on this device (``sm_90a``; several joined by ``;`` when
    ``MLLM_KERNEL_CUDA_ARCH_LIST`` lists several).

    >>> device_info(0)["compute_capability"]  # doctest: +SKIP
    '9.0'
    """
    if isinstance(device, bool) or not isinstance(device, int):
        raise TypeError(f"device must be a GPU index (int), got {device!r}")
    require_gpu("device_info")
    props = dict(native_module().device_properties(device))
    info: dict[str, Any] = {"index": device, "name": str(props.pop("name"))}
    major, minor = int(props.pop("major")), int(props.pop("minor"))
    info["compute_capability"] = f"{major}.{minor}"
    info.update({key: int(value) for key, value in sorted(props.items())})
    info["cluster_launch"] = bool(info["cluster_launch"])
    info["memory_bandwidth_gbps"] = round(
        theoretical_bandwidth_gbps(info["memory_clock_khz"], info["memory_bus_width_bits"]), 1
    )
    info["jit_arch"] = ";".join(f"sm_{arch.number}" for arch in resolve_cuda_archs(device))
    return info
