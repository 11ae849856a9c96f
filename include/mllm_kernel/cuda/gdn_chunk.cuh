// The gated delta net over chunks of tokens (gdn_extend): the pieces of the chunked
// (WY / UT) form that a chunk kernel is made of, on tensor cores where they are products.
//
// For one sequence, value head and chunk of C tokens (i, j = 0 .. C-1), with S0 the V x K
// state entering the chunk, k^_i = rk_i k_i and q^_i = rq_i q_i the normalised (and, for
// q, scaled) rows, G_i = g_0 + ... + g_i the chunk's cumulated log decay:
//
//   d_j = beta_j (v_j - e^{g_j} S_{j-1} k^_j)            (what token j adds, along k^_j)
//       = beta_j (v_j - e^{G_j} S0 k^_j) - sum_{i<j} beta_j e^{G_j - G_i} (k^_j . k^_i) d_i
//
// so (I + A) d = R with A_ji = beta_j e^{G_j - G_i} (k^_j . k^_i) for i < j (strictly
// lower) and R_j = beta_j (v_j - e^{G_j} S0 k^_j): one triangular solve per chunk. Then
//
//   o_i = e^{G_i} S0 q^_i + sum_{j<=i} e^{G_i - G_j} (q^_i . k^_j) d_j
//   S   = e^{G_C-1} S0 + sum_j e^{G_C-1 - G_j} d_j k^_j^T
//
// Every exponent is <= 0 (no division by a decay, which underflows), and the rules below
// keep the result within fp32 rounding of the token-by-token recurrence:
// * The products whose operands are inputs (K K^T, Q K^T, K S0^T, Q S0^T) take the raw
//   rows, exact in bf16; the norms and gates scale their fp32 results.
// * A computed operand (S0, the scores, d) goes to the tensor cores as two bf16 values,
//   hi = bf16(x) and lo = bf16(x - hi): hi * y + lo * y is within 2^-17 of x * y. fp16
//   inputs split the same way, exactly (11 bits = 8 + 3).
// * The triangular solve runs in fp32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "mllm_kernel/cuda/mma_sync.cuh"
#include "mllm_kernel/utils.cuh"

namespace mllm_kernel::cuda::gdn {

/// Tokens per chunk: the tensor-core products are 64-token tiles.
inline constexpr int kChunk = 64;

// ---------------------------------------------------------------------------
// bf16 hi / lo pairs: a computed fp32 operand on the tensor cores.
// ---------------------------------------------------------------------------

/// Two fp32 values as a packed bf16 pair `hi` (x0 in the low half) and the pair `lo` of
/// what hi leaves: hi + lo is within 2^-17 of each value.
__device__ __forceinline__ void split_pair(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - __low2float(h), x1 - __high2float(h));
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

/// One fp32 value as bf16 hi and lo (split_pair's halves).
__device__ __forceinline__ void split_one(float x, bf16_t& hi, bf16_t& lo) {
  hi = __float2bfloat16_rn(x);
  lo = __float2bfloat16_rn(x - __bfloat162float(hi));
}

/// A pair of raw 16-bit inputs (`bits`: element 0 in the low half) of type T as a bf16
/// operand: bf16 bits as they are (`lo` zero); fp16 split into hi + lo, exactly.
template <typename T>
__device__ __forceinline__ void input_pair(uint32_t bits, float& x0, float& x1, uint32_t& hi,
                                           uint32_t& lo) {
  if constexpr (std::is_same_v<T, bf16_t>) {
    x0 = __uint_as_float(bits << 16);
    x1 = __uint_as_float(bits & 0xffff0000u);
    hi = bits;
    lo = 0;
  } else {
    x0 = __half2float(__ushort_as_half(static_cast<uint16_t>(bits & 0xffffu)));
    x1 = __half2float(__ushort_as_half(static_cast<uint16_t>(bits >> 16)));
    split_pair(x0, x1, hi, lo);
  }
}

// ---------------------------------------------------------------------------
// Shared-memory tiles of 16-bit values and the mma.sync fragments read from them.
// ---------------------------------------------------------------------------

/// A row-major kRows x kCols tile of 16-bit values in shared memory, each row padded by
/// 16 bytes. The row stride is an odd multiple of 16 bytes, so the 8 rows ldmatrix reads
/// at once, and the 8 rows of a fragment's 32-bit stores, fall in distinct banks.
template <int kRows, int kCols>
struct Tile {
  static constexpr int kStride = kCols + 8;  // elements
  static constexpr int kBytes = kRows * kStride * 2;
  static_assert(kCols % 8 == 0 && (kStride * 2 / 16) % 2 == 1, "an odd number of 16-byte units");

  uint16_t* data;

