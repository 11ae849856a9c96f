"""CUDA ops and inputs they cannot take (issue 19 points 3, 4, 6; issue 20).

The first part needs no GPU: a CPU or meta tensor, a non-tensor or a non-number is
refused before an arch is chosen or anything compiles. The second part
(``cuda`` marker) runs the kernels' overlap and zero-stride checks on a GPU.
"""

from __future__ import annotations

import pytest
import torch

from mllm_kernel.cuda import jit as cuda
from mllm_kernel.jit_utils import loader


def _ops(device):
    """Each CUDA op as (callable taking tensors by keyword, valid keyword arguments)."""

    def t(*shape, dtype=torch.float32):
        return torch.randn(*shape, device=device).to(dtype)

    def i(*values):
        return torch.tensor(values, dtype=torch.int32, device=device)

    return {
        "add_constant": (lambda **a: cuda.add_constant(**a, constant=4), {"src": t(4)}),
        "add_constant_runtime": (
            lambda **a: cuda.add_constant_runtime(**a, constant=0.5),
            {"src": t(4)},
        ),
        "rmsnorm": (
            lambda **a: cuda.rmsnorm(a["input"], a["weight"], out=a.get("out")),
            {"input": t(2, 8), "weight": t(8)},
        ),
        "fused_add_rmsnorm": (
            lambda **a: cuda.fused_add_rmsnorm(a["input"], a["residual"], a["weight"]),
            {"input": t(2, 8), "residual": t(2, 8), "weight": t(8)},
        ),
        "rms_norm_gated": (
            lambda **a: cuda.rms_norm_gated(a["x"], a["weight"], a["z"], out=a.get("out")),
            {"x": t(2, 8), "weight": t(8), "z": t(2, 8)},
        ),
        "silu_and_mul": (
            lambda **a: cuda.silu_and_mul(a["input"], a.get("out")),
            {"input": t(2, 8)},
        ),
        "gelu_and_mul": (
            lambda **a: cuda.gelu_and_mul(a["input"], a.get("out")),
            {"input": t(2, 8)},
        ),
        "gelu_tanh_and_mul": (
            lambda **a: cuda.gelu_tanh_and_mul(a["input"], a.get("out")),
            {"input": t(2, 8)},
        ),
        "softmax": (lambda **a: cuda.softmax(a["x"], out=a.get("out")), {"x": t(2, 8)}),
        "softmax_backward": (
            lambda **a: cuda.softmax_backward(a["grad_out"], a["out"], a.get("grad_input")),
            {"grad_out": t(2, 8), "out": t(2, 8).softmax(-1)},
        ),
        "rope": (
            lambda **a: cuda.apply_rope_with_cos_sin_cache_inplace(
                a["positions"], a["query"], a["key"], 8, a["cos_sin_cache"]
            ),
            {"positions": i(0, 1), "query": t(2, 16), "key": t(2, 8), "cos_sin_cache": t(4, 8)},
        ),
        "store_cache": (
            lambda **a: cuda.store_cache(a["k"], a["v"], a["k_cache"], a["v_cache"], a["indices"]),
            {
                "k": t(2, 8),
                "v": t(2, 8),
                "k_cache": t(4, 8),
                "v_cache": t(4, 8),
                "indices": i(0, 3),
            },
        ),
        "gemm": (
            lambda **a: cuda.gemm(a["a"], a["b"], a.get("out")),
            {"a": t(16, 64, dtype=torch.bfloat16), "b": t(8, 64, dtype=torch.bfloat16)},
        ),
        "int8_scaled_mm": (
            lambda **a: cuda.int8_scaled_mm(
                a["mat_a"], a["mat_b"], a["scales_a"], a["scales_b"], torch.bfloat16
            ),
            {
                "mat_a": t(16, 64, dtype=torch.int8),
                "mat_b": t(8, 64, dtype=torch.int8).t(),
                "scales_a": t(16),
                "scales_b": t(8),
            },
        ),
        "per_token_quant_int8": (lambda **a: cuda.per_token_quant_int8(a["x"]), {"x": t(2, 8)}),
        "create_kv_indices": (
            lambda **a: cuda.create_kv_indices(
                a["req_to_token"],
                a["req_pool_indices"],
                a["page_kernel_lens"],
                a["kv_indptr"],
                None,
                a["kv_indices"],
            ),
            {
                "req_to_token": i(0, 1, 2, 3).reshape(2, 2),
                "req_pool_indices": i(0, 1),
                "page_kernel_lens": i(2, 2),
                "kv_indptr": i(0, 2, 4),
                "kv_indices": i(0, 0, 0, 0),
            },
        ),
    }


CPU_OPS = _ops("cpu")
# When every tensor is on the CPU, the error names the op's first tensor argument.
FIRST_ARG = {op: next(iter(args)) for op, (_, args) in CPU_OPS.items()}


@pytest.fixture
def no_arch_no_compile(monkeypatch):
    """No CUDA arch configured, and any build attempt fails the test."""
    monkeypatch.delenv("MLLM_KERNEL_CUDA_ARCH_LIST", raising=False)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)

    def no_build(spec):
        raise AssertionError(f"{spec.describe()} was built or loaded for a bad input")

    monkeypatch.setattr(loader, "load_spec", no_build)


