"""The Hopper GEMM against cuBLAS (torch.matmul), bf16, random data, in one run.

    python benchmarks/bench_gemm.py [--out benchmarks/RESULTS.md] [--quick] [--sm80]
    python benchmarks/bench_gemm.py --sweep-mid   # every tile choice at M = 64-256

Rows: 4096^3, 6144^3, 8192^3, and the Llama-3-8B/70B linear layers, M in
{1, 16, 128, 1024, 4096} x (N, K) in {(4096, 4096), (14336, 4096), (4096, 14336),
(28672, 8192), (8192, 28672)}. Both contenders write into a preallocated output and
are timed interleaved (rotated order, median of samples) as CUDA-graph replays of
10 calls, so launch overhead on the host stays out of the GPU-time comparison. Where
the weight matrix fits in L2, calls rotate over enough copies of it that it comes
from HBM, as in a model whose layers do not share weights.

Rooflines: bf16 tensor throughput (cuBLAS's own 8192^3 figure is the practical
ceiling), and for M <= 16, the bandwidth of reading B against a device-to-device
copy measured in the same run. The SASS section lists each compiled tile variant's
HGMMA instructions, registers and spills (from cuobjdump, when the toolkit has it).

``--sm80`` adds the sm_80 kernels (mma.sync, the path of Ampere, Ada and Orin GPUs)
to every row, built as compute_80 PTX and run on this GPU: a proxy, not a timing of
those GPUs.
"""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
from functools import partial
from pathlib import Path

import gemm_harness as harness
import torch
from bench_cuda import copy_bandwidth, time_interleaved

from mllm_kernel.cuda.jit import gemm
from mllm_kernel.cuda.jit.gemm import _GEMM, TILES, choose_tile
from mllm_kernel.cuda.jit.gemm_sm80 import SM80_TILES, Sm80Choice, choose_sm80_tile, launch_gemm

LLAMA_NK = [*harness.LLAMA_NK, (8192, 28672)]  # and 70B's MLP down
LLAMA_M = [1, 16, 128, 1024, 4096]
SQUARES = [4096, 6144, 8192]


def measure(m: int, n: int, k: int, sm80: bool = False) -> dict[str, float]:
    a = harness.random_bf16(m, k)
    weights = [harness.random_bf16(n, k) for _ in range(harness.weight_copies(n * k * 2, m))]
    ours_out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    theirs_out = torch.empty_like(ours_out)
    ours = [lambda b=b: gemm(a, b, ours_out) for b in weights]
    theirs = harness.cublas_calls(a, weights, theirs_out)
    contenders = {"ours": ours, "cublas": theirs}
    outs = [ours_out]
    if sm80:
        sm80_out = torch.empty_like(ours_out)
        choice = choose_sm80_tile(m, n, k, harness.gpu().sm_count)
        contenders["sm80"] = [
            lambda b=b: launch_gemm(a, b, sm80_out, None, choice) for b in weights
        ]
        outs.append(sm80_out)
        with harness.sm80_builds():
            contenders["sm80"][0]()
    ours[0]()
    theirs[0]()
    torch.cuda.synchronize()
    tolerance = 0.05 * (theirs_out.float().abs().max().item() + 1)
    ok = all((out.float() - theirs_out.float()).abs().max().item() <= tolerance for out in outs)
    result = harness.time_graphs(contenders, harness.replays_per_sample(m, n, k))
    if m <= 16:  # decode: also called one by one, the host's per-call work included
        eager = time_interleaved({"ours": ours, "cublas": theirs}, 20, 10)
        result.update({f"{name} eager": seconds for name, seconds in eager.items()})
    result["agree"] = float(ok)
    return result


def _tile_tflops(m: int, n: int, k: int, tiles: list) -> dict[str, float]:
    from mllm_kernel.cuda.jit.gemm import TileChoice, _launch

    a, b = harness.random_bf16(m, k), harness.random_bf16(n, k)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    contenders = {t.name: [lambda t=t: _launch(a, b, out, None, TileChoice(t))] for t in tiles}
    contenders["cuBLAS"] = harness.cublas_calls(a, [b], out)
    times = harness.time_graphs(contenders, 3, 8)
    return {name: 2 * m * n * k / t / 1e12 for name, t in times.items()}


def tile_comparison(shapes: list[tuple[int, int, int]]) -> list[str]:
    """TFLOP/s of every large-M tile configuration at ``shapes``, interleaved: the data
    behind choose_tile's choice among them."""
    tiles = [t for t in TILES if not t.swap_ab]
    lines = [
        "| M | N | K | " + " | ".join(t.name for t in tiles) + " | cuBLAS |",
        "|---:|---:|---:|" + "---:|" * (len(tiles) + 1),
    ]
    for m, n, k in shapes:
        tflops = _tile_tflops(m, n, k, tiles)
        lines.append(
            f"| {m} | {n} | {k} | " + " | ".join(f"{v:.0f}" for v in tflops.values()) + " |"
        )
        print(lines[-1], flush=True)
    return lines


