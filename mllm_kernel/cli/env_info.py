"""What this machine offers mllm-kernel: OS, CPU, CUDA, PyTorch, tool versions.

:func:`collect` gathers it as one JSON-ready dict (``show-env --json`` prints
it as is; :func:`mllm_kernel.cli.output.format_env` renders it as text). Nothing
here needs a GPU, nvcc or nvidia-smi: a missing tool is ``None``, and a probe that
fails records why instead of raising.

>>> info = collect()
>>> sorted(info)[:3]
['cache_root', 'cpu', 'cuda']
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from mllm_kernel.jit_utils import env, toolchain, trust
from mllm_kernel.jit_utils.cuda_arch import (
    arch_for_capability,
    choose_cuda_archs,
    cuda_arch_override,
)
from mllm_kernel.jit_utils.errors import CacheRootError, CudaArchError, ToolchainError

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
    """:func:`mllm_kernel.cuda.device_info` of GPU ``index`` (builds the runtime's native
    module on first use), or ``{"error": why}`` where it cannot be had (no nvcc, say)."""
    try:
        from mllm_kernel.cuda.runtime import device_info

        return device_info(index)
    except Exception as exc:
        return {"error": str(exc).splitlines()[0]}


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


def jit_cuda_arch(arch: str | None = None) -> dict[str, Any]:
    """The CUDA archs the loader builds for here (``archs``) and where that choice comes
    from (``source``), by :func:`~mllm_kernel.jit_utils.cuda_arch.choose_cuda_archs`;
    ``arch`` (e.g. ``"9.0a"``) as with ``--arch``. Where none can be chosen, ``archs`` is
    None, ``error`` says what to set, and ``no_gpu`` is True on a machine with no GPU
    where no arch was named (nothing is wrong there: CUDA kernels are just not built)."""
    override = cuda_arch_override(arch) if arch else contextlib.nullcontext()
    try:
        with override:
            archs, source = choose_cuda_archs()
    except CudaArchError as exc:
        return {"archs": None, "source": None, "error": str(exc), "no_gpu": _no_gpu_no_arch()}
    except Exception as exc:  # torch's own errors, e.g. a driver too old for this build
        return {"archs": None, "source": None, "error": str(exc).splitlines()[0], "no_gpu": False}
    return {"archs": [str(a) for a in archs], "source": source}


def _no_gpu_no_arch() -> bool:
    """No arch list is set and torch sees no GPU: the CPU-only machine's normal state."""
    if env.cuda_arch_list() is not None:
        return False
    try:
        import torch

        return not torch.cuda.is_available()
    except Exception:
        return False


def cache_root_info() -> dict[str, Any]:
    """The cache root set (``cache_root``), the one builds go to (``cache_root_in_use``:
    the private default when the one set cannot be used, None when neither can) and
    what is wrong with the one set (``cache_root_problem``, None when it is used)."""
    try:
        choice = trust.choose_root()
    except CacheRootError as exc:
        return {
            "cache_root": str(env.cache_root()),
            "cache_root_in_use": None,
            "cache_root_problem": str(exc),
        }
    return {
        "cache_root": str(choice.configured),
        "cache_root_in_use": str(choice.root),
        "cache_root_problem": choice.problem,
    }


def collect() -> dict[str, Any]:
    """Everything ``show-env`` reports, as one JSON-serialisable dict."""
    return {
        "os": os_info(),
        "python": python_info(),
        "cpu": cpu_info(),
        "cuda": cuda_info(),
        "jit_cuda_arch": jit_cuda_arch(),
        "torch": torch_info(),
        "versions": tool_versions(),
        **cache_root_info(),
    }
