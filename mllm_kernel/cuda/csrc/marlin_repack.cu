// GPTQ- and AWQ-packed int4/int8 weights -> the Marlin layout.
//
// Marlin stores a K x N weight as tiles of 16 k x 64 n, tile (kt, nt) at row kt,
// words [nt * W, (nt + 1) * W) of a [K / 16, N * 16 * bits / 32] int32 tensor
// (W = 16 * 64 * bits / 32). Inside a tile, lane l of the mma fragment layout
// (g = l / 4, t = l % 4) and warp w (the tile's 16-column block) own the values at
// rows 2t + {0, 1, 8, 9} of columns 16w + g and 16w + g + 8: for 4-bit weights one
// word at l * 4 + w, holding them as (row, column) = (0, g) (8, g) (0, g+8) (8, g+8)
// (1, g) (9, g) (1, g+8) (9, g+8) from the low nibble up (rows relative to 2t); for
// 8-bit weights two words at l * 8 + 2w and + 1 for columns g and g + 8, each
// holding rows 0, 8, 1, 9 from the low byte up. The pairs a dequantizer needs
// (rows 0/1 and 8/9 of a column) thus sit 16 bits apart.
//
// GPTQ input: [K / (32 / bits), N], value k at bits (k % pack) * bits of row
// k / pack; with act-order, Marlin row k takes input row perm[k].
// AWQ input: [K, N / (32 / bits)], columns interleaved inside a word: column
// 8j + c (4-bit) sits at nibble {0, 4, 1, 5, 2, 6, 3, 7}[c]; 8-bit {0, 2, 1, 3}[c]
// (marlin::word_slot, the weights' own interleave).
//
// `out` is flat: the caller allocates the words before the sizes are checked here, and
// views them as [K / 16, N * 16 / pack] afterwards.
#include <tvm/ffi/optional.h>

#include "mllm_kernel/cuda/marlin_layout.cuh"
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.cuh"

namespace mllm_kernel::cuda {
namespace marlin_repack {

inline constexpr int kThreads = 256;

struct Params {
  const uint32_t* in;
  const int32_t* perm;  // GPTQ act-order rows, or nullptr
  uint32_t* out;
  int64_t size_k, size_n;
};

template <int Bits, bool Awq>
__device__ __forceinline__ uint32_t source_value(const Params& p, int64_t k, int64_t n) {
  constexpr int kPack = 32 / Bits;
  constexpr uint32_t kMask = (1u << Bits) - 1;
  if constexpr (Awq) {
    const int slot = marlin::word_slot<Bits>(static_cast<int>(n % kPack));
    return (p.in[k * (p.size_n / kPack) + n / kPack] >> (slot * Bits)) & kMask;
  } else {
    // perm's values are clamped into the rows, as the GEMM clamps them: the Python range
    // check is skipped during CUDA-graph capture.
    const int64_t row =
        p.perm != nullptr ? min(max(int64_t{p.perm[k]}, int64_t{0}), p.size_k - 1) : k;
    return (p.in[(row / kPack) * p.size_n + n] >> ((row % kPack) * Bits)) & kMask;
  }
}

// One thread per output word.
template <int Bits, bool Awq>
__global__ void repack_kernel(const Params p) {
  constexpr int kTileWords = 16 * 64 * Bits / 32;
  const int64_t row_words = p.size_n * 16 * Bits / 32;
  const int64_t total = (p.size_k / 16) * row_words;
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; index < total;
       index += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t kt = index / row_words;
    const int64_t nt = (index % row_words) / kTileWords;
    const int within = static_cast<int>(index % kTileWords);
    int lane, warp, half;
    if constexpr (Bits == 4) {
      lane = within / 4, warp = within % 4, half = 0;
    } else {
      lane = within / 8, warp = (within % 8) / 2, half = within % 2;
    }
    const int64_t k0 = kt * 16 + 2 * (lane % 4);
    const int64_t n = nt * 64 + warp * 16 + lane / 4 + 8 * half;
    uint32_t word = 0;
    if constexpr (Bits == 4) {
      constexpr int kRow[8] = {0, 8, 0, 8, 1, 9, 1, 9};
      constexpr int kCol[8] = {0, 0, 8, 8, 0, 0, 8, 8};
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        word |= source_value<Bits, Awq>(p, k0 + kRow[s], n + kCol[s]) << (4 * s);
      }
    } else {
      constexpr int kRow[4] = {0, 8, 1, 9};
#pragma unroll
      for (int s = 0; s < 4; ++s) word |= source_value<Bits, Awq>(p, k0 + kRow[s], n) << (8 * s);
    }
    p.out[index] = word;
  }
}

