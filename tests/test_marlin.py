"""The Marlin format without a GPU: scalar-type ids, the pure-torch layout references,
the scale / zero-point helpers, the plans, and the W4A16 ops' checks made before a
kernel is chosen (the tensors' own checks are the kernels': tests/test_cuda_marlin.py)."""

from __future__ import annotations

import pytest
import torch
from marlin_reference import AWQ_ORDER, marlin_layout, pack_awq, pack_gptq

from mllm_kernel.cuda.device_facts import DeviceFacts
from mllm_kernel.cuda.jit import (
    awq_marlin_repack,
    awq_to_marlin_zero_points,
    gptq_marlin_gemm,
    gptq_marlin_repack,
    marlin_make_workspace,
    marlin_permute_scales,
    marlin_zero_points,
)
from mllm_kernel.cuda.jit import gptq_marlin as gptq_marlin_module
from mllm_kernel.cuda.jit.gptq_marlin import (
    FUSED_MAX_M,
    FUSED_MIN_M,
    FUSED_SPLIT_MIN_M,
    fused_tiling,
    plan,
)
from mllm_kernel.cuda.jit.marlin_format import (
    fp8_fused_exponent_bias_into_scales,
    nvfp4_marlin_process_global_scale,
    nvfp4_marlin_process_scales,
)
from mllm_kernel.cuda.jit.scalar_type import ScalarType, scalar_types
from mllm_kernel.jit_utils.cuda_arch import CudaArch


def test_scalar_type_ids_are_the_formats_ids():
    # exponent | mantissa << 8 | signed << 16 | bias << 17 | finite << 49 | nan_repr << 50,
    # the ids vLLM, sglang and the original mllm-kernel pass as b_q_type_id.
    assert scalar_types.uint4b8.id == 4 << 8 | 8 << 17 | 1 << 50 == 1125899907892224
    assert scalar_types.uint4.id == 4 << 8 | 1 << 50
    assert scalar_types.uint8b128.id == 8 << 8 | 128 << 17 | 1 << 50
    assert scalar_types.uint8.id == 8 << 8 | 1 << 50
    assert scalar_types.int8.id == 7 << 8 | 1 << 16 | 1 << 50
    assert scalar_types.float8_e4m3fn.id == 4 | 3 << 8 | 1 << 16 | 1 << 49 | 2 << 50
    for t in vars(scalar_types).values():
        assert ScalarType.from_id(t.id) == t
    assert str(scalar_types.uint4b8) == "uint4b8" and scalar_types.uint4b8.size_bits == 4
    assert ScalarType.from_id(ScalarType.int_(8, -3).id).bias == -3


