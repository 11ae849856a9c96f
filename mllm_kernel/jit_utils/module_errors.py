"""Argument errors of a user's module that name the C++ parameter.

tvm-ffi checks each argument of an exported function against its C++ type and says
``Mismatched type on argument #1 when calling: `my_kernel(0: DLTensor*, 1: DLTensor*)
-> void`. Expected `DLTensor*` but got `ffi.Array```: the position, counted from 0, and
tvm-ffi's names for the types. :func:`name_arguments` makes the exports of a module
that :func:`~mllm_kernel.jit_utils.load_cpu_jit` / ``load_cuda_jit`` return say instead
which parameter it is (its C++ name and type, read from the declaration in the user's
source), what came, and what to pass::

    my_kernel(out, x): argument 'x' (the 2nd, C++ tvm::ffi::TensorView) must be a
    tensor, got list. Pass a torch.Tensor (torch.tensor(...) or torch.as_tensor(...)
    make one of a list) or another DLPack array (numpy, cupy, jax).
      my_kernel wraps my_namespace::my_kernel<3>, declared at .../my_kernel.cpp:9

A call that succeeds costs one Python call more than the bare tvm-ffi function (the
error is worked out only when one is raised). The package's own ops do not go through
this: they call the tvm-ffi functions directly
(:class:`~mllm_kernel.jit_utils.kernel_module.Exports`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import tvm_ffi

from mllm_kernel.jit_utils.cpp_declarations import Declaration, find_declarations, function_name
from mllm_kernel.jit_utils.spec import BuildSpec, Wrapper

_MISMATCHED_TYPE = re.compile(
    r"Mismatched type on argument #(?P<index>\d+) when calling: `(?P<signature>[^`]*)`\. "
    r"Expected `(?P<expected>[^`]*)` but got `[^`]*`"
)
_MISMATCHED_COUNT = re.compile(
    r"Mismatched number of arguments when calling: `(?P<signature>[^`]*)`\. "
    r"Expected (?P<expected>\d+) but got (?P<got>\d+) arguments"
)
_SIGNATURE_PARAMETER = re.compile(r"(?:\(|, )\d+: ")  # "(0: " or ", 1: "
_TENSOR_ADVICE = (
    " Pass a torch.Tensor (torch.tensor(...) or torch.as_tensor(...) make one of a list) "
    "or another DLPack array (numpy, cupy, jax)."
)
# tvm-ffi's name of a parameter type -> what a Python caller passes for it.
_PYTHON_VALUE = {
    "int": "a Python int",
    "float": "a Python float (or int)",
    "bool": "a Python bool",
    "str": "a Python str",
}


def _ordinal(index: int) -> str:
    """``0`` -> ``"1st"``: the position a Python caller counts."""
    number = index + 1
    suffix = {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{'th' if 10 <= number % 100 <= 20 else suffix}"


def _type_name(value: Any) -> str:
    kind = type(value)
    if kind.__module__ == "builtins":
        return kind.__name__
    return f"{kind.__module__}.{kind.__qualname__}"


def _what_to_pass(expected: str, value: Any) -> str:
    """``"must be <what a parameter of tvm-ffi type expected takes>, got <type>."`` and,
    for a tensor, how to make one."""
    optional = re.fullmatch(r"Optional<(.*)>", expected)
    inner = optional[1] if optional else expected
    if "Tensor" in inner:
        kind, advice = "a tensor", _TENSOR_ADVICE
    else:
        kind, advice = _PYTHON_VALUE.get(inner, f"a value tvm-ffi converts to {inner}"), ""
    either = " or None" if optional else ""
    return f"must be {kind}{either}, got {_type_name(value)}.{advice}"


def _declaration(spec: BuildSpec, wrapper: Wrapper, arity: int) -> Declaration | None:
    """The declaration of the function ``wrapper`` exports, with ``arity`` parameters."""
    name = function_name(wrapper.expression)
    if name is None:
        return None
    files = spec.cuda_files if wrapper in spec.cuda_wrappers else spec.cpp_files
    for declaration in find_declarations(name, files, spec.include_paths):
        if len(declaration.parameters) == arity:
            return declaration
    return None


def explain(exc: TypeError, args: tuple[Any, ...], spec: BuildSpec, wrapper: Wrapper) -> str | None:
    """The message for tvm-ffi's argument error ``exc`` of a call of ``wrapper`` with
    ``args``, naming the parameter; None for any other error (the kernel's own checks)."""
    text = str(exc)
    mismatch = _MISMATCHED_TYPE.search(text) or _MISMATCHED_COUNT.search(text)
    if mismatch is None:
        return None
    arity = len(_SIGNATURE_PARAMETER.findall(mismatch["signature"]))
    declaration = _declaration(spec, wrapper, arity)
    if declaration is not None:
        names = [p.name or f"<{p.type}>" for p in declaration.parameters]
        where = f"{wrapper.expression}, declared at {declaration.where()}: {declaration.text}"
    else:  # tvm-ffi's own names of the types: "f(0: DLTensor*, 1: int) -> void"
        signature = mismatch["signature"]
        inside = signature[signature.find("(") + 1 : signature.rfind(")")]
        names = re.split(r"(?:^|, )\d+: ", inside)[1:]
        where = f"{wrapper.expression} (its declaration was not found in the sources)"
    call = f"{wrapper.export_name}({', '.join(names)})"
    context = f"\n  {wrapper.export_name} of module {spec.name!r} wraps {where}"
    if "index" not in mismatch.groupdict():
        return (
            f"{call} takes {mismatch['expected']} argument(s), got {mismatch['got']}: pass them "
            f"by position, in this order.{context}"
        )
    index = int(mismatch["index"])
    if index >= len(args):
        return None
    parameter = declaration.parameters[index] if declaration is not None else None
    cpp_type = parameter.type if parameter else mismatch["expected"]
    if parameter and parameter.name:
        argument = f"argument {parameter.name!r} (the {_ordinal(index)}, C++ {cpp_type})"
    else:
        argument = f"the {_ordinal(index)} argument (C++ {cpp_type})"
    passed = _what_to_pass(mismatch["expected"], args[index])
    return f"{call}: {argument} {passed}{context}"


def _explained(
    function: Callable[..., Any], spec: BuildSpec, wrapper: Wrapper
) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except TypeError as exc:
            message = explain(exc, args, spec, wrapper)
            if message is None:
                raise
            raise TypeError(message) from None

    call.__name__ = call.__qualname__ = wrapper.export_name
    call.__doc__ = f"{wrapper.expression} from module {spec.name!r} (tvm-ffi function: .function)"
    call.function = function  # type: ignore[attr-defined]
    return call


def name_arguments(module: Any, spec: BuildSpec) -> Any:
    """``module`` with each export, read as an attribute (``module.my_kernel``), raising
    argument errors that name the C++ parameter (:func:`explain`); ``module.get_function``
    still gives the bare tvm-ffi function. Anything but a tvm-ffi module (the spec the
    loader hands back while a builder's spec is read) is returned as it is."""
    if not isinstance(module, tvm_ffi.Module):
        return module
    for wrapper in (*spec.cpp_wrappers, *spec.cuda_wrappers):
        function = module.get_function(wrapper.export_name)
        setattr(module, wrapper.export_name, _explained(function, spec, wrapper))
    return module