def mid_m_sweep() -> None:
    """Microseconds of every tile choice at M in ``MID_M`` on the Llama shapes, with
    cuBLAS in the same rotation (CUDA graphs, weights from HBM): the data behind
    choose_tile's choice between the swapped and the plain tiles there."""
    from mllm_kernel.cuda.jit.gemm import _launch

    for m in harness.MID_M:
        for n, k in harness.LLAMA_NK:
            a = harness.random_bf16(m, k)
            weights = [harness.random_bf16(n, k) for _ in range(harness.weight_copies(n * k * 2))]
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            contenders = {
                str(c): [partial(_launch, a, b, out, None, c) for b in weights]
                for c in harness.mid_m_candidates(m)
            }
            contenders["cuBLAS"] = harness.cublas_calls(a, weights, out)
            times = harness.time_graphs(contenders, harness.replays_per_sample(m, n, k), 8)
            cells = [f"{name}: {t * 1e6:.1f}" for name, t in times.items()]
            chosen = choose_tile(m, n, k, harness.gpu().sm_count)
            print(f"M={m} N={n} K={k} (chosen: {chosen}) | " + " | ".join(cells), flush=True)


def sm80_tile_sweep() -> list[str]:
    """TFLOP/s of every sm_80 tile (and, at decode, split of K) against cuBLAS at a few
    shapes, interleaved, the kernels as compute_80 PTX: the data behind
    choose_sm80_tile (on this GPU, a proxy)."""
    lines = []
    for m, n, k in [
        (4096, 4096, 4096),
        (4096, 14336, 4096),
        (1024, 4096, 4096),
        (1, 14336, 4096),
        (16, 4096, 4096),
    ]:
        a = harness.random_bf16(m, k)
        weights = [harness.random_bf16(n, k) for _ in range(harness.weight_copies(n * k * 2, m))]
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        tiles = [t for t in SM80_TILES if (t.tile_m <= 64) == (m <= 64)]
        splits = (1, 2, 4, 8) if m <= 64 else (1,)
        contenders = {
            str(choice): [partial(launch_gemm, a, b, out, None, choice) for b in weights]
            for choice in (Sm80Choice(t, s) for t in tiles for s in splits)
        }
        with harness.sm80_builds():
            for calls in contenders.values():
                calls[0]()
        contenders["cuBLAS"] = harness.cublas_calls(a, weights, out)
        times = harness.time_graphs(contenders, harness.replays_per_sample(m, n, k), 8)
        cells = [f"{name} {2 * m * n * k / t / 1e12:.0f}" for name, t in times.items()]
        lines.append(f"- M={m} N={n} K={k}, TFLOP/s: " + ", ".join(cells))
        print(lines[-1], flush=True)
    return lines


def sass_report() -> list[str]:
    """HGMMA count, registers and spills of every compiled bf16 tile variant."""
    cuobjdump = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    if not Path(cuobjdump).exists():
        return ["(cuobjdump not found: no SASS report)"]
    lines = [
        "| tile | HGMMA in SASS | registers | stack | spill stores/loads |",
        "|---|---|---:|---:|---|",
    ]
    for tile in TILES:
        module_path = _compiled_path(tile)
        if module_path is None:
            continue
        sass = subprocess.run(
            [cuobjdump, "-sass", str(module_path)], capture_output=True, text=True
        ).stdout
        usage = subprocess.run(
            [cuobjdump, "-res-usage", str(module_path)], capture_output=True, text=True
        ).stdout
        kinds = sorted(set(re.findall(r"HGMMA\.[\w.]+", sass)))
        regs = re.search(r"REG:(\d+)", usage)
        stack = re.search(r"STACK:(\d+)", usage)
        stl, ldl = len(re.findall(r"\bSTL\b", sass)), len(re.findall(r"\bLDL\b", sass))
        count = len(re.findall(r"\bHGMMA\.", sass))
        lines.append(
            f"| {tile.name} | {count} ({', '.join(kinds)}) | {regs.group(1) if regs else '?'} | "
            f"{stack.group(1) if stack else '?'} | {stl}/{ldl} |"
        )
    return lines


def _compiled_path(tile) -> Path | None:
    from mllm_kernel.jit_utils import cache
    from mllm_kernel.jit_utils.cache_key import module_key

    spec = _GEMM.spec(*tile.template_args(torch.bfloat16))
    found = cache.lookup(module_key(spec))
    return found.artifact if found.status == "hit" else None


