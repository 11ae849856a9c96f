"""W8A8 int8_scaled_mm against cuBLAS bf16 and torch._int_mm + scaling, in one run.

    python benchmarks/bench_int8_gemm.py [--quick] [--sweep | --sweep-mid] [--sm80]

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

``--sm80`` adds the sm_80 kernel (mma.sync m16n8k32, the path of Ampere, Ada and
Orin GPUs) to every row, built as compute_80 PTX and run on this GPU: a proxy, not a
timing of those GPUs.

``--sweep`` instead times every tile configuration (and split of K) that can run a
few shapes, interleaved: the data behind choose_tile's choices for int8 (with
``--sm80``: the sm_80 kernels' tiles, behind choose_sm80_tile's).
"""

from __future__ import annotations

from functools import partial

import gemm_harness as harness
import torch
from bench_cuda import copy_bandwidth

from mllm_kernel.cuda.jit import int8_scaled_mm, per_token_quant_int8
from mllm_kernel.cuda.jit.gemm import TILES, TileChoice, choose_tile
from mllm_kernel.cuda.jit.gemm_sm80 import (
    SM80_TILES,
    Sm80Choice,
    choose_sm80_tile,
    launch_int8_scaled_mm,
)
from mllm_kernel.cuda.jit.int8_scaled_mm import _launch

INT_MM_MIN_M = 17


