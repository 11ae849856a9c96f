"""The Hopper GEMM against a float64 product, with cuBLAS's own error as the yardstick.

The first tests need no GPU: what is refused in Python before the kernel runs
(out_dtype, Gemm's construction arguments) is refused before any device or build.
The rest (``cuda`` marker) runs the kernels, and the C++ checks of every tensor."""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest
import torch
from conftest import force_sm80_path

# The module, not the function of the same name that mllm_kernel.cuda.jit exports.
gemm_module = importlib.import_module("mllm_kernel.cuda.jit.gemm")
facts_module = importlib.import_module("mllm_kernel.cuda.device_facts")
sm80_module = importlib.import_module("mllm_kernel.cuda.jit.gemm_sm80")

DTYPES = [torch.bfloat16, torch.float16]
# Not tile multiples: every M, N and K tail of every tile (M 1 and 7 are decode shapes).
SMALL_M = [1, 7, 64, 129, 1000]
SIZES_NK = [8, 72, 136, 1000, 4104]


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


_skip_unless_hopper = pytest.mark.skipif(not _hopper(), reason="needs an sm_90 GPU (H100/H200)")


def needs_hopper(test):
    """A GPU test (``cuda`` marker) that runs only on an sm_90 GPU."""
    return pytest.mark.cuda(_skip_unless_hopper(test))


# --------------------------------------------------------------------------- no GPU
@pytest.mark.parametrize(
    ("out_dtype", "error", "message"),
    [
        ("float64", TypeError, r"^argument 'out_dtype': unknown dtype 'float64'; use one of"),
        (3, TypeError, r"^argument 'out_dtype': unknown dtype 3"),
    ],
)
def test_out_dtype_names_are_refused_before_the_device(out_dtype, error, message):
    from mllm_kernel.cuda.jit import gemm

    a = torch.ones(4, 8, dtype=torch.bfloat16)
    with pytest.raises(error, match=message):
        gemm(a, a, out_dtype=out_dtype)


def test_out_dtype_names_are_dtypes():
    from mllm_kernel.ops.gemm import named_dtype

    assert named_dtype("FP32", "out_dtype") is torch.float32
    assert named_dtype(np.dtype("float16"), "dtype") is torch.float16
    assert named_dtype(torch.bfloat16, "dtype") is torch.bfloat16


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        ((4, 12, 16), {}, ValueError, r"^N \(12\) and K \(16\) must be multiples of 8"),
        ((4, -8, 16), {}, ValueError, r"^argument 'N': expected a non-negative int, got -8"),
        ((4, 8, 16), {"dtype": "fp32"}, TypeError, r"^argument 'dtype': expected bfloat16 or"),
        ((4, 8, 16), {"out_dtype": "fp16"}, TypeError, r"^argument 'out_dtype': expected"),
        ((4, 8, 16), {"arch": "sm75"}, NotImplementedError, r"^Gemm runs on sm_80 and newer"),
        ((4, 8, 16), {"arch": "7.0"}, NotImplementedError, r"got arch='7.0'"),
    ],
)
def test_gemm_object_refuses_bad_construction_arguments(args, kwargs, error, message):
    from mllm_kernel.cuda import Gemm

    with pytest.raises(error, match=message):
        Gemm(*args, **kwargs)


# --------------------------------------------------------------------------- on a GPU


def _operands(m, n, k, dtype, device="cuda"):
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(n, k, device=device).to(dtype)
    return a, b


def _relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not out.isnan().any(), "NaN in the output: an element was not written"
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _check(out, a, b, bias=None):
    """Our error is within 2x cuBLAS's error on the same inputs (floor: 1e-6)."""
    ref = a.double() @ b.double().T
    if bias is not None:
        ref = ref + bias.double()
    if out.dtype == torch.float32:
        # cuBLAS's 16-bit product with an fp32 result: the same tensor-core arithmetic.
        cublas = torch.mm(a, b.T, out_dtype=torch.float32)
        if bias is not None:
            cublas = cublas + bias.float()
    else:
        cublas = torch.nn.functional.linear(a, b, bias)
    ours, theirs = _relative_error(out, ref), _relative_error(cublas, ref)
    assert ours <= 2 * theirs + 1e-6, f"relative error {ours:.3g} vs cuBLAS {theirs:.3g}"


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", SMALL_M)
@pytest.mark.parametrize("n", SIZES_NK)
@pytest.mark.parametrize("k", SIZES_NK)
def test_gemm_tails(gemm_path, dtype, m, n, k):
    from mllm_kernel.cuda.jit import gemm

    a, b = _operands(m, n, k, dtype)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    assert gemm(a, b, out) is out
    _check(out, a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("m", "n", "k"),
    [
        (4096, 14336, 4096),
        (4096, 4104, 1000),
        (1000, 14336, 4104),
        (16, 14336, 4096),
        (1, 4096, 14336),
        (128, 28672, 8192),
    ],
)
def test_gemm_large(gemm_path, dtype, m, n, k):
    from mllm_kernel.cuda.jit import gemm

    a, b = _operands(m, n, k, dtype)
    _check(gemm(a, b), a, b)


