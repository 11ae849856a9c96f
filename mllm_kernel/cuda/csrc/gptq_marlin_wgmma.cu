// W4A16 GEMM for Hopper (sm_90a) on weights in the Marlin layout, dequantized in
// registers and fed straight to wgmma: c[M, N] = a[M, K] @ dequant(b)[K, N], for M
// from a few dozen tokens to a couple of thousand (gptq_marlin.py's plan has the
// measured bounds). Without it those M ran the streaming mma.sync kernel or
// dequantized the whole weight into a bf16/fp16 copy first, a memory pass that cost a
// quarter of the time at M = 1024.
//
// The product is computed transposed, C^T[N, M] = dequant(b)^T @ a^T: wgmma takes its
// A operand (64 rows x k16) from registers, and a k16 x n64 Marlin tile is exactly one
// such operand. Warp w of a warpgroup holds rows 16 w .. 16 w + 15, which in an
// m16n8k16 A fragment are lane (g, t)'s columns 16 w + g and 16 w + 8 + g at rows
// 2 t + {0, 1, 8, 9}: the two n8 blocks of lane l's Marlin word w (marlin_layout.cuh).
// So each thread reads one 32-bit word per k16 step, dequantizes its four pairs (the
// magic-number trick, then the zero and the group's scale in T, as the other paths
// do), and issues wgmma with the activations (B, K-major, 128-byte swizzle) from
// shared memory.
//
// A CTA is a producer warpgroup, one thread of which streams each 64-k block's
// activation tile (kTokens rows), weight tiles (4 k16 rows x the CTA's 128 columns,
// 4 KB) and scale / zero-point rows into a ring of stages with TMA, and two consumer
// warpgroups, one per 64 weight columns. Each consumer issues a k-block's four k16
// wgmmas at once and dequantizes the next k-block into a second register set while
// they run. Per-channel scales (one group) multiply the fp32 sums in the epilogue
// instead.
//
// Grid: (K slices, output tiles), tiles numbered token tile first, so the CTAs running
// at once share the weight columns they read and the activations stay in L2. When the
// output tiles alone leave SMs idle, K is split over `split` CTAs, whose sums meet in a
// cluster (the partners' written into the first CTA's shared memory) or, where the
// caller passes partials, through global memory (split_k.cuh), the last of a tile's
// CTAs to finish adding them: a cluster must fit one GPC, so clusters of 4 CTAs at
// about one an SM paired CTAs on some SMs while others idled (the plan's rule says
// where each wins). A launch may run a range of the tiles: the caller runs a last,
// mostly empty wave of tiles apart, split, in a launch that starts on the SMs the first
// one's last CTAs leave. The epilogue transposes the accumulators into c's rows in shared
// memory (stmatrix) and writes them with TMA stores.
//
// The kernel reads as its steps: fused_work (the CTA's output tile and k-blocks),
// StageRing (the stages and their barriers), the producer (produce_k_blocks,
// run_producer), the consumers' main loop (consume_k_blocks over run_k_block and
// dequant_k_block), the split-K sums (sum_over_cluster, sum_over_slices) and the epilogue
// (store_output_tile, over epilogue.cuh's stage_transposed_box).
#include <tvm/ffi/optional.h>

#include "mllm_kernel/cuda/cluster.cuh"
#include "mllm_kernel/cuda/dequant.cuh"
#include "mllm_kernel/cuda/epilogue.cuh"
#include "mllm_kernel/cuda/marlin_config.cuh"
#include "mllm_kernel/cuda/marlin_layout.cuh"
#include "mllm_kernel/cuda/mbarrier.cuh"
#include "mllm_kernel/cuda/split_k.cuh"
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
namespace marlin_wgmma {

using marlin::kBias;
using marlin::kIntZero;

/// The hardware barrier both consumer warpgroups meet at (1 and 2 are their own).
inline constexpr int kConsumersBarrier = 3;

/// Group rows one k-block's scale box covers: two for groups of 32, else one.
__host__ __device__ inline int group_rows_per_block(int group_shift) {
  return group_shift == 5 ? 2 : 1;
}

/// A k-block's first group row: its scales' and zero points' row (one group: row 0).
__device__ __forceinline__ int group_row(const marlin::Params& p, int kb) {
  return p.group_shift >= 0 ? (kb * 64) >> p.group_shift : 0;
}

/// What one thread subtracts from and multiplies into its pairs for one group: its
/// two n8 blocks' `magic + zero` and scales, each broadcast to a pair.
template <typename T>
struct BlockConstants {
  Pair<T> offset[2];
  Pair<T> scale[2];
};

/// The four A registers of one k16 step from the thread's Marlin word: rows g and
/// g + 8 (blocks 2 w and 2 w + 1) at k 2 t + {0, 1} then 2 t + {8, 9}.
template <typename T>
__device__ __forceinline__ void dequant_a(uint32_t (&a)[4], uint32_t word,
                                          const BlockConstants<T>& bc) {
  using Deq = IntDequant<T, 4>;
  constexpr int kPair[4] = {0, 2, 1, 3};  // the word's pair in each A register
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int block = r % 2;
    a[r] = bits_of<T>(__hmul2(Deq::pair(word, kPair[r], bc.offset[block]), bc.scale[block]));
  }
}

