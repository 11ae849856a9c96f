"""What this machine offers mllm-kernel: OS, CPU, CUDA, PyTorch, tool versions.

:func:`collect` gathers it as one JSON-ready dict (``show-env --json`` prints
it as is); :func:`format_env` renders it as aligned text. Nothing here needs a
GPU, nvcc or nvidia-smi: a missing tool is ``None`` in the dict and
``not found`` in the text, and a probe that fails records why instead of raising.

>>> info = collect()
>>> sorted(info)[:3]
['cache_root', 'cpu', 'cuda']
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from mllm_kernel.jit_utils import env, toolchain
from mllm_kernel.jit_utils.cuda_arch import arch_for_capability
from mllm_kernel.jit_utils.errors import ToolchainError

NOT_FOUND = "not found"

# The ISA extensions kernels dispatch on (x86 and Arm spellings from /proc/cpuinfo).
_ISA_FLAG = re.compile(
    r"^(avx|avx2|fma|f16c|avx512.*|avx_vnni.*|amx.*|neon|asimd.*|sve.*|sme(?!p$).*)$"
)
_NVIDIA_SMI_CUDA = re.compile(r"CUDA Version:\s*([\d.]+)")


def _run(command: list[str], timeout: float = 20) -> str | None:
    """stdout of ``command``, or None when it cannot run or fails."""
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def os_info() -> dict[str, str]:
    """``system``, ``release`` and ``machine`` of the running OS."""
    return {
        "system": platform.system(),
        "release": platform.release(),
        "machine": platform.machine(),
    }


def python_info() -> dict[str, str]:
    """The running interpreter's ``version`` and ``executable``."""
    return {"version": platform.python_version(), "executable": sys.executable}


def _cpuinfo_model() -> str | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    # x86 says "model name" ("model" is a number there); Arm boards say "Model" or "Hardware".
    for key in ("model name", "Model", "Hardware", "cpu model"):
        if fields.get(key):
            return fields[key]
    return None


def physical_cores() -> int | None:
    """Physical cores (not hardware threads), or None where the OS does not say."""
    cores = set()
    for cpu in Path("/sys/devices/system/cpu").glob("cpu[0-9]*"):
        try:
            package = (cpu / "topology" / "physical_package_id").read_text().strip()
            core = (cpu / "topology" / "core_id").read_text().strip()
        except OSError:
            continue
        cores.add((package, core))
    if cores:
        return len(cores)
    if platform.system() == "Darwin":
        out = _run(["sysctl", "-n", "hw.physicalcpu"])
        if out and out.strip().isdigit():
            return int(out.strip())
    return None


def isa_flags() -> list[str]:
    """The host CPU's ISA extensions that matter to kernels (avx2, avx512*, amx*, neon, ...).

    Read from the same fingerprint the cache key of ``-march=native`` builds uses.
    """
    machine_and_flags = toolchain.host_isa()
    _, _, flags = machine_and_flags.partition(":")
    found = sorted(f for f in flags.split() if _ISA_FLAG.match(f))
    if not found and platform.machine().lower() in ("arm64", "aarch64"):
        found = ["neon"]  # Armv8-A always has Advanced SIMD; macOS has no /proc/cpuinfo
    return found


def cpu_info() -> dict[str, Any]:
    """CPU ``model``, ``logical_cores``, ``physical_cores`` and ``isa_flags``."""
    return {
        "model": _cpuinfo_model() or platform.processor() or None,
        "logical_cores": os.cpu_count(),
        "physical_cores": physical_cores(),
        "isa_flags": isa_flags(),
    }


def nvidia_smi_info() -> dict[str, Any]:
    """nvidia-smi's ``path``, the ``driver_version`` and the driver's ``cuda_version``."""
    path = shutil.which("nvidia-smi")
    info: dict[str, Any] = {"path": path, "driver_version": None, "cuda_version": None}
    if path is None:
        return info
    out = _run([path, "--query-gpu=driver_version", "--format=csv,noheader"])
    if out and out.strip():
        info["driver_version"] = out.strip().splitlines()[0].strip()
    banner = _run([path])
    match = _NVIDIA_SMI_CUDA.search(banner or "")
    if match:
        info["cuda_version"] = match.group(1)
    return info


def nvidia_smi_capabilities() -> list[tuple[int, int]]:
    """Compute capabilities of the GPUs nvidia-smi lists (empty without nvidia-smi)."""
    path = shutil.which("nvidia-smi")
    out = _run([path, "--query-gpu=compute_cap", "--format=csv,noheader"]) if path else None
    capabilities = []
    for line in (out or "").splitlines():
        match = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", line)
        if match:
            capabilities.append((int(match.group(1)), int(match.group(2))))
    return capabilities


