"""The swapped Hopper GEMM tiles (bf16, int8) at deeper rings vs the package and cuBLAS.

Every deeper build against the package's choice and cuBLAS bf16, in one interleaved run.

    python benchmarks/bench_gemm_stages.py [--m 16,64,128] [--dtype bf16,int8] [--jobs N]
                                           [--quick] [--out FILE]

The swapped tiles (weights on wgmma's 64-row side, the tokens on its narrow side: the
decode and mid-M tiles of ``mllm_kernel.cuda.jit.gemm.TILES``) stream each weight byte
once, and at mid M each CTA also re-reads its tokens' rows from L2: a CTA keeps
``stages`` k-blocks of both in flight. Whether more bytes in flight per SM pay is what
this measures: every swapped tile is built again at deeper rings (as a module of this
benchmark's own, ``gemm_stage_sweep`` / ``int8_stage_sweep``, built in parallel first;
the package's modules are untouched) and timed, with every split of K the shared
memory allows, beside the package's own choice for the shape and cuBLAS bf16 (the
yardstick of ``bench_gemm.py`` and ``bench_int8_gemm.py``).

Each contender is a CUDA graph of 10 calls rotating over enough weight copies that the
weights come from HBM (``gemm_harness``); results of every contender are checked
against the package's own call on the first weight (int8: exact, same int32 sums
scaled; bf16: to the rounding of another split's fp32 sum order).
"""

from __future__ import annotations

import os
from dataclasses import replace

import gemm_harness as harness
import torch

from mllm_kernel.cuda.jit.gemm import TILES, TileChoice, TileConfig, choose_tile
from mllm_kernel.cuda.jit.gemm import _launch as launch_bf16
from mllm_kernel.cuda.jit.int8_scaled_mm import _launch as launch_int8
from mllm_kernel.jit_utils.cuda_arch import HOPPER_ONLY
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.jit_utils.precompile import precompile

# The ring depths tried per swapped tile (tokens on the narrow side): each stage is 8 KB
# of weights plus the tokens' 128-byte rows; the deepest fit an H100/H200 block (227 KB)
# with a split of 2 at least.
DEPTHS = {16: (8, 12, 16, 20), 32: (8, 12, 16), 64: (6, 8, 10, 12), 128: (6, 8)}
SPLITS = (1, 2, 4, 8)
BF16 = torch.bfloat16


def deep_tiles() -> list[TileConfig]:
    """The first swapped tile of the package for each token count at every depth of
    ``DEPTHS`` that no package tile of that token count has (those run as they are)."""
    built = {(tile.tile_q, tile.stages) for tile in TILES if tile.swap_ab}
    bases: dict[int, TileConfig] = {}
    for tile in TILES:
        if tile.swap_ab:
            bases.setdefault(tile.tile_q, tile)
    return [
        replace(base, name=f"{base.name}-s{stages}", stages=stages)
        for tile_q, base in bases.items()
        for stages in DEPTHS[tile_q]
        if (tile_q, stages) not in built
    ]


def sweep_modules(tiles: list[TileConfig]) -> dict[str, KernelModule]:
    """The benchmark's own builds of ``tiles``: the bf16 GEMM's and int8_scaled_mm's."""
    return {
        "bf16": KernelModule(
            "gemm_stage_sweep",
            device="cuda",
            sources=["gemm.cu"],
            exports=["gemm"],
            variants=[tile.template_args(BF16) for tile in tiles],
            builtin=False,
            archs=HOPPER_ONLY,
        ),
        "int8": KernelModule(
            "int8_stage_sweep",
            device="cuda",
            sources=["gemm.cu"],
            exports=["int8_scaled_mm"],
            variants=[tile.shape_args for tile in tiles],
            builtin=False,
            archs=HOPPER_ONLY,
        ),
    }


class Problem:
    """One ``m x n x k`` product of ``dtype`` (``"bf16"`` or ``"int8"``): its operands on
    rotating weight copies, cuBLAS bf16's calls and the package's own."""

    def __init__(self, m: int, n: int, k: int, dtype: str) -> None:
        self.m, self.n, self.k, self.dtype = m, n, k, dtype
        self.out = torch.empty(m, n, device="cuda", dtype=BF16)
        x = harness.random_bf16(m, k)
        bf16_copies = harness.weight_copies(n * k * 2, m)
        bf16_weights = [harness.random_bf16(n, k) for _ in range(bf16_copies)]
        self.cublas = harness.cublas_calls(x, bf16_weights, torch.empty_like(self.out))
        if dtype == "bf16":
            self.a, self.weights = x, bf16_weights
        else:
            self.a = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda")
            self.weights = [
                torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda")
                for _ in range(harness.weight_copies(n * k, m))
            ]
            self.scales_a = torch.rand(m, device="cuda") * 0.01
            self.scales_b = torch.rand(n, device="cuda") * 0.01

    def package_calls(self, choice: TileChoice, out: torch.Tensor) -> list:
        """The package's kernel of ``choice`` on every weight copy, into ``out``."""
        if self.dtype == "bf16":
            return [lambda w=w: launch_bf16(self.a, w, out, None, choice) for w in self.weights]
        return [
            lambda w=w: launch_int8(out, self.a, w.t(), self.scales_a, self.scales_b, None, choice)
            for w in self.weights
        ]

    def sweep_calls(self, module: KernelModule, tile: TileConfig, split: int, out) -> list:
        """This benchmark's build of ``tile`` with K split ``split`` ways, into ``out``."""
        index = self.a.get_device()
        if self.dtype == "bf16":
            kernel = module[(index, *tile.template_args(BF16))].gemm
            return [lambda w=w: kernel(out, self.a, w, None, BF16, split, 8) for w in self.weights]
        kernel = module[(index, *tile.shape_args)].int8_scaled_mm
        return [
            lambda w=w: kernel(out, self.a, w.t(), self.scales_a, self.scales_b, None, split, 8)
            for w in self.weights
        ]


