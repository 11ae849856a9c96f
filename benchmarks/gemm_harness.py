"""What the GEMM benchmarks (bench_gemm, bench_int8_gemm, bench_quant_gemm) share.

Contenders are lists of calls; :func:`time_graphs` captures each as one CUDA graph of
:data:`CALLS_PER_GRAPH` calls rotating over its list and times the graphs interleaved
(rotated order, median of samples: :func:`bench_cuda.time_interleaved`), so launch
overhead on the host stays out of a GPU-time comparison. Weights rotate over
:func:`weight_copies` copies so that they come from HBM, as in a model whose layers do
not share weights; :func:`cublas_calls` is the bf16 yardstick every table compares
against. A table starts with :func:`heading` (the GPU, its SMs, the commit, the time)
and goes out through :func:`publish` (printed, and written to ``--out`` when given).

Importing this module puts the checkout first on ``sys.path``, so that the scripts
measure the tree they sit in.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench_cuda import git_commit, l2_bytes, time_interleaved  # noqa: E402

from mllm_kernel.cuda.device_facts import DeviceFacts, device_facts  # noqa: E402

# The Llama-3 linear layers, as (N, K): 8B's attention projections, its MLP up (and
# gate) and down, and 70B's MLP up.
LLAMA_NK = [(4096, 4096), (14336, 4096), (4096, 14336), (28672, 8192)]
# Tokens a call, from decode to prefill.
LLAMA_M = [1, 4, 16, 64, 256, 1024, 4096]
CALLS_PER_GRAPH = 10
# Above this many tokens a GEMM is compute-bound: where its weights come from no
# longer matters, and one copy of them does.
COMPUTE_BOUND_M = 1024


def argument_parser(doc: str, quick: str, *, out: bool = True) -> argparse.ArgumentParser:
    """A parser described by ``doc``'s first line, with ``--out`` (when ``out``: the
    benchmarks that write a markdown table) and ``--quick`` (``quick`` says what it
    keeps); a script adds its own flags after these."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    if out:
        parser.add_argument("--out", type=Path, help="also write the markdown table here")
    parser.add_argument("--quick", action="store_true", help=quick)
    return parser


def gpu() -> DeviceFacts:
    """The facts of the GPU the benchmark runs on (torch's current device)."""
    return device_facts(torch.cuda.current_device())


def random_bf16(rows: int, cols: int) -> torch.Tensor:
    """A ``[rows, cols]`` bf16 tensor of standard-normal values on the GPU."""
    return torch.randn(rows, cols, device="cuda").to(torch.bfloat16)


def weight_copies(weight_bytes: int, m: int | None = None) -> int:
    """How many copies of a ``weight_bytes`` weight to rotate over so that L2 (three
    times over) holds none of them; one where ``m`` tokens make the GEMM compute-bound
    (``m`` left out: rotate whatever the size)."""
    if m is not None and m > COMPUTE_BOUND_M:
        return 1
    return max(1, math.ceil(3 * l2_bytes() / weight_bytes))


def cublas_calls(
    a: torch.Tensor, weights: list[torch.Tensor], out: torch.Tensor
) -> list[Callable[[], object]]:
    """cuBLAS bf16 through torch: ``a @ w.T`` into ``out``, one call per weight copy."""
    return [lambda w=w: torch.matmul(a, w.T, out=out) for w in weights]


def graph(calls: list[Callable[[], object]]) -> Callable[[], object]:
    """One CUDA graph of CALLS_PER_GRAPH calls rotating over ``calls`` (each run once
    before the capture); returns its replay."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    captured = torch.cuda.CUDAGraph()
    with torch.cuda.graph(captured):
        for i in range(CALLS_PER_GRAPH):
            calls[i % len(calls)]()
    return captured.replay


def replays_per_sample(m: int, n: int, k: int) -> int:
    """Graph replays in one timing sample: 3 where a replay takes milliseconds
    (2^36 multiply-adds and more), else 10."""
    return 3 if m * n * k >= 2**36 else 10


def time_graphs(
    contenders: dict[str, list[Callable[[], object]]], replays: int, rounds: int = 10
) -> dict[str, float]:
    """Median seconds per call of each contender, its calls captured as one graph
    (:func:`graph`) and the graphs timed interleaved, ``replays`` replays a sample,
    ``rounds`` samples each."""
    graphs = {name: [graph(calls)] for name, calls in contenders.items()}
    times = time_interleaved(graphs, replays, rounds)
    return {name: seconds / CALLS_PER_GRAPH for name, seconds in times.items()}


# Tokens a call where both tile families can win: the swapped (weights on wgmma's
# 64-row side) and the plain 128-row tiles; the sweeps time every candidate there.
MID_M = (64, 128, 256)


def mid_m_candidates(m: int) -> list:
    """Every Hopper tile choice worth timing for ``m`` tokens (``MID_M``): the swapped
    tiles of 64 and more tokens and the plain tiles, each with every split of K it
    allows (several tile-rows when ``m`` exceeds the tile's)."""
    from mllm_kernel.cuda.jit.gemm import TILES, TileChoice

    tiles = [t for t in TILES if not t.swap_ab or t.tile_q >= 64]
    return [TileChoice(t, s) for t in tiles for s in (1, 2, 4, 8) if s <= t.max_split]


@contextlib.contextmanager
def sm80_builds() -> Iterator[None]:
    """Kernels first called while open are built as compute_80 PTX, which the driver
    compiles for this GPU: on an H100 the GEMMs' sm_80 kernels run as on an Ampere GPU.
    A proxy for sm_80-89 only (their clocks, SMs and memory differ); a benchmark that
    uses it says so."""
    saved = os.environ.get("MLLM_KERNEL_CUDA_ARCH_LIST")
    os.environ["MLLM_KERNEL_CUDA_ARCH_LIST"] = "8.0+PTX"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["MLLM_KERNEL_CUDA_ARCH_LIST"]
        else:
            os.environ["MLLM_KERNEL_CUDA_ARCH_LIST"] = saved


def heading(title: str) -> str:
    """``## {title}, {GPU} ({SMs} SMs), commit {hash}, {UTC time}``: a table's first line."""
    facts = gpu()
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        f"## {title}, {facts.name} ({facts.sm_count} SMs), commit {git_commit()}, "
        f"{now:%Y-%m-%d %H:%M} UTC"
    )


def publish(text: str, out: Path | None) -> None:
    """Prints the finished report after the rows printed on the way, and writes it to
    ``out`` when given."""
    print("\n" + text)
    if out:
        out.write_text(text)
