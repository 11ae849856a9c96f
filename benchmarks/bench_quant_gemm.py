"""Quantized GEMMs against cuBLAS bf16, torch's own ways and the original mllm-kernel.

Measured in one interleaved run:

    python benchmarks/bench_quant_gemm.py [--out FILE] [--quick] [--m 1,16]
                                          [--weights uint4b8|fp8|nvfp4]
                                          [--original _peers/mllm-kernel]
                                          [--original-wait SECONDS]
                                          [--original-build-only]

Rows: the Llama-3-8B/70B linear shapes (N, K) in {(4096, 4096), (14336, 4096),
(4096, 14336), (28672, 8192)} x M in {1, 4, 16, 32, 64, 256, 1024, 4096} (32: the
fused kernel's smallest token tile, where the original's Marlin was last ahead). Contenders:
ours W4A16 (gptq_marlin_gemm, uint4b8, group 128; ``--weights fp8``: float8_e4m3fn,
group 128, ``--weights nvfp4``: float4_e2m1f with fp8 scales per 16 k and a global scale,
both in the format vLLM prepares: the W4A16 columns then hold these, and GB/s, % copy
and the plain read count their bytes, so that the speed per byte read compares with the
integer weights'), ours W8A8 (int8_scaled_mm, when
mllm_kernel.cuda.jit has it; "-" otherwise), torch bf16 matmul (cuBLAS),
torch._int_mm + scaling, and dequantize-then-matmul in torch. Each is timed as CUDA
graph replays of 10 calls, interleaved (rotated order, median of samples), rotating
over enough weight copies that weights come from HBM, not L2.

The original mllm-kernel's gptq_marlin_gemm (``--original``: its source tree, by default
``_peers/mllm-kernel`` where present; ``--original ''`` leaves it out), imported beside
ours (benchmarks/original_peer.py) and built by its own JIT on first use, runs on the
same repacked words (both take vLLM's Marlin layout) with fp16 activations and scales,
beside ours on the same fp16 inputs: fp16 only, since its JIT builds every kernel of a
dtype on the first call, which takes minutes. Its first result is checked against ours
(RESULTS DIFFER where they disagree). Where it is missing or fails to build, a note
says so and its columns are '-'. Its build takes many minutes (over 12 on a 2-core
machine): ``--original-build-only`` builds it and exits (run it in the background
beforehand; the build stays in its JIT's cache), and ``--original-wait`` gives a build
in a child process that long before going on without the original.

Rooflines: for small M the time to read the weight bytes at the bandwidth of a
device-to-device copy measured in the same run (% copy: achieved weight-read GB/s
over the copy's GB/s), and for M <= 16 a plain read of exactly the weight and scale
bytes ours reads: a vectorised read kernel (16-byte loads, nothing else) built through
the package's raw runtime, on the same rotating weight copies (so L2 holds none of
them), at the best of a small grid x block sweep per shape; for large M bf16 tensor
throughput (cuBLAS is the yardstick).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gemm_harness as harness
import original_peer
import torch
from bench_cuda import copy_bandwidth

import mllm_kernel.cuda.jit as jit
from mllm_kernel.cuda import compile_kernel
from mllm_kernel.cuda.jit import gptq_marlin as gptq_marlin_module
from mllm_kernel.cuda.jit import gptq_marlin_gemm, marlin_make_workspace, scalar_types
from mllm_kernel.cuda.jit.gptq_marlin import plan
from mllm_kernel.cuda.jit.marlin_format import (
    fp8_fused_exponent_bias_into_scales,
    nvfp4_marlin_process_global_scale,
    nvfp4_marlin_process_scales,
)

GROUP = 128
PLAIN_READ_MAX_M = 16  # the weight-bound rows
BF16 = torch.bfloat16
FP16 = torch.float16
# Results of ours and the original on the same inputs agree to fp32 sums in another
# order, rounded to fp16 (|error| / |result| about 1e-3); garbage is off by about 1.
SAME_RESULT = 1e-2

PLAIN_READ = r"""
__device__ __forceinline__ unsigned fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

