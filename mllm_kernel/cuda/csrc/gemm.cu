// Dense GEMM for Hopper (sm_90a): out[M, N] = a[M, K] @ b[N, K]^T (+ bias[N]),
// bf16 or fp16 inputs, fp32 accumulation, output in the input dtype or fp32; and the
// same kernel for int8 inputs (W8A8), int32 accumulation, an epilogue that scales
// each output by its row's (token's) and column's (channel's) fp32 scale, output in
// bf16 or fp16. A k-block is one 128-byte swizzled row of either type (64 16-bit or
// 128 int8 elements), and a wgmma k-step is 32 bytes of it, so the pipeline is the
// same for both; only the MMA instruction and the epilogue's arithmetic differ.
//
// One kernel computes C[p, q] = sum_k P[p, k] * Q[q, k] over tiles of kTileP x kTileQ:
//   - a producer warpgroup, one thread of which streams P and Q tiles into a ring of
//     shared-memory stages with TMA (128-byte swizzle), full/empty mbarriers per stage;
//   - one or two consumer warpgroups, each multiplying its 64 rows of the P tile by
//     the Q tile with wgmma (accumulators in registers), then writing its part of the
//     output tile (bias and the output cast fused) through shared memory and TMA
//     stores, so that it can start on its next tile while the stores drain;
//   - a persistent grid walking the tiles in grouped order (tile_scheduler.cuh).
// For large M, P = a and Q = b, and clusters of 2 CTAs on neighbouring tile-rows load
// each B tile once for both (TMA multicast). For small M (decode) the roles swap
// (P = b, Q = a): wgmma's M extent is fixed at 64, its N extent goes down to 8, so the
// weight rows fill the 64-row side and a few tokens the narrow side; the output, C^T,
// is transposed in shared memory and leaves by TMA too. Small- and mid-M problems also
// split K over the CTAs of a cluster, so that enough SMs stream the weights; the
// partial sums meet in the first CTA's shared memory (distributed shared memory).
//
// The kernel body reads as its steps, each a __forceinline__ function below:
//   cta_work, tile_origin    which tiles and k-blocks this CTA takes (tile scheduling);
//   init_stage_ring          the stage ring's full/empty barriers;
//   run_producer             load_k_block per k-block: wait for a free stage, TMA in;
//   run_consumer, per tile   load_epilogue_scales, mma_tile (wgmma over the stages,
//                            release_stage), reduce_split_k, stage_col_scales,
//                            store_output (store_tile_tma, store_tile_transposed
//                            or store_tile).
// Inlined, they compiled to the SASS the kernel had when it was one body (nvcc 13.0,
// every variant, instruction for instruction: cuobjdump -sass). To keep it so, a few
// things are written in an order that may look arbitrary (CtaWork's fields, the Q
// tile's address before the P copy, the `&` in load_epilogue_scales): other orders
// moved instructions and registers.
#include "mllm_kernel/cuda/cluster.cuh"
#include "mllm_kernel/cuda/epilogue.cuh"
#include "mllm_kernel/cuda/gemm_config.cuh"
#include "mllm_kernel/cuda/gemm_operands.cuh"
#include "mllm_kernel/cuda/mbarrier.cuh"
#include "mllm_kernel/cuda/tile_scheduler.cuh"
#include "mllm_kernel/cuda/tma.cuh"
#include "mllm_kernel/cuda/wgmma.cuh"
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.cuh"

// Only for sm_90a (the module is declared HOPPER_ONLY): for any other device target
// the kernels would compile to empty bodies, so such a build fails here instead.
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "this file's kernels run on sm_90a only (wgmma, TMA): build it for arch 9.0a"
#endif

namespace mllm_kernel::cuda {
namespace hopper_gemm {

/// Named barrier of the two consumers' staging of int8 column scales (ids 1 and 2 are
/// each consumer's own, in store_tile_tma).
inline constexpr int kColScalesBarrier = 3;

struct Params {
  void* out;
  const void* bias;  // nullptr, or one value per output column in the output dtype
  int64_t out_row_stride;
  int rows_p;
  int rows_q;
  int k_blocks;
  GroupedTileOrder order;
  bool out_fp32;
  bool out_bf16;   // int8 inputs: the output is bf16 (else fp16)
  bool tma_store;  // the output's rows allow TMA stores (16-byte aligned pitch and start)
  // int8 inputs: output row r (a token) is scaled by row_scales[r * row_scale_step] and
  // column c (a channel) by col_scales[c * col_scale_step]; a step of 0 is one scale
  // for all.
  const float* row_scales;
  const float* col_scales;
  int row_scale_step;
  int col_scale_step;
};

// ---------------------------------------------------------------------------
// Shared memory and tile scheduling.
// ---------------------------------------------------------------------------

/// The kernel's dynamic shared memory, carved as TileConfig lays it out: the stage
/// ring (P and Q tiles, one full and one empty barrier per stage), the consumers'
/// output buffers, the staged column scales (int8) and the split-K partial sums.
template <typename T, typename Config>
struct SharedStorage {
  T* tiles_p;
  T* tiles_q;
  uint8_t* store_buffers;
  float* col_scales;
  MBarrier* full;   // stage s holds its k-block: the producer's copies have landed
  MBarrier* empty;  // stage s was read by every consumer that reads it
  typename Config::Acc4* partials;

