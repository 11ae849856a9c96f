// W4A16 / W8A16 GEMM on weights in the Marlin layout (see marlin_repack.cu):
//   c[M, N] = a[M, K] @ dequant(b)[K, N],  dequant(q) = (q - zero) * scale,
// with zero the type's bias (uint4b8: 8, uint8b128: 128), an int zero point per
// group and column (uint4/uint8 + b_zeros) or a float one (is_zp_float); or, for fp8
// e4m3 bytes (zero mode kFp8), dequant(q) = fp8(q) * scale, with the scales carrying
// the exponent bias that dequant.cuh's Fp8Dequant leaves out; or, for NVFP4 (kFp4),
// dequant(q) = e2m1(q) * scale * global_scale with fp8 scales per 16 k
// (marlin_nvfp4.cuh), the global scale applied to the fp32 sums.
//
// Streaming kernel (`marlin_stream_kernel`), for the small M of decoding, where
// reading the weights bounds the time. A CTA is 4 warps; each warp owns one 64-column
// Marlin tile of the CTA's 256 columns, for the CTA's slice of K. A lane's 16 bytes of
// a k16 x n64 tile are exactly its mma fragments, so each lane copies its own bytes
// (cp.async) into its warp's ring of kDepth tiles and reads back only those: every
// tile is one coalesced warp read, and no warp waits for another on weights. The
// activations (`Rows` = 8, 16 or 64 tokens per CTA) pass through two shared-memory
// chunks of 256 k; those chunks are the CTA's only barriers. The tiles are multiplied
// with mma.sync m16n8k16 into fp32, four tiles a turn, in one of two ways:
//   - 8 or 16 tokens (no act-order, not 8-bit weights in bf16, not fp8 or NVFP4): the weights
//     are the A operand, entering as magic + step q straight from their bits, the
//     tokens one or two B operands, and each group's scale and zero apply once to its
//     fp32 sums (DeferredScales);
//   - otherwise the weights are dequantized in registers (the magic-number trick,
//     dequant.cuh), scaled, and are the B operand of 16-row blocks of activations.
// Scales and zero points are loaded one group ahead (NVFP4's, one per k16 tile, travel
// with their tiles through the weight ring), and the zero mode and act-order are
// template parameters.
//
// The kernel reads as its steps, each a device function or a small struct of them:
// StreamSlice (the CTA's columns, rows and K slice), the producers (WeightRing, each
// lane's ring of weight tiles; load_activation_chunk, the A chunks), the consumer
// (StreamConsumer: multiply one tile, begin a group, finish; GroupSchedule: when the
// constants change along K), stream_main_loop, and the epilogues (store_results,
// cluster_split_k_sum, publish_partial + sum_partials).
//
// When the column tiles alone cannot fill the GPU, K is split over `split` CTAs, which
// are summed in a fixed order (run-to-run identical results) in one of two ways:
//   - on sm_90+, the split CTAs of a column tile form a thread-block cluster and sum
//     through distributed shared memory;
//   - elsewhere they write fp32 partials, and the last to finish (counted in
//     `workspace`, left zeroed again) sums them.
// M beyond `Rows` tokens takes grid.z.
//
// `marlin_dequantize_kernel` writes dequant(b) as a [N, K] matrix (the nn.Linear
// layout) for large M, where the product runs on the Hopper GEMM instead.
//
// Act-order: a's columns are first permuted into Marlin row order (a[:, perm], by
// permute_columns_kernel into the caller's scratch), and g_idx is in Marlin row order;
// each k row then takes the scales of group g_idx[k].
#include <tvm/ffi/optional.h>

#include <climits>

#include "mllm_kernel/cuda/cluster.cuh"
#include "mllm_kernel/cuda/cp_async.cuh"
#include "mllm_kernel/cuda/dequant.cuh"
#include "mllm_kernel/cuda/marlin_config.cuh"
#include "mllm_kernel/cuda/marlin_layout.cuh"
#include "mllm_kernel/cuda/marlin_nvfp4.cuh"
#include "mllm_kernel/cuda/mma_sync.cuh"
#include "mllm_kernel/cuda/split_k.cuh"
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.cuh"

namespace mllm_kernel::cuda {
namespace marlin {

/// Per lane: the dequantization constants of its 8 n8 blocks (columns 8 jb + g of a
/// 64-column tile). Without act-order one scale per block (`scale[0]`); with it, one
/// per row 2t + {0, 1, 8, 9} (`scale[0..3]`), since each row has its own group.
template <typename T, int Bits, bool ActOrder>
struct TileConstants {
  using Deq = IntDequant<T, Bits>;
  typename Deq::Offset offset[8];  // magic + zero of block jb
  Vec<T, 8> scale[ActOrder ? 4 : 1];
  Vec<T, 8> float_zero;

  /// Zeros that do not vary: the type's bias (or 0 under float zero points).
  __device__ __forceinline__ void set_fixed_zero(float zero) {
    const typename Deq::Offset shared = Deq::offset(zero);  // once: one register, not 8
#pragma unroll
    for (int jb = 0; jb < 8; ++jb) offset[jb] = shared;
  }