def cuda_info() -> dict[str, Any]:
    """The CUDA toolkit the loader would use (``nvcc``, its real path behind any wrapper
    script, its version), ``CUDA_HOME``/``CUDA_PATH``, and nvidia-smi's view."""
    from_env = env.cuda_home()
    info: dict[str, Any] = {
        "cuda_home": {"variable": from_env[1], "value": from_env[0]} if from_env else None,
        "toolkit": None,
        "nvcc_on_path": None,
        "nvcc_on_path_real": None,
        "nvcc": None,
        "nvcc_real_path": None,
        "nvcc_version": None,
        "toolkit_version": None,
        "toolkit_error": None,
    }
    on_path = shutil.which("nvcc")
    if on_path:
        info["nvcc_on_path"] = on_path
        info["nvcc_on_path_real"] = str(toolchain.follow_wrapper(Path(on_path)))
    try:
        cuda = toolchain.find_cuda()
    except ToolchainError as exc:
        info["toolkit_error"] = str(exc)
    else:
        info["toolkit"] = str(cuda.home)
        info["nvcc"] = str(cuda.nvcc.path)
        info["nvcc_real_path"] = str(cuda.nvcc.real_path)
        info["nvcc_version"] = cuda.nvcc_version().text
        info["toolkit_version"] = cuda.release()
    info["nvidia_smi"] = nvidia_smi_info()
    return info


def torch_info() -> dict[str, Any]:
    """torch's ``version``, the ``cuda_build`` it was compiled against, whether
    ``cuda_available``, and each visible GPU (name, capability, memory, build arch)."""
    try:
        import torch
    except Exception as exc:  # a broken torch install is worth reporting, not crashing on
        return {"version": None, "error": f"cannot import torch: {exc}"}
    info: dict[str, Any] = {
        "version": torch.__version__,
        "cuda_build": torch.version.cuda,
        "cuda_available": False,
        "gpus": [],
    }
    try:
        info["cuda_available"] = bool(torch.cuda.is_available())
        for index in range(torch.cuda.device_count() if info["cuda_available"] else 0):
            props = torch.cuda.get_device_properties(index)
            info["gpus"].append(
                {
                    "index": index,
                    "name": props.name,
                    "compute_capability": f"{props.major}.{props.minor}",
                    "arch": f"sm_{arch_for_capability(props.major, props.minor).number}",
                    "memory_bytes": int(props.total_memory),
                    "details": gpu_details(index),
                }
            )
    except Exception as exc:  # e.g. a driver too old for this torch build
        info["error"] = str(exc).splitlines()[0]
    return info


def gpu_details(index: int) -> dict[str, Any]:
    """:func:`mllm_kernel.cuda.device_info` of GPU ``index`` (builds the runtime's launcher
    module on first use), or ``{"error": why}`` where it cannot be had (no nvcc, say)."""
    try:
        from mllm_kernel.cuda.runtime import device_info

        return device_info(index)
    except Exception as exc:
        return {"error": str(exc).splitlines()[0]}


def gpu_detail_rows(gpu: dict[str, Any]) -> list[tuple[str, str, str]]:
    """show-env rows of one GPU's :func:`gpu_details`."""
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


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def tool_versions() -> dict[str, Any]:
    """Versions of mllm-kernel, apache-tvm-ffi, torch-c-dlpack-ext and the C++ compiler
    (``None`` where one is not installed). No build uses ninja, so it is not asked."""
    from mllm_kernel import __version__

    try:
        import tvm_ffi

        tvm_ffi_version: str | None = tvm_ffi.__version__
    except Exception:
        tvm_ffi_version = _dist_version("apache-tvm-ffi")
    versions: dict[str, Any] = {
        "mllm_kernel": __version__,
        "apache_tvm_ffi": tvm_ffi_version,
        "torch_c_dlpack_ext": _dist_version("torch-c-dlpack-ext"),
        "cxx": None,
        "cxx_version": None,
        "cxx_error": None,
    }
    try:
        cxx = toolchain.find_cxx()
    except ToolchainError as exc:
        versions["cxx_error"] = str(exc)
    else:
        versions["cxx"] = str(cxx.path)
        versions["cxx_version"] = cxx.version()
    return versions


def collect() -> dict[str, Any]:
    """Everything ``show-env`` reports, as one JSON-serialisable dict."""
    return {
        "os": os_info(),
        "python": python_info(),
        "cpu": cpu_info(),
        "cuda": cuda_info(),
        "torch": torch_info(),
        "versions": tool_versions(),
        "cache_root": str(env.cache_root()),
    }


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


def env_rows(info: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(section, field, value)`` rows of :func:`collect`'s dict, missing values spelled out."""
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
        ("Cache", "root", info["cache_root"]),
    ]
    return rows


def format_env(info: dict[str, Any]) -> str:
    """:func:`collect`'s dict as aligned ``Section  field  value`` text."""
    rows = env_rows(info)
    field_width = max(len(field) for _, field, _ in rows)
    lines, section = [], None
    for name, field, value in rows:
        if name != section:
            lines.append(f"{name}:")
            section = name
        lines.append(f"  {field:<{field_width}}  {value}")
    return "\n".join(lines)