  /// The layout over `raw`, the dynamic shared memory, from its first 1024-byte
  /// boundary (the 128-byte swizzle's atoms).
  __device__ __forceinline__ explicit SharedStorage(uint8_t* raw) {
    uint8_t* base =
        reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t{1023});
    tiles_p = reinterpret_cast<T*>(base);
    tiles_q = reinterpret_cast<T*>(base + Config::kOffsetQ);
    store_buffers = base + Config::kOffsetStore;
    col_scales = reinterpret_cast<float*>(base + Config::kOffsetColScales);
    full = reinterpret_cast<MBarrier*>(base + Config::kOffsetBarriers);
    empty = full + Config::kStages;
    partials = reinterpret_cast<typename Config::Acc4*>(base + Config::kOffsetPartials);
  }

  __device__ __forceinline__ T* tile_p(int stage) const {
    return tiles_p + stage * Config::kTileP * Config::kTileK;
  }
  __device__ __forceinline__ T* tile_q(int stage) const {
    return tiles_q + stage * Config::kTileQ * Config::kTileK;
  }
};

/// What this CTA works on. A cluster either shares Q tiles (multicast) or splits K:
/// each CTA then sums its share of the k-blocks of the cluster's tiles. Clusters walk
/// the tiles persistently: the cluster's index, then every `tile_step`-th. The fields
/// go in the order the one-body kernel computed them (see the note at the top).
struct CtaWork {
  int cluster;  // CTAs in the cluster
  int rank;     // this CTA's rank in it
  int split;    // CTAs that share each tile's K (1 with multicast)
  int tile_step;
  int first_tile;
  KBlockRange k_blocks;  // this CTA's share of every tile's k-blocks
  int num_tiles;
};

/// This CTA's work, from its place in the grid and in its cluster.
template <typename Config>
__device__ __forceinline__ CtaWork cta_work(const Params& params) {
  const int cluster = static_cast<int>(cluster_size());
  const int rank = static_cast<int>(cluster_rank());
  const int split = Config::kMulticast > 1 ? 1 : cluster;
  return CtaWork{
      .cluster = cluster,
      .rank = rank,
      .split = split,
      .tile_step = static_cast<int>(gridDim.x) / cluster,
      .first_tile = static_cast<int>(blockIdx.x) / cluster,
      // Multicast partners sum every k-block of their own tiles (split is 1).
      .k_blocks = split_k_blocks(params.k_blocks, Config::kMulticast > 1 ? 0 : rank, split),
      .num_tiles = params.order.num_tiles(),
  };
}

/// Where tile `tile` of the walk starts: its first row of P (a cluster's multicast
/// partners take neighbouring tile-rows) and of Q.
struct TileOrigin {
  int row_p;
  int row_q;
};

template <typename Config>
__device__ __forceinline__ TileOrigin tile_origin(const Params& params, int tile, int rank) {
  const TileCoord at = params.order(tile);
  const int tile_row = at.row * Config::kMulticast + (Config::kMulticast > 1 ? rank : 0);
  return TileOrigin{tile_row * Config::kTileP, at.col * Config::kTileQ};
}

// ---------------------------------------------------------------------------
// The stage ring: its barriers, the producer's loads and the consumers' release.
// ---------------------------------------------------------------------------

/// One thread sets up every stage's barriers and prefetches the tensor maps; then the
/// whole CTA (the cluster, whose peers write into this CTA's shared memory and arrive
/// on its barriers) waits for it.
template <typename T, typename Config>
__device__ __forceinline__ void init_stage_ring(const SharedStorage<T, Config>& smem,
                                                const CUtensorMap* map_p, const CUtensorMap* map_q,
                                                const Params& params, const CtaWork& work) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < Config::kStages; ++s) {
      smem.full[s].init(1);  // the producer's arrive_expect_tx
      // Lane 0 of every consumer warp of every CTA whose producer writes this stage.
      smem.empty[s].init(Config::kConsumers * 4 * Config::kMulticast);
    }
    mbarrier_init_fence();
    if (params.k_blocks > 0) {
      tma_prefetch_map(map_p);
      tma_prefetch_map(map_q);
    }
  }
  if (work.cluster > 1) {
    cluster_sync();
  } else {
    __syncthreads();
  }
}

