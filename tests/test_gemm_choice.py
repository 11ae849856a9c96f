"""choose_tile between 64 and 256 tokens, where the swapped and the plain Hopper tiles
trade places: each assertion is a row of the ``--sweep-mid`` runs in
benchmarks/RESULTS.md (H200, 132 SMs), the choice measured fastest there. Runs
without a GPU (the kernels are tested in test_cuda_gemm and test_cuda_int8_gemm)."""

from __future__ import annotations

import itertools

import pytest

from mllm_kernel.cuda.jit.gemm import TILES, choose_tile

SMS = 132
BF16, INT8 = 2, 1


@pytest.mark.parametrize(
    ("m", "n", "k", "element_bytes", "expected"),
    [
        # M = 256 where N = 4096 leaves the plain tiles' grid at half the SMs: 128 x 128
        # tiles with K split in two for a long k-loop (>= 96 k-blocks), the swapped
        # 128-token tile over two tile-rows for a shorter one; the plain tiles elsewhere.
        (256, 4096, 14336, BF16, "128x128, split-K 2"),
        (256, 4096, 14336, INT8, "128x128, split-K 2"),
        (256, 4096, 4096, BF16, "swap-128x64-deep"),  # with its deeper ring (below)
        (256, 4096, 4096, INT8, "swap-128x64-deep"),
        (256, 14336, 4096, BF16, "128x256-mc2"),
        (256, 28672, 8192, BF16, "128x256-mc2"),
        # M = 65-128 and N large: 128 x 128 tiles without a cluster, both dtypes.
        (128, 14336, 4096, INT8, "128x128"),
        (128, 28672, 8192, INT8, "128x128"),
        (128, 14336, 4096, BF16, "128x128"),
        (128, 28672, 8192, BF16, "128x128"),
        (65, 14336, 4096, BF16, "128x128"),
        # int8, M = 128, N = 4096: two tile-rows of the 64-token tile (with its deeper
        # ring, below) where the 128-token one, unsplit, is half a wave; split, it stays.
        (128, 4096, 4096, INT8, "swap-64x64-deep"),
        (128, 4096, 14336, INT8, "swap-128x64, split-K 2"),
        # 16-bit, M = 128, N = 4096 keeps the swapped 128-token tile.
        (128, 4096, 4096, BF16, "swap-128x64, split-K 2"),
        (128, 4096, 14336, BF16, "swap-128x64, split-K 2"),
        # Outside (64, 256] nothing changes.
        (64, 14336, 4096, BF16, "swap-64x64"),
        (64, 14336, 4096, INT8, "swap-64x64"),
        (1024, 4096, 4096, BF16, "128x256-mc2"),
        (257, 4096, 4096, BF16, "128x128-mc2"),
    ],
)
def test_measured_choice(m, n, k, element_bytes, expected):
    assert str(choose_tile(m, n, k, SMS, element_bytes)) == expected


@pytest.mark.parametrize(
    ("m", "n", "k", "element_bytes", "expected"),
    [
        # 33-64 tokens, N = 4096 (64 tiles): the 12-stage ring unsplit, where the 6-stage
        # one split K in two or not at all (H100, bench_gemm_stages.py, session 27).
        (64, 4096, 4096, BF16, "swap-64x64-deep"),
        (64, 4096, 4096, INT8, "swap-64x64-deep"),
        (64, 4096, 14336, BF16, "swap-64x64-deep"),
        (64, 4096, 14336, INT8, "swap-64x64-deep"),
        (33, 8192, 4096, BF16, "swap-64x64-deep"),
        # More than a wave of tiles (N = 14336: 224; 8192 on 114 SMs: 128): the 6-stage
        # tile, two CTAs an SM.
        (64, 14336, 4096, BF16, "swap-64x64"),
        # A split of 4 (16 tiles at N = 1024) keeps more bytes in flight than the deep
        # ring unsplit would.
        (64, 1024, 4096, BF16, "swap-64x64, split-K 4"),
        # The 128-token tile at 8 stages where its 6-stage ring ran unsplit (two
        # tile-rows at 256 tokens), not where it split K in two.
        (256, 4096, 4096, BF16, "swap-128x64-deep"),
        (100, 4096, 512, BF16, "swap-128x64-deep"),
        (128, 4096, 4096, BF16, "swap-128x64, split-K 2"),
        (128, 4096, 14336, INT8, "swap-128x64, split-K 2"),
        # 1-32 tokens: the 16-stage rings unsplit where the 8-stage ones split K in two
        # or not at all (H100, bench_gemm_stages.py --m 16,32, session 28).
        (32, 4096, 4096, BF16, "swap-32x64-deep"),
        (32, 4096, 14336, INT8, "swap-32x64-deep"),
        (16, 4096, 4096, BF16, "swap-16x64-deep"),
        (16, 4096, 14336, INT8, "swap-16x64-deep"),
        (1, 6144, 4096, BF16, "swap-16x64-deep"),
        (16, 14336, 4096, BF16, "swap-16x64"),  # 224 tiles: more than a wave
        (32, 28672, 8192, INT8, "swap-32x64"),
        (1, 1024, 4096, BF16, "swap-16x64, split-K 8"),  # past a split of 2
    ],
)
def test_deep_ring_choice(m, n, k, element_bytes, expected):
    assert str(choose_tile(m, n, k, SMS, element_bytes)) == expected


@pytest.mark.parametrize("element_bytes", [BF16, INT8])
@pytest.mark.parametrize("m", [0, 1, 128, 129, 300, 4096])
def test_an_empty_output_has_a_choice(m, element_bytes):
    """N = 0 (an empty [M, 0] output, which the kernel returns at once): a tile, not a
    ZeroDivisionError in the wave efficiency past 128 tokens."""
    assert choose_tile(m, 0, 64, 132, element_bytes).tile in TILES


def test_deep_ring_needs_one_wave():
    """The same shape on fewer SMs than its tiles keeps the 6-stage tile."""
    assert str(choose_tile(64, 8192, 4096, 114, BF16)) == "swap-64x64"


@pytest.mark.parametrize("element_bytes", [BF16, INT8])
@pytest.mark.parametrize("num_sms", [16, 78, 114, 132])
def test_every_choice_is_a_tile_the_kernel_has(element_bytes, num_sms):
    """On any SM count and shape: a compiled tile, a split it allows, and swapped tiles
    only up to 256 tokens."""
    for m, n, k in itertools.product(
        [1, 16, 63, 64, 65, 127, 128, 129, 200, 256, 257, 4096], [64, 4096, 14336], [64, 4096]
    ):
        choice = choose_tile(m, n, k, num_sms, element_bytes)
        assert choice.tile in TILES
        assert 1 <= choice.split <= choice.tile.max_split, (m, n, k, choice)
        assert not choice.tile.swap_ab or m <= 256, (m, n, k, choice)
