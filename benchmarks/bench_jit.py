"""JIT core costs, in one run: cold compile (CPU, CUDA), warm load in a fresh
process, and per-call overhead of a built-in op vs its raw tvm-ffi function and
vs torch.add on a small tensor.

    python benchmarks/bench_jit.py [--out FILE.md] [--repeats N]

Targets (issue 3): a cached kernel's first call within 20 ms of loading its op
module; a built-in op within 1.3x of the raw tvm-ffi call and below
``torch.add(x, c, out=y)`` on a small CPU tensor.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import timeit
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]

PROBE_CPP = """
#include <cstdint>
namespace bench {
template <int K>
int64_t scale(int64_t x) { return x * K; }
}  // namespace bench
"""

PROBE_CU = """
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.cuh"
namespace bench {
__global__ void noop_kernel() {}
void noop(tvm::ffi::TensorView x) {
  mllm_kernel::KernelLauncher(1, 32, x.device())(noop_kernel);
}
}  // namespace bench
"""

WARM_SCRIPT = textwrap.dedent("""
    import time, torch
    t0 = time.perf_counter()
    from mllm_kernel.cpu.jit import add_constant
    t1 = time.perf_counter()
    add_constant(torch.ones(8), 8)
    t2 = time.perf_counter()
    print(f"{(t1 - t0) * 1e3:.3f} {(t2 - t1) * 1e3:.3f}")
""")


def _cold_cpu(cache: Path) -> float:
    from mllm_kernel.jit_utils import load_cpu_jit

    source = cache.parent / "bench_probe.cpp"
    source.write_text(PROBE_CPP)
    start = time.perf_counter()
    load_cpu_jit(
        "bench_probe", "3", cpp_files=[str(source)], cpp_wrappers=[("scale", "bench::scale<3>")]
    )
    return time.perf_counter() - start


def _cold_cuda(cache: Path) -> float | None:
    from mllm_kernel.jit_utils import cuda_arch_override, load_cuda_jit
    from mllm_kernel.jit_utils.errors import ToolchainError
    from mllm_kernel.jit_utils.toolchain import find_cuda

    try:
        find_cuda()
    except ToolchainError:
        return None
    source = cache.parent / "bench_probe.cu"
    source.write_text(PROBE_CU)
    arch = None if torch.cuda.is_available() else "9.0a"
    start = time.perf_counter()
    if arch:
        with cuda_arch_override(arch):
            load_cuda_jit(
                "bench_noop", cuda_files=[str(source)], cuda_wrappers=[("noop", "bench::noop")]
            )
    else:
        load_cuda_jit(
            "bench_noop", cuda_files=[str(source)], cuda_wrappers=[("noop", "bench::noop")]
        )
    return time.perf_counter() - start


def _warm_fresh_process(repeats: int) -> tuple[float, float, float]:
    """Median (import ms, first call ms, whole process ms) over fresh processes."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    imports, calls, walls = [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", WARM_SCRIPT], env=env, capture_output=True, text=True, check=True
        ).stdout.split()
        walls.append((time.perf_counter() - start) * 1e3)
        imports.append(float(out[0]))
        calls.append(float(out[1]))
    return statistics.median(imports), statistics.median(calls), statistics.median(walls)


def _warm_lookup_us() -> float:
    """In process: the cache key and the validation of a cached entry (manifest, artifact
    checksum, every recorded input), what each first load of a kernel does before dlopen."""
    from mllm_kernel.jit_utils import cache, registry
    from mllm_kernel.jit_utils.cache_key import module_key
    from mllm_kernel.jit_utils.status import CacheState

    (entry,) = [e for e in registry.kernels("cpu") if e.name == "add_constant"]
    spec = entry.spec((8,))
    assert cache.lookup(module_key(spec)).status is CacheState.HIT
    return _per_call_us(lambda: cache.lookup(module_key(spec)), number=200)


