"""W8A8: int8_scaled_mm against a float64 product of the int8 operands times their
scales, and per_token_quant_int8 against the quantisation rule computed by torch.

The first part needs no GPU: what Python refuses before the kernel runs (out_dtype,
scale_dtype) is refused, naming the argument, before any device or build is involved.
The rest (``cuda`` marker) runs the kernels and their C++ checks of every tensor.
"""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch
from conftest import force_sm80_path

from mllm_kernel.cuda.jit import int8_scaled_mm, per_token_quant_int8
from mllm_kernel.cuda.jit.gemm import TILES, TileChoice, choose_tile
from mllm_kernel.cuda.jit.gemm_sm80 import SM80_TILES, Sm80Choice, launch_int8_scaled_mm

int8_module = importlib.import_module("mllm_kernel.cuda.jit.int8_scaled_mm")

OUT_DTYPES = [torch.bfloat16, torch.float16]
# The M grid, N tails (multiples of 8) and K tails (multiples of 16) that cross
# every tile and k-block boundary (k-blocks are 128 int8 columns).
GRID_M = [1, 13, 16, 64, 257, 1024]
GRID_N = [8, 136, 4104]
GRID_K = [16, 1008, 4112]
# Unit roundoff of the output type: the kernel's only rounding above fp32's.
ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def _int8(*shape, device="cuda"):
    return torch.randint(-128, 128, shape, dtype=torch.int8, device=device)


def _scales(count, device="cuda"):
    return torch.rand(count, device=device) * 0.02 + 0.001


def _reference(mat_a, mat_b, scales_a, scales_b, bias=None):
    """float64 (exact for the int8 product) [M, N], scales broadcast like the kernel's."""
    ref = mat_a.double() @ mat_b.double()
    ref = ref * scales_a.double().reshape(-1, 1) * scales_b.double().reshape(1, -1)
    return ref if bias is None else ref + bias.double()


def _check(out, ref, out_dtype):
    """Every element within 2 output roundoffs of the reference (plus fp32 noise)."""
    assert out.dtype == out_dtype and out.shape == ref.shape
    assert not out.isnan().any(), "NaN in the output: an element was not written"
    tolerance = 2 * ROUNDOFF[out_dtype] * ref.abs() + 1e-6 * ref.abs().max().clamp_min(1e-30)
    error = (out.double() - ref).abs()
    worst = (error / tolerance).max().item()
    assert worst <= 1, f"max error {error.max().item():.3g}, {worst:.3g}x the tolerance"


def _poison_allocator(m, n, dtype):
    """Leaves NaN in the block torch's caching allocator hands out next for [m, n] of
    `dtype`, so that an output element the kernel never writes shows up as NaN."""
    poison = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
    del poison


# --------------------------------------------------------------------------- no GPU
@pytest.mark.parametrize("bad", [torch.float32, torch.int8, "bfloat16", None])
def test_out_dtype_must_be_bf16_or_fp16(bad):
    a, b = _int8(4, 16, device="cpu"), _int8(8, 16, device="cpu").t()
    with pytest.raises(TypeError, match=r"^argument 'out_dtype': expected torch.bfloat16 or"):
        int8_scaled_mm(a, b, _scales(4, "cpu"), _scales(8, "cpu"), bad)


def test_original_module_path_and_signature():
    """Drop-in for the original mllm-kernel: its module path gives this function, with
    its parameter names and defaults; per_token_quant_int8 keeps its scale_dtype."""
    import inspect

    from mllm_kernel.cuda.jit.int8_scaled_mm import int8_scaled_mm as original_path
    from mllm_kernel.cuda.jit.int8_scaled_mm_cutlass import int8_scaled_mm as cutlass_path

    assert original_path is int8_scaled_mm and cutlass_path is int8_scaled_mm
    params = inspect.signature(int8_scaled_mm).parameters
    assert list(params) == ["mat_a", "mat_b", "scales_a", "scales_b", "out_dtype", "bias"]
    assert params["bias"].default is None
    quant = inspect.signature(per_token_quant_int8).parameters
    assert list(quant) == ["x", "scale_dtype"] and quant["scale_dtype"].default is torch.float32


