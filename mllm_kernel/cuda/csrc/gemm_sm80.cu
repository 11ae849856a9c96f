// Dense GEMM and W8A8 int8 GEMM for every GPU from sm_80 on (Ampere A100/A10, Ada
// L4/RTX 4090, Jetson Orin sm_87, and Blackwell until it has a native kernel):
// out[M, N] = a[M, K] @ b[N, K]^T (+ bias[N]), bf16/fp16 inputs with fp32 accumulation
// (output in the input dtype or fp32), or int8 inputs with int32 accumulation and an
// epilogue that scales each output by its row's (token's) and column's (channel's)
// fp32 scale (output bf16 or fp16). The same signatures, checks (gemm_operands.cuh)
// and epilogues as the Hopper kernels of csrc/gemm.cu, which stay where wgmma exists.
//
// Design
// ------
// A CTA computes one kTileM x kTileN output tile over its share of K:
//   - load_k_block: every thread issues cp.async copies of 16-byte chunks of the A and
//     B rows of one k-block (128 bytes of K: 64 16-bit or 128 int8 elements) into a
//     ring of kStages shared-memory stages, zero-filling chunks past M, N or K, so the
//     main loop has no tails. Chunk c of row r sits at chunk c ^ (r % 8): the 8 rows an
//     ldmatrix reads at once then fall in 8 distinct 16-byte bank groups
//     (conflict-free), as they do when cp.async writes them.
//   - main_loop: kStages k-blocks in flight; per 32 bytes of K (a k-step) each warp
//     loads its A and B fragments with ldmatrix.x4 and runs mma.sync m16n8k16 (16-bit)
//     or m16n8k32 (int8) over its kWarpTileM x kWarpTileN accumulators (both shapes
//     take 32 bytes of K in the same register layout: only the instruction differs).
//     Fragments are double-buffered in registers, and a k-block's one barrier sits
//     before its last k-step, so ldmatrix latency hides behind mma.sync even across
//     the barrier. 128-byte k-blocks (one barrier per 4 k-steps) measured 8-15% faster
//     than 64-byte ones on an H100 through compute_80 PTX.
//   - reduce_split_k (split > 1): each slice of K stores its sums in a global
//     workspace; the last slice to finish a tile (a counter per tile) adds all slices
//     in slice order (a deterministic result) and runs the epilogue.
//   - store_tile: the epilogue from registers: int8 sums times their row's and
//     column's scales, the bias added, cast, each thread's pairs of neighbouring
//     columns stored as one 4- or 8-byte vector.
//
// Why these tiles (the roofline): A100's mma.sync peaks at 312 TFLOP/s (bf16) and
// 624 TOP/s (int8) against about 2 TB/s of HBM, a ridge of ~156 flops (312 ops for int8)
// per byte. A 128 x 128 tile spends 2 * 128 * 128 / (128 + 128) = 128 flops per element
// of K it loads (64 per byte for 16-bit, 128 for int8), and L2 (which serves
// neighbouring tiles' shared rows, walked in groups of 8 tile-rows) rather than HBM
// bounds it. Its 8 warps hold 64 x 32 each and its 3 stages take 96 KB, which every
// sm_80+ GPU gives a block; where an SM has 192 KB (Hopper) two CTAs share it. On an
// H100 through compute_80 PTX this beat 128 x 256 tiles (8 warps of 64 x 64, one CTA an
// SM: fewer bytes per flop, but a whole SM waits at each barrier) by 3-14% and 4-warp
// 128 x 128 tiles by 0-17% (benchmarks/RESULTS.md); no sm_80-89 GPU has timed them.
// Decode (M <= 64) reads each weight byte about once and does little arithmetic per
// byte: the time is the weights over HBM bandwidth. Its tiles are 16 or 64 tokens by
// 128 weight rows (4 warps; several CTAs an SM keep 36-48 KB of weights in flight each),
// and where those tiles do not fill the SMs, K is split over more CTAs.
#include "mllm_kernel/cuda/cp_async.cuh"
#include "mllm_kernel/cuda/gemm_operands.cuh"
#include "mllm_kernel/cuda/mma_sync.cuh"
#include "mllm_kernel/cuda/split_k.cuh"
#include "mllm_kernel/cuda/tile_scheduler.cuh"
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.cuh"

