"""The ops as torch custom ops (issue 16): ``torch.ops.mllm_kernel.*`` with schemas, fake
implementations and the right mutations (opcheck), traced by torch.compile(fullgraph=True)
without a graph break, not on the eager path; DLPack inputs (numpy here, CuPy on a GPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import mllm_kernel.cpu.jit as cpu
import mllm_kernel.cuda.jit as cuda
from mllm_kernel.jit_utils.torch_op import torch_op

REPO = Path(__file__).resolve().parent.parent
OPS = torch.ops.mllm_kernel

# Every public op of both devices and its registered op; the CUDA package's pure-torch
# helpers and queries run no kernel of their own and are not ops of the namespace.
NOT_KERNELS = {
    "can_use_store_cache": "a query on a row size, no tensors",
    "marlin_make_workspace": "a torch.zeros of the SM count",
    "marlin_permute_scales": "torch indexing of the scales",
    "marlin_zero_points": "torch indexing and bit packing of the zero points",
    "awq_to_marlin_zero_points": "torch unpacking and marlin_zero_points",
    "scalar_types": "the weight-type table, not a function",
}
CPU_OPS = {name: name for name in cpu.__all__}
CUDA_OPS = {name: name for name in cuda.__all__ if name not in NOT_KERNELS}


def _has_kernel(name: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"mllm_kernel::{name}", key)


# --------------------------------------------------------------------------- registration
@pytest.mark.parametrize("name", sorted(CPU_OPS))
def test_every_cpu_op_is_registered_with_a_cpu_kernel(name):
    assert _has_kernel(name, "CPU"), f"torch.ops.mllm_kernel.{name} has no CPU kernel"
    assert hasattr(OPS, name)


@pytest.mark.parametrize("name", sorted(CUDA_OPS))
def test_every_cuda_op_is_registered_with_a_cuda_kernel(name):
    assert _has_kernel(name, "CUDA"), f"torch.ops.mllm_kernel.{name} has no CUDA kernel"


def test_ops_on_both_devices_are_one_op_with_one_schema():
    both = sorted(set(CPU_OPS) & set(CUDA_OPS))
    assert both == [
        "add_constant",
        "add_constant_runtime",
        "fused_add_rmsnorm",
        "rmsnorm",
        "rmsnorm_backward",
        "silu_and_mul",
        "silu_and_mul_backward",
        "softmax",
    ]
    for name in both:
        assert _has_kernel(name, "CPU") and _has_kernel(name, "CUDA"), name
    assert str(OPS.rmsnorm.default._schema) == (
        "mllm_kernel::rmsnorm(Tensor input, Tensor weight, float eps=9.9999999999999995e-07)"
        " -> Tensor"
    )


def test_a_second_declaration_with_another_schema_is_refused():
    with pytest.raises(ValueError, match=r"rmsnorm.*declared as rmsnorm\(Tensor input.*again"):
        torch_op("rmsnorm", "(Tensor x, Tensor weight) -> Tensor", fake=torch.empty_like)


def test_mutated_arguments_are_in_the_schemas():
    def mutated(op):
        return [a.name for a in op._schema.arguments if a.alias_info and a.alias_info.is_write]

    assert mutated(OPS.fused_add_rmsnorm.default) == ["input", "residual"]
    assert mutated(OPS.apply_rope_with_cos_sin_cache_inplace.default) == ["query", "key"]
    assert mutated(OPS.store_cache.default) == ["k_cache", "v_cache"]
    assert mutated(OPS.create_kv_indices.default) == ["kv_indices"]
    assert mutated(OPS.rmsnorm.default) == []
    for name in ("rmsnorm", "silu_and_mul", "softmax", "add_constant", "rms_norm_gated"):
        assert mutated(getattr(OPS, name).out) == ["out"], name
    assert mutated(OPS.softmax_backward.out) == ["grad_input"]


# --------------------------------------------------------------------------- opcheck (CPU)
def _cpu_cases():
    x, w = torch.randn(3, 40), torch.randn(40)
    strided = torch.randn(40, 6).t()  # rows of 40 floats 1 apart, 6 of them: last dim strided
    return [
        ("rmsnorm", (x, w, 1e-5), {}),
        ("rmsnorm", (x, w), {"out": torch.empty_like(x)}),
        ("fused_add_rmsnorm", (x.clone(), torch.randn(3, 40), w, 1e-6), {}),
        ("silu_and_mul", (x,), {}),
        ("silu_and_mul", (x,), {"out": torch.empty(3, 20)}),
        ("softmax", (x,), {}),
        ("softmax", (x, 0, 0.5), {}),
        ("softmax", (strided, 1), {}),
        ("softmax", (x, -1, 2.0), {"out": torch.empty_like(x)}),
        ("add_constant", (x, 4), {}),
        ("add_constant", (x, 16), {"out": torch.empty_like(x)}),
        ("add_constant_runtime", (x, 0.25), {}),
        ("add_constant_runtime", (x, -3.0), {"out": torch.empty_like(x)}),
    ]


@pytest.mark.parametrize(
    ("name", "args", "kwargs"),
    _cpu_cases(),
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_opcheck_cpu(name, args, kwargs):
    op = getattr(OPS, name)
    overload = op.out if "out" in kwargs else op.default
    torch.library.opcheck(overload, args, kwargs)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_fake_softmax_has_the_eager_layout(dim):
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(6, 5).t()
    eager = cpu.softmax(x, dim)
    with FakeTensorMode() as mode:
        fake = OPS.softmax(mode.from_tensor(x), dim)
    assert (fake.shape, fake.stride(), fake.dtype) == (eager.shape, eager.stride(), eager.dtype)


def _handed_to_the_dispatcher(monkeypatch, *eager_functions) -> list[str]:
    """The names of the ops whose eager function (of ``eager_functions``) hands a call to
    its registered op (the generated function's ``_op``) from now on."""
    calls: list[str] = []
    for function in eager_functions:
        namespace = function.__globals__  # the generated function's own module
        registered = namespace["_op"]

        def spy(*args, _registered=registered, **kwargs):
            calls.append(_registered.name)
            return _registered(*args, **kwargs)

        monkeypatch.setitem(namespace, "_op", spy)
    return calls


def test_eager_calls_do_not_go_through_the_dispatcher(monkeypatch):
    ops = (cpu.rmsnorm, cpu.softmax, cpu.silu_and_mul, cpu.add_constant)
    handed = _handed_to_the_dispatcher(monkeypatch, *ops)
    x, w = torch.randn(2, 8), torch.randn(8)
    cpu.rmsnorm(x, w)
    cpu.softmax(x, temperature=0.5)
    cpu.silu_and_mul(x)
    cpu.add_constant(x, 2)
    assert handed == []


# --------------------------------------------------------------------------- torch.compile
def _decoder_layer(ops, x, residual, w_norm, w_up, w_down, out):
    ops.fused_add_rmsnorm(x, residual, w_norm)
    h = ops.rmsnorm(x, w_norm, 1e-5)
    act = ops.silu_and_mul(h @ w_up.t())
    y = torch.tanh(act @ w_down.t()) * 2.0
    scores = ops.softmax(y, dim=-1, temperature=0.7)
    ops.softmax(y, 0, out=out)
    return ops.add_constant(scores, 1) - 1, residual * 1.0


def _layer_inputs():
    torch.manual_seed(0)
    hidden, inter = 64, 96
    return (
        torch.randn(5, hidden),
        torch.randn(5, hidden),
        torch.randn(hidden),
        torch.randn(2 * inter, hidden) / 8,
        torch.randn(hidden, inter) / 8,
        torch.empty(5, hidden),
    )


def _clone(values):
    return [v.clone() for v in values]


def test_compile_fullgraph_traces_a_decoder_layer_without_graph_breaks():
    import torch._dynamo

    inputs = _layer_inputs()
    graphs = []

    def count_graphs(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    eager_inputs, compiled_inputs = _clone(inputs), _clone(inputs)
    expected = _decoder_layer(cpu, *eager_inputs)
    compiled = torch.compile(
        lambda *a: _decoder_layer(cpu, *a), fullgraph=True, backend=count_graphs
    )
    got = compiled(*compiled_inputs)
    assert len(graphs) == 1
    targets = {str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"}
    assert {
        "mllm_kernel.fused_add_rmsnorm.default",
        "mllm_kernel.rmsnorm.default",
        "mllm_kernel.silu_and_mul.default",
        "mllm_kernel.softmax.default",
        "mllm_kernel.softmax.out",
        "mllm_kernel.add_constant.default",
    } <= targets, targets
    explanation = torch._dynamo.explain(lambda *a: _decoder_layer(cpu, *a))(*_clone(inputs))
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    for a, b in zip((*got, *compiled_inputs), (*expected, *eager_inputs), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_compile_through_aot_autograd_functionalizes_and_matches_eager():
    # aot_eager: the mutations (fused_add_rmsnorm, the out= buffer) go through
    # functionalization as under inductor, without inductor's minutes of C++ builds on CI
    # (the CUDA test below compiles with inductor).
    import torch._dynamo

    torch._dynamo.reset()
    inputs = _layer_inputs()
    eager_inputs, compiled_inputs = _clone(inputs), _clone(inputs)
    expected = _decoder_layer(cpu, *eager_inputs)
    compiled = torch.compile(
        lambda *a: _decoder_layer(cpu, *a), fullgraph=True, backend="aot_eager"
    )
    got = compiled(*compiled_inputs)
    for a, b in zip((*got, *compiled_inputs), (*expected, *eager_inputs), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _strided_out_calls():
    """(name, fn(buf) -> buf): an op writing a non-contiguous view of ``buf`` [4, 64]
    through out= (which Dynamo cannot trace: a graph break, the op run eagerly)."""
    torch.manual_seed(1)
    x, w, gate = torch.randn(4, 32), torch.randn(32), torch.randn(4, 64)
    return [
        ("add_constant", lambda buf: cpu.add_constant(x, 4, out=buf[:, ::2])),
        ("add_constant_runtime", lambda buf: cpu.add_constant_runtime(x, 0.5, out=buf[:, 32:])),
        ("rmsnorm", lambda buf: cpu.rmsnorm(x, w, 1e-6, out=buf[:, 32:])),
        ("silu_and_mul", lambda buf: cpu.silu_and_mul(gate, out=buf[:, 32:])),
        ("softmax", lambda buf: cpu.softmax(x.t(), 0, out=buf[:, :32].t())),
    ]


@pytest.mark.parametrize(
    ("name", "call"), _strided_out_calls(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_compile_with_a_strided_out_buffer_runs_it_eagerly_and_matches(name, call):
    """Not fullgraph: the out= call breaks the graph and runs eagerly. Its registered
    kernel must not be traced again (it routed back to the op under tracing, which broke
    the graph again: RecursionError)."""
    import torch._dynamo

    torch._dynamo.reset()

    def written(buf):
        call(buf)
        return buf * 1.0

    expected = written(torch.zeros(4, 64))
    got = torch.compile(written, backend="eager")(torch.zeros(4, 64))
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert expected.count_nonzero() > 0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda t: cpu.add_constant_runtime(t, True), "'constant': expected a number but got bool"),
        (lambda t: cpu.add_constant(t, True), "'constant': expected an int but got bool"),
        (lambda t: cpu.softmax(t, True), "'dim': expected an int but got bool"),
        (lambda t: cpu.rmsnorm(t, torch.ones(2), True), "'eps': expected a number but got bool"),
    ],
    ids=["add_constant_runtime", "add_constant", "softmax", "rmsnorm"],
)
def test_a_bool_for_a_number_is_refused_when_traced_as_when_eager(call, message):
    """torch's schema would take True as 1 / 1.0: the traced call refuses it as the eager
    one does (make_fx, and torch.compile, which runs the refused call eagerly)."""
    import torch._dynamo
    from torch.fx.experimental.proxy_tensor import make_fx

    torch._dynamo.reset()
    with pytest.raises(TypeError, match=message):
        call(torch.zeros(2, 2))
    with pytest.raises(TypeError, match=message):
        make_fx(call)(torch.zeros(2, 2))
    with pytest.raises(TypeError, match=message):
        torch.compile(call, backend="eager")(torch.zeros(2, 2))


# --------------------------------------------------------------------------- DLPack inputs
def test_cpu_ops_take_numpy_arrays_and_return_torch_tensors():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 16), dtype=np.float32)
    w = rng.standard_normal(16, dtype=np.float32)
    tx, tw = torch.from_numpy(x.copy()), torch.from_numpy(w.copy())
    got = cpu.rmsnorm(x, w)
    assert type(got) is torch.Tensor
    torch.testing.assert_close(got, cpu.rmsnorm(tx, tw), rtol=0, atol=0)
    torch.testing.assert_close(cpu.softmax(x, 0), torch.softmax(tx, 0))
    torch.testing.assert_close(cpu.silu_and_mul(x), cpu.silu_and_mul(tx), rtol=0, atol=0)
    torch.testing.assert_close(cpu.add_constant(x, 8), tx + 8)
    out = np.full((3, 16), np.nan, dtype=np.float32)
    assert cpu.add_constant_runtime(x, 0.5, out=out).data_ptr() == out.ctypes.data
    np.testing.assert_allclose(out, x + 0.5)  # written through into the caller's array
    residual = rng.standard_normal((3, 16), dtype=np.float32)
    expected_x, expected_residual = tx.clone(), torch.from_numpy(residual.copy())
    cpu.fused_add_rmsnorm(expected_x, expected_residual, tw)
    cpu.fused_add_rmsnorm(x, residual, w)  # in place, on numpy memory
    np.testing.assert_array_equal(residual, expected_residual.numpy())
    np.testing.assert_array_equal(x, expected_x.numpy())


def test_a_read_only_numpy_array_is_read_but_not_written():
    x = np.ones((2, 4), dtype=np.float32)
    x.flags.writeable = False
    torch.testing.assert_close(cpu.add_constant(x, 2), torch.full((2, 4), 3.0))
    with pytest.raises(ValueError, match=r"^argument 'out': a read-only ndarray cannot be"):
        cpu.add_constant(torch.ones(2, 4), 2, out=x)
    with pytest.raises(TypeError, match=r"^argument 'src': ndarray cannot be shared with torch"):
        cpu.add_constant(np.array(["a", "b"]), 2)


# --------------------------------------------------------------------------- namespace
def test_top_level_namespace_is_the_public_api():
    script = (
        "import mllm_kernel, mllm_kernel.cpu.jit, mllm_kernel.cuda.jit, mllm_kernel.jit_utils\n"
        "print(sorted(dir(mllm_kernel)))\n"
        "print(sorted(n for n in vars(mllm_kernel) if not n.startswith('_')))\n"
    )
    lines = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    ).stdout.splitlines()
    public = ["__version__", "cpu", "cuda", "jit", "jit_utils"]
    assert lines[0] == str(public)
    imported = set(eval(lines[1]))
    # logging_setup moves into jit_utils (issue 17, point 4); until then the package
    # itself imports it, and only it.
    allowed = {"cpu", "cuda", "jit_utils", "ops"} | (
        {"logging_setup"} if (REPO / "mllm_kernel" / "logging_setup.py").exists() else set()
    )
    assert imported <= allowed, imported - allowed


# --------------------------------------------------------------------------- on a GPU
def _cuda_layer(x, weight, w_up, positions, cos_sin, k_cache, v_cache, slots):
    tokens, heads, head_size = x.shape[0], 4, 32
    h = cuda.rmsnorm(x, weight)
    act = cuda.silu_and_mul(h @ w_up.t())
    q, k = act.clone(), act * 0.5
    cuda.apply_rope_with_cos_sin_cache_inplace(positions, q, k, head_size, cos_sin, True)
    cuda.store_cache(k, act + 1, k_cache, v_cache, slots)
    scores = (q.view(tokens, heads, head_size) * 0.1).sum(-1)
    return cuda.softmax(scores, dim=-1, temperature=0.9), q


def _cuda_layer_inputs():
    torch.manual_seed(0)
    dev, hidden = "cuda", 128
    return [
        torch.randn(6, hidden, device=dev),
        torch.randn(hidden, device=dev),
        torch.randn(2 * hidden, hidden, device=dev) / 8,
        torch.tensor([0, 3, 7, 1, 2, 9], device=dev),
        torch.randn(16, 32, device=dev),
        torch.zeros(10, hidden, device=dev),
        torch.zeros(10, hidden, device=dev),
        torch.tensor([4, 0, 9, -1, 2, 5], device=dev),
    ]


@pytest.mark.cuda
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_cuda_decoder_layer_compiles_fullgraph_and_matches_eager(mode):
    import torch._dynamo

    torch._dynamo.reset()
    inputs = _cuda_layer_inputs()
    eager_inputs = [t.clone() for t in inputs]
    expected = _cuda_layer(*eager_inputs)
    compiled = torch.compile(_cuda_layer, fullgraph=True, mode=mode)
    for _ in range(3):  # CUDA graphs record on a later call: run past it
        compiled_inputs = [t.clone() for t in inputs]
        got = compiled(*compiled_inputs)
        torch.cuda.synchronize()
        for a, b in zip((*got, *compiled_inputs), (*expected, *eager_inputs), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    explanation = torch._dynamo.explain(_cuda_layer)(*[t.clone() for t in inputs])
    assert explanation.graph_break_count == 0


@pytest.mark.cuda
def test_opcheck_cuda():
    dev = "cuda"
    x, w = torch.randn(3, 64, device=dev), torch.randn(64, device=dev)
    cases = [
        (OPS.rmsnorm.default, (x, w), {}),
        (OPS.rmsnorm.out, (x, w), {"out": torch.empty_like(x)}),
        (OPS.fused_add_rmsnorm.default, (x.clone(), torch.randn_like(x), w), {}),
        (OPS.rms_norm_gated.default, (x, w, torch.randn_like(x)), {}),
        (OPS.silu_and_mul.default, (x,), {}),
        (OPS.gelu_and_mul.out, (x,), {"out": torch.empty(3, 32, device=dev)}),
        (OPS.gelu_tanh_and_mul.default, (x,), {}),
        (OPS.softmax.default, (x, 0, 0.5), {}),
        (OPS.softmax_backward.default, (torch.randn_like(x), torch.softmax(x, -1)), {}),
        (OPS.add_constant.default, (x, 2), {}),
        (OPS.add_constant_runtime.out, (x, 1.5), {"out": torch.empty_like(x)}),
        (
            OPS.apply_rope_with_cos_sin_cache_inplace.default,
            (torch.arange(3, device=dev), x.clone(), x.clone(), 64, torch.randn(8, 64, device=dev)),
            {},
        ),
        (
            OPS.store_cache.default,
            (x, x, torch.zeros(5, 64, device=dev), torch.zeros(5, 64, device=dev)),
            {},
        ),
    ]
    slots = torch.tensor([4, 1, 0], device=dev)
    cases[-1] = (cases[-1][0], (*cases[-1][1], slots), {})
    for op, args, kwargs in cases:
        torch.library.opcheck(op, args, kwargs)


@pytest.mark.cuda
def test_cuda_ops_take_cupy_arrays():
    cp = pytest.importorskip("cupy")
    x = cp.random.standard_normal((4, 64), dtype=cp.float32)
    w = cp.random.standard_normal(64, dtype=cp.float32)
    got = cuda.rmsnorm(x, w)
    assert type(got) is torch.Tensor and got.is_cuda
    tx, tw = torch.from_dlpack(x).double(), torch.from_dlpack(w).double()
    expected = tx * torch.rsqrt(tx.pow(2).mean(-1, keepdim=True) + 1e-6) * tw
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    out = cp.full((4, 32), cp.nan, dtype=cp.float32)
    cuda.silu_and_mul(x, out=out)
    torch.testing.assert_close(
        torch.from_dlpack(out), torch.nn.functional.silu(tx[:, :32]).float() * tx[:, 32:].float()
    )


# --------------------------------------------------------------------------- autograd
@pytest.mark.parametrize(("dim", "temperature"), [(-1, None), (0, 0.5), (1, 2.0)])
def test_softmax_backward_matches_float64_autograd(dim, temperature):
    torch.manual_seed(0)
    x = torch.randn(5, 7, 3, requires_grad=True)
    weights = torch.randn(5, 7, 3)
    (cpu.softmax(x, dim, temperature) * weights).sum().backward()
    x64 = x.detach().double().requires_grad_()
    t = 1.0 if temperature is None else temperature
    (torch.softmax(x64 / t, dim) * weights.double()).sum().backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-6)


def test_softmax_passes_gradcheck():
    # The kernel computes in float32; gradcheck's finite differences use that precision.
    x = torch.randn(3, 6, dtype=torch.float32, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda t: cpu.softmax(t, 1, 0.8), (x,), eps=1e-2, atol=2e-3, rtol=2e-2
    )


def test_softmax_under_no_grad_takes_the_direct_path():
    x = torch.randn(2, 4, requires_grad=True)
    with torch.no_grad():
        assert cpu.softmax(x).grad_fn is None


@pytest.mark.parametrize(
    "call",
    [
        lambda x: OPS.add_constant(x, 2),
        lambda x: OPS.rmsnorm_backward(x, x.detach(), torch.ones(8)),
        lambda x: OPS.silu_and_mul_backward(x[:, :4], x.detach()),
    ],
    ids=["add_constant", "rmsnorm_backward", "silu_and_mul_backward"],
)
def test_ops_without_a_backward_refuse_a_required_grad(call):
    x = torch.randn(2, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"has no backward: call it on tensors that do not"):
        call(x)
    with torch.no_grad():
        assert call(x) is not None  # inference keeps working with Parameters


def test_out_buffers_refuse_a_required_grad_as_torch_does():
    x = torch.randn(2, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"softmax\(\.\.\., out=\.\.\.\) does not support autom"):
        cpu.softmax(x, out=torch.empty(2, 8))


@pytest.mark.cuda
@pytest.mark.parametrize("dim", [-1, 0])
def test_cuda_softmax_backward_matches_float64_autograd(dim):
    torch.manual_seed(0)
    x = torch.randn(6, 300, device="cuda", requires_grad=True)
    weights = torch.randn(6, 300, device="cuda")
    (cuda.softmax(x, dim, 0.6) * weights).sum().backward()
    x64 = x.detach().double().requires_grad_()
    (torch.softmax(x64 / 0.6, dim) * weights.double()).sum().backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-4, atol=1e-6)


