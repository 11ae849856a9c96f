"""Helpers for weights in the Marlin format (the layout of :func:`gptq_marlin_gemm`).

Pure torch, so they run wherever the tensors live: the scale and zero-point
permutations that go with :func:`gptq_marlin_repack` / :func:`awq_marlin_repack`,
and the workspace the GEMM takes. Layouts are those of vLLM, sglang and the original
mllm-kernel: weights prepared by any of them work here and the other way round.

>>> s = torch.rand(4096 // 128, 4096, dtype=torch.float16)  # [groups, N]
>>> marlin_permute_scales(s, size_k=4096, size_n=4096, group_size=128).shape
torch.Size([32, 4096])
"""

from __future__ import annotations

import torch

from mllm_kernel.cuda.device_facts import device_facts
from mllm_kernel.jit_utils import op_inputs
from mllm_kernel.jit_utils.cuda_driver import require_torch_cuda

# The orders the kernels read (marlin_layout.cuh; tests/test_marlin_constants.py checks
# these against it). Grouped scales: inside each 64 columns, position 8 i + j holds
# column i + 8 j (the 8 columns one lane of the GEMM needs, contiguous). Per-channel
# scales: inside each 32 columns, position 8 i + j holds column 2 i + (0, 1, 8, 9, 16,
# 17, 24, 25)[j] (the columns of a lane's accumulator fragment).
SCALE_PERM = [i + 8 * j for i in range(8) for j in range(8)]
SCALE_PERM_SINGLE = [2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25)]
# The values of a packed word, from the low bits up, as the weights interleave them: 8
# (4-bit) or 4 (8-bit) to a word. Zero points (after SCALE_PERM) pack so, and AWQ packs
# the columns of its words so.
_WORD_ORDER = {4: [0, 2, 4, 6, 1, 3, 5, 7], 8: [0, 2, 1, 3]}