  /// Int zero points of block jb from the lane's word(s).
  __device__ __forceinline__ void set_zero_points(const uint32_t (&words)[2]) {
#pragma unroll
    for (int jb = 0; jb < 8; ++jb) {
      offset[jb] = Deq::int_offset(zero_point<Bits>(words, jb));
    }
  }
};

/// The lane's zero-point word(s) of a 64-column row of packed zero points.
template <int Bits>
__device__ __forceinline__ void lane_zero_words(uint32_t (&words)[2], const uint32_t* row,
                                                int lane) {
  words[0] = row[(Bits / 4) * (lane / 4)];
  words[1] = Bits == 8 ? row[2 * (lane / 4) + 1] : 0u;
}

/// One group's constants for lane g from a 64-column row of permuted scales (8
/// consecutive values per lane) and the matching zero points.
template <typename T, int Bits, bool ActOrder>
__device__ __forceinline__ void group_constants(TileConstants<T, Bits, ActOrder>& tc,
                                                const T* scale_row, const void* zero_row,
                                                int zero_mode, int lane) {
  tc.scale[0] = *reinterpret_cast<const Vec<T, 8>*>(scale_row + 8 * (lane / 4));
  if (zero_mode == kIntZero) {
    uint32_t words[2];
    lane_zero_words<Bits>(words, static_cast<const uint32_t*>(zero_row), lane);
    tc.set_zero_points(words);
  } else if (zero_mode == kFloatZero) {
    tc.float_zero =
        *reinterpret_cast<const Vec<T, 8>*>(static_cast<const T*>(zero_row) + 8 * (lane / 4));
  }
}

/// Per-channel scales (one group over K) of lane g's columns of the 64 from `col0`:
/// scales and float zeros in the per-channel permutation, int zero points in the
/// grouped one (the format's zero-point helper always permutes that way).
template <typename T, int Bits, bool ActOrder>
__device__ __forceinline__ void channel_constants(TileConstants<T, Bits, ActOrder>& tc,
                                                  const Params& p, int col0, int lane) {
  const T* scales = static_cast<const T*>(p.scales);
#pragma unroll
  for (int jb = 0; jb < 8; ++jb) {
    const int position = col0 + channel_scale_position(8 * jb + lane / 4);
    tc.scale[0].data[jb] = scales[position];
    if (p.zero_mode == kFloatZero) {
      tc.float_zero.data[jb] = static_cast<const T*>(p.zeros)[position];
    }
  }
  if (p.zero_mode == kIntZero) {
    uint32_t words[2];
    lane_zero_words<Bits>(words, static_cast<const uint32_t*>(p.zeros) + col0 * Bits / 32, lane);
    tc.set_zero_points(words);
  }
}

/// Act-order: the scales of each of the lane's 4 rows (from k row `row0`), each from
/// its own group, read from global memory (L1-cached: neighbouring lanes share them).
template <typename T, int Bits>
__device__ __forceinline__ void act_order_constants(TileConstants<T, Bits, true>& tc,
                                                    const Params& p, int64_t row0, int col0,
                                                    int lane) {
  const T* scales = static_cast<const T*>(p.scales);
  constexpr int kRowOffsets[4] = {0, 1, 8, 9};
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    // A group index out of range reads the nearest group rather than past the tensor.
    const int64_t group = min(max(__ldg(p.g_idx + row0 + kRowOffsets[r]), 0), p.groups - 1);
    tc.scale[r] = *reinterpret_cast<const Vec<T, 8>*>(scales + group * p.n + col0 + 8 * (lane / 4));
  }
}

/// The weight words of one lane for a k16 x n64 tile: 4 (4-bit) or 8 (8-bit).
template <int Bits>
using LaneWords = Vec<uint32_t, Bits == 4 ? 4 : 8>;

/// Block jb (columns 8 jb + g) of a lane's tile words, dequantized: rows 2t + {0, 1}
/// in `lo`, 2t + {8, 9} in `hi` (the two B registers of an m16n8k16 mma). `ZeroMode`
/// kFp8 reads the bytes as fp8 e4m3 (their exponent bias is in the scales), kFp4 the
/// nibbles as e2m1 (theirs is in the global factor).
template <typename T, int Bits, bool ActOrder, int ZeroMode>
__device__ __forceinline__ void dequant_block(const LaneWords<Bits>& words, int jb,
                                              const TileConstants<T, Bits, ActOrder>& tc,
                                              Pair<T>& lo, Pair<T>& hi) {
  using Deq = IntDequant<T, Bits>;
  // 4-bit: word jb / 2 holds blocks 2w (pairs 0, 1) and 2w + 1 (pairs 2, 3);
  // 8-bit: word jb holds one block (pairs 0, 1).
  uint32_t word;
  int first;
  if constexpr (Bits == 4) {
    word = words.data[jb / 2], first = 2 * (jb % 2);
  } else {
    word = words.data[jb], first = 0;
  }
  if constexpr (ZeroMode == kFp8) {
    static_assert(Bits == 8, "fp8 weights are bytes");
    lo = Fp8Dequant<T>::pair(word, 0);
    hi = Fp8Dequant<T>::pair(word, 1);
  } else if constexpr (ZeroMode == kFp4) {
    static_assert(Bits == 4, "NVFP4 weights are nibbles");
    lo = E2m1Dequant<T>::pair(word, first);
    hi = E2m1Dequant<T>::pair(word, first + 1);
  } else {
    lo = Deq::pair(word, first, tc.offset[jb]);
    hi = Deq::pair(word, first + 1, tc.offset[jb]);
  }
  if constexpr (ZeroMode == kFloatZero) {
    const Pair<T> zero{tc.float_zero.data[jb], tc.float_zero.data[jb]};
    lo = __hsub2(lo, zero);
    hi = __hsub2(hi, zero);
  }
  if constexpr (ActOrder) {
    lo = __hmul2(lo, Pair<T>{tc.scale[0].data[jb], tc.scale[1].data[jb]});
    hi = __hmul2(hi, Pair<T>{tc.scale[2].data[jb], tc.scale[3].data[jb]});
  } else {
    const Pair<T> scale{tc.scale[0].data[jb], tc.scale[0].data[jb]};
    lo = __hmul2(lo, scale);
    hi = __hmul2(hi, scale);
  }
}

/// Dequantizes a lane's tile words and multiplies them with the A fragments of the row
/// blocks that hold any of the `rows` valid rows.
template <typename T, int Bits, int MBlocks, bool ActOrder, int ZeroMode>
__device__ __forceinline__ void tile_mma(float (&acc)[MBlocks][8][4],
                                         const uint32_t (&a_frag)[MBlocks][4],
                                         const LaneWords<Bits>& words,
                                         const TileConstants<T, Bits, ActOrder>& tc, int rows) {
#pragma unroll
  for (int jb = 0; jb < 8; ++jb) {
    Pair<T> lo, hi;
    dequant_block<T, Bits, ActOrder, ZeroMode>(words, jb, tc, lo, hi);
#pragma unroll
    for (int mb = 0; mb < MBlocks; ++mb) {
      if (mb == 0 || mb * 16 < rows) {
        mma_m16n8k16<T>(acc[mb][jb], a_frag[mb], bits_of<T>(lo), bits_of<T>(hi));
      }
    }
  }
}

/// The zero every weight shares when there are no int zero points.
__device__ __forceinline__ float fixed_zero(const Params& p) {
  return p.zero_mode == kBias ? static_cast<float>(p.bias) : 0.f;
}

/// One group's scales (and zero points) for a lane, loaded ahead of their use.
template <typename T, int Bits, int ZeroMode>
struct GroupValues {
  Vec<T, 8> scale;
  uint32_t zero_words[2];  // kIntZero
  Vec<T, 8> float_zero;    // kFloatZero

  __device__ __forceinline__ void load(const Params& p, int group, int col0, int lane) {
    const int64_t row = int64_t{group} * p.n + col0;
    scale =
        *reinterpret_cast<const Vec<T, 8>*>(static_cast<const T*>(p.scales) + row + 8 * (lane / 4));
    if constexpr (ZeroMode == kIntZero) {
      lane_zero_words<Bits>(zero_words, static_cast<const uint32_t*>(p.zeros) + row * Bits / 32,
                            lane);
    } else if constexpr (ZeroMode == kFloatZero) {
      float_zero = *reinterpret_cast<const Vec<T, 8>*>(static_cast<const T*>(p.zeros) + row +
                                                       8 * (lane / 4));
    }
  }

  /// Asks L2 for group `group`'s scales of the warp's 64 columns (lane 0: one 128-byte
  /// line), so that their load, a group later, waits for L2 alone. Zero points are left
  /// out, and float zero points' builds ask for nothing: there it spilled the 16-token
  /// build (40 bytes).
  __device__ __forceinline__ static void prefetch(const Params& p, int group, int col0, int lane) {
    if constexpr (ZeroMode != kFloatZero) {
      if (lane == 0) {
        prefetch_l2_line(static_cast<const T*>(p.scales) + int64_t{group} * p.n + col0);
      }
    }
  }

  template <bool ActOrder>
  __device__ __forceinline__ void apply(TileConstants<T, Bits, ActOrder>& tc) const {
    tc.scale[0] = scale;
    if constexpr (ZeroMode == kIntZero) tc.set_zero_points(zero_words);
    if constexpr (ZeroMode == kFloatZero) tc.float_zero = float_zero;
  }
};

/// The streaming kernel's math for 8 or 16 tokens when scales can wait. The weights are
/// the mma's A operand (16 columns x 16 k) and the activations its B (16 k x 8 tokens,
/// once per 8 tokens), so an mma spends at most 7 token rows on absent tokens, not 15,
/// and a tile takes 4 mma per 8 tokens (the other way: 8 per 16 tokens, each weight
/// dequantized and scaled). Each weight enters as magic + step q, straight from its bits
/// (IntDequant::top_biased_pair, q in the mantissa's top bits: 2 instructions a pair
/// instead of 4), and the group's scale and zero meet its fp32 sum once, at the group's
/// end:
///   sum_k a_k (q_k - z) s = s / step (sum_k a_k (magic + step q_k)
///                                     - (magic + step z) sum_k a_k),
/// sum_k a_k coming from one more mma against ones per 8 tokens. The magic is 16 steps
/// for 4-bit weights and q's range for 8-bit ones, so the sums it is removed from are a
/// few times larger than the result, and fp32 keeps their rounding far below the
/// output's 16-bit precision (with q in the low bits, fp16 sums of activations with a
/// large common mean exceeded it: test_gemm_activations_with_a_large_common_mean).
/// Lane 4 g + t accumulates columns 8 (2 p + h) + g in mma p's d[2 h + i], for token
/// 8 b + 2 t + i of token block b (`Blocks` of 8 tokens: 1 or 2).
/// With 2 blocks the finished groups' totals live in shared memory (`shared_total`,
/// touched once per group): in registers the twice as many sums spilled at 128
/// registers and ran 2-4% slower than dequantizing each weight (RESULTS.md, session 10);
/// in shared memory they run 7-11% faster than it (session 11).
template <typename T, int Bits, int ZeroMode, int Blocks>
struct DeferredScales {
  using Deq = IntDequant<T, Bits>;
  static constexpr float kStep = Deq::kTopStep;
  static_assert(Blocks == 1 || Blocks == 2, "8 or 16 tokens");
  static constexpr bool kSharedTotals = Blocks > 1;
  /// Shared-memory floats per warp for the totals (0 when they stay in registers).
  static constexpr int kSharedFloatsPerWarp = kSharedTotals ? 32 * Blocks * 16 : 0;
  float group_sum[Blocks][4][4];  // this group's sum_k a (magic + step q)
  float a_sum[Blocks][4];  // this group's sum_k a: d[i] of token 8 b + 2 t + i (d[2..3] repeat)
  float total[4][4];       // with 1 block: the finished groups, scaled (mma p, accumulator d)
  // With 2 blocks: quad q (totals 4 q .. 4 q + 3) of this lane at shared_total[32 q], so
  // that a warp moves a quad with one conflict-free 16-byte access per lane.
  float4* shared_total;