/// Keeps the compiler from reusing the registers of a k-block's A register sets while
/// a wgmma that reads them asynchronously may still run (the asm names them as inputs
/// only).
__device__ __forceinline__ void keep_live(uint32_t (&a)[4][4]) {
#pragma unroll
  for (int s = 0; s < 4; ++s)
#pragma unroll
    for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(a[s][r])::"memory");
}

/// Four k16 wgmmas of one k-block, A from registers `a`, B the activation tile of
/// `stage`, closed into one commit group.
template <typename T, int kTokens, int N>
__device__ __forceinline__ void wgmma_k_block_rs(float (&acc)[N], const uint32_t (&a)[4][4],
                                                 const uint8_t* stage) {
  wgmma_fence();
  const uint64_t desc = smem_desc_k_major_sw128(stage, 0);
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    wgmma_m64k16_rs<T, kTokens>(acc, a[s], smem_desc_advance(desc, 32 * s));
  }
  wgmma_commit_group();
}

/// The ring of stages in dynamic shared memory, 1024-byte aligned (the 128-byte
/// swizzle), and after it each stage's barriers: `full` (the producer's copies have
/// landed) and `empty` (every consumer warp is done with the stage).
template <class Config>
struct StageRing {
  uint8_t* shared;
  MBarrier* full;
  MBarrier* empty;

  // Aligned by an offset from `raw`, so that the compiler still knows the pointers
  // address shared memory (LDS, not generic loads).
  __device__ __forceinline__ explicit StageRing(uint8_t* raw)
      : shared(raw + ((1024 - shared_address(raw) % 1024) % 1024)),
        full(reinterpret_cast<MBarrier*>(shared + Config::kStages * Config::kStageBytes)),
        empty(full + Config::kStages) {}

  __device__ __forceinline__ uint8_t* stage(int index) const {
    return shared + index * Config::kStageBytes;
  }

  /// One thread, before any use: a full phase takes the producer's arrival (and its
  /// copies' bytes), an empty phase lane 0 of every consumer warp.
  __device__ __forceinline__ void init_barriers() const {
    for (int s = 0; s < Config::kStages; ++s) {
      full[s].init(1);
      empty[s].init(Config::kConsumers * 4);
    }
    mbarrier_init_fence();
  }
};

/// What a CTA computes: its output tile (tokens from token0, weight columns from col0)
/// over its share [kb_begin, kb_end) of the k-blocks.
struct FusedWork {
  int split, rank;  // the CTAs sharing the tile (K slices), and this CTA's slice
  int token0, col0;
  int kb_begin, kb_end;
  bool grouped;        // grouped scales (else per-channel ones, applied in the epilogue)
  int rows_per_block;  // group rows a k-block's scale box covers
};

/// This CTA's FusedWork. The `split` CTAs along x (a cluster, unless their sums meet in
/// memory) share one output tile, each summing its share of the k-blocks; output tiles
/// are numbered token tile first, and this launch runs first_tile + y.
template <class Config, bool kSumsInMemory>
__device__ __forceinline__ FusedWork fused_work(const marlin::Params& p, int first_tile) {
  FusedWork work;
  work.split = static_cast<int>(kSumsInMemory ? gridDim.x : cluster_size());
  work.rank = static_cast<int>(kSumsInMemory ? blockIdx.x : cluster_rank());
  const int token_tiles = (p.m + Config::kTokens - 1) / Config::kTokens;
  const int tile = first_tile + static_cast<int>(blockIdx.y);
  work.token0 = tile % token_tiles * Config::kTokens;
  work.col0 = tile / token_tiles * Config::kCols;
  const int k_blocks = (p.k + Config::kTileK - 1) / Config::kTileK;
  work.kb_begin = work.rank * k_blocks / work.split;
  work.kb_end = (work.rank + 1) * k_blocks / work.split;
  work.grouped = p.group_shift >= 0;
  work.rows_per_block = group_rows_per_block(p.group_shift);
  return work;
}