// Every 16-byte vector of p[0, n) read once by a grid-stride loop; four independent loads
// per step keep enough bytes in flight for HBM's bandwidth.
__device__ unsigned read_vectors(const uint4* __restrict__ p, long long n) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned folded = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = __ldg(p + i), b = __ldg(p + i + stride), c = __ldg(p + i + 2 * stride),
                d = __ldg(p + i + 3 * stride);
    folded ^= fold(a) ^ fold(b) ^ fold(c) ^ fold(d);
  }
  for (; i < n; i += stride) folded ^= fold(__ldg(p + i));
  return folded;
}

// The weights and the scales read, nothing else: the XOR of all values is stored only
// when it equals a constant the compiler cannot rule out, so that the loads stay.
extern "C" __global__ void plain_read(const void* weights, long long weight_vectors,
                                      const void* scales, long long scale_vectors, void* sink) {
  const unsigned folded = read_vectors(static_cast<const uint4*>(weights), weight_vectors) ^
                          read_vectors(static_cast<const uint4*>(scales), scale_vectors);
  if (folded == 0x9E3779B9u) *static_cast<unsigned*>(sink) = folded;
}
"""
# The sweep of the plain read's launch: threads per block x blocks per SM.
READ_BLOCKS = (128, 256, 512, 1024)
READ_CTAS_PER_SM = (1, 2, 4, 8)
MAX_THREADS_PER_SM = 2048


class PlainRead:
    """The plain read kernel, and per (N, K) the fastest launch of the sweep."""

    def __init__(self) -> None:
        self.kernel = compile_kernel(PLAIN_READ, "plain_read")
        self.sink = torch.zeros(1, dtype=torch.int32, device="cuda")
        self.sms = harness.gpu().sm_count
        self.best: dict[tuple[int, int], tuple[int, int]] = {}

    def calls(
        self, weights: list[tuple[torch.Tensor, torch.Tensor]], grid: int, block: int
    ) -> list[Callable[[], object]]:
        """One read of each (packed words, scales) pair, launched as ``grid`` x ``block``."""
        return [
            lambda q=q, s=s: self.kernel(
                q, q.nbytes // 16, s, s.nbytes // 16, self.sink, grid=grid, block=block
            )
            for q, s in weights
        ]

    def fastest(
        self, n: int, k: int, weights: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[int, int]:
        """(grid, block) of the sweep's fastest read of ``weights``, timed once per shape."""
        if (n, k) not in self.best:
            launches = [
                (ctas * self.sms, block)
                for block in READ_BLOCKS
                for ctas in READ_CTAS_PER_SM
                if block * ctas <= MAX_THREADS_PER_SM
            ]
            times = harness.time_graphs(
                {launch: self.calls(weights, *launch) for launch in launches},
                harness.replays_per_sample(1, n, k),
            )
            self.best[n, k] = min(times, key=times.get)
        return self.best[n, k]


@dataclass(frozen=True)
class WeightFormat:
    """The weights of the W4A16 columns (``--weights``): their type, bits, rows per scale
    group and bytes per scale, and whether the fused Hopper kernel and 8-token CTAs take
    them (as gptq_marlin_gemm plans them)."""

    type_name: str
    bits: int
    group: int
    scale_bytes: int
    fusable: bool
    eight_rows: bool

    @property
    def type_id(self) -> int:
        return getattr(scalar_types, self.type_name).id

    def nbytes(self, n: int, k: int) -> int:
        """The bytes of one weight: packed words and scales."""
        return n * k * self.bits // 8 + (k // self.group) * n * self.scale_bytes

    def make(self, n: int, k: int) -> tuple[torch.Tensor, dict[torch.dtype, tuple]]:
        """A random weight on the GPU, as gptq_marlin_gemm takes it: the packed words and,
        per activation dtype (bf16, fp16), its scales and global scale (or None); valid
        values throughout (no NaN weights or scales), so that ours and the original can
        be compared on it."""
        words = torch.randint(
            -(2**31), 2**31 - 1, (k // 16, n * self.bits // 2), dtype=torch.int32, device="cuda"
        )
        groups = k // self.group
        if self.type_name == "float4_e2m1f":
            codes = torch.randint(0x30, 0x48, (groups, n), device="cuda")  # e4m3 0.5 .. 4
            scales = nvfp4_marlin_process_scales(codes.to(torch.uint8).view(torch.float8_e4m3fn))
            global_scale = torch.tensor(1e-3, device="cuda")
            return words, {
                dtype: (scales, nvfp4_marlin_process_global_scale(global_scale.to(dtype)))
                for dtype in (BF16, FP16)
            }
        scales = torch.rand(groups, n, device="cuda") * 0.01
        if self.type_name == "float8_e4m3fn":
            words &= 0xF7F7F7F7 - 2**32  # each byte's lowest exponent bit cleared: no NaN
            return words, {
                dtype: (fp8_fused_exponent_bias_into_scales(scales.to(dtype)), None)
                for dtype in (BF16, FP16)
            }
        return words, {dtype: (scales.to(dtype), None) for dtype in (BF16, FP16)}


WEIGHT_FORMATS = {
    "uint4b8": WeightFormat("uint4b8", 4, GROUP, 2, fusable=True, eight_rows=True),
    "fp8": WeightFormat("float8_e4m3fn", 8, GROUP, 2, fusable=False, eight_rows=False),
    "nvfp4": WeightFormat("float4_e2m1f", 4, 16, 1, fusable=False, eight_rows=False),
}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """``|got - want| / |want|`` (Frobenius norms, in float64); NaN or inf for garbage."""
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm())


