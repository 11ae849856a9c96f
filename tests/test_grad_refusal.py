"""No op drops a required gradient silently (issue 30): in eager mode, as under
torch.compile, an op without a backward, an op that writes its arguments in place,
and any op given an ``out=`` buffer refuse a tensor that requires grad while grad mode
is on, with a RuntimeError that says what to do, and write nothing. Under
torch.no_grad() the same calls run.

The refusal comes before any device work, so the CUDA ops' refusals are checked on CPU
tensors here (on a machine without a GPU too), and on CUDA tensors where a GPU is.
"""

from __future__ import annotations

import pytest
import torch
from conftest import HAS_GPU

import mllm_kernel.cpu.jit as cpu
import mllm_kernel.cuda.jit as cuda

OPS = torch.ops.mllm_kernel
NO_BACKWARD = "has no backward: call it on tensors that do not require grad"
OUT_BUFFER = r"does not support automatic differentiation \(as torch's out= functions\)"


def _rand(*shape, dtype=torch.float32, device="cpu", grad=False):
    return torch.randn(shape, device=device).to(dtype).requires_grad_(grad)


# No kernel on the CPU: refused by the registered op, so tested with CUDA tensors only.
CUDA_ONLY_REFUSED_BY_THE_OP = {"gelu_and_mul", "gelu_tanh_and_mul"}


# ------------------------------------------------------------------------ the cases
# Each case: (op name, a function of the device returning (call, tensors the call must
# leave unchanged)). The grad-requiring tensor is built inside.
def _cpu_cases():
    w = _rand(8)
    return {
        "add_constant": lambda: ((lambda x: cpu.add_constant(x, 2)), [_rand(2, 8, grad=True)]),
        "add_constant_runtime": lambda: (
            (lambda x: cpu.add_constant_runtime(x, 0.5)),
            [_rand(2, 8, grad=True)],
        ),
        "fused_add_rmsnorm": lambda: (
            (lambda x, r: cpu.fused_add_rmsnorm(x, r, w)),
            [_rand(2, 8, grad=True), _rand(2, 8)],
        ),
        "fused_add_rmsnorm(weight)": lambda: (
            (lambda x, r, weight: cpu.fused_add_rmsnorm(x, r, weight)),
            [_rand(2, 8), _rand(2, 8), _rand(8, grad=True)],
        ),
        "rmsnorm_backward": lambda: (
            (lambda g, x: cpu.rmsnorm_backward(g, x, w)),
            [_rand(2, 8, grad=True), _rand(2, 8)],
        ),
        "silu_and_mul_backward": lambda: (
            (lambda g, x: cpu.silu_and_mul_backward(g, x)),
            [_rand(2, 4, grad=True), _rand(2, 8)],
        ),
    }


CPU_CASES = _cpu_cases()