# --------------------------------------------------------------------------- GEMM family
QUANT_SCHEMAS = {
    "gemm": "(Tensor a, Tensor b, Tensor? bias=None, ScalarType? out_dtype=None) -> Tensor",
    "gemm.out": "(Tensor a, Tensor b, Tensor? bias=None, ScalarType? out_dtype=None, *, "
    "Tensor(a!) out) -> ()",
    "gptq_marlin_gemm": "(Tensor a, Tensor b_q_weight, Tensor b_scales, Tensor? global_scale, "
    "Tensor? b_zeros, Tensor? g_idx, Tensor? perm, Tensor(b!) workspace, int b_q_type_id, "
    "SymInt size_m, SymInt size_n, SymInt size_k, bool is_k_full=True, "
    "bool use_atomic_add=False, bool use_fp32_reduce=False, bool is_zp_float=False) -> Tensor",
    "gptq_marlin_repack": "(Tensor b_q_weight, Tensor? perm, SymInt size_k, SymInt size_n, "
    "int num_bits) -> Tensor",
    "awq_marlin_repack": "(Tensor b_q_weight, SymInt size_k, SymInt size_n, int num_bits) "
    "-> Tensor",
    "int8_scaled_mm": "(Tensor mat_a, Tensor mat_b, Tensor scales_a, Tensor scales_b, "
    "ScalarType out_dtype, Tensor? bias=None) -> Tensor",
    # 6: torch.float32's ScalarType number, as torch prints the default
    "per_token_quant_int8": "(Tensor x, ScalarType scale_dtype=6) -> (Tensor, Tensor)",
}


