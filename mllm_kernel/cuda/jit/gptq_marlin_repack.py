"""``gptq_marlin_repack`` (the original mllm-kernel's module path): GPTQ-packed
weights to the Marlin layout of :func:`mllm_kernel.cuda.jit.gptq_marlin_gemm`."""

from __future__ import annotations

import torch

from mllm_kernel.jit_utils import op_inputs
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.jit_utils.torch_op import torch_op

_tracing = torch.compiler.is_dynamo_compiling

_REPACK = KernelModule(
    "gptq_marlin_repack",
    device="cuda",
    sources=["marlin_repack.cu"],
    exports=["gptq_marlin_repack"],
)


def check_repack_sizes(size_k: object, size_n: object, num_bits: object) -> tuple[int, int, int]:
    """``size_k``, ``size_n``, ``num_bits`` as ints the Marlin layout can hold; ValueError
    (TypeError for a non-int) naming the argument otherwise."""
    size_k = op_inputs.integer(size_k, "size_k")
    size_n = op_inputs.integer(size_n, "size_n")
    num_bits = op_inputs.integer(num_bits, "num_bits")
    if num_bits not in (4, 8):
        raise ValueError(f"argument 'num_bits': expected 4 or 8, got {num_bits}")
    if size_k <= 0 or size_k % 16:
        raise ValueError(
            f"argument 'size_k': expected a positive multiple of 16 (Marlin tiles are 16 k "
            f"x 64 n), got {size_k}"
        )
    if size_n <= 0 or size_n % 64:
        raise ValueError(
            f"argument 'size_n': expected a positive multiple of 64 (Marlin tiles are 16 k "
            f"x 64 n), got {size_n}"
        )
    return size_k, size_n, num_bits


def check_packed(b_q_weight: torch.Tensor, shape: tuple[int, int], layout: str) -> None:
    """TypeError/ValueError unless ``b_q_weight`` is an int32 tensor of ``shape``."""
    if b_q_weight.dtype != torch.int32:
        raise TypeError(f"argument 'b_q_weight': expected dtype int32 but got {b_q_weight.dtype}")
    if tuple(b_q_weight.shape) != shape:
        raise ValueError(
            f"argument 'b_q_weight': expected shape {list(shape)} ({layout}) but got "
            f"{list(b_q_weight.shape)}"
        )


def _check_perm(perm: torch.Tensor | None, size_k: int) -> torch.Tensor | None:
    """The act-order permutation as the kernel takes it; None for none (empty)."""
    if perm is None or perm.numel() == 0:
        return None
    if perm.dtype != torch.int32:
        raise ValueError(f"argument 'perm': expected dtype int32 but got {perm.dtype}")
    if tuple(perm.shape) != (size_k,):
        raise ValueError(
            f"argument 'perm': expected shape [{size_k}] (size_k) or an empty tensor, got "
            f"{list(perm.shape)}"
        )
    if not torch.cuda.is_current_stream_capturing() and bool(((perm < 0) | (perm >= size_k)).any()):
        raise ValueError(f"argument 'perm': values must lie in [0, {size_k})")
    return perm.contiguous()


def gptq_marlin_repack(
    b_q_weight: torch.Tensor,
    perm: torch.Tensor | None,
    size_k: int,
    size_n: int,
    num_bits: int,
) -> torch.Tensor:
    """GPTQ-packed weights in the Marlin layout, for :func:`gptq_marlin_gemm`.

    ``b_q_weight``: int32 ``[size_k // (32 // num_bits), size_n]``, value k of column n
    at bits ``(k % pack) * num_bits`` of row ``k // pack``. ``perm``: int32 ``[size_k]``
    (act-order: Marlin row k takes input row ``perm[k]``), or None / an empty tensor.
    ``num_bits`` 4 or 8; ``size_k`` a multiple of 16, ``size_n`` of 64. Returns int32
    ``[size_k // 16, size_n * 16 // pack]``, bit-identical to vLLM's, sglang's and the
    original mllm-kernel's. Runs on the GPU of ``b_q_weight``.

    >>> q = torch.randint(0, 2**31, (4096 // 8, 4096), dtype=torch.int32, device="cuda")
    >>> gptq_marlin_repack(q, None, 4096, 4096, 4).shape  # doctest: +SKIP
    torch.Size([256, 8192])
    """
    if _tracing():
        return GPTQ_MARLIN_REPACK_OP(b_q_weight, perm, size_k, size_n, num_bits)
    b_q_weight = op_inputs.tensor(b_q_weight, "b_q_weight")
    perm = op_inputs.optional_tensor(perm, "perm")
    size_k, size_n, num_bits = check_repack_sizes(size_k, size_n, num_bits)
    pack = 32 // num_bits
    check_packed(b_q_weight, (size_k // pack, size_n), "GPTQ: size_k // (32 // num_bits), size_n")
    try:
        module = _REPACK[b_q_weight.get_device()]
        perm = _check_perm(perm, size_k)
        out = torch.empty(
            (size_k // 16, size_n * 16 // pack), dtype=torch.int32, device=b_q_weight.device
        )
        module.gptq_marlin_repack(b_q_weight.contiguous(), perm, out, size_k, size_n, num_bits)
    except Exception as error:
        op_inputs.explain(error, "cuda", b_q_weight=b_q_weight, perm=perm)
        raise
    return out


def marlin_repacked_empty(
    b_q_weight: torch.Tensor, size_k: int, size_n: int, num_bits: int
) -> torch.Tensor:
    """A new tensor of the shape and dtype the repacks return (their fake implementation)."""
    return b_q_weight.new_empty((size_k // 16, size_n * num_bits // 2), dtype=torch.int32)


GPTQ_MARLIN_REPACK_OP = torch_op(
    "gptq_marlin_repack",
    "(Tensor b_q_weight, Tensor? perm, SymInt size_k, SymInt size_n, int num_bits) -> Tensor",
    fake=lambda b_q_weight, perm, size_k, size_n, num_bits: marlin_repacked_empty(
        b_q_weight, size_k, size_n, num_bits
    ),
).implement("cuda", gptq_marlin_repack)


__all__ = ["gptq_marlin_repack"]
