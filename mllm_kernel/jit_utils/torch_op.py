"""The package's ops as torch custom ops (``torch.ops.mllm_kernel.*``): what torch.compile sees.

Every op gets its torch op from its declaration (:class:`mllm_kernel.ops.op.Op` infers
the schema and calls :func:`torch_op`, then registers each device's eager function with
:meth:`TorchOp.implement`); nothing else calls :func:`torch_op`.

* One name, one schema on every device: a second declaration with another schema is a
  ValueError at import (the op's signature is the same on both devices or the package
  does not load).
* ``fake`` gives the output's shape, dtype and strides without running anything (the
  meta implementation); ops that only write their arguments need none.
* Mutated arguments are annotated in the schema (``Tensor(a!) query``); an op with an
  ``out=`` buffer (``out="out"``) gets a second overload, ``<name>.out``, which takes
  the buffer as a keyword-only mutated argument and returns nothing: torch custom ops
  may not return an alias of an input, so the functional overload and the in-place
  one are separate, and :meth:`TorchOp.__call__` picks one as the Python op does.

The eager path does not go through torch's dispatcher: the generated eager function asks
``torch.compiler.is_dynamo_compiling()`` first (False in eager mode at the cost of one
empty call, folded to True by Dynamo while tracing, so a compiled graph holds the
registered op), then whether a dispatch mode, a functorch transform or torch.jit.trace
is active (each sees only the dispatcher: the call goes there too), and otherwise calls
its kernel directly. An op with a backward
(``autograd``) also takes the registered path when its input requires grad, so that
``.backward()`` works in eager mode; the registered implementation of an op without one,
or of one that writes its arguments in place, refuses a required grad
(:func:`refuse_grad`; under torch.compile :meth:`TorchOp.__call__`, where Dynamo traces,
refuses it for the latter): a RuntimeError that says what to do, in eager mode as under
torch.compile, never a result that silently drops the gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

NAMESPACE = "mllm_kernel"
_DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA"}

_library = torch.library.Library(NAMESPACE, "FRAGMENT")
_declared: dict[str, TorchOp] = {}


# (backward, setup_context) as torch.library.register_autograd takes them.
Autograd = tuple[Callable[..., Any], Callable[..., Any]]


def _no_output(*args: Any, **kwargs: Any) -> None:
    """The fake implementation of an op that only writes its arguments."""


def _no_backward(ctx: Any, *grads: Any) -> None:
    raise AssertionError("unreachable: the op's setup_context refused the grad")


def no_backward_error(name: str) -> RuntimeError:
    """The error of op ``name`` (which has no backward) called while autograd records
    and one of its tensors requires grad: said at the call, not at ``.backward()``."""
    return RuntimeError(
        f"mllm_kernel.{name} has no backward: call it on tensors that do not require "
        "grad (under torch.no_grad() or torch.inference_mode(), or on .detach()ed "
        "inputs)"
    )


def refuse_grad(name: str, *tensors: Any) -> None:
    """Raises :func:`no_backward_error` when grad mode is on and one of ``tensors``
    requires grad (values that are not torch tensors, None or a numpy ``out=``, are
    skipped): an op without a backward, or one writing its arguments in place, calls
    it before its kernel so that no result silently drops a gradient."""
    for value in tensors:
        if getattr(value, "requires_grad", False) and torch.is_grad_enabled():
            raise no_backward_error(name)


def _refuse_grad(name: str) -> Callable[..., None]:
    """The setup_context of an op without a backward: torch calls it only when a grad
    is required."""

    def refuse(ctx: Any, inputs: Any, output: Any) -> None:
        raise no_backward_error(name)

    return refuse


class TorchOp:
    """One op of ``torch.ops.mllm_kernel``, with its ``.out`` overload when it has an
    output buffer. Build it with :func:`torch_op`."""

    def __init__(
        self,
        name: str,
        schema: str,
        fake: Callable[..., Any] | None,
        out: str | None,
        autograd: Autograd | None,
    ) -> None:
        self.name = name
        self.schema = schema
        self.out = out
        self.autograd = autograd
        self.devices: set[str] = set()
        _library.define(name + schema)
        torch.library.register_fake(f"{NAMESPACE}::{name}", fake or _no_output, lib=_library)
        packet = getattr(torch.ops, NAMESPACE)
        self.functional = getattr(packet, name).default
        # Ops that write an argument (gptq_marlin_gemm's workspace, fused_add_rmsnorm)
        # have no grads, and torch.library.register_autograd refuses them. A plain bool:
        # Dynamo cannot read a FunctionSchema where it traces __call__.
        self.mutable = bool(self.functional._schema.is_mutable)
        if not self.mutable:
            backward, setup = autograd or (_no_backward, _refuse_grad(name))
            torch.library.register_autograd(
                f"{NAMESPACE}::{name}", backward, setup_context=setup, lib=_library
            )
        self.in_place = None
        if out is not None:
            _library.define(f"{name}.out{_with_out_buffer(schema, out)}")
            torch.library.register_fake(f"{NAMESPACE}::{name}.out", _no_output, lib=_library)
            self.in_place = getattr(packet, name).out

    def implement(self, device: str, fn: Callable[..., Any]) -> TorchOp:
        """Registers ``fn`` (the op's Python function, same parameters as the schema)
        as the kernel on ``device`` (``"cpu"`` or ``"cuda"``); returns ``self``."""
        if device in self.devices:
            raise ValueError(f"torch op {NAMESPACE}::{self.name} already has a {device} kernel")
        key = _DISPATCH_KEYS[device]
        # Detached inputs: below autograd the tensors may still require grad, and the
        # Python op would route them back to this op (detach shares memory: out= buffers
        # are still written). An op that writes its arguments has no autograd kernel
        # (torch refuses one), so it refuses a required grad here, before detaching.
        mutable = self.mutable

        # The kernels are never traced by Dynamo (torch.compiler.disable): where a compiled
        # function runs the op eagerly (a graph break, such as an out= buffer that is not
        # contiguous), Dynamo would trace the kernel's frame, the Python op there would
        # route back to this op (it does so under tracing), break the graph again, and so
        # on until RecursionError.
        @torch.compiler.disable
        def run(*args: Any, **kwargs: Any) -> Any:
            if mutable:
                refuse_grad(self.name, *_tensors(args), *_tensors(kwargs.values()))
            return fn(*_detached(args), **_detached(kwargs))

        _library.impl(self.name, run, key)
        if self.out is not None:

            @torch.compiler.disable
            def write_out(*args: Any, **kwargs: Any) -> None:
                self._refuse_out_grad(*args, *kwargs.values())
                fn(*_detached(args), **_detached(kwargs))

            _library.impl(f"{self.name}.out", write_out, key)
        self.devices.add(device)
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calls the registered op as the Python op would be called: with the output
        buffer (keyword ``self.out``) the ``.out`` overload, which returns the buffer.
        An op that writes its arguments refuses a required grad here, where Dynamo
        traces (its registered kernel's refusal runs inside the compiled forward, where
        grad mode is off: the gradient through it was dropped without a word)."""
        if self.mutable:
            refuse_grad(self.name, *_tensors(args), *_tensors(kwargs.values()))
        if self.out is None:
            return self.functional(*args, **kwargs)
        buffer = kwargs.pop(self.out, None)
        if buffer is None:
            return self.functional(*args, **kwargs)
        self._refuse_out_grad(*args, *kwargs.values(), buffer)
        self.in_place(*args, **kwargs, **{self.out: buffer})
        return buffer

    def _refuse_out_grad(self, *values: Any) -> None:
        """RuntimeError, as torch's out= functions raise it, when grad mode is on and one
        of the tensors among ``values`` requires grad."""
        if torch.is_grad_enabled() and any(t.requires_grad for t in _tensors(values)):
            raise RuntimeError(
                f"mllm_kernel.{self.name}(..., {self.out}=...) does not support automatic "
                f"differentiation (as torch's out= functions); drop {self.out}= to get a "
                "result with a grad_fn, or call it under torch.no_grad()"
            )


def _tensors(values: Any) -> list[torch.Tensor]:
    return [v for v in values if isinstance(v, torch.Tensor)]


def _detached(values: Any) -> Any:
    if isinstance(values, dict):
        return {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in values.items()}
    return [v.detach() if isinstance(v, torch.Tensor) else v for v in values]


def _with_out_buffer(schema: str, out: str) -> str:
    """``(args) -> Tensor`` as ``(args, *, Tensor(a!) out) -> ()``."""
    arguments = schema[: schema.rindex(") ->")]
    separator = ", " if "*" in arguments else ", *, "
    return f"{arguments}{separator}Tensor(a!) {out}) -> ()"


def torch_op(
    name: str,
    schema: str,
    *,
    fake: Callable[..., Any] | None = None,
    out: str | None = None,
    autograd: Autograd | None = None,
) -> TorchOp:
    """The op ``torch.ops.mllm_kernel.<name>`` with ``schema`` (``"(Tensor x) -> Tensor"``),
    defined on first use; ValueError when ``name`` was declared with another schema (by
    the op file of the other device). ``fake``: the meta implementation (required for an
    op that returns tensors). ``out``: the name of the op's output-buffer keyword, which
    gets the ``<name>.out`` overload. ``autograd``: ``(backward, setup_context)`` for
    torch.library.register_autograd; without it, an op that returns tensors raises a
    RuntimeError when called with a grad required.

    >>> op = torch_op("my_scale", "(Tensor x, float s) -> Tensor",
    ...               fake=lambda x, s: torch.empty_like(x))  # doctest: +SKIP
    """
    declared = _declared.get(name)
    if declared is not None:
        if (declared.schema, declared.out, declared.autograd) != (schema, out, autograd):
            raise ValueError(
                f"torch op {NAMESPACE}::{name} is declared as {name}{declared.schema} "
                f"(out={declared.out!r}) and again as {name}{schema} (out={out!r}); one op "
                "name has one signature on every device: make the declarations agree"
            )
        return declared
    if fake is None and not schema.endswith("-> ()"):
        raise ValueError(f"torch op {name}{schema} returns tensors: give it a fake implementation")
    op = _declared[name] = TorchOp(name, schema, fake, out, autograd)
    return op