/// The producer's step: once every consumer has released the stage at `state`, copies
/// k-block `kb` of the tile at `origin` into it, P whole and Q whole or (multicast)
/// this CTA's slice of Q into every CTA of the cluster; the stage's full barrier
/// counts the bytes.
template <typename T, typename Config>
__device__ __forceinline__ void load_k_block(const SharedStorage<T, Config>& smem,
                                             const PipelineState& state, const CUtensorMap* map_p,
                                             const CUtensorMap* map_q, TileOrigin origin, int kb,
                                             int rank) {
  constexpr int kTileK = Config::kTileK;
  MBarrier* full = &smem.full[state.stage];
  smem.empty[state.stage].wait(state.phase ^ 1);
  full->arrive_expect_tx(Config::kStageBytes);
  T* tile_q = smem.tile_q(state.stage);  // before the P copy (see the note at the top)
  tma_load_2d(smem.tile_p(state.stage), map_p, full, kb * kTileK, origin.row_p);
  if constexpr (Config::kMulticast > 1) {
    constexpr int kSliceRows = Config::kTileQ / Config::kMulticast;
    tma_load_2d_multicast(tile_q + rank * kSliceRows * kTileK, map_q, full, kb * kTileK,
                          origin.row_q + rank * kSliceRows,
                          static_cast<uint16_t>((1u << Config::kMulticast) - 1));
  } else {
    tma_load_2d(tile_q, map_q, full, kb * kTileK, origin.row_q);
  }
}

/// The producer warpgroup: one thread streams the k-blocks of every tile of the walk
/// into the stage ring; all of it joins the consumers' split-K cluster barriers.
template <typename T, typename Config>
__device__ __forceinline__ void run_producer(const Params& params,
                                             const SharedStorage<T, Config>& smem,
                                             const CtaWork& work, const CUtensorMap* map_p,
                                             const CUtensorMap* map_q) {
  if constexpr (Config::kReallocRegisters) {
    warpgroup_release_registers<Config::kProducerRegisters>();
  }
  PipelineState state;
  for (int tile = work.first_tile; tile < work.num_tiles; tile += work.tile_step) {
    if (threadIdx.x == 0) {
      const TileOrigin origin = tile_origin<Config>(params, tile, work.rank);
      for (int kb = work.k_blocks.begin; kb < work.k_blocks.end; ++kb) {
        load_k_block(smem, state, map_p, map_q, origin, kb, work.rank);
        state.advance(Config::kStages);
      }
    }
    if (work.split > 1) {  // reduce_split_k's barriers, then the one after the store
      if constexpr (Config::kPartialsInRing) cluster_sync();
      cluster_sync();
      cluster_sync();
    }
  }
}

/// A consumer warp is done with the stage of barrier `empty` (its lane 0 arrives). The
/// stage is free once every CTA that reads a slice written into it is done, so with
/// multicast the arrival goes to that barrier in every CTA of the cluster.
template <typename Config>
__device__ __forceinline__ void release_stage(MBarrier& empty, bool lane0) {
  if (!lane0) return;
  if constexpr (Config::kMulticast > 1) {
    for (int peer = 0; peer < Config::kMulticast; ++peer) empty.arrive_cluster_relaxed(peer);
  } else {
    empty.arrive();
  }
}

// ---------------------------------------------------------------------------
// The consumers: main loop, split-K reduction.
// ---------------------------------------------------------------------------

/// The consumer main loop: `acc` = consumer `consumer`'s 64 rows of the P tile times
/// the Q tile over this CTA's k-blocks, a k-block per stage. One k-block of wgmma
/// stays in flight: a stage is released once the group after it has been issued and
/// it has completed.
template <typename T, typename Config>
__device__ __forceinline__ void mma_tile(typename Config::Acc (&acc)[Config::kAccumulators],
                                         const SharedStorage<T, Config>& smem, PipelineState& state,
                                         KBlockRange k_blocks, int consumer, bool lane0) {
#pragma unroll
  for (int i = 0; i < Config::kAccumulators; ++i) acc[i] = 0;
  int previous = -1;
  for (int kb = k_blocks.begin; kb < k_blocks.end; ++kb) {
    smem.full[state.stage].wait(state.phase);
    wgmma_k_block_sw128<T, Config::kTileQ>(
        acc, smem.tile_p(state.stage) + consumer * 64 * Config::kTileK, smem.tile_q(state.stage));
    wgmma_wait_group<1>();
    if (previous >= 0) release_stage<Config>(smem.empty[previous], lane0);
    previous = state.stage;
    state.advance(Config::kStages);
  }
  wgmma_wait_group<0>();
  wgmma_fence_operands(acc);
  if (previous >= 0) release_stage<Config>(smem.empty[previous], lane0);
}

/// Split K: the partners add their sums into rank 0's registers through its shared
/// memory (`thread` counts the CTA's consumer threads). The slots are reused once
/// rank 0 has read them: the caller's cluster_sync() after the store. Slots in the
/// stage ring are written once rank 0's last wgmma has read it (the first barrier).
/// (Reduce-scattering instead, each partner summing and storing a share of the tile
/// from registers, ran as fast at M = 1 and 16 and 3-6% slower at M = 128 on an H200:
/// benchmarks/RESULTS.md, session 20.)
template <typename Config>
__device__ __forceinline__ void reduce_split_k(typename Config::Acc (&acc)[Config::kAccumulators],
                                               typename Config::Acc4* partials, const CtaWork& work,
                                               int thread) {
  if constexpr (Config::kPartialsInRing) cluster_sync();
  if (work.rank != 0) {
    send_cluster_partials(acc, partials, work.rank, thread, Config::kConsumerThreads);
  }
  cluster_sync();
  if (work.rank == 0) {
    add_cluster_partials(acc, partials, work.split - 1, thread, Config::kConsumerThreads);
  }
}

