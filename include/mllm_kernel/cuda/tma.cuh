// The Tensor Memory Accelerator (TMA, sm_90): 2-D tensor maps built on the host and
// tile copies global -> shared that complete on an mbarrier.
//
// A tensor map describes a row-major matrix (rows x cols, a row pitch in bytes that
// is a multiple of 16) and the box one copy moves. Pass it to the kernel by value as
// a `const __grid_constant__ CUtensorMap` parameter; rows and columns outside the
// matrix read as zeros, so tiles need no bounds checks on the load side.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums: types only, the driver is reached at run time
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <mutex>

#include "mllm_kernel/cuda/mbarrier.cuh"
#include "mllm_kernel/utils.hpp"

namespace mllm_kernel::cuda {

// ---------------------------------------------------------------------------
// Device side.
// ---------------------------------------------------------------------------

/// Copies the box at (column `col`, row `row`) of `map` into `shared` (1024-byte
/// aligned for the 128-byte swizzle) and counts its bytes on `barrier`.
__device__ __forceinline__ void tma_load_2d(void* shared, const CUtensorMap* map, MBarrier* barrier,
                                            int32_t col, int32_t row) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];" ::"r"(shared_address(shared)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(shared_address(barrier)), "r"(col), "r"(row)
      : "memory");
}

/// Like tma_load_2d, but the box lands at the same shared-memory offset in every CTA
/// of the cluster named in `cta_mask` (bit i: rank i), each counting its bytes on its
/// own barrier at `barrier`'s offset.
__device__ __forceinline__ void tma_load_2d_multicast(void* shared, const CUtensorMap* map,
                                                      MBarrier* barrier, int32_t col, int32_t row,
                                                      uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(shared_address(shared)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(shared_address(barrier)), "r"(col), "r"(row),
      "h"(cta_mask)
      : "memory");
}

/// Where byte `byte` of row `row` of a tile of 128-byte rows lies within that row under
/// TMA's 128-byte swizzle: 16-byte piece p of row r lands at piece p ^ (r % 8), so the
/// same piece of 8 consecutive rows falls in 8 different bank groups.
__device__ __forceinline__ int swizzle_128b(int row, int byte) {
  return (((byte / 16) ^ (row % 8)) * 16) + byte % 16;
}

/// Makes this thread's ordinary shared-memory writes visible to TMA (the async proxy);
/// then a barrier, then one thread issues the store that reads them.
__device__ __forceinline__ void fence_shared_for_tma() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

/// Copies the box at (column `col`, row `row`) of `map` from `shared` to global memory;
/// rows and columns outside the matrix are not written. Completes asynchronously, in
/// bulk groups of this thread: tma_store_commit(), then tma_store_wait_read<N>() before
/// `shared` is written again, tma_store_wait<0>() before the CTA exits.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* shared,
                                             int32_t col, int32_t row) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(shared_address(shared)), "r"(col), "r"(row)
               : "memory");
}

__device__ __forceinline__ void tma_store_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

/// Waits until at most `kPending` of this thread's store groups still read shared memory.
template <int kPending>
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}

/// Waits until at most `kPending` of this thread's store groups are unfinished.
template <int kPending>
__device__ __forceinline__ void tma_store_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(kPending) : "memory");
}

/// Fetches the tensor map into the constant cache ahead of its first use.
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// ---------------------------------------------------------------------------
// Host side.
// ---------------------------------------------------------------------------

/// What a 2-D tensor map covers: the matrix and the box one copy moves.
struct TmaMatrix {
  const void* data;
  uint64_t rows;
  uint64_t cols;
  uint64_t row_pitch_bytes;  // a multiple of 16
  uint32_t box_rows;         // at most 256
  uint32_t box_cols;         // box_cols * element size <= 128 for the 128-byte swizzle
  CUtensorMapDataType dtype;
  uint32_t element_bytes;
  // The 128-byte swizzle is how wgmma reads K-major tiles; data that threads read
  // themselves (packed weights, scales) lands unswizzled, with a box row of at most 256
  // elements and a multiple of 16 bytes.
  CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B;

  bool operator==(const TmaMatrix&) const = default;
};

namespace tma_detail {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/// cuTensorMapEncodeTiled, looked up through the runtime once: no link to libcuda.
inline EncodeTiled encode_tiled(source_location loc) {
  static EncodeTiled function = [] {
    void* address = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &address, 12000,
                                         cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      address = nullptr;
    }
    return reinterpret_cast<EncodeTiled>(address);
  }();
  if (function == nullptr) {
    mllm_kernel::detail::throw_error(
        "RuntimeError",
        "the CUDA driver has no cuTensorMapEncodeTiled (TMA needs a driver "
        "for CUDA 12.0 or newer)",
        loc);
  }
  return function;
}

inline CUtensorMap encode_tma_2d(const TmaMatrix& m, source_location loc) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {m.cols, m.rows};
  const cuuint64_t pitches[1] = {m.row_pitch_bytes};
  const cuuint32_t box[2] = {m.box_cols, m.box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult status =
      encode_tiled(loc)(&map, m.dtype, 2, const_cast<void*>(m.data), dims, pitches, box,
                        element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, m.swizzle,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS) {
    mllm_kernel::detail::throw_error(
        "RuntimeError",
        mllm_kernel::detail::concat("cuTensorMapEncodeTiled failed (CUresult ", int(status),
                                    ") for a ", m.rows, " x ", m.cols, " matrix with row pitch ",
                                    m.row_pitch_bytes, " bytes and a ", m.box_rows, " x ",
                                    m.box_cols, " box"),
        loc);
  }
  return map;
}

}  // namespace tma_detail

/// The tensor map of `matrix`, encoded once per (pointer, shape,
/// box): a decode loop calls a GEMM on the same weights every step, and encoding
/// costs more than the lookup. A small direct-mapped table; a collision re-encodes.
inline CUtensorMap tma_map_2d(const TmaMatrix& matrix,
                              source_location loc = source_location::current()) {
  struct Entry {
    TmaMatrix key{};
    CUtensorMap map{};
    bool used = false;
  };
  static std::mutex mutex;
  static std::array<Entry, 256> table;
  const auto bits = reinterpret_cast<uintptr_t>(matrix.data);
  const size_t slot = ((bits >> 8) ^ (matrix.rows * 31) ^ (matrix.cols * 17) ^ matrix.box_rows ^
                       (matrix.row_pitch_bytes << 3)) %
                      table.size();
  const std::lock_guard<std::mutex> lock(mutex);
  Entry& entry = table[slot];
  if (!entry.used || !(entry.key == matrix)) {
    entry.map = tma_detail::encode_tma_2d(matrix, loc);
    entry.key = matrix;
    entry.used = true;
  }
  return entry.map;
}

}  // namespace mllm_kernel::cuda
