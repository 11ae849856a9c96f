"""What a user gains end to end: one Llama-3-8B-shaped decoder layer at decode, eager and
as a CUDA graph, torch's ops against ours (bf16, W4A16, W8A8).

The layer (random weights, one new token per sequence, a KV cache of ``--context``
positions per sequence): rmsnorm, QKV projection, rope, store of the new K/V rows into
the cache, attention over the cache (torch's scaled_dot_product_attention stands in for
every row: neither side ships an attention kernel), O projection, fused residual add +
rmsnorm, gate/up projection, silu_and_mul, down projection, residual add.

Rows:

- ``torch bf16``: the same layer in torch ops (cuBLAS GEMMs, rmsnorm and rope as torch
  expressions, ``index_copy_`` into the cache);
- ``torch.compile``: that function under ``torch.compile`` (default mode);
- ``ours bf16``: our ``gemm`` and our ops; ``ours W4A16``: ``gptq_marlin_gemm`` (uint4b8,
  group 128) for the four projections; ``ours W8A8``: ``per_token_quant_int8`` +
  ``int8_scaled_mm``.

Before timing, each of ours is checked against the torch bf16 layer on the same input
and cache (its weights dequantised for the quantised rows); a row whose results differ
is marked RESULTS DIFFER. Each row is timed eagerly (a Python call per op, as a user
without graphs runs it) and replayed as one captured CUDA graph; the rows are sampled in
rotating turns (:func:`bench_cuda.time_interleaved`). Tokens/s counts the batch's tokens
per layer call; '% copy' is the layer's weight bytes (its four projections, as stored:
bf16, or 4-bit words and scales, or int8 and scales) over the graph's time, as a
fraction of a device-to-device copy's bandwidth measured in the same run
(:func:`bench_cuda.copy_bandwidth`, read + written bytes). ``--figure FILE.svg`` also
draws each row's graph speed-up over torch bf16's graph per batch (benchmarks/
decoder_layer.svg is such a run's).
"""

from __future__ import annotations

import copy
import datetime
import itertools
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import gemm_harness as harness
import torch
from bench_cuda import copy_bandwidth, time_interleaved
from speedup_figure import speedup_svg

from mllm_kernel.cuda import jit

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = 4096, 32, 8, 128, 14336
GROUP = 128
BF16 = torch.bfloat16
EPS = 1e-5
PROJECTIONS = ("qkv", "o", "gate_up", "down")
# The most |ours - reference| / |reference| of the layer's update (output - input) that
# counts as the same result. bf16 and W4A16 compute what their reference computes (the
# bf16 weights, or the dequantised ones in bf16) in another order with other bf16
# roundings: about 0.5%. W8A8 also rounds each projection's input to int8 per token
# (about 1% per projection, four in a row), which its reference does not. A wrong
# layout, scale or kernel is off by tens of percent or more (NaN counts as differing).
# The sleep that holds the GPU while host time is measured: about 50 ms at 2 GHz, longer
# than the host needs to queue a round of layer calls.
SLEEP_CYCLES = 100_000_000
SAME_RESULT = {"ours bf16": 2e-2, "ours W4A16": 2e-2, "ours W8A8": 5e-2}


class Weights:
    """One layer's random parameters and its KV cache for ``batch`` sequences of
    ``context`` positions (the new token goes to the last one)."""

    def __init__(self, batch: int, context: int) -> None:
        def w(n: int, k: int) -> torch.Tensor:
            return (torch.randn(n, k, device="cuda") * k**-0.5).to(BF16)

        self.batch, self.context = batch, context
        self.qkv = w((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN)
        self.o = w(HIDDEN, HEADS * HEAD_DIM)
        self.gate_up = w(2 * FFN, HIDDEN)
        self.down = w(HIDDEN, FFN)
        self.norm1 = (1 + 0.1 * torch.randn(HIDDEN, device="cuda")).to(BF16)
        self.norm2 = (1 + 0.1 * torch.randn(HIDDEN, device="cuda")).to(BF16)
        kv_row = KV_HEADS * HEAD_DIM
        self.k_cache = torch.randn(batch * context, kv_row, device="cuda").to(BF16)
        self.v_cache = torch.randn(batch * context, kv_row, device="cuda").to(BF16)
        self.slots = torch.arange(batch, device="cuda") * context + context - 1
        self.positions = torch.full((batch,), context - 1, device="cuda")
        inv = 1.0 / 500000.0 ** (torch.arange(0, HEAD_DIM, 2, device="cuda") / HEAD_DIM)
        angles = torch.arange(context, device="cuda")[:, None] * inv[None, :]
        self.cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)  # float32
        self.x = torch.randn(batch, HIDDEN, device="cuda").to(BF16)


