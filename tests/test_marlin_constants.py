"""What the Marlin ops' Python side assumes of their C++ kernels, checked against the
kernels' own headers (``include/mllm_kernel/cuda/marlin_config.cuh``,
``marlin_layout.cuh``, ``cluster.cuh``): one nvcc build of a small host program that
prints the headers' values (the streaming kernel's CTA width, turn and split-K limits,
the builds that defer scales, the fused kernel's tile and split limits per token tile,
the zero modes, and where the scale and zero-point permutations put each column), which
each test compares with the Python copy the plan or the format helpers use; the fp8
e4m3 dequantization (``dequant.cuh``'s ``Fp8Dequant``) of all 256 byte values, against
torch's float8_e4m3fn in float64; and NVFP4's (``marlin_nvfp4.cuh``): all 16 e2m1 codes
in every nibble of a word against their table, every scale byte the format helper
writes, and where the kernels read a lane's scale bytes.

No GPU: the program runs on the host and calls no CUDA function.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from conftest import run_host_program

gptq_marlin = importlib.import_module("mllm_kernel.cuda.jit.gptq_marlin")
marlin_format = importlib.import_module("mllm_kernel.cuda.jit.marlin_format")

pytestmark = pytest.mark.nvcc

CPP_TYPES = {torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}
ZERO_MODES = ("kBias", "kIntZero", "kFloatZero", "kFp8", "kFp4")
# Byte j of fp8 test word b is (b + 64 j) % 256: every byte value sits in every byte of
# some word, and a word's four bytes differ.
FP8_WORDS = [sum(((b + 64 * j) % 256) << (8 * j) for j in range(4)) for b in range(256)]
# Nibble j of e2m1 test word b is (b + 3 j) % 16: every code in every nibble of a word.
FP4_WORDS = [sum(((b + 3 * j) % 16) << (4 * j) for j in range(8)) for b in range(16)]
# The e2m1 codes' values (sign, 2 exponent bits with bias 1, 1 mantissa bit), by hand.
E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
E2M1_VALUES += [-v for v in E2M1_VALUES]
# NVFP4 scale offsets printed for a scale tensor of NVFP4_N columns: groups 0..3, every
# 8-column block.
NVFP4_N = 128


def _program() -> str:
    """A host program printing one ``name value...`` line per fact."""

    def show(name: str, *values: str) -> str:
        pattern = " ".join(["%d"] * len(values))
        return f'  std::printf("{name} {pattern}\\n", {", ".join(values)});'

    def series(name: str, function: str, count: int) -> list[str]:
        return [
            f'  std::printf("{name}");',
            f'  for (int i = 0; i < {count}; ++i) std::printf(" %d", {function}(i));',
            '  std::printf("\\n");',
        ]

    lines = [
        "#include <cuda_bf16.h>",
        "#include <cuda_fp16.h>",
        "#include <cstdio>",
        '#include "mllm_kernel/cuda/cluster.cuh"',
        '#include "mllm_kernel/cuda/dequant.cuh"',
        '#include "mllm_kernel/cuda/marlin_config.cuh"',
        '#include "mllm_kernel/cuda/marlin_layout.cuh"',
        '#include "mllm_kernel/cuda/marlin_nvfp4.cuh"',
        "using namespace mllm_kernel::cuda;",
        "int main() {",
        show("stream_cols", "marlin::kStreamCols"),
        show("turn_tiles", "marlin::kTurnTiles"),
        show("max_global_split", "marlin::kMaxGlobalSplit"),
        show("max_cluster_size", "kMaxClusterSize"),
        show("zero_modes", *(f"marlin::{mode}" for mode in ZERO_MODES)),
    ]
    for dtype, cpp in CPP_TYPES.items():
        for bits in (4, 8):
            for act_order in (False, True):
                defers = [
                    f"marlin::kDefersScales<{cpp}, {bits}, {rows}, {str(act_order).lower()}>"
                    for rows in gptq_marlin._ROWS
                ]
                lines.append(show(f"defers_{dtype}_{bits}_{act_order}", *defers))
        for tokens in gptq_marlin._FUSED_TOKENS:
            for zero in (0, 1):
                config = f"marlin_wgmma::FusedConfig<{cpp}, {tokens}, {zero}>"
                facts = (
                    f"static_cast<int>({config}::{fact})"
                    for fact in ("kCols", "kTileK", "kMaxSplit", "kCtasPerSm", "kPartialBytes")
                )
                lines.append(show(f"fused_{dtype}_{tokens}_{zero}", *facts))
    lines += series("grouped_scale_position", "marlin::grouped_scale_position", 64)
    lines += series("channel_scale_position", "marlin::channel_scale_position", 64)
    for bits in (4, 8):
        lines += series(f"word_slot_{bits}", f"marlin::word_slot<{bits}>", 32 // bits)
    words = ", ".join(f"{word}u" for word in FP8_WORDS)
    lines.append(f"  constexpr unsigned kFp8Words[] = {{{words}}};")
    for dtype, cpp in CPP_TYPES.items():
        lines.append(show(f"fp8_gap_{dtype}", f"Fp8Dequant<{cpp}>::kExponentGap"))
        for pair in (0, 1):
            lines += [
                f'  std::printf("fp8_pairs_{dtype}_{pair}");',
                "  for (unsigned word : kFp8Words)",
                f'    std::printf(" %u", Fp8Dequant<{cpp}>::pair_bits(word, {pair}));',
                '  std::printf("\\n");',
            ]
    words = ", ".join(f"{word}u" for word in FP4_WORDS)
    lines.append(f"  constexpr unsigned kFp4Words[] = {{{words}}};")
    for dtype, cpp in CPP_TYPES.items():
        lines.append(show(f"e2m1_gap_{dtype}", f"marlin::E2m1Dequant<{cpp}>::kExponentGap"))
        lines.append(
            show(f"nvfp4_scale_exponent_{dtype}", f"marlin::Nvfp4Scales<{cpp}>::kExponent")
        )
        for pair in range(4):
            lines += [
                f'  std::printf("e2m1_pairs_{dtype}_{pair}");',
                "  for (unsigned word : kFp4Words)",
                f'    std::printf(" %u", marlin::E2m1Dequant<{cpp}>::pair_bits(word, {pair}));',
                '  std::printf("\\n");',
            ]
        for pair in (0, 1):
            lines += [
                f'  std::printf("nvfp4_scale_pairs_{dtype}_{pair}");',
                "  for (unsigned word : kFp8Words)",
                f'    std::printf(" %u", marlin::Nvfp4Scales<{cpp}>::pair_bits(word, {pair}));',
                '  std::printf("\\n");',
            ]
    lines += [
        '  std::printf("nvfp4_scale_offsets");',
        "  for (int group = 0; group < 4; ++group)",
        f"    for (int column = 0; column < {NVFP4_N}; column += 8)",
        '      std::printf(" %d", static_cast<int>(marlin::nvfp4_scale_offset(group, column, '
        f"{NVFP4_N})));",
        '  std::printf("\\n");',
    ]
    return "\n".join([*lines, "  return 0;", "}"]) + "\n"


@pytest.fixture(scope="module")
def kernel_facts(tmp_path_factory) -> dict[str, list[int]]:
    """``{name: values}`` as the C++ headers compute them."""
    lines = run_host_program(tmp_path_factory.mktemp("marlin_constants"), _program())
    return {name: [int(v) for v in values] for name, *values in map(str.split, lines.splitlines())}


def test_the_streaming_plan_uses_the_kernels_shapes(kernel_facts):
    """plan() counts column tiles of the CTA's width, aligns K slices to the main loop's
    turn and splits K at most as far as the kernel sums: through global memory (the last
    CTA stages every slice) and in a cluster."""
    assert kernel_facts["stream_cols"] == [gptq_marlin._TILE_N]
    assert kernel_facts["turn_tiles"] == [gptq_marlin._SLICE_ALIGN]
    assert kernel_facts["max_global_split"] == [gptq_marlin._MAX_SPLIT]
    assert kernel_facts["max_cluster_size"] == [gptq_marlin._MAX_CLUSTER_SPLIT]
    # A measured limit below the kernel's, not a copy of it.
    assert kernel_facts["max_cluster_size"][0] >= gptq_marlin._MAX_CLUSTER_SPLIT_64


def test_zero_modes_are_the_kernels(kernel_facts):
    assert list(gptq_marlin._ZERO_MODE.values()) == kernel_facts["zero_modes"]


@pytest.mark.parametrize("dtype", CPP_TYPES)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("act_order", [False, True])
def test_the_builds_that_defer_scales_are_the_kernels(kernel_facts, dtype, bits, act_order):
    """_defers_scales (which weights get 8-token builds and plans) is kDefersScales of
    the 8- and 16-token builds; the 64-token ones never defer."""
    got = dict(
        zip(gptq_marlin._ROWS, kernel_facts[f"defers_{dtype}_{bits}_{act_order}"], strict=True)
    )
    expected = gptq_marlin._defers_scales(dtype, bits, act_order)
    assert (bool(got[8]), bool(got[16]), bool(got[64])) == (expected, expected, False)


@pytest.mark.parametrize("dtype", CPP_TYPES)
@pytest.mark.parametrize("tokens", gptq_marlin._FUSED_TOKENS)
@pytest.mark.parametrize("zero", [0, 1])
def test_the_fused_tiling_uses_the_kernels_shapes(kernel_facts, dtype, tokens, zero):
    """fused_tiling counts CTAs of the kernel's columns and k-blocks of its k, and splits
    K at most as far as a build's ring holds the other slices' sums, on as many CTAs an SM as
    the build holds, and sizes the partial sums a CTA stores in global memory."""
    facts = kernel_facts[f"fused_{dtype}_{tokens}_{zero}"]
    cols, k_block, max_split, ctas_per_sm, partial_bytes = facts
    assert (cols, k_block) == (gptq_marlin._FUSED_COLS, gptq_marlin._FUSED_K_BLOCK)
    assert max_split == gptq_marlin._FUSED_MAX_SPLIT[tokens]
    assert ctas_per_sm == gptq_marlin._FUSED_CTAS_PER_SM[tokens]
    assert partial_bytes == 4 * gptq_marlin._FUSED_PARTIAL_FLOATS[tokens]


def test_scale_permutations_are_where_the_kernels_read(kernel_facts):
    """Position p of a permuted row holds the column whose position the kernels compute
    as p: SCALE_PERM within 64 columns, SCALE_PERM_SINGLE within 32 (the kernel's
    positions repeat per 32 columns)."""
    grouped = kernel_facts["grouped_scale_position"]
    assert [grouped[column] for column in marlin_format.SCALE_PERM] == list(range(64))
    channel = kernel_facts["channel_scale_position"]
    assert [channel[column] for column in marlin_format.SCALE_PERM_SINGLE] == list(range(32))
    assert channel[32:] == [32 + p for p in channel[:32]]


@pytest.mark.parametrize("bits", [4, 8])
def test_packed_words_are_ordered_as_the_kernels_read(kernel_facts, bits):
    """The zero points' and AWQ's word order (value at each slot from the low bits up)
    is the kernels' word_slot."""
    slots = kernel_facts[f"word_slot_{bits}"]
    assert [slots[value] for value in marlin_format._WORD_ORDER[bits]] == list(range(32 // bits))


def test_fp8_exponent_gap_is_the_kernels(kernel_facts):
    """fp8_fused_exponent_bias_into_scales multiplies by what Fp8Dequant leaves out."""
    for dtype in CPP_TYPES:
        assert kernel_facts[f"fp8_gap_{dtype}"] == [marlin_format.FP8_EXPONENT_GAP[dtype]]


@pytest.mark.parametrize("dtype", CPP_TYPES)
def test_fp8_dequant_of_every_byte_is_torchs_float8(kernel_facts, dtype):
    """Each of the 256 bytes, in each byte of a word (pair 0 is bytes 0 and 2, pair 1
    bytes 1 and 3, the low half first), dequantizes to T bits whose value times
    2**kExponentGap is the byte's float8_e4m3fn value exactly (subnormals, +-0 and the
    largest, +-448, included); the two NaN bytes are the caller's to avoid."""
    gap = marlin_format.FP8_EXPONENT_GAP[dtype]
    words = torch.tensor(FP8_WORDS, dtype=torch.int64)
    byte = [(words >> (8 * j)) & 0xFF for j in range(4)]
    for pair in (0, 1):
        bits = torch.tensor(kernel_facts[f"fp8_pairs_{dtype}_{pair}"], dtype=torch.int64)
        for half, j in ((0, pair), (1, pair + 2)):
            got = ((bits >> (16 * half)) & 0xFFFF).to(torch.int32).to(torch.int16).view(dtype)
            want = byte[j].to(torch.uint8).view(torch.float8_e4m3fn).double()
            finite = ~want.isnan()
            assert finite.sum() == 254
            assert torch.equal(got.double()[finite] * 2.0**gap, want[finite])
            # The signs of zeros too.
            assert torch.equal(got[finite].signbit(), want[finite].signbit())


def _halves(bits: list[int], dtype: torch.dtype) -> list[torch.Tensor]:
    """The low and high T values of each printed 32-bit word of T bits."""
    words = torch.tensor(bits, dtype=torch.int64)
    return [
        ((words >> (16 * half)) & 0xFFFF).to(torch.int32).to(torch.int16).view(dtype)
        for half in (0, 1)
    ]


def test_nvfp4_exponents_are_the_kernels(kernel_facts):
    """nvfp4_marlin_process_global_scale multiplies by what E2m1Dequant leaves out (fp16
    14, bf16 126) less the 2**7 the scale bytes carry; the kernels' decoded scales carry
    2**7 (fp16) and 2**22 (bf16), whose extra 2**15 the kernels take back themselves."""
    for dtype in CPP_TYPES:
        assert kernel_facts[f"e2m1_gap_{dtype}"] == [marlin_format.NVFP4_EXPONENT_GAP[dtype]]
    assert kernel_facts["nvfp4_scale_exponent_torch.float16"] == [7]
    assert kernel_facts["nvfp4_scale_exponent_torch.bfloat16"] == [22]


@pytest.mark.parametrize("dtype", CPP_TYPES)
def test_e2m1_dequant_of_every_code_in_every_nibble(kernel_facts, dtype):
    """Pair i of a word is nibbles 4 i (low half) and 16 + 4 i (high half), as for 4-bit
    integers; each of the 16 codes, in each of the 8 nibbles, comes out as T bits whose
    value times 2**kExponentGap is the code's e2m1 value exactly (the subnormal +-0.5 and
    -0's sign included)."""
    gap = marlin_format.NVFP4_EXPONENT_GAP[dtype]
    words = torch.tensor(FP4_WORDS, dtype=torch.int64)
    table = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    for pair in range(4):
        halves = _halves(kernel_facts[f"e2m1_pairs_{dtype}_{pair}"], dtype)
        for half, nibble in ((0, pair), (1, pair + 4)):
            codes = (words >> (4 * nibble)) & 0xF
            assert sorted(codes.tolist()) == list(range(16))
            want = table[codes]
            assert torch.equal(halves[half].double() * 2.0**gap, want)
            assert torch.equal(halves[half].signbit(), codes >= 8)


def _s0e5m3(byte: torch.Tensor) -> torch.Tensor:
    """The value of a scale byte (5 exponent bits with fp16's bias, 3 mantissa bits, no
    sign), in float64: what the format says it holds, s * 2**7."""
    exponent, mantissa = (byte >> 3).double(), (byte & 7).double()
    normal = 2.0 ** (exponent - 15) * (1 + mantissa / 8)
    subnormal = 2.0**-14 * mantissa / 8
    return torch.where(exponent > 0, normal, subnormal)


@pytest.mark.parametrize("dtype", CPP_TYPES)
def test_nvfp4_scale_bytes_decode_to_the_scales(kernel_facts, dtype):
    """Every scale byte the format helper writes (from each non-negative e4m3 value,
    zero and subnormals included) decodes, in every byte of a word (pair 0 bytes 0 and
    2, pair 1 bytes 1 and 3, the low half first), to T values s * 2**kExponent exactly
    (bf16's after its multiply by 2**127)."""
    exponent = kernel_facts[f"nvfp4_scale_exponent_{dtype}"][0]
    scales = torch.arange(0x7F, dtype=torch.int64).to(torch.uint8).view(torch.float8_e4m3fn)
    # Two rows of 64 columns: positions after the helper's pair interleave and swaps.
    rows = torch.zeros(2, 128, dtype=torch.float32)
    rows.view(-1)[: len(scales)] = scales.float()
    written = marlin_format.nvfp4_marlin_process_scales(rows).view(torch.uint8)
    written_bytes = set(written.view(-1).tolist())
    words = torch.tensor(FP8_WORDS, dtype=torch.int64)
    for pair in (0, 1):
        halves = _halves(kernel_facts[f"nvfp4_scale_pairs_{dtype}_{pair}"], dtype)
        for half, j in ((0, pair), (1, pair + 2)):
            byte = (words >> (8 * j)) & 0xFF
            mine = torch.tensor([b in written_bytes for b in byte.tolist()])
            got = halves[half].double() * (1.0 if dtype == torch.float16 else 2.0**127)
            want = _s0e5m3(byte) * 2.0 ** (exponent - 7)
            assert torch.equal(got[mine], want[mine])
    # And the bytes written are those of s * 2**7: every e4m3 value >= 0 once.
    assert sorted(_s0e5m3(torch.tensor(sorted(written_bytes))).tolist()) == sorted(
        (scales.double() * 2.0**7).tolist()
    )


def test_nvfp4_scale_offsets_are_where_the_helper_writes(kernel_facts):
    """The 8 bytes the kernels read for group g and permuted columns c .. c + 7 (at
    nvfp4_scale_offset) are those the helper wrote for them, in the order s0 s2 s1 s3
    s4 s6 s5 s7 (so that bytes i and i + 2 of each word are a pair)."""
    groups = 4
    positions = torch.arange(groups * NVFP4_N)
    # Distinct e4m3 values would not fit; position p gets the p % 127-th value and each
    # group's row a different rotation, so that no two reads that must differ agree.
    codes = (positions * 5 + positions // NVFP4_N * 31) % 0x7F
    scales = codes.to(torch.uint8).view(torch.float8_e4m3fn).float().reshape(groups, NVFP4_N)
    written = marlin_format.nvfp4_marlin_process_scales(scales).view(torch.uint8).view(-1)
    offsets = iter(kernel_facts["nvfp4_scale_offsets"])
    for group in range(groups):
        for column in range(0, NVFP4_N, 8):
            offset = next(offsets)
            read = written[offset : offset + 8]
            want = scales[group, [column + e for e in (0, 2, 1, 3, 4, 6, 5, 7)]]
            assert torch.equal(_s0e5m3(read.long()), want.double() * 2.0**7), (group, column)