// mma.sync on bf16 and int8 m16n8k32, cp.async and ldmatrix need sm_80: a build for
// an older target would have no kernel, so it fails here instead.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "this file's kernels need sm_80 or newer (mma.sync, ldmatrix, cp.async)"
#endif

namespace mllm_kernel::cuda {
namespace sm80_gemm {

inline constexpr int kKBlockBytes = 128;  // K per row of a stage: 4 mma k-steps a barrier
inline constexpr int kChunkBytes = 16;    // one cp.async, one ldmatrix row
inline constexpr int kChunksPerRow = kKBlockBytes / kChunkBytes;
inline constexpr int kMmaKBytes = 32;  // K of one m16n8k16 (16-bit) or m16n8k32 (int8)
/// The most slices of K one tile is split into.
inline constexpr int kMaxSplit = 16;
/// The dynamic shared memory a block may opt in to on every sm_80+ GPU (sm_86, sm_89:
/// 99 KB; A100, Orin, Hopper: more), in bytes.
inline constexpr int kPortableSharedBytes = 99 * 1024;
/// Tile-rows walked together, so that CTAs running at once share rows of A and
/// columns of B in L2 (tile_scheduler.cuh).
inline constexpr int kGroupRows = 8;

/// A kernel's element type, tile and pipeline, fixed at compile time (the Python side
/// picks one per problem shape: mllm_kernel/cuda/jit/gemm_sm80.py, choose_sm80_tile).
template <typename T, int kTileM_, int kTileN_, int kWarpsM_, int kWarpsN_, int kStages_>
struct Config {
  using Element = T;
  static constexpr bool kInt8 = std::is_same_v<T, int8_t>;
  using Acc = std::conditional_t<kInt8, int32_t, float>;
  using Acc4 = std::conditional_t<kInt8, int4, float4>;  // split-K partial sums
  static constexpr int kTileM = kTileM_;
  static constexpr int kTileN = kTileN_;
  static constexpr int kWarpsM = kWarpsM_;
  static constexpr int kWarpsN = kWarpsN_;
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kWarpTileM = kTileM / kWarpsM;
  static constexpr int kWarpTileN = kTileN / kWarpsN;
  static constexpr int kFragsM = kWarpTileM / 16;  // m16 fragments of a warp
  static constexpr int kFragsN = kWarpTileN / 8;   // n8 fragments of a warp
  static constexpr int kAccumulators = kFragsM * kFragsN * 4;
  static constexpr int kTileBytesA = kTileM * kKBlockBytes;
  static constexpr int kStageBytes = (kTileM + kTileN) * kKBlockBytes;
  static constexpr int kSharedBytes = kStages * kStageBytes;
  // Registers: 128 accumulators a thread (64 x 64 warp tiles) need one CTA an SM's worth.
  static constexpr int kMinBlocksPerSM = kAccumulators >= 128 ? 1 : 2;
  // One split slice's partial sums of a tile.
  static constexpr int kPartialBytes = kTileM * kTileN * 4;