// ---------------------------------------------------------------------------
// The epilogue: scale (int8), bias, cast, store.
// ---------------------------------------------------------------------------

/// Output row `row`'s scale (int8 inputs; other accumulators are not scaled).
template <typename Config>
__device__ __forceinline__ float row_scale(const Params& params, int row) {
  if constexpr (Config::kInt8) {
    return params.row_scales[row * params.row_scale_step];
  } else {
    return 1.0f;
  }
}

/// Output column `col`'s scale (int8 inputs).
template <typename Config>
__device__ __forceinline__ float col_scale(const Params& params, int col) {
  if constexpr (Config::kInt8) {
    return params.col_scales[col * params.col_scale_step];
  } else {
    return 1.0f;
  }
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

/// The int8 epilogue's scales of one tile as this thread needs them: its two rows'
/// (store_tile_tma) and column `thread`'s, to stage for both consumers.
struct EpilogueScales {
  float rows[2];
  float col;
};

/// Loads this thread's epilogue scales as the tile starts (`thread` counts the CTA's
/// consumer threads). int8: waiting on them in the epilogue, chunk after chunk, cost
/// 15-20% at K = 4096 (H100, 4096 x 4096 x 4096: 131 us, against 107 us with one scale
/// for all); loaded now, they have long arrived when it reads them.
template <typename Config>
__device__ __forceinline__ void load_epilogue_scales(const Params& params, int row_base,
                                                     int col_base, int thread,
                                                     EpilogueScales& scales) {
  scales.col = 0.0f;
  if (Config::kTmaStore && params.tma_store) {
    const int in_warpgroup = static_cast<int>(threadIdx.x) % kWarpgroupThreads;
    const int row0 = in_warpgroup / 32 * 16 + in_warpgroup % 32 / 4;  // as store_tile_tma's
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // Rows past the matrix are clipped by the TMA store; their scale is never read.
      const int row = row_base + row0 + 8 * h;
      scales.rows[h] = row < params.rows_p ? row_scale<Config>(params, row) : 0.0f;
    }
    // `&`, not `&&`: one predicate for the load, as the one-body kernel compiled it
    // (two branches move a few instructions; see the note at the top).
    if (Config::kStageColScales & (thread < Config::kTileQ) & (col_base + thread < params.rows_q)) {
      scales.col = col_scale<Config>(params, col_base + thread);
    }
  }
}

/// Puts the tile's column scales (int8, TMA stores) in shared memory, one per consumer
/// thread, once both consumers have finished the last tile's epilogue, which read the
/// previous ones; then both see the new ones.
template <typename Config>
__device__ __forceinline__ void stage_col_scales(float* staged, float col_scale, int thread) {
  named_barrier(kColScalesBarrier, Config::kConsumerThreads);
  if (thread < Config::kTileQ) staged[thread] = col_scale;
  named_barrier(kColScalesBarrier, Config::kConsumerThreads);
}

template <typename Out>
__device__ __forceinline__ void store_pair(Out* at, float x, float y) {
  Vec<Out, 2> v;
  v[0] = from_float<Out>(x);
  v[1] = from_float<Out>(y);
  v.store(at);
}

/// Writes one consumer's 64 x kTileQ accumulators, scaled (int8) and adding the bias,
/// in Out, straight from registers. Fragment layout of wgmma m64nN (fp32 or int32):
/// warp w of the warpgroup holds rows 16w + lane/4 (+8); acc[4j + 2h + e] is column
/// 8j + 2 (lane % 4) + e of row + 8h.
template <typename Config, typename Out>
__device__ __forceinline__ void store_tile(const Params& params,
                                           const typename Config::Acc (&acc)[Config::kAccumulators],
                                           int row_base, int col_base) {
  Out* out = static_cast<Out*>(params.out);
  const Out* bias = static_cast<const Out*>(params.bias);
  const int lane = threadIdx.x % 32;
  const int row0 = row_base + (threadIdx.x % kWarpgroupThreads) / 32 * 16 + lane / 4;
  const int col0 = col_base + (lane % 4) * 2;
#pragma unroll
  for (int j = 0; j < Config::kTileQ / 8; ++j) {
    const int col = col0 + 8 * j;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + 8 * h;
      const auto x = acc[4 * j + 2 * h];
      const auto y = acc[4 * j + 2 * h + 1];
      if constexpr (Config::kSwapAB) {
        // C = out^T: row indexes out's columns (N), col its rows (M, not a multiple of 8).
        if (row >= params.rows_p) continue;
        const float b = bias ? to_float(bias[row]) : 0.0f;
        const float s = col_scale<Config>(params, row);
        if (col < params.rows_q) {
          out[col * params.out_row_stride + row] =
              from_float<Out>(dequantize(x, row_scale<Config>(params, col), s) + b);
        }
        if (col + 1 < params.rows_q) {
          out[(col + 1) * params.out_row_stride + row] =
              from_float<Out>(dequantize(y, row_scale<Config>(params, col + 1), s) + b);
        }
      } else {
        // N is a multiple of 8, so a pair is in bounds whole or not at all.
        if (row >= params.rows_p || col >= params.rows_q) continue;
        float bx = 0.0f, by = 0.0f;
        if (bias) {
          bx = to_float(bias[col]);
          by = to_float(bias[col + 1]);
        }
        const float s = row_scale<Config>(params, row);
        store_pair(out + row * params.out_row_stride + col,
                   dequantize(x, s, col_scale<Config>(params, col)) + bx,
                   dequantize(y, s, col_scale<Config>(params, col + 1)) + by);
      }
    }
  }
}

