"""CPU ops vs torch eager: time, achieved bandwidth, speedup; prints a markdown table.

    PYTHONPATH=. python benchmarks/bench_cpu.py [--min-run-time 0.2] [--threads N]

Each case times our kernel and the eager torch sequence it replaces, in the
same run, after a warm-up call (which also compiles the kernel). Ops that
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


def cases(rows_list: list[int], hiddens: list[int], dtypes: list[torch.dtype]) -> list[Case]:
    found = []
    for dtype in dtypes:
        size = torch.tensor([], dtype=dtype).element_size()
        for hidden in hiddens:
            for rows in rows_list:
                shape = (rows, hidden)
                n = rows * hidden
                x = torch.randn(shape, dtype=dtype)
                res = torch.randn(shape, dtype=dtype)
                w = torch.randn(hidden, dtype=dtype)
                gate_up = torch.randn(rows, 2 * hidden, dtype=dtype)
                out = torch.empty_like(x)
                found += [
                    Case("add_constant", dtype, shape, lambda x=x: add_constant(x, 8),
                         lambda x=x: torch.add(x, 8), 2 * n * size),
                    Case("add_constant, out=", dtype, shape,
                         lambda x=x, o=out: add_constant(x, 8, out=o),
                         lambda x=x, o=out: torch.add(x, 8, out=o), 2 * n * size),
                    Case("add_constant_runtime", dtype, shape,
                         lambda x=x: add_constant_runtime(x, 0.5),
                         lambda x=x: torch.add(x, 0.5), 2 * n * size),
                    Case("rmsnorm", dtype, shape, lambda x=x, w=w, o=out: rmsnorm(x, w, EPS, o),
                         lambda x=x, w=w: eager_rmsnorm(x, w), 2 * n * size),
                    Case("fused_add_rmsnorm", dtype, shape,
                         lambda x=x, r=res, w=w: fused_add_rmsnorm(x, r, w, EPS),
                         lambda x=x, r=res, w=w: eager_fused_add_rmsnorm(x, r, w), 4 * n * size),
                    Case("silu_and_mul", dtype, (rows, 2 * hidden),
                         lambda g=gate_up, o=out: silu_and_mul(g, o),
                         lambda g=gate_up: eager_silu_and_mul(g), 3 * n * size),
                    Case("softmax", dtype, shape, lambda x=x: softmax(x, -1),
                         lambda x=x: torch.softmax(x, -1), 2 * n * size),
                ]  # fmt: skip
    return found


def median_seconds(fn: Callable[[], object], min_run_time: float) -> float:
    fn()  # warm-up: compiles / loads the kernel, faults in the output pages
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn})
    return timer.blocked_autorange(min_run_time=min_run_time).median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-run-time", type=float, default=0.2, help="seconds per measurement")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 4096])
    parser.add_argument("--hidden", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtypes = [getattr(torch, name) for name in args.dtypes]

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print("| op | dtype | shape | ours (us) | torch eager (us) | speedup | ours GB/s |")
    print("|---|---|---|---:|---:|---:|---:|")
    for case in cases(args.rows, args.hidden, dtypes):
        ours = median_seconds(case.ours, args.min_run_time)
        eager = median_seconds(case.eager, args.min_run_time)
        dtype = str(case.dtype).removeprefix("torch.")
        shape = "x".join(map(str, case.shape))
        print(
            f"| {case.op} | {dtype} | {shape} | {ours * 1e6:.1f} | {eager * 1e6:.1f} "
            f"| {eager / ours:.2f}x | {case.bytes_moved / ours / 1e9:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
