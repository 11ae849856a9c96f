"""W4A16 / W8A16 in the Marlin format on a GPU: repacks bit for bit against the
pure-torch layout (tests/marlin_reference.py), and gptq_marlin_gemm against a float64
product with the dequantized weight, (q - zero) * scale, over M, shapes with tails,
both activation dtypes, every group size and weight type (fp8 e4m3 too: fp8(q) * scale;
NVFP4: e2m1(q) * scale * global scale), act-order, zero points, c=, split-K, Hopper's
fused wgmma and dequantize + GEMM paths, CUDA graphs and a second GPU."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from marlin_reference import dequantize, marlin_layout, pack_awq, pack_gptq

from mllm_kernel.cuda.jit import (
    awq_marlin_repack,
    awq_to_marlin_zero_points,
    gptq_marlin_gemm,
    gptq_marlin_repack,
    marlin_make_workspace,
    marlin_permute_scales,
    scalar_types,
)
from mllm_kernel.cuda.jit import gptq_marlin as gptq_marlin_module
from mllm_kernel.cuda.jit.marlin_format import (
    fp8_fused_exponent_bias_into_scales,
    nvfp4_marlin_process_global_scale,
    nvfp4_marlin_process_scales,
)

pytestmark = pytest.mark.cuda

DTYPES = [torch.float16, torch.bfloat16]
# The e2m1 codes' values (sign, 2 exponent bits with bias 1, 1 mantissa bit), by hand.
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
E2M1_VALUES = torch.cat([E2M1_VALUES, -E2M1_VALUES])


def _e4m3(codes: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn bytes ``codes`` as float32 values."""
    return codes.to(torch.uint8).view(torch.float8_e4m3fn).float()


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize(("k", "n"), [(16, 64), (272, 192), (1024, 640)])
def test_gptq_repack_matches_layout_reference(bits, k, n):
    torch.manual_seed(k + n + bits)
    q = torch.randint(0, 2**bits, (k, n))
    packed = pack_gptq(q, bits)
    out = gptq_marlin_repack(packed.cuda(), None, k, n, bits)
    assert torch.equal(out.cpu(), marlin_layout(q, bits))
    empty = torch.empty(0, dtype=torch.int32, device="cuda")
    assert torch.equal(gptq_marlin_repack(packed.cuda(), empty, k, n, bits), out)
    perm = torch.randperm(k, dtype=torch.int32)
    permuted = gptq_marlin_repack(packed.cuda(), perm.cuda(), k, n, bits)
    assert torch.equal(permuted.cpu(), marlin_layout(q[perm.long()], bits))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize(("k", "n"), [(16, 64), (272, 192), (1024, 640)])
def test_awq_repack_matches_layout_reference(bits, k, n):
    torch.manual_seed(k * n + bits)
    q = torch.randint(0, 2**bits, (k, n))
    out = awq_marlin_repack(pack_awq(q, bits).cuda(), k, n, bits)
    assert torch.equal(out.cpu(), marlin_layout(q, bits))


def test_gptq_repack_rejects_out_of_range_perm():
    packed = torch.zeros(16, 64, dtype=torch.int32, device="cuda")
    bad = torch.full((128,), 128, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match=r"argument 'perm'.*\[0, 128\)"):
        gptq_marlin_repack(packed, bad, 128, 64, 4)


