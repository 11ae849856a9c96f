"""Quantized GEMMs against cuBLAS bf16 and torch's own ways, in one interleaved run.

    python benchmarks/bench_quant_gemm.py [--out FILE] [--quick] [--m 1,16]

Rows: the Llama-3-8B/70B linear shapes (N, K) in {(4096, 4096), (14336, 4096),
(4096, 14336), (28672, 8192)} x M in {1, 4, 16, 64, 256, 1024, 4096}. Contenders:
ours W4A16 (gptq_marlin_gemm, uint4b8, group 128), ours W8A8 (int8_scaled_mm, when
mllm_kernel.cuda.jit has it; "-" otherwise), torch bf16 matmul (cuBLAS),
torch._int_mm + scaling, and dequantize-then-matmul in torch. Each is timed as CUDA
graph replays of 10 calls, interleaved (rotated order, median of samples), rotating
over enough weight copies that weights come from HBM, not L2.

Rooflines: for small M the time to read the weight bytes at the bandwidth of a
device-to-device copy measured in the same run (% copy: achieved weight-read GB/s
over the copy's GB/s), and for M <= 16 a plain read of the same bytes at the same size
(torch's float32 sum over the packed weights, launch and ramp included, which the large
copy leaves out); for large M bf16 tensor throughput (cuBLAS is the yardstick).
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_cuda import copy_bandwidth, git_commit, l2_bytes, time_interleaved  # noqa: E402

import mllm_kernel.cuda.jit as jit  # noqa: E402
from mllm_kernel.cuda.jit import gptq_marlin as gptq_marlin_module  # noqa: E402
from mllm_kernel.cuda.jit import gptq_marlin_gemm, marlin_make_workspace, scalar_types  # noqa: E402
from mllm_kernel.cuda.jit.gptq_marlin import plan  # noqa: E402

LLAMA_NK = [(4096, 4096), (14336, 4096), (4096, 14336), (28672, 8192)]
LLAMA_M = [1, 4, 16, 64, 256, 1024, 4096]
GROUP = 128
CALLS_PER_GRAPH = 10
PLAIN_READ_MAX_M = 16  # the weight-bound rows
BF16 = torch.bfloat16


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


def _copies(weight_bytes: int, m: int) -> int:
    """Weight copies to rotate over so that L2 (3x over) holds none of them."""
    return max(1, math.ceil(3 * l2_bytes() / weight_bytes)) if m <= 1024 else 1


def w4a16_contenders(m: int, n: int, k: int, a: torch.Tensor) -> dict[str, list]:
    """Ours (Marlin uint4b8, group 128) and torch dequantize-then-matmul on GPTQ weights;
    for M <= PLAIN_READ_MAX_M also torch's float32 sum over the same packed weights: a
    plain read of the 4-bit words ours reads (not its scales, 3% more bytes), in a call
    of the same size."""
    sets = _copies(n * k // 2, m)
    workspace = marlin_make_workspace("cuda")
    out = torch.empty(m, n, device="cuda", dtype=BF16)
    ours, naive, read = [], [], []
    for _ in range(sets):
        # Any int32 words are a valid packed weight; the layout does not change the time.
        q = torch.randint(-(2**31), 2**31 - 1, (k // 16, n * 2), dtype=torch.int32, device="cuda")
        s = (torch.rand(k // GROUP, n, device="cuda") * 0.01).to(BF16)
        ours.append(
            lambda q=q, s=s: gptq_marlin_gemm(
                a, out, q, s, None, None, None, None, workspace, scalar_types.uint4b8.id, m, n, k
            )
        )
        # A float32 sum: torch's int32 sum widens to int64 and reads at a fraction of
        # the bandwidth (about 540 GB/s on an H100). Random bits make some NaNs, which
        # cost nothing.
        read.append(lambda q=q: q.view(torch.float32).sum())
    gptq = torch.randint(-(2**31), 2**31 - 1, (k // 8, n), dtype=torch.int32, device="cuda")
    scales = (torch.rand(k // GROUP, n, device="cuda") * 0.01).to(BF16)
    shifts = torch.arange(0, 32, 4, device="cuda", dtype=torch.int32).view(1, 8, 1)

    def dequant_matmul():
        q = ((gptq.unsqueeze(1) >> shifts) & 15).reshape(k, n)
        w = (q.to(BF16) - 8) * scales.repeat_interleave(GROUP, dim=0)
        return torch.matmul(a, w, out=out)

    naive.append(dequant_matmul)
    result = {"w4a16": ours, "torch dequant+mm": naive}
    if m <= PLAIN_READ_MAX_M:
        result["read"] = read
    return result


def w8a8_contenders(m: int, n: int, k: int) -> dict[str, list]:
    """Ours int8_scaled_mm (when present) and torch._int_mm + scaling."""
    sets = _copies(n * k, m)
    a_q = torch.randint(-127, 127, (m, k), dtype=torch.int8, device="cuda")
    scale_a = torch.rand(m, 1, device="cuda") * 0.01
    scale_b = torch.rand(1, n, device="cuda") * 0.01
    weights = [
        torch.randint(-127, 127, (n, k), dtype=torch.int8, device="cuda") for _ in range(sets)
    ]
    result: dict[str, list] = {}
    ours_op = getattr(jit, "int8_scaled_mm", None)
    if ours_op is not None:
        result["w8a8"] = [
            lambda b=b: ours_op(a_q, b.t(), scale_a.view(-1), scale_b.view(-1), BF16)
            for b in weights
        ]

    def int_mm(b):
        return (torch._int_mm(a_q, b.t()).float() * scale_a * scale_b).to(BF16)

    try:  # torch._int_mm refuses some shapes (M <= 16 on many builds)
        int_mm(weights[0])
        result["torch _int_mm+scale"] = [lambda b=b: int_mm(b) for b in weights]
    except RuntimeError:
        pass
    return result


def measure(m: int, n: int, k: int) -> dict[str, float]:
    a = torch.randn(m, k, device="cuda").to(BF16)
    bf16_weights = [torch.randn(n, k, device="cuda").to(BF16) for _ in range(_copies(n * k * 2, m))]
    cublas_out = torch.empty(m, n, device="cuda", dtype=BF16)
    contenders = {
        "cublas": [lambda b=b: torch.matmul(a, b.T, out=cublas_out) for b in bf16_weights],
        **w4a16_contenders(m, n, k, a),
        **w8a8_contenders(m, n, k),
    }
    inner = 3 if m * n * k >= 2**36 else 10
    graphs = {name: [_graph(calls)] for name, calls in contenders.items()}
    times = time_interleaved(graphs, inner, 10)
    return {name: seconds / CALLS_PER_GRAPH for name, seconds in times.items()}


def _us(t: dict[str, float], name: str) -> str:
    return f"{t[name] * 1e6:.1f}" if name in t else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    parser.add_argument("--quick", action="store_true", help="M in {1, 16, 1024} only")
    parser.add_argument("--m", help="comma-separated M values (default: all)")
    args = parser.parse_args()
    ms = [int(v) for v in args.m.split(",")] if args.m else LLAMA_M
    if args.quick:
        ms = [1, 16, 1024]

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    copy_gbs = copy_bandwidth()
    header = (
        "| N | K | M | W4A16 path | W4A16 (us) | W8A8 (us) | cuBLAS bf16 (us) | "
        "_int_mm+scale (us) | torch dequant+mm (us) | W4A16 TFLOP/s | W4 weight GB/s | "
        "% copy | plain read (us) | W4A16 / plain read | W4A16 / cuBLAS | W8A8 / cuBLAS |"
    )
    rows = [header, "|---:|---:|---:|---|" + "---:|" * 12]
    print(header, flush=True)
    for n, k in LLAMA_NK:
        for m in ms:
            t = measure(m, n, k)
            sms, hopper, clusters = gptq_marlin_module._device_facts(torch.cuda.current_device())
            how = plan(m, n, k, sms, hopper, sms, clusters, fusable=True)
            where = " (cluster)" if how.cluster else ""
            if how.fused_tokens:
                path = f"fused {how.fused_tokens} split {how.fused_split}"
            elif how.dequant_gemm:
                path = "dequant+wgmma"
            else:
                path = f"stream split {how.split}{where}"
            weight_bytes = n * k // 2 + (k // GROUP) * n * 2
            gbs = weight_bytes / t["w4a16"] / 1e9
            w8 = f"{t['cublas'] / t['w8a8']:.2f}x" if "w8a8" in t else "-"
            vs_read = f"{t['read'] / t['w4a16']:.2f}x" if "read" in t else "-"
            row = (
                f"| {n} | {k} | {m} | {path} | {_us(t, 'w4a16')} | {_us(t, 'w8a8')} | "
                f"{_us(t, 'cublas')} | {_us(t, 'torch _int_mm+scale')} | "
                f"{_us(t, 'torch dequant+mm')} | {2 * m * n * k / t['w4a16'] / 1e12:.0f} | "
                f"{gbs:.0f} | {100 * gbs / copy_gbs:.0f}% | {_us(t, 'read')} | {vs_read} | "
                f"{t['cublas'] / t['w4a16']:.2f}x | {w8} |"
            )
            print(row, flush=True)
            rows.append(row)
    text = "\n".join(
        [
            f"## Quantized GEMM, {props.name} ({props.multi_processor_count} SMs), commit "
            f"{git_commit()}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
            "",
            f"bf16 activations and output; W4A16 = uint4b8 weights, group {GROUP}; W8A8 = "
            f"int8 per-token x per-channel. CUDA-graph replays, interleaved. Device copy: "
            f"{copy_gbs:.0f} GB/s (read + written); % copy = W4 weight bytes / time over it. "
            f"Plain read (M <= {PLAIN_READ_MAX_M}): torch's float32 sum over the same packed "
            f"weights, a read of those bytes in a call of this size; W4A16 / plain read is "
            f"its time over ours (1.00x: ours runs as fast as a plain read).",
            "",
            *rows,
            "",
        ]
    )
    print("\n" + text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