  static_assert(kTileM % (16 * kWarpsM) == 0, "warps hold whole m16 fragments");
  static_assert(kTileN % (16 * kWarpsN) == 0, "warps hold pairs of n8 fragments (ldmatrix.x4)");
  static_assert(kChunksPerRow == 8, "FragmentAddress's row phase is lane % 8");
  static_assert(kStages >= 2, "a stage loads while another is read");
  static_assert(kSharedBytes <= kPortableSharedBytes, "the stages must fit every sm_80+ GPU");
};

struct Params {
  const uint8_t* a;  // [M, K] rows, `a_row_bytes` apart
  const uint8_t* b;  // [N, K] rows (weights), `b_row_bytes` apart
  int64_t a_row_bytes;
  int64_t b_row_bytes;
  void* out;
  const void* bias;  // nullptr, or one value per output column in the output dtype
  int64_t out_row_stride;
  int m;
  int n;
  int k_bytes;
  int k_blocks;
  int split;
  GroupedTileOrder order;
  bool out_fp32;
  bool out_bf16;  // int8 inputs: the output is bf16 (else fp16)
  // int8 inputs: output row r is scaled by row_scales[r * row_scale_step] and column c
  // by col_scales[c * col_scale_step]; a step of 0 is one scale for all.
  const float* row_scales;
  const float* col_scales;
  int row_scale_step;
  int col_scale_step;
  // split > 1: a counter per tile (zeroed before the launch), then the partial sums,
  // [slice][tile][accumulator group][thread].
  int* counters;
  void* partials;
};

// ---------------------------------------------------------------------------
// The producer's side: cp.async into swizzled stages.
// ---------------------------------------------------------------------------

/// The byte offset of chunk `chunk` of row `row` in a stage's tile (see the note at
/// the top: conflict-free for ldmatrix's 8 rows and for cp.async's writes).
__device__ __forceinline__ uint32_t swizzled(int row, int chunk) {
  return static_cast<uint32_t>(row * kKBlockBytes +
                               ((chunk ^ (row % kChunksPerRow)) * kChunkBytes));
}

/// Copies the k-block at byte `k_byte` of K of `kRows` rows from `first_row` on (of
/// `rows`, `row_bytes` apart) into `tile`; chunks past the rows or K are zero-filled.
/// A thread copies the same chunk of every kRowsPerPass-th row, so its source address,
/// destination (swizzled: the row phase repeats every 8 rows) and K test are computed
/// once and each pass adds a constant: the copies cost few instructions beside the
/// mma.sync they feed.
template <int kRows, int kThreads>
__device__ __forceinline__ void load_rows(uint8_t* tile, const uint8_t* base, int64_t row_bytes,
                                          int first_row, int rows, int k_byte, int k_bytes) {
  constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static_assert(kRows % kRowsPerPass == 0 && kRowsPerPass % 8 == 0,
                "every pass copies whole rows, starting at the same row phase");
  const int chunk = static_cast<int>(threadIdx.x) % kChunksPerRow;
  const int row = static_cast<int>(threadIdx.x) / kChunksPerRow;
  const int byte = k_byte + chunk * kChunkBytes;
  const bool in_k = byte < k_bytes;
  const uint8_t* src = base + (first_row + row) * row_bytes + byte;
  uint8_t* dst = tile + swizzled(row, chunk);
#pragma unroll
  for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
    const bool valid = in_k && first_row + row + pass * kRowsPerPass < rows;
    // A zero-filled chunk still names a readable address: the operand's start.
    cp_async_16_or_zero(dst + pass * kRowsPerPass * kKBlockBytes,
                        valid ? src + pass * kRowsPerPass * row_bytes : base, valid);
  }
}

/// The producer's step: k-block `kb` of the tile's A rows and B rows into `stage`.
template <typename Config>
__device__ __forceinline__ void load_k_block(const Params& params, uint8_t* stage, int row0,
                                             int col0, int kb) {
  const int k_byte = kb * kKBlockBytes;
  load_rows<Config::kTileM, Config::kThreads>(stage, params.a, params.a_row_bytes, row0, params.m,
                                              k_byte, params.k_bytes);
  load_rows<Config::kTileN, Config::kThreads>(stage + Config::kTileBytesA, params.b,
                                              params.b_row_bytes, col0, params.n, k_byte,
                                              params.k_bytes);
}

// ---------------------------------------------------------------------------
// The consumer's side: ldmatrix + mma.sync over the stages.
// ---------------------------------------------------------------------------

/// One warp's operands of one 32-byte k-step: its A fragments (m16 x k) and B fragments
/// (n8 x k), in mma_sync.cuh's layouts.
template <typename Config>
struct Fragments {
  uint32_t a[Config::kFragsM][4];
  uint32_t b[Config::kFragsN][2];
};

/// Where a warp's fragments of one k-step sit in a stage: A fragment i's 16 rows (lane l
/// gives row l % 16, chunk l / 16) and B fragments 2j, 2j + 1's 16 columns (lane l
/// gives column (l / 16) 8 + l % 8, chunk (l / 8) % 2). The addresses are swizzled()'s,
/// written so that only the lane's row offsets stay live across the loop: every
/// fragment starts at a multiple of 8 rows, so a lane's row phase is lane % 8, and
/// fragment i (pair j) is i (j) times 16 rows further on, an immediate offset.
template <typename Config>
struct FragmentAddress {
  uint32_t stage;  // shared address of the stage
  int step;        // k-step within the k-block
  uint32_t a_row;  // this lane's A row in fragment 0, as a byte offset in the stage
  uint32_t b_row;  // this lane's B row in pair 0, as a byte offset in the stage
  int lane;

