"""W8A8 int8_scaled_mm against cuBLAS bf16 and torch._int_mm + scaling, in one run.

    python benchmarks/bench_int8_gemm.py [--quick] [--sweep]

At the Llama-3-8B/70B linear shapes, (N, K) in {(4096, 4096), (14336, 4096),
(4096, 14336), (28672, 8192)} and M in {1, 4, 16, 64, 256, 1024, 4096}, on random data:

- ours: ``int8_scaled_mm(a_q, w_q.t(), scales_a, scales_b, bf16)``;
- cuBLAS bf16: ``torch.matmul(a, w.T)`` on the bf16 operands the int8 ones stand for;
- _int_mm + scale: ``torch._int_mm(a_q, w_q.t())`` (int32, cuBLASLt) then
  ``(c * scales_a * scales_b).to(bf16)`` in torch, the unfused way to the same result.
  ``_int_mm`` takes M > 16 only: smaller M runs padded to 17 rows (what a caller
  without our kernel would do).

Each contender is a CUDA graph of 10 calls, timed interleaved (rotated order, median
of samples, benchmarks/bench_cuda.py). Weights rotate over enough copies that they come
from HBM. Columns: microseconds per call, ratios to cuBLAS bf16, our TOP/s, and for
M <= 16 our weight-read bandwidth as a fraction of a device copy measured in the run.
The last lines time per_token_quant_int8 against a copy of the same bytes.

``--sweep`` instead times every tile configuration (and split of K) that can run a
few shapes, interleaved: the data behind choose_tile's choices for int8.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_cuda import copy_bandwidth, l2_bytes, time_interleaved  # noqa: E402

from mllm_kernel.cuda.jit import int8_scaled_mm, per_token_quant_int8  # noqa: E402
from mllm_kernel.cuda.jit.gemm import TILES, TileChoice, choose_tile  # noqa: E402
from mllm_kernel.cuda.jit.int8_scaled_mm import _launch  # noqa: E402

LLAMA_NK = [(4096, 4096), (14336, 4096), (4096, 14336), (28672, 8192)]
LLAMA_M = [1, 4, 16, 64, 256, 1024, 4096]
CALLS_PER_GRAPH = 10
INT_MM_MIN_M = 17


def _graph(calls: list[Callable[[], object]]) -> Callable[[], object]:
    """One CUDA graph of CALLS_PER_GRAPH calls rotating over ``calls``."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(CALLS_PER_GRAPH):
            calls[i % len(calls)]()
    return graph.replay


