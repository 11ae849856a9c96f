"""Launch overhead of the raw runtime, in one run: an empty kernel with 3 tensor and 2
scalar arguments launched through ``compile_kernel`` vs a tvm-ffi JIT op with the same
arguments (``load_cuda_jit``, KernelLauncher) vs CuPy's RawKernel.

    python benchmarks/bench_runtime.py [--out FILE.md] [--inner N] [--outer N]

Goal (issue 15): within 1.3x of the tvm-ffi JIT call, and faster than CuPy's RawKernel.

What is timed is the host: wall-clock seconds per call over ``inner`` back-to-back calls
(the GPU runs an empty kernel faster than the host issues them), synchronised at the
end of each sample. The contenders are sampled in turn, in an order rotated every round,
so the shared machine's drifting load falls on all of them alike; each row is the median.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_cuda import git_commit  # noqa: E402

EMPTY_KERNEL = """
extern "C" __global__ void empty(const float* x, float* y, float* z, int n, float alpha) {}
"""

# The same kernel as a tvm-ffi op, launched the way every op of this package launches
# (KernelLauncher: device guard, the framework's stream, launch checked).
JIT_OP = """
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.cuh"

namespace bench {
__global__ void empty(const float* x, float* y, float* z, int n, float alpha) {}

void launch_empty(tvm::ffi::TensorView x, tvm::ffi::TensorView y, tvm::ffi::TensorView z,
                  int64_t n, double alpha) {
  mllm_kernel::KernelLauncher(1, 32, x.device())(
      empty, static_cast<const float*>(x.data_ptr()), static_cast<float*>(y.data_ptr()),
      static_cast<float*>(z.data_ptr()), static_cast<int>(n), static_cast<float>(alpha));
}
}  // namespace bench
"""


def load_empty_op(work: Path) -> Callable[..., object]:
    """:data:`JIT_OP` built (or loaded from the cache) through ``work``: the launch floor
    of a tvm-ffi op, ``empty(x, y, z, n, alpha)``."""
    from mllm_kernel.jit_utils import load_cuda_jit

    source = work / "bench_runtime_op.cu"
    source.write_text(JIT_OP)
    return load_cuda_jit(
        "bench_runtime_op",
        cuda_files=[str(source)],
        cuda_wrappers=[("empty", "bench::launch_empty")],
    ).empty


def _sample(call: Callable[[], object], inner: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(inner):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / inner


def time_interleaved(
    contenders: dict[str, Callable[[], object]], inner: int, outer: int
) -> dict[str, float]:
    """Median seconds per call of each contender, samples taken in rotating turns."""
    for call in contenders.values():
        for _ in range(inner):  # warm: first-launch module loads, caches, clocks
            call()
    names = list(contenders)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(outer):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(_sample(contenders[name], inner))
    return {name: statistics.median(values) for name, values in samples.items()}


def contenders(work: Path) -> tuple[dict[str, Callable[[], object]], list[str]]:
    from mllm_kernel.cuda import compile_kernel

    x, y, z = (torch.empty(1024, device="cuda") for _ in range(3))
    n, alpha = 1024, 0.5
    calls: dict[str, Callable[[], object]] = {}
    notes = []

    jit = load_empty_op(work)
    calls["tvm-ffi JIT op (load_cuda_jit)"] = lambda: jit(x, y, z, n, alpha)

    fixed = compile_kernel(EMPTY_KERNEL, "empty", grid=1, block=32)
    calls["ours, compile-time grid/block"] = lambda: fixed(x, y, z, n, alpha)
    calls["ours, grid/block per call"] = lambda: fixed(x, y, z, n, alpha, grid=1, block=32)

    try:
        import cupy as cp
        import numpy as np
    except ImportError:
        notes.append("CuPy is not installed here: no RawKernel row.")
    else:
        xc, yc, zc = (cp.empty(1024, dtype=cp.float32) for _ in range(3))
        raw = cp.RawKernel(EMPTY_KERNEL, "empty")
        n32, alpha32 = np.int32(n), np.float32(alpha)
        calls["CuPy RawKernel"] = lambda: raw((1,), (32,), (xc, yc, zc, n32, alpha32))
        calls["ours, CuPy arrays"] = lambda: fixed(xc, yc, zc, n, alpha)
    return calls, notes


def render(times: dict[str, float], notes: list[str], inner: int, outer: int) -> str:
    baseline = times["tvm-ffi JIT op (load_cuda_jit)"]
    cupy = times.get("CuPy RawKernel")
    lines = [
        f"## Raw runtime launch overhead: {torch.cuda.get_device_name()}",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M')}; git commit: {git_commit()}; "
        f"torch {torch.__version__}",
        "- an empty kernel, 3 tensors + 2 scalars; host wall-clock per call, median of "
        f"{outer} interleaved samples of {inner} calls each",
        "- goal: ours within 1.3x of the tvm-ffi JIT op, and below CuPy's RawKernel",
        *(f"- {note}" for note in notes),
        "",
        "| launch | us/call | x tvm-ffi JIT | x CuPy RawKernel |",
        "|---|---:|---:|---:|",
    ]
    for name, seconds in times.items():
        vs_cupy = f"{seconds / cupy:.2f}x" if cupy else "-"
        lines.append(f"| {name} | {seconds * 1e6:.2f} | {seconds / baseline:.2f}x | {vs_cupy} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    parser.add_argument("--inner", type=int, default=500)
    parser.add_argument("--outer", type=int, default=21)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_runtime: no CUDA GPU visible; nothing to measure", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as work:
        calls, notes = contenders(Path(work))
        times = time_interleaved(calls, args.inner, args.outer)
    table = render(times, notes, args.inner, args.outer)
    print(table)
    if args.out:
        args.out.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
