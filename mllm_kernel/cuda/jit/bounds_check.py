"""MLLM_KERNEL_CHECK_BOUNDS=1 for the KV-cache ops: a device counter the kernel bumps for
each out-of-range index, read (and raised as IndexError) after the kernel."""

from __future__ import annotations

import torch


def error_counter(like: torch.Tensor) -> torch.Tensor:
    """A zeroed int32 counter on ``like``'s device.

    Callers test ``env.check_bounds()`` themselves and build no message unless it is
    set: these ops run once per decode step, where every Python call counts.
    """
    return torch.zeros(1, dtype=torch.int32, device=like.device)


def raise_if_counted(errors: torch.Tensor, message: str) -> None:
    """IndexError with ``message`` (``{count}`` filled in) when the counter is not zero."""
    # Reading the counter synchronises; it is skipped while a CUDA graph is captured,
    # where the kernel still refuses every out-of-range write.
    if torch.cuda.is_current_stream_capturing():
        return
    count = int(errors.item())
    if count:
        raise IndexError(message.format(count=count))
