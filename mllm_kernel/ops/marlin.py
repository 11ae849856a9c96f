"""W4A16 / W8A16 (integer, fp8 or NVFP4 weights) in the Marlin format: ``gptq_marlin_gemm``
and the repacks that bring GPTQ, AWQ, fp8 and NVFP4 checkpoints to its weight layout, with
the original mllm-kernel's signatures (those of vLLM and sglang)."""

from __future__ import annotations

import torch

from mllm_kernel.ops.op import Op, named


def gptq_marlin_gemm(
    a: torch.Tensor,
    c: torch.Tensor | None,
    b_q_weight: torch.Tensor,
    b_scales: torch.Tensor,
    global_scale: torch.Tensor | None,
    b_zeros: torch.Tensor | None,
    g_idx: torch.Tensor | None,
    perm: torch.Tensor | None,
    workspace: torch.Tensor,
    b_q_type_id: int,
    size_m: int,
    size_n: int,
    size_k: int,
    is_k_full: bool = True,
    use_atomic_add: bool = False,
    use_fp32_reduce: bool = False,
    is_zp_float: bool = False,
) -> torch.Tensor:
    """``a @ dequant(b)``, ``dequant(q) = (q - zero) * scale``, for weights in the Marlin format.

    - ``a``: fp16 or bf16 ``[size_m, size_k]``, rows contiguous and 16-byte aligned.
    - ``b_q_weight``: int32 ``[size_k // 16, size_n * 16 * bits // 32]`` from
      ``gptq_marlin_repack`` / ``awq_marlin_repack``; ``size_k`` a multiple of 16,
      ``size_n`` of 64.
    - ``b_scales``: ``a.dtype`` ``[num_groups, size_n]`` through
      ``marlin_permute_scales``; group size ``size_k // num_groups`` of -1 (one group),
      32, 64, 128 or a larger power of two.
    - ``b_q_type_id``: ``scalar_types.uint4b8.id`` / ``uint8b128.id`` (zero 8 / 128,
      ``b_zeros`` None or empty), or ``uint4.id`` / ``uint8.id`` with ``b_zeros``: int32
      ``[num_groups, size_n * bits // 32]`` from ``marlin_zero_points`` /
      ``awq_to_marlin_zero_points``, or with ``is_zp_float`` float zero points in
      ``a.dtype`` ``[num_groups, size_n]`` permuted like the scales (4-bit only); or
      ``float8_e4m3fn.id``: fp8 e4m3 bytes packed as 8-bit weights (``gptq_marlin_repack``
      with ``num_bits=8``), ``dequant(q) = fp8(q) * scale``, group size -1 or 128, the
      scales carrying the exponent bias (``fp8_fused_exponent_bias_into_scales``, after
      ``marlin_permute_scales``), no zero points, no act-order; or ``float4_e2m1f.id``
      (NVFP4): e2m1 codes packed as 4-bit weights (``gptq_marlin_repack`` with
      ``num_bits=4``), ``dequant(q) = e2m1(q) * scale * global_scale``, groups of 16
      (``size_k`` a multiple of 32), ``b_scales`` float8_e4m3fn ``[size_k // 16, size_n]``
      from ``marlin_permute_scales`` then ``nvfp4_marlin_process_scales`` (scales >= 0),
      ``global_scale`` ``a.dtype``, one value (``[1]`` or 0-d) from
      ``nvfp4_marlin_process_global_scale``, no
      zero points, no act-order.
    - Act-order: ``g_idx`` (the group of each row, in Marlin row order: sorted) and
      ``perm`` (the repack's permutation), int32 ``[size_k]`` each, or both empty/None.
      ``is_k_full=False`` (K split over ranks) lifts the check that the groups divide K.
      Group indices must lie in ``[0, num_groups)`` and ``perm``'s in ``[0, size_k)``
      (they are clamped, not checked). Not with zero points, fp8 nor NVFP4.
    - ``workspace``: int32, one entry per SM at least (``marlin_make_workspace``), zero
      between calls (left zero). Its entries count the CTAs of a split's slices, so
      calls that may run at the same time (on different streams) need a workspace each,
      as with the original's: two such calls on one workspace, or one that is not zero,
      give wrong results.
    - ``global_scale``: NVFP4's (above), None or empty for the others. ``use_atomic_add`` and
      ``use_fp32_reduce`` are accepted for compatibility: partial sums are always
      reduced in fp32, in a fixed order (run to run identical results).
    - ``c``: the output ``[size_m, size_n]`` in ``a.dtype`` (allocated when None),
      contiguous, starting on a 4-byte boundary; ``b_q_weight``, ``b_scales`` and float
      ``b_zeros`` start on 16-byte ones (8 for NVFP4's scales), as torch allocates them.

    Raises TypeError (a dtype) or ValueError naming the argument for bad inputs.
    """


