"""choose_sm80_tile, the sm_80 GEMM kernels' tile and split of K per problem shape:
runs without a GPU (the kernels themselves are tested in test_cuda_gemm and
test_cuda_int8_gemm)."""

from __future__ import annotations

import itertools

import pytest

from mllm_kernel.cuda.jit.gemm_sm80 import SM80_TILES, choose_sm80_tile, workspace_bytes

SHAPES = list(
    itertools.product([1, 7, 16, 17, 64, 65, 128, 1024, 4096], [8, 4096, 14336], [8, 4096])
)


@pytest.mark.parametrize("element_bytes", [1, 2])
@pytest.mark.parametrize("num_sms", [16, 108, 132])
def test_every_choice_fits_every_gpu(element_bytes, num_sms):
    """Whatever the shape, the tile's stages fit the 99 KB of shared memory the
    smallest sm_80+ GPU gives a block, the split stays within the kernel's 16 slices,
    and decode splits fill the SMs at most once with slices of at least 2 KB of each
    row."""
    for m, n, k in SHAPES:
        choice = choose_sm80_tile(m, n, k, num_sms, element_bytes)
        assert choice.tile in SM80_TILES
        assert choice.tile.shared_bytes <= 99 * 1024, (m, n, k, choice)
        assert 1 <= choice.split <= 16
        tiles = -(-m // choice.tile.tile_m) * -(-n // choice.tile.tile_n)
        if choice.split > 1:
            assert tiles * choice.split <= num_sms, (m, n, k, choice)
            assert k * element_bytes // choice.split >= 2048, (m, n, k, choice)


def test_decode_splits():
    """The measured choices on 132 SMs: M = 1, N = 14336 (112 tiles) unsplit; M = 16,
    N = K = 4096 (32 tiles) split 4 (64 k-blocks of 128 bytes: 16 a slice); larger M
    128 x 128 tiles, unsplit."""
    assert str(choose_sm80_tile(1, 14336, 4096, 132)) == "16x128"
    assert str(choose_sm80_tile(16, 4096, 4096, 132)) == "16x128, split-K 4"
    assert str(choose_sm80_tile(65, 4096, 4096, 132)) == "128x128"


def test_workspace_holds_every_slice():
    """A split launch's workspace: a 16-byte aligned counter per tile, then every
    slice's 4-byte sums of every tile."""
    choice = choose_sm80_tile(16, 4096, 4096, 132)
    tiles = 4096 // 128
    assert workspace_bytes(choice, 16, 4096) == tiles * 4 + choice.split * tiles * 16 * 128 * 4