  /// `warp_shared` the warp's kSharedFloatsPerWarp floats (unused with 1 block).
  __device__ __forceinline__ void init(float* warp_shared, int lane) {
    if constexpr (kSharedTotals) shared_total = reinterpret_cast<float4*>(warp_shared) + lane;
#pragma unroll
    for (int q = 0; q < 4 * Blocks; ++q) store_quad(q, float4{0.f, 0.f, 0.f, 0.f});
#pragma unroll
    for (int i = 0; i < 16 * Blocks; ++i) group_sum[i / 16][i / 4 % 4][i % 4] = 0.f;
#pragma unroll
    for (int i = 0; i < 4 * Blocks; ++i) a_sum[i / 4][i % 4] = 0.f;
  }

  /// Totals 4 q .. 4 q + 3 (total j = 16 b + 4 p + d of block b, mma p, accumulator d).
  __device__ __forceinline__ float4 load_quad(int q) const {
    if constexpr (kSharedTotals) {
      return shared_total[32 * q];
    } else {
      return float4{total[q][0], total[q][1], total[q][2], total[q][3]};
    }
  }

  __device__ __forceinline__ void store_quad(int q, float4 v) {
    if constexpr (kSharedTotals) {
      shared_total[32 * q] = v;
    } else {
      total[q][0] = v.x, total[q][1] = v.y, total[q][2] = v.z, total[q][3] = v.w;
    }
  }

  /// One k16 tile: `frag[b]` the B fragment of token block b, `words` the lane's
  /// weight words (turned into A fragments once for all blocks).
  __device__ __forceinline__ void tile(const uint32_t (&frag)[Blocks][2],
                                       const LaneWords<Bits>& words) {
    constexpr uint32_t kOnes = std::is_same_v<T, __half> ? 0x3c003c00u : 0x3f803f80u;
    constexpr uint32_t kOnesFrag[4] = {kOnes, kOnes, kOnes, kOnes};
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      // A rows 0-7: column block 2 p (k pairs lo, hi), rows 8-15: block 2 p + 1.
      uint32_t w[4];
      if constexpr (Bits == 4) {
        const uint32_t word = words.data[p];  // blocks 2 p (pairs 0, 1) and 2 p + 1 (2, 3)
        w[0] = bits_of<T>(Deq::top_biased_pair(word, 0));
        w[1] = bits_of<T>(Deq::top_biased_pair(word, 2));
        w[2] = bits_of<T>(Deq::top_biased_pair(word, 1));
        w[3] = bits_of<T>(Deq::top_biased_pair(word, 3));
      } else {
        const uint32_t even = words.data[2 * p], odd = words.data[2 * p + 1];
        w[0] = bits_of<T>(Deq::top_biased_pair(even, 0));
        w[1] = bits_of<T>(Deq::top_biased_pair(odd, 0));
        w[2] = bits_of<T>(Deq::top_biased_pair(even, 1));
        w[3] = bits_of<T>(Deq::top_biased_pair(odd, 1));
      }
#pragma unroll
      for (int b = 0; b < Blocks; ++b) mma_m16n8k16<T>(group_sum[b][p], w, frag[b][0], frag[b][1]);
    }
#pragma unroll
    for (int b = 0; b < Blocks; ++b) mma_m16n8k16<T>(a_sum[b], kOnesFrag, frag[b][0], frag[b][1]);
  }

  /// Scales the group's sums with its constants `tc` into the totals and starts anew.
  template <bool ActOrder>
  __device__ __forceinline__ void close_group(const TileConstants<T, Bits, ActOrder>& tc) {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      // Accumulator d = 2 h + i of mma p: column block 2 p + h, token 8 b + 2 t + i.
      float scale[2], offset[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int jb = 2 * p + h;
        scale[h] = static_cast<float>(tc.scale[0].data[jb]) / kStep;  // exact
        float zero = __low2float(tc.offset[jb]) - Deq::kMagic;        // the column's zero
        if constexpr (ZeroMode == kFloatZero) zero += static_cast<float>(tc.float_zero.data[jb]);
        offset[h] = Deq::kMagic + kStep * zero;  // magic + step z
      }
#pragma unroll
      for (int b = 0; b < Blocks; ++b) {
        const float4 quad = load_quad(4 * b + p);
        float totals[4] = {quad.x, quad.y, quad.z, quad.w};
#pragma unroll
        for (int d = 0; d < 4; ++d) {
          totals[d] += scale[d / 2] * (group_sum[b][p][d] - offset[d / 2] * a_sum[b][d % 2]);
          group_sum[b][p][d] = 0.f;
        }
        store_quad(4 * b + p, float4{totals[0], totals[1], totals[2], totals[3]});
      }
    }
#pragma unroll
    for (int i = 0; i < 4 * Blocks; ++i) a_sum[i / 4][i % 4] = 0.f;
  }

  /// The totals in the row-major layout of the other kernel's accumulators (lane 4 g +
  /// t: token 8 b + g of columns 8 jb + 2 t, + 1 in acc[0][jb][2 b], [2 b + 1]), one
  /// 8 x 8 transpose per block and column block.
  __device__ __forceinline__ void to_rows(float (&acc)[1][8][4]) {
#pragma unroll
    for (int b = 0; b < Blocks; ++b) {
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        float4 quad = load_quad(4 * b + p);  // blocks 2 p (x, y) and 2 p + 1 (z, w)
        transpose_8x8(quad.x, quad.y);
        transpose_8x8(quad.z, quad.w);
        acc[0][2 * p][2 * b] = quad.x;
        acc[0][2 * p][2 * b + 1] = quad.y;
        acc[0][2 * p + 1][2 * b] = quad.z;
        acc[0][2 * p + 1][2 * b + 1] = quad.w;
      }
    }
  }
};

/// What the other kernels hold in DeferredScales' place.
struct NoDeferredScales {};

inline constexpr int kChunkTiles = 16;  // k16 tiles per shared-memory A chunk
inline constexpr int kChunkK = 16 * kChunkTiles;

/// Weight tiles each warp keeps in flight: 8 x 512 bytes (4-bit) or 8 x 1 KB. Depths 12
/// and 16 ran no faster on the H100 (RESULTS.md, session 7). The deferred-scales kernels
/// keep 4: with 8 tokens, on an H200 at M = 1, depths 4 / 8 / 12 took 47.2 / 48.5 / 48.9 us
/// (28672 x 8192) and 15.6 / 16.2 / 17.0 us (14336 x 4096; RESULTS.md, session 10):
/// fewer copies in flight queue less, and the ring is refilled as fast as it drains.
inline constexpr int kStreamDepth = 8;
inline constexpr int kDeferredDepth = 4;
/// CTAs per SM the kernels of up to 16 tokens are built for: 5 x 4 warps, at most 102
/// registers; the deferred-scales kernels 4, at most 128 registers (no spills, and with
/// 8 tokens 7-8% faster at M = 1 on an H200: 44.1 / 47.4 us at 28672 x 8192, 8.0 / 8.7
/// us at 4096^2; the planned grids hold at most ~3.4 CTAs per SM).
inline constexpr int kStreamMinBlocks = 5;
inline constexpr int kDeferredMinBlocks = 4;
static_assert(kTurnTiles == 4, "the main loop is written for turns of 4 tiles");
static_assert(kChunkTiles % kTurnTiles == 0, "a chunk holds whole turns");

/// Shared memory of the streaming kernel: each warp's ring of kDepth weight tiles, then
/// two A chunks (rows x 256 k, 16-byte pieces XOR-swizzled by the row so that
/// ldmatrix's 8 rows hit different banks), then (deferred scales, 16 tokens) each
/// warp's group totals, then (`RingScales`: NVFP4) each warp's ring of its tiles'
/// scales, 8 bytes a lane per tile.
template <int Bits, int Rows, bool Deferred, bool RingScales>
struct StreamLayout {
  static constexpr int kRows = Rows;
  static constexpr int kDepth = Deferred ? kDeferredDepth : kStreamDepth;
  // A chunk's copies join the group of the first tile that needs it, or an earlier one.
  static_assert(kDepth <= kChunkTiles, "a chunk's activations arrive with its first tile");
  static_assert(kDepth % kTurnTiles == 0, "the ring holds whole turns");
  static constexpr int kTileBytes = 16 * 64 * Bits / 8;
  static constexpr int kRingBytes = kStreamWarps * kDepth * kTileBytes;
  static constexpr int kChunkBytes = kRows * kChunkK * 2;
  static constexpr int kTotalsOffset = kRingBytes + 2 * kChunkBytes;
  static constexpr int kTotalsBytes = Deferred && Rows > 8 ? kStreamWarps * 32 * 32 * 4 : 0;
  static constexpr int kScaleSlotBytes = 32 * 8;  // a warp's: 8 bytes a lane
  static constexpr int kScaleRingOffset = kTotalsOffset + kTotalsBytes;
  static constexpr int kScaleRingBytes = RingScales ? kStreamWarps * kDepth * kScaleSlotBytes : 0;
  // 40 KB with 16 tokens and 4-bit weights: an sm_80 SM (164 KB, 1 KB reserved per
  // CTA) holds 4 CTAs.
  static constexpr int kSharedBytes = kScaleRingOffset + kScaleRingBytes;
  // After the main loop (and the totals' last read) the same bytes stage the split-K
  // sums, a row of kStreamCols floats per output row and split, and the ring's first
  // bytes hold the global split-K path's "last CTA" flag.
  static constexpr int kStagingBytes = kSharedBytes;
  static_assert(kRows * kStreamCols * 4 <= kStagingBytes, "a CTA's partial fits");
  static_assert(kMaxGlobalSplit * kStreamCols * 4 <= kStagingBytes,
                "a row of every split's partial sums fits (the global split-K sum)");
};

