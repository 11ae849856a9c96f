"""Where an eager GEMM call's host time goes: cProfile over many calls of each op."""
import cProfile, pstats, sys, io, time
sys.path.insert(0, "benchmarks")
import torch
import mllm_kernel.cuda.jit as cuda
from bench_decoder_layer import w4a16_linear, w8a8_linear
dev, bf16 = "cuda", torch.bfloat16
n = k = 1024
a = torch.randn(1, k, device=dev, dtype=bf16)
w = (torch.randn(n, k, device=dev) * k**-0.5).to(bf16)
w4, w8 = w4a16_linear(w), w8a8_linear(w)
a_q, sa = cuda.per_token_quant_int8(a)
w_t = torch.randint(-127, 128, (n, k), device=dev, dtype=torch.int8).t()
sb = torch.rand(n, device=dev)
import importlib
G = importlib.import_module("mllm_kernel.cuda.jit.gemm")
launch = G._planned((1, n, k, 0, bf16))
out = torch.empty(1, n, device=dev, dtype=bf16)
ops = {
    "bare reused out": lambda: launch(out, a, w, None, bf16),
    "bare new_empty out": lambda: launch(a.new_empty(size=(1, n), dtype=bf16), a, w, None, bf16),
    "gemm out=": lambda: cuda.gemm(a, w, out=out),
    "gemm": lambda: cuda.gemm(a, w),
    "w4a16": lambda: w4.call(a),
    "quant": lambda: cuda.per_token_quant_int8(a),
    "int8": lambda: cuda.int8_scaled_mm(a_q, w_t, sa, sb, bf16),
    "empty": lambda: torch.empty(1, n, device=dev, dtype=bf16),
}
for name, fn in ops.items():
    for _ in range(200): fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(3000): fn()
    torch.cuda.synchronize()
    print(f"== {name}: {(time.perf_counter()-t)/3000*1e6:.2f} us/call", flush=True)
    pr = cProfile.Profile(); pr.enable()
    for _ in range(3000): fn()
    pr.disable(); torch.cuda.synchronize()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18); print(s.getvalue()[-4000:])