template <bool Awq>
void launch(const Params& p, int64_t num_bits, DLDevice device) {
  const int64_t words = (p.size_k / 16) * p.size_n * 16 * num_bits / 32;
  const dim3 grid(grid_stride_blocks(words, kThreads, device));
  if (num_bits == 4) {
    KernelLauncher(grid, dim3(kThreads), device)(repack_kernel<4, Awq>, p);
  } else {
    KernelLauncher(grid, dim3(kThreads), device)(repack_kernel<8, Awq>, p);
  }
}

inline void check_sizes(int64_t size_k, int64_t size_n, int64_t num_bits) {
  ValueCheck(num_bits == 4 || num_bits == 8, "argument 'num_bits': expected 4 or 8, got ",
             num_bits);
  marlin::check_tile_sizes(size_k, size_n);
}

}  // namespace marlin_repack

/// out (the [K / 16, N * 16 / pack] words, flat) <- GPTQ b_q_weight [K / pack, N], rows
/// taken through `perm` (int32 [K]) when given.
inline void gptq_marlin_repack(TensorView b_q_weight, tvm::ffi::Optional<TensorView> perm,
                               TensorView out, int64_t size_k, int64_t size_n, int64_t num_bits) {
  marlin_repack::check_sizes(size_k, size_n, num_bits);
  const int64_t pack = 32 / num_bits;
  SymbolicDevice device;
  TensorMatcher()
      .dtype<int32_t>()
      .device(kDLCUDA, device)
      .contiguous()
      .verify(b_q_weight, "b_q_weight");
  marlin::check_packed_shape(b_q_weight, "b_q_weight", size_k / pack, size_n,
                             "GPTQ: size_k * num_bits / 32, size_n", num_bits);
  TensorMatcher({size_k / 16 * size_n * 16 / pack})
      .dtype<int32_t>()
      .device(kDLCUDA, device)
      .contiguous()
      .verify(out, "out");
  marlin_repack::Params p{data_ptr<uint32_t>(b_q_weight), nullptr, data_ptr<uint32_t>(out), size_k,
                          size_n};
  if (perm.has_value()) {
    TensorMatcher({size_k})
        .dtype<int32_t>()
        .device(kDLCUDA, device)
        .contiguous()
        .verify(*perm, "perm");
    p.perm = data_ptr<int32_t>(*perm);
  }
  marlin_repack::launch<false>(p, num_bits, device.value());
}

/// out (the [K / 16, N * 16 / pack] words, flat) <- AWQ b_q_weight [K, N / pack].
inline void awq_marlin_repack(TensorView b_q_weight, TensorView out, int64_t size_k, int64_t size_n,
                              int64_t num_bits) {
  marlin_repack::check_sizes(size_k, size_n, num_bits);
  const int64_t pack = 32 / num_bits;
  SymbolicDevice device;
  TensorMatcher()
      .dtype<int32_t>()
      .device(kDLCUDA, device)
      .contiguous()
      .verify(b_q_weight, "b_q_weight");
  marlin::check_packed_shape(b_q_weight, "b_q_weight", size_k, size_n / pack,
                             "AWQ: size_k, size_n * num_bits / 32", num_bits);
  TensorMatcher({size_k / 16 * size_n * 16 / pack})
      .dtype<int32_t>()
      .device(kDLCUDA, device)
      .contiguous()
      .verify(out, "out");
  const marlin_repack::Params p{data_ptr<uint32_t>(b_q_weight), nullptr, data_ptr<uint32_t>(out),
                                size_k, size_n};
  marlin_repack::launch<true>(p, num_bits, device.value());
}

}  // namespace mllm_kernel::cuda