def _cuda_cases(device: str):
    """The CUDA ops' refusals; on CPU tensors only those decided before the op's kernel
    is looked up (all of them but the gated activations, whose registered op refuses)."""
    bf16, f16, i32 = torch.bfloat16, torch.float16, torch.int32
    w = _rand(64, device=device)

    def rand(*shape, dtype=torch.float32, grad=False):
        return _rand(*shape, dtype=dtype, device=device, grad=grad)

    def rope(q, k):
        positions = torch.arange(2, device=device)
        cuda.apply_rope_with_cos_sin_cache_inplace(positions, q, k, 64, rand(16, 64))

    def store(k, k_cache):
        cuda.store_cache(k, rand(2, 64), k_cache, rand(8, 64), torch.arange(2, device=device))

    def int8_mm(scales_a):
        a = torch.ones(4, 64, dtype=torch.int8, device=device)
        b = torch.ones(64, 64, dtype=torch.int8, device=device).t()
        return cuda.int8_scaled_mm(a, b, scales_a, torch.ones(64, device=device), bf16)

    def marlin(a):
        weight = torch.zeros(4, 128, dtype=i32, device=device)
        workspace = torch.zeros(132, dtype=i32, device=device)
        uint4b8 = cuda.scalar_types.uint4b8.id
        scales = rand(1, 64, dtype=f16)
        args = (None, None, None, None, workspace, uint4b8, 1, 64, 64)
        return cuda.gptq_marlin_gemm(a, None, weight, scales, *args)

    def gdn(q, state_pool):
        k, v, ab = rand(2, 2, 64, dtype=bf16), rand(2, 2, 64, dtype=bf16), rand(2, 2, dtype=bf16)
        indices = torch.arange(2, device=device)
        cuda.gdn_decode(q, k, v, ab, ab, rand(2), rand(2), state_pool, indices)

    def gdn_ext(q, state_pool):
        k, v, ab = rand(3, 2, 64, dtype=bf16), rand(3, 2, 64, dtype=bf16), rand(3, 2, dtype=bf16)
        indices, offsets = torch.arange(2, device=device), torch.tensor([0, 1, 3], device=device)
        cuda.gdn_extend(q, k, v, ab, ab, rand(2), rand(2), state_pool, indices, offsets)

    cases = {
        "add_constant": lambda: (lambda x: cuda.add_constant(x, 2), [rand(2, 8, grad=True)]),
        "add_constant_runtime": lambda: (
            lambda x: cuda.add_constant_runtime(x, 0.5),
            [rand(2, 8, grad=True)],
        ),
        "fused_add_rmsnorm": lambda: (
            lambda x, r: cuda.fused_add_rmsnorm(x, r, w),
            [rand(2, 64, grad=True), rand(2, 64)],
        ),
        "rms_norm_gated": lambda: (
            lambda x, z: cuda.rms_norm_gated(x, w, z),
            [rand(2, 64), rand(2, 64, grad=True)],
        ),
        "rmsnorm_backward": lambda: (
            lambda g, x: cuda.rmsnorm_backward(g, x, w),
            [rand(2, 64, grad=True), rand(2, 64)],
        ),
        "silu_and_mul_backward": lambda: (
            cuda.silu_and_mul_backward,
            [rand(2, 32, grad=True), rand(2, 64)],
        ),
        "softmax_backward": lambda: (cuda.softmax_backward, [rand(2, 64, grad=True), rand(2, 64)]),
        "apply_rope_with_cos_sin_cache_inplace": lambda: (
            rope,
            [rand(2, 128, grad=True), rand(2, 128)],
        ),
        "store_cache": lambda: (store, [rand(2, 64, grad=True), rand(8, 64)]),
        # the weight (an nn.Linear parameter, say) is the one requiring grad
        "gemm": lambda: (cuda.gemm, [rand(4, 64, dtype=bf16), rand(64, 64, dtype=bf16, grad=True)]),
        "int8_scaled_mm": lambda: (int8_mm, [rand(4, grad=True)]),
        "per_token_quant_int8": lambda: (
            cuda.per_token_quant_int8,
            [rand(4, 64, dtype=bf16, grad=True)],
        ),
        "gptq_marlin_gemm": lambda: (marlin, [rand(1, 64, dtype=f16, grad=True)]),
        "gdn_decode": lambda: (gdn, [rand(2, 2, 64, dtype=bf16, grad=True), rand(4, 2, 64, 64)]),
        "gdn_extend": lambda: (
            gdn_ext,
            [rand(3, 2, 64, dtype=bf16, grad=True), rand(4, 2, 64, 64)],
        ),
    }
    if device == "cuda":
        for name in CUDA_ONLY_REFUSED_BY_THE_OP:
            op = getattr(cuda, name)
            cases[name] = lambda op=op: (op, [rand(2, 64, grad=True)])
    return cases


# Public names that are not ops on tensors that could require grad: helpers, integer
# tensors only (indices, packed weights), or ops with a backward (tested in
# test_autograd.py; their out= refusal below).
NOT_REFUSING = {
    "rmsnorm", "silu_and_mul", "softmax",  # differentiable
    "scalar_types", "can_use_store_cache", "marlin_make_workspace",
    "marlin_permute_scales", "marlin_zero_points", "awq_to_marlin_zero_points",  # pure torch
    "create_kv_indices", "gptq_marlin_repack", "awq_marlin_repack",  # integer tensors only
}  # fmt: skip


def test_every_public_op_is_covered():
    """A new op must say here how it treats a required grad."""
    cpu_names = {name.split("(")[0] for name in CPU_CASES}
    assert set(cpu.__all__) - NOT_REFUSING == cpu_names
    cuda_names = {name.split("(")[0] for name in _cuda_cases("cpu")}
    assert set(cuda.__all__) - NOT_REFUSING - CUDA_ONLY_REFUSED_BY_THE_OP == cuda_names


def _check_refused(op_name, make):
    call, tensors = make()
    before = [t.detach().clone() for t in tensors]
    with pytest.raises(RuntimeError, match=f"mllm_kernel.{op_name.split('(')[0]} {NO_BACKWARD}"):
        call(*tensors)
    for value, old in zip(tensors, before, strict=True):
        assert torch.equal(value.detach(), old)  # nothing written


@pytest.mark.parametrize("op_name", list(CPU_CASES))
def test_cpu_op_refuses_a_required_grad(op_name):
    _check_refused(op_name, CPU_CASES[op_name])
    call, tensors = CPU_CASES[op_name]()
    with torch.no_grad():
        call(*tensors)  # not recording: runs


