"""The device-neutral op layer (mllm_kernel.ops.op): one declaration gives the torch op
(schema inferred, fake, autograd, .out overload) and each device's eager function."""

from __future__ import annotations

import inspect
import typing
from typing import Any

import numpy as np
import pytest
import torch

from mllm_kernel.ops.op import Op, like, named


def scale_op(
    x: torch.Tensor, s: float = 2.0, times: int = 1, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``x * s * times``."""


def _save(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.factor = inputs[1] * inputs[2]


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
    return grad * ctx.factor, None, None


SCALE = Op(scale_op, out="out", fake=like("x"), autograd=(_backward, _save))
calls: list[tuple] = []


@SCALE.kernel("cpu")
def scale_op_cpu(x, s, times, out):
    """float32 only here."""
    calls.append((type(x), type(s), type(times), out))
    out = torch.empty_like(x) if out is None else out
    torch.mul(x, s * times, out=out)
    return out


def shift_op(x: torch.Tensor, by: int) -> torch.Tensor:
    """``x + by`` for ``by`` in {1, 2}."""


def _checked_by(value: object) -> int:
    if value not in (1, 2) or isinstance(value, bool):
        raise ValueError(f"by must be 1 or 2, got {value!r}")
    return int(value)


SHIFT = Op(shift_op, fake=like("x"), convert={"by": _checked_by})


@SHIFT.kernel("cpu")
def shift_op_cpu(x, by):
    return x + by


def test_the_schema_is_inferred_from_the_signature():
    schema = str(torch.ops.mllm_kernel.scale_op.default._schema)
    assert schema == "mllm_kernel::scale_op(Tensor x, float s=2., int times=1) -> Tensor"
    out_schema = str(torch.ops.mllm_kernel.scale_op.out._schema)
    assert "Tensor(a!) out" in out_schema
    assert str(torch.ops.mllm_kernel.shift_op.default._schema).endswith(
        "(Tensor x, int by) -> Tensor"
    )


def test_the_eager_function_has_the_declared_signature_and_both_docstrings():
    assert inspect.signature(scale_op_cpu) == inspect.signature(scale_op, eval_str=True)
    assert scale_op_cpu.__name__ == "scale_op"
    assert scale_op_cpu.__doc__ == "``x * s * times``.\n\nOn cpu: float32 only here."


def test_arguments_are_converted_by_their_annotation():
    calls.clear()
    x = np.arange(4, dtype=np.float32)
    result = scale_op_cpu(x, np.float32(0.5), np.int64(3))
    assert torch.equal(result, torch.arange(4.0) * 1.5)
    assert calls == [(torch.Tensor, float, int, None)]  # a DLPack array becomes a tensor
    with pytest.raises(TypeError, match=r"argument 's': expected a number but got str"):
        scale_op_cpu(torch.ones(2), "2")
    with pytest.raises(TypeError, match=r"argument 'times': expected an int but got float"):
        scale_op_cpu(torch.ones(2), 2.0, 1.5)
    with pytest.raises(TypeError, match=r"argument 'x'"):
        scale_op_cpu([1.0, 2.0])
    with pytest.raises(ValueError, match=r"by must be 1 or 2, got 3.0"):
        shift_op_cpu(torch.ones(2), 3.0)
    # An exact int skips an int converter (the hot path): the kernel's variant check
    # (KernelModule(check_variant=...)) refuses what the converter would.
    assert torch.equal(shift_op_cpu(torch.ones(2), 3), torch.full((2,), 4.0))
    with pytest.raises(ValueError, match=r"by must be 1 or 2, got True"):
        shift_op_cpu(torch.ones(2), True)  # not an exact int: the converter runs


def test_out_is_written_and_returned():
    x, out = torch.ones(3), torch.full((3,), float("nan"))
    assert scale_op_cpu(x, 3.0, out=out) is out
    assert torch.equal(out, torch.full((3,), 3.0))


def test_a_grad_goes_through_the_torch_op_and_its_backward():
    x = torch.ones(3, requires_grad=True)
    y = scale_op_cpu(x, 2.0, 2)
    assert y.grad_fn is not None
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 4.0))
    with pytest.raises(RuntimeError, match=r"does not support automatic differentiation"):
        scale_op_cpu(x, out=torch.empty(3))


def test_an_op_without_a_backward_refuses_a_grad():
    x = torch.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"mllm_kernel.shift_op has no backward"):
        shift_op_cpu(x, 1)
    with torch.no_grad():
        assert torch.equal(shift_op_cpu(x, 1), torch.full((2,), 2.0))


def test_compiled_graphs_hold_the_torch_op():
    compiled = torch.compile(lambda x: scale_op_cpu(x, 3.0), fullgraph=True)
    assert torch.equal(compiled(torch.ones(2)), torch.full((2,), 3.0))


def test_declaration_mistakes_are_errors_at_import():
    def unconverted(x: torch.Tensor, ids: list[int]) -> torch.Tensor:
        """."""

    with pytest.raises(TypeError, match=r"argument 'ids' is annotated .*give it a converter"):
        Op(unconverted, fake=like("x")).kernel("cpu")(lambda x, ids: x)

    def untyped(x: torch.Tensor, ids: list) -> torch.Tensor:
        """."""

    with pytest.raises(ValueError, match=r"Parameter ids has unsupported type"):
        Op(untyped, fake=like("x"))  # no schema: torch's own message
    with pytest.raises(ValueError, match=r"no parameter named \['output'\]"):
        Op(scale_op, out="output")
    with pytest.raises(ValueError, match=r"already has a cpu kernel"):
        SHIFT.kernel("cpu")(lambda x, by: x)


def pick_op(
    x: torch.Tensor,
    rows: int,
    limit: int | None = None,
    flip: bool = False,
    dtype: torch.dtype = torch.float32,
    *,
    pad: int = 0,
) -> torch.Tensor:
    """``x`` in ``dtype``, negated when ``flip``, its first ``rows`` rows (``limit`` of
    them when given) padded by ``pad`` (0 or a multiple of ``rows``)."""


def _check_pad(x: torch.Tensor, rows: int, pad: int) -> None:
    if pad % max(rows, 1):
        raise ValueError(f"argument 'pad': {pad} is not a multiple of rows={rows} ({x.dim()}-D x)")


PICK = Op(pick_op, fake=like("x"), symbolic=("rows",), check=_check_pad)
pick_calls: list[tuple] = []


@PICK.kernel("cpu")
def pick_op_cpu(x, rows, limit, flip, dtype, pad):
    pick_calls.append((rows, limit, flip, dtype, pad))
    y = x[: rows if limit is None else limit].to(dtype)
    return -y if flip else y


def test_bools_dtypes_optional_ints_and_symbolic_sizes():
    schema = str(torch.ops.mllm_kernel.pick_op.default._schema)
    assert schema.endswith(
        "(Tensor x, SymInt rows, int? limit=None, bool flip=False, "
        "ScalarType dtype=6, *, int pad=0) -> Tensor"  # 6: float32
    )
    pick_calls.clear()
    x = torch.arange(6.0).reshape(3, 2)
    got = pick_op_cpu(x, np.int32(2), np.int64(1), np.bool_(True), torch.float64, pad=4)
    assert torch.equal(got, -torch.tensor([[0.0, 1.0]], dtype=torch.float64))
    assert pick_calls == [(2, 1, True, torch.float64, 4)]
    assert [type(v) for v in pick_calls[0]] == [int, int, bool, torch.dtype, int]
    with pytest.raises(TypeError, match=r"argument 'flip': expected a bool but got int"):
        pick_op_cpu(x, 2, flip=1)  # 0/1 are counts elsewhere: not taken for a bool
    with pytest.raises(TypeError, match=r"argument 'dtype': expected a torch.dtype but got str"):
        pick_op_cpu(x, 2, dtype="float64")
    with pytest.raises(TypeError, match=r"argument 'limit': expected an int but got float"):
        pick_op_cpu(x, 2, limit=1.0)


def test_the_ops_check_runs_before_the_kernel_with_the_arguments_it_names():
    pick_calls.clear()
    with pytest.raises(ValueError, match=r"'pad': 3 is not a multiple of rows=2 \(2-D x\)"):
        pick_op_cpu(torch.ones(3, 2), 2, pad=3)
    assert pick_calls == []
    # A check's error is the caller's on any device: not replaced by the device error.
    with pytest.raises(ValueError, match=r"argument 'pad'"):
        pick_op_cpu(torch.ones(3, 2, device="meta"), 2, pad=3)

    def strict(x: torch.Tensor, rows: int) -> None:
        """."""

    with pytest.raises(ValueError, match=r"no parameter named \['nothing'\]"):
        Op(strict, check=lambda nothing: None)


def mid_out_op(
    x: torch.Tensor, out: torch.Tensor | None, scale: float = 1.0, *, bump: torch.Tensor
) -> torch.Tensor:
    """``x * scale``, counting calls in ``bump`` (``out`` declared before the scalars,
    without a default, as ``gptq_marlin_gemm``'s ``c`` is)."""


MID_OUT = Op(mid_out_op, out="out", fake=like("x"), writes=("bump",))


@MID_OUT.kernel("cpu")
def mid_out_op_cpu(x, out, scale, bump):
    bump.add_(1)
    out = torch.empty_like(x) if out is None else out
    return torch.mul(x, scale, out=out)


def test_the_torch_op_takes_the_schemas_order_when_out_is_declared_early():
    schema = str(torch.ops.mllm_kernel.mid_out_op.default._schema)
    assert schema.endswith("(Tensor x, float scale=1., *, Tensor(b!) bump) -> Tensor")
    assert "Tensor(b!) bump, Tensor(a!) out" in str(torch.ops.mllm_kernel.mid_out_op.out._schema)
    x, bump = torch.arange(3.0), torch.zeros(1)
    assert torch.equal(torch.ops.mllm_kernel.mid_out_op(x, 2.0, bump=bump), x * 2)
    out = torch.full((3,), float("nan"))
    torch.ops.mllm_kernel.mid_out_op.out(x, 3.0, bump=bump, out=out)
    assert torch.equal(out, x * 3)
    compiled = torch.compile(lambda x: mid_out_op_cpu(x, None, 4.0, bump=bump), fullgraph=True)
    assert torch.equal(compiled(x), x * 4)
    assert bump.item() >= 3


def after_out_op(out: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """``x + 1``, with ``out`` declared before the argument its result is like."""


AFTER_OUT = Op(after_out_op, out="out", fake=like("x"))


@AFTER_OUT.kernel("cpu")
def after_out_op_cpu(out, x):
    return torch.add(x, 1, out=out) if out is not None else x + 1


def test_like_finds_its_argument_in_the_schemas_order():
    x = torch.empty(2, 5, device="meta")
    got = torch.ops.mllm_kernel.after_out_op(x)  # torch passes (x,): no out in the schema
    assert (got.shape, got.device.type) == ((2, 5), "meta")
    assert torch.equal(after_out_op_cpu(None, torch.zeros(3)), torch.ones(3))


def cast_op(
    x: torch.Tensor, dtype: torch.dtype, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``x`` in ``dtype`` (float32 or float64), then in ``out_dtype`` (float16) if given."""


CAST = Op(
    cast_op,
    fake=like("x"),
    dtypes={"dtype": (torch.float32, torch.float64), "out_dtype": (torch.float16,)},
)


@CAST.kernel("cpu")
def cast_op_cpu(x, dtype, out_dtype):
    y = x.to(dtype)
    return y if out_dtype is None else y.to(out_dtype)


def test_a_dtype_the_op_does_not_take_is_a_type_error():
    x = torch.arange(3.0)
    assert cast_op_cpu(x, torch.float64).dtype == torch.float64
    assert cast_op_cpu(x, torch.float32, torch.float16).dtype == torch.float16
    for bad, got in [
        (torch.int8, "torch.int8"),
        ("float64", "str"),
        (np.dtype("float64"), r"\w+"),  # numpy's class name varies by version
        (torch.float64.__class__, "type"),
        (None, "None"),
    ]:
        with pytest.raises(
            TypeError,
            match=rf"^argument 'dtype': expected torch.float32 or torch.float64 but got {got}$",
        ):
            cast_op_cpu(x, bad)
    with pytest.raises(TypeError, match=r"^argument 'out_dtype': expected torch.float16 but got"):
        cast_op_cpu(x, torch.float32, torch.float32)
    # Under torch.compile the torch op takes the dtype and the eager function refuses it.
    compiled = torch.compile(lambda x: cast_op_cpu(x, torch.int32), fullgraph=True)
    with pytest.raises(TypeError, match=r"argument 'dtype'"):
        compiled(x)


def test_dtypes_name_dtype_arguments_without_a_converter():
    with pytest.raises(ValueError, match=r"no parameter named \['dt'\]"):
        Op(cast_op, dtypes={"dt": (torch.float32,)})
    with pytest.raises(TypeError, match=r"dtypes names 'x', which is not a torch.dtype"):
        Op(cast_op, dtypes={"x": (torch.float32,)})
    with pytest.raises(TypeError, match=r"dtypes names 'dtype', which is not a torch.dtype"):
        Op(cast_op, convert={"dtype": lambda v: v}, dtypes={"dtype": (torch.float32,)})


def _dtype_arguments() -> list:
    """(op, argument) for every torch.dtype argument of the package's declared ops."""
    import importlib
    import pkgutil

    import mllm_kernel.ops

    ops = []
    for info in pkgutil.iter_modules(mllm_kernel.ops.__path__):
        module = importlib.import_module(f"mllm_kernel.ops.{info.name}")
        ops += [v for v in vars(module).values() if isinstance(v, Op) and v not in ops]
    found = []
    for op in ops:
        for name, param in op.signature.parameters.items():
            optional = typing.get_args(param.annotation)
            if param.annotation is torch.dtype or torch.dtype in optional:
                found.append(pytest.param(op, name, id=f"{op.name}.{name}"))
    return found


def _convert(op: Op, name: str, value: object) -> object:
    """``value`` converted as ``op``'s eager functions convert argument ``name``: by its
    ``convert`` function, or by op_inputs.dtype (with the op's ``dtypes`` for it)."""
    from mllm_kernel.jit_utils import op_inputs

    if name in op.convert:
        return op.convert[name](value)
    return op_inputs.dtype(value, name, op.dtypes.get(name))


@pytest.mark.parametrize(("op", "name"), _dtype_arguments())
def test_every_ops_dtype_arguments_refuse_with_a_type_error(op, name):
    """A dtype argument of any op given what is not a dtype, or a dtype its op refuses
    there (a complex one: no kernel takes it), raises TypeError naming the argument."""
    for bad in (object(), "no_such_dtype"):
        with pytest.raises(TypeError, match=rf"argument '{name}'"):
            _convert(op, name, bad)
    try:
        assert _convert(op, name, torch.complex128) is torch.complex128  # the kernel's to refuse
    except TypeError as error:
        assert f"argument '{name}'" in str(error)


def named_op(x: torch.Tensor, rows: int, scale: float = 2.0) -> torch.Tensor:
    """A test op whose fake reads two of its arguments by name."""


NAMED = Op(named_op, fake=named(lambda x, rows: x.new_empty((rows, x.shape[1]))))


@NAMED.kernel("cpu")
def named_op_cpu(x, rows, scale):
    return x[:rows] * scale


def test_named_fake_gets_the_arguments_it_names_however_torch_passes_them():
    """Under fake tensors the result has the fake's shape whether the call passes the
    arguments by position or by keyword, defaults left out; a compiled call agrees."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(5, 3)
    with FakeTensorMode() as mode:
        t = mode.from_tensor(x)
        assert torch.ops.mllm_kernel.named_op(t, 4).shape == (4, 3)
        assert torch.ops.mllm_kernel.named_op(t, rows=1, scale=3.0).shape == (1, 3)
    compiled = torch.compile(lambda t: named_op_cpu(t, 2), fullgraph=True)
    torch.testing.assert_close(compiled(x), x[:2] * 2.0)


def test_named_fake_must_name_arguments_of_the_op():
    def other_op(x: torch.Tensor) -> torch.Tensor:
        """A test op."""

    with pytest.raises(ValueError, match=r"the fake names no argument of the op: \['y'\]"):
        Op(other_op, fake=named(lambda x, y: x))
