// Thread-block clusters (sm_90): the CTA's rank, a barrier over every thread of the
// cluster, access to another CTA's shared memory (distributed shared memory), and
// split-K sums: gathered into the first CTA's shared memory, or reduce-scattered (each
// CTA sums its share of the outputs over all of them: cluster_sum).
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

namespace mllm_kernel::cuda {

/// This CTA's rank in its cluster (0 without a cluster launch).
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}

/// CTAs in this CTA's cluster (1 without a cluster launch).
__device__ __forceinline__ uint32_t cluster_size() {
  uint32_t size;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(size));
  return size;
}

/// Every thread of every CTA in the cluster arrives, then waits for all the others;
/// shared-memory writes before it (local or remote) are visible after it. Threads may
/// call it from divergent branches (the non-.aligned form), but each must call it the
/// same number of times.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}

/// `pointer` (into this CTA's shared memory) mapped to the same offset in the shared
/// memory of the cluster's CTA `rank`: plain loads and stores through it reach that CTA.
template <typename T>
__device__ __forceinline__ T* cluster_map_shared(T* pointer, uint32_t rank) {
  return cooperative_groups::this_cluster().map_shared_rank(pointer, rank);
}

/// The most CTAs a cluster holds (Hopper, with the non-portable size allowed).
inline constexpr int kMaxClusterSize = 16;

/// Split-K over a cluster, reduce-scatter form: the sum over the cluster's first `ranks`
/// CTAs, in rank order (the same from run to run), of the float4 at `local` (this CTA's
/// shared memory) and at the same offset in theirs. All loads issue before the first
/// add: one round trip through distributed shared memory, not `ranks`. Between two
/// cluster_sync() calls: after the partners' writes, before any of them leaves.
/// 1 <= ranks <= MaxRanks.
template <int MaxRanks = kMaxClusterSize>
__device__ __forceinline__ float4 cluster_sum(const float4* local, int ranks) {
  const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(local));
  float4 v[MaxRanks];
#pragma unroll
  for (int rank = 0; rank < MaxRanks; ++rank) {
    if (rank == 0 || rank < ranks) {
      uint32_t remote;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(address), "r"(rank));
      asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                   : "=f"(v[rank].x), "=f"(v[rank].y), "=f"(v[rank].z), "=f"(v[rank].w)
                   : "r"(remote));
    }
  }
  float4 sum = v[0];
#pragma unroll
  for (int rank = 1; rank < MaxRanks; ++rank) {
    if (rank < ranks) {
      sum = float4{sum.x + v[rank].x, sum.y + v[rank].y, sum.z + v[rank].z, sum.w + v[rank].w};
    }
  }
  return sum;
}

/// Split-K over a cluster, part 1: a CTA of rank > 0 stores its `N` accumulators (as
/// N / 4 vectors of `Vec4`; this thread is `thread` of `threads` that hold them) into
/// slot `rank - 1` of `partials`, which lies in the shared memory of rank 0. Then a
/// cluster_sync(), then add_cluster_partials() in rank 0.
template <typename Vec4, typename Acc, int N>
__device__ __forceinline__ void send_cluster_partials(const Acc (&acc)[N], Vec4* partials, int rank,
                                                      int thread, int threads) {
  static_assert(N % 4 == 0, "accumulators go as vectors of 4");
  Vec4* slot = cluster_map_shared(partials, 0) + (rank - 1) * (N / 4) * threads;
#pragma unroll
  for (int v = 0; v < N / 4; ++v) {
    slot[v * threads + thread] = Vec4{acc[4 * v], acc[4 * v + 1], acc[4 * v + 2], acc[4 * v + 3]};
  }
}

/// Split-K over a cluster, part 2 (rank 0): adds the `partners` slots that
/// send_cluster_partials() filled to this thread's accumulators, in rank order, so the
/// sum is the same from run to run.
template <typename Vec4, typename Acc, int N>
__device__ __forceinline__ void add_cluster_partials(Acc (&acc)[N], const Vec4* partials,
                                                     int partners, int thread, int threads) {
  for (int partner = 0; partner < partners; ++partner) {
#pragma unroll
    for (int v = 0; v < N / 4; ++v) {
      const Vec4 x = partials[(partner * (N / 4) + v) * threads + thread];
      acc[4 * v] += x.x;
      acc[4 * v + 1] += x.y;
      acc[4 * v + 2] += x.z;
      acc[4 * v + 3] += x.w;
    }
  }
}

}  // namespace mllm_kernel::cuda
