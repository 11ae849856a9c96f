// Shared-memory barriers (mbarrier) for producer/consumer pipelines on sm_90: a
// barrier completes a phase when its expected arrivals have arrived and, for TMA,
// the expected bytes have landed. Waiters name the phase by its parity (0, 1, 0, ...).
//
//   __shared__ MBarrier full;
//   if (threadIdx.x == 0) { full.init(1); mbarrier_init_fence(); }
//   __syncthreads();
//   producer: full.arrive_expect_tx(bytes); tma_load_2d(..., &full, ...);
//   consumer: full.wait(phase);  // then reads the tile
#pragma once

#include <cstdint>

namespace mllm_kernel::cuda {

/// The shared-memory (state space) address of a generic pointer into shared memory.
__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

/// One 8-byte mbarrier in shared memory.
struct alignas(8) MBarrier {
  uint64_t state;

  /// Sets the arrivals each phase expects. One thread, before any use; then
  /// mbarrier_init_fence() and a CTA (or cluster) barrier.
  __device__ __forceinline__ void init(uint32_t arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(this)),
                 "r"(arrivals)
                 : "memory");
  }

  /// Arrives once and expects `bytes` more of asynchronous copies this phase.
  __device__ __forceinline__ void arrive_expect_tx(uint32_t bytes) {
    asm volatile(
        "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(this)),
        "r"(bytes)
        : "memory");
  }

  /// Arrives once (release: this thread's earlier accesses are seen by the waiters).
  __device__ __forceinline__ void arrive() {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(this)) : "memory");
  }

  /// Arrives once on the barrier at this one's offset in the shared memory of the
  /// cluster's CTA `rank`. Relaxed: it orders none of this thread's memory accesses,
  /// so use it where completion is known otherwise (a wgmma wait before releasing the
  /// operands it read). A release at cluster scope fences every earlier access, and
  /// stalled a pipeline that arrived once per stage (H100: 2.3x slower GEMM).
  __device__ __forceinline__ void arrive_cluster_relaxed(uint32_t rank) {
    asm volatile(
        "{\n.reg .b32 remote;\n"
        "mapa.shared::cluster.u32 remote, %0, %1;\n"
        "mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [remote];\n}" ::"r"(
            shared_address(this)),
        "r"(rank)
        : "memory");
  }

  /// True once the phase of `parity` has completed (acquire).
  __device__ __forceinline__ bool try_wait(uint32_t parity) {
    uint32_t done;
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(shared_address(this)), "r"(parity)
        : "memory");
    return done != 0;
  }

  /// Blocks until the phase of `parity` has completed. A fresh barrier counts the
  /// phase before its first as complete: wait(1) returns at once, wait(0) blocks.
  __device__ __forceinline__ void wait(uint32_t parity) {
    while (!try_wait(parity)) {
    }
  }
};

/// Makes barrier initialisation visible to the async proxy (TMA) and to the other
/// CTAs of a cluster; the initialising thread calls it before the CTA/cluster barrier.
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/// A ring of `stages` buffers and the position of one party (producer or consumer)
/// in it: the stage it is at and the parity of that stage's current phase.
struct PipelineState {
  int stage = 0;
  uint32_t phase = 0;

  __device__ __forceinline__ void advance(int stages) {
    if (++stage == stages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

}  // namespace mllm_kernel::cuda
