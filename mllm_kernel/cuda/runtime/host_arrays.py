"""The slow path of a launch: NumPy arrays and scalars, and stream objects the native module
does not take directly, turned into what it does take.

A NumPy array for a pointer parameter is copied to the GPU before the launch and, for
a non-const pointer, copied back once the kernel has finished. Launches take this
path only after the fast path refused an argument, so calls without such values
never pay for looking at them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mllm_kernel.cuda.runtime.signature import Param

_KDLCUDA = 2  # DLPack's device type of CUDA memory


@dataclass
class Staged:
    """Arguments ready for the native module, and the NumPy arrays to fill after the kernel."""

    args: tuple[Any, ...]
    stream: Any
    copy_back: list[tuple[Any, torch.Tensor]] = field(default_factory=list)
    uploads: int = 0  # NumPy arrays copied to the GPU for this call

    def finish(self) -> None:
        """Copies device results into the NumPy arrays they came from (after a sync)."""
        for array, tensor in self.copy_back:
            array[...] = tensor.cpu().numpy().reshape(array.shape)


def stream_handle(stream: Any) -> Any:
    """A torch/CuPy stream (or anything with ``__cuda_stream__``) as its cudaStream_t int."""
    if stream is None or isinstance(stream, int):
        return stream
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    for attribute in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
        if hasattr(stream, attribute):
            return int(getattr(stream, attribute))
    raise TypeError(
        "stream must be a torch.cuda.Stream (or any object with __cuda_stream__), a "
        f"cudaStream_t as an int, or None; got {type(stream).__name__}"
    )


def _tensor_device(args: Sequence[Any]) -> int:
    """The GPU of the first CUDA array among ``args``, else torch's current device."""
    for arg in args:
        if isinstance(arg, torch.Tensor):
            if arg.is_cuda:
                return arg.device.index
        elif hasattr(type(arg), "__dlpack_device__"):
            device_type, index = arg.__dlpack_device__()
            if device_type == _KDLCUDA:
                return int(index)
    return torch.cuda.current_device()


def stage(args: Sequence[Any], params: Sequence[Param], stream: Any) -> Staged | None:
    """``args`` with NumPy values converted and ``stream`` as an int; None when there is
    nothing to convert (the fast path's error then stands)."""
    numpy = sys.modules.get("numpy")  # no NumPy imported: no NumPy values passed
    handle = stream_handle(stream)
    if numpy is None or len(args) != len(params):
        return Staged(tuple(args), handle) if handle is not stream else None
    device = None
    staged = Staged((), handle)
    converted = []
    for arg, param in zip(args, params, strict=True):
        if isinstance(arg, numpy.ndarray) and param.is_pointer:
            if device is None:
                device = _tensor_device(args)
            tensor = torch.from_numpy(numpy.ascontiguousarray(arg)).to(f"cuda:{device}")
            staged.uploads += 1
            if not param.const:
                staged.copy_back.append((arg, tensor))
            converted.append(tensor)
        elif isinstance(arg, numpy.generic | numpy.ndarray) and not param.is_pointer:
            converted.append(arg.item() if arg.size == 1 else arg)
        else:
            converted.append(arg)
    if all(a is b for a, b in zip(converted, args, strict=True)) and handle is stream:
        return None
    if device is not None:
        # The copies ran on torch's current stream; the kernel may run on another.
        torch.cuda.current_stream(device).synchronize()
    staged.args = tuple(converted)
    return staged
