"""The Hopper GEMM against cuBLAS (torch.matmul), bf16, random data, in one run.

    python benchmarks/bench_gemm.py [--out benchmarks/RESULTS.md] [--quick]

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
"""

from __future__ import annotations

import argparse
import datetime
import math
import re
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_cuda import copy_bandwidth, git_commit, l2_bytes, time_interleaved  # noqa: E402

from mllm_kernel.cuda.jit import gemm  # noqa: E402
from mllm_kernel.cuda.jit.gemm import _GEMM, TILES, choose_tile  # noqa: E402

LLAMA_NK = [(4096, 4096), (14336, 4096), (4096, 14336), (28672, 8192), (8192, 28672)]
LLAMA_M = [1, 16, 128, 1024, 4096]
SQUARES = [4096, 6144, 8192]
CALLS_PER_GRAPH = 10


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
    sets = max(1, math.ceil(3 * l2_bytes() / (n * k * 2))) if m <= 1024 else 1
    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    weights = [torch.randn(n, k, device="cuda").to(torch.bfloat16) for _ in range(sets)]
    ours_out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    theirs_out = torch.empty_like(ours_out)
    ours = [lambda b=b: gemm(a, b, ours_out) for b in weights]
    theirs = [lambda b=b: torch.matmul(a, b.T, out=theirs_out) for b in weights]
    ours[0]()
    theirs[0]()
    torch.cuda.synchronize()
    ok = (ours_out.float() - theirs_out.float()).abs().max().item() <= 0.05 * (
        theirs_out.float().abs().max().item() + 1
    )
    inner = 3 if m * n * k >= 2**36 else 10
    times = time_interleaved({"ours": [_graph(ours)], "cublas": [_graph(theirs)]}, inner, 10)
    result = {name: seconds / CALLS_PER_GRAPH for name, seconds in times.items()}
    if m <= 16:  # decode: also called one by one, the host's per-call work included
        eager = time_interleaved({"ours": ours, "cublas": theirs}, 20, 10)
        result.update({f"{name} eager": seconds for name, seconds in eager.items()})
    result["agree"] = float(ok)
    return result


def _tile_tflops(m: int, n: int, k: int, tiles: list) -> dict[str, float]:
    from mllm_kernel.cuda.jit.gemm import TileChoice, _launch

    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    b = torch.randn(n, k, device="cuda").to(torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    contenders = {
        t.name: [_graph([lambda t=t: _launch(a, b, out, None, TileChoice(t))])] for t in tiles
    }
    contenders["cuBLAS"] = [_graph([lambda: torch.matmul(a, b.T, out=out)])]
    times = time_interleaved(contenders, 3, 8)
    return {name: 2 * m * n * k / (t / CALLS_PER_GRAPH) / 1e12 for name, t in times.items()}


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    parser.add_argument("--quick", action="store_true", help="8192^3 and M in {1, 4096} only")
    args = parser.parse_args()

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    shapes = [(s, s, s) for s in SQUARES] + [(m, n, k) for m in LLAMA_M for n, k in LLAMA_NK]
    if args.quick:
        shapes = [(8192, 8192, 8192)] + [(m, n, k) for m in (1, 4096) for n, k in LLAMA_NK]
    copy_gbs = copy_bandwidth()
    rows, ratios = [], {"small": [], "large": []}
    header = (
        "| M | N | K | tile | ours (us) | cuBLAS (us) | ours TFLOP/s | cuBLAS TFLOP/s | "
        "ours / cuBLAS | B read GB/s | % copy | eager: ours / cuBLAS (us) |"
    )
    print(header, flush=True)
    for m, n, k in shapes:
        t = measure(m, n, k)
        flops = 2 * m * n * k
        speed = t["cublas"] / t["ours"]
        b_gbs = n * k * 2 / t["ours"] / 1e9
        small = m <= 16
        row = (
            f"| {m} | {n} | {k} | {choose_tile(m, n, k, props.multi_processor_count)} | "
            f"{t['ours'] * 1e6:.1f} | {t['cublas'] * 1e6:.1f} | {flops / t['ours'] / 1e12:.0f} | "
            f"{flops / t['cublas'] / 1e12:.0f} | {speed:.3f}x | "
            f"{b_gbs:.0f} | {100 * b_gbs / copy_gbs:.0f}% | "
            f"{t['ours eager'] * 1e6:.1f} / {t['cublas eager'] * 1e6:.1f} |"
            if small
            else f"| {m} | {n} | {k} | {choose_tile(m, n, k, props.multi_processor_count)} | "
            f"{t['ours'] * 1e6:.1f} | {t['cublas'] * 1e6:.1f} | {flops / t['ours'] / 1e12:.0f} | "
            f"{flops / t['cublas'] / 1e12:.0f} | {speed:.3f}x | - | - | - |"
        )
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
    sass = sass_report()
    text = "\n".join(
        [
            f"## GEMM, {props.name} ({props.multi_processor_count} SMs), commit {git_commit()}, "
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
            "",
            f"bf16 in and out, fp32 accumulation, random data; CUDA-graph replays, interleaved "
            f"with cuBLAS (torch.matmul). Device copy: {copy_gbs:.0f} GB/s (read + written). "
            f"At M <= 16 the last column times plain calls, the host's work included.",
            "",
            header,
            "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
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
    print("\n" + text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
