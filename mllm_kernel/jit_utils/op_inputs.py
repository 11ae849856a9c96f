"""Argument checks that every op wrapper (CPU and CUDA) runs before calling its kernel.

The C++ side checks shapes, dtypes, strides and devices (``tensor.hpp``). What it
cannot see, because DLPack does not carry it or because the conversion to DLPack
fails first with a message about torch's internals, is checked here:

* a non-tensor where a tensor belongs (TypeError naming the argument). Any other
  DLPack tensor (a numpy array for CPU ops, a CuPy or JAX array for CUDA ops) is
  taken as a torch view of the same memory (``torch.from_dlpack``, no copy), so an
  op's results are torch tensors, whatever the caller passed. One with negative strides
  (``a[::-1]``), which ``torch.from_dlpack`` would abort the process on, is refused
  (ValueError naming the argument);
* a tensor with the negative bit (``x.conj().imag``): DLPack exports the raw
  values, so an input is resolved (``resolve_neg()``) and an output refused;
  conjugate views are complex, which no kernel accepts (the dtype check says so);
* a scalar that is not a number (TypeError; ``bool`` is not a number here) or beyond a
  float's range (OverflowError), a dtype argument that is not a dtype or not one the op
  takes (TypeError);
* a ``dim`` out of range (IndexError, as torch raises it, naming the argument);
* and, once a call failed: a meta, sparse, quantized or nested tensor, or one on
  the wrong kind of device, explained by :func:`explain` (ValueError naming the
  argument) instead of a RuntimeError from inside torch or tvm-ffi.

The first four run on every call, so each has a fast path for the common case
(an exact ``torch.Tensor`` / ``float`` / ``int``) that costs one or two attribute
reads; the last runs only on a failure. A new op's wrapper reads::

    from mllm_kernel.jit_utils import op_inputs

    def my_op(x, scale=1.0, out=None):
        x = op_inputs.tensor(x, "x")
        scale = op_inputs.number(scale, "scale")
        out = torch.empty_like(x) if out is None else op_inputs.output(out, "out")
        try:
            _MY_OP[x.get_device()].my_op(out, x, scale)  # a KernelModule; CPU: _MY_OP[()]
        except Exception as error:
            op_inputs.explain(error, "cuda", x=x, out=out)
            raise
        return out
"""

from __future__ import annotations

import numbers
import sys
from typing import Any

import torch

_Tensor = torch.Tensor


# --------------------------------------------------------------------------- tensors
def tensor(value: Any, arg: str) -> torch.Tensor:
    """``value`` as an input tensor: TypeError if it is not a tensor; a negative view is
    resolved (copied) so that the kernel reads the values torch shows.

    >>> tensor(torch.tensor([1 + 1j]).conj().imag, "x")
    tensor([-1.])
    """
    if type(value) is _Tensor and not value.is_neg():
        return value
    return _slow_tensor(value, arg, output=False)


def output(value: Any, arg: str) -> torch.Tensor:
    """``value`` as a tensor the kernel writes: TypeError if it is not a tensor,
    ValueError for a negative view (writing through it would store negated values)."""
    if type(value) is _Tensor and not value.is_neg():
        return value
    return _slow_tensor(value, arg, output=True)


def optional_tensor(value: Any, arg: str) -> torch.Tensor | None:
    """Like :func:`tensor`, with ``None`` passed through."""
    return None if value is None else tensor(value, arg)


def _slow_tensor(value: Any, arg: str, output: bool) -> torch.Tensor:
    if not isinstance(value, _Tensor):
        if not hasattr(value, "__dlpack__") or isinstance(value, type):
            raise TypeError(
                f"argument '{arg}': expected a torch.Tensor (or a DLPack tensor such as a "
                f"numpy array) but got {_type_name(value)}"
            )
        if output and not getattr(getattr(value, "flags", None), "writeable", True):
            raise ValueError(
                f"argument '{arg}': a read-only {_type_name(value)} cannot be written; pass "
                "a writable array"
            )
        if _reversed(value):
            raise ValueError(
                f"argument '{arg}': a {_type_name(value)} with negative strides (a reversed "
                "view such as a[::-1]) cannot be shared with torch; pass a contiguous copy "
                "(np.ascontiguousarray(a), or a.copy())"
            )
        try:
            return torch.from_dlpack(value)  # the same memory: an output is written through
        except Exception as error:  # an unsupported dtype or device
            raise TypeError(
                f"argument '{arg}': {_type_name(value)} cannot be shared with torch through "
                f"DLPack ({error}); pass a torch.Tensor"
            ) from None
    if value.is_neg():
        if output:
            raise ValueError(
                f"argument '{arg}': a negative view (for example x.conj().imag) cannot be "
                "written through; pass a plain tensor and negate afterwards"
            )
        return value.resolve_neg()
    return value  # a subclass such as torch.nn.Parameter


def _reversed(value: Any) -> bool:
    """Whether an array (numpy, CuPy: ``strides`` in bytes) steps backwards along a dim
    of more than one element. DLPack can describe that, but torch.from_dlpack aborts the
    process on it (a C++ exception it does not catch), so it must be refused first."""
    strides, shape = getattr(value, "strides", None), getattr(value, "shape", None)
    if not isinstance(strides, tuple) or not isinstance(shape, tuple):
        return False
    return any(isinstance(s, int) and s < 0 and n > 1 for n, s in zip(shape, strides, strict=False))


# --------------------------------------------------------------------------- scalars
def number(value: Any, arg: str) -> float:
    """``value`` as a float: an int or float (numpy scalars too), not a bool or a str.

    >>> number(2, "eps")
    2.0
    """
    if type(value) is float:
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            text = str(value)
            shown = text if len(text) <= 24 else f"{text[:19]}... ({len(text)} digits)"
            raise OverflowError(
                f"argument '{arg}': {shown} is out of range for a float (magnitude at most "
                f"{sys.float_info.max:e})"
            ) from None
    raise TypeError(f"argument '{arg}': expected a number but got {_type_name(value)}")