@pytest.mark.parametrize("op", CPU_OPS)
def test_cpu_tensor_is_refused_before_any_arch_or_build(op, no_arch_no_compile):
    # Before: CudaArchError without an arch; with one, a 15 s compile, then the error.
    fn, args = CPU_OPS[op]
    arg = FIRST_ARG[op]
    with pytest.raises(
        ValueError, match=rf"^argument '{arg}': expected a tensor on cuda but got one on cpu"
    ):
        fn(**args)


@pytest.mark.parametrize("op", CPU_OPS)
def test_meta_tensor_is_refused_naming_it(op, no_arch_no_compile):
    fn, args = CPU_OPS[op]
    meta = {k: v.to("meta") for k, v in args.items()}
    arg = FIRST_ARG[op]
    with pytest.raises(
        ValueError, match=rf"^argument '{arg}': expected a tensor on cuda but got a meta tensor"
    ):
        fn(**meta)


@pytest.mark.parametrize(
    ("op", "arg"), [(op, arg) for op, (_, args) in CPU_OPS.items() for arg in args]
)
def test_non_tensor_is_a_type_error_naming_it(op, arg, no_arch_no_compile):
    # A str, not None: None is a valid value for optional tensors (rms_norm_gated's z).
    fn, args = CPU_OPS[op]
    with pytest.raises(
        TypeError,
        match=rf"^argument '{arg}': expected a torch.Tensor \(or a DLPack tensor.*\) but got str",
    ):
        fn(**{**args, arg: "x"})


@pytest.mark.parametrize(
    "call",
    [
        lambda: cuda.rmsnorm(torch.randn(2, 4), torch.ones(4), eps="1e-6"),
        lambda: cuda.rms_norm_gated(torch.randn(2, 4), torch.ones(4), torch.randn(2, 4), eps=True),
        lambda: cuda.fused_add_rmsnorm(torch.randn(2, 4), torch.randn(2, 4), torch.ones(4), "0"),
        lambda: cuda.add_constant_runtime(torch.randn(3), "1.5"),
        lambda: cuda.softmax(torch.randn(3), temperature="hot"),
    ],
    ids=["rmsnorm-eps", "gated-eps-bool", "fused-eps", "runtime-constant", "softmax-temperature"],
)
def test_scalars_must_be_numbers(call, no_arch_no_compile):
    with pytest.raises(
        TypeError, match=r"^argument '(eps|constant|temperature)': expected a number"
    ):
        call()


def test_rope_head_size_must_be_an_int(no_arch_no_compile):
    _, args = CPU_OPS["rope"]
    with pytest.raises(TypeError, match=r"^argument 'head_size': expected an int but got float"):
        cuda.apply_rope_with_cos_sin_cache_inplace(
            args["positions"], args["query"], args["key"], 8.0, args["cos_sin_cache"]
        )


def test_softmax_dim_out_of_range_is_an_index_error(no_arch_no_compile):
    with pytest.raises(IndexError, match=r"^argument 'dim': dimension out of range"):
        cuda.softmax(torch.randn(2, 3), dim=2)


# --------------------------------------------------------------------------- on a GPU
@pytest.mark.cuda
def test_add_constant_refuses_overlapping_out():
    x = torch.randn(8, 8, device="cuda")
    with pytest.raises(
        ValueError, match=r"^argument 'out': (overlaps argument 'src'|expected a contig)"
    ):
        cuda.add_constant(x, 8, out=x.t())
    b = torch.randn(65, device="cuda")
    with pytest.raises(
        ValueError, match=r"^argument 'out': overlaps argument 'src'.*or 'src' itself"
    ):
        cuda.add_constant(b[:64], 1, out=b[1:])
    y = torch.randn(64, device="cuda")
    expected = y + 2
    assert cuda.add_constant(y, 2, out=y) is y  # in place on the same view is supported
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


def _cuda(*shape):
    return torch.randn(*shape, device="cuda")


# The C++ checks name the Python argument (issue 17 point 6): before, a bad tensor
# passed as add_constant(src=...) was reported as argument 'x'.
@pytest.mark.cuda
@pytest.mark.parametrize(
    ("call", "arg"),
    [
        (lambda bad: cuda.rmsnorm(input=bad, weight=_cuda(8)), "input"),
        (
            lambda bad: cuda.fused_add_rmsnorm(input=bad, residual=_cuda(4, 8), weight=_cuda(8)),
            "input",
        ),
        (lambda bad: cuda.rms_norm_gated(x=bad, weight=_cuda(8), z=_cuda(4, 8)), "x"),
        (lambda bad: cuda.silu_and_mul(input=bad), "input"),
        (lambda bad: cuda.gelu_and_mul(input=bad), "input"),
        (lambda bad: cuda.gelu_tanh_and_mul(input=bad), "input"),
        (lambda bad: cuda.add_constant(src=bad, constant=4), "src"),
        (lambda bad: cuda.add_constant_runtime(src=bad, constant=0.5), "src"),
        (lambda bad: cuda.softmax(x=bad), "x"),
        (lambda bad: cuda.softmax_backward(grad_out=bad, out=_cuda(4, 8)), "grad_out"),
    ],
    ids=[
        "rmsnorm",
        "fused_add_rmsnorm",
        "rms_norm_gated",
        "silu_and_mul",
        "gelu_and_mul",
        "gelu_tanh_and_mul",
        "add_constant",
        "runtime",
        "softmax",
        "softmax_backward",
    ],
)
def test_dtype_error_names_the_keyword_the_caller_wrote(call, arg):
    with pytest.raises(TypeError, match=rf"^argument '{arg}': .*uint8"):
        call(torch.zeros(4, 8, dtype=torch.uint8, device="cuda"))