def agrees(got: torch.Tensor, want: torch.Tensor, dtype: str) -> bool:
    """Whether a contender's result is the package's, to its sum order's rounding."""
    if dtype == "int8":
        return torch.equal(got, want)
    scale = want.float().abs().max().item() + 1
    return (got.float() - want.float()).abs().max().item() <= 0.02 * scale


def measure(problem: Problem, modules: dict[str, KernelModule], tiles: list[TileConfig]) -> str:
    """One line, us a call: the package's choice, the swapped tiles that fit ``m`` at the
    package's depth and this benchmark's deeper ones (:data:`DEPTHS`), each at every
    split, and cuBLAS bf16."""
    m, n, k = problem.m, problem.n, problem.k
    chosen = choose_tile(m, n, k, harness.gpu().sm_count, 2 if problem.dtype == "bf16" else 1)
    package = problem.package_calls(chosen, problem.out)
    contenders = {f"package ({chosen})": package}
    package[0]()
    torch.cuda.synchronize()
    want = problem.out.clone()
    # The narrowest swapped tile that holds the tokens (several tile-rows past 128), and
    # from 65 tokens also the 64-token tile over two or more tile-rows.
    narrowest = next(t.tile_q for t in TILES if t.swap_ab and t.tile_q >= min(m, 128))
    wanted = {narrowest, 64} if m > 64 else {narrowest}
    rejected = []
    # Each wanted tile at the package's depth (its own module) and at the deeper ones.
    builds = [(t, None) for t in TILES if t.swap_ab and t.tile_q in wanted]
    builds += [(t, modules[problem.dtype]) for t in tiles if t.tile_q in wanted]
    for tile, module in builds:
        for split in SPLITS:
            out = torch.empty_like(problem.out)
            if module is None:
                calls = problem.package_calls(TileChoice(tile, split), out)
            else:
                calls = problem.sweep_calls(module, tile, split, out)
            try:
                calls[0]()
                torch.cuda.synchronize()
            except Exception as error:  # a split the shared memory or the tile refuses
                rejected.append(f"{tile.name} split {split}: {str(error).splitlines()[0][:60]}")
                continue
            name = f"{tile.name} split {split}"
            contenders[name if agrees(out, want, problem.dtype) else name + " (DIFFERS)"] = calls
    contenders["cuBLAS bf16"] = problem.cublas
    times = harness.time_graphs(contenders, harness.replays_per_sample(m, n, k), 8)
    cells = " | ".join(f"{name}: {t * 1e6:.2f}" for name, t in times.items())
    skipped = f" (not run: {len(rejected)}, e.g. {rejected[0]})" if rejected else ""
    return f"{problem.dtype} M={m} N={n} K={k} | {cells}{skipped}"


def main() -> None:
    parser = harness.argument_parser(__doc__, "bf16 at M = 64 on 4096^2 and 14336 x 4096")
    parser.add_argument("--m", default="16,32,64,128,256", help="tokens, comma-separated")
    parser.add_argument("--dtype", default="bf16,int8", help="bf16, int8 or both")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="parallel builds")
    args = parser.parse_args()
    ms, dtypes, shapes = (
        [int(x) for x in args.m.split(",")],
        args.dtype.split(","),
        harness.LLAMA_NK,
    )
    if args.quick:
        ms, dtypes, shapes = [64], ["bf16"], shapes[:2]
    tiles = deep_tiles()
    modules = sweep_modules(tiles)
    report = precompile(device="cuda", kernels=[modules[d].name for d in dtypes], jobs=args.jobs)
    failed = [r for r in report.results if not r.ok]
    lines = [harness.heading("Swapped GEMM tiles at deeper rings (us a call)"), ""]
    lines += [f"- build failed: {r.job.describe()}: {r.error}" for r in failed]
    print("\n".join(lines), flush=True)
    for m in ms:
        for n, k in shapes:
            for dtype in dtypes:
                lines.append("- " + measure(Problem(m, n, k, dtype), modules, tiles))
                print(lines[-1], flush=True)
    harness.publish("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
