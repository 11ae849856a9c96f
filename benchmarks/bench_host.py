"""Per-call host cost of the op layer at decode size: CPU ops, and the CUDA module lookup
(on a GPU when there is one, else on a memo entry pre-filled for a CPU tensor's index).
On a GPU, also each CUDA op's eager call at one token against its bare kernel function
(the same tvm-ffi call without the op layer), the launch floor (a tvm-ffi call of an
empty kernel with three tensors and two scalars) and what a user would otherwise call:
``torch.compile`` of the op written in torch (one generated Triton kernel a call, its
guards and launcher on the host), timed interleaved (medians of rotating samples, as
bench_runtime does).

    python benchmarks/bench_host.py [--no-grad]

The numbers in benchmarks/RESULTS.md (session 6) come from this script, run alternately
against the commit before and after a change (the minimum of several runs: the timing
windows are short so that a busy machine still gives some quiet ones).
"""

from __future__ import annotations

import argparse
import importlib
import timeit

import torch

import mllm_kernel.cpu.jit as cpu


def per_call_us(fn, number: int = 1000, repeat: int = 300) -> float:
    fn()
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-grad", action="store_true", help="run under torch.no_grad()")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.set_grad_enabled(not args.no_grad)
    x, w, y = torch.randn(1, 4096), torch.randn(4096), torch.empty(1, 4096)
    residual, gate, gate_out = torch.randn(1, 4096), torch.randn(1, 8192), torch.empty(1, 4096)
    small, small_out = torch.randn(16), torch.empty(16)
    rows = {
        "cpu rmsnorm [1,4096] out=": lambda: cpu.rmsnorm(x, w, 1e-6, out=y),
        "cpu fused_add_rmsnorm [1,4096]": lambda: cpu.fused_add_rmsnorm(x, residual, w),
        "cpu silu_and_mul [1,8192] out=": lambda: cpu.silu_and_mul(gate, out=gate_out),
        "cpu softmax [1,4096]": lambda: cpu.softmax(x),
        "cpu add_constant [16] c=8 out=": lambda: cpu.add_constant(small, 8, out=small_out),
    }
    rmsnorm_module = importlib.import_module("mllm_kernel.cuda.jit.rmsnorm")._RMSNORM
    add_module = importlib.import_module("mllm_kernel.cuda.jit.add_constant")._ADD_CONSTANT
    probe = torch.randn(4, device="cuda") if torch.cuda.is_available() else torch.randn(4)
    if not torch.cuda.is_available():  # the same dict work, for the index a CPU tensor has
        dict.__setitem__(rmsnorm_module, -1, object())
        dict.__setitem__(add_module, (-1, 8), object())
    rows["cuda module lookup, no variant"] = lambda: rmsnorm_module[probe.get_device()]
    rows["cuda module lookup, variant c=8"] = lambda: add_module[probe.get_device(), 8]
    for name, fn in rows.items():
        print(f"{name:40s} {per_call_us(fn):.3f} us", flush=True)
    if torch.cuda.is_available():
        cuda_rows()


