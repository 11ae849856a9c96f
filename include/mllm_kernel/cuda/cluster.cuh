// Thread-block clusters (sm_90): the CTA's rank, a barrier over every thread of the
// cluster, and access to another CTA's shared memory (distributed shared memory).
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

}  // namespace mllm_kernel::cuda
