"""Terminal output for the CLI: aligned tables, colour only on a terminal, sizes, and
show-env's text (:func:`format_env` of :func:`.env_info.collect`'s facts)."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, TextIO

NOT_FOUND = "not found"
_ANSI = re.compile(r"\033\[[0-9;]*m")
_COLOURS = {"red": "31", "green": "32", "yellow": "33", "bold": "1", "dim": "2"}


def use_colour(stream: TextIO | None = None) -> bool:
    """Colour only on a terminal, and never with ``NO_COLOR`` set or ``TERM=dumb``."""
    stream = sys.stdout if stream is None else stream
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


def paint(text: str, colour: str, enabled: bool | None = None) -> str:
    """``text`` in ``colour`` (red, green, yellow, bold, dim) where :func:`use_colour`."""
    if not (use_colour() if enabled is None else enabled):
        return text
    return f"\033[{_COLOURS[colour]}m{text}\033[0m"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> str:
    """Rows under headers, columns padded to their widest cell (colour codes not counted)."""
    cells = [list(headers), *[list(map(str, row)) for row in rows]]
    widths = [max(len(_ANSI.sub("", row[i])) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [
            cell + " " * (width - len(_ANSI.sub("", cell)))
            for cell, width in zip(row, widths, strict=True)
        ]
        lines.append((indent + "  ".join(padded)).rstrip())
    return "\n".join(lines)


def print_json(data: Any) -> None:
    """``data`` as indented JSON on stdout (paths and other objects as strings)."""
    print(json.dumps(data, indent=2, sort_keys=False, default=str))


def _or_missing(value: Any, missing: str = NOT_FOUND) -> str:
    return missing if value is None or value == "" else str(value)


def format_bytes(size: int | None) -> str:
    """``1536`` -> ``1.5 KiB``; None -> ``-``."""
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


# What a machine without a GPU is told about CUDA: a fact, not a fault to fix.
NO_GPU_ARCH = (
    "none (no GPU here: CUDA kernels are built only for an arch you name, e.g. --arch 9.0a "
    "or MLLM_KERNEL_CUDA_ARCH_LIST=9.0a)"
)


def format_jit_arch(arch: dict[str, Any]) -> str:
    """:func:`.env_info.jit_cuda_arch` as ``9.0a (from $MLLM_KERNEL_CUDA_ARCH_LIST)``,
    :data:`NO_GPU_ARCH` on a machine without a GPU, or ``unknown: <what to set>``."""
    if arch["archs"]:
        return f"{';'.join(arch['archs'])} (from {arch['source']})"
    if arch.get("no_gpu"):
        return NO_GPU_ARCH
    return f"unknown: {arch['error']}"


def format_cache_root(info: dict[str, Any]) -> str:
    """:func:`.env_info.cache_root_info` as one line: the root builds go to and,
    when it is not the one ``MLLM_KERNEL_CACHE_DIR`` sets, why that one is not used."""
    problem = info["cache_root_problem"]
    if not problem:
        return info["cache_root"]
    if info["cache_root_in_use"] is None:  # the CacheRootError's text names both roots
        return problem
    return (
        f"{info['cache_root_in_use']} (MLLM_KERNEL_CACHE_DIR={info['cache_root']} is not used: "
        f"{problem})"
    )


def env_rows(info: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(section, field, value)`` rows of :func:`.env_info.collect`'s dict,
    missing values spelled out."""
    rows: list[tuple[str, str, str]] = []
    os_, py, cpu, cuda, torch_, ver = (
        info["os"],
        info["python"],
        info["cpu"],
        info["cuda"],
        info["torch"],
        info["versions"],
    )
    rows += [
        ("OS", "system", f"{os_['system']} {os_['release']} ({os_['machine']})"),
        ("Python", "version", py["version"]),
        ("Python", "executable", py["executable"]),
        ("CPU", "model", _or_missing(cpu["model"], "unknown")),
        (
            "CPU",
            "cores",
            f"{_or_missing(cpu['logical_cores'], '?')} logical, "
            f"{_or_missing(cpu['physical_cores'], '?')} physical",
        ),
        ("CPU", "ISA", " ".join(cpu["isa_flags"]) or "none of avx2/avx512/amx/neon"),
    ]
    home = cuda["cuda_home"]
    rows.append(
        ("CUDA", "CUDA_HOME", f"{home['value']} (${home['variable']})" if home else "not set")
    )
    for field, path, real in (
        ("nvcc on PATH", cuda["nvcc_on_path"], cuda["nvcc_on_path_real"]),
        ("nvcc", cuda["nvcc"], cuda["nvcc_real_path"]),
    ):
        shown = f"{path} -> {real}" if path and real and real != path else path
        rows.append(("CUDA", field, _or_missing(shown)))
    rows.append(("CUDA", "nvcc version", _or_missing(cuda["nvcc_version"], "-")))
    if cuda["toolkit"]:
        toolkit = f"{cuda['toolkit']} (CUDA {_or_missing(cuda['toolkit_version'], '?')})"
    else:
        toolkit = f"{NOT_FOUND}: {(cuda['toolkit_error'] or '').split(':', 1)[-1].strip()}"
    rows.append(("CUDA", "toolkit", toolkit))
    rows.append(("CUDA", "JIT arch", format_jit_arch(info["jit_cuda_arch"])))
    smi = cuda["nvidia_smi"]
    rows.append(("CUDA", "nvidia-smi", _or_missing(smi["path"])))
    rows.append(("CUDA", "driver", _or_missing(smi["driver_version"], "-")))
    rows.append(("CUDA", "driver CUDA", _or_missing(smi["cuda_version"], "-")))
    if torch_.get("version") is None:
        rows.append(("PyTorch", "version", f"{NOT_FOUND} ({torch_.get('error', '')})"))
    else:
        rows.append(("PyTorch", "version", torch_["version"]))
        rows.append(
            ("PyTorch", "CUDA build", _or_missing(torch_["cuda_build"], "none (CPU build)"))
        )
        available = "yes" if torch_["cuda_available"] else "no"
        if torch_.get("error"):
            available += f" ({torch_['error']})"
        rows.append(("PyTorch", "CUDA available", available))
        for gpu in torch_["gpus"]:
            rows.append(
                (
                    "PyTorch",
                    f"GPU {gpu['index']}",
                    f"{gpu['name']}, capability {gpu['compute_capability']} ({gpu['arch']}), "
                    f"{format_bytes(gpu['memory_bytes'])}",
                )
            )
            rows += gpu_detail_rows(gpu)
        if not torch_["gpus"]:
            rows.append(("PyTorch", "GPUs", "none visible"))
    rows += [
        ("Versions", "mllm-kernel", ver["mllm_kernel"]),
        ("Versions", "apache-tvm-ffi", _or_missing(ver["apache_tvm_ffi"])),
        ("Versions", "torch-c-dlpack-ext", _or_missing(ver["torch_c_dlpack_ext"])),
        (
            "Versions",
            "C++ compiler",
            f"{ver['cxx']} ({ver['cxx_version']})" if ver["cxx"] else NOT_FOUND,
        ),
        ("Cache", "root", format_cache_root(info)),
    ]
    return rows


