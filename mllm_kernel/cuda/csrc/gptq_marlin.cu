// W4A16 / W8A16 GEMM on weights in the Marlin layout (see marlin_repack.cu):
//   c[M, N] = a[M, K] @ dequant(b)[K, N],  dequant(q) = (q - zero) * scale,
// with zero the type's bias (uint4b8: 8, uint8b128: 128), an int zero point per
// group and column (uint4/uint8 + b_zeros) or a float one (is_zp_float).
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
//   - 8 or 16 tokens (no act-order, not 8-bit weights in bf16): the weights are the A
//     operand, entering as magic + step q straight from their bits, the tokens one or
//     two B operands, and each group's scale and zero apply once to its fp32 sums
//     (DeferredScales);
//   - otherwise the weights are dequantized in registers (the magic-number trick,
//     dequant.cuh), scaled, and are the B operand of 16-row blocks of activations.
// Scales and zero points are loaded one group ahead, and the zero mode and act-order
// are template parameters.
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
#include "mllm_kernel/cuda/mma_sync.cuh"
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
/// in `lo`, 2t + {8, 9} in `hi` (the two B registers of an m16n8k16 mma).
template <typename T, int Bits, bool ActOrder, bool FloatZero>
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
  lo = Deq::pair(word, first, tc.offset[jb]);
  hi = Deq::pair(word, first + 1, tc.offset[jb]);
  if constexpr (FloatZero) {
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
template <typename T, int Bits, int MBlocks, bool ActOrder, bool FloatZero>
__device__ __forceinline__ void tile_mma(float (&acc)[MBlocks][8][4],
                                         const uint32_t (&a_frag)[MBlocks][4],
                                         const LaneWords<Bits>& words,
                                         const TileConstants<T, Bits, ActOrder>& tc, int rows) {
#pragma unroll
  for (int jb = 0; jb < 8; ++jb) {
    Pair<T> lo, hi;
    dequant_block<T, Bits, ActOrder, FloatZero>(words, jb, tc, lo, hi);
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
/// warp's group totals.
template <int Bits, int Rows, bool Deferred>
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
  // 40 KB with 16 tokens and 4-bit weights: an sm_80 SM (164 KB, 1 KB reserved per
  // CTA) holds 4 CTAs.
  static constexpr int kSharedBytes = kTotalsOffset + kTotalsBytes;
  // After the main loop (and the totals' last read) the same bytes stage the split-K
  // sums, a row of kStreamCols floats per output row and split, and the ring's first
  // bytes hold the global split-K path's "last CTA" flag.
  static constexpr int kStagingBytes = kSharedBytes;
  static_assert(kRows * kStreamCols * 4 <= kStagingBytes, "a CTA's partial fits");
  static_assert(kMaxGlobalSplit * kStreamCols * 4 <= kStagingBytes,
                "a row of every split's partial sums fits (the global split-K sum)");
};

template <typename T, int Bits, int Rows, int ZeroMode, bool ActOrder>
__global__ void __launch_bounds__(kStreamThreads, Rows > 16 ? 2
                                                  : kDefersScales<T, Bits, Rows, ActOrder>
                                                      ? kDeferredMinBlocks
                                                      : kStreamMinBlocks)
    marlin_stream_kernel(const Params p) {
  static_assert(!ActOrder || ZeroMode == kBias, "act-order takes the type's zero");
  constexpr bool kDeferred = kDefersScales<T, Bits, Rows, ActOrder>;
  static_assert(Rows != 8 || kDeferred, "8-token CTAs are for deferred scales");
  constexpr int MBlocks = Rows > 16 ? Rows / 16 : 1;  // 16-row A blocks
  constexpr int kTokenBlocks = Rows / 8;              // 8-token B blocks (deferred scales)
  using Layout = StreamLayout<Bits, Rows, kDeferred>;
  constexpr int kRows = Layout::kRows;
  constexpr int kDepth = Layout::kDepth;
  constexpr int kLaneBytes = Layout::kTileBytes / 32;  // 16 (4-bit) or 32 (8-bit)
  extern __shared__ __align__(16) unsigned char smem[];

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int m0 = blockIdx.z * kRows;
  const int rows = min(kRows, p.m - m0);
  // grid (split, column tiles, row blocks): the CTAs of one column tile are neighbours
  // along x, so a cluster along x holds them.
  const int slice = blockIdx.x, column_tile = blockIdx.y;
  const int col0 = column_tile * kStreamCols + 64 * warp;
  const bool warp_valid = col0 < p.n;  // uniform per warp
  const int kt_begin = slice * p.k_tiles_per_split;
  const int kt_end = min(kt_begin + p.k_tiles_per_split, p.k / 16);
  const int tiles = kt_end - kt_begin;

  // Weights: each lane copies its own bytes of each tile into its warp's ring and reads
  // back only those, so no warp waits for another on weights. One cp.async group per
  // tile (zero-filled past the slice), so "the group of tile r" is always kDepth groups
  // back. `b_next` walks the slice's tile rows kDepth ahead of the tile being used.
  const int64_t row_bytes = int64_t{p.n} * 16 * Bits / 8;
  const unsigned char* b_next = reinterpret_cast<const unsigned char*>(p.b) +
                                int64_t{warp_valid ? col0 / 64 : 0} * Layout::kTileBytes +
                                lane * kLaneBytes + kt_begin * row_bytes;
  unsigned char* ring = smem + (warp * kDepth * 32 + lane) * kLaneBytes;  // slot s: + s * 32 lanes
  // Tile kt_begin + r into `slot` (ring slot r % kDepth); b_next moves on.
  auto load_tile = [&](int r, unsigned char* slot) {
    const bool valid = warp_valid && r < tiles;
#pragma unroll
    for (int v = 0; v < kLaneBytes / 16; ++v) {
      cp_async_16_or_zero(slot + 16 * v, b_next + 16 * v, valid);
    }
    if (valid) b_next += row_bytes;
  };

  // Activations: chunks of 256 k for all rows, double-buffered; their copies join the
  // group of a weight tile that is waited for before the chunk is used. A row of a chunk
  // is 32 pieces of 8 k: warp w copies rows w, w + 4, ..., lane l piece l of each.
  // Deriving row and piece from one flat index per copy cost ~14 instructions a tile
  // with 16 tokens. (A loop fully unrolled over kRows / 4 rows ran 2-4% slower at M = 1
  // on an H200, with the same main loop; this one runs as fast as the flat one there.)
  static_assert(kChunkK / 8 == 32, "a warp copies one row of a chunk");
  auto load_chunk = [&](int chunk) {
    const int k = (kt_begin + chunk * kChunkTiles) * 16 + lane * 8;
    if (k >= kt_end * 16) return;  // past the slice
    unsigned char* dst = smem + Layout::kRingBytes + (chunk % 2) * Layout::kChunkBytes;
    for (int row = warp; row < rows; row += kStreamWarps) {
      cp_async_16(dst + 2 * (row * kChunkK + ((lane ^ (row % 8)) * 8)),
                  static_cast<const T*>(p.a) + int64_t{m0 + row} * p.lda + k);
    }
  };

  // The first copies go out before anything waits on memory (the first group's scales).
  load_chunk(0);
#pragma unroll
  for (int r = 0; r < kDepth; ++r) {
    load_tile(r, ring + r * 32 * kLaneBytes);
    cp_async_commit();
  }

  float acc[MBlocks][8][4];
#pragma unroll
  for (int mb = 0; mb < MBlocks; ++mb)
#pragma unroll
    for (int jb = 0; jb < 8; ++jb)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mb][jb][i] = 0.f;
  using Deferred = DeferredScales<T, Bits, ZeroMode, kDeferred ? kTokenBlocks : 1>;
  std::conditional_t<kDeferred, Deferred, NoDeferredScales> deferred;
  if constexpr (kDeferred) {
    static_assert(Deferred::kSharedFloatsPerWarp * kStreamWarps * 4 == Layout::kTotalsBytes);
    deferred.init(reinterpret_cast<float*>(smem + Layout::kTotalsOffset) +
                      warp * Deferred::kSharedFloatsPerWarp,
                  lane);
  }

  TileConstants<T, Bits, ActOrder> constants;
  constants.set_fixed_zero(fixed_zero(p));
  const bool grouped = !ActOrder && p.group_shift >= 0;
  // k16 tiles per group (groups are >= 32 rows), the first tile of the next group, and
  // that group's values, loaded one group ahead.
  const int group_tiles = grouped ? max(1, (1 << p.group_shift) / 16) : 0;
  int next_group_kt = INT_MAX, next_group_index = 0;
  GroupValues<T, Bits, ZeroMode> next_group;
  if (warp_valid) {
    if (grouped) {
      const int group = kt_begin / group_tiles;
      GroupValues<T, Bits, ZeroMode> first;
      first.load(p, group, col0, lane);
      first.apply(constants);
      next_group_index = min(group + 1, p.groups - 1);
      next_group.load(p, next_group_index, col0, lane);
      next_group_kt = (group + 1) * group_tiles;
    } else if (!ActOrder) {
      channel_constants(constants, p, col0, lane);  // they do not change along K
    }
  }

  // Per lane, the byte offset of its ldmatrix row for tile 4 q + u of a chunk is
  // a_offset[mb][u] + 128 q: the swizzle only touches the low 3 bits of the 16-byte
  // piece index, which 8 q leaves alone. The four 8 x 8 matrices of ldmatrix_x4 are
  // tokens 0-7 and 8-15 of k 0-7, then of k 8-15 (an A fragment); the two of
  // ldmatrix_x2 / _x4 (deferred scales) tokens 0-7 of k 0-7 and 8-15 (a B fragment),
  // then tokens 8-15 of the same.
  uint32_t a_offset[MBlocks][4];
#pragma unroll
  for (int mb = 0; mb < MBlocks; ++mb) {
    const int token = kDeferred ? lane % 8 + 8 * (lane / 16) : lane % 16;
    const int k_half = kDeferred ? lane / 8 % 2 : lane / 16;
    // Rows past the valid ones read the last valid row (their results are dropped).
    const int row = min(mb * 16 + token, rows - 1);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      a_offset[mb][u] = 2 * (row * kChunkK + (((2 * u + k_half) ^ (row % 8)) * 8));
    }
  }
  const uint32_t a_shared =
      static_cast<uint32_t>(__cvta_generic_to_shared(smem + Layout::kRingBytes));

  // The next group's values take over at its first tile. Slices start at a multiple of
  // 4 tiles and groups span a power of two >= 2 of them, so groups change only at the
  // first (or, for 2-tile groups, the third) tile of a turn: checked there alone, the
  // switch costs nothing on the other tiles.
  auto switch_group = [&](int kt) {
    if (kt != next_group_kt) return;  // never equal unless grouped
    if constexpr (kDeferred) deferred.close_group(constants);
    next_group.apply(constants);
    next_group_index = min(next_group_index + 1, p.groups - 1);
    next_group.load(p, next_group_index, col0, lane);
    next_group_kt += group_tiles;
  };

  // Four tiles per turn: slots, chunk offsets and loop tests are paid once per four.
  // Built twice: only 2-tile groups (32 rows) check for a new group mid-turn.
  auto main_loop = [&](auto two_tile_groups) {
    for (int r0 = 0; r0 < tiles; r0 += 4) {
      const uint32_t a_tiles =
          a_shared + (r0 / kChunkTiles % 2) * Layout::kChunkBytes + (r0 % kChunkTiles / 4) * 128;
      unsigned char* ring_turn = ring + (r0 % kDepth) * 32 * kLaneBytes;
      if (warp_valid && !ActOrder) switch_group(kt_begin + r0);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int r = r0 + u;
        cp_async_wait<kDepth - 1>();  // tile r, and any A chunk sent with it, landed
        if (u == 0 && r0 % kChunkTiles == 0) {
          __syncthreads();  // the chunk is visible to all; all are done with the other buffer
          if (r0 + kChunkTiles < tiles) load_chunk(r0 / kChunkTiles + 1);
        }
        unsigned char* slot = ring_turn + u * 32 * kLaneBytes;
        const int kt = kt_begin + r;
        if (warp_valid && r < tiles) {
          if constexpr (ActOrder) {
            act_order_constants(constants, p, int64_t{kt} * 16 + 2 * (lane % 4), col0, lane);
          } else if constexpr (decltype(two_tile_groups)::value) {
            if (u == 2) switch_group(kt);
          }
          const LaneWords<Bits> words = *reinterpret_cast<const LaneWords<Bits>*>(slot);
          if constexpr (kDeferred) {
            uint32_t b_frag[kTokenBlocks][2];
            if constexpr (kTokenBlocks == 1) {
              ldmatrix_x2(b_frag[0], a_tiles + a_offset[0][u]);
            } else {
              ldmatrix_x4(reinterpret_cast<uint32_t (&)[4]>(b_frag), a_tiles + a_offset[0][u]);
            }
            deferred.tile(b_frag, words);
          } else {
            uint32_t a_frag[MBlocks][4];
#pragma unroll
            for (int mb = 0; mb < MBlocks; ++mb) ldmatrix_x4(a_frag[mb], a_tiles + a_offset[mb][u]);
            tile_mma<T, Bits, MBlocks, ActOrder, ZeroMode == kFloatZero>(acc, a_frag, words,
                                                                         constants, rows);
          }
        }
        load_tile(r + kDepth, slot);  // into the slot just read (its reads have completed)
        cp_async_commit();
      }
    }
  };
  if (group_tiles == 2) {
    main_loop(std::true_type{});
  } else {
    main_loop(std::false_type{});
  }
  cp_async_wait<0>();  // also before the split-K flag reuses the ring's first bytes
  if constexpr (kDeferred) {
    if (warp_valid) deferred.close_group(constants);
    deferred.to_rows(acc);
  }

  // Lane's results: rows mb * 16 + g (+ 8), columns col0 + 8 jb + 2 t (+ 1).
  auto for_each_pair = [&](auto&& visit) {
#pragma unroll
    for (int mb = 0; mb < MBlocks; ++mb)
#pragma unroll
      for (int jb = 0; jb < 8; ++jb)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = mb * 16 + lane / 4 + 8 * half;
          if (row < rows) {
            visit(row, col0 + 8 * jb + 2 * (lane % 4), acc[mb][jb][2 * half],
                  acc[mb][jb][2 * half + 1]);
          }
        }
  };
  T* c = static_cast<T*>(p.c);
  if (p.split == 1) {
    if (warp_valid) {
      for_each_pair([&](int row, int col, float x, float y) {
        *reinterpret_cast<Pair<T>*>(c + (m0 + row) * p.ldc + col) = pair_of<T>(x, y);
      });
    }
    return;
  }
  const int n0 = column_tile * kStreamCols;
  const int quads = min(kStreamCols, p.n - n0) / 4;  // n is a multiple of 64
  float* staging = reinterpret_cast<float*>(smem);
  if (p.cluster_reduce) {
    // Split K over a cluster (sm_90): each CTA leaves its partial in its own shared
    // memory, then sums a 1/split share of the outputs over all of them, read through
    // distributed shared memory in rank order. No global round trip, no counter.
#if __CUDA_ARCH__ >= 900
    cp_async_wait<0>();
    __syncthreads();  // the ring and chunks are free
    if (warp_valid) {
      for_each_pair([&](int row, int col, float x, float y) {
        *reinterpret_cast<float2*>(staging + row * kStreamCols + col - n0) = float2{x, y};
      });
    }
    cluster_sync();
    // CTA `slice` sums the slice-th of split contiguous shares of the outputs (with one
    // token, 4 float4 per CTA: spread over the cluster, not all in the first CTAs).
    const int outputs = rows * quads, share = div_ceil(outputs, p.split);
    const int end = min((slice + 1) * share, outputs);
    for (int i = slice * share + tid; i < end; i += kStreamThreads) {
      const int row = i / quads, quad = i % quads;
      const float4 sum = cluster_sum(
          reinterpret_cast<const float4*>(staging + row * kStreamCols + 4 * quad), p.split);
      T* out = c + (m0 + row) * p.ldc + n0 + 4 * quad;
      *reinterpret_cast<Pair<T>*>(out) = pair_of<T>(sum.x, sum.y);
      *reinterpret_cast<Pair<T>*>(out + 2) = pair_of<T>(sum.z, sum.w);
    }
    cluster_sync();  // no CTA leaves while another reads its shared memory
#else
    __trap();  // the host launches clusters only on sm_90 and newer
#endif
    return;
  }
  // Split K through global memory: publish this CTA's partial, then the last CTA of the
  // column tile sums all of them in split order (the same result whichever CTA
  // finishes last).
  if (warp_valid) {
    float* partial = p.partials + int64_t{slice} * p.m * p.n;
    for_each_pair([&](int row, int col, float x, float y) {
      __stcg(reinterpret_cast<float2*>(partial + int64_t{m0 + row} * p.n + col), float2{x, y});
    });
  }
  __threadfence();
  // With every thread's ring copies landed (cp_async_wait<0> after the main loop) and
  // read, the ring's first bytes are free for the flag.
  __syncthreads();
  int& is_last = *reinterpret_cast<int*>(smem);  // read by all before staging overwrites it
  if (tid == 0) is_last = atomicAdd(p.counters + column_tile, 1) == p.split - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  // Sum the partials through shared memory (free now), as many rows at a time as fit:
  // every thread first issues all its copies (one memory round trip in all, not one
  // per split), then each sums its columns over the splits in split order.
  float4* staged = reinterpret_cast<float4*>(staging);
  const int pass_rows = max(1, Layout::kStagingBytes / (p.split * quads * 16));
  for (int row0 = 0; row0 < rows; row0 += pass_rows) {
    const int pass = min(pass_rows, rows - row0);
    __syncthreads();  // the previous pass is done with the staging area
    for (int i = tid; i < p.split * pass * quads; i += kStreamThreads) {
      const int split = i / (pass * quads), row = (i / quads) % pass, quad = i % quads;
      cp_async_16(staged + i,
                  p.partials + (int64_t{split} * p.m + m0 + row0 + row) * p.n + n0 + 4 * quad);
    }
    cp_async_wait_all();
    __syncthreads();
    for (int i = tid; i < pass * quads; i += kStreamThreads) {
      float4 sum = staged[i];
      for (int split = 1; split < p.split; ++split) {
        const float4 v = staged[split * pass * quads + i];
        sum = float4{sum.x + v.x, sum.y + v.y, sum.z + v.z, sum.w + v.w};
      }
      T* out = c + (m0 + row0 + i / quads) * p.ldc + n0 + 4 * (i % quads);
      *reinterpret_cast<Pair<T>*>(out) = pair_of<T>(sum.x, sum.y);
      *reinterpret_cast<Pair<T>*>(out + 2) = pair_of<T>(sum.z, sum.w);
    }
  }
  if (tid == 0) p.counters[column_tile] = 0;  // ready for the next launch
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
    if constexpr (ActOrder) {
      act_order_constants(tc, p, int64_t{kt} * 16 + 2 * (lane % 4), col0, lane);
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
        dequant_block<T, Bits, ActOrder, true>(words, jb, tc, lo, hi);
      } else {
        dequant_block<T, Bits, ActOrder, false>(words, jb, tc, lo, hi);
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
/// (kBias, kIntZero, kFloatZero).
template <typename T, int Bits, int Rows, int ZeroMode, bool ActOrder>
void gptq_marlin_gemm_stream(TensorView a, TensorView b_q_weight, TensorView b_scales,
                             tvm::ffi::Optional<TensorView> b_zeros,
                             tvm::ffi::Optional<TensorView> g_idx,
                             tvm::ffi::Optional<TensorView> perm, TensorView workspace,
                             TensorView c, int64_t size_m, int64_t size_n, int64_t size_k,
                             bool is_k_full, int64_t bias, tvm::ffi::Optional<TensorView> a_scratch,
                             tvm::ffi::Optional<TensorView> partials, int64_t split,
                             int64_t k_tiles_per_split, bool cluster_reduce) {
  using namespace marlin;
  SymbolicDevice device;
  Params p = check_operands(device, a, c, b_q_weight, b_scales, b_zeros, g_idx, perm, workspace,
                            dtype_trait<T>::value, Bits, ZeroMode, ActOrder, size_m, size_n, size_k,
                            is_k_full, bias);
  p.split = static_cast<int>(split);
  p.k_tiles_per_split = static_cast<int>(k_tiles_per_split);
  using Layout = StreamLayout<Bits, Rows, kDefersScales<T, Bits, Rows, ActOrder>>;
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
                       tvm::ffi::Optional<TensorView> b_zeros, tvm::ffi::Optional<TensorView> g_idx,
                       tvm::ffi::Optional<TensorView> perm, TensorView workspace, TensorView c,
                       int64_t size_m, int64_t size_n, int64_t size_k, bool is_k_full,
                       int64_t zero_mode, int64_t bias, tvm::ffi::Optional<TensorView> a_scratch,
                       TensorView weight) {
  using namespace marlin;
  SymbolicDevice device;
  Params p = check_operands(device, a, c, b_q_weight, b_scales, b_zeros, g_idx, perm, workspace,
                            dtype_trait<T>::value, Bits, static_cast<int>(zero_mode), ActOrder,
                            size_m, size_n, size_k, is_k_full, bias);
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