def measure(m: int, n: int, k: int) -> dict[str, float]:
    sets = max(1, math.ceil(3 * l2_bytes() / (n * k)))
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    a_q = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda")
    a_pad = torch.randint(-127, 128, (max(m, INT_MM_MIN_M), k), dtype=torch.int8, device="cuda")
    scales_a = torch.rand(m, 1, device="cuda") * 0.01
    scales_pad = torch.rand(a_pad.shape[0], 1, device="cuda") * 0.01
    w_q = [torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda") for _ in range(sets)]
    w_bf16 = [torch.randn(n, k, device="cuda").to(torch.bfloat16) for _ in range(max(1, sets // 2))]
    scales_b = torch.rand(n, device="cuda") * 0.01
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

    ours = [lambda w=w: int8_scaled_mm(a_q, w.t(), scales_a, scales_b, torch.bfloat16) for w in w_q]
    cublas = [lambda w=w: torch.matmul(x, w.T, out=out) for w in w_bf16]

    def int_mm(w):
        c = torch._int_mm(a_pad, w.t())
        return (c * scales_pad * scales_b).to(torch.bfloat16)

    int_mm_calls = [lambda w=w: int_mm(w) for w in w_q]

    # The same answer as the unfused torch route (where M allows _int_mm unpadded).
    if m >= INT_MM_MIN_M:
        ref = (torch._int_mm(a_q, w_q[0].t()) * scales_a * scales_b).float()
        got = int8_scaled_mm(a_q, w_q[0].t(), scales_a, scales_b, torch.bfloat16).float()
        assert (got - ref).abs().max().item() <= 0.01 * ref.abs().max().item() + 1e-6

    inner = 3 if m * n * k >= 2**36 else 10
    times = time_interleaved(
        {"ours": [_graph(ours)], "cublas": [_graph(cublas)], "int_mm": [_graph(int_mm_calls)]},
        inner,
        10,
    )
    return {name: seconds / CALLS_PER_GRAPH for name, seconds in times.items()}


def quant_rows(copy_gbs: float) -> list[str]:
    lines = ["", "| per_token_quant_int8 | us | GB/s | % of copy |", "|---|---:|---:|---:|"]
    for m, k in [(1, 4096), (256, 4096), (4096, 4096), (4096, 14336), (16384, 8192)]:
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        seconds = time_interleaved({"q": [_graph([lambda x=x: per_token_quant_int8(x)])]}, 10, 10)
        t = seconds["q"] / CALLS_PER_GRAPH
        moved = m * k * 3 + m * 4  # bf16 in, int8 out, fp32 scales
        gbs = moved / t / 1e9
        share = 100 * gbs / copy_gbs
        lines.append(f"| bf16 [{m}, {k}] | {t * 1e6:.1f} | {gbs:.0f} | {share:.0f}% |")
        print(lines[-1], flush=True)
    return lines


SWEEP_SMALL = [(m, n, k) for m in (1, 16, 64) for n, k in LLAMA_NK[:3]]
SWEEP_LARGE = [(m, n, k) for m in (256, 1024, 4096) for n, k in LLAMA_NK[:2]]


def _candidates(m: int) -> list[TileChoice]:
    if m > 128:
        return [TileChoice(t, 1, rows) for t in TILES if not t.swap_ab for rows in (8, 16)]
    narrowest = next(t for t in TILES if t.swap_ab and t.tile_q >= m)
    return [TileChoice(narrowest, split) for split in (1, 2, 4, 8) if split <= narrowest.max_split]


def _sweep_times(m: int, n: int, k: int) -> dict[str, float]:
    sets = max(1, math.ceil(3 * l2_bytes() / (n * k)))
    a = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda")
    ws = [torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda") for _ in range(sets)]
    sa, sb = torch.rand(m, device="cuda"), torch.rand(n, device="cuda")
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    contenders = {
        f"{c}, rows {c.group_rows}": [
            _graph([lambda w=w, c=c: _launch(out, a, w, sa, sb, None, c) for w in ws])
        ]
        for c in _candidates(m)
    }
    times = time_interleaved(contenders, 3 if m * n * k >= 2**36 else 10, 8)
    return {name: t / CALLS_PER_GRAPH for name, t in times.items()}


def sweep() -> None:
    """Microseconds of each candidate configuration per shape, interleaved."""
    for m, n, k in SWEEP_SMALL + SWEEP_LARGE:
        times = _sweep_times(m, n, k)
        chosen = choose_tile(m, n, k, element_bytes=1)
        cells = [f"{name}: {t * 1e6:.1f}" for name, t in times.items()]
        print(f"M={m} N={n} K={k} (chosen: {chosen}) | " + " | ".join(cells), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two shapes, M in {1, 16, 4096}")
    parser.add_argument("--sweep", action="store_true", help="time every tile and split")
    args = parser.parse_args()
    if args.sweep:
        sweep()
        return
    shapes = LLAMA_NK[:2] if args.quick else LLAMA_NK
    ms = [1, 16, 4096] if args.quick else LLAMA_M
    copy_gbs = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}; device copy {copy_gbs:.0f} GB/s")
    header = (
        "| N | K | M | tile | ours us | cuBLAS bf16 us | _int_mm+scale us | vs cuBLAS |"
        " vs _int_mm | ours TOP/s | weights % of copy |"
    )
    print(header)
    print("|" + "---:|" * 11)
    for n, k in shapes:
        for m in ms:
            t = measure(m, n, k)
            ours, cublas, int_mm = t["ours"], t["cublas"], t["int_mm"]
            tops = 2 * m * n * k / ours / 1e12
            weights = f"{100 * n * k / ours / 1e9 / copy_gbs:.0f}%" if m <= 16 else ""
            tile = choose_tile(m, n, k, element_bytes=1)
            print(
                f"| {n} | {k} | {m} | {tile} | {ours * 1e6:.1f} | {cublas * 1e6:.1f} | "
                f"{int_mm * 1e6:.1f} | {cublas / ours:.2f}x | {int_mm / ours:.2f}x | "
                f"{tops:.0f} | {weights} |",
                flush=True,
            )
    quant_rows(copy_gbs)


if __name__ == "__main__":
    main()