/// Writes one consumer's 64 x kTileQ accumulators (scaled for int8, bias added, cast
/// to Out) through its two 8 KB shared-memory buffers: each 64 x (128 bytes) chunk is
/// stored with the 128-byte swizzle (conflict-free: the 8 rows a warp writes at once
/// fall in 8 different 16-byte columns) and leaves by one TMA store, which clips the
/// matrix edges. `chunk` counts this consumer's chunks across tiles, to alternate
/// buffers; the row scales come from load_epilogue_scales, the column scales (int8)
/// from `col_scales`, the tile's kTileQ of them staged in shared memory.
template <typename Config, typename Out>
__device__ __forceinline__ void store_tile_tma(
    const Params& params, const typename Config::Acc (&acc)[Config::kAccumulators], int row_base,
    int col_base, const float (&row_scales)[2], const float* col_scales, uint8_t* buffers,
    const CUtensorMap* map_out, int barrier_id, int& chunk) {
  constexpr int kChunkCols = 128 / sizeof(Out);
  constexpr int kPairBytes = 2 * sizeof(Out);
  const Out* bias = static_cast<const Out*>(params.bias);
  const int thread = static_cast<int>(threadIdx.x) % kWarpgroupThreads;
  const int lane = thread % 32;
  const int row0 = thread / 32 * 16 + lane / 4;  // within the consumer's 64 rows
#pragma unroll
  for (int c = 0; c < Config::kTileQ / kChunkCols; ++c, ++chunk) {
    uint8_t* buffer = buffers + (chunk % 2) * Config::kStoreChunkBytes;
    if (thread == 0) tma_store_wait_read<1>();  // the store from this buffer has read it
    warpgroup_barrier(barrier_id);
#pragma unroll
    for (int jj = 0; jj < kChunkCols / 8; ++jj) {
      const int j = c * (kChunkCols / 8) + jj;
      const int col = 8 * jj + 2 * (lane % 4);  // within the chunk
      const int out_col = col_base + c * kChunkCols + col;
      const bool in_matrix = out_col < params.rows_q;  // N is even: the pair is too
      float bx = 0.0f, by = 0.0f, sx = 0.0f, sy = 0.0f;
      if (bias && in_matrix) {
        bx = to_float(bias[out_col]);
        by = to_float(bias[out_col + 1]);
      }
      if constexpr (Config::kStageColScales) {
        const float2 pair = *reinterpret_cast<const float2*>(col_scales + c * kChunkCols + col);
        sx = pair.x, sy = pair.y;
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + 8 * h;
        const int swizzled = swizzle_128b(row, col * static_cast<int>(sizeof(Out)));
        Vec<Out, 2> v;
        v[0] = from_float<Out>(dequantize(acc[4 * j + 2 * h], row_scales[h], sx) + bx);
        v[1] = from_float<Out>(dequantize(acc[4 * j + 2 * h + 1], row_scales[h], sy) + by);
        static_assert(sizeof(v) == kPairBytes);
        *reinterpret_cast<Vec<Out, 2>*>(buffer + row * 128 + swizzled) = v;
      }
    }
    fence_shared_for_tma();
    warpgroup_barrier(barrier_id);
    if (thread == 0) {
      tma_store_2d(map_out, buffer, col_base + c * kChunkCols, row_base);
      tma_store_commit();
    }
  }
}