/// One build of the streaming kernel (activation type, weight bits, tokens per CTA, zero
/// mode, act-order) and what follows from it: how it multiplies, its shared memory and
/// the CTAs per SM it is built for.
template <typename T_, int Bits, int Rows, int ZeroMode, bool ActOrder>
struct StreamConfig {
  using T = T_;
  static constexpr int kBits = Bits;
  static constexpr int kZeroMode = ZeroMode;
  static constexpr bool kActOrder = ActOrder;
  static_assert(!ActOrder || ZeroMode == kBias, "act-order takes the type's zero");
  static_assert(ZeroMode != kFp8 || Bits == 8, "fp8 weights are bytes");
  static_assert(ZeroMode != kFp4 || Bits == 4, "NVFP4 weights are nibbles");
  // fp8 and e2m1 values enter the mma scaled: unscaled, bf16's would be some 2^-120.
  static constexpr bool kDeferred =
      ZeroMode != kFp8 && ZeroMode != kFp4 && kDefersScales<T, Bits, Rows, ActOrder>;
  // NVFP4's scales change every k16 tile: they come through the ring with the tiles.
  static constexpr bool kRingScales = ZeroMode == kFp4;
  static_assert(Rows != 8 || kDeferred, "8-token CTAs are for deferred scales");
  static constexpr int kMBlocks = Rows > 16 ? Rows / 16 : 1;  // 16-row A blocks
  static constexpr int kTokenBlocks = Rows / 8;               // 8-token B blocks (deferred)
  static constexpr int kMinBlocks =
      Rows > 16 ? 2 : (kDeferred ? kDeferredMinBlocks : kStreamMinBlocks);
  using Layout = StreamLayout<Bits, Rows, kDeferred, kRingScales>;
  static constexpr int kDepth = Layout::kDepth;
  using Constants = TileConstants<T, Bits, ActOrder>;
  using Deferred = DeferredScales<T, Bits, ZeroMode, kDeferred ? kTokenBlocks : 1>;
  using DeferredState = std::conditional_t<kDeferred, Deferred, NoDeferredScales>;
};

/// Where a CTA of the streaming kernel works, and this thread's place in it. grid (split,
/// column tiles, row blocks): the CTAs of one column tile are neighbours along x, so a
/// cluster along x holds them.
struct StreamSlice {
  int tid, lane, warp;
  int m0;                // the CTA's first token
  int rows;              // its tokens (at most the build's Rows)
  int slice;             // its K slice: its rank in a split-K cluster
  int column_tile;       // its kStreamCols columns
  int col0;              // the warp's 64 columns
  bool warp_valid;       // whether they exist (uniform per warp)
  int kt_begin, kt_end;  // the slice's k16 tiles
  int tiles;

  __device__ __forceinline__ StreamSlice(const Params& p, int cta_rows)
      : tid(threadIdx.x),
        lane(tid % 32),
        warp(tid / 32),
        m0(blockIdx.z * cta_rows),
        rows(min(cta_rows, p.m - m0)),
        slice(blockIdx.x),
        column_tile(blockIdx.y),
        col0(column_tile * kStreamCols + 64 * warp),
        warp_valid(col0 < p.n),
        kt_begin(slice * p.k_tiles_per_split),
        kt_end(min(kt_begin + p.k_tiles_per_split, p.k / 16)),
        tiles(kt_end - kt_begin) {}
};

/// The weights' producer. Each lane copies its own bytes of each k16 x n64 tile (its mma
/// fragments, marlin_layout.cuh) into its warp's ring of kDepth tiles and reads back
/// only those, so no warp waits for another on weights. One cp.async group per tile
/// (zero-filled past the slice), so "the group of tile r" is always kDepth groups back.
/// NVFP4 tiles bring their group's scales into a ring of their own, each lane the 8
/// bytes of its column block (lanes 4 g .. 4 g + 3 copy the same ones: a lane reads back
/// only its own copies, which then need no barrier).
template <class C>
struct WeightRing {
  static constexpr int kLaneBytes = C::Layout::kTileBytes / 32;  // 16 (4-bit) or 32 (8-bit)
  static constexpr int kSlotStride = 32 * kLaneBytes;            // a slot, all lanes
  int64_t row_bytes;            // a k16 row of b (every column's tile)
  const unsigned char* next;    // the lane's bytes of the next tile to copy: kDepth ahead
  unsigned char* slots;         // the lane's bytes of slot 0
  const unsigned char* scales;  // NVFP4: the scales, from the lane's column block
  unsigned char* scale_slots;   // NVFP4: the lane's bytes of scale slot 0
  int n;

  __device__ __forceinline__ WeightRing(const Params& p, const StreamSlice& s, unsigned char* smem)
      : row_bytes(int64_t{p.n} * 16 * C::kBits / 8),
        next(reinterpret_cast<const unsigned char*>(p.b) +
             int64_t{s.warp_valid ? s.col0 / 64 : 0} * C::Layout::kTileBytes + s.lane * kLaneBytes +
             s.kt_begin * row_bytes),
        slots(smem + (s.warp * C::kDepth * 32 + s.lane) * kLaneBytes),
        scales(static_cast<const unsigned char*>(p.scales) + 2 * (s.col0 + 8 * (s.lane / 4))),
        scale_slots(smem + C::Layout::kScaleRingOffset +
                    s.warp * C::kDepth * C::Layout::kScaleSlotBytes + 8 * s.lane),
        n(p.n) {}

  /// NVFP4: the lane's bytes of the scale slot of slice tile `r`.
  __device__ __forceinline__ unsigned char* scale_slot(int r) const {
    return scale_slots + r % C::kDepth * C::Layout::kScaleSlotBytes;
  }

  /// NVFP4: the lane's 8 scale bytes of slice tile `r` (whose group has landed).
  __device__ __forceinline__ uint2 scale_bytes(int r) const {
    return *reinterpret_cast<const uint2*>(scale_slot(r));
  }

  /// The lane's bytes of ring slot `index`.
  __device__ __forceinline__ unsigned char* lane_slot(int index) const {
    return slots + index * kSlotStride;
  }

  /// Copies slice tile `r`, the next one, into `slot` (zeros past the slice, or when the
  /// warp's columns do not exist) and moves on. `InSlice`: the caller knows r < tiles, so
  /// `next` moves on unconditionally (a warp without columns walks column tile 0's rows of
  /// the slice, copying nothing).
  template <bool InSlice = false>
  __device__ __forceinline__ void load(int r, unsigned char* slot, const StreamSlice& s) {
    const bool valid = s.warp_valid && (InSlice || r < s.tiles);
#pragma unroll
    for (int v = 0; v < kLaneBytes / 16; ++v) {
      cp_async_16_or_zero(slot + 16 * v, next + 16 * v, valid);
    }
    if (InSlice || valid) next += row_bytes;
    if constexpr (C::kRingScales) {
      // Tiles past the slice are never read: their scales need no copy.
      if (valid) cp_async_8(scale_slot(r), scales + nvfp4_scale_offset(s.kt_begin + r, 0, n));
    }
  }

  /// The slice's first kDepth tiles, one group each.
  __device__ __forceinline__ void fill(const StreamSlice& s) {
#pragma unroll
    for (int r = 0; r < C::kDepth; ++r) {
      load(r, lane_slot(r), s);
      cp_async_commit();
    }
  }

  /// The lane's words of the tile in `slot` (whose group has landed).
  __device__ __forceinline__ static LaneWords<C::kBits> words(const unsigned char* slot) {
    return *reinterpret_cast<const LaneWords<C::kBits>*>(slot);
  }
};