def marlin_make_workspace(device: torch.device | str | int) -> torch.Tensor:
    """The zeroed int32 workspace of :func:`gptq_marlin_gemm` for ``device``: one
    entry per SM. The GEMM leaves it zeroed again, so one workspace serves every
    call on one stream; calls on other streams, which may run at the same time, each
    need their own (the entries count a split's CTAs as they finish).

    >>> workspace = marlin_make_workspace("cuda")  # doctest: +SKIP
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"argument 'device': expected a CUDA device, got {device}")
    require_torch_cuda("marlin_make_workspace")
    index = torch.cuda.current_device() if device.index is None else device.index
    return torch.zeros(device_facts(index).sm_count, dtype=torch.int32, device=device)


def _check_sizes(size_k: int, size_n: int, group_size: int) -> tuple[int, int, int]:
    size_k = op_inputs.integer(size_k, "size_k")
    size_n = op_inputs.integer(size_n, "size_n")
    group_size = op_inputs.integer(group_size, "group_size")
    if size_k <= 0 or size_n <= 0 or size_n % 64:
        raise ValueError(
            f"size_k must be positive and size_n a positive multiple of 64, got "
            f"size_k={size_k}, size_n={size_n}"
        )
    if group_size != -1 and (group_size <= 0 or size_k % group_size):
        raise ValueError(
            f"argument 'group_size': expected -1 (per channel) or a divisor of size_k="
            f"{size_k}, got {group_size}"
        )
    return size_k, size_n, group_size


def marlin_permute_scales(
    s: torch.Tensor, size_k: int, size_n: int, group_size: int
) -> torch.Tensor:
    """Scales ``s`` ``[num_groups, size_n]`` (row g: group g; ``[1, size_n]`` for
    ``group_size=-1``) in the order :func:`gptq_marlin_gemm` reads them; a new
    contiguous tensor of the same shape and dtype.
    """
    s = op_inputs.tensor(s, "s")
    size_k, size_n, group_size = _check_sizes(size_k, size_n, group_size)
    groups = 1 if group_size in (-1, size_k) else size_k // group_size
    if s.dim() != 2 or tuple(s.shape) != (groups, size_n):
        raise ValueError(
            f"argument 's': expected shape [{groups}, {size_n}] (num_groups, size_n) for "
            f"size_k={size_k}, group_size={group_size}, got {list(s.shape)}"
        )
    perm = SCALE_PERM if groups > 1 else SCALE_PERM_SINGLE
    index = torch.tensor(perm, device=s.device)
    return s.reshape(-1, len(perm))[:, index].reshape(groups, size_n).contiguous()


# log2 of what dequant.cuh's Fp8Dequant leaves out of an fp8 e4m3 weight in each
# activation dtype: the difference of the exponent biases (fp16 15 - 7, bf16 127 - 7).
FP8_EXPONENT_GAP = {torch.float16: 8, torch.bfloat16: 120}


def fp8_fused_exponent_bias_into_scales(s: torch.Tensor) -> torch.Tensor:
    """Scales ``s`` (fp16 or bf16, the activations' dtype) of float8_e4m3fn weights times
    ``2**8`` (fp16) or ``2**120`` (bf16), as :func:`gptq_marlin_gemm` takes them: its fp8
    weights enter without the exponent bias, which the scales carry (vLLM's helper of this
    name, applied after :func:`marlin_permute_scales`). A new tensor; exact.

    >>> fp8_fused_exponent_bias_into_scales(torch.ones(1, 64, dtype=torch.float16))[0, 0]
    tensor(256., dtype=torch.float16)
    """
    s = op_inputs.tensor(s, "s")
    gap = FP8_EXPONENT_GAP.get(s.dtype)
    if gap is None:
        raise TypeError(f"argument 's': expected dtype float16 or bfloat16 but got {s.dtype}")
    return s * 2.0**gap


# log2 of what marlin_nvfp4.cuh's E2m1Dequant leaves out of an e2m1 weight in each
# activation dtype (fp16 15 - 1, bf16 127 - 1); NVFP4's global scale carries it, less the
# 2**7 that the scale bytes carry.
NVFP4_EXPONENT_GAP = {torch.float16: 14, torch.bfloat16: 126}


def nvfp4_marlin_process_scales(s: torch.Tensor) -> torch.Tensor:
    """NVFP4's e4m3 group scales ``s`` ``[size_k // 16, size_n]``, after
    :func:`marlin_permute_scales` (``group_size=16``), as :func:`gptq_marlin_gemm` takes
    them: float8_e4m3fn ``[size_k // 16, size_n]`` holding the bytes of vLLM's helper of
    this name (the original mllm-kernel's layout), a new tensor. Each scale becomes the
    byte "S0E5M3" of ``s * 2**7`` (its fp16 bits 14..7: no sign bit, so scales must be
    ``>= 0``); each pair of rows (``2 r``, ``2 r + 1``) becomes one of ``2 * size_n``
    bytes, 8 columns of row ``2 r`` then the same 8 of row ``2 r + 1``, and in each 4
    bytes the middle two swap (the order the kernels decode pairs in).

    ``s``: any float dtype holding e4m3 values (other values are rounded to e4m3 first);
    an even number of rows; ``size_n`` a multiple of 64.

    >>> nvfp4_marlin_process_scales(torch.ones(2, 64)).view(torch.uint8)[0, :2]
    tensor([176, 176], dtype=torch.uint8)
    """
    s = op_inputs.tensor(s, "s")
    if not s.is_floating_point():
        raise TypeError(f"argument 's': expected a floating-point dtype but got {s.dtype}")
    if s.dim() != 2 or s.shape[0] % 2 or s.shape[1] % 64:
        raise ValueError(
            "argument 's': expected shape [size_k // 16, size_n] with an even number of rows "
            f"(size_k a multiple of 32) and size_n a multiple of 64, got {list(s.shape)}"
        )
    e4m3 = s.to(torch.float8_e4m3fn).to(torch.float16)
    if bool((e4m3 < 0).any()) or bool(e4m3.isnan().any()):
        raise ValueError("argument 's': NVFP4 scales must be >= 0 (the kernel's have no sign)")
    # s * 2**7 is a normal fp16 number for every e4m3 value > 0 (and exact): its
    # exponent and top 3 mantissa bits are the byte.
    bits = (e4m3 * 2.0**7).view(torch.int16).to(torch.int32)
    codes = ((bits >> 7) & 0xFF).to(torch.uint8)
    rows, n = codes.shape
    codes = codes.reshape(rows // 2, 2, n // 8, 8).permute(0, 2, 1, 3).reshape(rows, n)
    codes = codes.reshape(-1, 4)[:, [0, 2, 1, 3]].reshape(rows, n)
    return codes.contiguous().view(torch.float8_e4m3fn)


def nvfp4_marlin_process_global_scale(global_scale: torch.Tensor) -> torch.Tensor:
    """NVFP4's global scale (fp16 or bf16, the activations' dtype; one value) as
    :func:`gptq_marlin_gemm` takes it: times ``2**7`` (fp16) or ``2**119`` (bf16), the
    exponent bias the kernel leaves out of e2m1 weights less what the scale bytes carry
    (vLLM's helper of this name), shape ``[1]``, a new tensor; exact.

    >>> nvfp4_marlin_process_global_scale(torch.tensor(0.5, dtype=torch.float16))
    tensor([64.], dtype=torch.float16)
    """
    global_scale = op_inputs.tensor(global_scale, "global_scale")
    gap = NVFP4_EXPONENT_GAP.get(global_scale.dtype)
    if gap is None:
        raise TypeError(
            "argument 'global_scale': expected dtype float16 or bfloat16 but got "
            f"{global_scale.dtype}"
        )
    if global_scale.numel() != 1:
        raise ValueError(
            f"argument 'global_scale': expected one value, got shape {list(global_scale.shape)}"
        )
    return global_scale.reshape(1) * 2.0 ** (gap - 7)


def marlin_zero_points(zp: torch.Tensor, size_k: int, size_n: int, num_bits: int) -> torch.Tensor:
    """Integer zero points ``zp`` ``[num_groups, size_n]`` (values ``0 .. 2**num_bits - 1``)
    packed as :func:`gptq_marlin_gemm` takes ``b_zeros`` for ``uint4`` / ``uint8``
    weights: int32 ``[num_groups, size_n * num_bits // 32]``.
    """
    zp = op_inputs.tensor(zp, "zp")
    size_k, size_n, _ = _check_sizes(size_k, size_n, -1)
    if num_bits not in _WORD_ORDER:
        raise ValueError(f"argument 'num_bits': expected 4 or 8, got {num_bits!r}")
    if zp.dim() != 2 or zp.shape[1] != size_n:
        raise ValueError(
            f"argument 'zp': expected shape [num_groups, {size_n}], got {list(zp.shape)}"
        )
    groups = zp.shape[0]
    permuted = zp.reshape(-1, 64)[:, torch.tensor(SCALE_PERM, device=zp.device)]
    interleave = _WORD_ORDER[num_bits]
    values = permuted.reshape(-1, len(interleave))[:, torch.tensor(interleave, device=zp.device)]
    values = values.to(torch.int64) & ((1 << num_bits) - 1)
    shifts = torch.arange(len(interleave), device=zp.device, dtype=torch.int64) * num_bits
    words = (values << shifts).sum(dim=1)
    words = torch.where(words >= 1 << 31, words - (1 << 32), words)
    return words.to(torch.int32).reshape(groups, size_n * num_bits // 32)


def awq_to_marlin_zero_points(
    q_zp_packed: torch.Tensor, size_k: int, size_n: int, num_bits: int
) -> torch.Tensor:
    """AWQ's packed zero points (int32 ``[num_groups, size_n // (32 // num_bits)]``, columns
    in AWQ's interleaved order) as :func:`gptq_marlin_gemm`'s ``b_zeros``."""
    q_zp_packed = op_inputs.tensor(q_zp_packed, "q_zp_packed")
    if num_bits not in _WORD_ORDER:
        raise ValueError(f"argument 'num_bits': expected 4 or 8, got {num_bits!r}")
    pack = 32 // num_bits
    order = _WORD_ORDER[num_bits]
    shifts = torch.tensor(
        [num_bits * order.index(c) for c in range(pack)], device=q_zp_packed.device
    )
    words = q_zp_packed.to(torch.int64) & 0xFFFFFFFF
    values = (words.unsqueeze(-1) >> shifts) & ((1 << num_bits) - 1)
    return marlin_zero_points(values.reshape(q_zp_packed.shape[0], -1), size_k, size_n, num_bits)


__all__ = [
    "FP8_EXPONENT_GAP",
    "NVFP4_EXPONENT_GAP",
    "SCALE_PERM",
    "SCALE_PERM_SINGLE",
    "awq_to_marlin_zero_points",
    "fp8_fused_exponent_bias_into_scales",
    "marlin_make_workspace",
    "marlin_permute_scales",
    "marlin_zero_points",
    "nvfp4_marlin_process_global_scale",
    "nvfp4_marlin_process_scales",
]