/// The producer's loop (one thread): for each of the CTA's k-blocks, once its stage is
/// free, TMA loads of the activation tile (kTokens rows x 64 k), the weight words (4 k16
/// rows x the CTA's columns) and the k-block's group rows of scales and zero points, all
/// counted on the stage's full barrier.
template <class Config>
__device__ __forceinline__ void produce_k_blocks(const StageRing<Config>& ring,
                                                 const FusedWork& work, const marlin::Params& p,
                                                 const CUtensorMap& map_a, const CUtensorMap& map_w,
                                                 const CUtensorMap& map_s,
                                                 const CUtensorMap& map_z) {
  const uint32_t bytes =
      Config::kActBytes + Config::kWeightBytes +
      (work.grouped ? work.rows_per_block * Config::kScaleRowBytes : 0) +
      (Config::kZeroMode == kIntZero ? work.rows_per_block * Config::kZeroRowBytes : 0);
  PipelineState state;
  for (int kb = work.kb_begin; kb < work.kb_end; ++kb) {
    ring.empty[state.stage].wait(state.phase ^ 1);
    uint8_t* stage = ring.stage(state.stage);
    MBarrier* barrier = &ring.full[state.stage];
    barrier->arrive_expect_tx(bytes);
    tma_load_2d(stage, &map_a, barrier, kb * Config::kTileK, work.token0);
    // Weight words: k16 rows 4 kb .. 4 kb + 3, 2 words per column.
    tma_load_2d(stage + Config::kWeightOffset, &map_w, barrier, work.col0 * 2, kb * 4);
    if (work.grouped) {
      tma_load_2d(stage + Config::kScaleOffset, &map_s, barrier, work.col0, group_row(p, kb));
    }
    if constexpr (Config::kZeroMode == kIntZero) {
      tma_load_2d(stage + Config::kZeroOffset, &map_z, barrier, work.col0 / 8, group_row(p, kb));
    }
    state.advance(Config::kStages);
  }
}

/// The producer warpgroup: gives its registers to the consumers, streams the k-blocks
/// (one thread), and meets the consumers' cluster barriers (a split in a cluster), which
/// every thread of the cluster must.
template <class Config, bool kSumsInMemory>
__device__ __forceinline__ void run_producer(const StageRing<Config>& ring, const FusedWork& work,
                                             const marlin::Params& p, const CUtensorMap& map_a,
                                             const CUtensorMap& map_w, const CUtensorMap& map_s,
                                             const CUtensorMap& map_z) {
  warpgroup_release_registers<Config::kProducerRegisters>();
  if (threadIdx.x == 0) produce_k_blocks(ring, work, p, map_a, map_w, map_s, map_z);
  if (!kSumsInMemory && work.split > 1) {  // the consumers' two reduction barriers
    cluster_sync();
    cluster_sync();
  }
  // A tail launch ends no sooner than the launch before it: what follows on the
  // stream then follows both.
  if (threadIdx.x == 0) wait_for_previous_grid();
}

/// A consumer thread: its warpgroup `consumer` (weight columns 64 consumer ..), its
/// warp (A rows 16 warp ..) and lane (g = lane / 4).
struct ConsumerThread {
  int consumer, warp, lane, g;

  __device__ __forceinline__ explicit ConsumerThread(int warpgroup)
      : consumer(warpgroup - 1),
        warp((static_cast<int>(threadIdx.x) / 32) % 4),
        lane(static_cast<int>(threadIdx.x) % 32),
        g(lane / 4) {}
};