  __device__ __forceinline__ uint16_t* at(int row, int col) const {
    return data + row * kStride + col;
  }
  __device__ __forceinline__ uint32_t address(int row, int col) const {
    return static_cast<uint32_t>(__cvta_generic_to_shared(at(row, col)));
  }
  /// Stores a packed pair at (row, col), (row, col + 1); col even.
  __device__ __forceinline__ void store_pair(int row, int col, uint32_t pair) const {
    *reinterpret_cast<uint32_t*>(at(row, col)) = pair;
  }
};

/// The calling lane's index in its warp.
__device__ __forceinline__ int lane_id() {
  return static_cast<int>(threadIdx.x) % kWarpSize;
}

/// The A fragment (16 x 16, mma_sync.cuh's layout) at rows row0.., columns col0.. of a
/// tile holding A row-major.
template <class Tl>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const Tl& tile, int row0, int col0) {
  const int lane = lane_id();
  ldmatrix_x4(a, tile.address(row0 + lane % 16, col0 + 8 * (lane / 16)));
}

/// The A fragment at rows row0.., columns col0.. of A, from a tile holding A transposed
/// (a tile row is a column of A).
template <class Tl>
__device__ __forceinline__ void load_a_trans(uint32_t (&a)[4], const Tl& tile, int row0, int col0) {
  const int lane = lane_id();
  ldmatrix_x4_trans(a, tile.address(col0 + lane % 8 + 8 * (lane / 16), row0 + 8 * (lane / 8 % 2)));
}

/// The B fragments of two 8-column tiles (columns n0.. and n0 + 8..) over k0 .. k0 + 15,
/// from a tile holding B transposed (a tile row is a column of B: mma's "col" layout):
/// b[0], b[1] for the first, b[2], b[3] for the second.
template <class Tl>
__device__ __forceinline__ void load_b(uint32_t (&b)[4], const Tl& tile, int n0, int k0) {
  const int lane = lane_id();
  ldmatrix_x4(b, tile.address(n0 + lane % 8 + 8 * (lane / 16), k0 + 8 * (lane / 8 % 2)));
}

/// load_b's fragments from a tile holding B row-major (a tile row is a row of B).
template <class Tl>
__device__ __forceinline__ void load_b_trans(uint32_t (&b)[4], const Tl& tile, int k0, int n0) {
  const int lane = lane_id();
  ldmatrix_x4_trans(b, tile.address(k0 + lane % 8 + 8 * (lane / 8 % 2), n0 + 8 * (lane / 16)));
}

/// c += a * b of bf16 operands, each a hi / lo pair where `a_lo` / `b_lo` (else exact in
/// bf16): the small terms first; lo * lo (2^-18 of the product) is dropped.
template <bool kALo, bool kBLo>
__device__ __forceinline__ void mma_split(float (&c)[4], const uint32_t (&a_hi)[4],
                                          const uint32_t (&a_lo)[4], uint32_t b_hi0, uint32_t b_hi1,
                                          uint32_t b_lo0, uint32_t b_lo1) {
  if constexpr (kALo) mma_m16n8k16<bf16_t>(c, a_lo, b_hi0, b_hi1);
  if constexpr (kBLo) mma_m16n8k16<bf16_t>(c, a_hi, b_lo0, b_lo1);
  mma_m16n8k16<bf16_t>(c, a_hi, b_hi0, b_hi1);
}

// ---------------------------------------------------------------------------
// The chunk's gates, and its triangular solve.
// ---------------------------------------------------------------------------

/// Per token of a chunk (shared memory, kChunk each): the cumulated log decay G, e^G,
/// beta, and 1 / |k| (1 without the L2 norm).
struct ChunkScalars {
  float* log_decay;  // G_i = g_0 + ... + g_i
  float* decay;      // e^{G_i}
  float* beta;
  float* inv_norm_k;
};

/// Inclusive prefix sums of the kChunk values a warp holds two to a lane (`lo` for
/// tokens 0-31 by lane, `hi` for 32-63).
__device__ __forceinline__ void warp_prefix_sum_64(float& lo, float& hi) {
  const int lane = lane_id();
#pragma unroll
  for (int offset = 1; offset < kWarpSize; offset *= 2) {
    const float below_lo = __shfl_up_sync(0xffffffffu, lo, offset);
    const float below_hi = __shfl_up_sync(0xffffffffu, hi, offset);
    if (lane >= offset) {
      lo += below_lo;
      hi += below_hi;
    }
  }
  hi += __shfl_sync(0xffffffffu, lo, kWarpSize - 1);
}

/// Inverts, by one warp, the unit lower triangular 16 x 16 block I + L in place: `block`
/// (fp32, rows `stride` apart) holds L below its diagonal and zeros on and above it, and
/// gets the inverse's part below the diagonal (its diagonal is 1, above it 0). Lane c
/// (and c + 16, whose copy is not stored) substitutes column c from the rows as read;
/// the writes wait for every lane's reads.
__device__ __forceinline__ void invert_unit_lower_16(float* block, int stride) {
  const int c = lane_id() % 16;
  float m[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    float x = i == c ? 1.0f : 0.0f;
#pragma unroll
    for (int k = 0; k < i; ++k) x = fmaf(-block[i * stride + k], m[k], x);
    m[i] = x;
  }
  __syncwarp();
  if (lane_id() < 16) {
#pragma unroll
    for (int i = 1; i < 16; ++i) {
      if (i > c) block[i * stride + c] = m[i];
    }
  }
}

