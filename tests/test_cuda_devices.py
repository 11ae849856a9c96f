"""Every op family on a non-current GPU, on a side stream, and inside a CUDA graph."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

pytestmark = pytest.mark.cuda


@dataclass
class Case:
    """``run(inputs)`` returns the op's result (or the tensor it updates in place);
    ``reference(inputs)`` the expected value computed with torch."""

    make_inputs: Callable[[torch.device], dict]
    run: Callable[[dict], torch.Tensor]
    reference: Callable[[dict], torch.Tensor]
    atol: float = 2e-2


def _norm_case():
    def make(dev):
        return {
            "x": torch.randn(16, 4096, device=dev, dtype=torch.bfloat16),
            "w": torch.randn(4096, device=dev, dtype=torch.bfloat16),
        }

    def run(i):
        from mllm_kernel.cuda.jit import rmsnorm

        return rmsnorm(i["x"], i["w"])

    def ref(i):
        x = i["x"].double()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * i["w"].double()

    return Case(make, run, ref, atol=5e-2)


def _fused_norm_case():
    def make(dev):
        return {
            "x": torch.randn(8, 5120, device=dev, dtype=torch.float16),
            "r": torch.randn(8, 5120, device=dev, dtype=torch.float16),
            "w": torch.randn(5120, device=dev, dtype=torch.float16),
        }

    def run(i):
        from mllm_kernel.cuda.jit import fused_add_rmsnorm

        x, r = i["x"].clone(), i["r"].clone()
        fused_add_rmsnorm(x, r, i["w"])
        return torch.cat([x, r])

    def ref(i):
        r = (i["x"].double() + i["r"].double()).half().double()
        y = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + 1e-6) * i["w"].double()
        return torch.cat([y, r])

    return Case(make, run, ref, atol=2e-2)


def _activation_case():
    def make(dev):
        return {"x": torch.randn(8, 2 * 11008, device=dev, dtype=torch.bfloat16)}

    def run(i):
        from mllm_kernel.cuda.jit import silu_and_mul

        return silu_and_mul(i["x"])

    def ref(i):
        x, y = i["x"].double().chunk(2, -1)
        return torch.nn.functional.silu(x) * y

    return Case(make, run, ref)


def _rope_case():
    def make(dev):
        inv = 1.0 / (10000 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128))
        freqs = torch.outer(torch.arange(1024, dtype=torch.float64), inv)
        return {
            "pos": torch.randint(0, 1024, (9,), device=dev),
            "q": torch.randn(9, 4 * 128, device=dev, dtype=torch.bfloat16),
            "k": torch.randn(9, 128, device=dev, dtype=torch.bfloat16),
            "cache": torch.cat([freqs.cos(), freqs.sin()], -1).float().to(dev),
        }

    def run(i):
        from mllm_kernel.cuda.jit import apply_rope_with_cos_sin_cache_inplace

        q, k = i["q"].clone(), i["k"].clone()
        apply_rope_with_cos_sin_cache_inplace(i["pos"], q, k, 128, i["cache"])
        return torch.cat([q, k], dim=1)

    def ref(i):
        cos = i["cache"][i["pos"], :64].double()[:, None]
        sin = i["cache"][i["pos"], 64:].double()[:, None]

        def rotate(x):
            x = x.double().view(x.shape[0], -1, 128)
            x1, x2 = x[..., :64], x[..., 64:]
            return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).flatten(1)

        return torch.cat([rotate(i["q"]), rotate(i["k"])], dim=1)

    return Case(make, run, ref, atol=5e-2)


def _softmax_case(hidden):
    def make(dev):
        return {"x": 4 * torch.randn(4, hidden, device=dev)}

    def run(i):
        from mllm_kernel.cuda.jit import softmax

        return softmax(i["x"], temperature=0.5)

    def ref(i):
        return torch.softmax(i["x"].double() / 0.5, -1)

    return Case(make, run, ref, atol=1e-5)


def _store_cache_case():
    def make(dev):
        return {
            "k": torch.randn(8, 8, 128, device=dev, dtype=torch.bfloat16),
            "v": torch.randn(8, 8, 128, device=dev, dtype=torch.bfloat16),
            "idx": torch.tensor([5, -1, 0, 9, 2, 7, 30, 31], device=dev),
        }

    def run(i):
        from mllm_kernel.cuda.jit import store_cache

        k_cache = torch.zeros(32, 8, 128, device=i["k"].device, dtype=torch.bfloat16)
        v_cache = torch.zeros_like(k_cache)
        store_cache(i["k"], i["v"], k_cache, v_cache, i["idx"])
        return torch.cat([k_cache, v_cache])

    def ref(i):
        k_cache = torch.zeros(32, 8, 128, device=i["k"].device, dtype=torch.bfloat16)
        v_cache = torch.zeros_like(k_cache)
        keep = i["idx"] >= 0
        k_cache[i["idx"][keep]] = i["k"][keep]
        v_cache[i["idx"][keep]] = i["v"][keep]
        return torch.cat([k_cache, v_cache]).double()

    return Case(make, run, ref, atol=0)


def _kv_indices_case():
    def make(dev):
        return {
            "r2t": torch.randint(0, 1 << 20, (16, 4096), device=dev, dtype=torch.int32),
            "pool": torch.tensor([3, 0, 9], device=dev),
            "lens": torch.tensor([4000, 1, 77], device=dev, dtype=torch.int32),
            "indptr": torch.tensor([0, 4000, 4001, 4078], device=dev, dtype=torch.int32),
            "start": torch.tensor([50, 0, 3], device=dev),
        }

    def run(i):
        from mllm_kernel.cuda.jit import create_kv_indices

        out = torch.full((4078,), -1, device=i["r2t"].device, dtype=torch.int32)
        create_kv_indices(i["r2t"], i["pool"], i["lens"], i["indptr"], i["start"], out)
        return out

    def ref(i):
        parts = [
            i["r2t"][p, s : s + n]
            for p, s, n in zip(
                i["pool"].tolist(), i["start"].tolist(), i["lens"].tolist(), strict=True
            )
        ]
        return torch.cat(parts).double()

    return Case(make, run, ref, atol=0)


def _add_constant_case():
    def make(dev):
        return {"x": torch.randint(-100, 100, (1000, 33), device=dev, dtype=torch.int32)}

    def run(i):
        from mllm_kernel.cuda.jit import add_constant

        return add_constant(i["x"], 8)

    def ref(i):
        return (i["x"] + 8).double()

    return Case(make, run, ref, atol=0)


CASES = {
    "add_constant": _add_constant_case(),
    "rmsnorm": _norm_case(),
    "fused_add_rmsnorm": _fused_norm_case(),
    "silu_and_mul": _activation_case(),
    "rope": _rope_case(),
    "softmax_small": _softmax_case(1000),
    "softmax_cluster": _softmax_case(40000),  # few rows: the cluster tier
    "softmax_sliced": _softmax_case(200000),  # 16 slices of a row in shared memory
    "store_cache": _store_cache_case(),
    "create_kv_indices": _kv_indices_case(),
}


def _check(case: Case, inputs: dict, got: torch.Tensor) -> None:
    torch.testing.assert_close(got.double(), case.reference(inputs), rtol=2e-2, atol=case.atol)


@pytest.mark.parametrize("name", list(CASES))
def test_non_current_device(name):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs (tensors on cuda:1 while cuda:0 is current)")
    case = CASES[name]
    torch.cuda.set_device(0)
    dev = torch.device("cuda:1")
    inputs = case.make_inputs(dev)
    got = case.run(inputs)
    assert got.device == dev
    assert torch.cuda.current_device() == 0
    torch.cuda.synchronize(dev)
    _check(case, inputs, got)


@pytest.mark.parametrize("name", list(CASES))
def test_side_stream(name):
    """The op must run on torch's current stream: its input is produced on that stream
    behind a long sleep, so running on any other stream would read stale data."""
    case = CASES[name]
    dev = torch.device("cuda")
    inputs = case.make_inputs(dev)
    staged = {k: torch.zeros_like(v) for k, v in inputs.items()}
    case.run(inputs)  # build and load outside the timed region
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(50_000_000)
        for key, value in inputs.items():
            staged[key].copy_(value)
        got = case.run(staged)
    torch.cuda.synchronize()
    _check(case, inputs, got)


@pytest.mark.parametrize("name", list(CASES))
def test_cuda_graph_capture_and_replay(name):
    case = CASES[name]
    dev = torch.device("cuda")
    static = case.make_inputs(dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (build, load) outside capture
        case.run(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = case.run(static)
    fresh = case.make_inputs(dev)
    for key, value in fresh.items():
        static[key].copy_(value)
    graph.replay()
    torch.cuda.synchronize()
    _check(case, fresh, got)