  __device__ __forceinline__ uint32_t a(int i) const {
    const int chunk = (2 * step + lane / 16) ^ (lane % 8);
    return stage + a_row + i * 16 * kKBlockBytes + chunk * kChunkBytes;
  }
  __device__ __forceinline__ uint32_t b_pair(int j) const {
    const int chunk = (2 * step + (lane / 8) % 2) ^ (lane % 8);
    return stage + b_row + j * 16 * kKBlockBytes + chunk * kChunkBytes;
  }
};

template <typename Config>
__device__ __forceinline__ void load_b_pair(Fragments<Config>& f, const FragmentAddress<Config>& at,
                                            int j) {
  uint32_t pair[4];
  ldmatrix_x4(pair, at.b_pair(j));
  f.b[2 * j][0] = pair[0];
  f.b[2 * j][1] = pair[1];
  f.b[2 * j + 1][0] = pair[2];
  f.b[2 * j + 1][1] = pair[3];
}

/// Loads one k-step's fragments into `f`.
template <typename Config>
__device__ __forceinline__ void load_fragments(Fragments<Config>& f,
                                               const FragmentAddress<Config>& at) {
#pragma unroll
  for (int i = 0; i < Config::kFragsM; ++i) ldmatrix_x4(f.a[i], at.a(i));
#pragma unroll
  for (int j = 0; j < Config::kFragsN / 2; ++j) load_b_pair(f, at, j);
}

/// acc += the products of `f`'s fragments, each fragment reloaded from `next` (when
/// `has_next`) as soon as its last mma.sync has read it: A fragment i after row i, B
/// fragments during the last row. The next k-step's loads overlap this one's products
/// without a second set of fragment registers (a 64 x 64 warp tile already holds 128
/// accumulators).
template <typename Config>
__device__ __forceinline__ void mma_step(typename Config::Acc (&acc)[Config::kAccumulators],
                                         Fragments<Config>& f, const FragmentAddress<Config>& next,
                                         bool has_next) {
#pragma unroll
  for (int i = 0; i < Config::kFragsM; ++i) {
#pragma unroll
    for (int j = 0; j < Config::kFragsN; ++j) {
      auto& c = *reinterpret_cast<typename Config::Acc(*)[4]>(&acc[4 * (i * Config::kFragsN + j)]);
      if constexpr (Config::kInt8) {
        mma_m16n8k32_s8(c, f.a[i], f.b[j][0], f.b[j][1]);
      } else {
        mma_m16n8k16<typename Config::Element>(c, f.a[i], f.b[j][0], f.b[j][1]);
      }
      if (i == Config::kFragsM - 1 && j % 2 == 1 && has_next) load_b_pair(f, next, j / 2);
    }
    if (has_next) ldmatrix_x4(f.a[i], next.a(i));
  }
}

/// The main loop: `acc` = this warp's part of the tile at (row0, col0) over the
/// k-blocks of `k_blocks`, kStages of them in flight. Each k-step's fragments load
/// while the previous k-step's products run (mma_step), and a k-block's one barrier
/// sits before its last k-step, so the next k-block's first fragments load during that
/// step's products (no bubble at the barrier). Behind the barrier every warp has read
/// the k-block's stage, which is then refilled with the k-block kStages ahead.
template <typename Config>
__device__ __forceinline__ void main_loop(typename Config::Acc (&acc)[Config::kAccumulators],
                                          const Params& params, uint8_t* shared, int row0, int col0,
                                          KBlockRange k_blocks) {
  constexpr int kSteps = kKBlockBytes / kMmaKBytes;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp_row = (warp / Config::kWarpsN) * Config::kWarpTileM;
  const int warp_col = (warp % Config::kWarpsN) * Config::kWarpTileN;
  const uint32_t a_row = (warp_row + lane % 16) * kKBlockBytes;
  const uint32_t b_row =
      Config::kTileBytesA + (warp_col + (lane / 16) * 8 + lane % 8) * kKBlockBytes;
  const uint32_t shared_address = static_cast<uint32_t>(__cvta_generic_to_shared(shared));
  const int count = k_blocks.end - k_blocks.begin;
#pragma unroll
  for (int i = 0; i < Config::kAccumulators; ++i) acc[i] = 0;
  if (count <= 0) return;  // a slice with no k-blocks adds zeros (uniform in the CTA)
#pragma unroll
  for (int s = 0; s < Config::kStages; ++s) {
    if (s < count) {
      load_k_block<Config>(params, shared + s * Config::kStageBytes, row0, col0,
                           k_blocks.begin + s);
    }
    cp_async_commit();  // one group per k-block, empty or not: the waits count groups
  }
  cp_async_wait<Config::kStages - 1>();  // k-block 0 (this thread's copies)
  __syncthreads();                       // everyone's
  Fragments<Config> frags;
  load_fragments(frags, FragmentAddress<Config>{shared_address, 0, a_row, b_row, lane});
  for (int i = 0; i < count; ++i) {
    const int stage = i % Config::kStages;
    const uint32_t stage_address = shared_address + stage * Config::kStageBytes;
#pragma unroll
    for (int step = 0; step < kSteps - 1; ++step) {
      mma_step(acc, frags, FragmentAddress<Config>{stage_address, step + 1, a_row, b_row, lane},
               true);
    }
    // Groups through k-block i + kStages - 1 are committed: k-block i + 1 has landed once
    // at most kStages - 2 are pending.
    cp_async_wait<Config::kStages - 2>();
    __syncthreads();  // k-block i + 1 is everyone's; every warp has read this stage
    if (i + Config::kStages < count) {
      load_k_block<Config>(params, shared + stage * Config::kStageBytes, row0, col0,
                           k_blocks.begin + i + Config::kStages);
    }
    cp_async_commit();
    const uint32_t next_stage = shared_address + ((i + 1) % Config::kStages) * Config::kStageBytes;
    mma_step(acc, frags, FragmentAddress<Config>{next_stage, 0, a_row, b_row, lane}, i + 1 < count);
  }
}

// ---------------------------------------------------------------------------
// Split K and the epilogue.
// ---------------------------------------------------------------------------

/// Split K: stores this slice's sums of tile `tile`; the last slice to arrive adds every
/// slice's (in slice order, so the result does not depend on which one is last) and
/// returns true, to run the epilogue; the others return false.
template <typename Config>
__device__ __forceinline__ bool reduce_split_k(typename Config::Acc (&acc)[Config::kAccumulators],
                                               const Params& params, int tile, int slice) {
  using Acc4 = typename Config::Acc4;
  constexpr int kGroups = Config::kAccumulators / 4;
  const int tiles = params.order.num_tiles();
  Acc4* partials = static_cast<Acc4*>(params.partials);
  auto slot = [&](int s, int group) {
    return partials + (static_cast<int64_t>(s) * tiles + tile) * kGroups * Config::kThreads +
           group * Config::kThreads + threadIdx.x;
  };
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    *slot(slice, g) = Acc4{acc[4 * g], acc[4 * g + 1], acc[4 * g + 2], acc[4 * g + 3]};
  }
  // The barrier orders every thread's stores before thread 0's count, which releases them
  // (and acquires the other slices') at GPU scope: split_k.cuh's last_to_arrive.
  __syncthreads();
  __shared__ int last;
  if (threadIdx.x == 0) last = last_to_arrive(&params.counters[tile], params.split);
  __syncthreads();
  if (!last) return false;
#pragma unroll
  for (int i = 0; i < Config::kAccumulators; ++i) acc[i] = 0;
  for (int s = 0; s < params.split; ++s) {
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      const Acc4 v = __ldcg(slot(s, g));  // from L2: another SM wrote it
      acc[4 * g] += v.x;
      acc[4 * g + 1] += v.y;
      acc[4 * g + 2] += v.z;
      acc[4 * g + 3] += v.w;
    }
  }
  return true;
}

