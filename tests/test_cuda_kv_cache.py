"""CUDA store_cache and create_kv_indices against plain torch indexing."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.cuda


def _bits(t):
    """Bitwise view, so NaN-poisoned and float8 tensors compare exactly."""
    return t.contiguous().view(torch.uint8)


@pytest.fixture
def bounds_flag(monkeypatch):
    """Sets MLLM_KERNEL_CHECK_BOUNDS as a new process would see it: the package reads it
    once, so the cached value is dropped on each change and after the test."""
    from mllm_kernel.jit_utils import env

    def set_flag(value: str | None) -> None:
        if value is None:
            monkeypatch.delenv("MLLM_KERNEL_CHECK_BOUNDS", raising=False)
        else:
            monkeypatch.setenv("MLLM_KERNEL_CHECK_BOUNDS", value)
        env.check_bounds.cache_clear()

    yield set_flag
    monkeypatch.undo()
    env.check_bounds.cache_clear()


def _random(shape, dtype):
    if dtype in (torch.int8, torch.int32):
        return torch.randint(-100, 100, shape, device="cuda", dtype=dtype)
    return torch.randn(shape, device="cuda").to(dtype)


@pytest.mark.parametrize(
    "dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.int8]
)
@pytest.mark.parametrize("row_shape", [(1,), (3,), (8, 128), (5, 7), (1, 576)])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("num_tokens", [1, 8, 1000])
def test_store_cache(dtype, row_shape, index_dtype, num_tokens):
    from mllm_kernel.cuda.jit import store_cache

    num_slots = 2 * num_tokens + 3
    k = _random((num_tokens, *row_shape), dtype)
    v = _random((num_tokens, *row_shape), dtype)
    k_cache = _random((num_slots, *row_shape), dtype)
    v_cache = _random((num_slots, *row_shape), dtype)
    indices = torch.randperm(num_slots, device="cuda")[:num_tokens].to(index_dtype)
    indices[::5] = -1  # padding
    # The reference scatters raw bytes: index_put has no float8 kernels.
    k_expected, v_expected = _bits(k_cache).clone(), _bits(v_cache).clone()
    keep = indices >= 0
    k_expected[indices[keep].long()] = _bits(k)[keep]
    v_expected[indices[keep].long()] = _bits(v)[keep]
    store_cache(k, v, k_cache, v_cache, indices)
    assert torch.equal(_bits(k_cache), k_expected)
    assert torch.equal(_bits(v_cache), v_expected)


def test_store_cache_strided_rows_and_different_v_width():
    from mllm_kernel.cuda.jit import store_cache

    kv = torch.randn(64, 2, 4, 64, device="cuda", dtype=torch.bfloat16)
    k = kv[:, 0]  # token stride 2 * 4 * 64
    v = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16)  # MLA-like: own width
    k_cache = torch.zeros(100, 4, 64, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.zeros(100, 512, device="cuda", dtype=torch.bfloat16)
    indices = torch.arange(64, device="cuda") + 30
    store_cache(k, v, k_cache, v_cache, indices)
    assert torch.equal(k_cache[30:94], k) and torch.equal(v_cache[30:94], v)
    assert not k_cache[:30].any() and not v_cache[94:].any()


def test_store_cache_into_the_halves_of_one_kv_buffer():
    """k_cache and v_cache as the K and V halves of one [slots, 2, H, D] buffer (and k, v
    as views of one fused projection): disjoint, though they share their buffers."""
    from mllm_kernel.cuda.jit import store_cache

    kv_cache = torch.zeros(50, 2, 4, 64, device="cuda", dtype=torch.bfloat16)
    k_cache, v_cache = kv_cache[:, 0], kv_cache[:, 1]
    kv = torch.randn(16, 8 * 64, device="cuda", dtype=torch.bfloat16)
    k, v = kv[:, : 4 * 64].view(16, 4, 64), kv[:, 4 * 64 :].view(16, 4, 64)
    indices = torch.randperm(50, device="cuda")[:16]
    store_cache(k, v, k_cache, v_cache, indices)
    assert torch.equal(k_cache[indices], k) and torch.equal(v_cache[indices], v)
    untouched = torch.ones(50, dtype=torch.bool, device="cuda")
    untouched[indices] = False
    assert not kv_cache[untouched].any()


def test_store_cache_out_of_range(bounds_flag):
    from mllm_kernel.cuda.jit import store_cache

    k = torch.randn(4, 64, device="cuda")
    k_cache = torch.zeros(8, 64, device="cuda")
    v_cache = torch.zeros(8, 64, device="cuda")
    indices = torch.tensor([0, 8, 3, 100], device="cuda")
    bounds_flag(None)
    store_cache(k, k, k_cache, v_cache, indices)  # never writes past the end
    assert torch.equal(k_cache[0], k[0]) and torch.equal(k_cache[3], k[2])
    bounds_flag("1")
    with pytest.raises(IndexError, match=r"2 of argument 'indices'.*8 slots"):
        store_cache(k, k, k_cache, v_cache, indices)
    store_cache(k[:1], k[:1], k_cache, v_cache, indices[:1])  # in range: no error


def test_store_cache_bad_inputs():
    from mllm_kernel.cuda.jit import store_cache

    k = torch.randn(4, 64, device="cuda", dtype=torch.float16)
    cache = torch.zeros(8, 64, device="cuda", dtype=torch.float16)
    v_cache = torch.zeros_like(cache)  # k_cache and v_cache must not share memory
    idx = torch.arange(4, device="cuda")
    with pytest.raises(TypeError, match="'k_cache'"):
        store_cache(k, k, cache.float(), v_cache, idx)
    with pytest.raises(ValueError, match="'k_cache'"):
        store_cache(k, k, cache[:, :32], v_cache, idx)
    with pytest.raises(TypeError, match="'indices'"):
        store_cache(k, k, cache, v_cache, idx.float())
    with pytest.raises(ValueError, match="'k'"):
        store_cache(k[:3], k, cache, v_cache, idx)
    with pytest.raises(ValueError, match="'v_cache'"):
        store_cache(k, k, cache, v_cache.cpu(), idx)
    with pytest.raises(ValueError, match="'k'"):
        store_cache(
            torch.randn(4, 64, 2, device="cuda", dtype=torch.float16)[..., 0],
            k,
            cache,
            v_cache,
            idx,
        )
    with pytest.raises(
        ValueError, match=r"^argument 'k_cache': is the same memory as argument 'v_c"
    ):
        store_cache(k, k, cache, cache, idx)
    # One slot index addresses both caches: their slot counts must agree.
    with pytest.raises(
        ValueError, match=r"^argument 'v_cache': expected 8 slots \(k_cache.shape\[0\]\) but got 7"
    ):
        store_cache(k, k, cache, v_cache[:7], idx)


def _kv_indices_ref(req_to_token, pool, lens, indptr, start, total):
    out = torch.full((total,), -7, dtype=req_to_token.dtype)
    r2t = req_to_token.cpu()
    for i in range(pool.numel()):
        s = int(start[i]) if start is not None else 0
        n, b = int(lens[i]), int(indptr[i])
        out[b : b + n] = r2t[int(pool[i]), s : s + n]
    return out


def _kv_inputs(batch, index_dtype, token_dtype, with_start, strided):
    pool_size, max_context = 64, 3000
    req_to_token = torch.randint(0, 1 << 20, (pool_size, max_context), device="cuda").to(
        token_dtype
    )
    start = torch.randint(0, 500, (batch,), device="cuda") if with_start else None
    base = start if start is not None else torch.zeros(batch, device="cuda", dtype=torch.long)
    lens = (torch.rand(batch, device="cuda") * (max_context - base)).long()
    pool = torch.randint(0, pool_size, (batch,), device="cuda")  # requests may share a row
    indptr = torch.zeros(batch + 1, device="cuda", dtype=torch.long)
    indptr[1:] = torch.cumsum(lens, 0)

    def cast(t):
        if t is None:
            return None
        t = t.to(index_dtype)
        if strided:  # every other element of a buffer twice as long
            wide = torch.zeros(2 * t.numel(), device="cuda", dtype=index_dtype)
            wide[::2] = t
            return wide[::2]
        return t

    return req_to_token, cast(pool), cast(lens), cast(indptr), cast(start)


@pytest.mark.parametrize("batch", [0, 1, 3, 100])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("token_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("with_start", [False, True])
@pytest.mark.parametrize("strided", [False, True])
def test_create_kv_indices(batch, index_dtype, token_dtype, with_start, strided):
    from mllm_kernel.cuda.jit import create_kv_indices

    req_to_token, pool, lens, indptr, start = _kv_inputs(
        batch, index_dtype, token_dtype, with_start, strided
    )
    total = int(indptr[-1])
    kv_indices = torch.full((total,), -7, device="cuda", dtype=token_dtype)
    create_kv_indices(req_to_token, pool, lens, indptr, start, kv_indices)
    expected = _kv_indices_ref(req_to_token, pool, lens, indptr, start, total)
    assert torch.equal(kv_indices.cpu(), expected)


def test_create_kv_indices_out_of_range(bounds_flag):
    from mllm_kernel.cuda.jit import create_kv_indices

    req_to_token = torch.arange(4 * 10, device="cuda", dtype=torch.int32).view(4, 10)
    pool = torch.tensor([1, 9], device="cuda")  # row 9 does not exist
    lens = torch.tensor([3, 2], device="cuda")
    indptr = torch.tensor([0, 3, 5], device="cuda")
    kv_indices = torch.full((5,), -7, device="cuda", dtype=torch.int32)
    bounds_flag(None)
    create_kv_indices(req_to_token, pool, lens, indptr, None, kv_indices)
    assert kv_indices.tolist() == [10, 11, 12, -7, -7]
    bounds_flag("1")
    with pytest.raises(IndexError, match="1 request"):
        create_kv_indices(req_to_token, pool, lens, indptr, None, kv_indices)


def test_create_kv_indices_sums_past_int64_are_out_of_range(bounds_flag):
    """int64 offsets whose sums would wrap past 2^63 into range (a start near 2^63 with a
    length, an indptr near 2^63): counted and skipped, nothing written."""
    from mllm_kernel.cuda.jit import create_kv_indices

    req_to_token = torch.arange(4 * 10, device="cuda", dtype=torch.int32).view(4, 10)
    pool = torch.tensor([1, 2, 3], device="cuda")
    lens = torch.tensor([3, 2, 2], device="cuda")
    near = 2**63 - 2
    indptr = torch.tensor([0, near, 3, 5], device="cuda")
    start = torch.tensor([0, 0, near], device="cuda")
    kv_indices = torch.full((5,), -7, device="cuda", dtype=torch.int32)
    bounds_flag(None)
    create_kv_indices(req_to_token, pool, lens, indptr, start, kv_indices)
    assert kv_indices.tolist() == [10, 11, 12, -7, -7]
    bounds_flag("1")
    with pytest.raises(IndexError, match="2 request"):
        create_kv_indices(req_to_token, pool, lens, indptr, start, kv_indices)


def test_create_kv_indices_bad_inputs():
    from mllm_kernel.cuda.jit import create_kv_indices

    r2t = torch.zeros(4, 10, device="cuda", dtype=torch.int32)
    pool = torch.tensor([0, 1], device="cuda")
    lens = torch.tensor([1, 1], device="cuda")
    indptr = torch.tensor([0, 1, 2], device="cuda")
    out = torch.zeros(2, device="cuda", dtype=torch.int32)
    with pytest.raises(ValueError, match="'kv_indptr'"):
        create_kv_indices(r2t, pool, lens, indptr[:2], None, out)
    with pytest.raises(TypeError, match="'kv_indices'"):
        create_kv_indices(r2t, pool, lens, indptr, None, out.long())
    with pytest.raises(ValueError, match="'page_kernel_lens'"):
        create_kv_indices(r2t, pool, lens[:1], indptr, None, out)
    with pytest.raises(ValueError, match="'kv_start_idx'"):
        create_kv_indices(r2t, pool, lens, indptr, lens[:1], out)
    with pytest.raises(TypeError, match="'req_to_token'"):
        create_kv_indices(r2t.float(), pool, lens, indptr, None, out)
