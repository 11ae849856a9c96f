"""What every op does with inputs it cannot take (issue 19 points 3, 4, 6; issue 20):
the error type and the argument it names, for each CPU op, and for each CUDA op the
checks that run before a GPU is needed."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from mllm_kernel.cpu import jit as cpu
from mllm_kernel.jit_utils import op_inputs

warnings.filterwarnings("ignore", message=".*(quantize|nested).*", category=UserWarning)


def negative_view(shape, dtype=torch.float32) -> torch.Tensor:
    """A real tensor with the negative bit set: DLPack exports its raw values."""
    raw = torch.randn(shape, dtype=torch.float64)
    view = torch.complex(torch.zeros_like(raw), raw).conj().imag.to(dtype)
    if not view.is_neg():  # .to() of the same dtype keeps the bit; another dtype resolves it
        view = torch.complex(torch.zeros(shape), raw.float()).conj().imag
    assert view.is_neg()
    return view


# --------------------------------------------------------------------------- helper
@pytest.mark.parametrize(
    ("value", "expected"), [(1e-6, 1e-6), (2, 2.0), (np.float32(0.5), 0.5), (np.int64(3), 3.0)]
)
def test_number_accepts_ints_and_floats(value, expected):
    assert op_inputs.number(value, "eps") == expected
    assert type(op_inputs.number(value, "eps")) is float


@pytest.mark.parametrize("value", ["1e-6", True, None, [1.0], torch.tensor(1.0)])
def test_number_refuses_the_rest(value):
    with pytest.raises(TypeError, match=r"^argument 'eps': expected a number but got"):
        op_inputs.number(value, "eps")


@pytest.mark.parametrize("value", [1.0, True, "2", None])
def test_integer_refuses_non_integers(value):
    with pytest.raises(TypeError, match=r"^argument 'head_size': expected an int"):
        op_inputs.integer(value, "head_size")


@pytest.mark.parametrize(
    ("value", "ndim", "expected"), [(-1, 3, 2), (0, 3, 0), (2, 3, 2), (0, 0, 0)]
)
def test_dim_normalises_like_torch(value, ndim, expected):
    assert op_inputs.dim(value, ndim) == expected


@pytest.mark.parametrize(("value", "ndim"), [(3, 3), (-4, 3), (5, 2), (1, 0)])
def test_dim_out_of_range_is_an_index_error_like_torch(value, ndim):
    with pytest.raises(IndexError) as ours:
        op_inputs.dim(value, ndim)
    with pytest.raises(IndexError):
        torch.zeros((2,) * ndim).softmax(value)
    assert str(ours.value).startswith("argument 'dim': dimension out of range")


def test_tensor_passes_plain_tensors_through_and_resolves_negative_views():
    x = torch.randn(3)
    assert op_inputs.tensor(x, "x") is x
    v = negative_view(3)
    resolved = op_inputs.tensor(v, "x")
    assert not resolved.is_neg()
    torch.testing.assert_close(resolved, v, rtol=0, atol=0)
    parameter = torch.nn.Parameter(torch.randn(2))
    assert op_inputs.tensor(parameter, "w") is parameter


def test_output_refuses_negative_views():
    with pytest.raises(ValueError, match=r"^argument 'out': a negative view"):
        op_inputs.output(negative_view(3), "out")


# --------------------------------------------------------------------------- CPU ops
# Each op as (callable taking tensors by keyword, valid keyword arguments, which are outputs).
def _cpu_ops():
    x = torch.randn(4, 8)
    return {
        "add_constant": (lambda **a: cpu.add_constant(**a, constant=4), {"src": x}),
        "add_constant_runtime": (
            lambda **a: cpu.add_constant_runtime(**a, constant=0.5),
            {"src": x},
        ),
        "rmsnorm": (lambda **a: cpu.rmsnorm(**a), {"input": x, "weight": torch.randn(8)}),
        "fused_add_rmsnorm": (
            lambda **a: cpu.fused_add_rmsnorm(**a),
            {"input": x.clone(), "residual": torch.randn(4, 8), "weight": torch.randn(8)},
        ),
        "silu_and_mul": (lambda **a: cpu.silu_and_mul(**a), {"input": x}),
        "softmax": (lambda **a: cpu.softmax(**a), {"x": x}),
    }


CPU_OPS = _cpu_ops()
CPU_ARGS = [(op, arg) for op, (_, args) in CPU_OPS.items() for arg in args]
BAD_KINDS = {
    "meta": (lambda t: t.to("meta"), r"expected a tensor on cpu but got a meta tensor"),
    "sparse": (lambda t: t.to_sparse(), r"expected a strided \(dense\) tensor.*to_dense"),
    "quantized": (
        lambda t: torch.quantize_per_tensor(t, 0.1, 0, torch.quint8),
        r"quantized tensors are not supported; call \.dequantize\(\)",
    ),
    "nested": (
        lambda t: torch.nested.nested_tensor(list(t)),
        r"nested tensors are not supported",
    ),
}


@pytest.mark.parametrize(("op", "arg"), CPU_ARGS)
def test_cpu_op_refuses_a_non_tensor_naming_it(op, arg):
    fn, args = CPU_OPS[op]
    with pytest.raises(
        TypeError,
        match=rf"^argument '{arg}': expected a torch.Tensor \(or a DLPack tensor.*\) but got",
    ):
        fn(**{**args, arg: [1.0, 2.0]})
    with pytest.raises(
        TypeError,
        match=rf"^argument '{arg}': expected a torch.Tensor \(or a DLPack tensor.*\) but got None",
    ):
        fn(**{**args, arg: None})


@pytest.mark.parametrize("kind", BAD_KINDS)
@pytest.mark.parametrize(("op", "arg"), CPU_ARGS)
def test_cpu_op_refuses_meta_sparse_quantized_nested_naming_it(op, arg, kind):
    fn, args = CPU_OPS[op]
    make, message = BAD_KINDS[kind]
    with pytest.raises(ValueError, match=rf"^argument '{arg}': {message}") as info:
        fn(**{**args, arg: make(args[arg])})
    # torch's account of the same failure (a C++ stack trace) is not chained on.
    assert info.value.__suppress_context__ and info.value.__cause__ is None


@pytest.mark.parametrize(
    ("op", "arg"),
    [(op, next(iter(CPU_OPS[op][1]))) for op in CPU_OPS if op != "fused_add_rmsnorm"]
    + [("rmsnorm", "weight")],
)
def test_cpu_op_reads_negative_views_as_torch_shows_them(op, arg):
    # fused_add_rmsnorm writes its input: see the test after the next.
    fn, args = CPU_OPS[op]
    view = negative_view(args[arg].shape)
    expected = fn(**{**args, arg: view.clone()})
    torch.testing.assert_close(fn(**{**args, arg: view}), expected, rtol=0, atol=0)


def test_add_constant_of_a_negative_view_is_torchs_answer():
    v = torch.tensor([1 + 1j, 2 + 2j, 3 + 3j]).conj().imag
    torch.testing.assert_close(cpu.add_constant(v, 8), torch.tensor([7.0, 6.0, 5.0]))


def test_fused_add_rmsnorm_weight_negative_view_and_outputs_refused():
    x, residual, weight = torch.randn(4, 8), torch.randn(4, 8), negative_view(8)
    expected_x, expected_residual = x.clone(), residual.clone()
    cpu.fused_add_rmsnorm(expected_x, expected_residual, weight.clone())
    cpu.fused_add_rmsnorm(x, residual, weight)
    torch.testing.assert_close(x, expected_x, rtol=0, atol=0)
    for arg in ("input", "residual"):
        args = {
            "input": torch.randn(4, 8),
            "residual": torch.randn(4, 8),
            "weight": torch.randn(8),
        }
        args[arg] = negative_view((4, 8))
        with pytest.raises(ValueError, match=rf"^argument '{arg}': a negative view"):
            cpu.fused_add_rmsnorm(**args)


@pytest.mark.parametrize("op", ["add_constant", "add_constant_runtime", "rmsnorm", "silu_and_mul"])
def test_cpu_op_refuses_a_negative_view_as_out(op):
    fn, args = CPU_OPS[op]
    out = fn(**args)
    with pytest.raises(ValueError, match=r"^argument 'out': a negative view"):
        fn(**args, out=negative_view(out.shape))


@pytest.mark.parametrize(
    "call",
    [
        lambda: cpu.rmsnorm(torch.randn(2, 4), torch.ones(4), eps="1e-6"),
        lambda: cpu.rmsnorm(torch.randn(2, 4), torch.ones(4), eps=True),
        lambda: cpu.fused_add_rmsnorm(torch.randn(2, 4), torch.randn(2, 4), torch.ones(4), None),
        lambda: cpu.add_constant_runtime(torch.randn(3), "1.5"),
        lambda: cpu.add_constant_runtime(torch.randn(3), False),
    ],
    ids=["eps-str", "eps-bool", "fused-eps-none", "constant-str", "constant-bool"],
)
def test_cpu_scalars_must_be_numbers(call):
    with pytest.raises(TypeError, match=r"^argument '(eps|constant)': expected a number but got"):
        call()


def test_softmax_dim_out_of_range_is_an_index_error_naming_dim():
    with pytest.raises(IndexError, match=r"^argument 'dim': dimension out of range.*\[-2, 1\].*5"):
        cpu.softmax(torch.randn(2, 3), dim=5)
    with pytest.raises(TypeError, match=r"^argument 'dim': expected an int but got float"):
        cpu.softmax(torch.randn(2, 3), dim=1.0)
    x = torch.randn(3, 4, 5)
    torch.testing.assert_close(cpu.softmax(x, dim=-3), torch.softmax(x, -3))


@pytest.mark.parametrize("op", ["rmsnorm", "silu_and_mul"])
def test_strided_last_dim_error_says_call_contiguous(op):
    fn, args = CPU_OPS[op]
    strided = torch.randn(8, 4).t()
    with pytest.raises(
        ValueError, match=r"'input'.*stride 1 in the last dim.*call \.contiguous\(\)"
    ):
        fn(**{**args, "input": strided})


# The C++ checks name the Python argument (issue 17 point 6): before, a bad tensor
# passed as rmsnorm(input=...) was reported as argument 'x'.
@pytest.mark.parametrize(
    ("call", "arg"),
    [
        (lambda bad: cpu.rmsnorm(input=bad, weight=torch.randn(8)), "input"),
        (
            lambda bad: cpu.fused_add_rmsnorm(
                input=bad, residual=torch.randn(4, 8), weight=torch.randn(8)
            ),
            "input",
        ),
        (lambda bad: cpu.silu_and_mul(input=bad), "input"),
        (lambda bad: cpu.add_constant(src=bad, constant=4), "src"),
        (lambda bad: cpu.add_constant_runtime(src=bad, constant=0.5), "src"),
        (lambda bad: cpu.softmax(x=bad), "x"),
    ],
    ids=["rmsnorm", "fused_add_rmsnorm", "silu_and_mul", "add_constant", "runtime", "softmax"],
)
def test_cpu_dtype_error_names_the_keyword_the_caller_wrote(call, arg):
    with pytest.raises(TypeError, match=rf"^argument '{arg}': .*uint8"):
        call(torch.zeros(4, 8, dtype=torch.uint8))


# --------------------------------------------------------------------------- overlaps (CPU)
def test_add_constant_refuses_out_overlapping_src():
    x = torch.randn(4, 4)
    with pytest.raises(
        ValueError, match=r"^argument 'out': overlaps argument 'src'.*or 'src' itself"
    ):
        cpu.add_constant(x, 8, out=x.t())
    b = torch.randn(65)
    with pytest.raises(ValueError, match=r"^argument 'out': overlaps argument 'src'"):
        cpu.add_constant(b[:64], 1, out=b[1:])


@pytest.mark.parametrize(
    ("op", "make_out"),
    [
        ("add_constant", lambda out: out[:1].expand_as(out)),
        ("add_constant_runtime", lambda out: out[:, :1].expand_as(out)),
        ("rmsnorm", lambda out: out[:1].expand_as(out)),
        ("silu_and_mul", lambda out: out[:1].expand_as(out)),
    ],
)
def test_cpu_op_refuses_a_zero_stride_out(op, make_out):
    fn, args = CPU_OPS[op]
    out = fn(**args)
    with pytest.raises(ValueError, match=r"^argument 'out': has stride 0 in dim \d .*expanded"):
        fn(**args, out=make_out(torch.empty_like(out)))


def test_fused_add_rmsnorm_refuses_zero_strides_and_overlaps():
    weight = torch.randn(8)
    with pytest.raises(ValueError, match=r"^argument 'residual': has stride 0"):
        cpu.fused_add_rmsnorm(torch.randn(4, 8), torch.randn(1, 8).expand(4, 8), weight)
    with pytest.raises(ValueError, match=r"^argument 'input': has stride 0"):
        cpu.fused_add_rmsnorm(torch.randn(1, 8).expand(4, 8), torch.randn(4, 8), weight)
    buf = torch.randn(4, 8)
    with pytest.raises(
        ValueError, match=r"^argument 'input': is the same memory as argument 'resid"
    ):
        cpu.fused_add_rmsnorm(buf, buf, weight)
    w = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"^argument 'input': overlaps argument 'weight'"):
        cpu.fused_add_rmsnorm(w, torch.randn(4, 8), w[1])


def test_rmsnorm_out_may_be_input_itself_but_not_weight():
    x, weight = torch.randn(4, 8), torch.randn(8)
    expected = cpu.rmsnorm(x, weight)
    assert cpu.rmsnorm(x, weight, out=x) is x
    torch.testing.assert_close(x, expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"^argument 'out': overlaps argument 'weight'"):
        cpu.rmsnorm(torch.randn(1, 8), x[1], out=x[1:2])


def test_silu_and_mul_refuses_out_inside_input():
    x = torch.randn(4, 16)
    with pytest.raises(ValueError, match=r"^argument 'out': overlaps argument 'input'"):
        cpu.silu_and_mul(x, out=x[:, :8])


def test_disjoint_views_of_one_buffer_are_accepted():
    # Column blocks of one row-major buffer (q/k/v of a fused qkv) and interleaved
    # elements share a byte range but no element: they must keep working.
    buf = torch.randn(5, 24)
    x, out = buf[:, :8], buf[:, 8:16]
    expected = x + 4
    cpu.add_constant(x, 4, out=out)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    weight = torch.randn(8)
    expected = cpu.rmsnorm(buf[:, 16:].clone(), weight)
    cpu.rmsnorm(buf[:, 16:], weight, out=buf[:, :8])
    torch.testing.assert_close(buf[:, :8], expected, rtol=0, atol=0)
    pairs = torch.randn(6, 10)
    evens, odds = pairs[:, 0::2], pairs[:, 1::2]
    expected = evens + 2
    cpu.add_constant(evens, 2, out=odds)
    torch.testing.assert_close(odds, expected, rtol=0, atol=0)


def test_overlapping_but_shifted_views_are_refused():
    buf = torch.randn(5, 24)
    with pytest.raises(ValueError, match=r"^argument 'out': overlaps argument 'src'"):
        cpu.add_constant(buf[:, 8:16], 4, out=buf[:, 7:15])