/// An accumulator as an output value before the bias: fp32 sums as they are, int32
/// sums times their row's and column's scales.
template <typename Acc>
__device__ __forceinline__ float dequantize(Acc x, float row_scale, float col_scale) {
  if constexpr (std::is_same_v<Acc, float>) {
    return x;
  } else {
    return static_cast<float>(x) * row_scale * col_scale;
  }
}

/// Writes this thread's accumulators of the tile at (row0, col0): scaled (int8), the
/// bias added, in Out. Fragment (i, j) of the warp holds rows 16 i + lane / 4 (+ 8) and
/// columns 8 j + 2 (lane % 4) (+ 1) of its part; N is even, so a pair is in bounds
/// whole or not at all, and leaves as one vector.
template <typename Config, typename Out>
__device__ __forceinline__ void store_tile(const Params& params,
                                           const typename Config::Acc (&acc)[Config::kAccumulators],
                                           int row0, int col0) {
  Out* out = static_cast<Out*>(params.out);
  const Out* bias = static_cast<const Out*>(params.bias);
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int rows = row0 + (warp / Config::kWarpsN) * Config::kWarpTileM + lane / 4;
  const int cols = col0 + (warp % Config::kWarpsN) * Config::kWarpTileN + 2 * (lane % 4);
#pragma unroll
  for (int j = 0; j < Config::kFragsN; ++j) {
    const int col = cols + 8 * j;
    if (col >= params.n) continue;
    float bx = 0.0f, by = 0.0f, sx = 1.0f, sy = 1.0f;
    if (bias) {
      bx = to_float(bias[col]);
      by = to_float(bias[col + 1]);
    }
    if constexpr (Config::kInt8) {
      sx = params.col_scales[col * params.col_scale_step];
      sy = params.col_scales[(col + 1) * params.col_scale_step];
    }
#pragma unroll
    for (int i = 0; i < Config::kFragsM; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = rows + 16 * i + 8 * h;
        if (row >= params.m) continue;
        const float s = Config::kInt8 ? params.row_scales[row * params.row_scale_step] : 1.0f;
        const int at = 4 * (i * Config::kFragsN + j) + 2 * h;
        Vec<Out, 2> v;
        v[0] = from_float<Out>(dequantize(acc[at], s, sx) + bx);
        v[1] = from_float<Out>(dequantize(acc[at + 1], s, sy) + by);
        v.store(out + static_cast<int64_t>(row) * params.out_row_stride + col);
      }
    }
  }
}