/// The constants of group row `row` of `stage` for the thread's two n8 blocks: the
/// scales of columns 16 w + g and 16 w + 8 + g sit side by side (permuted positions
/// 8 g + 2 w, + 1); their zero points are nibbles w and w + 4 of the row's word g.
template <typename T, class Config>
__device__ __forceinline__ void load_group_constants(BlockConstants<T>& bc, const uint8_t* stage,
                                                     int row, const ConsumerThread& id,
                                                     bool grouped) {
  using Deq = IntDequant<T, 4>;
  if (grouped) {
    const Pair<T> s = *reinterpret_cast<const Pair<T>*>(
        stage + Config::kScaleOffset + row * Config::kScaleRowBytes +
        (id.consumer * 64 + 8 * id.g + 2 * id.warp) * 2);
    bc.scale[0] = Pair<T>{s.x, s.x};
    bc.scale[1] = Pair<T>{s.y, s.y};
  }
  if constexpr (Config::kZeroMode == kIntZero) {
    const uint32_t word = *reinterpret_cast<const uint32_t*>(
        stage + Config::kZeroOffset + row * Config::kZeroRowBytes + (id.consumer * 8 + id.g) * 4);
    bc.offset[0] = Deq::int_offset((word >> (4 * id.warp)) & 0xf);
    bc.offset[1] = Deq::int_offset((word >> (4 * (id.warp + 4))) & 0xf);
  }
}

/// Dequantizes the k-block in `stage` into the A registers `a`: the thread's word of
/// each k16 row, with the constants of the row's group (`bc`, loaded here).
template <typename T, class Config>
__device__ __forceinline__ void dequant_k_block(uint32_t (&a)[4][4], const uint8_t* stage,
                                                BlockConstants<T>& bc, const ConsumerThread& id,
                                                const FusedWork& work) {
  const uint32_t* words = reinterpret_cast<const uint32_t*>(stage + Config::kWeightOffset) +
                          id.consumer * 128 + id.lane * 4 + id.warp;
  uint32_t word[4];
#pragma unroll
  for (int s = 0; s < 4; ++s) word[s] = words[s * 2 * 128];  // k16 row s: 1 KB
  load_group_constants<T, Config>(bc, stage, 0, id, work.grouped);
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    if (s == 2 && work.rows_per_block == 2) {
      load_group_constants<T, Config>(bc, stage, 1, id, work.grouped);
    }
    dequant_a<T>(a[s], word[s], bc);
  }
}

/// Releases the stage before `state`'s to the producer (lane 0 of each consumer warp:
/// the empty barrier counts warps).
template <class Config>
__device__ __forceinline__ void release_previous_stage(const StageRing<Config>& ring,
                                                       const PipelineState& state) {
  ring.empty[(state.stage + Config::kStages - 1) % Config::kStages].arrive();
}

/// One turn of the consumers' pipeline: runs k-block kb (the stage at `state`), whose
/// registers `a` are ready, and, while its wgmmas run, waits for block kb + 1 and
/// dequantizes it into `next`.
template <typename T, class Config>
__device__ __forceinline__ void run_k_block(float (&acc)[Config::kAccumulators], int kb,
                                            uint32_t (&a)[4][4], uint32_t (&next)[4][4],
                                            PipelineState& state, const StageRing<Config>& ring,
                                            const FusedWork& work, BlockConstants<T>& bc,
                                            const ConsumerThread& id) {
  wgmma_k_block_rs<T, Config::kTokens>(acc, a, ring.stage(state.stage));
  // The previous block's wgmmas have finished: its registers may be rewritten and its
  // stage released.
  wgmma_wait_group<1>();
  keep_live(next);
  if (kb > work.kb_begin && id.lane == 0) release_previous_stage(ring, state);
  state.advance(Config::kStages);
  if (kb + 1 < work.kb_end) {
    ring.full[state.stage].wait(state.phase);
    dequant_k_block<T, Config>(next, ring.stage(state.stage), bc, id, work);
  }
}