def w4a16_contenders(
    m: int,
    n: int,
    k: int,
    a: torch.Tensor,
    read: PlainRead,
    original: Callable | None,
    weight_format: WeightFormat,
) -> tuple[dict[str, list], float | None]:
    """Ours (Marlin, ``weight_format``'s weights: uint4b8 group 128 by default) in bf16 and
    fp16, the original in fp16 on the same words (when given), and torch
    dequantize-then-matmul on GPTQ uint4 weights; for M <= PLAIN_READ_MAX_M also the
    plain read of the words and bf16 scales ours reads. Returns them and the original's
    relative error against ours (fp16, the first weight copy)."""
    sets = harness.weight_copies(weight_format.nbytes(n, k), m)
    workspace = marlin_make_workspace("cuda")
    out = torch.empty(m, n, device="cuda", dtype=BF16)
    a16, out16 = a.to(FP16), torch.empty(m, n, device="cuda", dtype=FP16)
    type_id = weight_format.type_id
    # Random valid weights: the values do not change the time.
    made = [weight_format.make(n, k) for _ in range(sets)]
    weights = [(q, *per_dtype[BF16]) for q, per_dtype in made]
    fp16 = [(q, *per_dtype[FP16]) for q, per_dtype in made]
    result: dict[str, list] = {
        "w4a16": [
            lambda q=q, s=s, g=g: gptq_marlin_gemm(
                a, out, q, s, g, None, None, None, workspace, type_id, m, n, k
            )
            for q, s, g in weights
        ]
    }
    result["w4a16 fp16"] = [
        lambda q=q, s=s, g=g: gptq_marlin_gemm(
            a16, out16, q, s, g, None, None, None, workspace, type_id, m, n, k
        )
        for q, s, g in fp16
    ]
    error = None
    if original is not None:
        # Its own workspace: its split-K locks and ours must not meet. use_fp32_reduce as
        # vLLM and sglang call it (their default), and as ours always sums.
        theirs = marlin_make_workspace("cuda")
        original_out = torch.empty(m, n, device="cuda", dtype=FP16)
        result["original fp16"] = [
            lambda q=q, s=s, g=g: original(
                a=a16, c=original_out, b_q_weight=q, b_scales=s, global_scale=g,
                b_zeros=None, g_idx=None, perm=None, workspace=theirs, b_q_type_id=type_id,
                size_m=m, size_n=n, size_k=k, use_fp32_reduce=True,
            )
            for q, s, g in fp16
        ]  # fmt: skip
        want = result["w4a16 fp16"][0]().clone()
        error = relative_error(result["original fp16"][0](), want)
    gptq = torch.randint(-(2**31), 2**31 - 1, (k // 8, n), dtype=torch.int32, device="cuda")
    scales = (torch.rand(k // GROUP, n, device="cuda") * 0.01).to(BF16)
    shifts = torch.arange(0, 32, 4, device="cuda", dtype=torch.int32).view(1, 8, 1)

    def dequant_matmul():
        q = ((gptq.unsqueeze(1) >> shifts) & 15).reshape(k, n)
        w = (q.to(BF16) - 8) * scales.repeat_interleave(GROUP, dim=0)
        return torch.matmul(a, w, out=out)

    result["torch dequant+mm"] = [dequant_matmul]
    if m <= PLAIN_READ_MAX_M:
        words_and_scales = [(q, s) for q, s, _ in weights]
        result["read"] = read.calls(words_and_scales, *read.fastest(n, k, words_and_scales))
    return result, error


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


def measure(
    m: int,
    n: int,
    k: int,
    read: PlainRead,
    original: Callable | None,
    weight_format: WeightFormat,
) -> tuple[dict[str, float], float | None]:
    """Seconds per call of every contender at ``m x n x k``, and the original's relative
    error against ours (None without the original)."""
    a = harness.random_bf16(m, k)
    bf16_weights = [harness.random_bf16(n, k) for _ in range(harness.weight_copies(n * k * 2, m))]
    cublas_out = torch.empty(m, n, device="cuda", dtype=BF16)
    w4a16, error = w4a16_contenders(m, n, k, a, read, original, weight_format)
    contenders = {
        "cublas": harness.cublas_calls(a, bf16_weights, cublas_out),
        **w4a16,
        **w8a8_contenders(m, n, k),
    }
    return harness.time_graphs(contenders, harness.replays_per_sample(m, n, k)), error


def _us(t: dict[str, float], name: str) -> str:
    return f"{t[name] * 1e6:.1f}" if name in t else "-"


# The shared Llama M grid and M = 32, where the fused kernel's 32-token tile runs.
QUANT_M = sorted({*harness.LLAMA_M, 32})


def _ratio(t: dict[str, float], slower: str, faster: str) -> str:
    """``t[slower] / t[faster]`` as ``1.23x``, or '-' where either is missing."""
    return f"{t[slower] / t[faster]:.2f}x" if slower in t and faster in t else "-"


def load_original(root: str) -> Callable | None:
    """The original's gptq_marlin_gemm from the source tree ``root``, built by a first call
    on fp16 inputs; None where it cannot be had (the reason on stderr)."""
    n, k = harness.LLAMA_NK[0]
    example = dict(
        a=torch.randn(16, k, device="cuda", dtype=FP16),
        c=None,
        b_q_weight=torch.zeros(k // 16, n * 2, dtype=torch.int32, device="cuda"),
        b_scales=torch.ones(k // GROUP, n, device="cuda", dtype=FP16),
        global_scale=None,
        b_zeros=None,
        g_idx=None,
        perm=None,
        workspace=marlin_make_workspace("cuda"),
        b_q_type_id=scalar_types.uint4b8.id,
        size_m=16,
        size_n=n,
        size_k=k,
    )
    print("bench_quant_gemm: building the original's Marlin kernels ...", file=sys.stderr)
    return original_peer.load_original(
        Path(root),
        "mllm_kernel.cuda.jit.gptq_marlin",
        "gptq_marlin_gemm",
        example,
        "bench_quant_gemm",
    )


def main() -> None:
    parser = harness.argument_parser(__doc__, "M in {1, 16, 1024} only")
    parser.add_argument("--m", help="comma-separated M values (default: all)")
    parser.add_argument(
        "--weights",
        choices=sorted(WEIGHT_FORMATS),
        default="uint4b8",
        help="the W4A16 columns' weights: uint4b8 (group 128, the default), fp8 "
        "(float8_e4m3fn, group 128) or nvfp4 (float4_e2m1f, fp8 scales per 16 k)",
    )
    parser.add_argument(
        "--original",
        default=original_peer.default_root(),
        help="the original mllm-kernel's source tree (default: _peers/mllm-kernel where "
        "present; '' leaves it out)",
    )
    parser.add_argument(
        "--original-wait",
        type=float,
        help="build the original in a child process and wait this many seconds at most "
        "(default: build it here, however long it takes)",
    )
    parser.add_argument(
        "--original-build-only",
        action="store_true",
        help="build the original (into its JIT's cache) and exit; what --original-wait runs",
    )
    args = parser.parse_args()
    if args.original_build_only:
        sys.exit(0 if load_original(args.original) else 1)
    ms = [int(v) for v in args.m.split(",")] if args.m else QUANT_M
    weight_format = WEIGHT_FORMATS[args.weights]
    if args.quick:
        ms = [1, 16, 1024]

    index = harness.gpu().index
    notes = []
    original = None
    why = None if args.original else "none given: pass --original PATH"
    if why is None and args.original_wait is not None:
        command = [sys.executable, __file__, "--original", args.original, "--original-build-only"]
        why = original_peer.build_in_child(command, args.original_wait)
    if why is None:
        original = load_original(args.original)
    if original is None:
        notes.append(
            f"The original mllm-kernel is not available ({why or 'see stderr'}): its columns "
            "are '-'."
        )
    copy_gbs = copy_bandwidth()
    read = PlainRead()
    header = (
        "| N | K | M | W4A16 path | W4A16 (us) | W8A8 (us) | cuBLAS bf16 (us) | "
        "_int_mm+scale (us) | torch dequant+mm (us) | W4A16 TFLOP/s | W4 weight GB/s | "
        "% copy | plain read (us) | W4A16 / plain read | W4A16 / cuBLAS | W8A8 / cuBLAS | "
        "W4A16 fp16 (us) | original fp16 (us) | ours / original (fp16) |"
    )
    rows = [header, "|---:|---:|---:|---|" + "---:|" * 15]
    print(header, flush=True)
    for n, k in harness.LLAMA_NK:
        for m in ms:
            t, error = measure(m, n, k, read, original, weight_format)
            sms, hopper, clusters = gptq_marlin_module._device_facts(index)
            how = plan(
                m, n, k, sms, hopper, sms, clusters, fusable=weight_format.fusable,
                eight_rows=weight_format.eight_rows,
            )  # fmt: skip
            where = " (cluster)" if how.cluster else ""
            if how.fused_tokens:
                path = f"fused {how.fused_tokens} split {how.fused_split}"
            elif how.dequant_gemm:
                path = "dequant+wgmma"
            else:
                path = f"stream split {how.split}{where}"
            gbs = weight_format.nbytes(n, k) / t["w4a16"] / 1e9
            vs_original = _ratio(t, "original fp16", "w4a16 fp16")
            if error is not None and not error <= SAME_RESULT:
                vs_original += f" RESULTS DIFFER ({error:.1e})"
            row = (
                f"| {n} | {k} | {m} | {path} | {_us(t, 'w4a16')} | {_us(t, 'w8a8')} | "
                f"{_us(t, 'cublas')} | {_us(t, 'torch _int_mm+scale')} | "
                f"{_us(t, 'torch dequant+mm')} | {2 * m * n * k / t['w4a16'] / 1e12:.0f} | "
                f"{gbs:.0f} | {100 * gbs / copy_gbs:.0f}% | {_us(t, 'read')} | "
                f"{_ratio(t, 'read', 'w4a16')} | {_ratio(t, 'cublas', 'w4a16')} | "
                f"{_ratio(t, 'cublas', 'w8a8')} | {_us(t, 'w4a16 fp16')} | "
                f"{_us(t, 'original fp16')} | {vs_original} |"
            )
            print(row, flush=True)
            rows.append(row)
    launches = ", ".join(f"{n}x{k}: {g} x {b}" for (n, k), (g, b) in read.best.items())
    text = "\n".join(
        [
            harness.heading("Quantized GEMM"),
            "",
            f"bf16 activations and output; W4A16 = {weight_format.type_name} weights, group "
            f"{weight_format.group}; W8A8 = "
            f"int8 per-token x per-channel. CUDA-graph replays, interleaved. Device copy: "
            f"{copy_gbs:.0f} GB/s (read + written); % copy = weight bytes (words and scales) / "
            f"time over it. "
            f"Plain read (M <= {PLAIN_READ_MAX_M}): a kernel that only reads the packed "
            f"weights and the scales, in 16-byte loads, from HBM (rotating copies), at its "
            f"fastest grid x block of a sweep ({launches or 'none run'}); W4A16 / plain read "
            f"is its time over ours (1.00x: ours runs as fast as a plain read). fp16 "
            f"columns: ours and the original mllm-kernel's Marlin kernel on the same words "
            f"with fp16 activations and scales; ours / original is its time over ours "
            f"(above 1: ours is faster).",
            *notes,
            "",
            *rows,
            "",
        ]
    )
    harness.publish(text, args.out)


if __name__ == "__main__":
    main()
