"""Per-call host cost of the op layer at decode size: CPU ops, and the CUDA module lookup
(on a GPU when there is one, else on a memo entry pre-filled for a CPU tensor's index).

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


if __name__ == "__main__":
    main()