/// The consumers' main loop over the CTA's k-blocks into `acc` (zeroed first). A
/// registers of two k-blocks (4 k16 steps each): one block's wgmmas run while the next
/// block is dequantized into the other set; two blocks a turn, so that each register
/// set is named at compile time. The loop's state (`bc`, `state`) goes to its steps as
/// arguments: gathered with the rest in one struct, it compiled to other code (12-15%
/// fewer instructions in SASS with int zero points, 1-2% more without; unmeasured).
template <typename T, class Config>
__device__ __forceinline__ void consume_k_blocks(float (&acc)[Config::kAccumulators],
                                                 const StageRing<Config>& ring,
                                                 const FusedWork& work, const marlin::Params& p,
                                                 const ConsumerThread& id) {
  using Deq = IntDequant<T, 4>;
  BlockConstants<T> bc;
  const Pair<T> fixed = Deq::offset(static_cast<float>(Config::kZeroMode == kBias ? p.bias : 0));
  bc.offset[0] = bc.offset[1] = fixed;
  // Per-channel scales wait for the epilogue; the weights are multiplied by one (exact)
  // rather than branched around, so that one k-block's four words dequantize as one
  // stretch of code the compiler can interleave.
  const T one = static_cast<T>(1.f);
  bc.scale[0] = bc.scale[1] = Pair<T>{one, one};
#pragma unroll
  for (int i = 0; i < Config::kAccumulators; ++i) acc[i] = 0.f;
  // Pins the zeroing before the first wgmma: ptxas otherwise may sink it into the
  // pipeline and then serializes every wgmma (warning C7515).
  wgmma_fence_operands(acc);
  uint32_t a_regs[2][4][4];
  PipelineState state;
  if (work.kb_begin < work.kb_end) {
    ring.full[state.stage].wait(state.phase);
    dequant_k_block<T, Config>(a_regs[0], ring.stage(state.stage), bc, id, work);
  }
  for (int kb = work.kb_begin; kb < work.kb_end; kb += 2) {
    run_k_block<T, Config>(acc, kb, a_regs[0], a_regs[1], state, ring, work, bc, id);
    if (kb + 1 < work.kb_end) {
      run_k_block<T, Config>(acc, kb + 1, a_regs[1], a_regs[0], state, ring, work, bc, id);
    }
  }
  wgmma_wait_group<0>();
  wgmma_fence_operands(acc);
  keep_live(a_regs[0]);
  keep_live(a_regs[1]);
  if (work.kb_begin < work.kb_end && id.lane == 0) release_previous_stage(ring, state);
}

/// Split-K over a cluster: every CTA is done with its ring, so the partners write their
/// sums into the first CTA's, which adds them in rank order (run-to-run identical).
/// Returns whether this CTA holds the sum (rank 0) and goes on to store it.
template <class Config>
__device__ __forceinline__ bool sum_over_cluster(float (&acc)[Config::kAccumulators],
                                                 const StageRing<Config>& ring,
                                                 const FusedWork& work) {
  const int thread = static_cast<int>(threadIdx.x) - kWarpgroupThreads;
  auto* partials = reinterpret_cast<float4*>(ring.shared);
  cluster_sync();
  if (work.rank != 0) {
    send_cluster_partials(acc, partials, work.rank, thread, Config::kConsumerThreads);
  }
  cluster_sync();
  if (work.rank != 0) return false;
  add_cluster_partials(acc, partials, work.split - 1, thread, Config::kConsumerThreads);
  // Both consumers have read the partials before the epilogue writes over them.
  named_barrier(kConsumersBarrier, Config::kConsumerThreads);
  return true;
}

/// Split-K through global memory (split_k.cuh): every CTA stores its sums in its slot of
/// the tile's partials, and the last of the tile's CTAs to finish adds them all in
/// slice order (run-to-run identical; the same sums as sum_over_cluster's), staging the
/// others' in its ring, which both consumers are done with by then (the ring's first
/// bytes hold the flag that says which CTA is last). Returns whether this CTA holds the
/// sum and goes on to store it; it leaves the tile's counter at 0.
template <class Config>
__device__ __forceinline__ bool sum_over_slices(float (&acc)[Config::kAccumulators],
                                                const StageRing<Config>& ring,
                                                const FusedWork& work, const marlin::Params& p) {
  constexpr int kThreads = Config::kConsumerThreads;
  const int thread = static_cast<int>(threadIdx.x) - kWarpgroupThreads;
  float4* partials =
      reinterpret_cast<float4*>(p.partials) +
      static_cast<int64_t>(blockIdx.y) * work.split * (Config::kAccumulators / 4) * kThreads;
  store_split_partial(acc, partials, work.rank, thread, kThreads);
  int& last = *reinterpret_cast<int*>(ring.shared);
  named_barrier(kConsumersBarrier, kThreads);  // every partial stored, both consumers done
  if (thread == 0) last = last_to_arrive(p.counters + blockIdx.y, work.split);
  named_barrier(kConsumersBarrier, kThreads);
  if (!last) return false;
  add_partials_in_rank_order(acc, partials, work.rank, work.split, thread, kThreads,
                             reinterpret_cast<float4*>(ring.shared + Config::kSplitStagingOffset));
  if (thread == 0) p.counters[blockIdx.y] = 0;
  // Both consumers have read their staged partials before the epilogue writes over them.
  named_barrier(kConsumersBarrier, kThreads);
  return true;
}