def attention(weights: Weights, q: torch.Tensor) -> torch.Tensor:
    """SDPA of the new queries over each sequence's cache (the stand-in kernel)."""
    b, ctx = weights.batch, weights.context
    k = weights.k_cache.view(b, ctx, KV_HEADS, HEAD_DIM).transpose(1, 2)
    v = weights.v_cache.view(b, ctx, KV_HEADS, HEAD_DIM).transpose(1, 2)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.view(b, HEADS, 1, HEAD_DIM), k, v, enable_gqa=True
    )
    return out.reshape(b, HEADS * HEAD_DIM)


def torch_layer(weights: Weights) -> Callable[[], torch.Tensor]:
    """The layer in torch ops (bf16, cuBLAS)."""
    half = HEAD_DIM // 2

    def rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + EPS)).to(BF16) * w

    def rope(t: torch.Tensor, heads: int) -> torch.Tensor:
        cos, sin = weights.cos_sin[weights.positions].chunk(2, dim=-1)
        t = t.view(-1, heads, HEAD_DIM).float()
        a, b = t[..., :half], t[..., half:]
        cos, sin = cos[:, None], sin[:, None]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1).to(BF16).flatten(1)

    def layer(tick: Tick = _untimed) -> torch.Tensor:
        x = weights.x
        h = rmsnorm(x, weights.norm1)
        tick("rmsnorm")
        qkv = h @ weights.qkv.T
        tick("qkv")
        q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
        q, k = rope(q, HEADS), rope(k, KV_HEADS)
        tick("rope")
        weights.k_cache.index_copy_(0, weights.slots, k)
        weights.v_cache.index_copy_(0, weights.slots, v)
        tick("store cache")
        h = attention(weights, q)
        tick("attention (SDPA)")
        residual = x + h @ weights.o.T
        tick("o")
        h = rmsnorm(residual, weights.norm2)
        tick("add + rmsnorm")
        gate, up = (h @ weights.gate_up.T).chunk(2, dim=-1)
        tick("gate_up")
        h = torch.nn.functional.silu(gate) * up
        tick("silu_and_mul")
        h = residual + h @ weights.down.T
        tick("down + residual")
        return h

    return layer


# A layer's steps call ``tick(name)`` after each one; :func:`host_steps` times them.
Tick = Callable[[str], None]


def _untimed(step: str) -> None:
    """The tick of a timed or graphed call: nothing (about 0.05 us a step)."""


class Linear(NamedTuple):
    """One projection of ours: the call, the bf16 weight [N, K] it multiplies by (the
    dequantised one for quantised weights: the reference's), and the bytes it stores."""

    call: Callable[[torch.Tensor], torch.Tensor]
    weight: torch.Tensor
    nbytes: int


def bf16_linear(weight: torch.Tensor) -> Linear:
    return Linear(lambda a: jit.gemm(a, weight), weight, weight.nbytes)


