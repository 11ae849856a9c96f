"""CPU ops vs torch eager: time, achieved bandwidth, speedup; prints a markdown table.

    PYTHONPATH=. python benchmarks/bench_cpu.py [--min-run-time 0.2] [--threads N]

Each case times our kernel and the eager torch sequence it replaces, in the
same run, after a warm-up call (which also compiles the kernel). One op and
shape is timed at every dtype in a row, so "vs bf16" (our time over our
bfloat16 time) compares dtypes under the same machine load. Ops that
allocate their output pay for it like torch does ("out=" rows show the kernel
alone: a fresh large output costs page faults, often more than the op). Bandwidth
counts the bytes each op must read and write once: the roofline for these
memory-bound ops is the machine's streaming bandwidth.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils import benchmark

from mllm_kernel.cpu.jit import (
    add_constant,
    add_constant_runtime,
    fused_add_rmsnorm,
    rmsnorm,
    silu_and_mul,
    softmax,
)

EPS = 1e-6


@dataclass
class Case:
    op: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    ours: Callable[[], object]
    eager: Callable[[], object]
    bytes_moved: int


def eager_rmsnorm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    variance = xf.pow(2).mean(-1, keepdim=True)
    return (xf * torch.rsqrt(variance + EPS)).to(x.dtype) * weight


def eager_fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> None:
    residual.add_(x)
    x.copy_(eager_rmsnorm(residual, weight))


def eager_silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def cases(rows: int, hidden: int, dtype: torch.dtype) -> list[Case]:
    size = torch.tensor([], dtype=dtype).element_size()
    shape = (rows, hidden)
    n = rows * hidden
    x = torch.randn(shape, dtype=dtype)
    res = torch.randn(shape, dtype=dtype)
    w = torch.randn(hidden, dtype=dtype)
    gate_up = torch.randn(rows, 2 * hidden, dtype=dtype)
    out = torch.empty_like(x)
    return [
        Case("add_constant", dtype, shape, lambda: add_constant(x, 8), lambda: torch.add(x, 8),
             2 * n * size),
        Case("add_constant, out=", dtype, shape, lambda: add_constant(x, 8, out=out),
             lambda: torch.add(x, 8, out=out), 2 * n * size),
        Case("add_constant_runtime", dtype, shape, lambda: add_constant_runtime(x, 0.5),
             lambda: torch.add(x, 0.5), 2 * n * size),
        Case("rmsnorm", dtype, shape, lambda: rmsnorm(x, w, EPS, out),
             lambda: eager_rmsnorm(x, w), 2 * n * size),
        Case("fused_add_rmsnorm", dtype, shape, lambda: fused_add_rmsnorm(x, res, w, EPS),
             lambda: eager_fused_add_rmsnorm(x, res, w), 4 * n * size),
        Case("silu_and_mul", dtype, (rows, 2 * hidden), lambda: silu_and_mul(gate_up, out),
             lambda: eager_silu_and_mul(gate_up), 3 * n * size),
        Case("softmax", dtype, shape, lambda: softmax(x, -1), lambda: torch.softmax(x, -1),
             2 * n * size),
    ]  # fmt: skip


def median_seconds(fn: Callable[[], object], min_run_time: float) -> float:
    fn()  # warm-up: compiles / loads the kernel, faults in the output pages
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn})
    return timer.blocked_autorange(min_run_time=min_run_time).median


def time_group(group: tuple[Case, ...], min_run_time: float) -> list[str]:
    """Table rows for one op and shape at every dtype, "vs bf16" filled when bf16 is among them."""
    timed = [
        (case, median_seconds(case.ours, min_run_time), median_seconds(case.eager, min_run_time))
        for case in group
    ]
    bf16 = next((ours for case, ours, _ in timed if case.dtype == torch.bfloat16), None)
    lines = []
    for case, ours, eager in timed:
        dtype = str(case.dtype).removeprefix("torch.")
        shape = "x".join(map(str, case.shape))
        vs_bf16 = f"{ours / bf16:.2f}x" if bf16 else "-"
        lines.append(
            f"| {case.op} | {dtype} | {shape} | {ours * 1e6:.1f} | {eager * 1e6:.1f} "
            f"| {eager / ours:.2f}x | {vs_bf16} | {case.bytes_moved / ours / 1e9:.1f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-run-time", type=float, default=0.2, help="seconds per measurement")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 4096])
    parser.add_argument("--hidden", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "float16"])
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtypes = [getattr(torch, name) for name in args.dtypes]

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print("| op | dtype | shape | ours (us) | torch eager (us) | speedup | vs bf16 | ours GB/s |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for hidden in args.hidden:
        for rows in args.rows:
            # Case i of every dtype's list is the same op and shape.
            for group in zip(*(cases(rows, hidden, dtype) for dtype in dtypes), strict=True):
                print("\n".join(time_group(group, args.min_run_time)), flush=True)


if __name__ == "__main__":
    main()