/// The activations' producer: chunk `chunk` of the slice (kChunkK k of every row) into
/// its buffer (chunk % 2, after the rings). Its copies join the group of a weight tile
/// that is waited for before the chunk is used. A row of a chunk is 32 pieces of 8 k:
/// warp w copies rows w, w + 4, ..., lane l piece l of each. Deriving row and piece
/// from one flat index per copy cost ~14 instructions a tile with 16 tokens. (A loop
/// fully unrolled over rows / 4 rows ran 2-4% slower at M = 1 on an H200, with the same
/// main loop; this one runs as fast as the flat one there.)
template <class C>
__device__ __forceinline__ void load_activation_chunk(const Params& p, const StreamSlice& s,
                                                      unsigned char* smem, int chunk) {
  static_assert(kChunkK / 8 == 32, "a warp copies one row of a chunk");
  const int k = (s.kt_begin + chunk * kChunkTiles) * 16 + s.lane * 8;
  if (k >= s.kt_end * 16) return;  // past the slice
  unsigned char* dst = smem + C::Layout::kRingBytes + (chunk % 2) * C::Layout::kChunkBytes;
  for (int row = s.warp; row < s.rows; row += kStreamWarps) {
    cp_async_16(dst + 2 * (row * kChunkK + ((s.lane ^ (row % 8)) * 8)),
                static_cast<const typename C::T*>(p.a) + int64_t{s.m0 + row} * p.lda + k);
  }
}

/// The consumer's view of the activation chunks: where the lane's ldmatrix rows lie.
/// The lane's row for tile 4 q + u of a chunk is at byte offset[mb][u] + 128 q: the
/// swizzle only touches the low 3 bits of the 16-byte piece index, which 8 q leaves
/// alone. The four 8 x 8 matrices of ldmatrix_x4 are tokens 0-7 and 8-15 of k 0-7, then
/// of k 8-15 (an A fragment); the two of ldmatrix_x2 / _x4 (deferred scales) tokens 0-7
/// of k 0-7 and 8-15 (a B fragment), then tokens 8-15 of the same.
template <class C>
struct ChunkFragments {
  uint32_t offset[C::kMBlocks][4];
  uint32_t base;  // the shared-memory address of the first chunk

  __device__ __forceinline__ ChunkFragments(const StreamSlice& s, unsigned char* smem) {
#pragma unroll
    for (int mb = 0; mb < C::kMBlocks; ++mb) {
      const int token = C::kDeferred ? s.lane % 8 + 8 * (s.lane / 16) : s.lane % 16;
      const int k_half = C::kDeferred ? s.lane / 8 % 2 : s.lane / 16;
      // Rows past the valid ones read the last valid row (their results are dropped).
      const int row = min(mb * 16 + token, s.rows - 1);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        offset[mb][u] = 2 * (row * kChunkK + (((2 * u + k_half) ^ (row % 8)) * 8));
      }
    }
    base = static_cast<uint32_t>(__cvta_generic_to_shared(smem + C::Layout::kRingBytes));
  }

  /// The shared-memory address of the four tiles of the turn from slice tile `r0`.
  __device__ __forceinline__ uint32_t turn(int r0) const {
    return base + (r0 / kChunkTiles % 2) * C::Layout::kChunkBytes + (r0 % kChunkTiles / 4) * 128;
  }
};

/// The consumer's state: the warp's fp32 sums of its 64 columns (rows mb * 16 + g (+ 8),
/// columns 8 jb + 2 t (+ 1) in acc[mb][jb]), the dequantization constants in force and,
/// with deferred scales, the current group's sums before its scales.
template <class C>
struct StreamConsumer {
  using T = typename C::T;
  float acc[C::kMBlocks][8][4];
  typename C::DeferredState deferred;
  typename C::Constants constants;

  /// Zero sums, and the zero every weight shares (the type's bias, or 0).
  __device__ __forceinline__ void init(const Params& p, const StreamSlice& s, unsigned char* smem) {
#pragma unroll
    for (int mb = 0; mb < C::kMBlocks; ++mb)
#pragma unroll
      for (int jb = 0; jb < 8; ++jb)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mb][jb][i] = 0.f;
    if constexpr (C::kDeferred) {
      using Deferred = typename C::Deferred;
      static_assert(Deferred::kSharedFloatsPerWarp * kStreamWarps * 4 == C::Layout::kTotalsBytes);
      deferred.init(reinterpret_cast<float*>(smem + C::Layout::kTotalsOffset) +
                        s.warp * Deferred::kSharedFloatsPerWarp,
                    s.lane);
    }
    constants.set_fixed_zero(fixed_zero(p));
  }

  /// Tile u of the turn at `a_tiles` times the lane's weight words: deferred scales take
  /// the tokens as B fragments, the others dequantize the weights and take the 16-row
  /// blocks of activations that hold any of the `rows` as A fragments.
  __device__ __forceinline__ void multiply(const ChunkFragments<C>& chunks, uint32_t a_tiles, int u,
                                           const LaneWords<C::kBits>& words, int rows) {
    if constexpr (C::kDeferred) {
      uint32_t b_frag[C::kTokenBlocks][2];
      if constexpr (C::kTokenBlocks == 1) {
        ldmatrix_x2(b_frag[0], a_tiles + chunks.offset[0][u]);
      } else {
        ldmatrix_x4(reinterpret_cast<uint32_t (&)[4]>(b_frag), a_tiles + chunks.offset[0][u]);
      }
      deferred.tile(b_frag, words);
    } else {
      uint32_t a_frag[C::kMBlocks][4];
#pragma unroll
      for (int mb = 0; mb < C::kMBlocks; ++mb) {
        ldmatrix_x4(a_frag[mb], a_tiles + chunks.offset[mb][u]);
      }
      tile_mma<T, C::kBits, C::kMBlocks, C::kActOrder, C::kZeroMode>(acc, a_frag, words, constants,
                                                                     rows);
    }
  }

  /// A group's values take over (deferred scales: the finished group's sums are scaled
  /// into the totals first).
  __device__ __forceinline__ void begin_group(
      const GroupValues<T, C::kBits, C::kZeroMode>& values) {
    if constexpr (C::kDeferred) deferred.close_group(constants);
    values.apply(constants);
  }

  /// Every sum times `factor` (NVFP4: the global scale, marlin_nvfp4.cuh).
  __device__ __forceinline__ void scale_sums(float factor) {
#pragma unroll
    for (int i = 0; i < C::kMBlocks * 8 * 4; ++i) (&acc[0][0][0])[i] *= factor;
  }

  /// After the last tile (deferred scales): the last group scaled, and the totals in
  /// acc's layout.
  __device__ __forceinline__ void finish(bool warp_valid) {
    if constexpr (C::kDeferred) {
      if (warp_valid) deferred.close_group(constants);
      deferred.to_rows(acc);
    }
  }
};

/// When the dequantization constants change along K. Grouped: each group's values are
/// loaded one group ahead and take over at the group's first tile; L2 is asked for them
/// kPrefetchGroups further ahead (ncu, H200, 28672 x 8192, M = 1: without it, 10% of
/// the stall samples waited on the one-group-ahead load). Slices start at a multiple of
/// 4 tiles and groups span a power of two >= 2 of them, so groups change only at the
/// first (or, for 2-tile groups, the third) tile of a turn: checked there alone, the
/// switch costs nothing on the other tiles. Per-channel constants never change;
/// act-order's are each tile's own (act_order_constants, in the main loop).
template <class C>
struct GroupSchedule {
  static constexpr int kPrefetchGroups = 2;
  using Values = GroupValues<typename C::T, C::kBits, C::kZeroMode>;
  int group_tiles;        // k16 tiles per group (groups are >= 32 rows); 0: none
  int next_kt = INT_MAX;  // the next group's first tile (never reached ungrouped)
  int next_index = 0;     // and its index
  Values next;            // and its values

  /// The slice's first constants into `consumer`'s: its first group's (the next
  /// group's values on their way), or the per-channel ones.
  __device__ __forceinline__ void start(StreamConsumer<C>& consumer, const Params& p,
                                        const StreamSlice& s) {
    if constexpr (C::kRingScales) {
      group_tiles = 0;  // each tile's scales come with it
      return;
    }
    const bool grouped = !C::kActOrder && p.group_shift >= 0;
    group_tiles = grouped ? max(1, (1 << p.group_shift) / 16) : 0;
    if (!s.warp_valid) return;
    if (grouped) {
      const int group = s.kt_begin / group_tiles;
      Values first;
      first.load(p, group, s.col0, s.lane);
      first.apply(consumer.constants);
      next_index = min(group + 1, p.groups - 1);
      next.load(p, next_index, s.col0, s.lane);
      next_kt = (group + 1) * group_tiles;
      for (int ahead = 1; ahead <= kPrefetchGroups; ++ahead) {
        Values::prefetch(p, min(next_index + ahead, p.groups - 1), s.col0, s.lane);
      }
    } else if (!C::kActOrder) {
      channel_constants(consumer.constants, p, s.col0, s.lane);
    }
  }

