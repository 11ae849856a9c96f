// Warp-level tensor-core building blocks of sm_80 and newer: ldmatrix for A and B
// fragments, mma.sync m16n8k16 with fp32 accumulation, m16n8k32 on int8 with int32
// accumulation, and movmatrix transposes of accumulator blocks (the copies that feed
// them are in cp_async.cuh).
//
// Fragment layouts of m16n8k16 (lane = threadIdx.x % 32, g = lane / 4, t = lane % 4):
//   A (16 x 16, row-major)  a[0]: rows g,   k 2t..2t+1   a[1]: rows g+8, k 2t..2t+1
//                           a[2]: rows g,   k 2t+8..+9   a[3]: rows g+8, k 2t+8..+9
//   B (16 x 8, "col")       b[0]: k 2t..2t+1, col g      b[1]: k 2t+8..2t+9, col g
//   C (16 x 8, fp32)        c[0..1]: row g, cols 2t..2t+1  c[2..3]: row g+8, same cols
// m16n8k32 on int8 has the same layouts counted in bytes (a register holds 4 int8 of K
// where it held 2 16-bit values), so one ldmatrix of 32 bytes of K feeds either, and its
// int32 C is laid out as the fp32 C above.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace mllm_kernel::cuda {

/// Four 8x8 b16 matrices from shared memory; lane i gives the shared-memory address (as
/// from __cvta_generic_to_shared: loops keep per-lane offsets as 32-bit values) of row
/// i % 8 of matrix i / 8, and receives one 32-bit pair of each matrix.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&frag)[4], uint32_t shared_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(frag[0]), "=r"(frag[1]), "=r"(frag[2]), "=r"(frag[3])
               : "r"(shared_address));
}

/// Two 8x8 b16 matrices: lanes 0-15 give the rows' addresses (as for ldmatrix_x4).
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&frag)[2], uint32_t shared_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(frag[0]), "=r"(frag[1])
               : "r"(shared_address));
}

/// ldmatrix_x4 with each 8x8 matrix transposed: lane 4 g + t receives elements (2 t, g)
/// and (2 t + 1, g) of each matrix whose rows the lanes address. Gives the A or B
/// fragment of an operand stored with its two dims swapped (the K dim along a row).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&frag)[4], uint32_t shared_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(frag[0]), "=r"(frag[1]), "=r"(frag[2]), "=r"(frag[3])
               : "r"(shared_address));
}

/// c += a * b for one 16 x 8 x 16 tile, inputs in `T` (fp16_t or bf16_t), fp32 accumulation.
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "mma_m16n8k16 takes fp16 or bf16 inputs");
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

/// c += a * b for one 16 x 8 x 32 tile of int8 inputs, int32 accumulation (exact).
__device__ __forceinline__ void mma_m16n8k32_s8(int32_t (&c)[4], const uint32_t (&a)[4],
                                                uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Transposes an 8 x 8 matrix of b16 values spread over a warp as C fragments are (lane
/// 4 g + t holds row g, columns 2 t and 2 t + 1): returns that lane's part of the
/// transpose.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t pair) {
  uint32_t out;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(out) : "r"(pair));
  return out;
}

/// movmatrix_trans for an 8 x 8 block of fp32 values (x, y: row g, columns 2 t, 2 t + 1),
/// exactly: their high and low halves travel as two b16 matrices.
__device__ __forceinline__ void transpose_8x8(float& x, float& y) {
  const uint32_t xb = __float_as_uint(x), yb = __float_as_uint(y);
  const uint32_t high = movmatrix_trans(__byte_perm(xb, yb, 0x7632));
  const uint32_t low = movmatrix_trans(__byte_perm(xb, yb, 0x5410));
  x = __uint_as_float(__byte_perm(low, high, 0x5410));
  y = __uint_as_float(__byte_perm(low, high, 0x7632));
}

}  // namespace mllm_kernel::cuda