def test_per_token_quant_scale_dtype_must_be_fp32():
    with pytest.raises(TypeError, match=r"^argument 'scale_dtype': expected torch.float32"):
        per_token_quant_int8(torch.randn(2, 8), scale_dtype=torch.float16)


def test_int8_tiles_split_k_later():
    """int8 k-blocks hold 128 columns and a split of K needs 32 of them per CTA (the
    bf16 kernel: 8 of 64 columns), so int8 splits K later than bf16, as measured
    fastest on an H100. Seen at N = 1024 (16 tiles of 64 weight rows: up to 8 CTAs a
    tile fit 132 SMs), where splits past 2 remain; a split of 2 or none gives way to
    the deep-ring tile unsplit (test_gemm_choice)."""
    assert str(choose_tile(1, 1024, 4096)) == "swap-16x64, split-K 8"  # bf16: 64 k-blocks
    assert str(choose_tile(1, 1024, 16384, element_bytes=1)) == "swap-16x64, split-K 4"  # 128
    assert str(choose_tile(1, 1024, 16256, element_bytes=1)) == "swap-16x64-deep"  # int8: 127
    assert str(choose_tile(1, 1024, 4096, element_bytes=1)) == "swap-16x64-deep"  # int8: 32
    assert choose_tile(4096, 4096, 4096, element_bytes=1) == choose_tile(4096, 4096, 4096)


# --------------------------------------------------------------------------- on a GPU
def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_hopper = pytest.mark.skipif(not _hopper(), reason="needs an sm_90 GPU (H100/H200)")


@pytest.mark.cuda
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("m", GRID_M)
@pytest.mark.parametrize("n", GRID_N)
@pytest.mark.parametrize("k", GRID_K)
def test_int8_scaled_mm_grid(gemm_path, m, n, k, with_bias, out_dtype):
    a, w = _int8(m, k), _int8(n, k)
    scales_a, scales_b = _scales(m), _scales(n)
    bias = torch.randn(n, device="cuda").to(out_dtype) if with_bias else None
    _poison_allocator(m, n, out_dtype)
    out = int8_scaled_mm(a, w.t(), scales_a, scales_b, out_dtype, bias)
    _check(out, _reference(a, w.t(), scales_a, scales_b, bias), out_dtype)


@pytest.mark.cuda
@needs_hopper
@pytest.mark.parametrize(
    ("m", "n", "k"),
    [
        (128, 4096, 4096),
        (128, 14336, 1024),
        (100, 12288, 512),
        (256, 4096, 1024),
        (200, 4104, 12304),
    ],
)
def test_int8_mid_m_choices(m, n, k):
    """The shapes where choose_tile takes another tile (tests/test_gemm_choice.py)
    through the public call: two tile-rows of the 64-token tile, 128 x 128 tiles without
    a cluster, the swapped 128-token tile over two tile-rows, 128 x 128 tiles with K
    split in two (K = 12304), into a poisoned output."""
    a, w = _int8(m, k), _int8(n, k)
    scales_a, scales_b = _scales(m), _scales(n)
    _poison_allocator(m, n, torch.bfloat16)
    out = int8_scaled_mm(a, w.t(), scales_a, scales_b, torch.bfloat16)
    _check(out, _reference(a, w.t(), scales_a, scales_b), torch.bfloat16)


@pytest.mark.cuda
@needs_hopper
@pytest.mark.parametrize("config", TILES, ids=lambda t: t.name)
def test_int8_every_tile_and_split(config):
    """Each configuration (and each split of K it allows) on shapes that cross its tails,
    into poisoned outputs."""
    m, n, k = 2 * config.tile_m + 3, 2 * config.tile_n + 8, 2064
    splits = sorted({s for s in (1, 2, config.max_split) if s <= config.max_split})
    a, w = _int8(m, k), _int8(n, k)
    scales_a, scales_b = _scales(m), _scales(n)
    for split in splits:
        for out_dtype in OUT_DTYPES:
            bias = torch.randn(n, device="cuda").to(out_dtype)
            out = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
            choice = TileChoice(config, split)
            int8_module._launch(out, a, w.t(), scales_a, scales_b, bias, choice)
            _check(out, _reference(a, w.t(), scales_a, scales_b, bias), out_dtype)