def _loop_layout(q: torch.Tensor, bits: int) -> torch.Tensor:
    """The Marlin layout element by element, walking output words (the reference
    builds it per lane): a second reading of the same description."""
    k, n = q.shape
    tile_words = 16 * 64 * bits // 32
    out = torch.zeros(k // 16, n * 16 * bits // 32, dtype=torch.int64)
    for kt in range(k // 16):
        for index in range(out.shape[1]):
            nt, within = divmod(index, tile_words)
            if bits == 4:
                lane, w, half = within // 4, within % 4, 0
                parts = [(0, 0), (8, 0), (0, 8), (8, 8), (1, 0), (9, 0), (1, 8), (9, 8)]
            else:
                lane, w, half = within // 8, (within % 8) // 2, within % 2
                parts = [(0, 0), (8, 0), (1, 0), (9, 0)]
            row0 = kt * 16 + 2 * (lane % 4)
            col0 = nt * 64 + 16 * w + lane // 4 + 8 * half
            word = 0
            for i, (dr, dc) in enumerate(parts):
                word |= int(q[row0 + dr, col0 + dc]) << (bits * i)
            out[kt, index] = word
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)


@pytest.mark.parametrize("bits", [4, 8])
def test_layout_reference_agrees_with_an_elementwise_reading(bits):
    torch.manual_seed(0)
    q = torch.randint(0, 2**bits, (32, 128))
    assert torch.equal(marlin_layout(q, bits), _loop_layout(q, bits))


@pytest.mark.parametrize("bits", [4, 8])
def test_packing_references(bits):
    torch.manual_seed(1)
    q = torch.randint(0, 2**bits, (16, 64))
    pack = 32 // bits
    gptq = pack_gptq(q, bits).to(torch.int64) & 0xFFFFFFFF
    assert ((gptq[1, 5] >> (bits * 2)) & (2**bits - 1)) == q[pack + 2, 5]
    awq = pack_awq(q, bits).to(torch.int64) & 0xFFFFFFFF
    for slot, col in enumerate(AWQ_ORDER[bits]):
        assert ((awq[3, 1] >> (bits * slot)) & (2**bits - 1)) == q[3, pack + col]


def test_permute_scales_orders():
    s = torch.arange(2 * 128, dtype=torch.float32).reshape(2, 128)
    grouped = marlin_permute_scales(s, size_k=256, size_n=128, group_size=128)
    # position 8 i + j of each 64 columns holds column i + 8 j
    assert grouped[0, 8 * 3 + 5].item() == 3 + 8 * 5
    assert grouped[1, 64 + 8 * 7 + 1].item() == 128 + 64 + 7 + 8
    single = marlin_permute_scales(s[:1], size_k=256, size_n=128, group_size=-1)
    # position 8 i + j of each 32 columns holds column 2 i + (0, 1, 8, 9, 16, 17, 24, 25)[j]
    assert single[0, 8 * 2 + 3].item() == 2 * 2 + 9
    assert single[0, 32 + 8 * 1 + 6].item() == 32 + 2 + 24
    same = marlin_permute_scales(s[:1], size_k=256, size_n=128, group_size=256)
    assert torch.equal(single, same)


@pytest.mark.parametrize("bits", [4, 8])
def test_zero_points_pack_like_the_weights(bits):
    torch.manual_seed(2)
    zp = torch.randint(0, 2**bits, (3, 128))
    words = marlin_zero_points(zp, 384, 128, bits)
    assert words.shape == (3, 128 * bits // 32) and words.dtype == torch.int32
    permuted = marlin_permute_scales(zp, 384, 128, 128).to(torch.int64)
    interleave = [0, 2, 4, 6, 1, 3, 5, 7] if bits == 4 else [0, 2, 1, 3]
    per_word = 32 // bits
    unsigned = words.to(torch.int64) & 0xFFFFFFFF
    for slot, position in enumerate(interleave):
        got = (unsigned[:, 1] >> (bits * slot)) & (2**bits - 1)
        assert torch.equal(got, permuted[:, per_word + position])
    awq = pack_awq(zp, bits)
    assert torch.equal(awq_to_marlin_zero_points(awq, 384, 128, bits), words)


def test_ops_are_registered_under_their_public_names():
    from mllm_kernel.jit_utils import registry

    entries = {entry.name: entry for entry in registry.kernels("cuda")}
    for name in ("gptq_marlin_gemm", "gptq_marlin_repack", "awq_marlin_repack"):
        assert name in entries, f"{name} is not registered"
    variants = entries["gptq_marlin_gemm"].variants
    # both dtypes x 16/64 tokens per CTA x (4-bit: type zero, int zeros, float zeros,
    # act-order, NVFP4; 8-bit: type zero, int zeros, act-order, fp8), and 8 tokens per CTA
    # where scales are deferred: 4-bit fp16 and bf16 (3 zero modes each), 8-bit fp16 (2)
    assert len(variants) == 36 + 8 and len(set(variants)) == 44
    eight = {(v[0], v[1], v[3]) for v in variants if v[2] == 8}
    assert len(eight) == 8 and not any(v[4] for v in variants if v[2] == 8)
    assert (torch.bfloat16, 8, 0) not in eight, "8-bit bf16 weights are not deferred"
    assert all(v[3] == 0 for v in variants if v[4]), "act-order only with the type's zero"
    assert all(v[1] == 4 for v in variants if v[3] == 2), "float zero points only for 4 bits"
    fp8 = {v for v in variants if v[3] == 3}
    dtypes = (torch.float16, torch.bfloat16)
    assert fp8 == {(dtype, 8, rows, 3, False) for dtype in dtypes for rows in (16, 64)}
    fp4 = {v for v in variants if v[3] == 4}
    assert fp4 == {(dtype, 4, rows, 4, False) for dtype in dtypes for rows in (16, 64)}


def test_plan_takes_the_fused_kernel_for_fusable_weights_on_hopper():
    fused = plan(1024, 4096, 4096, 132, True, 132, fusable=True)
    assert (fused.fused_tokens, fused.fused_split) == (256, 1) and not fused.dequant_gemm
    # 4096 columns are 32 CTAs of 128: at M = 64, K splits 4 ways to fill the SMs
    small = plan(64, 4096, 4096, 132, True, 132, fusable=True)
    assert (small.fused_tokens, small.fused_split) == (64, 4)
    # 8-bit, act-order or float zero points (not fusable), or not Hopper: as before
    assert plan(1024, 4096, 4096, 132, True, 132).dequant_gemm
    assert plan(1024, 4096, 4096, 132, False, 132, fusable=True).fused_tokens == 0
    below = plan(FUSED_MIN_M - 1, 28672, 8192, 132, True, 132, fusable=True)
    assert below.fused_tokens == 0 and not below.dequant_gemm
    # the narrow layers (K split in 4, sums in memory) from FUSED_SPLIT_MIN_M tokens
    narrow = plan(FUSED_SPLIT_MIN_M, 4096, 14336, 132, True, 132, fusable=True)
    assert (narrow.fused_tokens, narrow.fused_split, narrow.fused_sums_in_memory) == (32, 4, True)
    assert plan(FUSED_SPLIT_MIN_M - 1, 4096, 4096, 132, True, 132, fusable=True).fused_tokens == 0
    assert plan(16, 6144, 4096, 132, True, 132, fusable=True).fused_tokens == 0  # 192 CTAs
    assert plan(16, 4096, 4096, 132, True, 132).fused_tokens == 0  # not fusable
    above = plan(FUSED_MAX_M, 4096, 4096, 132, True, 132, fusable=True)
    assert above.fused_tokens == 0 and above.dequant_gemm


def test_fused_tiling_is_no_wider_than_m_needs_and_keeps_slices_long():
    assert fused_tiling(100, 28672, 8192, 132) == (128, 1, 0)
    assert fused_tiling(256, 4096, 4096, 132) == (128, 2, 0)  # 256 tokens: 32 CTAs only
    # 16 k-blocks: slices of 8, so 64-token tiles split in two fill only 64 SMs; 32-token
    # tiles split in two fill 128
    assert fused_tiling(64, 4096, 1024, 132) == (32, 2, 0)


def test_fused_tiling_takes_the_second_slot_only_with_long_enough_slices():
    # 48 tiles of 64 tokens split in two fill 96 SMs; four slices of 16 k-blocks would
    # fill the second slots, but 64-token slices that short lose: the tile stays as it is
    assert fused_tiling(64, 6144, 4096, 132) == (64, 2, 0)
    assert fused_tiling(64, 6144, 14336, 132) == (64, 4, 0)  # slices of 56 k-blocks
    # 32-token partners send half the sums: split into the second slot all the same
    assert fused_tiling(24, 6144, 4096, 132) == (32, 4, 0)
    # 112 tiles: split in two, slices of 32 k-blocks
    assert fused_tiling(64, 14336, 4096, 132) == (64, 2, 0)


def test_fused_tiling_splits_a_mostly_empty_last_wave():
    # 448 tiles: 3 waves of 132 and 52 more, which run split in two (104 CTAs)
    assert fused_tiling(1024, 14336, 4096, 132) == (256, 1, 52)
    # 896 tiles: the last wave is 104 of 132 full, too full to split
    assert fused_tiling(1024, 28672, 8192, 132) == (256, 1, 0)
    assert plan(1024, 14336, 4096, 132, True, 132, fusable=True).fused_tail == 52


def test_fused_splits_sum_in_memory_where_their_ctas_fit_one_an_sm():
    """Splits of 4 whose CTAs fit one an SM sum through global memory (clusters of 4
    would pair CTAs on some SMs); splits of 2, and splits at two CTAs an SM, in a
    cluster."""

    def fused(m, n, k):
        how = plan(m, n, k, 132, True, 132, clusters=True, fusable=True)
        return how.fused_split, how.fused_sums_in_memory

    assert fused(17, 4096, 14336) == (4, True)  # 32 tiles x 4
    assert fused(64, 4096, 4096) == (4, True)
    assert fused(128, 4096, 4096) == (2, False)  # 64 tiles x 2
    assert fused(24, 6144, 4096) == (4, False)  # 48 tiles x 4: two CTAs an SM
    assert fused(100, 28672, 8192) == (1, False)


def test_fused_kernel_is_registered_with_its_variants():
    from mllm_kernel.jit_utils import registry

    entries = {entry.name: entry for entry in registry.kernels("cuda")}
    variants = entries["gptq_marlin_gemm_wgmma"].variants
    # both dtypes x tokens per CTA (32, 64, 128, 256) x zero mode (the type's, int zero
    # points)
    assert len(set(variants)) == len(variants) == 16
    assert {v[1] for v in variants} == {32, 64, 128, 256} and {v[2] for v in variants} == {0, 1}


def test_plan_splits_k_only_while_column_tiles_leave_sms_idle():
    small = plan(1, 4096, 4096, 132, True, 132)
    assert not small.dequant_gemm and small.rows == 16
    # 8-token CTAs where the build has them (deferred scales), up to 8 tokens
    assert plan(8, 4096, 4096, 132, True, 132, eight_rows=True).rows == 8
    assert plan(9, 4096, 4096, 132, True, 132, eight_rows=True).rows == 16
    # 16 column tiles of 256: K split 16 ways (the cap), slices of 16 k16 tiles
    assert (small.split, small.k_tiles_per_split) == (16, 16)
    wide = plan(1, 28672, 8192, 132, True, 132)
    # 112 column tiles: 4 slices make >= 3 CTAs per SM; slices are whole ring steps
    assert (wide.split, wide.k_tiles_per_split) == (4, 128)
    assert plan(1, 28672, 8192, 132, True, 100).split == 1  # the workspace is too short
    deep = plan(1, 4096, 14336, 132, True, 132)
    assert deep.split == 16 and deep.k_tiles_per_split == 56
    assert plan(64, 4096, 4096, 132, True, 132).rows == 64
    assert plan(257, 4096, 4096, 132, False, 132).split == 1  # several row blocks
    assert plan(1024, 4096, 4096, 132, True, 132).dequant_gemm
    assert not plan(1024, 4096, 4096, 108, False, 108).dequant_gemm  # no Hopper GEMM
    # With clusters: at most 8 slices, summed in the cluster; the workspace is not used.
    clustered = plan(1, 4096, 4096, 132, True, 0, clusters=True)
    assert (clustered.split, clustered.k_tiles_per_split, clustered.cluster) == (16, 16, True)
    # More than _STREAM_CLUSTER_SPLIT slices sum through global memory where it can.
    in_memory = plan(1, 4096, 4096, 132, True, 132, clusters=True)
    assert (in_memory.split, in_memory.k_tiles_per_split, in_memory.cluster) == (16, 16, False)
    assert plan(1, 28672, 8192, 132, True, 132, clusters=True).cluster is False  # split 4
    assert plan(64, 4096, 4096, 132, True, 0, clusters=True).split == 8
    # several row blocks split too when the slices sum in a cluster
    assert plan(256, 4096, 4096, 132, False, 132, clusters=True).split == 7
    assert plan(256, 4096, 4096, 132, False, 132).split == 1
    assert plan(1, 192, 256, 132, True, 132, clusters=True).cluster is False  # one slice
    tail = plan(1, 192, 272, 132, True, 132)
    assert (tail.split, tail.k_tiles_per_split) == (1, 20)  # 17 k16 tiles: too few to split


@pytest.mark.parametrize(
    ("capability", "archs", "hopper", "clusters"),
    [
        ((9, 0), [CudaArch(9, 0, "a")], True, True),
        ((9, 0), [CudaArch(8, 0, ptx=True)], False, False),  # Ampere code runs on Hopper
        ((9, 0), [CudaArch(8, 0), CudaArch(9, 0, "a")], True, True),
        ((8, 6), [CudaArch(8, 0)], False, False),
        ((10, 0), [CudaArch(10, 0, "a")], False, True),
    ],
)
def test_device_facts_take_clusters_only_where_sm90_code_runs(
    monkeypatch, capability, archs, hopper, clusters
):
    """The split-K sum through a cluster needs the code the driver picks for the GPU (the
    newest built arch not newer than it) to be sm_90 or newer; otherwise the kernel would
    trap, so the global-memory path must be planned."""
    gpu = DeviceFacts(0, "GPU", capability, sm_count=100)
    monkeypatch.setattr(gptq_marlin_module, "_devices", {})
    monkeypatch.setattr(gptq_marlin_module, "device_facts", lambda index: gpu)
    monkeypatch.setattr(gptq_marlin_module, "resolve_cuda_archs", lambda index: archs)
    assert gptq_marlin_module._device_facts(0) == (100, hopper, clusters)


def test_device_facts_refuse_gpus_before_ampere(monkeypatch):
    turing = DeviceFacts(0, "GPU", (7, 5), sm_count=40)
    monkeypatch.setattr(gptq_marlin_module, "_devices", {})
    monkeypatch.setattr(gptq_marlin_module, "device_facts", lambda index: turing)
    with pytest.raises(
        NotImplementedError,
        match=r"^gptq_marlin_gemm runs on sm_80 and newer \(it uses .*\); "
        r"cuda:0 \(GPU\) is sm_75 \(compute capability 7\.5\)$",
    ):
        gptq_marlin_module._device_facts(0)


# --- the checks made before a kernel is chosen: CPU tensors suffice. The tensors' own
# checks are the kernels' (C++): tests/test_cuda_marlin.py.

M, N, K = 3, 128, 256


def _gemm_args(**override):
    args = dict(
        a=torch.zeros(M, K, dtype=torch.float16),
        c=None,
        b_q_weight=torch.zeros(K // 16, N * 2, dtype=torch.int32),
        b_scales=torch.zeros(2, N, dtype=torch.float16),
        global_scale=None,
        b_zeros=None,
        g_idx=None,
        perm=None,
        workspace=torch.zeros(132, dtype=torch.int32),
        b_q_type_id=scalar_types.uint4b8.id,
        size_m=M,
        size_n=N,
        size_k=K,
    )
    args.update(override)
    return args


@pytest.mark.parametrize(
    ("override", "error", "match"),
    [
        ({"global_scale": torch.ones(1)}, ValueError, "argument 'global_scale'.*FP4"),
        (
            {
                "global_scale": torch.ones(1, dtype=torch.float16),
                "b_q_type_id": scalar_types.float8_e4m3fn.id,
            },
            ValueError,
            r"argument 'global_scale': only float4_e2m1f \(NVFP4\) weights take a global scale",
        ),
        ({"b_q_type_id": "uint4b8"}, TypeError, "argument 'b_q_type_id': expected an int"),
        ({"size_n": 128.0}, TypeError, "argument 'size_n': expected an int"),
        ({"is_k_full": 1}, TypeError, "argument 'is_k_full': expected a bool"),
        ({"b_scales": [1.0]}, TypeError, "argument 'b_scales': expected a torch.Tensor"),
        ({}, ValueError, "argument 'a': expected a tensor on cuda but got one on cpu"),
    ],
)
def test_gemm_refuses_on_any_device(override, error, match):
    """What the op refuses before its kernel, on CPU tensors too."""
    with pytest.raises(error, match=match):
        gptq_marlin_gemm(**_gemm_args(**override))


@pytest.mark.parametrize(
    ("override", "error", "match"),
    [
        ({"a": torch.zeros(M, K, dtype=torch.float32)}, TypeError, "argument 'a'.*float32"),
        ({"b_q_type_id": 12345}, ValueError, "argument 'b_q_type_id'.*uint4b8"),
        (
            {"b_zeros": torch.zeros(2, N // 8, dtype=torch.int32)},
            ValueError,
            "argument 'b_zeros'.*uint4b8",
        ),
        ({"b_q_type_id": scalar_types.uint4.id}, ValueError, "argument 'b_zeros'.*zero points"),
        (
            {
                "b_q_type_id": scalar_types.uint4.id,
                "b_zeros": torch.zeros(2, N // 8, dtype=torch.int32),
                "g_idx": torch.zeros(K, dtype=torch.int32),
                "perm": torch.zeros(K, dtype=torch.int32),
            },
            ValueError,
            r"act-order.*zero points is not supported",
        ),
        (
            {
                "b_q_type_id": scalar_types.uint8.id,
                "b_zeros": torch.zeros(2, N, dtype=torch.float16),
                "is_zp_float": True,
            },
            ValueError,
            "argument 'is_zp_float': float zero points need uint4",
        ),
        (
            {
                "b_q_type_id": scalar_types.float8_e4m3fn.id,
                "b_zeros": torch.zeros(2, N // 4, dtype=torch.int32),
            },
            ValueError,
            "argument 'b_zeros': float8_e4m3fn weights take no zero points",
        ),
        (
            {
                "b_q_type_id": scalar_types.float8_e4m3fn.id,
                "g_idx": torch.zeros(K, dtype=torch.int32),
                "perm": torch.zeros(K, dtype=torch.int32),
            },
            ValueError,
            r"argument 'g_idx': act-order .* not supported for float8_e4m3fn",
        ),
        (
            {
                "b_q_type_id": scalar_types.float4_e2m1f.id,
                "b_zeros": torch.zeros(2, N // 8, dtype=torch.int32),
            },
            ValueError,
            "argument 'b_zeros': float4_e2m1f weights take no zero points",
        ),
        (
            {
                "b_q_type_id": scalar_types.float4_e2m1f.id,
                "g_idx": torch.zeros(K, dtype=torch.int32),
                "perm": torch.zeros(K, dtype=torch.int32),
            },
            ValueError,
            r"argument 'g_idx': act-order .* not supported for float4_e2m1f",
        ),
        (
            {"b_q_type_id": scalar_types.float8_e5m2.id},
            ValueError,
            r"argument 'b_q_type_id': \d+ is not a supported weight type.*float8_e4m3fn.*"
            r"float4_e2m1f",
        ),
    ],
)
def test_gemm_refuses_what_no_kernel_is_built_for(override, error, match):
    """The rules that pick a build (dtype, zero mode, act-order), run before the GPU is
    asked for anything: the kernel function itself, on CPU tensors. (The public op names
    the CPU tensor instead.)"""
    kernel = gptq_marlin_module.gptq_marlin_gemm.__wrapped__
    args = dict(is_k_full=True, use_atomic_add=False, use_fp32_reduce=False, is_zp_float=False)
    args.update(_gemm_args(**override))
    with pytest.raises(error, match=match):
        kernel(**args)


@pytest.mark.parametrize(
    ("m", "n", "k", "shape"),
    [
        (-1, N, K, (0, N, K)),
        (M, 96, 200, (M, 96, 200)),
        (M, 0, 8, (M, 0, 8)),
        (0, -64, -16, (0, 0, 0)),
    ],
)
def test_sizes_are_the_kernels_to_check(monkeypatch, m, n, k, shape):
    """Python states no size rule (marlin_layout.cuh's check_tile_sizes and
    check_operands do: tests/test_cuda_marlin.py): any sizes get a plan, on a GPU of
    either kind, and buffers that torch can allocate, so that the kernel's error is the
    one raised."""
    monkeypatch.setattr(gptq_marlin_module, "_calls", {})
    for module in ("_STREAM", "_FUSED", "_DEQUANTIZE"):
        monkeypatch.setattr(gptq_marlin_module, module, _AnyBuild())
    for hopper in (False, True):
        monkeypatch.setattr(gptq_marlin_module, "_devices", {0: (132, hopper, hopper)})
        key = (m, n, k, 0, torch.float16, scalar_types.uint4b8.id, False, False, False)
        call = gptq_marlin_module._planned(key, torch.zeros(1))
        assert call.shape == shape and call.plan.split >= 1


@pytest.mark.parametrize("hopper", [False, True])
@pytest.mark.parametrize("m", [1, 8, 16, 64, 255, 256, 1024, 4096])
def test_fp8_weights_plan_the_streaming_kernel_or_dequantize_and_gemm(monkeypatch, hopper, m):
    """fp8 weights never take the fused kernel (4-bit only) nor 8-token CTAs (their
    scales are not deferred): the streaming kernel's fp8 build of 16 or 64 tokens, or on
    Hopper from DEQUANT_GEMM_MIN_M dequantize + GEMM, with zero mode 3 (kFp8)."""
    monkeypatch.setattr(gptq_marlin_module, "_calls", {})
    for module in ("_STREAM", "_FUSED", "_DEQUANTIZE"):
        monkeypatch.setattr(gptq_marlin_module, module, _AnyBuild())
    monkeypatch.setattr(gptq_marlin_module, "_devices", {0: (132, hopper, hopper)})
    for dtype in (torch.float16, torch.bfloat16):
        key = (m, 4096, 4096, 0, dtype, scalar_types.float8_e4m3fn.id, False, False, False)
        call = gptq_marlin_module._planned(key, torch.zeros(1))
        assert call.zero_mode == 3 and call.bias == 0 and call.plan.fused_tokens == 0
        if hopper and m >= gptq_marlin_module.DEQUANT_GEMM_MIN_M:
            assert call.plan.dequant_gemm and call.module == (0, dtype, 8, False)
        else:
            rows = 16 if m <= 16 else 64
            assert call.module == (0, dtype, 8, rows, 3, False)


@pytest.mark.parametrize("hopper", [False, True])
@pytest.mark.parametrize("m", [1, 8, 16, 64, 255, 256, 1024, 4096])
def test_nvfp4_weights_plan_the_streaming_kernel_or_dequantize_and_gemm(monkeypatch, hopper, m):
    """NVFP4 weights never take the fused kernel (integer weights only) nor 8-token CTAs
    (their scales are not deferred): the streaming kernel's NVFP4 build of 16 or 64
    tokens, or on Hopper from DEQUANT_GEMM_MIN_M dequantize + GEMM's 4-bit build, with
    zero mode 4 (kFp4)."""
    monkeypatch.setattr(gptq_marlin_module, "_calls", {})
    for module in ("_STREAM", "_FUSED", "_DEQUANTIZE"):
        monkeypatch.setattr(gptq_marlin_module, module, _AnyBuild())
    monkeypatch.setattr(gptq_marlin_module, "_devices", {0: (132, hopper, hopper)})
    for dtype in (torch.float16, torch.bfloat16):
        key = (m, 4096, 4096, 0, dtype, scalar_types.float4_e2m1f.id, False, False, False)
        call = gptq_marlin_module._planned(key, torch.zeros(1))
        assert call.zero_mode == 4 and call.bias == 0 and call.plan.fused_tokens == 0
        if hopper and m >= gptq_marlin_module.DEQUANT_GEMM_MIN_M:
            assert call.plan.dequant_gemm and call.module == (0, dtype, 4, False)
        else:
            rows = 16 if m <= 16 else 64
            assert call.module == (0, dtype, 4, rows, 4, False)


def test_the_ops_copy_of_the_nvfp4_type_id_is_scalar_types():
    """ops/marlin.py cannot import the device package's scalar types: its copy of
    float4_e2m1f's id, which alone takes a global scale, is checked here."""
    from mllm_kernel.ops import marlin as ops_marlin

    assert scalar_types.float4_e2m1f.id == ops_marlin._FLOAT4_E2M1F_ID


class _AnyBuild:
    """Stands in for a KernelModule: every variant is a module named by its key."""

    def __getitem__(self, key):
        return key


def test_repacks_refuse_on_any_device():
    with pytest.raises(TypeError, match="argument 'size_k': expected an int"):
        gptq_marlin_repack(torch.zeros(32, 64, dtype=torch.int32), None, 256.0, 64, 4)
    with pytest.raises(ValueError, match="argument 'b_q_weight': expected a tensor on cuda"):
        gptq_marlin_repack(torch.zeros(32, 64, dtype=torch.int32), None, 256, 64, 4)
    with pytest.raises(ValueError, match="argument 'b_q_weight': expected a tensor on cuda"):
        awq_marlin_repack(torch.zeros(256, 8, dtype=torch.int32), 256, 64, 4)


def test_format_helpers_reject_bad_inputs():
    with pytest.raises(ValueError, match=r"argument 's'.*\[2, 128\]"):
        marlin_permute_scales(torch.zeros(4, 128), 256, 128, 128)
    with pytest.raises(ValueError, match="argument 'group_size'"):
        marlin_permute_scales(torch.zeros(4, 128), 256, 128, 100)
    with pytest.raises(ValueError, match="argument 'num_bits'"):
        marlin_zero_points(torch.zeros(2, 128), 256, 128, 2)
    with pytest.raises(ValueError, match=r"argument 'device'.*CUDA"):
        marlin_make_workspace("cpu")
    with pytest.raises(TypeError, match=r"argument 's': expected dtype float16 or bfloat16"):
        fp8_fused_exponent_bias_into_scales(torch.ones(1, 64))


@pytest.mark.parametrize(("dtype", "gap"), [(torch.float16, 8), (torch.bfloat16, 120)])
def test_fp8_scales_carry_the_exponent_bias(dtype, gap):
    """Exactly 2**8 (fp16) or 2**120 (bf16) times the scales, a new tensor, as vLLM's
    helper of the same name (the kernel leaves the bias out of its fp8 weights)."""
    s = (torch.rand(3, 128) * 0.1 + 1e-3).to(dtype)
    fused = fp8_fused_exponent_bias_into_scales(s)
    assert fused.dtype == dtype and fused.data_ptr() != s.data_ptr()
    assert torch.equal(fused.double(), s.double() * 2.0**gap)


def _vllm_nvfp4_scales(s: torch.Tensor) -> torch.Tensor:
    """vLLM's nvfp4_marlin_process_scales step by step, as its source spells them (the
    version the original mllm-kernel's kernel reads: with the pair interleave): to fp16,
    interleave pairs of rows by 8 columns, swap the middle two of each 4, then the high
    byte of (s * 2**7)'s int16 bits shifted left by one."""
    s = s.to(torch.half)
    s = s.view(s.size(0) // 2, 2, -1, 8).permute(0, 2, 1, 3).reshape(s.size(0), -1)
    s = s.view(-1, 4)[:, [0, 2, 1, 3]].view(s.size(0), -1)
    s = (s * 2**7).view(torch.int16) << 1
    return s.view(torch.float8_e4m3fn)[:, 1::2].contiguous()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_nvfp4_scales_are_vllms_bytes(dtype):
    """The scale bytes equal vLLM's helper's (followed step by step above), byte for
    byte, for every non-negative e4m3 value (zero, subnormals, 448) in a [64, 512] table;
    the result is float8_e4m3fn, the input left as it was."""
    torch.manual_seed(5)
    codes = torch.randint(0, 0x7F, (64, 512))
    codes[0, :0x7F] = torch.arange(0x7F)
    scales = codes.to(torch.uint8).view(torch.float8_e4m3fn).to(dtype)
    before = scales.clone()
    got = nvfp4_marlin_process_scales(scales)
    assert got.dtype == torch.float8_e4m3fn and got.shape == (64, 512)
    assert torch.equal(got.view(torch.uint8), _vllm_nvfp4_scales(scales).view(torch.uint8))
    assert torch.equal(scales, before)


@pytest.mark.parametrize(("dtype", "power"), [(torch.float16, 7), (torch.bfloat16, 119)])
def test_nvfp4_global_scale_carries_the_exponent_bias(dtype, power):
    """Exactly 2**7 (fp16) or 2**119 (bf16) times the global scale, shape [1] (a 0-d
    scale too), a new tensor, as vLLM's helper of the same name."""
    for g in (torch.tensor(1e-3, dtype=dtype), torch.tensor([0.25], dtype=dtype)):
        out = nvfp4_marlin_process_global_scale(g)
        assert out.shape == (1,) and out.dtype == dtype and out.data_ptr() != g.data_ptr()
        assert torch.equal(out.double(), g.double().reshape(1) * 2.0**power)


def test_nvfp4_helpers_reject_bad_inputs():
    with pytest.raises(ValueError, match=r"argument 's': NVFP4 scales must be >= 0"):
        nvfp4_marlin_process_scales(-torch.ones(2, 64))
    with pytest.raises(ValueError, match=r"argument 's': expected shape .*even.*\[3, 64\]"):
        nvfp4_marlin_process_scales(torch.ones(3, 64))
    with pytest.raises(ValueError, match=r"argument 's': expected shape .*\[2, 96\]"):
        nvfp4_marlin_process_scales(torch.ones(2, 96))
    with pytest.raises(TypeError, match=r"argument 's': expected a floating-point dtype"):
        nvfp4_marlin_process_scales(torch.ones(2, 64, dtype=torch.int32))
    with pytest.raises(TypeError, match=r"argument 'global_scale': expected dtype float16"):
        nvfp4_marlin_process_global_scale(torch.ones(1))
    with pytest.raises(ValueError, match=r"argument 'global_scale': expected one value"):
        nvfp4_marlin_process_global_scale(torch.ones(2, dtype=torch.float16))