/// Writes a swapped tile (C = out^T: C's rows are output columns) in Out, a 16-bit type,
/// scaled (int8) and adding the bias: transposed into the box in shared memory
/// (stage_transposed_box), then one TMA store, which clips the rows past M and the
/// columns past N. 2-byte stores straight from the accumulators half-filled every
/// sector they touched (ncu: 50% excess sectors at M = 128, N = K = 4096).
template <typename Config, typename Out>
__device__ __forceinline__ void store_tile_transposed(
    const Params& params, const typename Config::Acc (&acc)[Config::kAccumulators], int row_base,
    int col_base, uint8_t* box, const CUtensorMap* map_out) {
  const Out* bias = static_cast<const Out*>(params.bias);
  const int thread = static_cast<int>(threadIdx.x) % kWarpgroupThreads;
  const int warp = thread / 32;
  const int lane = thread % 32;
  float add[2], scale[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int col = row_base + 16 * warp + lane / 4 + 8 * h;  // an output column
    const bool in_matrix = col < params.rows_p;
    add[h] = bias && in_matrix ? to_float(bias[col]) : 0.0f;
    scale[h] = in_matrix ? col_scale<Config>(params, col) : 0.0f;
  }
  if (thread == 0) tma_store_wait_read<0>();  // the last tile's store has read the box
  warpgroup_barrier(1);
  stage_transposed_box<Out, Config::kTileQ>(shared_address(box), warp, lane, [&](int i, int h) {
    const int row = col_base + 8 * (i / 4) + 2 * (lane % 4) + i % 2;  // an output row
    const float s = row < params.rows_q ? row_scale<Config>(params, row) : 0.0f;
    return dequantize(acc[i], s, scale[h]) + add[h];
  });
  fence_shared_for_tma();
  warpgroup_barrier(1);
  if (thread == 0) {
    tma_store_2d(map_out, box, row_base, col_base);
    tma_store_commit();
  }
}

/// Stores consumer `consumer`'s tile in the output dtype, through shared memory and
/// TMA where the output allows it, else straight from registers.
template <typename T, typename Config>
__device__ __forceinline__ void store_output(
    const Params& params, const typename Config::Acc (&acc)[Config::kAccumulators], int row_base,
    int col_base, const EpilogueScales& scales, const SharedStorage<T, Config>& smem,
    const CUtensorMap* map_out, int consumer, int& chunk) {
  uint8_t* buffers = smem.store_buffers + consumer * 2 * Config::kStoreChunkBytes;
  auto store = [&](auto out_type) {
    using Out = decltype(out_type);
    if constexpr (Config::kSwapAB && sizeof(Out) == 2) {
      if (params.tma_store) {
        store_tile_transposed<Config, Out>(params, acc, row_base, col_base, smem.store_buffers,
                                           map_out);
        return;
      }
    }
    if (Config::kTmaStore && params.tma_store) {
      store_tile_tma<Config, Out>(params, acc, row_base, col_base, scales.rows, smem.col_scales,
                                  buffers, map_out, 1 + consumer, chunk);
    } else {
      store_tile<Config, Out>(params, acc, row_base, col_base);
    }
  };
  if constexpr (Config::kInt8) {
    params.out_bf16 ? store(bf16_t{}) : store(fp16_t{});
  } else {
    params.out_fp32 ? store(float{}) : store(T{});
  }
}

/// A consumer warpgroup: for every tile of the walk, its 64 rows of the product
/// (mma_tile), summed over the split's partners, then written out; the output tile's
/// stores drain while it starts on the next.
template <typename T, typename Config>
__device__ __forceinline__ void run_consumer(const Params& params,
                                             const SharedStorage<T, Config>& smem,
                                             const CtaWork& work, const CUtensorMap* map_out,
                                             int consumer) {
  if constexpr (Config::kReallocRegisters) {
    warpgroup_claim_registers<Config::kConsumerRegisters>();
  }
  const int thread = static_cast<int>(threadIdx.x) - kWarpgroupThreads;  // among consumers
  const bool lane0 = threadIdx.x % 32 == 0;
  PipelineState state;
  int chunk = 0;  // output chunks this consumer has stored (store_tile_tma)
  for (int tile = work.first_tile; tile < work.num_tiles; tile += work.tile_step) {
    const TileOrigin origin = tile_origin<Config>(params, tile, work.rank);
    const int row_base = origin.row_p + consumer * 64;
    EpilogueScales scales;
    load_epilogue_scales<Config>(params, row_base, origin.row_q, thread, scales);
    typename Config::Acc acc[Config::kAccumulators];
    mma_tile(acc, smem, state, work.k_blocks, consumer, lane0);
    if (work.split > 1) reduce_split_k<Config>(acc, smem.partials, work, thread);
    if (Config::kStageColScales && params.tma_store) {
      stage_col_scales<Config>(smem.col_scales, scales.col, thread);
    }
    if (work.split == 1 || work.rank == 0) {
      store_output(params, acc, row_base, origin.row_q, scales, smem, map_out, consumer, chunk);
    }
    if (work.split > 1) cluster_sync();  // rank 0 has read the partial sums: slots reusable
  }
  // The stores must finish reading shared memory (and writing) before the CTA exits.
  if (params.tma_store && threadIdx.x % kWarpgroupThreads == 0) tma_store_wait<0>();
}