@pytest.mark.cuda
@needs_hopper
@pytest.mark.parametrize("name", [t.name for t in TILES if t.name.endswith("-deep")])
@pytest.mark.parametrize(
    "blocks", [0, "ring", 128], ids=["under-the-ring", "one-wrap", "many-wraps"]
)
def test_int8_deep_ring_tiles_on_every_k_length(name, blocks):
    """The deep-ring tiles with fewer k-blocks (128 k) than stages, one more than the
    ring, and a ring that wraps many times (each with a K tail of 16), on one and two
    tile-rows with a row tail, into poisoned outputs."""
    deep = next(t for t in TILES if t.name == name)
    k = 128 * (deep.stages if blocks == "ring" else blocks) + 16
    n = 4112
    w, scales_b = _int8(n, k), _scales(n)
    for m in (deep.tile_q // 2 + 1, deep.tile_q + 3):
        a, scales_a = _int8(m, k), _scales(m)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        int8_module._launch(out, a, w.t(), scales_a, scales_b, None, TileChoice(deep))
        _check(out, _reference(a, w.t(), scales_a, scales_b), torch.bfloat16)


@pytest.mark.cuda
@pytest.mark.parametrize("m", [1, 257])
@pytest.mark.parametrize(
    ("shape_a", "shape_b"),
    [
        ((1,), (-1,)),  # per-tensor activation scale, per-channel weights
        (("m",), (1,)),  # per-token activations, per-tensor weight scale
        ((1,), (1,)),
        (("m", 1), ("n", 1)),  # per_token_quant_int8's [M, 1]; sglang's [N, 1] weights
        ((), (1, "n")),  # a 0-d scale; a [1, N] row
    ],
    ids=["a1-bN", "aM-b1", "a1-b1", "aM1-bN1", "a0d-b1N"],
)
def test_int8_scaled_mm_scale_shapes(gemm_path, m, shape_a, shape_b):
    n, k = 136, 1008
    a, w = _int8(m, k), _int8(n, k)

    def make(shape, rows):
        dims = [rows if d in ("m", "n", -1) else d for d in shape]
        return _scales(max(1, torch.Size(dims).numel())).reshape(dims)

    scales_a, scales_b = make(shape_a, m), make(shape_b, n)
    out = int8_scaled_mm(a, w.t(), scales_a, scales_b, torch.bfloat16)
    ref = _reference(a, w.t(), scales_a.reshape(-1), scales_b.reshape(-1))
    _check(out, ref, torch.bfloat16)


@pytest.mark.cuda
@pytest.mark.parametrize("m", [1, 13, 1024])
def test_w8a8_linear_from_bf16(gemm_path, m):
    """The path a W8A8 linear layer takes: per-token quantised activations times
    per-channel quantised weights, against the bf16 product it approximates."""
    n, k = 4104, 4096
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    weight = torch.randn(n, k, device="cuda").to(torch.bfloat16)
    w_q, w_scales = per_token_quant_int8(weight)  # per output channel: rows of [N, K]
    x_q, x_scales = per_token_quant_int8(x)
    assert x_scales.shape == (m, 1) and w_scales.shape == (n, 1)
    out = int8_scaled_mm(x_q, w_q.t(), x_scales, w_scales, torch.bfloat16)
    _check(out, _reference(x_q, w_q.t(), x_scales, w_scales), torch.bfloat16)
    exact = x.double() @ weight.double().T
    relative = ((out.double() - exact).norm() / exact.norm()).item()
    assert relative < 0.03, f"W8A8 relative error {relative:.3g} against bf16"


@pytest.mark.cuda
def test_int8_scaled_mm_strided_and_empty(gemm_path):
    """A row-strided mat_a and a column-major mat_b with a padded leading dim (slices
    of bigger buffers); K = 0 gives the bias; M = 0 an empty result."""
    m, n, k = 13, 136, 1008
    a = _int8(m, k + 32)[:, 16 : k + 16]
    w = _int8(n, k + 48)[:, :k]
    scales_a, scales_b = _scales(m), _scales(n)
    out = int8_scaled_mm(a, w.t(), scales_a, scales_b, torch.float16)
    _check(out, _reference(a, w.t(), scales_a, scales_b), torch.float16)

    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    empty_a, empty_w = _int8(m, 0), _int8(n, 0)
    out = int8_scaled_mm(empty_a, empty_w.t(), scales_a, scales_b, torch.bfloat16, bias)
    torch.testing.assert_close(out, bias.expand(m, n), rtol=0, atol=0)
    none = int8_scaled_mm(_int8(0, k), w.t(), _scales(1), scales_b, torch.bfloat16)
    assert none.shape == (0, n)


@pytest.mark.cuda
def test_int8_scaled_mm_one_row_takes_any_row_stride(gemm_path):
    """One token's mat_a row sliced from a wider one (its stride no multiple of 16
    bytes): only that row is read, TMA's tensor map included."""
    n, k = 136, 1008
    a = _int8(1, k + 8)[:, :k]
    assert a.stride(0) % 16
    w = _int8(n, k)
    scales_a, scales_b = _scales(1), _scales(n)
    out = int8_scaled_mm(a, w.t(), scales_a, scales_b, torch.bfloat16)
    _check(out, _reference(a, w.t(), scales_a, scales_b), torch.bfloat16)


@pytest.mark.cuda
def test_int8_scaled_mm_cuda_graph_and_side_stream(gemm_path):
    small, big = (7, 4104, 1008), (1000, 4104, 1008)
    a, a_big, w = _int8(7, 1008), _int8(1000, 1008), _int8(4104, 1008)
    scales_a, scales_big, scales_b = _scales(7), _scales(1000), _scales(4104)
    x = torch.randn(1000, 1008, device="cuda").to(torch.bfloat16)
    # Build and load outside the capture.
    int8_scaled_mm(a, w.t(), scales_a, scales_b, torch.bfloat16)
    int8_scaled_mm(a_big, w.t(), scales_big, scales_b, torch.bfloat16)
    per_token_quant_int8(x)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = int8_scaled_mm(a, w.t(), scales_a, scales_b, torch.bfloat16)
        out_big = int8_scaled_mm(a_big, w.t(), scales_big, scales_b, torch.bfloat16)
        x_q, x_scales = per_token_quant_int8(x)
    assert out.shape == small[:2] and out_big.shape == big[:2]
    for _ in range(2):
        a.copy_(_int8(7, 1008))
        a_big.copy_(_int8(1000, 1008))
        x.copy_(torch.randn_like(x))
        for result in (out, out_big, x_q, x_scales):
            result.fill_(0)
        graph.replay()
        torch.cuda.synchronize()
        _check(out, _reference(a, w.t(), scales_a, scales_b), torch.bfloat16)
        _check(out_big, _reference(a_big, w.t(), scales_big, scales_b), torch.bfloat16)
        ref_q, ref_scales = _quant_reference(x)
        assert torch.equal(x_q, ref_q) and torch.equal(x_scales, ref_scales)


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_int8_on_second_gpu(gemm_path):
    with torch.cuda.device(0):
        x = torch.randn(129, 1008, device="cuda:1").to(torch.bfloat16)
        x_q, x_scales = per_token_quant_int8(x)
        assert x_q.device == torch.device("cuda:1")
        w = _int8(1000, 1008, device="cuda:1")
        scales_b = _scales(1000, device="cuda:1")
        out = int8_scaled_mm(x_q, w.t(), x_scales, scales_b, torch.bfloat16)
        assert out.device == torch.device("cuda:1")
        _check(out, _reference(x_q, w.t(), x_scales, scales_b), torch.bfloat16)
        with pytest.raises(ValueError, match=r"argument 'scales_b'.*device"):
            int8_scaled_mm(x_q, w.t(), x_scales, scales_b.to("cuda:0"), torch.bfloat16)


@pytest.mark.cuda
def test_int8_scaled_mm_bad_inputs(gemm_path):
    m, n, k = 16, 72, 144
    a, w = _int8(m, k), _int8(n, k)
    sa, sb = _scales(m), _scales(n)
    bf16 = torch.bfloat16
    cases = [
        # M, N and K pick the tile: the ranks are checked (in Python) before it is chosen
        (
            (a[None], w.t(), sa, sb),
            ValueError,
            r"^argument 'mat_a': expected a 2-D tensor \[M, K\]",
        ),
        ((a, w[0], sa, sb), ValueError, r"^argument 'mat_b': expected a 2-D tensor \[K, N\]"),
        ((a.float(), w.t(), sa, sb), TypeError, r"^argument 'mat_a': expected dtype in \{int8\}"),
        ((a, w.t().to(torch.uint8), sa, sb), TypeError, r"^argument 'mat_b': expected dtype"),
        ((a, w.t(), sa.double(), sb), TypeError, r"^argument 'scales_a': expected dtype"),
        ((a, w.t(), sa, sb.half()), TypeError, r"^argument 'scales_b': expected dtype"),
        (
            (a, w.t(), sa[:5], sb),
            ValueError,
            r"^argument 'scales_a': expected 16 scales \(M: one per row of mat_a\) or 1 but got 5",
        ),
        (
            (a, w.t(), sa, sb[:7]),
            ValueError,
            r"^argument 'scales_b': expected 72 scales \(N: one per column of mat_b\) or 1 but "
            r"got 7",
        ),
        ((a, w.t(), _scales(2 * m)[::2], sb), ValueError, r"^argument 'scales_a': expected a"),
        (
            (a[:, :136], w[:, :136].t(), sa, sb),
            ValueError,
            r"^argument 'mat_a': K \(136\) must be a multiple of 16",
        ),
        (
            (a, _int8(68, k).t(), sa, sb[:68]),
            ValueError,
            r"^argument 'mat_b': N \(68\) must be a multiple of 8",
        ),
        (
            (_int8(m, k + 8)[:, :k], w.t(), sa, sb),
            ValueError,
            r"^argument 'mat_a': the row stride must be a multiple of 16 elements",
        ),
        (
            (a, _int8(n, 2 * k).t(), sa, sb),
            ValueError,
            r"^argument 'mat_b': expected dim 0 \(K\) to be 144 as in 'mat_a' but got 288",
        ),
        (
            (a, _int8(k, n), sa, sb),
            ValueError,
            r"^argument 'mat_b': expected a column-major \[K, N\] tensor \(stride\(0\) == 1\) "
            r"but got strides \[72, 1\]; pass weight.t\(\)",
        ),
        (
            (a, _int8(n, k + 8)[:, :k].t(), sa, sb),
            ValueError,
            r"^argument 'mat_b': stride\(1\) \(the weight's row stride\) must be a multiple of "
            r"16 elements",
        ),
        (
            (a, w.t(), _scales(m).reshape(2, 8), sb),
            ValueError,
            r"^argument 'scales_a': expected \[M\], \[M, 1\] or \[1\] but got shape \[2, 8\]",
        ),
        (
            (a, w.t(), sa, _scales(n).reshape(1, 8, 9)),
            ValueError,
            r"^argument 'scales_b': expected \[N\], \[N, 1\] or \[1\] but got shape \[1, 8, 9\]",
        ),
        ((a.cpu(), w.t(), sa, sb), ValueError, r"^argument 'mat_a': expected a tensor on cuda"),
        ((a, w.t(), sa.cpu(), sb), ValueError, r"^argument 'scales_a'.*cuda"),
    ]
    for number, (args, error, message) in enumerate(cases):
        print(f"case {number}: expecting {error.__name__} matching {message!r}")  # on failure
        with pytest.raises(error, match=message):
            int8_scaled_mm(*args, bf16)
    bias_cases = [
        (torch.randn(n, device="cuda"), TypeError, r"^argument 'bias': expected dtype"),
        (torch.randn(n + 1, device="cuda").to(bf16), ValueError, r"^argument 'bias'"),
        (torch.randn(n, 1, device="cuda").to(bf16), ValueError, r"^argument 'bias'"),
    ]
    for bias, error, message in bias_cases:
        with pytest.raises(error, match=message):
            int8_scaled_mm(a, w.t(), sa, sb, bf16, bias)


@pytest.mark.cuda
@pytest.mark.parametrize("config", SM80_TILES, ids=lambda t: t.name)
def test_int8_every_sm80_tile_and_split(config, monkeypatch):
    """Each sm_80 configuration (unsplit, split in 2 and in 16: slices with no k-blocks
    too) on shapes that cross its tails, into poisoned outputs, as compute_80 PTX."""
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("the sm_80 kernels need a GPU of compute capability 8.0 or newer")
    force_sm80_path(monkeypatch)
    m, n, k = 2 * config.tile_m + 3, 2 * config.tile_n + 8, 2064
    a, w = _int8(m, k), _int8(n, k)
    scales_a, scales_b = _scales(m), _scales(n)
    for split in (1, 2, 16):
        for out_dtype in OUT_DTYPES:
            bias = torch.randn(n, device="cuda").to(out_dtype)
            out = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
            launch_int8_scaled_mm(
                out, a, w.t(), scales_a, scales_b, bias, Sm80Choice(config, split)
            )
            _check(out, _reference(a, w.t(), scales_a, scales_b, bias), out_dtype)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_int8_scaled_mm_refuses_gpus_before_sm80(monkeypatch):
    facts_module = importlib.import_module("mllm_kernel.cuda.device_facts")
    monkeypatch.setattr(int8_module, "_plans", {})
    monkeypatch.setattr(facts_module, "_matmul_paths", {})
    index = torch.cuda.current_device()
    turing = dataclasses.replace(facts_module.device_facts(index), capability=(7, 5))
    monkeypatch.setitem(facts_module._facts, index, turing)
    with pytest.raises(NotImplementedError, match=r"^int8_scaled_mm runs on sm_80 and newer"):
        int8_scaled_mm(_int8(4, 16), _int8(8, 16).t(), _scales(4), _scales(8), torch.bfloat16)


# ------------------------------------------------------------------ per_token_quant_int8
def _quant_reference(x):
    """The quantisation rule in torch: the scale absmax / 127 and 127 / absmax correctly
    rounded to fp32, as the kernel's divisions are (computed in float64 and rounded once,
    which is exact for a quotient of fp32 values; torch's own fp32 `127.0 / t` multiplies
    by a rounded reciprocal and on the GPU so does `t / 127.0`), the product x * (127 /
    absmax) in fp32, then rounded half away from zero (exactly, in float64)."""
    absmax = x.float().abs().amax(-1, keepdim=True).clamp_min(1e-10).double()
    inv_scale = (127.0 / absmax).float()
    v = (x.float() * inv_scale).double()
    q = (v.sign() * (v.abs() + 0.5).floor()).clamp(-128, 127)
    return q.to(torch.int8), (absmax / 127.0).float()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hidden", [1, 7, 8, 64, 1000, 4096, 4104, 16392, 40000])
@pytest.mark.parametrize("rows", [1, 13, 257])
def test_per_token_quant_int8(dtype, hidden, rows):
    """Hidden sizes off every vector width, rows in registers (<= 4 vectors per thread)
    and beyond (16392 fp32, 40000 any type)."""
    x = (torch.randn(rows, hidden, device="cuda") * 3).to(dtype)
    x[0, -1] = 1000.0  # one large outlier: the other values round at a coarse scale
    x_q, scales = per_token_quant_int8(x)
    ref_q, ref_scales = _quant_reference(x)
    assert x_q.dtype == torch.int8 and scales.dtype == torch.float32
    assert scales.shape == (rows, 1)
    assert torch.equal(scales, ref_scales)
    assert torch.equal(x_q, ref_q), f"{(x_q != ref_q).sum().item()} elements differ"
    # The point of it: x_q * scale reproduces x to within half a step.
    assert ((x_q.double() * scales.double() - x.double()).abs() <= 0.5001 * scales).all()
    assert x_q.abs().max().item() == 127


@pytest.mark.cuda
def test_per_token_quant_int8_shapes_and_views():
    """Leading dims, row-strided views (vector and element paths), zero rows, an
    all-zero row, exact halves."""
    x = torch.randn(2, 3, 4096, device="cuda").to(torch.bfloat16)
    x_q, scales = per_token_quant_int8(x)
    assert x_q.shape == (2, 3, 4096) and scales.shape == (2, 3, 1)
    ref_q, ref_scales = _quant_reference(x)
    assert torch.equal(x_q, ref_q) and torch.equal(scales, ref_scales)

    for pad in (8, 3):  # pad 3 leaves rows off 16-byte boundaries: one element at a time
        big = torch.randn(13, 1000 + pad, device="cuda").to(torch.float16)
        view = big[:, pad : pad + 1000] if pad == 8 else big[:, :1000]
        x_q, scales = per_token_quant_int8(view)
        ref_q, ref_scales = _quant_reference(view)
        assert torch.equal(x_q, ref_q) and torch.equal(scales, ref_scales)

    zero = torch.zeros(3, 64, device="cuda")
    zero[1] = torch.linspace(-127, 127, 64, device="cuda")
    zero[2, :4] = torch.tensor([127.0, 0.5, -0.5, -1.5], device="cuda")  # halves: away from 0
    x_q, scales = per_token_quant_int8(zero)
    assert x_q[0].eq(0).all() and scales[0].item() == pytest.approx(1e-10 / 127)
    assert x_q[2, :4].tolist() == [127, 1, -1, -2]
    ref_q, _ = _quant_reference(zero)
    assert torch.equal(x_q, ref_q)

    x_q, scales = per_token_quant_int8(torch.empty(0, 64, device="cuda"))
    assert x_q.shape == (0, 64) and scales.shape == (0, 1)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [64, 1000, 40000])