def cuda_rows() -> None:
    """Eager vs bare kernel vs launch floor vs torch.compile, per CUDA op at one token."""
    import tempfile
    from pathlib import Path

    from bench_runtime import load_empty_op, time_interleaved

    import mllm_kernel.cuda.jit as cuda

    with tempfile.TemporaryDirectory() as work:
        empty = load_empty_op(Path(work))
    dev, bf16 = "cuda", torch.bfloat16
    x, w, y = (torch.randn(1, 4096, device=dev, dtype=bf16) for _ in range(3))
    w = w[0]
    residual = torch.randn(1, 4096, device=dev, dtype=bf16)
    gate, gate_out = (
        torch.randn(1, 8192, device=dev, dtype=bf16),
        torch.empty(1, 4096, device=dev, dtype=bf16),
    )
    small, small_out = torch.randn(16, device=dev), torch.empty(16, device=dev)
    floor = lambda: empty(x, y, y, 1, 0.5)  # noqa: E731
    modules = {
        name: importlib.import_module(f"mllm_kernel.cuda.jit.{name}")
        for name in ("rmsnorm", "activation", "softmax", "add_constant")
    }
    index = x.get_device()
    d = gate.shape[-1] // 2

    def torch_rmsnorm(t: torch.Tensor) -> torch.Tensor:
        t32 = t.float()
        return (t32 * torch.rsqrt(t32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(bf16) * w

    def torch_fused_add_rmsnorm() -> None:
        residual.add_(x)
        x.copy_(torch_rmsnorm(residual))

    # name: (our eager call, its bare kernel function, the torch function compiled)
    ops = {
        "rmsnorm out=": (
            lambda: cuda.rmsnorm(x, w, 1e-6, out=y),
            lambda: modules["rmsnorm"]._RMSNORM[index].rmsnorm(y, x, w, 1e-6),
            lambda: y.copy_(torch_rmsnorm(x)),
        ),
        "fused_add_rmsnorm": (
            lambda: cuda.fused_add_rmsnorm(x, residual, w),
            lambda: modules["rmsnorm"]._RMSNORM[index].fused_add_rmsnorm(x, residual, w, 1e-6),
            torch_fused_add_rmsnorm,
        ),
        "silu_and_mul out=": (
            lambda: cuda.silu_and_mul(gate, out=gate_out),
            lambda: modules["activation"]._ACTIVATION[index].silu_and_mul(gate_out, gate),
            lambda: gate_out.copy_(torch.nn.functional.silu(gate[:, :d]) * gate[:, d:]),
        ),
        "softmax": (
            lambda: cuda.softmax(x),
            lambda: modules["softmax"]._SOFTMAX[index].softmax_forward(torch.empty_like(x), x, 1.0),
            lambda: torch.softmax(x.float(), -1).to(bf16),
        ),
        "add_constant c=8 out=": (
            lambda: cuda.add_constant(small, 8, out=small_out),
            lambda: modules["add_constant"]._ADD_CONSTANT[index, 8].add_constant(small_out, small),
            lambda: small_out.copy_(small + 8),
        ),
    }
    ops |= _layer_ops(index)
    print(
        f"\n{'CUDA op, 1 token (us/call)':28s} {'eager':>7s} {'bare':>7s} {'floor':>7s} "
        f"{'compile':>8s} {'eager/floor':>12s} {'eager/compile':>14s}"
    )
    for name, (eager, bare, in_torch) in ops.items():
        compiled = torch.compile(in_torch)
        contenders = {"eager": eager, "bare": bare, "floor": floor, "compile": compiled}
        if bare is None:
            del contenders["bare"]
        times = time_interleaved(contenders, inner=200, outer=21)
        us = {k: v * 1e6 for k, v in times.items()} | ({} if bare else {"bare": float("nan")})
        print(
            f"{name:28s} {us['eager']:7.2f} {us['bare']:7.2f} {us['floor']:7.2f} "
            f"{us['compile']:8.2f} {us['eager'] / us['floor']:11.2f}x "
            f"{us['eager'] / us['compile']:13.2f}x",
            flush=True,
        )


def _layer_ops(index: int) -> dict[str, tuple]:
    """The decoder layer's other ops at one token (bench_decoder_layer's calls), small
    weights so the kernels stay shorter than the host's work: name -> (eager call, bare
    kernel function or None, the torch function compiled: for the GEMMs, the bf16
    product a model without our kernels runs)."""
    from bench_decoder_layer import w4a16_linear, w8a8_linear

    import mllm_kernel.cuda.jit as cuda

    # The modules, not the functions of the same names that mllm_kernel.cuda.jit exports.
    gemm_module = importlib.import_module("mllm_kernel.cuda.jit.gemm")
    int8_module = importlib.import_module("mllm_kernel.cuda.jit.int8_scaled_mm")
    quant_module = importlib.import_module("mllm_kernel.cuda.jit.per_token_quant")
    rope_module = importlib.import_module("mllm_kernel.cuda.jit.rope")
    store_module = importlib.import_module("mllm_kernel.cuda.jit.store_cache")

    dev, bf16 = "cuda", torch.bfloat16
    n = k = 1024
    a, out = torch.randn(1, k, device=dev, dtype=bf16), torch.empty(1, n, device=dev, dtype=bf16)
    w = (torch.randn(n, k, device=dev) * k**-0.5).to(bf16)
    # The GEMMs' bare calls: the launches their plans bind (tvm-ffi function and tile).
    gemm_launch = gemm_module._planned((1, n, k, index, bf16))
    int8_launch = int8_module._planned((1, n, k, index))
    w4a16, w8a8 = w4a16_linear(w), w8a8_linear(w)
    a_q, scales_a = cuda.per_token_quant_int8(a)
    # [K, N] column-major, made once as a model does (bench_decoder_layer's w8a8_linear).
    w_t = torch.randint(-127, 128, (n, k), device=dev, dtype=torch.int8).t()
    scales_b = torch.rand(n, device=dev)
    q, kk = (
        torch.randn(1, 32 * 128, device=dev, dtype=bf16),
        torch.randn(1, 8 * 128, device=dev, dtype=bf16),
    )
    positions = torch.zeros(1, device=dev, dtype=torch.int64)
    cos_sin = torch.randn(4096, 128, device=dev)
    k_cache, v_cache = (torch.zeros(64, 8 * 128, device=dev, dtype=bf16) for _ in range(2))
    slots = torch.tensor([5], device=dev, dtype=torch.int64)
    mm = lambda: torch.mm(a, w.t())  # noqa: E731
    return {
        "gemm [1,1024]x1024": (
            lambda: cuda.gemm(a, w),
            lambda: gemm_launch(out, a, w, None, bf16),
            mm,
        ),
        "gptq_marlin_gemm W4 1024": (lambda: w4a16.call(a), None, mm),
        "per_token_quant_int8": (
            lambda: cuda.per_token_quant_int8(a),
            lambda: quant_module._QUANT[index].per_token_quant_int8(a_q, scales_a, a),
            lambda: (a.float() * 127 / a.float().abs().amax(-1, keepdim=True)).round().char(),
        ),
        "int8_scaled_mm 1024": (
            lambda: cuda.int8_scaled_mm(a_q, w_t, scales_a, scales_b, bf16),
            lambda: int8_launch(out, a_q, w_t, scales_a, scales_b, None),
            mm,
        ),
        "W8A8 linear (both)": (lambda: w8a8.call(a), None, mm),
        "rope 32q+8k heads": (
            lambda: cuda.apply_rope_with_cos_sin_cache_inplace(
                positions, q, kk, 128, cos_sin, True
            ),
            lambda: rope_module._ROPE[index].apply_rope_inplace(
                positions, q, kk, cos_sin, 128, True
            ),
            lambda: (q * 1.0001, kk * 1.0001),
        ),
        "store_cache 8 heads": (
            lambda: cuda.store_cache(kk, kk, k_cache, v_cache, slots),
            lambda: store_module._STORE_CACHE[index].store_cache(
                kk, kk, k_cache, v_cache, slots, None
            ),
            lambda: k_cache.index_copy_(0, slots, kk),
        ),
    }


if __name__ == "__main__":
    main()