/// The kernel: the stage ring set up, warpgroup 0 produces and the others consume.
template <typename T, typename Config>
__global__ void __launch_bounds__(Config::kThreads, Config::kMinBlocksPerSM)
    gemm_kernel(const __grid_constant__ CUtensorMap map_p,
                const __grid_constant__ CUtensorMap map_q,
                const __grid_constant__ CUtensorMap map_out, const Params params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t shared_raw[];
  const SharedStorage<T, Config> smem(shared_raw);
  const CtaWork work = cta_work<Config>(params);
  init_stage_ring(smem, &map_p, &map_q, params, work);
  const int warpgroup = static_cast<int>(threadIdx.x) / kWarpgroupThreads;
  if (warpgroup == 0) {
    run_producer(params, smem, work, &map_p, &map_q);
  } else {
    run_consumer(params, smem, work, &map_out, warpgroup - 1);
  }
  // No CTA leaves while a peer may still write into its shared memory or arrive on
  // its barriers.
  if (Config::kMulticast > 1) cluster_sync();
#endif
}

/// The row pitch a tensor map gives TMA, in bytes: the tensor's; for a single row, whose
/// stride no copy uses and which torch leaves at any value (a [1, K] slice of a wider
/// row, a transposed column), the row's own bytes rounded up to the 16 TMA asks of a
/// pitch.
inline uint64_t tma_row_pitch(int64_t rows, int64_t cols, int64_t row_stride, uint32_t element) {
  if (rows <= 1) return round_up<uint64_t>(static_cast<uint64_t>(cols) * element, 16);
  return static_cast<uint64_t>(row_stride) * element;
}

/// An operand's tensor map: boxes of `box_rows` rows x 128 bytes (64 16-bit or 128
/// int8 elements), swizzled as wgmma reads them.
template <typename T>
CUtensorMap matrix_map(const Operand& m, int box_rows) {
  constexpr uint32_t kBytes = sizeof(T);
  const CUtensorMapDataType type = std::is_same_v<T, int8_t>   ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : std::is_same_v<T, bf16_t> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                               : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return tma_map_2d(TmaMatrix{m.data, static_cast<uint64_t>(m.rows), static_cast<uint64_t>(m.cols),
                              tma_row_pitch(m.rows, m.cols, m.row_stride, kBytes),
                              static_cast<uint32_t>(box_rows),
                              static_cast<uint32_t>(kSwizzle128Bytes / kBytes), type, kBytes});
}

/// The output's tensor map for TMA stores: boxes of `box_rows` rows x 128 bytes.
inline CUtensorMap output_map(const TensorView& out, int box_rows) {
  const bool fp32 = is_dtype<fp32_t>(out.dtype());
  const CUtensorMapDataType type = fp32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                   : is_dtype<bf16_t>(out.dtype())
                                       ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                       : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const uint32_t element = fp32 ? 4 : 2;
  return tma_map_2d(TmaMatrix{data_ptr<const void>(out), static_cast<uint64_t>(out.size(0)),
                              static_cast<uint64_t>(out.size(1)),
                              tma_row_pitch(out.size(0), out.size(1), out.stride(0), element),
                              static_cast<uint32_t>(box_rows), 128 / element, type, element});
}

