// The order in which a persistent GEMM grid walks its output tiles.
//
// Tiles are numbered in groups of `group_rows` tile-rows: within a group, down the
// rows first, then across. CTAs that run at the same time then share a few rows of
// A and a few columns of B, which stay in L2, instead of each streaming its own.
#pragma once

#include <cstdint>

namespace mllm_kernel::cuda {

struct TileCoord {
  int row;  // tile index along the output's rows
  int col;  // tile index along the output's columns
};

struct GroupedTileOrder {
  int tile_rows;
  int tile_cols;
  int group_rows;

  __host__ __device__ int num_tiles() const { return tile_rows * tile_cols; }

  /// The `index`-th tile in the walk (index < num_tiles()).
  __host__ __device__ TileCoord operator()(int index) const {
    const int per_group = group_rows * tile_cols;
    const int group = index / per_group;
    const int first_row = group * group_rows;
    const int rows_here = tile_rows - first_row < group_rows ? tile_rows - first_row : group_rows;
    const int within = index - group * per_group;
    return {first_row + within % rows_here, within / rows_here};
  }
};

/// A range [begin, end) of a tile's k-blocks.
struct KBlockRange {
  int begin;
  int end;
};

/// The k-blocks that partner `rank` of `split` CTAs sharing a tile's K sums:
/// consecutive shares whose sizes differ by at most one block.
__host__ __device__ inline KBlockRange split_k_blocks(int k_blocks, int rank, int split) {
  return {rank * k_blocks / split, (rank + 1) * k_blocks / split};
}

}  // namespace mllm_kernel::cuda