/// The per-channel scales (one group over K) of the thread's weight columns
/// 16 w + g + 8 h of the 64 from `col_base` into `scale` (left alone with grouped
/// scales, which the dequantized weights already carry, and past N).
template <typename T>
__device__ __forceinline__ void channel_scales(float (&scale)[2], const marlin::Params& p,
                                               const FusedWork& work, const ConsumerThread& id,
                                               int col_base) {
  if (!work.grouped) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int col = col_base + 16 * id.warp + 8 * h + id.g;
      if (col < p.n) {
        const int position = col / 64 * 64 + marlin::channel_scale_position(col % 64);
        scale[h] = to_float(static_cast<const T*>(p.scales)[position]);
      }
    }
  }
}

/// The epilogue: each consumer's 64 columns go through a box in shared memory (the
/// ring's first bytes) and leave with one TMA store, which writes whole 128-byte row
/// pieces and clips the rows past M; 2-byte stores straight from the accumulators
/// half-filled every sector they touched.
template <typename T, class Config>
__device__ __forceinline__ void store_output_tile(const float (&acc)[Config::kAccumulators],
                                                  const StageRing<Config>& ring,
                                                  const FusedWork& work, const ConsumerThread& id,
                                                  const marlin::Params& p,
                                                  const CUtensorMap& map_c) {
  const int col_base = work.col0 + id.consumer * 64;
  float scale[2] = {1.f, 1.f};
  channel_scales<T>(scale, p, work, id, col_base);
  uint8_t* box = ring.shared + id.consumer * Config::kOutBoxBytes;
  // acc[4 j + 2 h + e] is weight column 16 w + g + 8 h (of the consumer's 64) and token
  // 8 j + 2 t + e: the box holds c's rows, [kTokens][64].
  stage_transposed_box<T, Config::kTokens>(shared_address(box), id.warp, id.lane,
                                           [&](int i, int h) { return acc[i] * scale[h]; });
  fence_shared_for_tma();
  warpgroup_barrier(1 + id.consumer);
  if (threadIdx.x % kWarpgroupThreads == 0 && col_base < p.n) {
    tma_store_2d(&map_c, box, col_base, work.token0);
    tma_store_commit();
    // Shared memory must outlive the store's reads; the writes complete with the grid.
    tma_store_wait_read<0>();
  }
}

/// The fused kernel (see the file comment): warpgroup 0 produces, warpgroups 1 and 2
/// consume the ring, sum over the K slices when K is split (in a cluster, or through
/// global memory: kSumsInMemory, a kernel of its own so that the cluster's code is
/// as it was), and store their columns.
template <typename T, typename Config, bool kSumsInMemory>
__global__ void __launch_bounds__(Config::kThreads, Config::kCtasPerSm)
    marlin_wgmma_kernel(const __grid_constant__ CUtensorMap map_a,
                        const __grid_constant__ CUtensorMap map_w,
                        const __grid_constant__ CUtensorMap map_s,
                        const __grid_constant__ CUtensorMap map_z,
                        const __grid_constant__ CUtensorMap map_c, const marlin::Params p,
                        const int first_tile) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t shared_raw[];
  const StageRing<Config> ring(shared_raw);
  const FusedWork work = fused_work<Config, kSumsInMemory>(p, first_tile);
  if (threadIdx.x == 0) {
    // The tensor maps' first fetches overlap the set-up instead of each one's first
    // copy (the epilogue's store map too).
    tma_prefetch_map(&map_a);
    tma_prefetch_map(&map_w);
    if (work.grouped) tma_prefetch_map(&map_s);
    if constexpr (Config::kZeroMode == kIntZero) tma_prefetch_map(&map_z);
    tma_prefetch_map(&map_c);
    ring.init_barriers();
  }
  __syncthreads();
  // A tail launch (overlap_previous) of this kernel may take the SMs this launch's CTAs
  // leave: it writes other output tiles.
  allow_dependent_launch();

  const int warpgroup = static_cast<int>(threadIdx.x) / kWarpgroupThreads;
  if (warpgroup == 0) {
    run_producer<Config, kSumsInMemory>(ring, work, p, map_a, map_w, map_s, map_z);
  } else {
    warpgroup_claim_registers<Config::kConsumerRegisters>();
    const ConsumerThread id(warpgroup);
    float acc[Config::kAccumulators];
    consume_k_blocks<T>(acc, ring, work, p, id);
    if (work.split > 1) {
      if constexpr (kSumsInMemory) {
        if (!sum_over_slices(acc, ring, work, p)) return;
      } else {
        if (!sum_over_cluster(acc, ring, work)) return;
      }
    }
    store_output_tile<T>(acc, ring, work, id, p, map_c);
  }