def measure(m: int, n: int, k: int, sm80: bool = False) -> dict[str, float]:
    sets = harness.weight_copies(n * k)
    x = harness.random_bf16(m, k)
    a_q = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda")
    a_pad = torch.randint(-127, 128, (max(m, INT_MM_MIN_M), k), dtype=torch.int8, device="cuda")
    scales_a = torch.rand(m, 1, device="cuda") * 0.01
    scales_pad = torch.rand(a_pad.shape[0], 1, device="cuda") * 0.01
    w_q = [torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda") for _ in range(sets)]
    w_bf16 = [harness.random_bf16(n, k) for _ in range(max(1, sets // 2))]
    scales_b = torch.rand(n, device="cuda") * 0.01
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

    ours = [lambda w=w: int8_scaled_mm(a_q, w.t(), scales_a, scales_b, torch.bfloat16) for w in w_q]
    cublas = harness.cublas_calls(x, w_bf16, out)

    def int_mm(w):
        c = torch._int_mm(a_pad, w.t())
        return (c * scales_pad * scales_b).to(torch.bfloat16)

    int_mm_calls = [lambda w=w: int_mm(w) for w in w_q]

    # The same answer as the unfused torch route (where M allows _int_mm unpadded).
    if m >= INT_MM_MIN_M:
        ref = (torch._int_mm(a_q, w_q[0].t()) * scales_a * scales_b).float()
        got = int8_scaled_mm(a_q, w_q[0].t(), scales_a, scales_b, torch.bfloat16).float()
        assert (got - ref).abs().max().item() <= 0.01 * ref.abs().max().item() + 1e-6

    contenders = {"ours": ours, "cublas": cublas, "int_mm": int_mm_calls}
    if sm80:
        sm80_out = torch.empty_like(out)
        pick = choose_sm80_tile(m, n, k, harness.gpu().sm_count, element_bytes=1)
        contenders["sm80"] = [
            lambda w=w: launch_int8_scaled_mm(sm80_out, a_q, w.t(), scales_a, scales_b, None, pick)
            for w in w_q
        ]
        with harness.sm80_builds():
            contenders["sm80"][0]()
        want = int8_scaled_mm(a_q, w_q[0].t(), scales_a, scales_b, torch.bfloat16).float()
        assert (sm80_out.float() - want).abs().max().item() <= 0.01 * want.abs().max().item() + 1e-6
    return harness.time_graphs(contenders, harness.replays_per_sample(m, n, k))


def quant_rows(copy_gbs: float) -> list[str]:
    lines = ["", "| per_token_quant_int8 | us | GB/s | % of copy |", "|---|---:|---:|---:|"]
    for m, k in [(1, 4096), (256, 4096), (4096, 4096), (4096, 14336), (16384, 8192)]:
        x = harness.random_bf16(m, k)
        t = harness.time_graphs({"q": [lambda x=x: per_token_quant_int8(x)]}, 10)["q"]
        moved = m * k * 3 + m * 4  # bf16 in, int8 out, fp32 scales
        gbs = moved / t / 1e9
        share = 100 * gbs / copy_gbs
        lines.append(f"| bf16 [{m}, {k}] | {t * 1e6:.1f} | {gbs:.0f} | {share:.0f}% |")
        print(lines[-1], flush=True)
    return lines


SWEEP_SMALL = [(m, n, k) for m in (1, 16, 64) for n, k in harness.LLAMA_NK[:3]]
SWEEP_LARGE = [(m, n, k) for m in (256, 1024, 4096) for n, k in harness.LLAMA_NK[:2]]


def _candidates(m: int) -> list[TileChoice]:
    if m > 128:
        return [TileChoice(t, 1, rows) for t in TILES if not t.swap_ab for rows in (8, 16)]
    narrowest = next(t for t in TILES if t.swap_ab and t.tile_q >= m)
    return [TileChoice(narrowest, split) for split in (1, 2, 4, 8) if split <= narrowest.max_split]


def _sweep_times(
    m: int, n: int, k: int, candidates: list[TileChoice] | None = None
) -> dict[str, float]:
    a = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda")
    ws = [
        torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda")
        for _ in range(harness.weight_copies(n * k))
    ]
    sa, sb = torch.rand(m, device="cuda"), torch.rand(n, device="cuda")
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    contenders = {
        f"{c}, rows {c.group_rows}": [
            lambda w=w, c=c: _launch(out, a, w.t(), sa, sb, None, c) for w in ws
        ]
        for c in candidates or _candidates(m)
    }
    if candidates:  # the mid-M sweep: what a bf16 layer of the same shape costs
        x = harness.random_bf16(m, k)
        bf16 = [harness.random_bf16(n, k) for _ in range(max(1, len(ws) // 2))]
        contenders["cuBLAS bf16"] = harness.cublas_calls(x, bf16, out)
    return harness.time_graphs(contenders, harness.replays_per_sample(m, n, k), 8)


def sm80_sweep() -> None:
    """TOP/s of every sm_80 tile (at decode, and split of K) at a few shapes against
    cuBLAS bf16, interleaved, the kernels as compute_80 PTX (on this GPU, a proxy)."""
    for m, n, k in [(4096, 4096, 4096), (4096, 14336, 4096), (1024, 4096, 4096), (1, 14336, 4096)]:
        a = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda")
        ws = [
            torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda")
            for _ in range(harness.weight_copies(n * k))
        ]
        sa, sb = torch.rand(m, device="cuda"), torch.rand(n, device="cuda")
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        tiles = [t for t in SM80_TILES if (t.tile_m <= 64) == (m <= 64)]
        splits = (1, 2, 4, 8) if m <= 64 else (1,)
        contenders = {
            str(choice): [
                partial(launch_int8_scaled_mm, out, a, w.t(), sa, sb, None, choice) for w in ws
            ]
            for choice in (Sm80Choice(t, s) for t in tiles for s in splits)
        }
        with harness.sm80_builds():
            for calls in contenders.values():
                calls[0]()
        x = harness.random_bf16(m, k)
        contenders["cuBLAS bf16"] = harness.cublas_calls(
            x, [harness.random_bf16(n, k) for _ in range(max(1, len(ws) // 2))], out
        )
        times = harness.time_graphs(contenders, harness.replays_per_sample(m, n, k), 8)
        cells = [f"{name} {2 * m * n * k / t / 1e12:.0f}" for name, t in times.items()]
        print(f"- M={m} N={n} K={k}, TOP/s: " + ", ".join(cells), flush=True)


def sweep(mid: bool = False) -> None:
    """Microseconds of each candidate configuration per shape, interleaved; ``mid``:
    every tile family at M in ``MID_M`` (:func:`gemm_harness.mid_m_candidates`), with
    cuBLAS bf16 in the same rotation."""
    shapes = SWEEP_SMALL + SWEEP_LARGE
    if mid:
        shapes = [(m, n, k) for m in harness.MID_M for n, k in harness.LLAMA_NK]
    for m, n, k in shapes:
        times = _sweep_times(m, n, k, harness.mid_m_candidates(m) if mid else None)
        chosen = choose_tile(m, n, k, element_bytes=1)
        cells = [f"{name}: {t * 1e6:.1f}" for name, t in times.items()]
        print(f"M={m} N={n} K={k} (chosen: {chosen}) | " + " | ".join(cells), flush=True)


def main() -> None:
    parser = harness.argument_parser(__doc__, "two shapes, M in {1, 16, 4096}", out=False)
    parser.add_argument("--sweep", action="store_true", help="time every tile and split")
    parser.add_argument("--sm80", action="store_true", help="add the sm_80 kernel (proxy)")
    parser.add_argument(
        "--sweep-mid", action="store_true", help="every tile family at M = 64-256 vs cuBLAS"
    )
    args = parser.parse_args()
    if args.sweep or args.sweep_mid:
        sm80_sweep() if args.sm80 else sweep(mid=args.sweep_mid)
        return
    shapes = harness.LLAMA_NK[:2] if args.quick else harness.LLAMA_NK
    ms = [1, 16, 4096] if args.quick else harness.LLAMA_M
    copy_gbs = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}; device copy {copy_gbs:.0f} GB/s")
    header = (
        "| N | K | M | tile | ours us | cuBLAS bf16 us | _int_mm+scale us | vs cuBLAS |"
        " vs _int_mm | ours TOP/s | weights % of copy |"
        + (" sm_80 path tile | sm_80 path us | sm_80 path vs cuBLAS |" if args.sm80 else "")
    )
    if args.sm80:
        print("sm_80 path: the mma.sync kernel as compute_80 PTX on this GPU, a proxy only")
    print(header)
    print("|" + "---:|" * (14 if args.sm80 else 11))
    for n, k in shapes:
        for m in ms:
            t = measure(m, n, k, args.sm80)
            ours, cublas, int_mm = t["ours"], t["cublas"], t["int_mm"]
            tops = 2 * m * n * k / ours / 1e12
            weights = f"{100 * n * k / ours / 1e9 / copy_gbs:.0f}%" if m <= 16 else ""
            tile = choose_tile(m, n, k, element_bytes=1)
            print(
                f"| {n} | {k} | {m} | {tile} | {ours * 1e6:.1f} | {cublas * 1e6:.1f} | "
                f"{int_mm * 1e6:.1f} | {cublas / ours:.2f}x | {int_mm / ours:.2f}x | "
                f"{tops:.0f} | {weights} |"
                + (
                    f" {choose_sm80_tile(m, n, k, harness.gpu().sm_count, element_bytes=1)} | "
                    f"{t['sm80'] * 1e6:.1f} | {cublas / t['sm80']:.2f}x |"
                    if args.sm80
                    else ""
                ),
                flush=True,
            )
    quant_rows(copy_gbs)


if __name__ == "__main__":
    main()