/// The epilogue in the output's dtype.
template <typename Config>
__device__ __forceinline__ void store_output(
    const Params& params, const typename Config::Acc (&acc)[Config::kAccumulators], int row0,
    int col0) {
  if constexpr (Config::kInt8) {
    if (params.out_bf16) {
      store_tile<Config, bf16_t>(params, acc, row0, col0);
    } else {
      store_tile<Config, fp16_t>(params, acc, row0, col0);
    }
  } else if (params.out_fp32) {
    store_tile<Config, float>(params, acc, row0, col0);
  } else {
    store_tile<Config, typename Config::Element>(params, acc, row0, col0);
  }
}

/// The kernel: CTA (tile, slice) computes slice `blockIdx.y` of K of tile `blockIdx.x`
/// of the grouped walk.
template <typename Config>
__global__ void __launch_bounds__(Config::kThreads, Config::kMinBlocksPerSM)
    gemm_sm80_kernel(const Params params) {
  extern __shared__ __align__(128) uint8_t shared[];
  const int tile = static_cast<int>(blockIdx.x);
  const int slice = static_cast<int>(blockIdx.y);
  const TileCoord at = params.order(tile);
  const int row0 = at.row * Config::kTileM;
  const int col0 = at.col * Config::kTileN;
  typename Config::Acc acc[Config::kAccumulators];
  main_loop<Config>(acc, params, shared, row0, col0,
                    split_k_blocks(params.k_blocks, slice, params.split));
  if (params.split > 1 && !reduce_split_k<Config>(acc, params, tile, slice)) return;
  store_output<Config>(params, acc, row0, col0);
}

