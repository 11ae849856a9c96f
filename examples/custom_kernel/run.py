"""A custom kernel loaded the way a user would: ``python examples/custom_kernel/run.py``.

The module is compiled on the first call for each scale, cached under
``~/.cache/mllm_kernel`` (or ``$MLLM_KERNEL_CACHE_DIR``), and loaded from there by
every later process without running a compiler.
"""

from __future__ import annotations

from pathlib import Path

import torch

from mllm_kernel.jit_utils import cache_once, load_cpu_jit, make_cpp_args, register_kernel

SOURCE = Path(__file__).with_name("my_kernel.cpp")


# register_kernel lists the kernel (and its variants) in `mllm-kernel show-config`
# and lets `mllm-kernel precompile` build it ahead of time.
@register_kernel("my_kernel", device="cpu", variants=[(2,), (3,)])
@cache_once
def _jit_my_kernel_module(scale: int):
    args = make_cpp_args(scale)
    return load_cpu_jit(
        "my_kernel",
        *args,
        cpp_files=[str(SOURCE)],
        cpp_wrappers=[("my_kernel", f"my_namespace::my_kernel<{args}>")],
    )


def scale(x: torch.Tensor, factor: int) -> torch.Tensor:
    """``x * factor`` through the custom kernel (one compiled module per factor)."""
    out = torch.empty_like(x)
    _jit_my_kernel_module(factor).my_kernel(out, x)
    return out


def main() -> None:
    x = torch.randn(4, 5)
    y = scale(x, 3)
    torch.testing.assert_close(y, x * 3)
    print("scale(x, 3) matches x * 3:", y.shape)
    try:
        scale(x.double(), 3)
    except TypeError as error:  # the C++ check names the argument and the dtype
        print("float64 input:", error)


if __name__ == "__main__":
    main()
