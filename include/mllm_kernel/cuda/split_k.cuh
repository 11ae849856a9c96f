// Split-K through global memory, for a launch without clusters: the `split` CTAs of an
// output tile each hold the sums of their share of K in registers, N accumulators in
// each of `threads` threads. Each stores them in its slot of the tile's partials
// (store_split_partial), counts itself in the tile's counter (last_to_arrive), and the
// last to arrive adds every slot in rank order (add_partials_in_rank_order), its own
// sums in their place: the same result whichever CTA finishes last, and the same as
// cluster.cuh's sum over a cluster (rank 0's sums plus the others in rank order).
//
// Against a cluster's sum it lets the block scheduler place every CTA where it likes: a
// cluster must fit one GPC, so clusters of about one CTA an SM pair CTAs on some SMs
// while others idle, and those CTAs' main loops take up to twice the others'.
//
// The streaming Marlin kernel (gptq_marlin.cu) and the sm_80 GEMM (gemm_sm80.cu) count
// their slices with last_to_arrive too, over partials laid out their own way.
#pragma once

#include "mllm_kernel/cuda/cp_async.cuh"

namespace mllm_kernel::cuda {

/// A tile's partials: `split` slots of N / 4 float4 per thread, thread-minor (each
/// store and load of a warp is contiguous).
template <int N, typename F4>
__device__ __forceinline__ F4* split_slot(F4* partials, int rank, int threads) {
  return partials + static_cast<int64_t>(rank) * (N / 4) * threads;
}

/// Stores this thread's N accumulators in slot `rank` of the tile's `partials` (through
/// L2: the last CTA reads them there).
template <int N>
__device__ __forceinline__ void store_split_partial(const float (&acc)[N], float4* partials,
                                                    int rank, int thread, int threads) {
  static_assert(N % 4 == 0, "accumulators go as vectors of 4");
  float4* slot = split_slot<N>(partials, rank, threads);
#pragma unroll
  for (int v = 0; v < N / 4; ++v) {
    __stcg(slot + v * threads + thread,
           float4{acc[4 * v], acc[4 * v + 1], acc[4 * v + 2], acc[4 * v + 3]});
  }
}

/// One thread of a CTA whose threads have all stored their partials and then met at a
/// barrier: counts the CTA in the tile's `counter` and returns whether it is the last of
/// the `split` to arrive. The add releases the CTA's stores at GPU scope (the barrier
/// orders the other threads' before it) and acquires the others' for the last CTA, whose
/// threads read them after a barrier; one round trip in all, where a fence per thread
/// and then the add took two. The last CTA must leave the counter at 0.
__device__ __forceinline__ bool last_to_arrive(int32_t* counter, int split) {
  int32_t before;
  asm volatile("atom.add.acq_rel.gpu.global.s32 %0, [%1], 1;"
               : "=r"(before)
               : "l"(counter)
               : "memory");
  return before == split - 1;
}

/// The last CTA to arrive: adds every slot of the tile's `partials` in rank order into
/// this thread's accumulators, its own (`rank`) in its place. The other slots' vectors
/// of this thread are first copied into `staging` (shared memory, (split - 1) N / 4
/// float4 per thread, thread-minor), all at once: one round trip to L2, not one per
/// slot. Only this thread reads what it copied, so no barrier is needed before; the
/// caller's barrier must precede any other use of `staging`.
template <int N>
__device__ __forceinline__ void add_partials_in_rank_order(float (&acc)[N], const float4* partials,
                                                           int rank, int split, int thread,
                                                           int threads, float4* staging) {
  for (int r = 0, staged = 0; r < split; ++r) {
    if (r == rank) continue;
    const float4* slot = split_slot<N>(partials, r, threads);
#pragma unroll
    for (int v = 0; v < N / 4; ++v) {
      cp_async_16(staging + (staged * (N / 4) + v) * threads + thread, slot + v * threads + thread);
    }
    ++staged;
  }
  cp_async_wait_all();
#pragma unroll
  for (int v = 0; v < N / 4; ++v) {
    const float4 own{acc[4 * v], acc[4 * v + 1], acc[4 * v + 2], acc[4 * v + 3]};
    // slot r is staged at r, or r - 1 past this CTA's own
    auto slot = [&](int r) {
      return r == rank ? own : staging[((r - (r > rank)) * (N / 4) + v) * threads + thread];
    };
    float4 sum = slot(0);
    for (int r = 1; r < split; ++r) {
      const float4 x = slot(r);
      sum = float4{sum.x + x.x, sum.y + x.y, sum.z + x.z, sum.w + x.w};
    }
    acc[4 * v] = sum.x;
    acc[4 * v + 1] = sum.y;
    acc[4 * v + 2] = sum.z;
    acc[4 * v + 3] = sum.w;
  }
}

}  // namespace mllm_kernel::cuda
