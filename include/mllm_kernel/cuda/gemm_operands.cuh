// The host-side checks of the GEMMs' arguments (gemm, int8_scaled_mm), shared by every
// kernel that serves them (csrc/gemm.cu: TMA + wgmma on sm_90a; csrc/gemm_sm80.cu:
// cp.async + mma.sync on sm_80 and newer), so that both refuse the same inputs with the
// same messages. Each kernel copies rows in 16-byte pieces, so both need the same
// alignment; `copier` names what copies them in the messages ("TMA", "cp.async").
#pragma once

#include <cstdint>

#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.cuh"

namespace mllm_kernel::cuda {

/// Rows are copied in 16-byte pieces: their start and pitch must be multiples of it.
inline constexpr int kGemmRowAlignBytes = 16;

/// The kernels count rows, tiles and K's bytes in 32 bits: M and N stay below this
/// (a tile's rounding past the last row stays in range), K's bytes below 2^31.
inline constexpr int64_t kMaxGemmRows = (int64_t{1} << 31) - 1024;
inline constexpr int64_t kMaxGemmKBytes = (int64_t{1} << 31) - 1;

/// M, N and K (`k_bytes`: K times the operand size) within what the kernels index;
/// `a_arg` and `b_arg` name the operands in errors.
inline void check_gemm_sizes(int64_t m, int64_t n, int64_t k_bytes, const char* a_arg,
                             const char* b_arg) {
  ValueCheck(m <= kMaxGemmRows, "argument '", a_arg, "': M (", m, ") must be at most ",
             kMaxGemmRows);
  ValueCheck(n <= kMaxGemmRows, "argument '", b_arg, "': N (", n, ") must be at most ",
             kMaxGemmRows);
  ValueCheck(k_bytes <= kMaxGemmKBytes, "argument '", a_arg,
             "': K must be under 2^31 bytes a row, got ", k_bytes);
}

/// An input operand as the kernel reads it: `rows` rows of `cols` (K) elements, each
/// contiguous, `row_stride` elements apart; how the caller sees it is for errors.
struct Operand {
  const void* data;
  int64_t rows;
  int64_t cols;
  int64_t row_stride;
  const char* arg;          // the caller's argument
  const char* stride_name;  // row_stride as the caller's tensor has it
  const char* fix;          // what to pass instead when the stride is unusable
};

/// A row-major [rows, K] argument (`a`, `b`, `mat_a`) as an operand.
inline Operand row_major(const TensorView& m, const char* arg) {
  return Operand{.data = data_ptr<const void>(m),
                 .rows = m.size(0),
                 .cols = m.size(1),
                 .row_stride = m.stride(0),
                 .arg = arg,
                 .stride_name = "the row stride",
                 .fix = "call .contiguous()"};
}

/// The rows of `m` start at 16-byte boundaries: the start and the row pitch must be
/// multiples of 16 bytes (checked where K > 0: no row is read otherwise).
template <typename T>
void check_operand_rows(const Operand& m, const char* copier) {
  constexpr int64_t kElements = kGemmRowAlignBytes / sizeof(T);
  ValueCheck(m.rows <= 1 || m.row_stride % kElements == 0, "argument '", m.arg,
             "': ", m.stride_name, " must be a multiple of ", kElements, " elements (",
             kGemmRowAlignBytes, " bytes) for ", copier, ", got ", m.row_stride, "; ", m.fix);
  ValueCheck(reinterpret_cast<uintptr_t>(m.data) % kGemmRowAlignBytes == 0, "argument '", m.arg,
             "': the data must start on a ", kGemmRowAlignBytes, "-byte boundary; ", m.fix);
}

/// The kernels store pairs of neighbouring output columns: rows start at even columns.
inline void check_output_pairs(const TensorView& out) {
  const bool out_fp32 = is_dtype<fp32_t>(out.dtype());
  ValueCheck(out.size(0) <= 1 || out.stride(0) % 2 == 0,
             "argument 'out': the row stride must be even, got ", out.stride(0),
             "; call .contiguous()");
  ValueCheck(reinterpret_cast<uintptr_t>(data_ptr<const void>(out)) % (out_fp32 ? 8 : 4) == 0,
             "argument 'out': the data must be aligned to two elements");
}

/// gemm's operands once checked: a [M, K] and b [N, K] as the kernel reads them, and
/// the device they are on.
struct GemmOperands {
  Operand a;
  Operand b;
  DLDevice device;
};

/// Checks gemm's arguments, out[M, N] = a[M, K] @ b[N, K]^T (+ bias[N]) in `out_dtype`
/// (T or fp32, the dtype `out` must have), for a kernel whose rows `copier` copies.
template <typename T>
GemmOperands check_gemm_operands(const TensorView& out, const TensorView& a, const TensorView& b,
                                 const ::tvm::ffi::Optional<TensorView>& bias, DLDataType out_dtype,
                                 const char* copier) {
  SymbolicSize m{"M"}, n{"N"}, k{"K"};
  SymbolicDevice device;
  TensorMatcher({m, k}).dtype<T>().device(kDLCUDA, device).last_dim_contiguous().verify(a, "a");
  TensorMatcher({n, k}).dtype<T>().device(kDLCUDA, device).last_dim_contiguous().verify(b, "b");
  ValueCheck(is_dtype<T>(out_dtype) || is_dtype<fp32_t>(out_dtype),
             "argument 'out_dtype': expected the input dtype (", dtype_trait<T>::name,
             ") or float32 but got ", dtype_name(out_dtype));
  TensorMatcher({m, n})
      .dtype(out_dtype)
      .device(kDLCUDA, device)
      .last_dim_contiguous()
      .verify(out, "out");
  if (bias.has_value()) {
    TensorMatcher({n}).dtype(out_dtype).device(kDLCUDA, device).contiguous().verify(*bias, "bias");
  }
  // The kernel reads a, b and bias while it writes out: they must not share memory.
  if (bias.has_value()) {
    verify_output(out, "out", {{a, "a"}, {b, "b"}, {*bias, "bias"}});
  } else {
    verify_output(out, "out", {{a, "a"}, {b, "b"}});
  }
  check_gemm_sizes(m.value(), n.value(), k.value() * static_cast<int64_t>(sizeof(T)), "a", "b");
  constexpr int64_t kRowElements = kGemmRowAlignBytes / sizeof(T);
  ValueCheck(k.value() % kRowElements == 0, "argument 'a': K (", k.value(),
             ") must be a multiple of ", kRowElements, " (", kGemmRowAlignBytes, "-byte rows for ",
             copier, ")");
  ValueCheck(n.value() % kRowElements == 0, "argument 'b': N (", n.value(),
             ") must be a multiple of ", kRowElements, " (", kGemmRowAlignBytes, "-byte rows for ",
             copier, ")");
  return GemmOperands{row_major(a, "a"), row_major(b, "b"), device.value()};
}

/// A scale vector of `rows` entries (`what` says which) or one entry for all, shaped
/// [rows], [rows, 1], [1, rows], [1] or 0-d (`count` names `rows` in errors);
/// returns the step between the entries of neighbouring rows (1, or 0 for one scale).
inline int check_scales(const TensorView& scales, int64_t rows, const char* arg, const char* count,
                        const char* what, SymbolicDevice& device) {
  TensorMatcher().dtype<fp32_t>().device(kDLCUDA, device).contiguous().verify(scales, arg);
  const bool vector =
      scales.ndim() <= 1 || (scales.ndim() == 2 && (scales.size(0) == 1 || scales.size(1) == 1));
  ValueCheck(vector, "argument '", arg, "': expected [", count, "], [", count,
             ", 1] or [1] but got shape ", dims_str(scales.shape()));
  const int64_t entries = scales.numel();
  ValueCheck(entries == rows || entries == 1, "argument '", arg, "': expected ", rows, " scales (",
             what, ") or 1 but got ", entries);
  return entries == 1 ? 0 : 1;
}

/// int8_scaled_mm's operands once checked: mat_a [M, K] and the weight's rows [N, K]
/// (mat_b's columns) as the kernel reads them, the steps of the row (token) and column
/// (channel) scales (0: one scale for all), and the device.
struct Int8Operands {
  Operand a;
  Operand weight_rows;
  int row_scale_step;
  int col_scale_step;
  DLDevice device;
};

/// Checks int8_scaled_mm's arguments: out[M, N] = (mat_a[M, K] @ mat_b[K, N]) *
/// scales_a[M] * scales_b[N] (+ bias[N]), out bf16 or fp16, `mat_b` column-major (the
/// transpose of a contiguous [N, K] weight), for a kernel whose rows `copier` copies.
inline Int8Operands check_int8_operands(const TensorView& out, const TensorView& mat_a,
                                        const TensorView& mat_b, const TensorView& scales_a,
                                        const TensorView& scales_b,
                                        const ::tvm::ffi::Optional<TensorView>& bias,
                                        const char* copier) {
  SymbolicSize m{"M"}, n{"N"}, k{"K"};
  SymbolicDevice device;
  TensorMatcher({m, k})
      .dtype<int8_t>()
      .device(kDLCUDA, device)
      .last_dim_contiguous()
      .verify(mat_a, "mat_a");
  TensorMatcher({k, n}).dtype<int8_t>().device(kDLCUDA, device).verify(mat_b, "mat_b");
  ValueCheck(k.value() <= 1 || mat_b.stride(0) == 1,
             "argument 'mat_b': expected a column-major [K, N] tensor (stride(0) == 1) but got "
             "strides ",
             dims_str(mat_b.strides()), "; pass weight.t() of a contiguous [N, K] weight");
  TensorMatcher({m, n})
      .dtype<bf16_t, fp16_t>()
      .device(kDLCUDA, device)
      .last_dim_contiguous()
      .verify(out, "out");
  const int row_scale_step =
      check_scales(scales_a, m.value(), "scales_a", "M", "M: one per row of mat_a", device);
  const int col_scale_step =
      check_scales(scales_b, n.value(), "scales_b", "N", "N: one per column of mat_b", device);
  if (bias.has_value()) {
    TensorMatcher({n})
        .dtype(out.dtype())
        .device(kDLCUDA, device)
        .contiguous()
        .verify(*bias, "bias");
    verify_output(out, "out",
                  {{mat_a, "mat_a"},
                   {mat_b, "mat_b"},
                   {scales_a, "scales_a"},
                   {scales_b, "scales_b"},
                   {*bias, "bias"}});
  } else {
    verify_output(
        out, "out",
        {{mat_a, "mat_a"}, {mat_b, "mat_b"}, {scales_a, "scales_a"}, {scales_b, "scales_b"}});
  }
  check_gemm_sizes(m.value(), n.value(), k.value(), "mat_a", "mat_b");
  constexpr int64_t kKElements = kGemmRowAlignBytes;        // int8
  constexpr int64_t kOutElements = kGemmRowAlignBytes / 2;  // bf16 or fp16 output rows
  ValueCheck(k.value() % kKElements == 0, "argument 'mat_a': K (", k.value(),
             ") must be a multiple of ", kKElements, " (", kGemmRowAlignBytes,
             "-byte int8 rows for ", copier, ")");
  ValueCheck(n.value() % kOutElements == 0, "argument 'mat_b': N (", n.value(),
             ") must be a multiple of ", kOutElements, " (", kGemmRowAlignBytes,
             "-byte output rows)");
  // mat_b's columns are the weight's rows: element (k, n) at n * stride(1) + k.
  const Operand weight_rows{.data = data_ptr<const void>(mat_b),
                            .rows = n.value(),
                            .cols = k.value(),
                            .row_stride = mat_b.stride(1),
                            .arg = "mat_b",
                            .stride_name = "stride(1) (the weight's row stride)",
                            .fix = "pass weight.t() of a contiguous [N, K] weight"};
  return Int8Operands{row_major(mat_a, "mat_a"), weight_rows, row_scale_step, col_scale_step,
                      device.value()};
}

}  // namespace mllm_kernel::cuda