/// Runs `Config`'s kernel on checked operands (a [M, K], b [N, K], out [M, N]); `params`
/// comes with the epilogue's inputs (bias, scales, output type) filled in.
template <typename Config>
void run_gemm(const TensorView& out, const Operand& a, const Operand& b, Params params,
              int64_t split, int64_t group_rows, DLDevice dev) {
  using T = typename Config::Element;
  constexpr int kMulticast = Config::kMulticast;
  static_assert(Config::shared_bytes(1) <= kSm90SharedBytesPerBlock,
                "the tile's stages do not fit in an sm_90 block's shared memory");
  ValueCheck(split >= 1 && split <= Config::max_split(), "split must be in [1, ",
             Config::max_split(), "] for this tile, got ", split);
  ValueCheck(group_rows >= 1, "group_rows must be at least 1, got ", group_rows);
  ValueCheck(kMulticast == 1 || split == 1, "multicast tiles do not split K, got split ", split);
  const bool out_fp32 = is_dtype<fp32_t>(out.dtype());
  check_output_pairs(out);
  if (out.size(0) == 0 || out.size(1) == 0) return;
  // K == 0 runs with no k-blocks (the output is the bias, or zeros) and no copies, so
  // the tensor maps, which cannot describe empty rows, are never built or read.
  const bool empty_k = a.cols == 0;
  if (!empty_k) {
    check_operand_rows<T>(a, "TMA");
    check_operand_rows<T>(b, "TMA");
  }

  const Operand& p = Config::kSwapAB ? b : a;
  const Operand& q = Config::kSwapAB ? a : b;
  params.out = data_ptr<void>(out);
  params.out_row_stride = out.stride(0);
  params.rows_p = static_cast<int>(p.rows);
  params.rows_q = static_cast<int>(q.rows);
  params.k_blocks = static_cast<int>(div_ceil<int64_t>(a.cols, Config::kTileK));
  // Tiles of the walk: a cluster's kMulticast neighbouring tile-rows count as one.
  params.order = GroupedTileOrder{
      static_cast<int>(div_ceil<int64_t>(params.rows_p, Config::kTileP * kMulticast)),
      static_cast<int>(div_ceil<int64_t>(params.rows_q, Config::kTileQ)),
      static_cast<int>(group_rows)};
  params.out_fp32 = out_fp32;
  const CUtensorMap map_p = empty_k ? CUtensorMap{} : matrix_map<T>(p, Config::kTileP);
  const CUtensorMap map_q = empty_k ? CUtensorMap{} : matrix_map<T>(q, Config::kTileQ / kMulticast);

  const std::size_t out_element = out_fp32 ? 4 : 2;
  // Swapped tiles store 16-bit outputs only through TMA (stmatrix moves 16-bit values).
  params.tma_store = (Config::kTmaStore || !out_fp32) && !empty_k &&
                     reinterpret_cast<uintptr_t>(data_ptr<const void>(out)) % kTmaAlignBytes == 0 &&
                     (out.size(0) <= 1 || out.stride(0) * out_element % kTmaAlignBytes == 0);
  const CUtensorMap map_out =
      params.tma_store ? output_map(out, Config::kSwapAB ? Config::kTileQ : 64) : CUtensorMap{};

  const std::size_t shared = Config::shared_bytes(static_cast<int>(split));
  RuntimeCheck(shared <= max_shared_memory_per_block(dev), "gemm: a split of ", split, " needs ",
               shared, " bytes of shared memory, more than the device's ",
               max_shared_memory_per_block(dev));
  auto* kernel = gemm_kernel<T, Config>;
  const int cluster = kMulticast > 1 ? kMulticast : static_cast<int>(split);
  const int tiles = params.order.num_tiles();
  int clusters = tiles;
  if (split == 1) {  // persistent: as many clusters as run at once, each walking tiles
    static int resident[64] = {};
    int& fit = resident[dev.device_id % 64];
    if (fit == 0) fit = max_active_clusters(kernel, cluster, Config::kThreads, shared, dev);
    RuntimeCheck(fit > 0, "gemm: the kernel does not fit on the device");
    clusters = tiles < fit ? tiles : fit;
  }
  KernelLauncher(dim3(static_cast<unsigned>(clusters * cluster)), dim3(Config::kThreads), dev,
                 shared)
      .cluster(static_cast<unsigned>(cluster))(kernel, map_p, map_q, map_out, params);
}

/// out[M, N] = a[M, K] @ b[N, K]^T (+ bias[N]) in `out_dtype` (T or fp32, the dtype
/// `out` must have; the caller's default is a's). Every argument is checked here.
template <typename T, int kConsumers, int kTileQ, int kStages, bool kSwapAB, int kMulticast>
void gemm(TensorView out, TensorView a, TensorView b, ::tvm::ffi::Optional<TensorView> bias,
          DLDataType out_dtype, int64_t split, int64_t group_rows) {
  using Config = TileConfig<T, kConsumers, kTileQ, kStages, kSwapAB, kMulticast>;
  const GemmOperands operands = check_gemm_operands<T>(out, a, b, bias, out_dtype, "TMA");
  Params params{};
  params.bias = bias.has_value() ? data_ptr<const void>(*bias) : nullptr;
  run_gemm<Config>(out, operands.a, operands.b, params, split, group_rows, operands.device);
}

/// out[M, N] = (mat_a[M, K] @ mat_b[K, N]) * scales_a[M] * scales_b[N] (+ bias[N]),
/// int8 operands, int32 accumulation, out bf16 or fp16. `mat_b` is column-major: the
/// transpose of a contiguous [N, K] weight, read as that weight's rows.
template <int kConsumers, int kTileQ, int kStages, bool kSwapAB, int kMulticast>
void int8_scaled_mm(TensorView out, TensorView mat_a, TensorView mat_b, TensorView scales_a,
                    TensorView scales_b, ::tvm::ffi::Optional<TensorView> bias, int64_t split,
                    int64_t group_rows) {
  using Config = TileConfig<int8_t, kConsumers, kTileQ, kStages, kSwapAB, kMulticast>;
  const Int8Operands operands =
      check_int8_operands(out, mat_a, mat_b, scales_a, scales_b, bias, "TMA");
  Params params{};
  params.row_scale_step = operands.row_scale_step;
  params.col_scale_step = operands.col_scale_step;
  params.row_scales = data_ptr<const float>(scales_a);
  params.col_scales = data_ptr<const float>(scales_b);
  params.out_bf16 = is_dtype<bf16_t>(out.dtype());
  params.bias = bias.has_value() ? data_ptr<const void>(*bias) : nullptr;
  run_gemm<Config>(out, operands.a, operands.weight_rows, params, split, group_rows,
                   operands.device);
}

}  // namespace hopper_gemm

using hopper_gemm::gemm;
using hopper_gemm::int8_scaled_mm;

}  // namespace mllm_kernel::cuda
