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

import gemm_harness as harness
import torch
from bench_cuda import copy_bandwidth

import mllm_kernel.cuda.jit as jit
from mllm_kernel.cuda.jit import gptq_marlin as gptq_marlin_module
from mllm_kernel.cuda.jit import gptq_marlin_gemm, marlin_make_workspace, scalar_types
from mllm_kernel.cuda.jit.gptq_marlin import plan

GROUP = 128
PLAIN_READ_MAX_M = 16  # the weight-bound rows
BF16 = torch.bfloat16


def w4a16_contenders(m: int, n: int, k: int, a: torch.Tensor) -> dict[str, list]:
    """Ours (Marlin uint4b8, group 128) and torch dequantize-then-matmul on GPTQ weights;
    for M <= PLAIN_READ_MAX_M also torch's float32 sum over the same packed weights: a
    plain read of the 4-bit words ours reads (not its scales, 3% more bytes), in a call
    of the same size."""
    sets = harness.weight_copies(n * k // 2, m)
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
    sets = harness.weight_copies(n * k, m)
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
    a = harness.random_bf16(m, k)
    bf16_weights = [harness.random_bf16(n, k) for _ in range(harness.weight_copies(n * k * 2, m))]
    cublas_out = torch.empty(m, n, device="cuda", dtype=BF16)
    contenders = {
        "cublas": harness.cublas_calls(a, bf16_weights, cublas_out),
        **w4a16_contenders(m, n, k, a),
        **w8a8_contenders(m, n, k),
    }
    return harness.time_graphs(contenders, harness.replays_per_sample(m, n, k))


def _us(t: dict[str, float], name: str) -> str:
    return f"{t[name] * 1e6:.1f}" if name in t else "-"


def main() -> None:
    parser = harness.argument_parser(__doc__, "M in {1, 16, 1024} only")
    parser.add_argument("--m", help="comma-separated M values (default: all)")
    args = parser.parse_args()
    ms = [int(v) for v in args.m.split(",")] if args.m else harness.LLAMA_M
    if args.quick:
        ms = [1, 16, 1024]

    index = harness.gpu().index
    copy_gbs = copy_bandwidth()
    header = (
        "| N | K | M | W4A16 path | W4A16 (us) | W8A8 (us) | cuBLAS bf16 (us) | "
        "_int_mm+scale (us) | torch dequant+mm (us) | W4A16 TFLOP/s | W4 weight GB/s | "
        "% copy | plain read (us) | W4A16 / plain read | W4A16 / cuBLAS | W8A8 / cuBLAS |"
    )
    rows = [header, "|---:|---:|---:|---|" + "---:|" * 12]
    print(header, flush=True)
    for n, k in harness.LLAMA_NK:
        for m in ms:
            t = measure(m, n, k)
            sms, hopper, clusters = gptq_marlin_module._device_facts(index)
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
            harness.heading("Quantized GEMM"),
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
    harness.publish(text, args.out)


if __name__ == "__main__":
    main()