def main() -> None:
    parser = harness.argument_parser(__doc__, "8192^3 and M in {1, 4096} only")
    parser.add_argument("--sm80", action="store_true", help="add the sm_80 kernels (proxy)")
    parser.add_argument(
        "--sweep-mid", action="store_true", help="only: every tile choice at M = 64-256 vs cuBLAS"
    )
    args = parser.parse_args()
    if args.sweep_mid:
        mid_m_sweep()
        return

    sms = harness.gpu().sm_count
    shapes = [(s, s, s) for s in SQUARES] + [(m, n, k) for m in LLAMA_M for n, k in LLAMA_NK]
    if args.quick:
        shapes = [(8192, 8192, 8192)] + [(m, n, k) for m in (1, 4096) for n, k in LLAMA_NK]
    copy_gbs = copy_bandwidth()
    rows, ratios = [], {"small": [], "large": []}
    header = (
        "| M | N | K | tile | ours (us) | cuBLAS (us) | ours TFLOP/s | cuBLAS TFLOP/s | "
        "ours / cuBLAS | B read GB/s | % copy | eager: ours / cuBLAS (us) |"
        + (" sm_80 path tile | sm_80 path (us) | sm_80 path / cuBLAS |" if args.sm80 else "")
    )
    print(header, flush=True)
    for m, n, k in shapes:
        t = measure(m, n, k, args.sm80)
        flops = 2 * m * n * k
        speed = t["cublas"] / t["ours"]
        b_gbs = n * k * 2 / t["ours"] / 1e9
        small = m <= 16
        row = (
            f"| {m} | {n} | {k} | {choose_tile(m, n, k, sms)} | "
            f"{t['ours'] * 1e6:.1f} | {t['cublas'] * 1e6:.1f} | {flops / t['ours'] / 1e12:.0f} | "
            f"{flops / t['cublas'] / 1e12:.0f} | {speed:.3f}x | "
            f"{b_gbs:.0f} | {100 * b_gbs / copy_gbs:.0f}% | "
            f"{t['ours eager'] * 1e6:.1f} / {t['cublas eager'] * 1e6:.1f} |"
            if small
            else f"| {m} | {n} | {k} | {choose_tile(m, n, k, sms)} | "
            f"{t['ours'] * 1e6:.1f} | {t['cublas'] * 1e6:.1f} | {flops / t['ours'] / 1e12:.0f} | "
            f"{flops / t['cublas'] / 1e12:.0f} | {speed:.3f}x | - | - | - |"
        )
        if args.sm80:
            choice = choose_sm80_tile(m, n, k, sms)
            row += f" {choice} | {t['sm80'] * 1e6:.1f} | {t['cublas'] / t['sm80']:.3f}x |"
        if not t["agree"]:
            row += " RESULTS DIFFER"
        print(row, flush=True)
        rows.append(row)
        if (m, n, k) not in [(s, s, s) for s in SQUARES]:
            ratios["small" if small else "large"].append(speed)
    summary = [
        f"- Geometric mean ours/cuBLAS, Llama shapes M >= 128: "
        f"{statistics.geometric_mean(ratios['large']):.3f}x"
        if ratios["large"]
        else "",
        f"- Geometric mean ours/cuBLAS, Llama shapes M <= 16: "
        f"{statistics.geometric_mean(ratios['small']):.3f}x"
        if ratios["small"]
        else "",
    ]
    comparison = tile_comparison([(8192, 8192, 8192), (4096, 14336, 4096), (1024, 4096, 4096)])
    if args.sm80:
        comparison += ["", "sm_80 tiles (compute_80 PTX on this GPU, a proxy):", ""]
        comparison += sm80_tile_sweep()
    sass = sass_report()
    text = "\n".join(
        [
            harness.heading("GEMM"),
            "",
            f"bf16 in and out, fp32 accumulation, random data; CUDA-graph replays, interleaved "
            f"with cuBLAS (torch.matmul). Device copy: {copy_gbs:.0f} GB/s (read + written). "
            f"At M <= 16 the eager column times plain calls, the host's work included."
            + (
                " The sm_80 path columns run the mma.sync kernels as compute_80 PTX on this "
                "GPU: a proxy for Ampere/Ada/Orin, not a timing of those GPUs."
                if args.sm80
                else ""
            ),
            "",
            header,
            "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
            + ("---|---:|---:|" if args.sm80 else ""),
            *rows,
            "",
            *[line for line in summary if line],
            "",
            "Large-M tile configurations, TFLOP/s (interleaved):",
            "",
            *comparison,
            "",
            "SASS of the bf16 tile variants:",
            "",
            *sass,
            "",
        ]
    )
    harness.publish(text, args.out)


if __name__ == "__main__":
    main()