// ---------------------------------------------------------------------------
// Host side.
// ---------------------------------------------------------------------------

/// Bytes of split-K workspace a launch needs: a counter per tile, then (from a 16-byte
/// boundary) every slice's partial sums of every tile. The Python side allocates it
/// (mllm_kernel/cuda/jit/gemm_sm80.py: workspace_bytes, the same formula).
template <typename Config>
int64_t workspace_bytes(int64_t tiles, int64_t split) {
  return (tiles * 4 + 15) / 16 * 16 + split * tiles * Config::kPartialBytes;
}

/// Runs `Config`'s kernel on checked operands (a [M, K], b [N, K], out [M, N]); `params`
/// comes with the epilogue's inputs (bias, scales, output type) filled in.
template <typename Config>
void run_gemm(const TensorView& out, const Operand& a, const Operand& b, Params params,
              int64_t split, const ::tvm::ffi::Optional<TensorView>& workspace, DLDevice dev) {
  using T = typename Config::Element;
  ValueCheck(split >= 1 && split <= kMaxSplit, "split must be in [1, ", kMaxSplit, "], got ",
             split);
  check_output_pairs(out);
  if (out.size(0) == 0 || out.size(1) == 0) return;
  if (a.cols > 0) {  // K == 0: no row is read, the output is the bias (or zeros)
    check_operand_rows<T>(a, "cp.async");
    check_operand_rows<T>(b, "cp.async");
  }
  params.a = static_cast<const uint8_t*>(a.data);
  params.b = static_cast<const uint8_t*>(b.data);
  params.a_row_bytes = a.row_stride * static_cast<int64_t>(sizeof(T));
  params.b_row_bytes = b.row_stride * static_cast<int64_t>(sizeof(T));
  params.out = data_ptr<void>(out);
  params.out_row_stride = out.stride(0);
  params.out_fp32 = is_dtype<fp32_t>(out.dtype());
  params.m = static_cast<int>(a.rows);
  params.n = static_cast<int>(b.rows);
  params.k_bytes = static_cast<int>(a.cols * static_cast<int64_t>(sizeof(T)));
  params.k_blocks = static_cast<int>(div_ceil<int64_t>(params.k_bytes, kKBlockBytes));
  params.split = static_cast<int>(split);
  params.order =
      GroupedTileOrder{static_cast<int>(div_ceil<int64_t>(params.m, Config::kTileM)),
                       static_cast<int>(div_ceil<int64_t>(params.n, Config::kTileN)), kGroupRows};
  const int tiles = params.order.num_tiles();
  if (split > 1) {
    const int64_t needed = workspace_bytes<Config>(tiles, split);
    ValueCheck(workspace.has_value(), "a split of ", split, " needs a workspace of ", needed,
               " bytes");
    const TensorView& space = *workspace;
    uint8_t* base = data_ptr<uint8_t>(space);
    ValueCheck(space.IsContiguous() && space.numel() * (space.dtype().bits / 8) >= needed &&
                   reinterpret_cast<uintptr_t>(base) % 16 == 0,
               "the workspace must be a contiguous, 16-byte aligned buffer of at least ", needed,
               " bytes");
    ValueCheck(space.device().device_type == kDLCUDA && space.device().device_id == dev.device_id,
               "the workspace must be on the operands' GPU");
    params.counters = reinterpret_cast<int*>(base);
    params.partials = base + (tiles * 4 + 15) / 16 * 16;
    ::tvm::ffi::CUDADeviceGuard guard(dev.device_id);
    RuntimeCheck(cudaMemsetAsync(params.counters, 0, tiles * sizeof(int), current_stream(dev)) ==
                     cudaSuccess,
                 "gemm: zeroing the split-K counters failed");
  }
  const std::size_t shared = Config::kSharedBytes;
  RuntimeCheck(shared <= max_shared_memory_per_block(dev), "gemm: the tile's stages need ", shared,
               " bytes of shared memory, more than the device's ",
               max_shared_memory_per_block(dev));
  KernelLauncher(dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(split)),
                 dim3(Config::kThreads), dev, shared)(gemm_sm80_kernel<Config>, params);
}