@pytest.mark.parametrize("name", sorted(QUANT_SCHEMAS))
def test_gemm_family_schemas(name):
    op_name, _, overload = name.partition(".")
    op = getattr(getattr(OPS, op_name), overload or "default")
    assert str(op._schema) == f"mllm_kernel::{name}{QUANT_SCHEMAS[name]}"


def test_gemm_family_mutations_and_out_overloads():
    def mutated(op):
        return [a.name for a in op._schema.arguments if a.alias_info and a.alias_info.is_write]

    assert mutated(OPS.gptq_marlin_gemm.default) == ["workspace"]
    assert mutated(OPS.gptq_marlin_gemm.out) == ["workspace", "c"]
    assert mutated(OPS.gemm.out) == ["out"]
    for name in ("gemm", "gptq_marlin_repack", "awq_marlin_repack", "int8_scaled_mm"):
        assert mutated(getattr(OPS, name).default) == [], name
    assert mutated(OPS.per_token_quant_int8.default) == []
    for name in ("gptq_marlin_repack", "awq_marlin_repack", "int8_scaled_mm"):
        assert getattr(OPS, name).overloads() == ["default"], name


def _layout(t):
    return tuple(t.shape), t.stride(), t.dtype, t.device.type


M_Q, N_Q, K_Q = 5, 128, 256  # a GEMM-family problem: M tokens, N outputs, K inputs


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


