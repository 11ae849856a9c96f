"""Benchmarks of the backward kernels (rmsnorm_backward, silu_and_mul_backward) against the
memory-bandwidth roofline, torch eager autograd and torch.compile, at training sizes.

    python benchmarks/bench_backward.py [--out backward.md] [--ops rmsnorm]

For every case, from one run, timed interleaved with its contenders as bench_cuda does:
median time per call; achieved GB/s counting each byte of the inputs and outputs read or
written once (rmsnorm's fp32 workspace, its own overhead, not counted); that as a fraction
of a device-to-device copy of the same bytes measured in the same run; the speedup over
torch eager autograd (the backward of the forward's graph alone) and over torch.compile of
the backward's formula ("n/a" where one fails). Inputs rotate among enough sets to exceed
the L2 cache three times, so they come from HBM.
"""

from __future__ import annotations

import argparse
import math
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_cuda import copy_bandwidth, git_commit, l2_bytes, time_interleaved

import mllm_kernel
from mllm_kernel.jit_utils import cache_once, load_cuda_jit

CSRC = Path(mllm_kernel.__file__).parent / "cuda" / "csrc"
EPS = 1e-6


def _source(*names: str) -> Path:
    """The first of `names` in cuda/csrc (the ops branch renames norm.cu to rmsnorm.cu)."""
    return next(CSRC / name for name in names if (CSRC / name).is_file())


@cache_once
def _norm():
    return load_cuda_jit(
        "rmsnorm_backward_bench",
        cuda_files=[_source("rmsnorm.cu", "norm.cu")],
        cuda_wrappers=[
            ("rmsnorm_backward", "mllm_kernel::cuda::rmsnorm_backward"),
            ("workspace_rows", "mllm_kernel::cuda::rmsnorm_backward_workspace_rows"),
        ],
    )


@cache_once
def _activation():
    return load_cuda_jit(
        "activation_backward_bench",
        cuda_files=[_source("activation.cu")],
        cuda_wrappers=[("silu_and_mul_backward", "mllm_kernel::cuda::silu_and_mul_backward")],
    )


@dataclass
class Case:
    op: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    bytes: int  # read and written once
    make: Callable[[], dict]  # one input set
    ours: Callable[[dict], object]
    eager: Callable[[dict], object]
    compiled: Callable[[dict], object]


# --- rmsnorm_backward ----------------------------------------------------------


def _rms_backward_formula(x, w, g):
    """rmsnorm's backward written in torch ops (fp32 math), for torch.compile."""
    xf, gw = x.float(), g.float() * w.float()
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    dot = (gw * xf).sum(-1, keepdim=True)
    grad_input = (r * gw - xf * r.pow(3) * dot / x.shape[-1]).to(x.dtype)
    return grad_input, (g.float() * xf * r).sum(0)


def rmsnorm_case(rows: int, hidden: int, dtype: torch.dtype) -> Case:
    def make():
        x = torch.randn(rows, hidden, device="cuda", dtype=dtype).requires_grad_()
        w = torch.randn(hidden, device="cuda", dtype=dtype).requires_grad_()
        y = F.rms_norm(x, (hidden,), w, EPS)
        g = torch.randn_like(y)
        return {
            "x": x.detach(),
            "w": w.detach(),
            "g": g,
            "graph": (y, x, w),
            "dx": torch.empty_like(x),
            "dw": torch.empty(hidden, device="cuda"),
            "workspace": torch.empty(_norm().workspace_rows(rows), hidden, device="cuda"),
        }

    def ours(s):
        _norm().rmsnorm_backward(s["dx"], s["dw"], s["workspace"], s["g"], s["x"], s["w"], EPS)

    def eager(s):
        y, x, w = s["graph"]
        return torch.autograd.grad(y, (x, w), s["g"], retain_graph=True)

    compiled_formula = torch.compile(_rms_backward_formula, dynamic=False)
    elem = torch.finfo(dtype).bits // 8
    return Case(
        "rmsnorm_backward",
        (rows, hidden),
        dtype,
        3 * rows * hidden * elem + hidden * (elem + 4),
        make,
        ours,
        eager,
        lambda s: compiled_formula(s["x"], s["w"], s["g"]),
    )


# --- silu_and_mul_backward -----------------------------------------------------


