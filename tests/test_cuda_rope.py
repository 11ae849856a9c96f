"""CUDA apply_rope_with_cos_sin_cache_inplace against a float64 reference."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.cuda

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}
MAX_POS = 4096


def _cos_sin_cache(rot_dim, max_pos=MAX_POS, base=10000.0):
    """As in sglang / vLLM: [max_pos, rot_dim] float32, cos half then sin half."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).float().cuda()


def _rope_ref(positions, x, head_size, cache, is_neox):
    """x [tokens, heads * head_size] rotated in float64 (partial rotary: first rot_dim)."""
    rot_dim = cache.shape[1]
    half = rot_dim // 2
    cos = cache[positions.long(), :half].double()[:, None, :]
    sin = cache[positions.long(), half:].double()[:, None, :]
    y = x.double().reshape(x.shape[0], -1, head_size).clone()
    r = y[..., :rot_dim]
    if is_neox:
        x1, x2 = r[..., :half], r[..., half:]
        rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    else:
        x1, x2 = r[..., 0::2], r[..., 1::2]
        rotated = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    y[..., :rot_dim] = rotated
    return y.reshape(x.shape)


def _close(out, ref):
    tol = TOL[out.dtype]
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)


def test_reference_gptj_pairs_adjacent_elements():
    # One head, rot_dim 4, angle pi/2 at position 1: (a, b) -> (-b, a) per pair.
    cache = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]]).cuda()
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=torch.float64, device="cuda")
    pos = torch.tensor([1], device="cuda")
    gptj = _rope_ref(pos, x, 4, cache, is_neox=False)
    neox = _rope_ref(pos, x, 4, cache, is_neox=True)
    assert gptj.tolist() == [[-2.0, 1.0, -4.0, 3.0]]
    assert neox.tolist() == [[-3.0, -4.0, 1.0, 2.0]]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize(
    ("head_size", "rot_dim"), [(128, 128), (128, 64), (64, 64), (80, 80), (64, 24), (6, 6)]
)
@pytest.mark.parametrize("num_tokens", [1, 7, 129])
@pytest.mark.parametrize("pos_dtype", [torch.int64, torch.int32])
def test_rope(dtype, is_neox, head_size, rot_dim, num_tokens, pos_dtype):
    from mllm_kernel.cuda.jit import apply_rope_with_cos_sin_cache_inplace

    q_heads, k_heads = 8, 2
    cache = _cos_sin_cache(rot_dim)
    positions = torch.randint(0, MAX_POS, (num_tokens,), device="cuda", dtype=pos_dtype)
    q = torch.randn(num_tokens, q_heads * head_size, device="cuda").to(dtype)
    k = torch.randn(num_tokens, k_heads * head_size, device="cuda").to(dtype)
    q_ref = _rope_ref(positions, q, head_size, cache, is_neox)
    k_ref = _rope_ref(positions, k, head_size, cache, is_neox)
    apply_rope_with_cos_sin_cache_inplace(positions, q, k, head_size, cache, is_neox)
    _close(q, q_ref)
    _close(k, k_ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
def test_rope_on_a_fused_qkv_buffer(dtype, is_neox):
    from mllm_kernel.cuda.jit import apply_rope_with_cos_sin_cache_inplace

    tokens, head_size, q_heads, k_heads = 33, 128, 4, 1
    qkv = torch.randn(tokens, (q_heads + 2 * k_heads) * head_size, device="cuda").to(dtype)
    q = qkv[:, : q_heads * head_size]
    k = qkv[:, q_heads * head_size : (q_heads + k_heads) * head_size]
    v_before = qkv[:, (q_heads + k_heads) * head_size :].clone()
    cache = _cos_sin_cache(head_size)
    positions = torch.arange(tokens, device="cuda")
    q_ref = _rope_ref(positions, q, head_size, cache, is_neox)
    k_ref = _rope_ref(positions, k, head_size, cache, is_neox)
    apply_rope_with_cos_sin_cache_inplace(positions, q, k, head_size, cache, is_neox)
    _close(q, q_ref)
    _close(k, k_ref)
    assert torch.equal(qkv[:, (q_heads + k_heads) * head_size :], v_before)


@pytest.mark.parametrize("fused", [False, True])
def test_rope_three_dim_heads(fused):
    """q and k [T, H, D]: tensors of their own, or (``fused``) views of their column
    blocks of one qkv buffer, disjoint though they share it, which the kernel takes (v
    is left alone)."""
    from mllm_kernel.cuda.jit import apply_rope_with_cos_sin_cache_inplace

    qkv = torch.randn(5, (4 + 2 + 2) * 64, device="cuda", dtype=torch.bfloat16)
    if fused:
        q, k = qkv[:, : 4 * 64].view(5, 4, 64), qkv[:, 4 * 64 : 6 * 64].view(5, 2, 64)
    else:
        q = torch.randn(5, 4, 64, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(5, 2, 64, device="cuda", dtype=torch.bfloat16)
    v_before = qkv[:, 6 * 64 :].clone()
    cache = _cos_sin_cache(64)
    positions = torch.randint(0, MAX_POS, (5,), device="cuda")
    q_ref = _rope_ref(positions, q.reshape(5, -1), 64, cache, True).reshape(q.shape)
    k_ref = _rope_ref(positions, k.reshape(5, -1), 64, cache, True).reshape(k.shape)
    apply_rope_with_cos_sin_cache_inplace(positions, q, k, 64, cache)
    _close(q, q_ref)
    _close(k, k_ref)
    assert torch.equal(qkv[:, 6 * 64 :], v_before)


def test_out_of_range_position_leaves_the_token_alone():
    from mllm_kernel.cuda.jit import apply_rope_with_cos_sin_cache_inplace

    cache = _cos_sin_cache(64, max_pos=16)
    q = torch.randn(2, 128, device="cuda")
    k = torch.randn(2, 64, device="cuda")
    q0, k0 = q.clone(), k.clone()
    positions = torch.tensor([3, 16], device="cuda")
    apply_rope_with_cos_sin_cache_inplace(positions, q, k, 64, cache)
    assert torch.equal(q[1], q0[1]) and torch.equal(k[1], k0[1])
    _close(q[:1], _rope_ref(positions[:1], q0[:1], 64, cache, True))


def test_bad_inputs():
    from mllm_kernel.cuda.jit import apply_rope_with_cos_sin_cache_inplace as rope

    cache = _cos_sin_cache(64)
    q = torch.randn(3, 256, device="cuda", dtype=torch.float16)
    k = torch.randn(3, 64, device="cuda", dtype=torch.float16)
    pos = torch.arange(3, device="cuda")
    with pytest.raises(TypeError, match="'cos_sin_cache'"):
        rope(pos, q, k, 64, cache.half())
    with pytest.raises(ValueError, match="'cos_sin_cache'"):
        rope(pos, q, k, 32, _cos_sin_cache(64)[:, :64])
    with pytest.raises(ValueError, match="'query'"):
        rope(pos, q[:, :100], k, 64, cache)
    with pytest.raises(ValueError, match="'key'"):
        rope(pos, q, k[:2], 64, cache)
    with pytest.raises(TypeError, match="'key'"):
        rope(pos, q, k.float(), 64, cache)
    with pytest.raises(TypeError, match="'positions'"):
        rope(pos.float(), q, k, 64, cache)
    with pytest.raises(ValueError, match="'positions'"):
        rope(pos.cpu(), q, k, 64, cache)
