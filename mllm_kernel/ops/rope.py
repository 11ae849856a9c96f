"""Rotary position embedding from a cos/sin cache, applied in place."""

from __future__ import annotations

import torch

from mllm_kernel.ops.op import Op


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
    """


APPLY_ROPE = Op(apply_rope_with_cos_sin_cache_inplace, writes=("query", "key"))
