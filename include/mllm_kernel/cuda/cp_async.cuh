// cp.async (sm_80 and newer): 16-byte (and 8-byte) copies global -> shared that bypass
// registers (and, at 16 bytes, L1), so a thread can issue many before waiting for any.
// Copies issued since the last commit form a group; a thread waits for its own groups,
// and other threads see the data after a barrier.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mllm_kernel::cuda {

/// Copies 16 bytes global -> shared; nothing is copied (and `dst` is left as it was)
/// when `valid` is false.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid = true) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile(
      "{\n"
      "  .reg .pred p;\n"
      "  setp.ne.b32 p, %2, 0;\n"
      "  @p cp.async.cg.shared.global [%0], [%1], 16;\n"
      "}\n" ::"r"(address),
      "l"(src), "r"(static_cast<int>(valid))
      : "memory");
}

/// Copies 16 bytes global -> shared, or writes 16 zero bytes when `valid` is false
/// (`src` must still be a valid address). Unlike cp_async_16's predicate, the source
/// size operand costs no extra instructions.
__device__ __forceinline__ void cp_async_16_or_zero(void* dst, const void* src, bool valid) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}

/// Copies 8 bytes global -> shared (cp.async's 8-byte form, which caches in L1 too:
/// .ca; .cg takes 16-byte copies only), for pieces smaller than a 16-byte chunk such
/// as a lane's NVFP4 scale bytes of a Marlin tile (marlin_nvfp4.cuh).
__device__ __forceinline__ void cp_async_8(void* dst, const void* src) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(address), "l"(src) : "memory");
}

/// Asks L2 to fetch the 128-byte line holding `src` (nothing to wait for; a later load
/// of it then waits for L2, not for memory).
__device__ __forceinline__ void prefetch_l2_line(const void* src) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(src) : "memory");
}

/// Closes the group of copies issued by this thread since the last commit.
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/// Waits until at most `Pending` committed groups of this thread are still in flight.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

/// Commits this thread's open copies and waits for all of them.
__device__ __forceinline__ void cp_async_wait_all() {
  cp_async_commit();
  cp_async_wait<0>();
}

}  // namespace mllm_kernel::cuda
