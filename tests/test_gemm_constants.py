"""What the GEMM's Python side assumes of its C++ kernel, checked against the kernel's
own header (``include/mllm_kernel/cuda/gemm_config.cuh``): one nvcc build of a small
host program that instantiates every configuration of ``TILES`` and prints what the
kernel computes for it (tile rows and columns, k-block elements, shared memory for the
largest split ``choose_tile`` may pick), for 16-bit and int8 operands.

No GPU: the program runs on the host and calls no CUDA function.
"""

from __future__ import annotations

import importlib

import pytest
from conftest import run_host_program

gemm_module = importlib.import_module("mllm_kernel.cuda.jit.gemm")
TILES = gemm_module.TILES

pytestmark = pytest.mark.nvcc

# The element types of the kernel's instantiations: (C++ type, bytes).
ELEMENTS = {"bf16": ("__nv_bfloat16", 2), "int8": ("int8_t", 1)}


def _program() -> str:
    """A host program printing, per element type and tile, one line of
    ``element name tile_p tile_q tile_k shared_bytes(max_split) max_split()``, then the
    header's limits."""
    lines = [
        "#include <cuda_bf16.h>",
        "#include <cstdio>",
        '#include "mllm_kernel/cuda/gemm_config.cuh"',
        "using namespace mllm_kernel::cuda::hopper_gemm;",
        "template <typename C>",
        "void show(const char* element, const char* name, int split) {",
        '  std::printf("%s %s %d %d %d %zu %d\\n", element, name, C::kTileP, C::kTileQ,',
        "              C::kTileK, C::shared_bytes(split), C::max_split());",
        "}",
        "int main() {",
    ]
    for element, (cpp_type, _) in ELEMENTS.items():
        for t in TILES:
            swap = "true" if t.swap_ab else "false"
            config = f"TileConfig<{cpp_type}, {t.consumers}, {t.tile_q}, {t.stages}, {swap}, "
            config += f"{t.multicast}>"
            lines.append(f'  show<{config}>("{element}", "{t.name}", {t.max_split});')
    lines += [
        '  std::printf("limits %d %zu %d\\n", kMaxSplit, kSm90SharedBytesPerBlock, '
        "kTmaAlignBytes);",
        "  return 0;",
        "}",
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def kernel_facts(tmp_path_factory):
    """``({(element, tile name): (tile_p, tile_q, tile_k, shared bytes, largest split)},
    limits)`` as the C++ header computes them."""
    lines = run_host_program(tmp_path_factory.mktemp("gemm_constants"), _program())
    facts, limits = {}, None
    for line in lines.splitlines():
        fields = line.split()
        if fields[0] == "limits":
            limits = dict(
                zip(("max_split", "shared", "tma_align"), map(int, fields[1:]), strict=True)
            )
        else:
            facts[fields[0], fields[1]] = tuple(map(int, fields[2:]))
    return facts, limits


@pytest.mark.parametrize("element", ELEMENTS)
@pytest.mark.parametrize("tile", TILES, ids=lambda t: t.name)
def test_tile_shapes_are_the_kernels(kernel_facts, element, tile):
    """tile_m / tile_n (what choose_tile counts tiles and waves with) are the kernel's
    P and Q extents, swapped for swap_ab tiles."""
    tile_p, tile_q, _, _, _ = kernel_facts[0][element, tile.name]
    rows, cols = (tile_q, tile_p) if tile.swap_ab else (tile_p, tile_q)
    assert (tile.tile_m, tile.tile_n) == (rows, cols)


@pytest.mark.parametrize("element", ELEMENTS)
def test_a_k_block_is_the_kernels(kernel_facts, element):
    """choose_tile counts K in k-blocks of _K_BLOCK_BYTES bytes: one kernel k-block
    (TileConfig::kTileK elements) of every tile."""
    size = ELEMENTS[element][1]
    for tile in TILES:
        tile_k = kernel_facts[0][element, tile.name][2]
        assert tile_k * size == gemm_module._K_BLOCK_BYTES, tile.name


@pytest.mark.parametrize("element", ELEMENTS)
@pytest.mark.parametrize("tile", TILES, ids=lambda t: t.name)
def test_every_split_choose_tile_may_pick_fits(kernel_facts, element, tile):
    """A split of max_split CTAs is one cluster, at most kMaxSplit, and its partial sums
    fit in an sm_90 block's shared memory (the kernel's own shared_bytes), beside the
    stages or in them (max_split(), which the launch checks); multicast tiles share
    their cluster and never split."""
    _, _, _, shared, kernel_max_split = kernel_facts[0][element, tile.name]
    limits = kernel_facts[1]
    assert 1 <= tile.max_split <= min(limits["max_split"], kernel_max_split)
    assert tile.max_split & (tile.max_split - 1) == 0, "choose_tile doubles the split"
    assert shared <= limits["shared"], f"{shared} bytes for a split of {tile.max_split}"
    assert tile.multicast <= limits["max_split"]
    assert tile.multicast == 1 or tile.max_split == 1


def test_gemm_objects_refuse_what_the_kernel_refuses(kernel_facts):
    """Gemm(M, N, K) refuses, at construction, N and K that are not multiples of
    _ROW_MULTIPLE 16-bit elements: the kernel's 16-byte TMA rows."""
    assert kernel_facts[1]["tma_align"] == 2 * gemm_module._ROW_MULTIPLE
