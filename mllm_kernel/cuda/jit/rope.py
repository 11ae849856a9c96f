"""Rotary position embedding (neox and gptj styles) from a cos/sin cache, in place."""

from __future__ import annotations

import torch

from mllm_kernel.jit_utils import op_inputs
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.jit_utils.torch_op import refuse_grad, torch_op

_tracing = torch.compiler.is_dynamo_compiling

_ROPE = KernelModule("rope", device="cuda", sources=["rope.cu"], exports=["apply_rope_inplace"])


def apply_rope_with_cos_sin_cache_inplace(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> None:
    """Rotates ``query`` and ``key`` in place by the angles of ``positions``.

    ``query`` ``[tokens, q_heads * head_size]`` (or ``[tokens, q_heads, head_size]``),
    ``key`` likewise with its own head count, fp32/fp16/bf16; rows may be strided.
    ``cos_sin_cache`` is float32 ``[max_pos, rot_dim]``: cos in the first half, sin
    in the second; ``rot_dim <= head_size`` (partial rotary leaves the rest alone).
    ``positions`` int64 or int32 ``[tokens]``; a token whose position is outside
    ``[0, max_pos)`` is left unrotated. ``is_neox``: pairs ``(i, i + rot_dim/2)``,
    else gptj pairs ``(2i, 2i + 1)``.

    >>> apply_rope_with_cos_sin_cache_inplace(pos, q, k, 128, cache)  # doctest: +SKIP
    """
    if _tracing():
        return ROPE_OP(positions, query, key, head_size, cos_sin_cache, is_neox)
    positions = op_inputs.tensor(positions, "positions")
    query = op_inputs.output(query, "query")
    key = op_inputs.output(key, "key")
    cos_sin_cache = op_inputs.tensor(cos_sin_cache, "cos_sin_cache")
    head_size = op_inputs.integer(head_size, "head_size")
    refuse_grad("apply_rope_with_cos_sin_cache_inplace", query, key, cos_sin_cache)
    try:
        _ROPE[query.get_device()].apply_rope_inplace(
            positions, query, key, cos_sin_cache, head_size, bool(is_neox)
        )
    except Exception as error:
        op_inputs.explain(
            error, "cuda", positions=positions, query=query, key=key, cos_sin_cache=cos_sin_cache
        )
        raise


ROPE_OP = torch_op(
    "apply_rope_with_cos_sin_cache_inplace",
    "(Tensor positions, Tensor(a!) query, Tensor(b!) key, int head_size, "
    "Tensor cos_sin_cache, bool is_neox=True) -> ()",
).implement("cuda", apply_rope_with_cos_sin_cache_inplace)
