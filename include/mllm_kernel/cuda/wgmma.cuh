// Warpgroup MMA (wgmma, sm_90a): shared-memory matrix descriptors, the fences and
// group waits around wgmma.mma_async, and warpgroup register reallocation.
//
// A warpgroup is 4 consecutive warps starting at a warp index divisible by 4. One
// k-step of a tile, with both operands K-major in 128-byte-swizzled shared memory
// (as tma_load_2d leaves them, 64 16-bit or 128 int8 elements per 128-byte row):
//
//   wgmma_fence();
//   for (int k = 0; k < 4; ++k)   // 128 bytes = 4 k-steps of 32 (k16 16-bit, k32 int8)
//     wgmma_k_step<T, N>(acc, smem_desc_k_major_sw128(a_tile, k),
//                        smem_desc_k_major_sw128(b_tile, k));
//   wgmma_commit_group();
//   wgmma_wait_group<0>();        // acc readable, the tiles reusable
//   wgmma_fence_operands(acc);
//
// wgmma_k_block_sw128 is the fence, the k-steps and the commit of one such k-block.
#pragma once

#include <cstdint>

#include "mllm_kernel/cuda/mbarrier.cuh"
#include "mllm_kernel/cuda/wgmma_mma.cuh"

namespace mllm_kernel::cuda {

/// Threads in a warpgroup.
inline constexpr int kWarpgroupThreads = 128;

/// Bytes of one 128-byte swizzled row (64 16-bit or 128 8-bit elements): a tile's K
/// extent per copy.
inline constexpr int kSwizzle128Bytes = 128;

/// The descriptor of a K-major tile in shared memory, rows of 128 bytes swizzled in
/// 8-row (1024-byte) atoms, starting `k16` k-steps of 32 bytes (16 16-bit or 32 8-bit
/// elements) into the row. The tile must be 1024-byte aligned.
///
/// Fields: start address >> 4 (bits 0-13); leading byte offset >> 4 (16-29), unused
/// when one swizzled row holds the whole k-step; stride byte offset >> 4 (32-45), the
/// distance between 8-row atoms; swizzle mode (62-63), 1 = 128 bytes.
__device__ __forceinline__ uint64_t smem_desc_k_major_sw128(const void* tile, int k16) {
  const uint64_t address = shared_address(tile) + static_cast<uint32_t>(k16) * 32;
  return ((address & 0x3FFFF) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

/// `desc` (a shared-memory descriptor) moved on by `bytes`, a multiple of 16: the start
/// address is the low field, and shared addresses (< 256 KiB) never carry out of it.
/// One add where a new descriptor costs the masks and shifts again.
__device__ __forceinline__ uint64_t smem_desc_advance(uint64_t desc, int bytes) {
  return desc + static_cast<uint64_t>(bytes >> 4);
}

/// Orders earlier register and shared-memory accesses before the next wgmma.mma_async.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

/// Closes the wgmma.mma_async operations issued since the last commit into a group.
__device__ __forceinline__ void wgmma_commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

/// Waits until at most `kPending` committed groups are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

/// One 128-byte k-block of K-major tiles in 128-byte-swizzled shared memory (A: 64
/// rows, B: N rows, as tma_load_2d leaves them): its k-steps of 32 bytes, fenced and
/// closed into one commit group.
template <typename T, int N, typename Acc>
__device__ __forceinline__ void wgmma_k_block_sw128(Acc (&acc)[N / 2], const T* tile_a,
                                                    const T* tile_b) {
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < kSwizzle128Bytes / 32; ++k) {
    wgmma_k_step<T, N>(acc, smem_desc_k_major_sw128(tile_a, k), smem_desc_k_major_sw128(tile_b, k));
  }
  wgmma_commit_group();
}

/// Keeps the compiler from moving accesses to the accumulators across a wgmma wait:
/// the asm that writes them asynchronously names them, the wait does not.
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(float (&acc)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(acc[i])::"memory");
}
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(int32_t (&acc)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(acc[i])::"memory");
}

/// A barrier over `threads` threads (a multiple of 32): hardware barrier `id` (1-15; 0
/// is __syncthreads), so groups of warps of a CTA synchronise independently.
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

/// A barrier over the 128 threads of one warpgroup (hardware barrier `id`).
__device__ __forceinline__ void warpgroup_barrier(int id) {
  named_barrier(id, kWarpgroupThreads);
}

/// Stores four 8x8 b16 matrices to shared memory transposed: lane i gives the
/// shared-memory address of row i % 8 of matrix i / 8, and holds, in frag[m], the
/// pair (2 (i % 4), 2 (i % 4) + 1) of row i / 4 of matrix m, an mma accumulator pair.
/// Row r in shared memory receives column r of the matrix: an accumulator tile of
/// wgmma (rows x columns) lands as columns x rows.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t shared_address,
                                                  const uint32_t (&frag)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(
                   shared_address),
               "r"(frag[0]), "r"(frag[1]), "r"(frag[2]), "r"(frag[3])
               : "memory");
}

/// Gives registers back (producer warpgroups, which need few) or takes them (consumer
/// warpgroups holding accumulators). Takes effect only in a kernel with a register cap
/// at entry: __launch_bounds__(threads, 1).
template <int kRegisters>
__device__ __forceinline__ void warpgroup_release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void warpgroup_claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

}  // namespace mllm_kernel::cuda