  /// At slice tile `kt`: if a group starts there, its values take over and the next
  /// group's are loaded.
  __device__ __forceinline__ void switch_at(int kt, StreamConsumer<C>& consumer, const Params& p,
                                            const StreamSlice& s) {
    if (kt != next_kt) return;  // never equal unless grouped
    consumer.begin_group(next);
    next_index = min(next_index + 1, p.groups - 1);
    next.load(p, next_index, s.col0, s.lane);
    Values::prefetch(p, min(next_index + kPrefetchGroups, p.groups - 1), s.col0, s.lane);
    next_kt += group_tiles;
  }
};

/// One turn of the main loop: slice tiles r0 .. r0 + 3. Each tile: wait for its copies
/// (and any A chunk sent with them), take its scales (act-order's; NVFP4's from the
/// ring), multiply, and send the copy of the tile kDepth ahead into the slot just read.
/// `Steady`: the turn and the copies it sends lie within the slice, so no tile is tested
/// against the slice's end and, with deferred scales, none against the warp's columns (a
/// warp without columns multiplies the zeros it copied, and its sums are never stored).
/// Only 2-tile groups (32 rows) check for a new group mid-turn.
template <class C, bool TwoTileGroups, bool Steady>
__device__ __forceinline__ void stream_turn(int r0, const Params& p, const StreamSlice& s,
                                            unsigned char* smem, WeightRing<C>& weights,
                                            const ChunkFragments<C>& chunks,
                                            GroupSchedule<C>& groups, StreamConsumer<C>& consumer) {
  const uint32_t a_tiles = chunks.turn(r0);
  unsigned char* ring_turn = weights.lane_slot(r0 % C::kDepth);
  if constexpr (!C::kActOrder && !C::kRingScales) {
    if (s.warp_valid) groups.switch_at(s.kt_begin + r0, consumer, p, s);
  }
#pragma unroll
  for (int u = 0; u < kTurnTiles; ++u) {
    const int r = r0 + u;
    cp_async_wait<C::kDepth - 1>();  // tile r, and any A chunk sent with it, landed
    if (u == 0 && r0 % kChunkTiles == 0) {
      __syncthreads();  // the chunk is visible to all; all are done with the other buffer
      if (r0 + kChunkTiles < s.tiles) load_activation_chunk<C>(p, s, smem, r0 / kChunkTiles + 1);
    }
    unsigned char* slot = ring_turn + u * WeightRing<C>::kSlotStride;
    const int kt = s.kt_begin + r;
    const bool multiply = Steady ? (C::kDeferred || s.warp_valid) : s.warp_valid && r < s.tiles;
    if (multiply) {
      if constexpr (C::kActOrder) {
        act_order_constants(consumer.constants, p, int64_t{kt} * 16 + 2 * (s.lane % 4), s.col0,
                            s.lane);
      } else if constexpr (C::kRingScales) {
        consumer.constants.scale[0] = Nvfp4Scales<typename C::T>::eight(weights.scale_bytes(r));
      } else if constexpr (TwoTileGroups) {
        if (u == 2) groups.switch_at(kt, consumer, p, s);  // a warp without columns: never
      }
      consumer.multiply(chunks, a_tiles, u, WeightRing<C>::words(slot), s.rows);
    }
    // Into the slot just read (its reads have completed).
    weights.template load<Steady>(r + C::kDepth, slot, s);
    cp_async_commit();
  }
}

/// The main loop over the slice's k16 tiles, a turn of four at a time (slots, chunk
/// offsets and loop tests are paid once per four). With deferred scales (the decode
/// builds, up to 16 tokens), steady turns while every copy a turn sends lies within the
/// slice, then the last kDepth / 4 turns (and a partial one) with their tests. With the
/// scales' L2 prefetch (GroupSchedule) this took M = 1 from 45.9 to 41.7 us at 28672 x
/// 8192 and 18.5 to 16.7 at 4096 x 14336 (H200; RESULTS.md, session 21). The other
/// builds, whose timings were not taken with it, test every turn.
template <class C, bool TwoTileGroups>
__device__ __forceinline__ void stream_main_loop(const Params& p, const StreamSlice& s,
                                                 unsigned char* smem, WeightRing<C>& weights,
                                                 const ChunkFragments<C>& chunks,
                                                 GroupSchedule<C>& groups,
                                                 StreamConsumer<C>& consumer) {
  int r0 = 0;
  if constexpr (C::kDeferred) {
    for (; r0 + kTurnTiles + C::kDepth <= s.tiles; r0 += kTurnTiles) {
      stream_turn<C, TwoTileGroups, true>(r0, p, s, smem, weights, chunks, groups, consumer);
    }
  }
  for (; r0 < s.tiles; r0 += kTurnTiles) {
    stream_turn<C, TwoTileGroups, false>(r0, p, s, smem, weights, chunks, groups, consumer);
  }
}

/// Calls visit(row, col, x, y) for each pair of the lane's results in c's rows: rows
/// mb * 16 + g (+ 8) of the CTA's, columns col0 + 8 jb + 2 t (+ 1).
template <int MBlocks, typename Visit>
__device__ __forceinline__ void for_each_result_pair(const float (&acc)[MBlocks][8][4],
                                                     const StreamSlice& s, Visit&& visit) {
#pragma unroll
  for (int mb = 0; mb < MBlocks; ++mb)
#pragma unroll
    for (int jb = 0; jb < 8; ++jb)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = mb * 16 + s.lane / 4 + 8 * half;
        if (row < s.rows) {
          visit(row, s.col0 + 8 * jb + 2 * (s.lane % 4), acc[mb][jb][2 * half],
                acc[mb][jb][2 * half + 1]);
        }
      }
}

/// The epilogue without split-K: the warp's sums, cast to T, straight into c.
template <class C>
__device__ __forceinline__ void store_results(const Params& p, const StreamSlice& s,
                                              const float (&acc)[C::kMBlocks][8][4]) {
  using T = typename C::T;
  if (!s.warp_valid) return;
  T* c = static_cast<T*>(p.c);
  for_each_result_pair(acc, s, [&](int row, int col, float x, float y) {
    *reinterpret_cast<Pair<T>*>(c + (s.m0 + row) * p.ldc + col) = pair_of<T>(x, y);
  });
}

/// The CTA's columns of c as the split-K sums take them: from n0, `quads` float4 of
/// fp32 sums (kStreamCols / 4, fewer at the right edge; N is a multiple of 64).
struct SplitKColumns {
  int n0, quads;

  __device__ __forceinline__ SplitKColumns(const Params& p, const StreamSlice& s)
      : n0(s.column_tile * kStreamCols), quads(min(kStreamCols, p.n - n0) / 4) {}
};

/// Split-K over a cluster (sm_90): each CTA leaves its partial in its own shared
/// memory, then sums a 1/split share of the outputs over all of them, read through
/// distributed shared memory in rank order. No global round trip, no counter.
template <class C>
__device__ __forceinline__ void cluster_split_k_sum(const Params& p, const StreamSlice& s,
                                                    const SplitKColumns& columns,
                                                    const float (&acc)[C::kMBlocks][8][4],
                                                    unsigned char* smem) {
#if __CUDA_ARCH__ >= 900
  using T = typename C::T;
  const int n0 = columns.n0, quads = columns.quads;
  float* staging = reinterpret_cast<float*>(smem);
  cp_async_wait<0>();
  __syncthreads();  // the ring and chunks are free
  if (s.warp_valid) {
    for_each_result_pair(acc, s, [&](int row, int col, float x, float y) {
      *reinterpret_cast<float2*>(staging + row * kStreamCols + col - n0) = float2{x, y};
    });
  }
  cluster_sync();
  // CTA `slice` sums the slice-th of split contiguous shares of the outputs (with one
  // token, 4 float4 per CTA: spread over the cluster, not all in the first CTAs).
  const int outputs = s.rows * quads, share = div_ceil(outputs, p.split);
  const int end = min((s.slice + 1) * share, outputs);
  T* c = static_cast<T*>(p.c);
  for (int i = s.slice * share + s.tid; i < end; i += kStreamThreads) {
    const int row = i / quads, quad = i % quads;
    const float4 sum = cluster_sum(
        reinterpret_cast<const float4*>(staging + row * kStreamCols + 4 * quad), p.split);
    T* out = c + (s.m0 + row) * p.ldc + n0 + 4 * quad;
    *reinterpret_cast<Pair<T>*>(out) = pair_of<T>(sum.x, sum.y);
    *reinterpret_cast<Pair<T>*>(out + 2) = pair_of<T>(sum.z, sum.w);
  }
  cluster_sync();  // no CTA leaves while another reads its shared memory
#else
  __trap();  // the host launches clusters only on sm_90 and newer
#endif
}