@pytest.mark.cuda
def test_runtime_constant_error_names_the_keyword_the_caller_wrote():
    src = torch.zeros(4, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match=r"^argument 'constant': an int32 tensor needs an int"):
        cuda.add_constant_runtime(src=src, constant=0.5)


@pytest.mark.cuda
@pytest.mark.parametrize(
    "op",
    [
        "add_constant",
        "rmsnorm",
        "rms_norm_gated",
        "silu_and_mul",
        "gelu_and_mul",
        "softmax",
        "gemm",
    ],
)
def test_zero_stride_out_is_refused(op):
    fn, args = _ops("cuda")[op]
    out = fn(**args)
    expanded = torch.empty_like(out)[:1].expand_as(out)
    with pytest.raises(ValueError, match=r"^argument 'out': (has stride 0|expected a contiguous)"):
        fn(**args, out=expanded)


@pytest.mark.cuda
def test_norms_refuse_overlaps_and_keep_in_place():
    x, weight = torch.randn(4, 64, device="cuda"), torch.randn(64, device="cuda")
    expected = cuda.rmsnorm(x, weight)
    assert cuda.rmsnorm(x, weight, out=x) is x
    torch.testing.assert_close(x, expected, rtol=0, atol=0)
    buf = torch.randn(4, 65, device="cuda")
    with pytest.raises(ValueError, match=r"^argument 'out': overlaps argument 'input'"):
        cuda.rmsnorm(buf[:, 1:], weight, out=buf[:, :64])
    with pytest.raises(ValueError, match=r"^argument 'input': is the same memory as argument"):
        cuda.fused_add_rmsnorm(x, x, weight)
    with pytest.raises(ValueError, match=r"^argument 'residual': has stride 0"):
        cuda.fused_add_rmsnorm(x, torch.randn(1, 64, device="cuda").expand(4, 64), weight)
    z = torch.randn(4, 64, device="cuda")
    with pytest.raises(ValueError, match=r"^argument 'out': is the same memory as argument 'z'"):
        cuda.rms_norm_gated(x, weight, z, out=z)


@pytest.mark.cuda
def test_rope_on_query_and_key_of_one_qkv_buffer_is_accepted_and_right():
    qkv = torch.randn(3, 3 * 64, device="cuda")
    positions = torch.tensor([0, 5, 9], device="cuda")
    freqs = torch.outer(torch.arange(16.0), 1.0 / 10000 ** (torch.arange(0, 32, 2) / 32.0))
    cache = torch.cat([freqs.cos(), freqs.sin()], -1).float().cuda()
    q, k = qkv[:, :64].clone(), qkv[:, 64:128].clone()
    cuda.apply_rope_with_cos_sin_cache_inplace(positions, q, k, 32, cache)
    cuda.apply_rope_with_cos_sin_cache_inplace(positions, qkv[:, :64], qkv[:, 64:128], 32, cache)
    torch.testing.assert_close(qkv[:, :64], q, rtol=0, atol=0)
    torch.testing.assert_close(qkv[:, 64:128], k, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"^argument 'query': overlaps argument 'key'"):
        cuda.apply_rope_with_cos_sin_cache_inplace(positions, qkv[:, :64], qkv[:, 32:96], 32, cache)


@pytest.mark.cuda
def test_store_cache_refuses_expanded_caches():
    fn, args = _ops("cuda")["store_cache"]
    shared = torch.randn(1, 8, device="cuda").expand(4, 8)
    with pytest.raises(ValueError, match=r"^argument 'k_cache': has stride 0"):
        fn(**{**args, "k_cache": shared})


@pytest.mark.cuda
@pytest.mark.parametrize("op", ["add_constant", "rmsnorm", "silu_and_mul", "softmax"])
def test_negative_view_inputs_are_read_as_torch_shows_them(op):
    fn, args = _ops("cuda")[op]
    arg = FIRST_ARG[op]
    raw = torch.randn(args[arg].shape, device="cuda")
    view = torch.complex(torch.zeros_like(raw), raw).conj().imag
    assert view.is_neg()
    expected = fn(**{**args, arg: view.clone()})
    torch.testing.assert_close(fn(**{**args, arg: view}), expected, rtol=0, atol=0)