def test_per_token_quant_int8_nan_and_inf_rows(dtype, hidden):
    """A row holding a NaN gets a NaN scale, one holding an infinity an infinite one, both
    zeros: the W8A8 products of those rows are NaN, not finite values that hide the bad
    input; the other rows are quantised as ever (vector and element paths)."""
    x = torch.randn(4, hidden, device="cuda").to(dtype)
    x[1, hidden // 2] = float("nan")
    x[2, -1] = float("-inf")
    x_q, scales = per_token_quant_int8(x)
    assert scales[1].isnan().all() and scales[2].isinf().all()
    assert x_q[1:3].eq(0).all()
    ref_q, ref_scales = _quant_reference(x[[0, 3]])
    assert torch.equal(x_q[[0, 3]], ref_q) and torch.equal(scales[[0, 3]], ref_scales)
    w = _int8(64, hidden - hidden % 16 or 16)
    a = x_q[:, : w.shape[1]].contiguous()
    out = int8_scaled_mm(a, w.t(), scales, _scales(64), torch.bfloat16)
    assert out[1:3].isnan().all() and not out[[0, 3]].isnan().any()


@pytest.mark.cuda
def test_per_token_quant_int8_bad_inputs():
    with pytest.raises(TypeError, match=r"^argument 'x': expected dtype in"):
        per_token_quant_int8(torch.ones(2, 8, device="cuda", dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^argument 'x': expected at least 1 dim"):
        per_token_quant_int8(torch.ones((), device="cuda"))
    with pytest.raises(ValueError, match=r"^argument 'x': expected stride 1 in the last dim"):
        per_token_quant_int8(torch.ones(8, 4, device="cuda").t())