def _per_call_us(fn, number: int = 20000, repeat: int = 7) -> float:
    fn()
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def _overheads() -> list[tuple[str, float]]:
    from mllm_kernel.cpu.jit import add_constant
    from mllm_kernel.cpu.jit.add_constant import _ADD_CONSTANT

    x = torch.randn(16)
    y = torch.empty_like(x)
    raw = _ADD_CONSTANT[8].add_constant
    threads = torch.get_num_threads()
    rows = [
        (
            "cpu add_constant(x, 8, out=y), 16 floats",
            _per_call_us(lambda: add_constant(x, 8, out=y)),
        ),
        ("raw tvm-ffi function (same args)", _per_call_us(lambda: raw(y, x, threads))),
        ("torch.add(x, 8, out=y)", _per_call_us(lambda: torch.add(x, 8, out=y))),
    ]
    if torch.cuda.is_available():
        from mllm_kernel.cuda.jit import add_constant as cuda_add_constant
        from mllm_kernel.cuda.jit.add_constant import _ADD_CONSTANT as CUDA_ADD_CONSTANT

        xc = torch.randn(16, device="cuda")
        yc = torch.empty_like(xc)
        raw_cuda = CUDA_ADD_CONSTANT[xc.get_device(), 8].add_constant
        rows += [
            (
                "cuda add_constant(x, 8, out=y), 16 floats",
                _per_call_us(lambda: cuda_add_constant(xc, 8, out=yc), number=5000),
            ),
            ("raw tvm-ffi function (same args)", _per_call_us(lambda: raw_cuda(yc, xc), 5000)),
            (
                "torch.add(x, 8, out=y) (cuda)",
                _per_call_us(lambda: torch.add(xc, 8, out=yc), number=5000),
            ),
        ]
        torch.cuda.synchronize()
    return rows


def _seconds(value: float | None) -> str:
    return "n/a (no nvcc)" if value is None else f"{value:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the table to this markdown file")
    parser.add_argument("--repeats", type=int, default=7, help="fresh processes for the warm load")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        os.environ["MLLM_KERNEL_CACHE_DIR"] = str(cache)
        cold_cpu = _cold_cpu(cache)
        cold_cuda = _cold_cuda(cache)
        from mllm_kernel.cpu.jit import add_constant

        add_constant(torch.ones(8), 8)  # cached now, for the fresh processes
        imp, first, wall = _warm_fresh_process(args.repeats)
        lookup = _warm_lookup_us()
        overheads = _overheads()

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    lines = [
        f"## JIT core ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, {device})",
        "",
        "| measurement | value |",
        "| --- | --- |",
        f"| cold compile, CPU module | {cold_cpu:.2f} s |",
        f"| cold compile, CUDA module | {_seconds(cold_cuda)} |",
        f"| fresh process: import mllm_kernel.cpu.jit | {imp:.1f} ms |",
        f"| fresh process: first call of a cached kernel | {first:.1f} ms (target < 20 ms) |",
        f"| fresh process: whole run incl. torch import | {wall:.0f} ms |",
        f"| warm lookup: cache key + entry validation (add_constant<8>) | {lookup:.0f} us |",
    ]
    lines += [f"| per call: {name} | {us:.2f} us |" for name, us in overheads]
    cpu_op, cpu_raw, cpu_torch = (us for _, us in overheads[:3])
    lines += [
        f"| op / raw tvm-ffi (CPU) | {cpu_op / cpu_raw:.2f}x (target <= 1.3x) |",
        f"| op / torch.add (CPU) | {cpu_op / cpu_torch:.2f}x (target < 1x) |",
    ]
    if len(overheads) == 6:
        gpu_op, gpu_raw, gpu_torch = (us for _, us in overheads[3:])
        lines += [
            f"| op / raw tvm-ffi (CUDA) | {gpu_op / gpu_raw:.2f}x |",
            f"| op / torch.add (CUDA) | {gpu_op / gpu_torch:.2f}x |",
        ]
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