def test_registered_in_place_op_refuses_a_required_grad():
    """torch.ops.mllm_kernel.fused_add_rmsnorm called directly: an op that writes its
    arguments has no autograd kernel, so its registered implementation refuses."""
    x, residual = _rand(2, 8, grad=True), _rand(2, 8)
    _check_refused(
        "fused_add_rmsnorm",
        lambda: ((lambda a, r: OPS.fused_add_rmsnorm(a, r, torch.ones(8))), [x, residual]),
    )


@pytest.mark.parametrize("op_name", sorted(set(_cuda_cases("cpu"))))
def test_cuda_op_refuses_a_required_grad_before_the_device_check(op_name):
    _check_refused(op_name, _cuda_cases("cpu")[op_name])


@pytest.mark.cuda
@pytest.mark.parametrize("op_name", sorted(_cuda_cases("cuda") if HAS_GPU else []))
def test_cuda_op_refuses_a_required_grad_on_the_gpu(op_name):
    _check_refused(op_name, _cuda_cases("cuda")[op_name])


@pytest.mark.parametrize(
    "call",
    [
        lambda x, o: cpu.add_constant(x, 2, out=o),
        lambda x, o: cpu.add_constant_runtime(x, 2.0, out=o),
        lambda x, o: cpu.rmsnorm(x, torch.ones(8), out=o),
        lambda x, o: cpu.silu_and_mul(torch.cat([x, x], -1), out=o),
        lambda x, o: cpu.softmax(x, out=o),
        lambda x, o: OPS.add_constant.out(x, 2, out=o),
    ],
    ids=["add_constant", "add_constant_runtime", "rmsnorm", "silu_and_mul", "softmax", ".out"],
)
def test_an_out_buffer_that_requires_grad_is_refused(call):
    x, out = _rand(2, 8), _rand(2, 8, grad=True)
    before = out.detach().clone()
    with pytest.raises(RuntimeError, match=f"{NO_BACKWARD}|{OUT_BUFFER}"):
        call(x, out)
    assert torch.equal(out.detach(), before)


@pytest.mark.parametrize(
    "call",
    [
        lambda x, o: cpu.rmsnorm(x, torch.ones(8), out=o),
        lambda x, o: cpu.silu_and_mul(torch.cat([x, x], -1), out=o),
        lambda x, o: cpu.softmax(x, out=o),
    ],
    ids=["rmsnorm", "silu_and_mul", "softmax"],
)
def test_a_numpy_out_buffer_is_written_by_a_differentiable_op(call):
    """A NumPy out= has no requires_grad: the differentiable ops' grad test must not
    trip over it (the CUDA ops' is the same code, run on the GPU machine)."""
    import numpy as np

    x = _rand(2, 8)
    out = np.full((2, 8), np.nan, dtype=np.float32)
    assert call(x, out) is not None
    assert np.isfinite(out).all()


# ------------------------------------------------- writes autograd must know about
@pytest.mark.parametrize(
    "write",
    [
        lambda w: cpu.add_constant(w, 8, out=w),
        lambda w: cpu.rmsnorm(w[None], torch.ones(4), out=w[None]),
        lambda w: cpu.fused_add_rmsnorm(torch.randn(1, 4), w[None], torch.ones(4)),
        lambda w: OPS.add_constant.out(w, 8, out=w),
    ],
    ids=["out", "out-view", "writes", "registered-out"],
)
def test_a_write_into_a_tensor_saved_for_backward_fails_that_backward(write):
    """An op's kernel writes its out= buffer (or a declared argument) where autograd
    cannot see it: the tensor's version counter says so, as torch's in-place ops do, so
    a backward that needs the tensor's old values refuses instead of using the new ones
    (it gave x.grad = w + 8, silently)."""
    x, w = torch.randn(4, requires_grad=True), torch.ones(4)
    y = (x * w).sum()  # saves w
    with torch.no_grad():
        write(w)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_under_compile_an_op_writing_its_arguments_refuses_a_required_grad():
    """Compiled, the registered kernel of an op that writes its arguments runs inside a
    forward where grad mode is off, so its refusal never fired and the gradient through
    it was dropped (w.grad half the true one): the refusal now comes where Dynamo
    traces the call."""
    import torch._dynamo

    torch._dynamo.reset()
    a, residual, w = _rand(2, 16), _rand(2, 16), _rand(16, grad=True)

    def step(a, residual, w):
        cpu.fused_add_rmsnorm(a, residual, w)
        return (a * w).sum()

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match="fused_add_rmsnorm has no backward"):
        compiled(a, residual, w).backward()