class Weights:
    """A random quantized weight [K, N], its Marlin tensors and its float64 dequant."""

    def __init__(
        self, k, n, dtype, type_name="uint4b8", group_size=128, act_order=False,
        zp_float=False, device="cuda",
    ):  # fmt: skip
        scalar_type = getattr(scalar_types, type_name)
        bits = scalar_type.size_bits
        self.type_id, self.n = scalar_type.id, n
        groups = 1 if group_size == -1 else k // group_size
        q = torch.randint(0, 2**bits, (k, n))
        self.global_scale = None
        if scalar_type == scalar_types.float4_e2m1f:
            self._nvfp4(q, k, n, dtype, group_size, device)
            return
        fp8 = scalar_type == scalar_types.float8_e4m3fn
        if fp8:
            # Every byte but the two NaNs (0x7f, 0xff): subnormals, both zeros, +-448.
            q = torch.randint(0, 254, (k, n))
            q += (q >= 0x7F).long()
        scales = (torch.rand(groups, n) * 0.02 + 0.005).to(dtype)
        if act_order:
            rows_group = torch.arange(k) // group_size
            rows_group = rows_group[torch.randperm(k)]  # GPTQ's g_idx: a group per input row
            perm = torch.argsort(rows_group, stable=True).to(torch.int32)
            self.g_idx = rows_group[perm.long()].to(torch.int32).to(device)
            self.perm = perm.to(device)
        else:
            rows_group = torch.arange(k) // (k if group_size == -1 else group_size)
            perm, self.g_idx, self.perm = None, None, None
        self.b_q_weight = gptq_marlin_repack(pack_gptq(q, bits).to(device), self.perm, k, n, bits)
        self.b_scales = marlin_permute_scales(scales, k, n, group_size).to(device)
        self.b_zeros, self.is_zp_float = None, zp_float
        if fp8:
            # The kernel's fp8 weights leave the exponent bias to the scales.
            self.b_scales = fp8_fused_exponent_bias_into_scales(self.b_scales)
            values = q.to(torch.uint8).view(torch.float8_e4m3fn).double()
            self.w = dequantize(values, scales, 0.0, rows_group).to(device)
            return
        if scalar_type.bias:
            zeros = float(scalar_type.bias)
        elif zp_float:
            zeros = (torch.rand(groups, n) * 2**bits).to(dtype)
            self.b_zeros = marlin_permute_scales(zeros, k, n, group_size).to(device)
        else:
            zeros = torch.randint(0, 2**bits, (groups, n))
            self.b_zeros = awq_to_marlin_zero_points(pack_awq(zeros, bits), k, n, bits).to(device)
        self.w = dequantize(q, scales, zeros, rows_group).to(device)  # [K, N] float64

    def _nvfp4(self, q, k, n, dtype, group_size, device):
        """NVFP4 as vLLM prepares it: e2m1 codes q packed as 4-bit weights, e4m3 scales
        per 16 rows (every non-negative value: zero, subnormals, 448), permuted then
        processed into the kernel's bytes, and a global scale in a's dtype, processed."""
        assert group_size == 16, "NVFP4 takes groups of 16"
        self.b_q_weight = gptq_marlin_repack(pack_gptq(q, 4).to(device), None, k, n, 4)
        scales = _e4m3(torch.randint(0, 0x7F, (k // 16, n)))
        permuted = marlin_permute_scales(scales, k, n, 16)
        self.b_scales = nvfp4_marlin_process_scales(permuted).to(device)
        g = (torch.rand(()) * 2e-3 + 1e-4).to(dtype)
        self.global_scale = nvfp4_marlin_process_global_scale(g).to(device)
        self.b_zeros, self.is_zp_float, self.g_idx, self.perm = None, False, None, None
        rows_group = torch.arange(k) // 16
        self.w = dequantize(E2M1_VALUES[q], scales * g.double(), 0.0, rows_group).to(device)


def _run(w: Weights, a: torch.Tensor, c=None, workspace=None):
    m, k = a.shape
    return gptq_marlin_gemm(
        a, c, w.b_q_weight, w.b_scales, w.global_scale, w.b_zeros, w.g_idx, w.perm,
        workspace if workspace is not None else marlin_make_workspace(a.device),
        w.type_id, m, w.n, k, is_zp_float=w.is_zp_float,
    )  # fmt: skip


def _check(out: torch.Tensor, a: torch.Tensor, w: Weights):
    """Within what 16-bit weights (each (q - zero) * scale rounded once) and a rounded
    16-bit output allow: 2**-7 of sum |a| |w| per element, the bf16 unit roundoff x 2."""
    assert not out.isnan().any(), "NaN in the output: an element was not written"
    ref = a.double() @ w.w
    bound = (a.double().abs() @ w.w.abs()) * 2**-7 + 1e-6
    err = (out.double() - ref).abs()
    worst = (err / bound).max().item()
    assert worst <= 1, f"error {err.max().item():.3g} exceeds the bound by {worst:.2f}x"


# (N, K): less than one 256-column CTA, 1.25 and 1.75 CTAs, K slices of 18 k16 tiles (not
# whole 8-tile ring turns), and a Llama shape.
SHAPES = [(192, 256), (320, 1152), (448, 1408), (4096, 4096)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 8, 13, 16, 64, 257, 1024])
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_gemm_uint4b8_group128(dtype, m, n, k):
    torch.manual_seed(m + n + k)
    w = Weights(k, n, dtype, group_size=128)
    a = torch.randn(m, k, device="cuda").to(dtype)
    _check(_run(w, a), a, w)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [9, 12, 16])
@pytest.mark.parametrize(
    ("type_name", "group_size"), [("uint4b8", 128), ("uint4", 64), ("uint4b8", -1)]
)
def test_narrow_layers_take_the_fused_kernel_from_9_tokens(dtype, m, type_name, group_size):
    """On Hopper, 9-16 tokens on a layer whose K the fused kernel splits in 4 (its sums
    meeting in memory) run the fused kernel's 32-token build, rows past M empty: with
    the type's zero or zero points, grouped or channelwise scales."""
    if not _hopper():
        pytest.skip("the fused kernel needs sm_90 with sm_90a code")
    n, k = 2048, 4096
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    how = gptq_marlin_module.plan(m, n, k, sms, True, sms, fusable=True)
    assert (how.fused_tokens, how.fused_sums_in_memory) == (32, True)
    torch.manual_seed(m)
    w = Weights(k, n, dtype, type_name, group_size)
    a = torch.randn(m, k, device="cuda").to(dtype)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    _check(_run(w, a, c=c), a, w)


# The weights the deferred-scale kernels (8 and 16 tokens) take, with the output's unit
# roundoff.
DEFERRED_WEIGHTS = [
    (dtype, 2**-11 if dtype == torch.float16 else 2**-8, name)
    for dtype in DTYPES
    for name in ("uint4b8", "uint4", "uint8b128")
    if gptq_marlin_module._defers_scales(dtype, getattr(scalar_types, name).size_bits, False)
]


@pytest.fixture
def streaming(monkeypatch):
    """Runs a test's calls of up to 16 tokens on the streaming kernel, which Hopper
    otherwise gives the fused kernel on layers whose K it splits in 4 or more."""
    monkeypatch.setattr(gptq_marlin_module, "FUSED_SPLIT_MIN_M", gptq_marlin_module.FUSED_MIN_M)
    monkeypatch.setattr(gptq_marlin_module, "_calls", {})  # planned so


@pytest.mark.parametrize(("dtype", "unit_roundoff", "type_name"), DEFERRED_WEIGHTS)
@pytest.mark.parametrize("m", [1, 5, 8, 13, 16])
def test_gemm_activations_with_a_large_common_mean(streaming, dtype, unit_roundoff, type_name, m):
    """Up to 16 tokens the kernel sums magic + step q and removes the magic per group:
    activations of mean 4 and spread 1 make those sums several times the result. The
    output must still be within its own rounding of the float64 product (plus 1/4 of a
    unit of the mean magnitude), far tighter than _check's bound."""
    torch.manual_seed(m)
    k, n = 4096, 512
    w = Weights(k, n, dtype, type_name, group_size=128)
    a = (torch.randn(m, k, device="cuda") + 4).to(dtype)
    ref = a.double() @ w.w
    err = (_run(w, a).double() - ref).abs()
    bound = (ref.abs() + ref.abs().mean() / 4) * unit_roundoff
    worst = (err / bound).max().item()
    assert worst <= 1, f"error {err.max().item():.3g} exceeds the bound by {worst:.2f}x"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("type_name", ["uint4b8", "uint4", "uint8b128", "uint8"])
@pytest.mark.parametrize("group_size", [-1, 32, 64, 128])
@pytest.mark.parametrize("m", [5, 13, 40])
def test_gemm_types_and_groups(dtype, type_name, group_size, m):
    torch.manual_seed(m + group_size)
    w = Weights(1152, 320, dtype, type_name, group_size)
    a = torch.randn(m, 1152, device="cuda").to(dtype)
    _check(_run(w, a), a, w)


def _hopper() -> bool:
    return gptq_marlin_module._device_facts(torch.cuda.current_device())[1]


@pytest.fixture(params=gptq_marlin_module._FUSED_TOKENS)
def fused_tokens(request, monkeypatch):
    """Runs a test with the fused kernel built for each token tile (Hopper only)."""
    if not _hopper():
        pytest.skip("the fused kernel needs sm_90 with sm_90a code")
    monkeypatch.setattr(gptq_marlin_module, "_FUSED_TOKENS", (request.param,))
    monkeypatch.setattr(gptq_marlin_module, "_calls", {})  # planned with every tile
    return request.param


# (N, K, M): one 128-column CTA; half a CTA of columns past the last whole one with K
# not a multiple of the 64-k block (group 32 ends mid-block); several token tiles, the
# last one partial; K shorter than one 64-k block (per-channel scales only); the fewest
# tokens planned fused (FUSED_MIN_M), just over half the smallest tile.
FUSED_SHAPES = [
    (128, 256, 64),
    (320, 1120, 100),
    (1024, 2048, 515),
    (192, 48, 40),
    (256, 512, 17),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("type_name", ["uint4b8", "uint4"])
@pytest.mark.parametrize("group_size", [-1, 32, 128])
@pytest.mark.parametrize(("n", "k", "m"), FUSED_SHAPES)
def test_fused_gemm_types_groups_and_tiles(fused_tokens, dtype, type_name, group_size, n, k, m):
    if k % abs(group_size):
        pytest.skip("the group size does not divide K")
    torch.manual_seed(m + n + group_size)
    w = Weights(k, n, dtype, type_name, group_size)
    a = torch.randn(m, k, device="cuda").to(dtype)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert gptq_marlin_module.plan(m, n, k, sms, True, sms, fusable=True).fused_tokens == (
        fused_tokens
    )
    c = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    _check(_run(w, a, c=c), a, w)


@pytest.mark.parametrize("type_name", ["uint4b8", "uint4"])
@pytest.mark.parametrize("group_size", [-1, 32, 64])
def test_fused_gemm_splits_k_over_slices(fused_tokens, type_name, group_size):
    """Two column tiles and 65 k-blocks: K splits as far as the tile allows, unevenly
    (in 4 for 32 and 64 tokens: through global memory; in 2 for the others: in a
    cluster); the partial sums add up in a fixed order whichever slice ends last, and
    the tiles' counters are left at zero."""
    n, k, m = 256, 4160, 70
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    how = gptq_marlin_module.plan(m, n, k, sms, True, sms, fusable=True)
    most = gptq_marlin_module._FUSED_MAX_SPLIT[fused_tokens]
    assert how.fused_split == 1 << (most.bit_length() - 1)  # splits double
    assert how.fused_sums_in_memory == (how.fused_split > 2)
    torch.manual_seed(group_size)
    w = Weights(k, n, torch.bfloat16, type_name, group_size)
    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    workspace = marlin_make_workspace("cuda")
    out = _run(w, a, workspace=workspace)
    _check(out, a, w)
    assert not workspace.any(), "split-K counters must be left zeroed"
    for _ in range(5):
        assert torch.equal(_run(w, a, workspace=workspace), out), "sums in a fixed order"


def _fused_split_call(m, n, k):
    """The fused module of the planned token tile for an ``m x n x k`` product, the
    arguments of a launch before its split, its tiles and token tile, and its (a,
    Weights, c); bf16 uint4b8 group 128."""
    index = torch.cuda.current_device()
    sms = torch.cuda.get_device_properties(index).multi_processor_count
    tokens = gptq_marlin_module.plan(m, n, k, sms, True, sms, fusable=True).fused_tokens
    w = Weights(k, n, torch.bfloat16, "uint4b8", 128)
    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    zero = gptq_marlin_module._ZERO_MODE["bias"]
    module = gptq_marlin_module._FUSED[index, torch.bfloat16, tokens, zero]
    tiles = -(-m // tokens) * -(-n // gptq_marlin_module._FUSED_COLS)
    bias = scalar_types.uint4b8.bias
    args = (a, w.b_q_weight, w.b_scales, None, marlin_make_workspace("cuda"), c, m, n, k, bias)
    return module, args, tiles, tokens, (a, w, c)


def test_fused_gemm_split_partials_poisoned_and_refused_when_short():
    """A split launch whose sums meet in global memory writes every partial it reads (a
    NaN-filled buffer gives the right product) and leaves its counters at zero, and it
    refuses partials or counters too few for its tiles, misaligned partials and a start
    before the previous launch ends."""
    if not _hopper():
        pytest.skip("the fused kernel needs sm_90 with sm_90a code")
    torch.manual_seed(3)
    m, n, k, split = 40, 512, 2048, 4
    module, args, tiles, tokens, (a, w, c) = _fused_split_call(m, n, k)
    floats = tiles * split * gptq_marlin_module._FUSED_PARTIAL_FLOATS[tokens]
    partials = torch.full((floats,), float("nan"), device="cuda")
    module.fused(*args, split, 0, tiles, False, partials)
    _check(c, a, w)
    assert not args[4].any(), "split-K counters must be left zeroed"
    with pytest.raises(RuntimeError, match=r"partials of \d+ floats, a split launch needs"):
        module.fused(*args, split, 0, tiles, False, partials[:-1])
    with pytest.raises(RuntimeError, match="partials must be 16-byte aligned"):
        module.fused(*args, split, 0, tiles, False, torch.empty(floats + 1, device="cuda")[1:])
    with pytest.raises(RuntimeError, match="sum in memory cannot overlap the previous one"):
        module.fused(*args, split, 0, tiles, True, partials)
    # More tiles than the workspace has counters (one per SM): no plan splits those.
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    wide = 128 * (sms + 1)
    module, args, tiles, tokens, _ = _fused_split_call(m, wide, 1024)
    floats = tiles * split * gptq_marlin_module._FUSED_PARTIAL_FLOATS[tokens]
    partials = torch.empty(floats, device="cuda")
    with pytest.raises(RuntimeError, match=f"{tiles} tiles needs as many counters"):
        module.fused(*args, split, 0, tiles, False, partials)


@pytest.fixture
def three_sms(monkeypatch):
    """Runs a test on a Hopper GPU taken to have 3 SMs, so that few tiles make a tail."""
    if not _hopper():
        pytest.skip("the fused kernel needs sm_90 with sm_90a code")
    index = torch.cuda.current_device()
    _, hopper, clusters = gptq_marlin_module._device_facts(index)
    monkeypatch.setitem(gptq_marlin_module._devices, index, (3, hopper, clusters))
    monkeypatch.setattr(gptq_marlin_module, "_calls", {})  # planned for 3 SMs


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_gemm_runs_a_mostly_empty_last_wave_split(dtype, three_sms):
    """Four output tiles on 3 SMs: three in one launch, the fourth in a second one with
    K split in two."""
    n, k, m = 512, 1024, 64
    assert gptq_marlin_module.plan(m, n, k, 3, True, 3, fusable=True).fused_tail == 1
    torch.manual_seed(1)
    w = Weights(k, n, dtype, "uint4", 64)
    a = torch.randn(m, k, device="cuda").to(dtype)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    _check(_run(w, a, c=c), a, w)


def test_fused_gemm_tail_launch_in_a_graph_feeds_the_next_kernel(three_sms):
    """The tail launch may start before the first one ends (it writes other tiles); the
    kernel after both must still see every tile, replay after replay."""
    n, k, m = 512, 1024, 64
    assert gptq_marlin_module.plan(m, n, k, 3, True, 3, fusable=True).fused_tail == 1
    torch.manual_seed(2)
    w = Weights(k, n, torch.bfloat16, "uint4b8", 128)
    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    doubled = torch.empty_like(c)
    workspace = marlin_make_workspace("cuda")
    _run(w, a, c=c, workspace=workspace)  # builds the module outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _run(w, a, c=c, workspace=workspace)
        torch.mul(c, 2, out=doubled)
    for _ in range(3):
        c.fill_(float("nan"))
        doubled.fill_(float("nan"))
        a.copy_(torch.randn(m, k, device="cuda").to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        _check(c, a, w)
        assert torch.equal(doubled, c * 2), "the next kernel ran before the tail's tiles"


@pytest.mark.parametrize("m", [40, 300])
def test_fused_gemm_output_not_16_byte_aligned(m):
    """A c that starts 2 bytes past an allocation: the fused kernel's TMA stores need 16,
    so the op computes into an aligned buffer and copies."""
    if not _hopper():
        pytest.skip("the fused kernel needs sm_90 with sm_90a code")
    n, k = 256, 512
    torch.manual_seed(m)
    w = Weights(k, n, torch.float16)
    a = torch.randn(m, k, device="cuda").to(torch.float16)
    c = torch.full((m * n + 1,), float("nan"), device="cuda", dtype=torch.float16)[1:]
    c = c.view(m, n)
    assert c.data_ptr() % 16
    out = _run(w, a, c=c)
    assert out.data_ptr() == c.data_ptr()
    _check(c, a, w)


@pytest.mark.parametrize("group_size", [64, 256])
def test_fused_gemm_other_group_sizes(group_size):
    if not _hopper():
        pytest.skip("the fused kernel needs sm_90 with sm_90a code")
    torch.manual_seed(group_size)
    w = Weights(1024, 256, torch.bfloat16, "uint4", group_size)
    a = torch.randn(200, 1024, device="cuda").to(torch.bfloat16)
    _check(_run(w, a), a, w)


def test_fused_gemm_strided_rows():
    if not _hopper():
        pytest.skip("the fused kernel needs sm_90 with sm_90a code")
    w = Weights(512, 128, torch.float16)
    big = torch.randn(300, 1024, device="cuda").to(torch.float16)
    a = big[:, 256:768]  # row stride 1024
    _check(_run(w, a), a, w)
    with pytest.raises(ValueError, match="argument 'a': rows must start on 16-byte"):
        _run(w, big[:, 3:515])


@pytest.fixture(params=["cluster", "global"])
def split_sums(request, monkeypatch):
    """Runs a test with K slices summed in a cluster's shared memory (where the GPU has
    clusters) and again through global memory (the path of GPUs without them)."""
    index = torch.cuda.current_device()
    sms, hopper, clusters = gptq_marlin_module._device_facts(index)
    if request.param == "cluster" and not clusters:
        pytest.skip("this GPU's code has no thread-block clusters")
    monkeypatch.setitem(
        gptq_marlin_module._devices, index, (sms, hopper, request.param == "cluster")
    )
    # the streaming kernel's sums: up to 16 tokens, not the fused kernel's
    monkeypatch.setattr(gptq_marlin_module, "FUSED_SPLIT_MIN_M", gptq_marlin_module.FUSED_MIN_M)
    monkeypatch.setattr(gptq_marlin_module, "_calls", {})  # planned for these sums
    return request.param


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("type_name", ["uint4b8", "uint4", "uint8b128"])
@pytest.mark.parametrize("m", [1, 3, 8, 9, 13, 16, 40])
def test_gemm_k_slices_starting_inside_a_group(split_sums, dtype, type_name, m):
    """Group 512 over K = 2560: every plan's slices (320 or 256 rows) start mid-group.
    m = 9 and 13 leave the second 8-token block of a 16-token CTA partly empty."""
    n, k = 4096, 2560
    sms, hopper, clusters = gptq_marlin_module._devices[torch.cuda.current_device()]
    bits = getattr(scalar_types, type_name).size_bits
    eight_rows = gptq_marlin_module._defers_scales(dtype, bits, False)
    how = gptq_marlin_module.plan(m, n, k, sms, hopper, sms, clusters, eight_rows=eight_rows)
    assert how.split > 1 and how.cluster == (split_sums == "cluster")
    assert how.k_tiles_per_split * 16 % 512
    torch.manual_seed(m)
    w = Weights(k, n, dtype, type_name, group_size=512)
    a = torch.randn(m, k, device="cuda").to(dtype)
    _check(_run(w, a), a, w)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("type_name", ["uint4b8", "uint8b128"])
@pytest.mark.parametrize("m", [1, 16, 64, 1024])
def test_gemm_act_order(dtype, type_name, m):
    torch.manual_seed(m)
    w = Weights(1024, 256, dtype, type_name, group_size=128, act_order=True)
    a = torch.randn(m, 1024, device="cuda").to(dtype)
    _check(_run(w, a), a, w)


def test_gemm_act_order_k_not_full_takes_uneven_groups():
    """A K shard of a row-parallel layer: its rows belong to groups of any size."""
    torch.manual_seed(3)
    dtype, k, n = torch.float16, 512, 128
    w = Weights(k, n, dtype, group_size=128, act_order=True)
    a = torch.randn(7, k, device="cuda").to(dtype)
    out = gptq_marlin_gemm(
        a, None, w.b_q_weight, w.b_scales, None, None, w.g_idx, w.perm,
        marlin_make_workspace("cuda"), w.type_id, 7, n, k, is_k_full=False,
    )  # fmt: skip
    _check(out, a, w)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 13, 64, 1024])
def test_gemm_float_zero_points(dtype, m):
    torch.manual_seed(m + 11)
    w = Weights(512, 256, dtype, "uint4", group_size=64, zp_float=True)
    a = torch.randn(m, 512, device="cuda").to(dtype)
    _check(_run(w, a), a, w)


@pytest.mark.parametrize("m", [1, 16, 64, 2048, 4096])
def test_gemm_writes_c_and_leaves_workspace_zero(m):
    torch.manual_seed(m)
    w = Weights(4096, 1024, torch.bfloat16)
    a = torch.randn(m, 4096, device="cuda").to(torch.bfloat16)
    c = torch.full((m, 1024), float("nan"), device="cuda", dtype=torch.bfloat16)
    workspace = marlin_make_workspace("cuda")
    out = _run(w, a, c=c, workspace=workspace)
    assert out.data_ptr() == c.data_ptr()
    _check(c, a, w)
    assert not workspace.any(), "split-K counters must be left zeroed"
    again = _run(w, a, workspace=workspace)
    assert torch.equal(again, c), "the reductions must add in a fixed order"


def test_gemm_strided_rows_and_empty_m():
    w = Weights(512, 128, torch.float16)
    big = torch.randn(9, 1024, device="cuda").to(torch.float16)
    a = big[:, 256:768]  # row stride 1024
    _check(_run(w, a), a, w)
    empty = torch.empty(0, 512, device="cuda", dtype=torch.float16)
    assert _run(w, empty).shape == (0, 128)


def test_gemm_plans_cover_both_paths():
    index = torch.cuda.current_device()
    sms = torch.cuda.get_device_properties(index).multi_processor_count
    _, hopper, _ = gptq_marlin_module._device_facts(index)
    assert gptq_marlin_module.plan(1024, 4096, 4096, sms, hopper, sms).dequant_gemm == hopper
    assert gptq_marlin_module.plan(1, 4096, 4096, sms, hopper, sms).split > 1


@pytest.mark.parametrize("m", [4, 300])
def test_gemm_cuda_graph_on_a_side_stream(m):
    torch.manual_seed(5)
    w = Weights(4096, 1024, torch.float16)
    a = torch.randn(m, 4096, device="cuda").to(torch.float16)
    workspace = marlin_make_workspace("cuda")
    c = torch.empty(m, 1024, device="cuda", dtype=torch.float16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _run(w, a, c=c, workspace=workspace)  # builds the module outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        _run(w, a, c=c, workspace=workspace)
    c.fill_(float("nan"))
    a.copy_(torch.randn(m, 4096, device="cuda").to(torch.float16))
    graph.replay()
    torch.cuda.synchronize()
    _check(c, a, w)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_gemm_on_second_gpu():
    w = Weights(1024, 256, torch.bfloat16, device="cuda:1")
    a = torch.randn(3, 1024, device="cuda:1").to(torch.bfloat16)
    out = _run(w, a)
    assert out.device == torch.device("cuda:1")
    _check(out, a, w)


def test_gemm_device_mismatch_names_the_argument():
    w = Weights(256, 128, torch.float16)
    a = torch.randn(2, 256).to(torch.float16)  # on the CPU
    with pytest.raises(ValueError, match="argument 'a'"):
        _run(w, a, workspace=marlin_make_workspace("cuda"))
    with pytest.raises(ValueError, match=r"workspace.*marlin_make_workspace"):
        _run(w, a.cuda(), workspace=torch.zeros(1, dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match="argument 'b_scales': expected a tensor on cuda"):
        gptq_marlin_gemm(
            a.cuda(), None, w.b_q_weight, w.b_scales.cpu(), None, None, None, None,
            marlin_make_workspace("cuda"), w.type_id, 2, w.n, 256,
        )  # fmt: skip


def test_gemm_plans_once_per_shape(monkeypatch):
    """A call plans its shape once; the next calls of that shape (and GPU, dtype and
    weight kind) find the plan."""
    monkeypatch.setattr(gptq_marlin_module, "_calls", {})
    planned = []
    plan = gptq_marlin_module.plan
    monkeypatch.setattr(
        gptq_marlin_module, "plan", lambda *a, **k: planned.append(a) or plan(*a, **k)
    )
    w = Weights(512, 256, torch.float16)
    a = torch.randn(3, 512, device="cuda").to(torch.float16)
    for _ in range(3):
        _check(_run(w, a), a, w)
    _run(w, a[:2])
    assert [p[:3] for p in planned] == [(3, 256, 512), (2, 256, 512)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group_size", [-1, 128])
@pytest.mark.parametrize("m", [1, 5, 16, 64, 300, 1024])
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_gemm_fp8_weights(dtype, group_size, m, n, k):
    """float8_e4m3fn weights (every non-NaN byte) repacked as 8-bit weights, channelwise
    or group-128 scales with the exponent bias fused in: against fp8(q) * scale in
    float64, into a NaN-poisoned c (every element written). On Hopper M = 300 and 1024
    run dequantize + GEMM, the smaller M (and everywhere else every M) the streaming
    kernel's fp8 builds."""
    torch.manual_seed(m + n + k + group_size)
    w = Weights(k, n, dtype, "float8_e4m3fn", group_size)
    a = torch.randn(m, k, device="cuda").to(dtype)
    c = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
    workspace = marlin_make_workspace("cuda")
    out = _run(w, a, c=c, workspace=workspace)
    assert out.data_ptr() == c.data_ptr()
    _check(out, a, w)
    assert not workspace.any(), "the workspace is left zeroed"


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_fp8_extreme_values_are_exact(dtype):
    """Weights of single fp8 values (the largest normal, the smallest subnormal and its
    negative, zero) in one column each, times a one-hot a: each output is one weight times
    its scale, which the kernel rounds once, like torch."""
    k, n = 256, 256
    values = torch.tensor([0x7E, 0x01, 0x81, 0x00, 0xFE, 0x08], dtype=torch.int64)
    q = values.repeat(n // len(values) + 1)[:n].expand(k, n).contiguous()
    scales = torch.full((1, n), 0.5, dtype=dtype)
    b_q_weight = gptq_marlin_repack(pack_gptq(q, 8).cuda(), None, k, n, 8)
    b_scales = fp8_fused_exponent_bias_into_scales(marlin_permute_scales(scales, k, n, -1)).cuda()
    a = torch.zeros(16, k, dtype=dtype, device="cuda")
    a[torch.arange(16), torch.arange(16) * 7] = 1
    out = gptq_marlin_gemm(
        a, None, b_q_weight, b_scales, None, None, None, None, marlin_make_workspace("cuda"),
        scalar_types.float8_e4m3fn.id, 16, n, k,
    )  # fmt: skip
    want = (q[0].to(torch.uint8).view(torch.float8_e4m3fn).double() * 0.5).to(dtype)
    assert torch.equal(out.cpu(), want.expand(16, n))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 5, 16, 64, 300, 1024])
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_gemm_nvfp4_weights(dtype, m, n, k):
    """NVFP4 weights (every e2m1 code, every non-negative e4m3 scale) prepared as vLLM
    prepares them: against e2m1(q) * scale * global in float64, into a NaN-poisoned c
    (every element written), the workspace left zeroed. On Hopper M = 300 and 1024 run
    dequantize + GEMM, the smaller M (and everywhere else every M) the streaming kernel's
    NVFP4 builds, split over K where the shape is small."""
    torch.manual_seed(m + n + k)
    w = Weights(k, n, dtype, "float4_e2m1f", 16)
    a = torch.randn(m, k, device="cuda").to(dtype)
    c = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
    workspace = marlin_make_workspace("cuda")
    out = _run(w, a, c=c, workspace=workspace)
    assert out.data_ptr() == c.data_ptr()
    _check(out, a, w)
    assert not workspace.any(), "the workspace is left zeroed"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 13, 40])
def test_gemm_nvfp4_k_split(split_sums, dtype, m):
    """NVFP4 with K split over several CTAs (summed in a cluster or through global
    memory): each slice's sums take the global scale before they are added."""
    n, k = 4096, 2560
    sms, hopper, clusters = gptq_marlin_module._devices[torch.cuda.current_device()]
    how = gptq_marlin_module.plan(m, n, k, sms, hopper, sms, clusters)
    assert how.split > 1 and how.cluster == (split_sums == "cluster")
    torch.manual_seed(m)
    w = Weights(k, n, dtype, "float4_e2m1f", 16)
    a = torch.randn(m, k, device="cuda").to(dtype)
    _check(_run(w, a), a, w)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [16, 300])
def test_gemm_nvfp4_single_values_are_exact(dtype, m):
    """Columns of single e2m1 codes (all 16, -0 included) under scales of every kind
    (zero, the smallest subnormal, a subnormal, 1, 448) and a global scale, times a
    one-hot a: each output is one code x scale x global, which the kernel rounds once,
    like torch (M = 300: dequantize + GEMM on Hopper, where the weight is rounded once
    and the GEMM multiplies it by one)."""
    k, n = 256, 256
    codes = torch.arange(n) % 16
    q = codes.expand(k, n).contiguous()
    scale_codes = torch.tensor([0x00, 0x01, 0x05, 0x38, 0x7E])[torch.arange(n) // 16 % 5]
    scales = _e4m3(scale_codes).expand(k // 16, n).contiguous()
    g = torch.tensor(0.0123, dtype=dtype)
    b_q_weight = gptq_marlin_repack(pack_gptq(q, 4).cuda(), None, k, n, 4)
    b_scales = nvfp4_marlin_process_scales(marlin_permute_scales(scales, k, n, 16)).cuda()
    global_scale = nvfp4_marlin_process_global_scale(g).cuda()
    a = torch.zeros(m, k, dtype=dtype, device="cuda")
    a[torch.arange(m), torch.arange(m) * 7 % k] = 1
    out = gptq_marlin_gemm(
        a, None, b_q_weight, b_scales, global_scale, None, None, None,
        marlin_make_workspace("cuda"), scalar_types.float4_e2m1f.id, m, n, k,
    )  # fmt: skip
    want = (E2M1_VALUES[codes] * scales[0].double() * g.double()).to(dtype)
    assert torch.equal(out.cpu(), want.expand(m, n))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_nvfp4_empty_global_scale_is_refused(dtype):
    """The original's way of passing no tensor (an empty one) is no global scale: NVFP4
    weights then have none, which the kernel refuses, naming the argument."""
    w = Weights(256, 128, dtype, "float4_e2m1f", 16)
    w.global_scale = torch.empty(0, dtype=dtype, device="cuda")
    a = torch.randn(3, 256, device="cuda").to(dtype)
    with pytest.raises(ValueError, match=r"argument 'global_scale': float4_e2m1f .* need"):
        _run(w, a)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_nvfp4_takes_a_0d_global_scale(dtype):
    """A 0-d global scale (as vLLM's and sglang's processing leaves a 0-d one) gives the
    [1] one's result."""
    torch.manual_seed(4)
    w = Weights(256, 128, dtype, "float4_e2m1f", 16)
    a = torch.randn(3, 256, device="cuda").to(dtype)
    want = _run(w, a)
    w.global_scale = w.global_scale.reshape(())
    assert torch.equal(_run(w, a), want)


# The tensors' checks, all in the kernels' C++ (marlin_layout.cuh's check_operands):
# each refusal names the argument, the expected and what came.
M, N, K = 3, 128, 256


def _gemm_args(**override):
    args = dict(
        a=_cuda(M, K, dtype=torch.float16).made(),
        c=None,
        b_q_weight=_cuda(K // 16, N * 2, dtype=torch.int32).made(),
        b_scales=_cuda(2, N, dtype=torch.float16).made(),
        global_scale=None,
        b_zeros=None,
        g_idx=None,
        perm=None,
        workspace=marlin_make_workspace("cuda"),
        b_q_type_id=scalar_types.uint4b8.id,
        size_m=M,
        size_n=N,
        size_k=K,
    )
    args.update(override)
    return args


@dataclass(frozen=True)
class _Zeros:
    """A zero GPU tensor made when the test runs (collecting needs no GPU): ``shape``,
    then every ``step``-th element of the last dim."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    step: int = 1
    offset: int = 0  # elements into a bigger buffer: a start off the usual alignment

    def made(self) -> torch.Tensor:
        if self.offset:
            flat = torch.zeros(math.prod(self.shape) + self.offset, dtype=self.dtype, device="cuda")
            return flat[self.offset :].view(self.shape)
        return torch.zeros(self.shape, dtype=self.dtype, device="cuda")[..., :: self.step]


def _cuda(*shape, dtype, step=1, offset=0):
    return _Zeros(shape, dtype, step, offset)


def _made(value):
    return value.made() if isinstance(value, _Zeros) else value


@pytest.mark.parametrize(
    ("override", "error", "match"),
    [
        ({"a": _cuda(M, K, 1, dtype=torch.float16)}, ValueError, "argument 'a'.*expected 2 dims"),
        ({"size_m": 4}, ValueError, r"argument 'size_m': expected 3 \(a.shape\[0\]\), got 4"),
        ({"size_k": 128}, ValueError, r"argument 'size_k': expected 256 \(a.shape\[1\]\)"),
        ({"size_m": -1}, ValueError, r"argument 'size_m': expected 3 \(a.shape\[0\]\), got -1"),
        (
            {"a": _cuda(M, 200, dtype=torch.float16), "size_k": 200},
            ValueError,
            "argument 'size_k': expected a positive multiple of 16",
        ),
        ({"size_n": 96}, ValueError, "argument 'size_n': expected a positive multiple of 64"),
        ({"size_n": 0}, ValueError, "argument 'size_n': expected a positive multiple of 64"),
        (
            {"b_q_weight": _cuda(K // 16, N, dtype=torch.int32)},
            ValueError,
            r"argument 'b_q_weight': expected shape \[16, 256\] \(size_k / 16, .*4-bit",
        ),
        (
            {"b_q_weight": _cuda(K // 16, N * 2, dtype=torch.int64)},
            TypeError,
            "argument 'b_q_weight': expected dtype in {int32} but got int64",
        ),
        ({"b_scales": _cuda(2, N, dtype=torch.bfloat16)}, TypeError, "argument 'b_scales'"),
        ({"b_scales": _cuda(2, 64, dtype=torch.float16)}, ValueError, "'b_scales'.*128"),
        ({"b_scales": _cuda(0, N, dtype=torch.float16)}, ValueError, "'b_scales'.*a group"),
        ({"b_scales": _cuda(16, N, dtype=torch.float16)}, ValueError, "group size"),
        ({"b_scales": _cuda(3, N, dtype=torch.float16)}, ValueError, "group size"),
        (
            {
                "b_q_type_id": scalar_types.uint4.id,
                "b_zeros": _cuda(2, N, dtype=torch.int32),
            },
            ValueError,
            r"argument 'b_zeros': expected shape \[2, 16\]",
        ),
        (
            {
                "b_q_type_id": scalar_types.uint4.id,
                "b_zeros": _cuda(2, N, dtype=torch.float32),
                "is_zp_float": True,
            },
            TypeError,
            "argument 'b_zeros'.*float16",
        ),
        (
            {"g_idx": _cuda(K, dtype=torch.int32)},
            ValueError,
            "argument 'perm': act-order needs both g_idx and perm",
        ),
        (
            {"g_idx": _cuda(K, dtype=torch.int64), "perm": _cuda(K, dtype=torch.int32)},
            TypeError,
            "argument 'g_idx'.*int32",
        ),
        (
            {"g_idx": _cuda(K, dtype=torch.int32), "perm": _cuda(K - 16, dtype=torch.int32)},
            ValueError,
            r"argument 'perm'.*\(size_k\) to be 256",
        ),
        (
            {
                "g_idx": _cuda(K, dtype=torch.int32),
                "perm": _cuda(K, dtype=torch.int32),
                "b_scales": _cuda(1, N, dtype=torch.float16),
            },
            ValueError,
            "act-order with is_k_full=True needs num_groups > 1",
        ),
        ({"workspace": _cuda(132, dtype=torch.int64)}, TypeError, "argument 'workspace'.*int32"),
        ({"c": _cuda(M, N, dtype=torch.bfloat16)}, TypeError, "argument 'c'"),
        ({"c": _cuda(M, N + 64, dtype=torch.float16)}, ValueError, "argument 'c'.*size_n"),
        ({"c": _cuda(M, 2 * N, dtype=torch.float16, step=2)}, ValueError, "argument 'c'.*contig"),
        # Starts off the kernels' copy sizes (slices of flat buffers): refused, not a fault.
        (
            {"c": _cuda(M, N, dtype=torch.float16, offset=1)},
            ValueError,
            "argument 'c': the data must start on a 4-byte boundary",
        ),
        (
            {"b_q_weight": _cuda(K // 16, N * 2, dtype=torch.int32, offset=1)},
            ValueError,
            "argument 'b_q_weight': the data must start on a 16-byte boundary",
        ),
        (
            {"b_scales": _cuda(2, N, dtype=torch.float16, offset=4)},
            ValueError,
            "argument 'b_scales': the data must start on a 16-byte boundary",
        ),
        # fp8 weights: 8-bit words, scales in a's dtype, per channel or groups of 128.
        (
            {"b_q_type_id": scalar_types.float8_e4m3fn.id},
            ValueError,
            r"argument 'b_q_weight': expected shape \[16, 512\] .*8-bit",
        ),
        (
            {
                "b_q_type_id": scalar_types.float8_e4m3fn.id,
                "b_q_weight": _cuda(K // 16, N * 4, dtype=torch.int32),
                "b_scales": _cuda(2, N, dtype=torch.float32),
            },
            TypeError,
            "argument 'b_scales': expected dtype in {float16} but got float32",
        ),
        (
            {
                "b_q_type_id": scalar_types.float8_e4m3fn.id,
                "b_q_weight": _cuda(K // 16, N * 4, dtype=torch.int32),
                "b_scales": _cuda(4, N, dtype=torch.float16),
            },
            ValueError,
            r"argument 'b_scales': 4 groups over size_k=256 is not a group size fp8 weights "
            r"take; expected -1 \(one group: per channel\) or 128",
        ),
        (
            {
                "b_q_type_id": scalar_types.float8_e4m3fn.id,
                "b_q_weight": _cuda(K // 16, N * 4, dtype=torch.int32),
                "b_scales": _cuda(8, N, dtype=torch.float16),
            },
            ValueError,
            "argument 'b_scales': 8 groups over size_k=256 is not a group size fp8",
        ),
        # NVFP4: float8_e4m3fn scales of 16-row groups, paired; a.dtype [1] global scale.
        (
            {
                "b_q_type_id": scalar_types.float4_e2m1f.id,
                "b_scales": _cuda(K // 16, N, dtype=torch.float8_e4m3fn),
            },
            ValueError,
            r"argument 'global_scale': float4_e2m1f \(NVFP4\) weights need their global "
            r"scale \(nvfp4_marlin_process_global_scale\), got none",
        ),
        (
            {
                "b_q_type_id": scalar_types.float4_e2m1f.id,
                "b_scales": _cuda(K // 16, N, dtype=torch.float8_e4m3fn),
                "global_scale": _cuda(1, dtype=torch.float32),
            },
            TypeError,
            "argument 'global_scale': expected dtype in {float16} but got float32",
        ),
        (
            {
                "b_q_type_id": scalar_types.float4_e2m1f.id,
                "b_scales": _cuda(K // 16, N, dtype=torch.float8_e4m3fn),
                "global_scale": _cuda(2, dtype=torch.float16),
            },
            ValueError,
            r"argument 'global_scale': expected one value \(\[1\] or 0-d\) but got shape \[2\]",
        ),
        (
            {
                "b_q_type_id": scalar_types.float4_e2m1f.id,
                "b_scales": _cuda(K // 16, N, dtype=torch.float16),
                "global_scale": _cuda(1, dtype=torch.float16),
            },
            TypeError,
            "argument 'b_scales': expected dtype in {float8_e4m3fn} but got float16",
        ),
        (
            {
                "b_q_type_id": scalar_types.float4_e2m1f.id,
                "b_scales": _cuda(K // 32, N, dtype=torch.float8_e4m3fn),
                "global_scale": _cuda(1, dtype=torch.float16),
            },
            ValueError,
            r"argument 'b_scales': 8 groups over size_k=256 is not the group size NVFP4 "
            r"weights take; expected size_k / 16 groups \(16 rows each\)",
        ),
        (
            {
                "b_q_type_id": scalar_types.float4_e2m1f.id,
                "a": _cuda(M, 272, dtype=torch.float16),
                "size_k": 272,
                "b_q_weight": _cuda(272 // 16, N * 2, dtype=torch.int32),
                "b_scales": _cuda(272 // 16, N, dtype=torch.float8_e4m3fn),
                "global_scale": _cuda(1, dtype=torch.float16),
            },
            ValueError,
            "argument 'size_k': NVFP4 weights pair their groups' scale rows; expected a "
            "multiple of 32, got 272",
        ),
    ],
)
def test_gemm_rejects_bad_inputs(override, error, match):
    with pytest.raises(error, match=match):
        gptq_marlin_gemm(**_gemm_args(**{arg: _made(v) for arg, v in override.items()}))


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((_cuda(32, 64, dtype=torch.int32), None, 256, 64, 3), ValueError, "'num_bits'.*3"),
        ((_cuda(32, 64, dtype=torch.int32), None, 200, 64, 4), ValueError, "'size_k'.*16"),
        ((_cuda(32, 96, dtype=torch.int32), None, 256, 96, 4), ValueError, "'size_n'.*64"),
        (
            (_cuda(16, 64, dtype=torch.int32), None, 256, 64, 4),
            ValueError,
            r"'b_q_weight': expected shape \[32, 64\] \(GPTQ",
        ),
        ((_cuda(32, 64, dtype=torch.int16), None, 256, 64, 4), TypeError, "int32"),
        (
            (_cuda(32, 64, dtype=torch.int32), _cuda(256, dtype=torch.int64), 256, 64, 4),
            TypeError,
            "argument 'perm'.*int32",
        ),
    ],
)
def test_gptq_repack_rejects_bad_inputs(args, error, match):
    with pytest.raises(error, match=match):
        gptq_marlin_repack(*map(_made, args))


@pytest.mark.parametrize("bad_row", [-1, 256, 2**20])
def test_gptq_repack_refuses_perm_rows_outside_k(bad_row):
    """perm's values are rows the kernel reads: one outside [0, size_k) is refused
    before the kernel runs; a perm of the wrong dtype gets the kernel's type error
    instead (its values are never read)."""
    q = torch.zeros(32, 64, dtype=torch.int32, device="cuda")
    perm = torch.arange(256, dtype=torch.int32, device="cuda")
    perm[17] = bad_row
    with pytest.raises(ValueError, match=r"argument 'perm': values must lie in \[0, 256\)"):
        gptq_marlin_repack(q, perm, 256, 64, 4)
    with pytest.raises(TypeError, match=r"argument 'perm'.*int32"):
        gptq_marlin_repack(q, perm.float(), 256, 64, 4)


def test_gptq_repack_clamps_perm_rows_in_a_cuda_graph():
    """During graph capture perm's values cannot be read to check them: the kernel clamps
    them into the rows (as the GEMM does), so a replay reads nothing past the weight."""
    torch.manual_seed(5)
    q = torch.randint(-(2**31), 2**31 - 1, (32, 64), dtype=torch.int32, device="cuda")
    perm = torch.arange(256, dtype=torch.int32, device="cuda")
    perm[17], perm[18] = 2**20, -1
    want = gptq_marlin_repack(q, perm.clamp(0, 255), 256, 64, 4)  # also builds the kernel
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = gptq_marlin_repack(q, perm, 256, 64, 4)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(got, want)


def test_awq_repack_rejects_bad_inputs():
    with pytest.raises(ValueError, match=r"'b_q_weight'.*\[256, 8\] \(AWQ"):
        awq_marlin_repack(_cuda(32, 64, dtype=torch.int32).made(), 256, 64, 4)
    with pytest.raises(ValueError, match="'num_bits'"):
        awq_marlin_repack(_cuda(256, 8, dtype=torch.int32).made(), 256, 64, 2)