@needs_hopper
@pytest.mark.parametrize("config", gemm_module.TILES, ids=lambda t: t.name)
def test_every_tile_and_split(config):
    """Each configuration (and each split of K it allows) on shapes that cross its tails."""
    from mllm_kernel.cuda.jit.gemm import TileChoice, _launch

    m, n, k = 2 * config.tile_m + 3, 2 * config.tile_n + 8, 1000
    splits = sorted({1, 2, config.max_split} & set(range(1, config.max_split + 1)))
    for split in splits:
        for dtype in DTYPES:
            a, b = _operands(m, n, k, dtype)
            bias = torch.randn(n, device="cuda").to(dtype)
            out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
            _launch(a, b, out, bias, TileChoice(config, split))
            _check(out, a, b, bias)


@needs_hopper
@pytest.mark.parametrize("name", [t.name for t in gemm_module.TILES if t.name.endswith("-deep")])
@pytest.mark.parametrize(
    "blocks", [1, "ring", 128], ids=["under-the-ring", "one-wrap", "many-wraps"]
)
def test_deep_ring_tiles_on_every_k_length(name, blocks):
    """The deep-ring tiles with fewer k-blocks (64 k) than stages, one more than the
    ring, and a ring that wraps many times (each with a K tail of 8), on one and two
    tile-rows with a row tail, into poisoned outputs."""
    from mllm_kernel.cuda.jit.gemm import TileChoice, _launch

    deep = gemm_module._BY_NAME[name]
    k = 64 * (deep.stages if blocks == "ring" else blocks) + 8
    for m in (deep.tile_q // 2 + 1, deep.tile_q + 3):
        a, b = _operands(m, 4104, k, torch.bfloat16)
        out = torch.full((m, 4104), float("nan"), device="cuda", dtype=torch.bfloat16)
        _launch(a, b, out, None, TileChoice(deep))
        _check(out, a, b)


@needs_hopper
def test_a_split_past_the_tiles_partial_sums_is_refused():
    """128 x 128 tiles keep their split partners' partial sums (64 KB each) in the stage
    ring: 3 partners fit, a split of 8 is a ValueError, not a write past it."""
    from mllm_kernel.cuda.jit.gemm import TileChoice, _launch

    a, b = _operands(256, 256, 1024, torch.bfloat16)
    out = torch.empty(256, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"split must be in \[1, 4\] for this tile, got 8"):
        _launch(a, b, out, None, TileChoice(gemm_module._BY_NAME["128x128"], 8))


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("m", "n", "k"),
    [(256, 4096, 1024), (200, 4096, 2048), (129, 4104, 1000), (200, 4104, 6152), (100, 9000, 1032)],
)
def test_gemm_mid_m_choices(gemm_path, m, n, k):
    """M = 129-256 where choose_tile takes the swapped 128-token tile over two tile-rows
    or, with a long k-loop (K = 6152), 128 x 128 tiles with K split in two, and M = 100
    where it takes 128 x 128 tiles without a cluster (tests/test_gemm_choice.py),
    through the public call, into a poisoned output."""
    from mllm_kernel.cuda.jit import gemm

    a, b = _operands(m, n, k, torch.bfloat16)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm(a, b, out=out)
    _check(out, a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 7, 129, 1000])
