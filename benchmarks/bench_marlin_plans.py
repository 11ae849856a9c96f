"""The streaming W4A16 kernel (M <= 16) under forced splits and split sums vs its plan.

gptq_marlin_gemm's streaming kernel with its split of K and the place where the slices'
sums meet (a cluster's shared memory, or global memory) forced, against the plan's own
choice and a plain read of the same bytes, in one interleaved run.

    python benchmarks/bench_marlin_plans.py [--m 1,4,8,16] [--shapes 4096x4096,...]
                                            [--quick] [--out FILE]

On Hopper the plan sums a split's slices in a thread-block cluster (up to 16 CTAs a
cluster). A cluster must fit one GPC, and the fused kernel's clusters of 4 were shown
to leave the block scheduler too little freedom (benchmarks/RESULTS.md, session 25: the
same CTAs without clusters ended 40% sooner). The streaming kernel also has the
global-memory sum (the path of GPUs without clusters: each slice's fp32 partial in
``partials``, the last CTA of a column tile, counted in the workspace, adds them in
slice order): this times both at the plan's split and at splits around it.

bf16 activations, uint4b8 weights in groups of 128 (random words: the values do not
change the time), CUDA graphs of 10 calls rotating over enough weight copies that the
weights come from HBM (``gemm_harness``); every contender's result on the first copy is
checked against the plan's (the same split sums in the same order: the same bits;
another split: the rounding of another order). The plain read is bench_quant_gemm's
(the weight and scale bytes read once by a vectorised kernel, its fastest launch).
"""

from __future__ import annotations

from functools import partial

import gemm_harness as harness
import torch
from bench_quant_gemm import WEIGHT_FORMATS, PlainRead

from mllm_kernel.cuda.jit import gptq_marlin as marlin
from mllm_kernel.cuda.jit import gptq_marlin_gemm, marlin_make_workspace

BF16 = torch.bfloat16
UINT4B8 = WEIGHT_FORMATS["uint4b8"]
SHAPES = "4096x4096,6144x4096,4096x14336,14336x4096,28672x4096,28672x8192"


def stream_calls(a, out, weights, workspace, split: int, in_cluster: bool) -> tuple[list, int]:
    """The streaming kernel's calls on every (words, scales) of ``weights`` with K split
    ``split`` ways (rounded as plan() rounds slices), the sums in a cluster or in global
    memory; and the split that results."""
    m, k = a.shape
    n = out.shape[1]
    rows = 8 if m <= 8 else 16
    k_tiles = k // 16
    per_split = -(-k_tiles // split)
    per_split = -(-per_split // marlin._SLICE_ALIGN) * marlin._SLICE_ALIGN
    split = -(-k_tiles // per_split)
    module = marlin._STREAM[a.get_device(), BF16, 4, rows, marlin._ZERO_MODE["bias"], False]
    partials = None
    if split > 1 and not in_cluster:
        partials = torch.empty(split, m, n, device="cuda", dtype=torch.float32)
    bias = marlin._weight_type(UINT4B8.type_id).scalar_type.bias  # the type's zero, 8
    cluster = in_cluster and split > 1

    def call(q, s):
        module.stream(
            a, q, s, None, None, None, None, workspace, out, m, n, k, True, bias, None,
            partials, split, per_split, cluster,
        )  # fmt: skip

    return [partial(call, q, s) for q, s in weights], split


def measure(m: int, n: int, k: int, read: PlainRead) -> str:
    """One line of us a call: the plan, each forced plan, the plain read."""
    made = [UINT4B8.make(n, k) for _ in range(harness.weight_copies(UINT4B8.nbytes(n, k), m))]
    weights = [(q, per_dtype[BF16][0]) for q, per_dtype in made]
    a = harness.random_bf16(m, k)
    workspace = marlin_make_workspace("cuda")
    out = torch.empty(m, n, device="cuda", dtype=BF16)
    type_id = UINT4B8.type_id

    def call(q, s):
        gptq_marlin_gemm(a, out, q, s, None, None, None, None, workspace, type_id, m, n, k)

    rule = [partial(call, q, s) for q, s in weights]
    rule[0]()
    torch.cuda.synchronize()
    want = out.clone()
    how = marlin._calls[(m, n, k, a.get_device(), BF16, type_id, False, False, False)].plan
    if how.fused_tokens or how.dequant_gemm:
        return f"M={m} {n}x{k}: the plan runs another kernel ({how}); skipped"
    contenders = {f"plan (split {how.split}, {'cluster' if how.cluster else 'memory'})": rule}
    # Half, one less (the plan rounds its CTAs up past 3 an SM: 112 column tiles split
    # in 4 are 448 CTAs for 396 places on 132 SMs), the plan's, one more, twice.
    base = how.split
    splits = {max(1, base // 2), max(1, base - 1), base, min(16, base + 1), min(16, 2 * base)}
    tried = set()
    for split in sorted(splits):
        for in_cluster in (True, False):
            forced_out = torch.empty_like(out)
            calls, actual = stream_calls(a, forced_out, weights, workspace, split, in_cluster)
            # slices rounded to whole turns give a split twice; one slice sums nothing
            key = (actual, in_cluster if actual > 1 else None)
            if key in tried:
                continue
            tried.add(key)
            calls[0]()
            torch.cuda.synchronize()
            name = f"split {actual}" + (f" {'cluster' if in_cluster else 'memory'}" * (actual > 1))
            same = torch.equal(forced_out, want)
            if not same and actual == how.split:
                name += " (DIFFERS)"
            contenders[name] = calls
    contenders["read"] = read.calls(weights, *read.fastest(n, k, weights))
    times = harness.time_graphs(contenders, harness.replays_per_sample(m, n, k))
    floor = times["read"]
    cells = " | ".join(f"{name}: {t * 1e6:.2f} ({t / floor:.2f}x)" for name, t in times.items())
    return f"M={m} {n}x{k} | {cells}"


def main() -> None:
    parser = harness.argument_parser(__doc__, "M = 1 on 4096^2 and 28672 x 8192")
    parser.add_argument("--m", default="1,4,8,16", help="tokens, comma-separated (<= 16)")
    parser.add_argument("--shapes", default=SHAPES, help="NxK, comma-separated")
    args = parser.parse_args()
    ms, shapes = ("1", "4096x4096,28672x8192") if args.quick else (args.m, args.shapes)
    read = PlainRead()
    lines = [harness.heading("Streaming W4A16 kernel, forced plans (us; x the plain read)"), ""]
    for shape in shapes.split(","):
        n, k = (int(x) for x in shape.split("x"))
        for m in (int(x) for x in ms.split(",")):
            lines.append("- " + measure(m, n, k, read))
            print(lines[-1], flush=True)
    harness.publish("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