def w4a16_linear(weight: torch.Tensor) -> Linear:
    """``weight`` quantised to uint4b8 (value q - 8, q in 0..15) with one bf16 scale per
    group of 128 along K, packed as GPTQ and repacked into the Marlin layout."""
    n, k = weight.shape
    groups = weight.float().view(n, k // GROUP, GROUP)
    scales = (groups.abs().amax(-1, keepdim=True) / 8).clamp_min(1e-8).to(BF16)
    q = (groups / scales.float()).round().clamp(-8, 7) + 8  # [N, K / GROUP, GROUP]
    dequantised = ((q - 8) * scales.float()).to(BF16).view(n, k)
    # GPTQ packing: value k of column n at bits 4 (k % 8) of word [k // 8, n].
    values = q.view(n, k // 8, 8).to(torch.int64).permute(1, 2, 0)  # [K / 8, 8, N]
    shifts = torch.arange(0, 32, 4, device="cuda", dtype=torch.int64).view(1, 8, 1)
    words = (values << shifts).sum(1)
    packed = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    marlin_q = jit.gptq_marlin_repack(packed, None, k, n, 4)
    marlin_s = jit.marlin_permute_scales(scales.view(n, k // GROUP).t(), k, n, GROUP)
    workspace = jit.marlin_make_workspace("cuda")
    uint4b8 = jit.scalar_types.uint4b8.id

    def linear(a: torch.Tensor) -> torch.Tensor:
        return jit.gptq_marlin_gemm(
            a, None, marlin_q, marlin_s, None, None, None, None, workspace, uint4b8,
            a.shape[0], n, k,
        )  # fmt: skip

    return Linear(linear, dequantised, marlin_q.nbytes + marlin_s.nbytes)


def w8a8_linear(weight: torch.Tensor) -> Linear:
    """``weight`` quantised to int8 with one float32 scale per output channel;
    activations quantised per token by ``per_token_quant_int8``."""
    scales_b = weight.float().abs().amax(1).clamp_min(1e-8) / 127
    q = (weight.float() / scales_b[:, None]).round().clamp(-127, 127)
    dequantised = (q * scales_b[:, None]).to(BF16)
    # [K, N] column-major, the view int8_scaled_mm takes, made once as a model would.
    b_t = q.to(torch.int8).t()

    def linear(a: torch.Tensor) -> torch.Tensor:
        a_q, scales_a = jit.per_token_quant_int8(a)
        return jit.int8_scaled_mm(a_q, b_t, scales_a, scales_b, BF16)

    return Linear(linear, dequantised, b_t.nbytes + scales_b.nbytes)


class Layer(NamedTuple):
    """A layer to time: the call, the parameters its reference (the torch bf16 layer)
    takes, and the bytes of its projections' weights."""

    call: Callable[[], torch.Tensor]
    reference: Weights
    weight_bytes: int


def torch_weight_bytes(weights: Weights) -> int:
    return sum(getattr(weights, name).nbytes for name in PROJECTIONS)


def our_layer(weights: Weights, make: Callable[[torch.Tensor], Linear]) -> Layer:
    """The layer in our ops, its four projections made by ``make``."""
    linears = {name: make(getattr(weights, name)) for name in PROJECTIONS}
    qkv, o, gate_up, down = (linears[name].call for name in PROJECTIONS)
    b = weights.batch
    residual = torch.empty_like(weights.x)

    def layer(tick: Tick = _untimed) -> torch.Tensor:
        residual.copy_(weights.x)
        h = jit.rmsnorm(weights.x, weights.norm1, EPS)
        tick("rmsnorm")
        h = qkv(h)
        tick("qkv")
        q, k, v = h.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
        jit.apply_rope_with_cos_sin_cache_inplace(
            weights.positions, q, k, HEAD_DIM, weights.cos_sin, True
        )
        tick("rope")
        jit.store_cache(k, v, weights.k_cache, weights.v_cache, weights.slots)
        tick("store cache")
        h = attention(weights, q).view(b, -1)
        tick("attention (SDPA)")
        h = o(h)
        tick("o")
        jit.fused_add_rmsnorm(h, residual, weights.norm2, EPS)
        tick("add + rmsnorm")
        h = gate_up(h)
        tick("gate_up")
        h = jit.silu_and_mul(h)
        tick("silu_and_mul")
        h = residual.add_(down(h))
        tick("down + residual")
        return h

    # The same layer in torch: the same input, norms and cache, our weights in bf16.
    reference = copy.copy(weights)
    for name, linear in linears.items():
        setattr(reference, name, linear.weight)
    return Layer(layer, reference, sum(linear.nbytes for linear in linears.values()))


def update_error(layer: Layer, x: torch.Tensor) -> float:
    """``|ours - torch|`` over ``|torch|`` of the layer's update (output less input ``x``),
    float64 norms, torch's layer run on ``layer.reference``; NaN or inf for garbage.
    Each writes the new token's K/V rows before it reads the cache, so neither sees the
    other's."""
    ours = layer.call().double() - x.double()
    want = torch_layer(layer.reference)().double() - x.double()
    return float((ours - want).norm() / want.norm())


def graphed(layer: Callable[[], torch.Tensor]) -> Callable[[], None]:
    """``layer`` captured once as a CUDA graph: the call replays it."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm: compiles, plans, cuBLAS workspaces
            layer()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer()
    return graph.replay


def host_seconds(
    call: Callable[[Tick], object], rounds: int = 15, calls: int = 12
) -> dict[str, float]:
    """Median host seconds of each step of ``call`` (what it ticks) and of the whole call
    (``"whole call"``, untimed steps), with the GPU held busy all the while by a sleep
    kernel queued first: the launches queue behind it, so only the host's work (Python,
    tvm-ffi, torch's dispatch and allocator, the driver's launch) is timed, whatever the
    kernels would take. A step that waits for the GPU shows as the sleep's length.
    Launches queued behind a busy GPU cost the host more than launches into an idle
    one (H200: ours bf16's whole call 339 us held, its eager call 216 us free), so
    read the steps' shares of the whole call, not their absolute times."""
    found: dict[str, list[float]] = {}
    last = 0.0

    def tick(step: str) -> None:
        nonlocal last
        now = time.perf_counter()
        found.setdefault(step, []).append(now - last)
        last = time.perf_counter()

    for _ in range(rounds):
        torch.cuda._sleep(SLEEP_CYCLES)
        for _ in range(calls):
            last = time.perf_counter()
            call(tick)
        for _ in range(calls):
            start = time.perf_counter()
            call(_untimed)
            found.setdefault("whole call", []).append(time.perf_counter() - start)
        torch.cuda.synchronize()
    return {step: statistics.median(values) for step, values in found.items()}


def host_table(context: int, rows: list[str]) -> list[str]:
    """Where an eager layer call's host time goes, at batch 1: each step's host time per
    row (:func:`host_seconds`), against the launch floor (an empty tvm-ffi kernel, three
    tensors and two scalars) and torch.empty of one token's hidden state, timed the same
    way; and the row's graph time."""
    import tempfile
    from pathlib import Path

    from bench_runtime import load_empty_op

    weights = Weights(1, context)
    x, y = torch.empty_like(weights.x), torch.empty_like(weights.x)
    with tempfile.TemporaryDirectory() as work:
        empty = load_empty_op(Path(work))
    references = {
        "launch floor": lambda tick: (empty(x, y, y, 1, 0.5), tick("launch floor")),
        "torch.empty [1, 4096]": lambda tick: (
            torch.empty((1, HIDDEN), dtype=BF16, device=x.device),
            tick("torch.empty [1, 4096]"),
        ),
    }
    reference = {}
    for call in references.values():
        reference |= host_seconds(call)
    layers = {"torch bf16": Layer(torch_layer(weights), weights, 0)}
    layers |= {
        name: our_layer(weights, make)
        for name, make in (
            ("ours bf16", bf16_linear), ("ours W4A16", w4a16_linear), ("ours W8A8", w8a8_linear)
        )
        if name in rows
    }  # fmt: skip
    steps = {name: host_seconds(layer.call) for name, layer in layers.items()}
    graphs = time_interleaved({name: [graphed(layer.call)] for name, layer in layers.items()})
    names = list(layers)
    lines = [
        "",
        f"Host time per eager call at batch 1, by step (us; GPU held busy, so no kernel time): "
        f"launch floor {reference['launch floor'] * 1e6:.2f}, torch.empty of [1, 4096] bf16 "
        f"{reference['torch.empty [1, 4096]'] * 1e6:.2f}. Each step's time runs from the end "
        "of the step before; ours' rmsnorm step includes the residual's copy_. Launches "
        "behind a busy GPU cost more than into an idle one: read shares, not absolutes.",
        "",
        "| step | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    order = [step for step in steps[names[-1]] if step != "whole call"]
    for step in [*order, "whole call"]:
        cells = [f"{steps[name].get(step, float('nan')) * 1e6:.1f}" for name in names]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    lines.append("| graph (GPU) | " + " | ".join(f"{graphs[n] * 1e6:.1f}" for n in names) + " |")
    return lines


def gpu_steps(call: Callable[[Tick], object], replays: int = 200) -> dict[str, float]:
    """Median GPU seconds of each step of ``call`` inside its CUDA graph: the capture
    records an event after each step (``external`` events become record nodes of the
    graph), and each replay's consecutive events give the steps' times. A step's time
    includes the gap before its first kernel; ``"whole call"`` is the first event to
    the last."""
    events: list[tuple[str, torch.cuda.Event]] = []

    def tick(step: str) -> None:
        event = torch.cuda.Event(enable_timing=True, external=True)
        event.record()
        events.append((step, event))

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm: compiles, plans, cuBLAS workspaces
            call(_untimed)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tick("start")
        call(tick)
    found: dict[str, list[float]] = {}
    for _ in range(replays):
        graph.replay()
        torch.cuda.synchronize()
        for (_, before), (step, after) in itertools.pairwise(events):
            found.setdefault(step, []).append(before.elapsed_time(after) * 1e-3)
        whole = events[0][1].elapsed_time(events[-1][1])
        found.setdefault("whole call", []).append(whole * 1e-3)
    return {step: statistics.median(values) for step, values in found.items()}


def steps_table(batches: list[int], context: int, rows: list[str]) -> list[str]:
    """Where the graph's GPU time goes: each step's median time per row
    (:func:`gpu_steps`), at each batch."""
    makers: dict[str, Callable[[Weights], Layer]] = {
        "torch bf16": lambda w: Layer(torch_layer(w), w, 0),
        "ours bf16": lambda w: our_layer(w, bf16_linear),
        "ours W4A16": lambda w: our_layer(w, w4a16_linear),
        "ours W8A8": lambda w: our_layer(w, w8a8_linear),
    }
    names = [name for name in rows if name in makers]
    lines = [
        "",
        "GPU time per step inside the CUDA graph (us, median of 200 replays; event record "
        "nodes between the steps, so a step includes the gap before its first kernel):",
        "",
        "| batch | step | " + " | ".join(names) + " |",
        "|---:|---|" + "---:|" * len(names),
    ]
    for batch in batches:
        weights = Weights(batch, context)
        steps = {name: gpu_steps(makers[name](weights).call) for name in names}
        for step in steps[names[0]]:
            cells = [f"{steps[name].get(step, float('nan')) * 1e6:.1f}" for name in names]
            lines.append(f"| {batch} | {step} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    return lines


def measure(batch: int, context: int, rows: list[str]) -> dict[str, dict[str, float]]:
    """Per row: eager and graph seconds per layer call, its weight bytes, and for ours
    the relative error of its update against the torch bf16 layer (``error``)."""
    weights = Weights(batch, context)
    torch_bytes = torch_weight_bytes(weights)
    makers: dict[str, Callable[[], Layer]] = {
        "torch bf16": lambda: Layer(torch_layer(weights), weights, torch_bytes),
        "torch.compile": lambda: Layer(torch.compile(torch_layer(weights)), weights, torch_bytes),
        "ours bf16": lambda: our_layer(weights, bf16_linear),
        "ours W4A16": lambda: our_layer(weights, w4a16_linear),
        "ours W8A8": lambda: our_layer(weights, w8a8_linear),
    }
    contenders = {}
    found: dict[str, dict[str, float]] = {}
    for name in rows:
        layer = makers[name]()
        found[name] = {"bytes": layer.weight_bytes}
        if name in SAME_RESULT:  # before any timing, on the layer's first call
            found[name]["error"] = update_error(layer, weights.x)
        contenders[f"{name} eager"] = [layer.call]
        contenders[f"{name} graph"] = [graphed(layer.call)]
    times = time_interleaved(contenders, inner=20, outer=15)
    for name in rows:
        found[name] |= {mode: times[f"{name} {mode}"] for mode in ("eager", "graph")}
    return found


def main() -> None:
    parser = harness.argument_parser(__doc__, "batch 1 only")
    parser.add_argument("--batch", default="1,16,64", help="comma-separated batch sizes")
    parser.add_argument("--context", type=int, default=1024, help="KV positions a sequence")
    parser.add_argument(
        "--host", action="store_true", help="also where the eager call's host time goes (batch 1)"
    )
    parser.add_argument(
        "--steps", action="store_true", help="also each step's GPU time inside the graph"
    )
    parser.add_argument(
        "--figure", type=Path, help="also draw the graphs' speed-ups over torch bf16 (SVG)"
    )
    args = parser.parse_args()
    batches = [1] if args.quick else [int(b) for b in args.batch.split(",")]
    rows = ["torch bf16", "torch.compile", "ours bf16", "ours W4A16", "ours W8A8"]
    copy_gbs = copy_bandwidth()
    lines = [
        harness.heading(
            f"Llama-3-8B decoder layer at decode, context {args.context} (us per layer call)"
        ),
        "",
        f"Device copy: {copy_gbs:.0f} GB/s (read + written). % copy: the projections' "
        "weight bytes over the graph's time, as a fraction of it. Error: |ours - torch| / "
        "|torch| of the layer's update (output - input), torch run on our weights "
        "(dequantised for W4A16 and W8A8); RESULTS DIFFER above "
        + ", ".join(f"{bound:g} ({name})" for name, bound in SAME_RESULT.items())
        + ".",
        "",
        "| batch | row | eager | graph | eager / graph | tokens/s (graph) | "
        "graph vs torch bf16 graph | weight MB | % copy (graph) | error vs torch |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    speedups: dict[str, list[float]] = {name: [] for name in rows if name != "torch bf16"}
    for batch in batches:
        found = measure(batch, args.context, rows)
        base = found["torch bf16"]["graph"]
        for name in speedups:
            speedups[name].append(base / found[name]["graph"])
        for name in rows:
            row = found[name]
            eager, graph = row["eager"], row["graph"]
            label, error = name, "-"
            if "error" in row:
                error = f"{row['error']:.1e}"
                if not row["error"] <= SAME_RESULT[name]:
                    label += " RESULTS DIFFER"
            lines.append(
                f"| {batch} | {label} | {eager * 1e6:.1f} | {graph * 1e6:.1f} | "
                f"{eager / graph:.2f}x | {batch / graph:,.0f} | {base / graph:.2f}x | "
                f"{row['bytes'] / 1e6:.0f} | {100 * row['bytes'] / graph / 1e9 / copy_gbs:.0f}% | "
                f"{error} |"
            )
    if args.host:
        lines += host_table(args.context, rows)
    if args.steps:
        lines += steps_table(batches, args.context, rows)
    harness.publish("\n".join(lines), args.out)
    if args.figure:
        facts = harness.gpu()
        title = (
            f"Llama-3-8B decoder layer, CUDA graph, context {args.context}: speed-up over "
            f"torch bf16 ({facts.name}, {datetime.date.today()})"
        )
        args.figure.write_text(speedup_svg(title, [str(b) for b in batches], speedups))


if __name__ == "__main__":
    main()
