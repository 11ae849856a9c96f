"""An op declared once for every device, and the eager call path generated from it.

Design
------
An op's declaration (``mllm_kernel/ops/<family>.py``) is a typed Python signature with
its docstring, plus what torch and the call path need to know about it::

    def rmsnorm(input: Tensor, weight: Tensor, eps: float = 1e-6,
                out: Tensor | None = None) -> Tensor:
        '''What it computes, on every device.'''

    RMSNORM = Op(rmsnorm, out="out", fake=like("input"), autograd=(backward, setup))

From the declaration come the torch custom op ``torch.ops.mllm_kernel.rmsnorm`` (its
schema inferred from the annotations by ``torch.library.infer_schema``, never spelled
by hand; its fake, autograd and ``.out`` overload: :mod:`.torch_op`) and, per device,
the public eager function. A device's op file gives the op its kernel::

    @RMSNORM.kernel("cuda")
    def rmsnorm(input, weight, eps, out):
        '''Notes for this device (dtypes, layouts), appended to the op's docstring.'''
        out = torch.empty_like(input) if out is None else out
        _RMSNORM[input.get_device()].rmsnorm(out, input, weight, eps)
        return out

and gets back ``mllm_kernel.cuda.jit.rmsnorm``: a function with the declared signature
whose body is generated once per (op, device) as straight-line code (no loop over the
arguments, no ``*args``), so that an eager call costs what a hand-written wrapper
would. In order, it

1. under ``torch.compile`` tracing, or any other tracer or transform that sees only the
   dispatcher (a dispatch mode: make_fx, non-strict torch.export; functorch's vmap /
   jvp; torch.jit.trace), calls the torch op (the graph holds it);
2. converts each argument by its annotation (:mod:`.op_inputs`: a ``Tensor`` may be
   any DLPack tensor, a written one or the ``out`` buffer is checked as an output, a
   ``float`` any real number, an ``int`` any integer), or by the op's ``convert``
   function for that argument; a ``bool`` is a bool (numpy's too), a ``torch.dtype`` a
   dtype (one of those the op's ``dtypes`` names for it, if any), ``X | None`` also
   None. A value of the wrong type and a dtype the op does not take raise TypeError, a
   value the type allows but the op does not ValueError, as the kernels' own checks do
   (``tensor.hpp``: TypeError for a dtype, ValueError for the rest; a ``convert``
   function follows the same rule). An exact ``torch.Tensor`` / ``float`` / ``int`` takes
   the fast path of one ``type()`` test (an ``int`` or ``float`` argument's converter
   too: it runs for other types only, so a value it would refuse must also be refused
   by the kernel module's variant check, as ``add_constant``'s is);
3. when grad mode is on and a tensor argument requires grad: an op with a backward
   goes through the torch op, whose autograd records it; any other op raises the
   no-backward RuntimeError (:func:`.torch_op.no_backward_error`): no result silently
   drops a gradient;
4. runs the op's ``check`` (a rule of the op's contract over arguments the kernel never
   sees, such as ``store_cache``'s ``row_bytes``), called by keyword with the arguments
   it names: its errors are the caller's on any device, so they come before the kernel;
5. calls the kernel with the converted arguments, in the declared order; a failure is
   explained by :func:`.op_inputs.explain` (an argument of the wrong kind of tensor is
   named) before it propagates;
6. bumps the version counter of every tensor the kernel wrote (``out`` and ``writes``),
   as torch's in-place ops do: a backward that saved one of them then refuses instead
   of using the new values.

A kernel allocates what it returns the cheapest way torch has, since at decode size an
allocation costs as much as the rest of the call: ``torch.empty_like(x)`` for ``x``'s
shape, else ``x.new_empty(size=shape, dtype=...)`` with the size by keyword. torch's
argument parser takes a positional size 0.5 us slower (1 us for a ``torch.Size`` such
as ``x.shape``; torch 2.13), and ``torch.empty(..., device=x.device)`` slower still.

So a device's file holds only its ``KernelModule`` and kernel functions, every check of
tensor shapes, dtypes and strides is the C++ kernel's, and nothing of the op is written
twice.
"""

from __future__ import annotations

import inspect
import re
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from mllm_kernel.jit_utils import op_inputs
from mllm_kernel.jit_utils.torch_op import Autograd, TorchOp, no_backward_error, torch_op

_Tensor = torch.Tensor


@dataclass(frozen=True)
class like:
    """A fake implementation: a new tensor like the argument ``name`` (shape, dtype,
    device), wherever the call passes it."""

    name: str

    def bound(self, signature: inspect.Signature) -> Callable[..., torch.Tensor]:
        """The fake for an op of ``signature``, as torch calls it: the schema's
        arguments (the declared ones without the ``out`` buffer)."""
        position = list(signature.parameters).index(self.name)

        def fake(*args: Any, **kwargs: Any) -> torch.Tensor:
            return torch.empty_like(kwargs[self.name] if position >= len(args) else args[position])

        return fake