/// The first half of solve_unit_lower, by a CTA of 4 warps: the four 16 x 16 diagonal
/// blocks of I + A (A as solve_unit_lower takes it) inverted in place, a warp each. A
/// barrier must follow before substitute_unit_lower reads them.
__device__ __forceinline__ void invert_diagonal_blocks(float* a, int a_stride) {
  constexpr int kBlock = 16;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  invert_unit_lower_16(a + kBlock * warp * (a_stride + 1), a_stride);
}

/// The second half of solve_unit_lower, by a CTA of 4 warps: x over r, block row b after
/// block row b: y = r_b - A_{b,<b} x_{<b}, x_b = (I + A_bb)^-1 y, each thread 4 columns
/// of one row, with A's diagonal blocks already inverted (invert_diagonal_blocks) and A
/// left as it is, so that one A solves any number of right-hand sides. Starts and ends
/// with every thread at a barrier. kFirst (a multiple of 16): r's rows above it are zero,
/// so x's are too and stay as they are; only the block rows from kFirst on are
/// substituted, their sums over the columns from kFirst on (columns of the identity past
/// kFirst, as for the second half of (I + A)^-1).
template <int kFirst = 0>
__device__ __forceinline__ void substitute_unit_lower(const float* a, int a_stride, float* r,
                                                      int r_stride) {
  constexpr int kBlock = 16;
  static_assert(kFirst % kBlock == 0 && kFirst < kChunk, "a block row of the chunk");
  const int row = static_cast<int>(threadIdx.x) / 8, col = 4 * (static_cast<int>(threadIdx.x) % 8);
  auto quad = [&](int i) { return reinterpret_cast<float4*>(r + i * r_stride + col); };
  auto fma4 = [](float m, const float4& x, float4& y) {
    y.x = fmaf(m, x.x, y.x);
    y.y = fmaf(m, x.y, y.y);
    y.z = fmaf(m, x.z, y.z);
    y.w = fmaf(m, x.w, y.w);
  };
#pragma unroll
  for (int b = kFirst; b < kChunk; b += kBlock) {
    const float* a_row = a + (b + row) * a_stride;
    float4 y = *quad(b + row);
#pragma unroll 1
    for (int k = kFirst; k < b; k += 4) {
      const float4 coef = *reinterpret_cast<const float4*>(a_row + k);
      fma4(-coef.x, *quad(k), y);
      fma4(-coef.y, *quad(k + 1), y);
      fma4(-coef.z, *quad(k + 2), y);
      fma4(-coef.w, *quad(k + 3), y);
    }
    *quad(b + row) = y;  // this thread's own elements
    __syncthreads();
    float4 x = y;  // the inverse's diagonal is 1; a_row[b + i] is 0 for i >= row
#pragma unroll
    for (int i = 0; i < kBlock; ++i) fma4(a_row[b + i], *quad(b + i), x);
    __syncthreads();
    *quad(b + row) = x;
    __syncthreads();
  }
}

/// (I + A) x = r by a CTA of 4 warps, x over r: A strictly lower triangular kChunk x
/// kChunk (fp32, rows `a_stride` apart, 16-byte aligned, zeros on and above the diagonal
/// within each 16 x 16 diagonal block; A is overwritten), r kChunk x 32 (rows `r_stride`
/// apart, 16-byte aligned). The four diagonal blocks are inverted at once (a warp each),
/// then substituted block row after block row. Starts and ends with every thread at a
/// barrier.
__device__ __forceinline__ void solve_unit_lower(float* a, int a_stride, float* r, int r_stride) {
  invert_diagonal_blocks(a, a_stride);
  __syncthreads();
  substitute_unit_lower(a, a_stride, r, r_stride);
}

// ---------------------------------------------------------------------------
// Accumulators as operands: a product's fp32 result feeding the next product.
// ---------------------------------------------------------------------------

/// The A fragment (hi / lo) of the 16 x 16 block whose two 8-column halves a warp holds as
/// the C fragments `left` and `right` of m16n8 tiles: mma's C layout of a 16 x 16 block is
/// its A layout, so the split is all the work (no shuffle, no shared memory).
__device__ __forceinline__ void accumulators_as_a(const float (&left)[4], const float (&right)[4],
                                                  uint32_t (&hi)[4], uint32_t (&lo)[4]) {
  split_pair(left[0], left[1], hi[0], lo[0]);    // row g, columns 2t, 2t + 1
  split_pair(left[2], left[3], hi[1], lo[1]);    // row g + 8
  split_pair(right[0], right[1], hi[2], lo[2]);  // row g, columns 8 + 2t, 8 + 2t + 1
  split_pair(right[2], right[3], hi[3], lo[3]);  // row g + 8
}

}  // namespace mllm_kernel::cuda::gdn
