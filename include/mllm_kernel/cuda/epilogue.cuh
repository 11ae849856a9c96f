// Epilogue building blocks for wgmma accumulators. Where a kernel puts its output's
// columns on wgmma's 64-row side (swapped dense GEMM tiles, the fused Marlin kernel),
// each thread holds pairs of neighbouring output *rows*: stored from registers, every
// 2-byte store half-fills the sectors it touches. Staged transposed in shared memory
// (stmatrix .trans), the tile leaves by one TMA store of whole 128-byte rows instead.
#pragma once

#include <cstdint>

#include "mllm_kernel/cuda/dequant.cuh"
#include "mllm_kernel/cuda/wgmma.cuh"

namespace mllm_kernel::cuda {

/// Writes a warpgroup's wgmma accumulators of an m64 x nQ tile, as 16-bit T, transposed
/// into the shared-memory box at `box`: box row c (c < kQ) holds tile column c, its 64
/// values in 128 bytes, TMA's 128-byte swizzle (16-byte piece p of row c at
/// p ^ (c % 8), so the 8 rows one stmatrix matrix writes fall in 8 different 16-byte
/// columns: conflict-free). `value(i, h)` is the float to store for accumulator i of
/// this thread, which holds tile row 16 warp + lane / 4 + 8 h and column
/// 8 (i / 4) + 2 (lane % 4) + i % 2 (wgmma's layout; `warp` counts the warpgroup's).
template <typename T, int kQ, typename Value>
__device__ __forceinline__ void stage_transposed_box(uint32_t box, int warp, int lane,
                                                     Value value) {
  static_assert(kQ % 16 == 0, "stmatrix.x4 writes two 8-column blocks at a time");
  // This lane addresses row lane % 8 of matrix lane / 8: the tile's column block
  // j + matrix / 2, rows 16 warp + 8 (matrix % 2)..., which is the box row's 16-byte
  // piece 2 warp + matrix % 2.
  const int matrix = lane / 8;
#pragma unroll
  for (int j = 0; j < kQ / 8; j += 2) {
    uint32_t frag[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int i = 4 * (j + m / 2) + 2 * (m % 2);
      frag[m] = bits_of<T>(pair_of<T>(value(i, m % 2), value(i + 1, m % 2)));
    }
    const int column = 8 * (j + matrix / 2) + lane % 8;
    const int piece = (2 * warp + matrix % 2) ^ (column % 8);
    stmatrix_x4_trans(box + column * kSwizzle128Bytes + piece * 16, frag);
  }
}

}  // namespace mllm_kernel::cuda