@dataclass(frozen=True)
class named:
    """A fake implementation from the arguments it names: ``fn``'s parameters are some
    of the op's, and it is called with those by keyword, however torch passes them (its
    defaults filled in), so a fake spells only what it reads::

        Op(gemm, fake=named(lambda a, b, out_dtype: a.new_empty(...)))
    """

    fn: Callable[..., Any]

    def bound(self, signature: inspect.Signature) -> Callable[..., Any]:
        """The fake for an op of ``signature``, as torch calls it (see :meth:`like.bound`)."""
        wanted = list(inspect.signature(self.fn).parameters)
        unknown = set(wanted) - set(signature.parameters)
        if unknown:
            raise ValueError(f"the fake names no argument of the op: {sorted(unknown)}")

        def fake(*args: Any, **kwargs: Any) -> Any:
            given = signature.bind(*args, **kwargs)
            given.apply_defaults()
            return self.fn(**{name: given.arguments[name] for name in wanted})

        return fake


def _is_optional(annotation: Any, kind: type) -> bool:
    """Whether ``annotation`` is ``kind | None``."""
    return typing.get_origin(annotation) in (typing.Union, types.UnionType) and set(
        typing.get_args(annotation)
    ) == {kind, type(None)}


class Op:
    """One op for every device: see the module docstring."""

    def __init__(
        self,
        signature: Callable[..., Any],
        *,
        fake: Callable[..., Any] | like | named | None = None,
        out: str | None = None,
        writes: tuple[str, ...] = (),
        autograd: Autograd | None = None,
        convert: dict[str, Callable[[Any], Any]] | None = None,
        symbolic: tuple[str, ...] = (),
        check: Callable[..., None] | None = None,
        dtypes: dict[str, tuple[torch.dtype, ...]] | None = None,
    ) -> None:
        self.name = signature.__name__
        self.signature = inspect.signature(signature, eval_str=True)
        self.doc = inspect.getdoc(signature) or ""
        self.out = out
        self.writes = writes
        self.autograd = autograd
        self.convert = dict(convert or {})
        self.symbolic = symbolic
        self.check = check
        self.dtypes = dict(dtypes or {})
        unknown = set(self.convert) | set(writes) | set(symbolic) | ({out} if out else set())
        if check is not None:
            unknown |= set(inspect.signature(check).parameters)
        unknown |= set(self.dtypes)
        unknown -= set(self.signature.parameters)
        if unknown:
            raise ValueError(f"op {self.name}: no parameter named {sorted(unknown)}")
        for name in self.dtypes:
            annotation = self.signature.parameters[name].annotation
            if name in self.convert or not (
                annotation is torch.dtype or _is_optional(annotation, torch.dtype)
            ):
                raise TypeError(
                    f"op {self.name}: dtypes names {name!r}, which is not a torch.dtype "
                    "argument without a converter"
                )
        if isinstance(fake, like | named):
            schema_order = [p for name, p in self.signature.parameters.items() if name != out]
            fake = fake.bound(self.signature.replace(parameters=schema_order))
        self.torch_op: TorchOp = torch_op(
            self.name, self.schema(), fake=fake, out=out, autograd=autograd
        )
        self.kernels: dict[str, Callable[..., Any]] = {}

    def schema(self) -> str:
        """The torch schema, inferred from the signature without the ``out`` buffer
        (it is the ``.out`` overload's); ``int`` stays ``int`` (torch infers
        ``SymInt``): an int argument of ours picks a kernel, it is never symbolic, but
        for the ``symbolic`` ones (sizes a traced graph passes on, as
        ``gptq_marlin_gemm``'s ``size_m`` is ``x.shape[0]``)."""
        params = [p for name, p in self.signature.parameters.items() if name != self.out]
        prototype = _prototype(self.signature.replace(parameters=params))
        schema = torch.library.infer_schema(prototype, mutates_args=self.writes)
        schema = re.sub(
            r"SymInt(\?)? (\w+)",
            lambda m: m[0] if m[2] in self.symbolic else f"int{m[1] or ''} {m[2]}",
            schema,
        )
        # Alias sets named a, b, ... in order (torch names them by position, a7), after
        # the .out overload's ``a``: the schemas read as vLLM's and the original's.
        letters = iter("bcdefghijklmnopqrstuvwxyz" if self.out else "abcdefghijklmnopqrstuvwxyz")
        return re.sub(r"Tensor\(a\d*!\)", lambda m: f"Tensor({next(letters)}!)", schema)

    def kernel(self, device: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: ``fn`` is the op's kernel on ``device`` (``"cpu"`` or ``"cuda"``),
        called with the converted arguments in the declared order; returns the public
        eager function of that device (and registers it as the torch op's kernel)."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            if device in self.kernels:
                raise ValueError(f"op {self.name} already has a {device} kernel")
            eager = _generate(self, device, fn)
            self.kernels[device] = eager
            self.torch_op.implement(device, self._in_schema_order(eager))
            return eager

        return register

    def _in_schema_order(self, eager: Callable[..., Any]) -> Callable[..., Any]:
        """``eager`` as torch calls an op's kernel: the schema's positional arguments
        (the declared ones without ``out``) and ``out`` by keyword. Where ``out`` is
        declared last (or there is none) that is ``eager`` itself; else (``gemm``'s
        ``out``, ``gptq_marlin_gemm``'s ``c``, which has no default) the positions are
        renamed and a missing ``out`` is None."""
        params = list(self.signature.parameters)
        if self.out is None or params[-1] == self.out:
            return eager
        names = [n for n in params if n != self.out]

        def in_schema_order(*args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault(self.out, None)  # the functional overload has none
            return eager(**dict(zip(names, args, strict=False)), **kwargs)

        return in_schema_order


def _prototype(signature: inspect.Signature) -> Callable[..., Any]:
    def prototype(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a signature only")

    prototype.__signature__ = signature  # type: ignore[attr-defined]
    return prototype


# A scalar annotation: (the name of its exact type in the generated code, the name of
# its op_inputs converter there).
_SCALARS = {
    float: ("float", "_number"),
    int: ("int", "_integer"),
    bool: ("bool", "_boolean"),
    torch.dtype: ("_dtype_type", "_dtype"),
}


def _conversion(op: Op, name: str, annotation: Any) -> tuple[str, dict[str, Any]]:
    """The generated line converting argument ``name``, and the names it uses."""
    written = name in op.writes or name == op.out
    allowed = op.dtypes.get(name)
    if allowed is not None:  # a dtype of the declared ones: one type() test, one lookup
        test = f"type({name}) is not _dtype_type or {name} not in _allowed_{name}"
        if annotation is not torch.dtype:
            test = f"{name} is not None and ({test})"
        line = f"if {test}: {name} = _dtype({name}, {name!r}, _allowed_{name})"
        return line, {f"_allowed_{name}": allowed}
    custom = op.convert.get(name)
    if custom is not None:
        exact = "int" if annotation is int else "float" if annotation is float else None
        line = f"{name} = _convert_{name}({name})"
        if exact:  # the converter's fast path, inline
            line = f"if type({name}) is not {exact}: {line}"
        return line, {f"_convert_{name}": custom}
    # The fast path of op_inputs.tensor / output, inline: an exact torch tensor without
    # the negative bit (a negative view would hand the kernel negated values).
    check = "_output" if written else "_tensor"
    fast = f"type({name}) is _Tensor and not _is_neg({name})"
    if annotation is _Tensor:
        return f"if not ({fast}): {name} = {check}({name}, {name!r})", {}
    if _is_optional(annotation, _Tensor):
        return f"if {name} is not None and not ({fast}): {name} = {check}({name}, {name!r})", {}
    for kind, (exact, convert) in _SCALARS.items():
        if annotation is kind:  # an exact value is taken as it is: one type() test
            return f"if type({name}) is not {exact}: {name} = {convert}({name}, {name!r})", {}
        if _is_optional(annotation, kind):
            return f"if {name} is not None: {name} = {convert}({name}, {name!r})", {}
    raise TypeError(
        f"op {op.name}: argument {name!r} is annotated {annotation!r}; give it a converter "
        "(Op(convert={...}))"
    )


def _bool_refusal(op: Op, name: str, annotation: Any) -> str | None:
    """For argument ``name`` if it is an int or a float (or either | None), and not one
    torch may pass a symbol for: the call of its converter, in the generated code, which
    refuses a bool (the eager call's refusal); else None."""
    if name in op.symbolic:
        return None
    for kind in (int, float):
        if annotation is kind or _is_optional(annotation, kind):
            if name in op.convert:
                return f"_convert_{name}({name})"
            return f"{_SCALARS[kind][1]}({name}, {name!r})"
    return None


def _generate(op: Op, device: str, kernel: Callable[..., Any]) -> Callable[..., Any]:
    """The eager function of ``op`` on ``device`` around ``kernel`` (module docstring)."""
    params = op.signature.parameters
    names = list(params)
    tensors = [
        n
        for n, p in params.items()
        if p.annotation is _Tensor or _is_optional(p.annotation, _Tensor)
    ]
    # The code runs in a module of its own, registered as a submodule of the device's op
    # file: torch.compile looks a function's globals up by their module's name, and
    # op_inputs._same_op_on tells the device by it.
    module = types.ModuleType(f"{kernel.__module__}._eager_{op.name}")
    sys.modules[module.__name__] = module
    namespace = module.__dict__
    namespace.update(
        {
            "_tracing": torch.compiler.is_dynamo_compiling,
            # Other tracers and transforms see only what goes through the dispatcher:
            # make_fx and non-strict torch.export (a dispatch mode), vmap / jvp
            # (functorch), torch.jit.trace.
            "_dispatch_modes": torch._C._len_torch_dispatch_stack,
            "_functorch": torch._C._are_functorch_transforms_active,
            "_jit_tracing": torch._C._get_tracing_state,
            "_bump": torch._C._increment_version,
            "_grad_enabled": torch.is_grad_enabled,
            "_op": op.torch_op,
            "_kernel": kernel,
            "_Tensor": _Tensor,
            "_is_neg": _Tensor.is_neg,
            "_tensor": op_inputs.tensor,
            "_output": op_inputs.output,
            "_number": op_inputs.number,
            "_integer": op_inputs.integer,
            "_boolean": op_inputs.boolean,
            "_dtype": op_inputs.dtype,
            "_dtype_type": torch.dtype,
            "_explain": op_inputs.explain,
            "_no_backward": no_backward_error,
        }
    )
    header = []
    for name, param in params.items():
        if param.kind is param.KEYWORD_ONLY and "*" not in header:
            header.append("*")
        if param.default is param.empty:
            header.append(name)
        else:
            namespace[f"_default_{name}"] = param.default
            header.append(f"{name}=_default_{name}")
    positional = [n for n in names if n != op.out and params[n].kind is not params[n].KEYWORD_ONLY]
    keyword = [n for n in names if n != op.out and params[n].kind is params[n].KEYWORD_ONLY]
    traced_args = ", ".join([*positional, *(f"{n}={n}" for n in keyword)])
    if op.out:
        traced_args += f", {op.out}={op.out}"
    lines = [f"def {op.name}({', '.join(header)}):"]
    lines.append(
        "    if _tracing() or _dispatch_modes() or _functorch() or _jit_tracing() is not None:"
    )
    # torch's schema takes a bool for an int or a float (as 1 or 1.0), where the eager
    # call refuses it: the traced call refuses it too, through the argument's converter.
    for name in names:
        refusal = _bool_refusal(op, name, params[name].annotation)
        if refusal is not None:
            if name in op.convert:
                namespace[f"_convert_{name}"] = op.convert[name]
            lines.append(f"        if type({name}) is bool: {refusal}")
    lines.append(f"        return _op({traced_args})")
    for name in names:
        line, extra = _conversion(op, name, params[name].annotation)
        namespace.update(extra)
        lines.append(f"    {line}")
    if tensors:
        required = " or ".join(
            f"{n}.requires_grad"
            if params[n].annotation is _Tensor
            else f"({n} is not None and {n}.requires_grad)"
            for n in tensors
        )
        route = f"return _op({traced_args})" if op.autograd else f"raise _no_backward({op.name!r})"
        lines.append(f"    if _grad_enabled() and ({required}): {route}")
    if op.check is not None:
        namespace["_check"] = op.check
        checked = ", ".join(f"{n}={n}" for n in inspect.signature(op.check).parameters)
        lines.append(f"    _check({checked})")
    named = ", ".join(f"{n}={n}" for n in tensors)
    lines += [
        "    try:",
        f"        result = _kernel({', '.join(names)})",
        "    except Exception as error:",
        f"        _explain(error, {device!r}, {named})",
        "        raise",
    ]
    # The kernel wrote these behind autograd's back: their version counters say so, as
    # torch's in-place ops do, so that a tensor saved for a backward and written here
    # fails that backward instead of giving a wrong gradient.
    written = [n for n in names if n in op.writes or n == op.out]
    required = [n for n in written if params[n].annotation is _Tensor]
    if required:
        lines.append(f"    _bump(({', '.join(required)},))")
    lines += [f"    if {n} is not None: _bump(({n},))" for n in written if n not in required]
    lines.append("    return result")
    exec("\n".join(lines), namespace)  # generated from the declaration only
    eager = namespace[op.name]
    notes = inspect.getdoc(kernel)
    eager.__doc__ = f"{op.doc}\n\nOn {device}: {notes}" if notes else op.doc
    eager.__module__ = kernel.__module__
    eager.__qualname__ = op.name
    eager.__signature__ = op.signature
    eager.__wrapped__ = kernel
    return eager