def test_gemm_fp32_out_and_bias(gemm_path, dtype, m):
    from mllm_kernel.cuda.jit import gemm

    n, k = 1000, 4104
    a, b = _operands(m, n, k, dtype)
    bias32 = torch.randn(n, device="cuda")
    out = gemm(a, b, bias=bias32, out_dtype=torch.float32)
    assert out.dtype == torch.float32 and out.shape == (m, n)
    _check(out, a, b, bias32)
    bias = torch.randn(n, device="cuda").to(dtype)
    _check(gemm(a, b, bias=bias), a, b, bias)
    poisoned = torch.full((m, n), float("nan"), device="cuda")
    assert gemm(a, b, poisoned, out_dtype=torch.float32) is poisoned
    _check(poisoned, a, b)
    named = gemm(a, b, bias=bias32, out_dtype="float32")  # a name, as Gemm takes it
    assert named.dtype == torch.float32
    _check(named, a, b, bias32)


@pytest.mark.cuda
def test_run_gemm_is_the_kernel_with_the_chosen_tile(gemm_path):
    """run_gemm (for ops built on the GEMM) writes out in out's dtype, or in out_dtype;
    its tensors are checked in C++ as gemm's are."""
    from mllm_kernel.cuda.jit.gemm import run_gemm

    a, b = _operands(7, 136, 1000, torch.bfloat16)
    out = torch.full((7, 136), float("nan"), device="cuda")
    assert run_gemm(a, b, out) is out
    _check(out, a, b)
    bias = torch.randn(136, device="cuda").to(torch.bfloat16)
    out16 = torch.full((7, 136), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert run_gemm(a, b, out16, bias, torch.bfloat16) is out16
    _check(out16, a, b, bias)
    with pytest.raises(TypeError, match=r"^argument 'out': expected dtype in \{bfloat16\}"):
        run_gemm(a, b, out, out_dtype=torch.bfloat16)


@pytest.mark.cuda
@pytest.mark.parametrize("m", [1, 129])
def test_gemm_k_zero(gemm_path, m):
    from mllm_kernel.cuda.jit import gemm

    a = torch.empty(m, 0, device="cuda", dtype=torch.bfloat16)
    b = torch.empty(72, 0, device="cuda", dtype=torch.bfloat16)
    out = torch.full((m, 72), float("nan"), device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(72, device="cuda").to(torch.bfloat16)
    gemm(a, b, out, bias=bias)
    torch.testing.assert_close(out, bias.expand(m, 72), rtol=0, atol=0)
    assert gemm(a, b).eq(0).all()


@pytest.mark.cuda
@pytest.mark.parametrize("m", [1, 7, 1000])
@pytest.mark.parametrize("out_pad", [8, 2])
def test_gemm_strided_rows(gemm_path, m, out_pad):
    """Slices of bigger buffers: row strides larger than the rows, for a, b and out. An
    out pitch of 16-byte multiples leaves through TMA stores, others (pad 2) directly."""
    from mllm_kernel.cuda.jit import gemm

    n, k = 136, 1000
    a_big, b_big = _operands(m, n + 24, k + 40, torch.bfloat16)
    a, b = a_big[:, 8 : k + 8], b_big[:n, 16 : k + 16]
    out_big = torch.full((m, n + out_pad), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = out_big[:, :n]
    gemm(a, b, out)
    _check(out, a, b)
    assert out_big[:, n:].isnan().all(), "wrote outside out"


@pytest.mark.cuda
@pytest.mark.parametrize("view", ["slice", "transposed-column"])
def test_gemm_one_row_takes_any_row_stride(gemm_path, view):
    """One token whose row stride is no multiple of 16 bytes (a [1, K] slice of a wider
    row; a column transposed, strides (1, 1)), into an out of an odd row stride: only the
    first row is read or written, so any stride is taken, TMA's tensor maps included."""
    from mllm_kernel.cuda.jit import gemm

    n, k = 136, 1000
    if view == "slice":
        a = torch.randn(1, k + 4, device="cuda").to(torch.bfloat16)[:, :k]
    else:
        a = torch.randn(k, 1, device="cuda").to(torch.bfloat16).t()
    assert a.stride(0) * 2 % 16
    b = torch.randn(n, k, device="cuda").to(torch.bfloat16)
    out_big = torch.full((1, n + 3), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = out_big[:, :n]
    gemm(a, b, out)
    _check(out, a, b)
    assert out_big[:, n:].isnan().all(), "wrote outside out"


@pytest.mark.cuda
def test_gemm_sizes_past_32_bits_are_refused(gemm_path):
    """K of 2^31 bytes a row is refused naming the argument, where the kernels' 32-bit
    counts would wrap. One row is allocated (2 GiB; the last dim must be contiguous) and
    b repeats it with a row stride of 0."""
    from mllm_kernel.cuda.jit import gemm

    k = 2**30  # bf16: 2^31 bytes a row
    a = torch.empty(1, k, device="cuda", dtype=torch.bfloat16)
    b = a.expand(8, k)
    with pytest.raises(ValueError, match=r"^argument 'a': K must be under 2\^31 bytes a row"):
        gemm(a, b)


@pytest.mark.cuda
def test_gemm_cuda_graph_and_side_stream(gemm_path):
    from mllm_kernel.cuda.jit import gemm

    a, b = _operands(7, 4104, 1000, torch.bfloat16)
    big_a, _ = _operands(1000, 8, 1000, torch.bfloat16)
    out = torch.empty(7, 4104, device="cuda", dtype=torch.bfloat16)
    big_out = torch.empty(1000, 4104, device="cuda", dtype=torch.bfloat16)
    gemm(a, b, out)  # build and load outside the capture
    gemm(big_a, b, big_out)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        gemm(a, b, out)
        gemm(big_a, b, big_out)
    for _ in range(2):
        a.copy_(torch.randn_like(a, dtype=torch.float32))
        big_a.copy_(torch.randn_like(big_a, dtype=torch.float32))
        out.fill_(float("nan"))
        big_out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(out, a, b)
        _check(big_out, big_a, b)


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_gemm_on_second_gpu(gemm_path):
    from mllm_kernel.cuda.jit import gemm

    with torch.cuda.device(0):
        a, b = _operands(129, 1000, 4104, torch.bfloat16, device="cuda:1")
        out = gemm(a, b)
        assert out.device == torch.device("cuda:1")
        _check(out, a, b)
        with pytest.raises(ValueError, match=r"argument 'b'.*device"):
            gemm(a, b.to("cuda:0"))


@pytest.mark.cuda
def test_gemm_object(gemm_path):
    from mllm_kernel.cuda import Gemm
    from mllm_kernel.cuda.jit.gemm import plan_for

    op = Gemm(7, 4104, 1000)
    assert op.wgmma is (gemm_path == "wgmma")
    assert op.tile_config == plan_for(7, 4104, 1000, op.wgmma, op.num_sms).choice
    assert Gemm.choose_tile(4096, 4096, 4096).tile.name == "128x256-mc2"
    a, b = _operands(7, 4104, 1000, torch.bfloat16)
    _check(op(a, b), a, b)
    # numpy in, numpy out (bf16 results come back as float32: numpy has no bf16).
    a_np = np.random.randn(7, 1000).astype(np.float32)
    b_np = np.random.randn(4104, 1000).astype(np.float32)
    result = op(a_np, b_np)
    assert isinstance(result, np.ndarray) and result.dtype == np.float32
    a_t = torch.from_numpy(a_np).cuda().to(torch.bfloat16)
    b_t = torch.from_numpy(b_np).cuda().to(torch.bfloat16)
    _check(torch.from_numpy(result).cuda().to(torch.bfloat16), a_t, b_t)
    with pytest.raises(ValueError, match="expected a of shape \\[7, 1000\\]"):
        op(a[:5], b)
    half = Gemm(64, 72, 136, dtype="float16", out_dtype="float32")
    a16, b16 = _operands(64, 72, 136, torch.float16)
    out = half(a16, b16)
    assert out.dtype == torch.float32
    _check(out, a16, b16)


@pytest.mark.cuda
def test_gemm_bad_inputs(gemm_path):
    from mllm_kernel.cuda.jit import gemm

    a, b = _operands(16, 72, 136, torch.bfloat16)
    square, square2 = _operands(64, 64, 64, torch.bfloat16)
    cases = [
        ((a.half(), b), {}, TypeError, "argument 'b'.*dtype"),
        ((a, b.half()), {}, TypeError, "argument 'b'.*dtype"),
        ((a.float(), b.float()), {}, TypeError, "argument 'a'.*dtype"),
        ((a, b[:, :128]), {}, ValueError, "argument 'b'.*K"),
        ((a[:, :130], b[:, :130]), {}, ValueError, "argument 'a': K \\(130\\) must be a multiple"),
        ((a, b[:70]), {}, ValueError, "argument 'b': N \\(70\\) must be a multiple"),
        ((a.cpu(), b), {}, ValueError, "argument 'a': expected a tensor on cuda"),
        ((a, b.cpu()), {}, ValueError, "argument 'b'.*cuda"),
        # M, N and K pick the tile: the ranks are checked (in Python) before it is chosen
        ((a[0], b), {}, ValueError, r"^argument 'a': expected a 2-D tensor \[M, K\] but got"),
        ((a, b[None]), {}, ValueError, r"^argument 'b': expected a 2-D tensor \[N, K\] but got"),
        ((a, None), {}, TypeError, "argument 'b': expected a torch.Tensor"),
        (
            (a, b),
            {"out": torch.empty(16, 71, device="cuda", dtype=torch.bfloat16)},
            ValueError,
            "argument 'out'",
        ),
        # A 1-D out: the C++ check names it (the sm_80 path sized its workspace from out's
        # shape first: IndexError).
        (
            (a, b),
            {"out": torch.empty(16 * 72, device="cuda", dtype=torch.bfloat16)},
            ValueError,
            "argument 'out'",
        ),
        # out_dtype defaults to the input dtype, whatever out's dtype: say float32 to get it.
        ((a, b), {"out": torch.empty(16, 72, device="cuda")}, TypeError, "argument 'out'"),
        (
            (a, b),
            {"bias": torch.empty(71, device="cuda", dtype=torch.bfloat16)},
            ValueError,
            "argument 'bias'",
        ),
        ((a, b), {"bias": torch.empty(72, device="cuda")}, TypeError, "argument 'bias'"),
        ((a, b), {"out_dtype": torch.float16}, ValueError, "argument 'out_dtype'"),
        ((square, square2), {"out": square}, ValueError, "argument 'out': is the same memory"),
        ((square, square2), {"out": square2.T}, ValueError, "argument 'out'"),
        ((a.t(), b), {}, ValueError, "argument 'a'"),
        (
            (torch.empty(16, 140, device="cuda", dtype=torch.bfloat16)[:, :136], b),
            {},
            ValueError,
            "row stride must be a multiple of 8",
        ),
    ]
    for number, (args, kwargs, error, message) in enumerate(cases):
        print(f"case {number}: expecting {error.__name__} matching {message!r}")  # on failure
        with pytest.raises(error, match=message):
            gemm(*args, **kwargs)


@pytest.mark.cuda
@pytest.mark.parametrize("config", sm80_module.SM80_TILES, ids=lambda t: t.name)
def test_every_sm80_tile_and_split(config, monkeypatch):
    """Each sm_80 configuration (unsplit, split in 2 and in 16: slices with no k-blocks
    too), as compute_80 PTX, on shapes that cross its tails, with a bias and fp32 out."""
    from mllm_kernel.cuda.jit.gemm_sm80 import Sm80Choice, launch_gemm

    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("the sm_80 kernels need a GPU of compute capability 8.0 or newer")
    force_sm80_path(monkeypatch)
    m, n, k = 2 * config.tile_m + 3, 2 * config.tile_n + 8, 1000
    for split in (1, 2, 16):
        for dtype in DTYPES:
            a, b = _operands(m, n, k, dtype)
            bias = torch.randn(n, device="cuda").to(dtype)
            out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
            launch_gemm(a, b, out, bias, Sm80Choice(config, split))
            _check(out, a, b, bias)
            out32 = torch.full((m, n), float("nan"), device="cuda")
            launch_gemm(a, b, out32, None, Sm80Choice(config, split))
            _check(out32, a, b)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gemm_refuses_gpus_before_sm80(monkeypatch):
    monkeypatch.setattr(gemm_module, "_plans", {})
    monkeypatch.setattr(facts_module, "_matmul_paths", {})
    index = torch.cuda.current_device()
    turing = dataclasses.replace(facts_module.device_facts(index), capability=(7, 5))
    monkeypatch.setitem(facts_module._facts, index, turing)
    a, b = _operands(4, 8, 8, torch.bfloat16)
    with pytest.raises(NotImplementedError, match=r"^gemm runs on sm_80 and newer .*is sm_75"):
        gemm_module.gemm(a, b)