#endif
}

/// An unswizzled tensor map of a row-major matrix [rows, cols] of `element_bytes`
/// elements, boxes of `box_rows` x `box_cols`.
inline CUtensorMap plain_map(const void* data, int64_t rows, int64_t cols, uint32_t element_bytes,
                             CUtensorMapDataType type, int box_rows, int box_cols) {
  return tma_map_2d(TmaMatrix{data, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols),
                              static_cast<uint64_t>(cols) * element_bytes,
                              static_cast<uint32_t>(box_rows), static_cast<uint32_t>(box_cols),
                              type, element_bytes, CU_TENSOR_MAP_SWIZZLE_NONE});
}

}  // namespace marlin_wgmma

/// c = a @ dequant(b) for 4-bit weights (uint4b8, or uint4 with int zero points:
/// `ZeroMode`), no act-order, on sm_90a; see the file comment. The operands are
/// gptq_marlin_gemm's, checked by check_operands (`a`'s rows on 16-byte boundaries, c
/// [M, N] contiguous). Group size 0: per-channel scales. Runs output tiles [first_tile,
/// first_tile + tiles) (numbered token tile first), K split over `split` CTAs (at most the
/// build's kMaxSplit), whose sums meet in a cluster, or with `partials` (fp32, at least
/// tiles x split x kPartialBytes / 4 floats) there and in the first `tiles` counters of
/// `workspace` (zero before and after). c must start on a 16-byte
/// boundary (TMA stores: the caller passes an aligned buffer). With `overlap_previous` the launch
/// may start while the previous kernel on the stream still runs, which must be this kernel on other
/// tiles of the same product (a tail launch).
template <typename T, int kTokens, int ZeroMode>
void gptq_marlin_gemm_wgmma(TensorView a, TensorView b_q_weight, TensorView b_scales,
                            tvm::ffi::Optional<TensorView> b_zeros, TensorView workspace,
                            TensorView c, int64_t size_m, int64_t size_n, int64_t size_k,
                            int64_t bias, int64_t split, int64_t first_tile, int64_t tiles,
                            bool overlap_previous, tvm::ffi::Optional<TensorView> partials) {
  using namespace marlin;
  using Config = marlin_wgmma::FusedConfig<T, kTokens, ZeroMode>;
  SymbolicDevice device;
  Params p =
      check_operands(device, a, c, b_q_weight, b_scales, tvm::ffi::Optional<TensorView>(), b_zeros,
                     tvm::ffi::Optional<TensorView>(), tvm::ffi::Optional<TensorView>(), workspace,
                     dtype_trait<T>::value, 4, ZeroMode, false, size_m, size_n, size_k, true, bias);
  RuntimeCheck(reinterpret_cast<uintptr_t>(p.c) % 16 == 0,
               "gptq_marlin_gemm: the fused kernel's c must start on a 16-byte boundary");
  if (size_m == 0) return;

  constexpr auto kType = std::is_same_v<T, bf16_t> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                   : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const CUtensorMap map_a =
      tma_map_2d(TmaMatrix{p.a, static_cast<uint64_t>(size_m), static_cast<uint64_t>(size_k),
                           static_cast<uint64_t>(p.lda) * sizeof(T), static_cast<uint32_t>(kTokens),
                           static_cast<uint32_t>(kSwizzle128Bytes / sizeof(T)), kType, sizeof(T)});
  const CUtensorMap map_w = marlin_wgmma::plain_map(
      p.b, size_k / 16, size_n * 2, 4, CU_TENSOR_MAP_DATA_TYPE_INT32, 4, Config::kCols * 2);
  const int rows = marlin_wgmma::group_rows_per_block(p.group_shift);
  const CUtensorMap map_s = p.group_shift >= 0
                                ? marlin_wgmma::plain_map(p.scales, p.groups, size_n, sizeof(T),
                                                          kType, rows, Config::kCols)
                                : CUtensorMap{};
  const CUtensorMap map_z =
      ZeroMode == kIntZero
          ? marlin_wgmma::plain_map(p.zeros, p.groups, size_n / 8, 4, CU_TENSOR_MAP_DATA_TYPE_INT32,
                                    rows, Config::kCols / 8)
          : CUtensorMap{};
  // The output: this CTA's consumers each store a [kTokens][64] box.
  const CUtensorMap map_c = tma_map_2d(
      TmaMatrix{p.c, static_cast<uint64_t>(size_m), static_cast<uint64_t>(size_n),
                static_cast<uint64_t>(size_n) * sizeof(T), static_cast<uint32_t>(kTokens),
                static_cast<uint32_t>(kSwizzle128Bytes / sizeof(T)), kType, sizeof(T)});
  RuntimeCheck(Config::kSharedBytes <= max_shared_memory_per_block(device.value()),
               "gptq_marlin_gemm: the fused kernel needs ", Config::kSharedBytes,
               " bytes of shared memory, more than the device's ",
               max_shared_memory_per_block(device.value()));
  RuntimeCheck(split >= 1 && split <= Config::kMaxSplit, "gptq_marlin_gemm: split ", split,
               " is outside [1, ", Config::kMaxSplit, "] for ", kTokens, " tokens per CTA");
  const int64_t all_tiles =
      div_ceil<int64_t>(size_m, kTokens) * div_ceil<int64_t>(size_n, Config::kCols);
  RuntimeCheck(first_tile >= 0 && tiles >= 0 && first_tile + tiles <= all_tiles && tiles <= 65535,
               "gptq_marlin_gemm: tiles [", first_tile, ", ", first_tile + tiles,
               ") are not within the ", all_tiles, " output tiles (or more than 65535)");
  const bool in_cluster = split > 1 && !partials.has_value();
  if (partials.has_value()) {
    RuntimeCheck(workspace.size(0) >= tiles, "gptq_marlin_gemm: a split launch of ", tiles,
                 " tiles needs as many counters, the workspace has ", workspace.size(0));
    TensorMatcher({kAnySize})
        .dtype<fp32_t>()
        .device(kDLCUDA, device)
        .contiguous()
        .verify(*partials, "partials");
    const int64_t floats = tiles * split * static_cast<int64_t>(Config::kPartialBytes / 4);
    RuntimeCheck((*partials).size(0) >= floats, "gptq_marlin_gemm: partials of ",
                 (*partials).size(0), " floats, a split launch needs ", floats);
    p.partials = data_ptr<float>(*partials);
    RuntimeCheck(reinterpret_cast<uintptr_t>(p.partials) % 16 == 0,
                 "gptq_marlin_gemm: partials must be 16-byte aligned (float4 slots)");
    // The counters are the launch's own until its last CTA leaves them at zero: a launch
    // that overlaps the previous one would count into that one's.
    RuntimeCheck(!overlap_previous,
                 "gptq_marlin_gemm: a launch whose slices sum in memory cannot overlap the "
                 "previous one");
  }
  if (tiles == 0) return;
  const dim3 grid(static_cast<unsigned>(split), static_cast<unsigned>(tiles));
  auto* kernel = partials.has_value() ? marlin_wgmma::marlin_wgmma_kernel<T, Config, true>
                                      : marlin_wgmma::marlin_wgmma_kernel<T, Config, false>;
  KernelLauncher(grid, dim3(Config::kThreads), device.value(), Config::kSharedBytes)
      .cluster(in_cluster ? static_cast<unsigned>(split) : 1u)
      .overlap_previous(overlap_previous)(kernel, map_a, map_w, map_s, map_z, map_c, p,
                                          static_cast<int>(first_tile));
}

}  // namespace mllm_kernel::cuda