def _marlin_meta_args(m=M_Q, dtype=torch.bfloat16):
    """gptq_marlin_gemm's arguments (uint4b8, 2 groups, no act-order) on meta tensors,
    without its c."""
    from mllm_kernel.cuda.jit.scalar_type import scalar_types

    return (
        _meta(m, K_Q, dtype=dtype),
        _meta(K_Q // 16, N_Q * 16 * 4 // 32, dtype=torch.int32),
        _meta(2, N_Q, dtype=dtype),
        None,
        None,
        None,
        None,
        _meta(132, dtype=torch.int32),
        scalar_types.uint4b8.id,
        m,
        N_Q,
        K_Q,
    )


def test_fake_gemm_is_a_new_m_by_n_tensor_in_the_output_dtype():
    a, b = _meta(M_Q, K_Q), _meta(N_Q, K_Q)
    assert _layout(OPS.gemm(a, b)) == ((M_Q, N_Q), (N_Q, 1), torch.bfloat16, "meta")
    bias = _meta(N_Q, dtype=torch.float32)
    got = OPS.gemm(a, b, bias, torch.float32)
    assert _layout(got) == ((M_Q, N_Q), (N_Q, 1), torch.float32, "meta")
    # a strided a (rows of a larger buffer) still gives a contiguous result
    wide = _meta(M_Q, 2 * K_Q)[:, :K_Q]
    assert _layout(OPS.gemm(wide, b, out_dtype=torch.bfloat16))[:2] == ((M_Q, N_Q), (N_Q, 1))
    assert OPS.gemm.out(a, b, out=_meta(M_Q, N_Q)) is None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fake_gptq_marlin_gemm_is_size_m_by_size_n_in_a_dtype(dtype):
    got = OPS.gptq_marlin_gemm(*_marlin_meta_args(dtype=dtype))
    assert _layout(got) == ((M_Q, N_Q), (N_Q, 1), dtype, "meta")
    c = _meta(M_Q, N_Q, dtype=dtype)
    assert OPS.gptq_marlin_gemm.out(*_marlin_meta_args(dtype=dtype), c=c) is None


@pytest.mark.parametrize("bits", [4, 8])
def test_fake_repacks_are_the_marlin_layout(bits):
    pack = 32 // bits
    expected = ((K_Q // 16, N_Q * 16 // pack), (N_Q * 16 // pack, 1), torch.int32, "meta")
    gptq = _meta(K_Q // pack, N_Q, dtype=torch.int32)
    assert _layout(OPS.gptq_marlin_repack(gptq, None, K_Q, N_Q, bits)) == expected
    perm = _meta(K_Q, dtype=torch.int32)
    assert _layout(OPS.gptq_marlin_repack(gptq, perm, K_Q, N_Q, bits)) == expected
    awq = _meta(K_Q, N_Q // pack, dtype=torch.int32)
    assert _layout(OPS.awq_marlin_repack(awq, K_Q, N_Q, bits)) == expected


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_fake_int8_scaled_mm_is_m_by_n_in_out_dtype(out_dtype):
    mat_a = _meta(M_Q, K_Q, dtype=torch.int8)
    mat_b = _meta(N_Q, K_Q, dtype=torch.int8).t()  # [K, N] column-major
    scales_a, scales_b = _meta(M_Q, 1, dtype=torch.float32), _meta(N_Q, dtype=torch.float32)
    got = OPS.int8_scaled_mm(mat_a, mat_b, scales_a, scales_b, out_dtype)
    assert _layout(got) == ((M_Q, N_Q), (N_Q, 1), out_dtype, "meta")
    bias = _meta(N_Q, dtype=out_dtype)
    assert _layout(OPS.int8_scaled_mm(mat_a, mat_b, scales_a, scales_b, out_dtype, bias))[:2] == (
        (M_Q, N_Q),
        (N_Q, 1),
    )


def test_fake_per_token_quant_int8_is_int8_values_and_one_scale_per_row():
    x = _meta(2, 3, K_Q)
    x_q, scales = OPS.per_token_quant_int8(x)
    assert _layout(x_q) == ((2, 3, K_Q), (3 * K_Q, K_Q, 1), torch.int8, "meta")
    assert _layout(scales) == ((2, 3, 1), (3, 1, 1), torch.float32, "meta")
    rows = _meta(4, 2 * K_Q, dtype=torch.float16)[:, :K_Q]  # a row stride of 2K: not kept
    x_q, scales = OPS.per_token_quant_int8(rows, torch.float32)
    assert _layout(x_q) == ((4, K_Q), (K_Q, 1), torch.int8, "meta")
    assert _layout(scales) == ((4, 1), (1, 1), torch.float32, "meta")


def _quant_pipeline(x, w_q, w_scale, b_q, b_scales, workspace, w_out, c):
    """per-token int8 -> W8A8 GEMM -> 4-bit Marlin GEMM (into c, and into a new
    tensor) -> dense GEMM: every GEMM-family op of the package, as a model calls them."""
    from mllm_kernel.cuda.jit.scalar_type import scalar_types

    x_q, x_scale = cuda.per_token_quant_int8(x)
    h = cuda.int8_scaled_mm(x_q, w_q.t(), x_scale, w_scale, torch.bfloat16)
    marlin_args = (b_q, b_scales, None, None, None, None, workspace, scalar_types.uint4b8.id)
    sizes = (h.shape[0], b_scales.shape[1], h.shape[1])
    into_c = cuda.gptq_marlin_gemm(h, c, *marlin_args, *sizes)
    fresh = cuda.gptq_marlin_gemm(h, None, *marlin_args, *sizes, use_fp32_reduce=True)
    return cuda.gemm(into_c + fresh, w_out, out_dtype=torch.float32), into_c


def _quant_pipeline_inputs(device, m=M_Q):
    """Random inputs of _quant_pipeline: x [m, 64] -> [m, K_Q] -> [m, N_Q] -> [m, 64]."""
    torch.manual_seed(0)
    hidden = 64
    return [
        torch.randn(m, hidden, dtype=torch.bfloat16, device=device),
        torch.randint(-127, 128, (K_Q, hidden), dtype=torch.int8, device=device),
        torch.rand(K_Q, device=device) / 100 + 1e-3,
        torch.randint(-(2**31), 2**31 - 1, (K_Q // 16, N_Q * 2), dtype=torch.int32, device=device),
        (torch.rand(2, N_Q, device=device) / 50).to(torch.bfloat16),
        # one zeroed entry per SM (on the meta device: an H100's 132)
        cuda.marlin_make_workspace(device)
        if device == "cuda"
        else torch.zeros(132, dtype=torch.int32, device=device),
        torch.randn(hidden, N_Q, dtype=torch.bfloat16, device=device) / 8,
        torch.full((m, N_Q), float("nan"), dtype=torch.bfloat16, device=device),
    ]


def test_compile_fullgraph_traces_the_gemm_family_on_meta_tensors():
    # No GPU: Dynamo traces the CUDA ops' Python functions (their _tracing() branch puts
    # the registered ops in the graph), and the graph runs on the fake implementations.
    import torch._dynamo

    graphs = []

    def count_graphs(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    inputs = [t.to("meta") for t in _quant_pipeline_inputs("cpu")]
    out, into_c = torch.compile(_quant_pipeline, fullgraph=True, backend=count_graphs)(*inputs)
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    mine = [t for t in targets if t.startswith("mllm_kernel.")]
    assert mine == [
        "mllm_kernel.per_token_quant_int8.default",
        "mllm_kernel.int8_scaled_mm.default",
        "mllm_kernel.gptq_marlin_gemm.out",
        "mllm_kernel.gptq_marlin_gemm.default",
        "mllm_kernel.gemm.default",
    ], targets
    assert _layout(out) == ((M_Q, 64), (64, 1), torch.float32, "meta")
    assert into_c is inputs[-1]


def test_gemm_family_eager_calls_do_not_go_through_the_dispatcher(monkeypatch):
    # On a CPU tensor every op refuses the device in its Python function: before the
    # registered op would be called.
    calls = (cuda.per_token_quant_int8, cuda.gemm, cuda.awq_marlin_repack)
    handed = _handed_to_the_dispatcher(monkeypatch, *calls)
    inputs = _quant_pipeline_inputs("cpu")
    for call in (
        lambda: cuda.per_token_quant_int8(inputs[0]),
        lambda: cuda.gemm(inputs[0], inputs[0]),
        lambda: cuda.awq_marlin_repack(torch.zeros(256, 16, dtype=torch.int32), 256, 128, 4),
    ):
        with pytest.raises(ValueError, match=r"^argument '\w+': expected a tensor on cuda but"):
            call()
    assert handed == []


@pytest.mark.cuda
def test_opcheck_cuda_gemm_family():
    from mllm_kernel.cuda.jit import marlin_make_workspace
    from mllm_kernel.cuda.jit.scalar_type import scalar_types

    dev = "cuda"
    torch.manual_seed(0)
    a16, b16 = torch.randn(5, 64, device=dev).bfloat16(), torch.randn(96, 64, device=dev).bfloat16()
    mat_a = torch.randint(-127, 128, (5, 64), dtype=torch.int8, device=dev)
    w8 = torch.randint(-127, 128, (96, 64), dtype=torch.int8, device=dev)
    scales_a, scales_b = torch.rand(5, 1, device=dev), torch.rand(96, device=dev)
    words = torch.randint(-(2**31), 2**31 - 1, (K_Q // 8, N_Q), dtype=torch.int32, device=dev)
    a_marlin = torch.randn(3, K_Q, device=dev).half()
    marlin = (
        torch.randint(-(2**31), 2**31 - 1, (K_Q // 16, N_Q * 2), dtype=torch.int32, device=dev),
        (torch.rand(2, N_Q, device=dev) / 50).half(),
        None,
        None,
        None,
        None,
        marlin_make_workspace(dev),
        scalar_types.uint4b8.id,
        3,
        N_Q,
        K_Q,
    )
    cases = [
        (OPS.gemm.default, (a16, b16), {}),
        (OPS.gemm.default, (a16, b16, torch.randn(96, device=dev), torch.float32), {}),
        (OPS.gemm.out, (a16, b16), {"out": torch.empty(5, 96, dtype=torch.bfloat16, device=dev)}),
        (OPS.int8_scaled_mm.default, (mat_a, w8.t(), scales_a, scales_b, torch.bfloat16), {}),
        (
            OPS.int8_scaled_mm.default,
            (mat_a, w8.t(), scales_a, scales_b, torch.float16, torch.randn(96, device=dev).half()),
            {},
        ),
        (OPS.per_token_quant_int8.default, (a16,), {}),
        (OPS.per_token_quant_int8.default, (torch.randn(2, 3, 64, device=dev),), {}),
        (OPS.gptq_marlin_repack.default, (words, None, K_Q, N_Q, 4), {}),
        (OPS.gptq_marlin_repack.default, (torch.cat([words, words]), None, K_Q, N_Q, 8), {}),
        (OPS.awq_marlin_repack.default, (words.view(K_Q, N_Q // 8), K_Q, N_Q, 4), {}),
        (OPS.gptq_marlin_gemm.default, (a_marlin, *marlin), {}),
        (
            OPS.gptq_marlin_gemm.out,
            (a_marlin, *marlin),
            {"c": torch.empty(3, N_Q, dtype=torch.float16, device=dev)},
        ),
    ]
    for op, args, kwargs in cases:
        torch.library.opcheck(op, args, kwargs)


@pytest.mark.cuda
def test_cuda_gemm_family_compiles_fullgraph_and_matches_eager():
    import torch._dynamo

    torch._dynamo.reset()
    inputs = _quant_pipeline_inputs("cuda")
    eager_inputs, compiled_inputs = _clone(inputs), _clone(inputs)
    expected = _quant_pipeline(*eager_inputs)
    got = torch.compile(_quant_pipeline, fullgraph=True)(*compiled_inputs)
    torch.cuda.synchronize()
    assert got[1] is compiled_inputs[-1]  # c= is written and returned
    for a, b in zip((*got, *compiled_inputs), (*expected, *eager_inputs), strict=True):
        torch.testing.assert_close(a, b)  # c started as NaN: written everywhere
    assert not compiled_inputs[5].any()  # the workspace is left zeroed
    explanation = torch._dynamo.explain(_quant_pipeline)(*_clone(inputs))
    assert explanation.graph_break_count == 0


def test_other_tracers_and_transforms_see_the_op():
    """make_fx (and so non-strict torch.export), torch.jit.trace and vmap see only what
    reaches the dispatcher: the eager fast path hands the call to the registered op
    under them, where make_fx recorded an empty_like and returned uninitialised memory
    and vmap failed on a batched tensor's data pointer."""
    from torch.fx.experimental.proxy_tensor import make_fx

    import mllm_kernel.cpu.jit as cpu

    x = torch.randn(3, 8)
    want = torch.softmax(x, -1)
    graph = make_fx(lambda t: cpu.softmax(t))(x)
    called = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    assert called == [torch.ops.mllm_kernel.softmax.default]
    torch.testing.assert_close(graph(x), want)
    traced = torch.jit.trace(lambda t: cpu.softmax(t), (x,))
    assert "mllm_kernel::softmax" in str(traced.graph)
    torch.testing.assert_close(traced(x * 2), torch.softmax(x * 2, -1))
    torch.testing.assert_close(torch.func.vmap(cpu.softmax)(x), want)