/// Split-K through global memory, first step: this CTA's partial (fp32, past L1) into
/// `partials`, counted in on the column tile's counter. Returns whether this CTA came
/// last, and so sums them all.
template <class C>
__device__ __forceinline__ bool publish_partial(const Params& p, const StreamSlice& s,
                                                const float (&acc)[C::kMBlocks][8][4],
                                                unsigned char* smem) {
  if (s.warp_valid) {
    float* partial = p.partials + int64_t{s.slice} * p.m * p.n;
    for_each_result_pair(acc, s, [&](int row, int col, float x, float y) {
      __stcg(reinterpret_cast<float2*>(partial + int64_t{s.m0 + row} * p.n + col), float2{x, y});
    });
  }
  // The barrier orders every thread's stores before thread 0's count, which releases them
  // (and acquires the other CTAs') at GPU scope: split_k.cuh's last_to_arrive. With every
  // thread's ring copies landed (cp_async_wait<0> after the main loop) and read, the
  // ring's first bytes are free for the flag.
  __syncthreads();
  int& is_last = *reinterpret_cast<int*>(smem);  // read by all before staging overwrites it
  if (s.tid == 0) is_last = last_to_arrive(p.counters + s.column_tile, p.split);
  __syncthreads();
  return is_last;
}

/// Split-K through global memory, last CTA of the column tile: sums the partials in
/// split order (the same result whichever CTA finishes last) into c, through shared
/// memory (free now), as many rows at a time as fit: every thread first issues all its
/// copies (one memory round trip in all, not one per split), then each sums its
/// columns over the splits. Leaves the tile's counter zeroed for the next launch.
template <class C>
__device__ __forceinline__ void sum_partials(const Params& p, const StreamSlice& s,
                                             const SplitKColumns& columns, unsigned char* smem) {
  using T = typename C::T;
  const int n0 = columns.n0, quads = columns.quads;
  float4* staged = reinterpret_cast<float4*>(smem);
  T* c = static_cast<T*>(p.c);
  const int pass_rows = max(1, C::Layout::kStagingBytes / (p.split * quads * 16));
  for (int row0 = 0; row0 < s.rows; row0 += pass_rows) {
    const int pass = min(pass_rows, s.rows - row0);
    __syncthreads();  // the previous pass is done with the staging area
    for (int i = s.tid; i < p.split * pass * quads; i += kStreamThreads) {
      const int split = i / (pass * quads), row = (i / quads) % pass, quad = i % quads;
      cp_async_16(staged + i,
                  p.partials + (int64_t{split} * p.m + s.m0 + row0 + row) * p.n + n0 + 4 * quad);
    }
    cp_async_wait_all();
    __syncthreads();
    for (int i = s.tid; i < pass * quads; i += kStreamThreads) {
      float4 sum = staged[i];
      for (int split = 1; split < p.split; ++split) {
        const float4 v = staged[split * pass * quads + i];
        sum = float4{sum.x + v.x, sum.y + v.y, sum.z + v.z, sum.w + v.w};
      }
      T* out = c + (s.m0 + row0 + i / quads) * p.ldc + n0 + 4 * (i % quads);
      *reinterpret_cast<Pair<T>*>(out) = pair_of<T>(sum.x, sum.y);
      *reinterpret_cast<Pair<T>*>(out + 2) = pair_of<T>(sum.z, sum.w);
    }
  }
  if (s.tid == 0) p.counters[s.column_tile] = 0;  // ready for the next launch
}

/// The streaming kernel (see the file comment): the producers start the weight ring
/// and the first activation chunk, the group schedule sets the first constants, the
/// main loop multiplies the slice's tiles, and the sums leave through one of the three
/// epilogues (no split, split-K in a cluster, split-K through global memory).
template <typename T, int Bits, int Rows, int ZeroMode, bool ActOrder>
__global__ void __launch_bounds__(kStreamThreads,
                                  StreamConfig<T, Bits, Rows, ZeroMode, ActOrder>::kMinBlocks)
    marlin_stream_kernel(const Params p) {
  using C = StreamConfig<T, Bits, Rows, ZeroMode, ActOrder>;
  extern __shared__ __align__(16) unsigned char smem[];
  const StreamSlice s(p, Rows);

  // The first copies go out before anything waits on memory (the first group's scales).
  WeightRing<C> weights(p, s, smem);
  load_activation_chunk<C>(p, s, smem, 0);
  weights.fill(s);

  StreamConsumer<C> consumer;
  consumer.init(p, s, smem);
  GroupSchedule<C> groups;
  groups.start(consumer, p, s);
  const ChunkFragments<C> chunks(s, smem);
  if (groups.group_tiles == 2) {
    stream_main_loop<C, true>(p, s, smem, weights, chunks, groups, consumer);
  } else {
    stream_main_loop<C, false>(p, s, smem, weights, chunks, groups, consumer);
  }
  cp_async_wait<0>();  // also before the split-K flag reuses the ring's first bytes
  consumer.finish(s.warp_valid);
  if constexpr (C::kRingScales) {
    consumer.scale_sums(Nvfp4Scales<T>::global_factor(p.global_scale));
  }

  if (p.split == 1) {
    store_results<C>(p, s, consumer.acc);
    return;
  }
  const SplitKColumns columns(p, s);
  if (p.cluster_reduce) {
    cluster_split_k_sum<C>(p, s, columns, consumer.acc, smem);
  } else if (publish_partial<C>(p, s, consumer.acc, smem)) {
    sum_partials<C>(p, s, columns, smem);
  }
}

// grid (N / 64, ceil(K / 64)), 4 warps: warp w dequantizes k16 tile 4 y + w of the
// 64 columns x, through a shared [64 n][64 k] tile so that rows of out leave whole.
template <typename T, int Bits, bool ActOrder>
__global__ void __launch_bounds__(128) marlin_dequantize_kernel(const Params p, T* out) {
  constexpr int kTileWords = 16 * 64 * Bits / 32;
  constexpr int kPitch = 64 + 8;  // padded rows: the lanes' pair stores spread over banks
  __shared__ __align__(16) T tile[64][kPitch];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int col0 = blockIdx.x * 64;
  const int kt = blockIdx.y * 4 + warp;
  if (kt < p.k / 16) {
    const int64_t row_words = static_cast<int64_t>(p.n) * 16 * Bits / 32;
    const LaneWords<Bits> words = *reinterpret_cast<const LaneWords<Bits>*>(
        p.b + kt * row_words + blockIdx.x * kTileWords + lane * (Bits == 4 ? 4 : 8));
    TileConstants<T, Bits, ActOrder> tc;
    tc.set_fixed_zero(fixed_zero(p));
    // fp8 weights come to the 8-bit builds without act-order, NVFP4 to the 4-bit ones.
    constexpr int kFp8Here = Bits == 8 && !ActOrder ? kFp8 : kBias;
    constexpr int kFp4Here = Bits == 4 && !ActOrder ? kFp4 : kBias;
    if constexpr (ActOrder) {
      act_order_constants(tc, p, int64_t{kt} * 16 + 2 * (lane % 4), col0, lane);
    } else if (p.zero_mode == kFp4) {
      tc.scale[0] = Nvfp4Scales<T>::eight(
          *reinterpret_cast<const uint2*>(static_cast<const unsigned char*>(p.scales) +
                                          nvfp4_scale_offset(kt, col0 + 8 * (lane / 4), p.n)));
    } else if (p.group_shift >= 0) {
      const int64_t group = (int64_t{kt} * 16) >> p.group_shift;
      const int zero_col_bits = p.zero_mode == kIntZero ? Bits : 16;
      group_constants(
          tc, static_cast<const T*>(p.scales) + group * p.n + col0,
          static_cast<const unsigned char*>(p.zeros) + (group * p.n + col0) * zero_col_bits / 8,
          p.zero_mode, lane);
    } else {
      channel_constants(tc, p, col0, lane);
    }
    const int k_local = warp * 16 + 2 * (lane % 4);
#pragma unroll
    for (int jb = 0; jb < 8; ++jb) {
      Pair<T> lo, hi;
      if (p.zero_mode == kFloatZero) {
        dequant_block<T, Bits, ActOrder, kFloatZero>(words, jb, tc, lo, hi);
      } else if (p.zero_mode == kFp8) {
        dequant_block<T, Bits, ActOrder, kFp8Here>(words, jb, tc, lo, hi);
      } else if (p.zero_mode == kFp4) {
        dequant_block<T, Bits, ActOrder, kFp4Here>(words, jb, tc, lo, hi);
        // The global scale once per weight, in T: lo and hi are exact products.
        const float factor = Nvfp4Scales<T>::global_factor(p.global_scale);
        lo = __hmul2(lo, pair_of<T>(factor, factor));
        hi = __hmul2(hi, pair_of<T>(factor, factor));
      } else {
        dequant_block<T, Bits, ActOrder, kBias>(words, jb, tc, lo, hi);
      }
      *reinterpret_cast<Pair<T>*>(&tile[8 * jb + lane / 4][k_local]) = lo;
      *reinterpret_cast<Pair<T>*>(&tile[8 * jb + lane / 4][k_local + 8]) = hi;
    }
  }
  __syncthreads();
  for (int i = tid; i < 64 * 8; i += 128) {
    const int row = i / 8, chunk = i % 8;
    const int64_t k = int64_t{blockIdx.y} * 64 + chunk * 8;
    if (k >= p.k) continue;
    *reinterpret_cast<int4*>(out + (col0 + row) * int64_t{p.k} + k) =
        *reinterpret_cast<const int4*>(&tile[row][chunk * 8]);
  }
}

