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

Each row is timed eagerly (a Python call per op, as a user without graphs runs it) and
replayed as one captured CUDA graph; the rows are sampled in rotating turns
(:func:`bench_cuda.time_interleaved`). Tokens/s counts the batch's tokens per layer call.
"""

from __future__ import annotations

from collections.abc import Callable

import gemm_harness as harness
import torch
from bench_cuda import time_interleaved

from mllm_kernel.cuda import jit

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = 4096, 32, 8, 128, 14336
GROUP = 128
BF16 = torch.bfloat16
EPS = 1e-5


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

    def layer() -> torch.Tensor:
        x = weights.x
        qkv = rmsnorm(x, weights.norm1) @ weights.qkv.T
        q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
        q, k = rope(q, HEADS), rope(k, KV_HEADS)
        weights.k_cache.index_copy_(0, weights.slots, k)
        weights.v_cache.index_copy_(0, weights.slots, v)
        residual = x + attention(weights, q) @ weights.o.T
        gate, up = (rmsnorm(residual, weights.norm2) @ weights.gate_up.T).chunk(2, dim=-1)
        return residual + (torch.nn.functional.silu(gate) * up) @ weights.down.T

    return layer


def bf16_linear(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda a: jit.gemm(a, weight)


def w4a16_linear(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """Random 4-bit words in the Marlin layout (any int32 words are a valid packed
    weight) and group-128 scales, the size of ``weight``."""
    n, k = weight.shape
    q = torch.randint(-(2**31), 2**31 - 1, (k // 16, n * 2), dtype=torch.int32, device="cuda")
    s = (torch.rand(k // GROUP, n, device="cuda") * 0.01 / 8).to(BF16)
    workspace = jit.marlin_make_workspace("cuda")
    uint4b8 = jit.scalar_types.uint4b8.id
    return lambda a: jit.gptq_marlin_gemm(
        a, None, q, s, None, None, None, None, workspace, uint4b8, a.shape[0], n, k
    )


def w8a8_linear(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """Random int8 weights with per-channel scales, the size of ``weight``; activations
    quantised per token by ``per_token_quant_int8``."""
    n, k = weight.shape
    # [K, N] column-major, the view int8_scaled_mm takes, made once as a model would.
    b_t = torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda").t()
    scales_b = torch.rand(n, device="cuda") * 0.01 / 127

    def linear(a: torch.Tensor) -> torch.Tensor:
        a_q, scales_a = jit.per_token_quant_int8(a)
        return jit.int8_scaled_mm(a_q, b_t, scales_a, scales_b, BF16)

    return linear


def our_layer(
    weights: Weights, linear: Callable[[torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]
) -> Callable[[], torch.Tensor]:
    """The layer in our ops, its four projections made by ``linear``."""
    qkv, o, gate_up, down = (
        linear(w) for w in (weights.qkv, weights.o, weights.gate_up, weights.down)
    )
    b = weights.batch
    residual = torch.empty_like(weights.x)

    def layer() -> torch.Tensor:
        residual.copy_(weights.x)
        h = qkv(jit.rmsnorm(weights.x, weights.norm1, EPS))
        q, k, v = h.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
        jit.apply_rope_with_cos_sin_cache_inplace(
            weights.positions, q, k, HEAD_DIM, weights.cos_sin, True
        )
        jit.store_cache(k, v, weights.k_cache, weights.v_cache, weights.slots)
        h = o(attention(weights, q).view(b, -1))
        jit.fused_add_rmsnorm(h, residual, weights.norm2, EPS)
        h = down(jit.silu_and_mul(gate_up(h)))
        return residual.add_(h)

    return layer


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


def measure(batch: int, context: int, rows: list[str]) -> dict[str, dict[str, float]]:
    weights = Weights(batch, context)
    makers: dict[str, Callable[[], Callable[[], torch.Tensor]]] = {
        "torch bf16": lambda: torch_layer(weights),
        "torch.compile": lambda: torch.compile(torch_layer(weights)),
        "ours bf16": lambda: our_layer(weights, bf16_linear),
        "ours W4A16": lambda: our_layer(weights, w4a16_linear),
        "ours W8A8": lambda: our_layer(weights, w8a8_linear),
    }
    contenders = {}
    for name in rows:
        layer = makers[name]()
        contenders[f"{name} eager"] = [layer]
        contenders[f"{name} graph"] = [graphed(layer)]
    times = time_interleaved(contenders, inner=20, outer=15)
    return {name: {mode: times[f"{name} {mode}"] for mode in ("eager", "graph")} for name in rows}


def main() -> None:
    parser = harness.argument_parser(__doc__, "batch 1 only")
    parser.add_argument("--batch", default="1,16,64", help="comma-separated batch sizes")
    parser.add_argument("--context", type=int, default=1024, help="KV positions a sequence")
    args = parser.parse_args()
    batches = [1] if args.quick else [int(b) for b in args.batch.split(",")]
    rows = ["torch bf16", "torch.compile", "ours bf16", "ours W4A16", "ours W8A8"]
    lines = [
        harness.heading(
            f"Llama-3-8B decoder layer at decode, context {args.context} (us per layer call)"
        ),
        "| batch | row | eager | graph | eager / graph | tokens/s (graph) | "
        "graph vs torch bf16 graph |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for batch in batches:
        times = measure(batch, args.context, rows)
        base = times["torch bf16"]["graph"]
        for name in rows:
            eager, graph = times[name]["eager"], times[name]["graph"]
            lines.append(
                f"| {batch} | {name} | {eager * 1e6:.1f} | {graph * 1e6:.1f} | "
                f"{eager / graph:.2f}x | {batch / graph:,.0f} | {base / graph:.2f}x |"
            )
    harness.publish("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