# scalar_types.float4_e2m1f.id (mllm_kernel.cuda.jit.scalar_type: a device package, which
# this module does not import; tests/test_marlin.py checks the copy): NVFP4 weights, the
# only ones that take a global scale.
_FLOAT4_E2M1F_ID = 562949953487106


def _global_scale_only_for_nvfp4(global_scale: torch.Tensor | None, b_q_type_id: int) -> None:
    # Refused here, whatever the device; NVFP4's global scale itself (given, its shape and
    # dtype) is the kernels' to check.
    if global_scale is not None and global_scale.numel() and b_q_type_id != _FLOAT4_E2M1F_ID:
        raise ValueError(
            "argument 'global_scale': only float4_e2m1f (NVFP4) weights take a global scale; "
            "pass None or an empty tensor"
        )


def gptq_marlin_repack(
    b_q_weight: torch.Tensor, perm: torch.Tensor | None, size_k: int, size_n: int, num_bits: int
) -> torch.Tensor:
    """GPTQ-packed weights in the Marlin layout, for ``gptq_marlin_gemm``.

    ``b_q_weight``: int32 ``[size_k // (32 // num_bits), size_n]``, value k of column n
    at bits ``(k % pack) * num_bits`` of row ``k // pack``. ``perm``: int32 ``[size_k]``
    (act-order: Marlin row k takes input row ``perm[k]``, values in ``[0, size_k)``: others
    are refused, or, while a CUDA graph captures, where they cannot be read, clamped), or
    None / an empty tensor. ``num_bits`` 4 or 8; ``size_k`` a multiple of 16, ``size_n``
    of 64. Returns int32 ``[size_k // 16, size_n * 16 // pack]``, bit-identical to
    vLLM's, sglang's and the original mllm-kernel's.
    """


def awq_marlin_repack(
    b_q_weight: torch.Tensor, size_k: int, size_n: int, num_bits: int
) -> torch.Tensor:
    """AWQ-packed weights in the Marlin layout, for ``gptq_marlin_gemm``.

    ``b_q_weight``: int32 ``[size_k, size_n // (32 // num_bits)]`` in AWQ's column
    order inside a word (4-bit: columns 0, 2, 4, 6, 1, 3, 5, 7 from the low bits up).
    ``num_bits`` 4 or 8; ``size_k`` a multiple of 16, ``size_n`` of 64. Returns int32
    ``[size_k // 16, size_n * 16 // pack]``; zero points go through
    ``awq_to_marlin_zero_points``.
    """


def marlin_repacked_empty(
    b_q_weight: torch.Tensor, size_k: int, size_n: int, num_bits: int
) -> torch.Tensor:
    """A new tensor of the shape and dtype the repacks return (their fake)."""
    return b_q_weight.new_empty((size_k // 16, size_n * num_bits // 2), dtype=torch.int32)


GPTQ_MARLIN_GEMM = Op(
    gptq_marlin_gemm,
    out="c",
    # Split-K counters, left zeroed: written during the call.
    writes=("workspace",),
    fake=named(lambda a, size_m, size_n: a.new_empty((size_m, size_n))),
    # Sizes a traced graph passes on (size_m is x.shape[0]).
    symbolic=("size_m", "size_n", "size_k"),
    check=_global_scale_only_for_nvfp4,
)
GPTQ_MARLIN_REPACK = Op(
    gptq_marlin_repack,
    fake=named(marlin_repacked_empty),
    symbolic=("size_k", "size_n"),
)
AWQ_MARLIN_REPACK = Op(
    awq_marlin_repack, fake=named(marlin_repacked_empty), symbolic=("size_k", "size_n")
)