/// out[M, N] = a[M, K] @ b[N, K]^T (+ bias[N]) in `out_dtype` (T or fp32, the dtype
/// `out` must have), K split over `split` CTAs (a `workspace` then). Every argument is
/// checked here, as csrc/gemm.cu's gemm checks them.
template <typename T, int kTileM, int kTileN, int kWarpsM, int kWarpsN, int kStages>
void gemm(TensorView out, TensorView a, TensorView b, ::tvm::ffi::Optional<TensorView> bias,
          DLDataType out_dtype, int64_t split, ::tvm::ffi::Optional<TensorView> workspace) {
  using Cfg = Config<T, kTileM, kTileN, kWarpsM, kWarpsN, kStages>;
  const GemmOperands operands = check_gemm_operands<T>(out, a, b, bias, out_dtype, "cp.async");
  Params params{};
  params.bias = bias.has_value() ? data_ptr<const void>(*bias) : nullptr;
  run_gemm<Cfg>(out, operands.a, operands.b, params, split, workspace, operands.device);
}

/// out[M, N] = (mat_a[M, K] @ mat_b[K, N]) * scales_a[M] * scales_b[N] (+ bias[N]),
/// int8 operands, int32 accumulation, out bf16 or fp16; `mat_b` column-major (the
/// transpose of a contiguous [N, K] weight). Checked as csrc/gemm.cu's int8_scaled_mm.
template <int kTileM, int kTileN, int kWarpsM, int kWarpsN, int kStages>
void int8_scaled_mm(TensorView out, TensorView mat_a, TensorView mat_b, TensorView scales_a,
                    TensorView scales_b, ::tvm::ffi::Optional<TensorView> bias, int64_t split,
                    ::tvm::ffi::Optional<TensorView> workspace) {
  using Cfg = Config<int8_t, kTileM, kTileN, kWarpsM, kWarpsN, kStages>;
  const Int8Operands operands =
      check_int8_operands(out, mat_a, mat_b, scales_a, scales_b, bias, "cp.async");
  Params params{};
  params.row_scale_step = operands.row_scale_step;
  params.col_scale_step = operands.col_scale_step;
  params.row_scales = data_ptr<const float>(scales_a);
  params.col_scales = data_ptr<const float>(scales_b);
  params.out_bf16 = is_dtype<bf16_t>(out.dtype());
  params.bias = bias.has_value() ? data_ptr<const void>(*bias) : nullptr;
  run_gemm<Cfg>(out, operands.a, operands.weight_rows, params, split, workspace, operands.device);
}

}  // namespace sm80_gemm

}  // namespace mllm_kernel::cuda