def format_env(info: dict[str, Any]) -> str:
    """:func:`.env_info.collect`'s dict as aligned ``Section  field  value`` text."""
    rows = env_rows(info)
    field_width = max(len(field) for _, field, _ in rows)
    lines, section = [], None
    for name, field, value in rows:
        if name != section:
            lines.append(f"{name}:")
            section = name
        lines.append(f"  {field:<{field_width}}  {value}")
    return "\n".join(lines)


def gpu_detail_rows(gpu: dict[str, Any]) -> list[tuple[str, str, str]]:
    """show-env rows of one GPU's :func:`.env_info.gpu_details`."""
    name, details = f"GPU {gpu['index']}", gpu.get("details") or {}
    if "error" in details or not details:
        return [("PyTorch", f"{name} details", f"unavailable ({details.get('error', '?')})")]
    clusters = "yes" if details["cluster_launch"] else "no"
    return [
        (
            "PyTorch",
            f"{name} compute",
            f"{details['sm_count']} SMs, warp {details['warp_size']}, "
            f"{details['max_threads_per_block']} threads/block, "
            f"{details['max_threads_per_sm']} threads/SM, "
            f"{details['registers_per_sm']} registers/SM, clusters {clusters}, "
            f"JIT arch {details['jit_arch']}",
        ),
        (
            "PyTorch",
            f"{name} shared memory",
            f"{format_bytes(details['shared_memory_per_block'])}/block "
            f"({format_bytes(details['shared_memory_per_block_optin'])} opt-in), "
            f"{format_bytes(details['shared_memory_per_sm'])}/SM",
        ),
        (
            "PyTorch",
            f"{name} memory",
            f"{format_bytes(details['total_memory_bytes'])}, "
            f"L2 {format_bytes(details['l2_cache_bytes'])}, "
            f"{details['memory_bus_width_bits']}-bit at "
            f"{details['memory_clock_khz'] / 1000:.0f} MHz: "
            f"{details['memory_bandwidth_gbps']:.0f} GB/s theoretical",
        ),
    ]