/// out [M, K] = a[:, perm] (act-order: a's columns in Marlin row order), one element
/// per step of a grid-stride loop; a perm value outside [0, K) reads the nearest column.
template <typename T>
__global__ void permute_columns_kernel(const T* a, int64_t lda, const int32_t* perm, T* out,
                                       int64_t m, int64_t k) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < m * k;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t column = min(max(int64_t{__ldg(perm + i % k)}, int64_t{0}), k - 1);
    out[i] = a[(i / k) * lda + column];
  }
}

/// Act-order: `a` permuted into `scratch` (the caller's contiguous [M, K]), which the
/// kernels then read as `a`.
template <typename T>
void permute_a(Params& p, tvm::ffi::Optional<TensorView> scratch, SymbolicDevice& device) {
  RuntimeCheck(scratch.has_value(), "act-order needs a scratch for the permuted a");
  TensorMatcher({p.m, p.k})
      .dtype<T>()
      .device(kDLCUDA, device)
      .contiguous()
      .verify(*scratch, "a_scratch");
  T* out = data_ptr<T>(*scratch);
  constexpr int kThreads = 256;
  const int64_t elements = int64_t{p.m} * p.k;
  KernelLauncher(dim3(grid_stride_blocks(elements, kThreads, device.value())), dim3(kThreads),
                 device.value())(permute_columns_kernel<T>, static_cast<const T*>(p.a), p.lda,
                                 p.perm, out, int64_t{p.m}, int64_t{p.k});
  p.a = out;
  p.lda = p.k;
}

}  // namespace marlin

/// c = a @ dequant(b) with the streaming kernel of `Rows` tokens per CTA (8 only where
/// scales are deferred: kDefersScales); see the file comment. The operands are
/// gptq_marlin_gemm's, checked by check_operands; act-order (`ActOrder`, which takes the
/// type's zero) first permutes a's columns into `a_scratch` (contiguous [M, K]). With
/// split > 1 the K slices of `k_tiles_per_split` k16 tiles are summed in a cluster's
/// shared memory (`cluster_reduce`, sm_90 and newer) or through `partials` fp32 [split,
/// M, N] and the workspace's counters (one row block). `ZeroMode` is the build's zero mode
/// (kBias, kIntZero, kFloatZero, kFp8 for fp8 e4m3 weights, or kFp4 for NVFP4, which
/// alone takes `global_scale`).
template <typename T, int Bits, int Rows, int ZeroMode, bool ActOrder>
void gptq_marlin_gemm_stream(TensorView a, TensorView b_q_weight, TensorView b_scales,
                             tvm::ffi::Optional<TensorView> b_zeros,
                             tvm::ffi::Optional<TensorView> global_scale,
                             tvm::ffi::Optional<TensorView> g_idx,
                             tvm::ffi::Optional<TensorView> perm, TensorView workspace,
                             TensorView c, int64_t size_m, int64_t size_n, int64_t size_k,
                             bool is_k_full, int64_t bias, tvm::ffi::Optional<TensorView> a_scratch,
                             tvm::ffi::Optional<TensorView> partials, int64_t split,
                             int64_t k_tiles_per_split, bool cluster_reduce) {
  using namespace marlin;
  SymbolicDevice device;
  Params p = check_operands(device, a, c, b_q_weight, b_scales, global_scale, b_zeros, g_idx, perm,
                            workspace, dtype_trait<T>::value, Bits, ZeroMode, ActOrder, size_m,
                            size_n, size_k, is_k_full, bias);
  p.split = static_cast<int>(split);
  p.k_tiles_per_split = static_cast<int>(k_tiles_per_split);
  using Layout = typename StreamConfig<T, Bits, Rows, ZeroMode, ActOrder>::Layout;
  const int64_t column_tiles = div_ceil<int64_t>(size_n, kStreamCols);
  RuntimeCheck(k_tiles_per_split > 0 && k_tiles_per_split % kTurnTiles == 0 && split >= 1 &&
                   split * k_tiles_per_split >= size_k / 16,
               "bad split plan: split ", split, " x ", k_tiles_per_split, " k16 tiles");
  if (split > 1) {
    p.cluster_reduce = cluster_reduce;
    if (cluster_reduce) {
      RuntimeCheck(split <= kMaxClusterSize, "split ", split, " is more than a cluster holds (",
                   kMaxClusterSize, ")");
    } else {
      RuntimeCheck(size_m <= Rows, "split-K through global memory: one row block");
      RuntimeCheck(split <= kMaxGlobalSplit, "split ", split,
                   " is more than the final sum stages in shared memory (", kMaxGlobalSplit, ")");
      RuntimeCheck(workspace.size(0) >= column_tiles, "split-K through global memory needs ",
                   column_tiles, " counters, the workspace has ", workspace.size(0));
      RuntimeCheck(partials.has_value(), "split-K through global memory needs partials");
      TensorMatcher({split, size_m, size_n})
          .dtype<fp32_t>()
          .device(kDLCUDA, device)
          .contiguous()
          .verify(*partials, "partials");
      p.partials = data_ptr<float>(*partials);
    }
  }
  if (size_m == 0) return;
  if constexpr (ActOrder) permute_a<T>(p, a_scratch, device);
  const dim3 grid(static_cast<unsigned>(split), static_cast<unsigned>(column_tiles),
                  static_cast<unsigned>(div_ceil<int64_t>(size_m, Layout::kRows)));
  KernelLauncher(grid, dim3(kStreamThreads), device.value(), Layout::kSharedBytes)
      .cluster(p.cluster_reduce ? static_cast<unsigned>(split) : 1u)(
          marlin_stream_kernel<T, Bits, Rows, ZeroMode, ActOrder>, p);
}

/// gptq_marlin_gemm's dequantize + GEMM path up to the GEMM: `weight` [N, K] =
/// dequant(b)^T (the nn.Linear layout) and, under act-order, a's columns permuted into
/// `a_scratch`. The operands, the GEMM's `a` and `c` too, are checked by check_operands;
/// `zero_mode` is a runtime argument (the builds differ by dtype, bits and act-order).
template <typename T, int Bits, bool ActOrder>
void marlin_dequantize(TensorView a, TensorView b_q_weight, TensorView b_scales,
                       tvm::ffi::Optional<TensorView> b_zeros,
                       tvm::ffi::Optional<TensorView> global_scale,
                       tvm::ffi::Optional<TensorView> g_idx, tvm::ffi::Optional<TensorView> perm,
                       TensorView workspace, TensorView c, int64_t size_m, int64_t size_n,
                       int64_t size_k, bool is_k_full, int64_t zero_mode, int64_t bias,
                       tvm::ffi::Optional<TensorView> a_scratch, TensorView weight) {
  using namespace marlin;
  SymbolicDevice device;
  Params p = check_operands(device, a, c, b_q_weight, b_scales, global_scale, b_zeros, g_idx, perm,
                            workspace, dtype_trait<T>::value, Bits, static_cast<int>(zero_mode),
                            ActOrder, size_m, size_n, size_k, is_k_full, bias);
  TensorMatcher({size_n, size_k})
      .dtype<T>()
      .device(kDLCUDA, device)
      .contiguous()
      .verify(weight, "weight");
  if constexpr (ActOrder) {
    if (size_m > 0) permute_a<T>(p, a_scratch, device);
  }
  const dim3 grid(static_cast<unsigned>(size_n / 64),
                  static_cast<unsigned>(div_ceil<int64_t>(size_k, 64)));
  KernelLauncher(grid, dim3(128), device.value())(marlin_dequantize_kernel<T, Bits, ActOrder>, p,
                                                  data_ptr<T>(weight));
}

}  // namespace mllm_kernel::cuda
