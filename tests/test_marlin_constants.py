"""What the Marlin ops' Python side assumes of their C++ kernels, checked against the
kernels' own headers (``include/mllm_kernel/cuda/marlin_config.cuh``,
``marlin_layout.cuh``, ``cluster.cuh``): one nvcc build of a small host program that
prints the headers' values (the streaming kernel's CTA width, turn and split-K limits,
the builds that defer scales, the fused kernel's tile and split limits per token tile,
the zero modes, and where the scale and zero-point permutations put each column), which
each test compares with the Python copy the plan or the format helpers use; and the fp8
e4m3 dequantization (``dequant.cuh``'s ``Fp8Dequant``) of all 256 byte values, against
torch's float8_e4m3fn in float64.

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
ZERO_MODES = ("kBias", "kIntZero", "kFloatZero", "kFp8")
# Byte j of fp8 test word b is (b + 64 j) % 256: every byte value sits in every byte of
# some word, and a word's four bytes differ.
FP8_WORDS = [sum(((b + 64 * j) % 256) << (8 * j) for j in range(4)) for b in range(256)]


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
                facts = (f"{config}::{fact}" for fact in ("kCols", "kTileK", "kMaxSplit"))
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
    K at most as far as a build's ring holds its partners' sums."""
    cols, k_block, max_split = kernel_facts[f"fused_{dtype}_{tokens}_{zero}"]
    assert (cols, k_block) == (gptq_marlin._FUSED_COLS, gptq_marlin._FUSED_K_BLOCK)
    assert max_split == gptq_marlin._FUSED_MAX_SPLIT[tokens]


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