def _silu_backward_formula(x, g):
    gate, up = x.float().chunk(2, dim=-1)
    s = torch.sigmoid(gate)
    gf = g.float()
    return torch.cat([gf * up * s * (1 + gate * (1 - s)), gf * gate * s], -1).to(x.dtype)


def silu_case(rows: int, d: int, dtype: torch.dtype) -> Case:
    def make():
        x = torch.randn(rows, 2 * d, device="cuda", dtype=dtype).requires_grad_()
        gate, up = x.chunk(2, dim=-1)
        y = F.silu(gate) * up
        return {
            "x": x.detach(),
            "g": torch.randn_like(y),
            "graph": (y, x),
            "dx": torch.empty_like(x),
        }

    def ours(s):
        _activation().silu_and_mul_backward(s["dx"], s["g"], s["x"])

    def eager(s):
        y, x = s["graph"]
        return torch.autograd.grad(y, x, s["g"], retain_graph=True)

    compiled_formula = torch.compile(_silu_backward_formula, dynamic=False)
    return Case(
        "silu_and_mul_backward",
        (rows, 2 * d),
        dtype,
        5 * rows * d * (torch.finfo(dtype).bits // 8),
        make,
        ours,
        eager,
        lambda s: compiled_formula(s["x"], s["g"]),
    )


def cases() -> list[Case]:
    bf16, fp32 = torch.bfloat16, torch.float32
    return [
        rmsnorm_case(8192, 4096, bf16),
        rmsnorm_case(8192, 8192, bf16),
        rmsnorm_case(4096, 16384, bf16),
        rmsnorm_case(8192, 4096, fp32),
        rmsnorm_case(8192, 5120, torch.float16),
        silu_case(8192, 14336, bf16),
        silu_case(8192, 11008, fp32),
    ]


# --- measuring ----------------------------------------------------------------


def _runnable(name: str, calls: list[Callable[[], object]]) -> bool:
    """True when `calls[0]` runs (one call); else says why, for an n/a."""
    try:
        calls[0]()
        return True
    except Exception as exc:
        reason = str(exc).splitlines()[0] if str(exc) else repr(exc)
        print(f"  {name} failed: {reason}", file=sys.stderr)
        return False


def measure(case: Case) -> dict:
    first = case.make()
    size = case.bytes
    sets = [first] + [
        case.make() for _ in range(min(max(math.ceil(3 * l2_bytes() / size), 2), 8) - 1)
    ]
    contenders = {"ours": [lambda s=s: case.ours(s) for s in sets]}
    for name, fn in (("eager", case.eager), ("compiled", case.compiled)):
        calls = [lambda s=s, fn=fn: fn(s) for s in sets]
        if _runnable(f"{name} {case.op}", calls):
            contenders[name] = calls
    times = time_interleaved(contenders)
    del sets, first
    torch.cuda.empty_cache()
    return {"case": case, **times, "copy_gbs": copy_bandwidth(case.bytes)}


def render(rows: list[dict]) -> str:
    name = torch.cuda.get_device_name()
    lines = [
        f"### Backward kernels: {name}, commit {git_commit()}",
        "",
        "| op | shape | dtype | us | GB/s | % of a same-size copy | vs eager autograd "
        "| vs torch.compile |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        case, ours = row["case"], row["ours"]
        gbs = case.bytes / ours / 1e9

        def ratio(other, ours=ours):
            return f"{other / ours:.2f}x" if other else "n/a"

        shape = "x".join(map(str, case.shape))
        dtype = str(case.dtype).removeprefix("torch.")
        lines.append(
            f"| {case.op} | {shape} | {dtype} | {ours * 1e6:.2f} | {gbs:.0f} "
            f"| {100 * gbs / row['copy_gbs']:.0f}% | {ratio(row.get('eager'))} "
            f"| {ratio(row.get('compiled'))} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the table here")
    parser.add_argument("--ops", default="", help="comma-separated substrings of op names")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_backward: no CUDA GPU visible; nothing to measure", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    wanted = [w for w in args.ops.split(",") if w]
    rows = []
    for case in cases():
        if wanted and not any(w in case.op for w in wanted):
            continue
        print(f"{case.op} {case.shape} {case.dtype} ...", file=sys.stderr, flush=True)
        try:
            rows.append(measure(case))
        except Exception:
            traceback.print_exc()
    table = render(rows)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
