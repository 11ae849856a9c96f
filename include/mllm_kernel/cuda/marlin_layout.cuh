// The Marlin weight format as kernels read it: the operands' kernel view (`Params`,
// checked on the host by `check_weights`), the zero modes, and where a column's scale
// and zero point sit in their permuted rows (mllm_kernel/cuda/jit/marlin_format.py
// writes them). Weights: int32 [K / 16, N * 16 * bits / 32], one k16 x n64 tile per
// 512 (4-bit) or 1024 (8-bit) contiguous bytes; lane l = 4 g + t of a warp owns 16 or
// 32 bytes of each tile, its mma.sync B fragments: 4-bit word w holds columns 8 (2 w) + g
// (pairs 0 and 1: rows 2 t + {0, 1} and 2 t + {8, 9}) and 8 (2 w + 1) + g (pairs 2, 3),
// a pair being the nibbles at bits 4 i and 16 + 4 i (dequant.cuh).
#pragma once

#include <tvm/ffi/optional.h>

#include <cstdint>

#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.cuh"

namespace mllm_kernel::cuda {
namespace marlin {

enum ZeroMode : int { kBias = 0, kIntZero = 1, kFloatZero = 2 };

struct Params {
  const void* a;  // [M, K], row stride lda
  int64_t lda;
  const uint32_t* b;     // Marlin words, [K / 16, N * 16 * bits / 32]
  const void* scales;    // [groups, N], Marlin-permuted
  const void* zeros;     // int32 [groups, N * bits / 32] or T [groups, N], or nullptr
  const int32_t* g_idx;  // [K] group of each Marlin row (act-order), or nullptr
  void* c;               // [M, N], row stride ldc
  int64_t ldc;
  float* partials;    // [split, M, N] when split > 1
  int32_t* counters;  // one per CTA column when split > 1, zero between launches
  int m, n, k;
  int groups;
  int group_shift;  // log2 of the rows per group; -1: one group over K (per channel)
  int zero_mode;
  int bias;               // the type's zero when zero_mode == kBias
  int split;              // CTAs along K
  int cluster_reduce;     // split-K sums through a cluster's shared memory (sm_90)
  int k_tiles_per_split;  // a multiple of 4 (the kernel's turn)
};

/// Position of column `c` (0..63) of a 64-column block in the permuted scales: groups
/// use [i * 8 + j] = column i + 8 j; per-channel scales permute 32-column blocks as
/// [8 i + j'] = column 2 i + {0, 1, 8, 9, 16, 17, 24, 25}[j'].
__device__ __forceinline__ int grouped_scale_position(int c) {
  return (c % 8) * 8 + c / 8;
}
__device__ __forceinline__ int channel_scale_position(int c) {
  const int within = c % 32, i = (within % 8) / 2, rest = within - 2 * i;
  return (c / 32) * 32 + 8 * i + (rest / 8) * 2 + rest % 2;
}

/// Slot of permuted position j (0..7) in a lane's zero-point word(s): words interleave
/// as the weights do, {0, 2, 4, 6, 1, 3, 5, 7} (4-bit) and {0, 2, 1, 3} (8-bit).
template <int Bits>
__device__ __forceinline__ uint32_t zero_point(const uint32_t* words, int j) {
  if constexpr (Bits == 4) {
    return (words[0] >> (4 * ((j % 2) * 4 + j / 2))) & 0xf;
  } else {
    const int c = j % 4;
    return (words[j / 4] >> (8 * ((c % 2) * 2 + c / 2))) & 0xff;
  }
}

/// The kernel's view of the weight operands, checked against each other and `device`.
inline Params check_weights(SymbolicDevice& device, TensorView b_q_weight, TensorView b_scales,
                            tvm::ffi::Optional<TensorView> b_zeros,
                            tvm::ffi::Optional<TensorView> g_idx, DLDataType dtype, int bits,
                            int64_t size_k, int64_t size_n, int64_t group_size, int64_t zero_mode,
                            int64_t bias) {
  Params p{};
  SymbolicSize groups{"num_groups"};
  TensorMatcher({size_k / 16, size_n * 16 * bits / 32})
      .dtype<int32_t>()
      .device(kDLCUDA, device)
      .contiguous()
      .verify(b_q_weight, "b_q_weight");
  TensorMatcher({groups, size_n})
      .dtype(dtype)
      .device(kDLCUDA, device)
      .contiguous()
      .verify(b_scales, "b_scales");
  p.b = data_ptr<uint32_t>(b_q_weight);
  p.scales = data_ptr<void>(b_scales);
  p.k = static_cast<int>(size_k);
  p.n = static_cast<int>(size_n);
  p.groups = static_cast<int>(groups.value());
  p.group_shift = group_size == 0 ? -1 : 31 - __builtin_clz(static_cast<unsigned>(group_size));
  p.zero_mode = static_cast<int>(zero_mode);
  p.bias = static_cast<int>(bias);
  ValueCheck(group_size == 0 || (group_size >= 32 && (group_size & (group_size - 1)) == 0 &&
                                 p.groups * group_size >= size_k),
             "argument 'b_scales': ", p.groups, " groups of ", group_size,
             " rows do not cover size_k = ", size_k);
  if (zero_mode != kBias) {
    RuntimeCheck(b_zeros.has_value(), "b_zeros missing for zero_mode ", zero_mode);
    TensorMatcher({groups, zero_mode == kIntZero ? size_n * bits / 32 : size_n})
        .dtype(zero_mode == kIntZero ? dtype_trait<int32_t>::value : dtype)
        .device(kDLCUDA, device)
        .contiguous()
        .verify(*b_zeros, "b_zeros");
    p.zeros = data_ptr<void>(*b_zeros);
  }
  if (g_idx.has_value()) {
    TensorMatcher({size_k})
        .dtype<int32_t>()
        .device(kDLCUDA, device)
        .contiguous()
        .verify(*g_idx, "g_idx");
    p.g_idx = data_ptr<int32_t>(*g_idx);
  }
  return p;
}

}  // namespace marlin
}  // namespace mllm_kernel::cuda