def integer(value: Any, arg: str) -> int:
    """``value`` as an int: any integer type, not a bool, a float or a str.

    >>> integer(128, "head_size")
    128
    """
    if type(value) is int:
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    raise TypeError(f"argument '{arg}': expected an int but got {_type_name(value)}")


def boolean(value: Any, arg: str) -> bool:
    """``value`` as a bool: a bool or a numpy bool, not an int (``0``/``1`` mean a
    count elsewhere) or anything else that merely has a truth value.

    >>> boolean(True, "is_neox")
    True
    """
    if type(value) is bool:
        return value
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):
        return bool(value)
    raise TypeError(f"argument '{arg}': expected a bool but got {_type_name(value)}")


def dtype(value: Any, arg: str, allowed: tuple[torch.dtype, ...] | None = None) -> torch.dtype:
    """``value`` as a torch dtype, one of ``allowed`` when given: TypeError for anything
    else (a string, a numpy dtype, a dtype outside ``allowed``). A wrong dtype is a
    TypeError wherever it is found, as the kernels' dtype checks raise it (tensor.hpp).

    >>> dtype(torch.float32, "scale_dtype", allowed=(torch.float32,))
    torch.float32
    """
    if isinstance(value, torch.dtype) and (allowed is None or value in allowed):
        return value
    if allowed is None:
        raise TypeError(f"argument '{arg}': expected a torch.dtype but got {_type_name(value)}")
    got = value if isinstance(value, torch.dtype) else _type_name(value)
    expected = " or ".join(str(d) for d in allowed)
    raise TypeError(f"argument '{arg}': expected {expected} but got {got}")


def dim(value: Any, ndim: int, arg: str = "dim") -> int:
    """``value`` as a dim of a tensor of rank ``ndim``, in ``[0, ndim)``; IndexError when
    out of range (torch's own type for it), TypeError when not an int.

    >>> dim(-1, 3)
    2
    """
    value = integer(value, arg)
    low, high = -max(ndim, 1), max(ndim, 1) - 1
    if not low <= value <= high:
        raise IndexError(
            f"argument '{arg}': dimension out of range (expected to be in range of "
            f"[{low}, {high}], but got {value})"
        )
    return value % max(ndim, 1)


# --------------------------------------------------------------------------- failures
def unsupported(value: torch.Tensor, device: str) -> str | None:
    """Why a kernel for ``device`` (``"cpu"`` or ``"cuda"``) cannot take ``value``,
    or None if it can as far as its kind goes (the kernel checks the rest)."""
    if value.is_meta:
        return f"expected a tensor on {device} but got a meta tensor (it has no data)"
    if value.layout is not torch.strided:
        return f"expected a strided (dense) tensor but got layout {value.layout}; call .to_dense()"
    if value.is_quantized:
        return "quantized tensors are not supported; call .dequantize()"
    if value.is_nested:
        return "nested tensors are not supported; pass each component or a padded tensor"
    kind = value.device.type
    if kind != device:
        return f"expected a tensor on {device} but got one on {value.device}"
    return None


def check_device(device: str, **tensors: Any) -> None:
    """ValueError naming the first of ``tensors`` (name=value) that a ``device`` kernel
    cannot take (see :func:`unsupported`); None values are skipped. The slow path of
    :func:`explain`, and what CUDA ops call before choosing an arch or compiling.

    A tensor on the other kind of device gets a pointer to the op of the same name
    there, where the package has one (``mllm_kernel.cpu.jit.rmsnorm`` for a CPU tensor
    given to ``mllm_kernel.cuda.jit.rmsnorm``)."""
    for arg, value in tensors.items():
        if isinstance(value, _Tensor):
            reason = unsupported(value, device)
            if reason:
                raise ValueError(f"argument '{arg}': {reason}{_same_op_on(value.device.type)}")


def explain(error: BaseException, device: str, **tensors: Any) -> None:
    """From an op's ``except`` clause: raises a ValueError naming the argument when one
    of ``tensors`` is of a kind the kernel cannot take (the real cause of ``error``),
    else returns so that the caller re-raises ``error`` unchanged.

    The clear error replaces ``error`` (``from None``): that one is torch's or tvm-ffi's
    account of the same problem, often with a C++ stack trace. An IndexError (a ``dim``
    out of range, checked by the kernel function where it needs the tensor's rank) is
    the caller's mistake on any device and stays.
    """
    if isinstance(error, IndexError):  # a dim out of range: named already, whatever the device
        return
    try:
        check_device(device, **tensors)
    except ValueError as clear:
        raise clear from None


_OP_PACKAGES = {"cpu": "mllm_kernel.cpu.jit", "cuda": "mllm_kernel.cuda.jit"}


def _same_op_on(device: str) -> str:
    """``"; for cpu tensors call mllm_kernel.cpu.jit.<op>"`` when the public op being
    called (found on the call stack: this runs only on a failure) exists for ``device``
    too, else ``""``."""
    import importlib

    package_name = _OP_PACKAGES.get(device)
    if package_name is None:
        return ""
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        caller = next((p for p in _OP_PACKAGES.values() if module.startswith(p + ".")), None)
        name = frame.f_code.co_name
        if caller is not None and name in importlib.import_module(caller).__all__:
            if caller != package_name and name in importlib.import_module(package_name).__all__:
                return f"; for {device} tensors call {package_name}.{name}"
            return ""
        frame = frame.f_back
    return ""


def _type_name(value: Any) -> str:
    return "None" if value is None else type(value).__name__
