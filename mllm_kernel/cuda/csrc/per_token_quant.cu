// Per-token int8 quantisation, the activation side of a W8A8 GEMM (int8_scaled_mm):
// for each row of x (fp32, fp16 or bf16),
//   absmax = max(max_i |x_i|, 1e-10),  scale = absmax / 127,
//   x_q[i] = round(x_i * (127 / absmax))  (half away from zero, saturated to int8),
// so that x ~ x_q * scale with every |x_q| <= 127; a row holding a NaN gets a NaN scale,
// one holding an infinity an infinite one, and x_q = 0 where round() gives NaN, so that
// the W8A8 GEMM's products of such a row are NaN. One CTA per row in one pass over
// memory: stage 1 reads the row into registers (up to 4 16-byte vectors per thread,
// 32k bf16 elements; longer rows are read again from L1/L2) and block-reduces its
// absolute maximum, stage 2 writes the int8 row and its scale. Rows whose length or
// alignment does not allow vectors take the same path one element at a time.
#include "mllm_kernel/rows.hpp"
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.cuh"

namespace mllm_kernel::cuda {
namespace per_token_quant {

struct Params {
  int8_t* out;
  int64_t out_stride;
  const void* in;
  int64_t in_stride;
  float* scales;     // one per row
  int64_t num_vecs;  // vectors per row
};

inline constexpr int kCachedVecs = 4;  // vectors per thread kept in registers
inline constexpr int kMaxThreads = 1024;
// All zeros would give a zero scale (and 0/0 on dequantisation): the floor keeps it
// positive, as the original mllm-kernel and sglang do.
inline constexpr float kMinAbsmax = 1e-10f;

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_vec(const Params& p, int64_t row, int64_t v) {
  Vec<T, N> x;
  x.load(static_cast<const T*>(p.in) + row * p.in_stride + v * N);
  return x;
}

/// The vector's absolute maximum; `nan` is set where it holds a NaN (which fmaxf drops).
template <typename T, int N>
__device__ __forceinline__ float vec_absmax(const Vec<T, N>& x, bool& nan) {
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const float v = fabsf(to_float(x[i]));
    m = fmaxf(m, v);
    nan |= v != v;
  }
  return m;
}

/// round(x * inv_scale) saturated to int8 (roundf: halves away from zero); 0 where that
/// is NaN (a row's NaN or infinite scale: its products are NaN whatever x_q holds).
__device__ __forceinline__ int8_t quantize(float x, float inv_scale) {
  const float r = roundf(x * inv_scale);
  const float q = fminf(fmaxf(r, -128.0f), 127.0f);
  return r == r ? static_cast<int8_t>(static_cast<int>(q)) : int8_t{0};
}

template <typename T, int N>
__device__ __forceinline__ void store_quantized(const Params& p, int64_t row, int64_t v,
                                                const Vec<T, N>& x, float inv_scale) {
  Vec<int8_t, N> q;
#pragma unroll
  for (int i = 0; i < N; ++i) q[i] = quantize(to_float(x[i]), inv_scale);
  q.store(p.out + row * p.out_stride + v * N);
}

template <typename T, int N, bool kCached>
__global__ void __launch_bounds__(kMaxThreads) per_token_quant_kernel(const Params p) {
  constexpr int kSlots = kCached ? kCachedVecs : 1;
  const int64_t row = blockIdx.x;
  float absmax = 0.0f;
  bool nan = false;
  Vec<T, N> cache[kSlots];

  // Stage 1: every load issued before any math, then the row's absolute maximum.
  if constexpr (kCached) {
#pragma unroll
    for (int k = 0; k < kCachedVecs; ++k) {
      const int64_t v = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      if (v < p.num_vecs) cache[k] = load_vec<T, N>(p, row, v);
    }
#pragma unroll
    for (int k = 0; k < kCachedVecs; ++k) {
      const int64_t v = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      if (v < p.num_vecs) absmax = fmaxf(absmax, vec_absmax(cache[k], nan));
    }
  } else {
    for (int64_t v = threadIdx.x; v < p.num_vecs; v += blockDim.x) {
      absmax = fmaxf(absmax, vec_absmax(load_vec<T, N>(p, row, v), nan));
    }
  }
  // A NaN anywhere in the row makes its scale NaN, not the scale of its other values.
  const bool row_nan = __syncthreads_or(nan);
  absmax = row_nan ? __int_as_float(0x7fc00000) : fmaxf(block_reduce_max(absmax), kMinAbsmax);
  const float inv_scale = 127.0f / absmax;
  if (threadIdx.x == 0) p.scales[row] = absmax / 127.0f;

  // Stage 2: quantise and write.
  if constexpr (kCached) {
#pragma unroll
    for (int k = 0; k < kCachedVecs; ++k) {
      const int64_t v = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      if (v < p.num_vecs) store_quantized<T, N>(p, row, v, cache[k], inv_scale);
    }
  } else {
    for (int64_t v = threadIdx.x; v < p.num_vecs; v += blockDim.x) {
      store_quantized<T, N>(p, row, v, load_vec<T, N>(p, row, v), inv_scale);
    }
  }
}

inline void launch(Params p, DLDataType dtype, const RowMatrix& shape, bool aligned,
                   DLDevice device) {
  if (shape.rows == 0) return;
  RuntimeCheck(shape.rows < (int64_t{1} << 31), "per_token_quant_int8: at most 2^31 - 1 rows, got ",
               shape.rows);
  dispatch_dtype<fp32_t, fp16_t, bf16_t>(dtype, "x", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int W = kVecWidth<T>;
    auto run = [&](auto kernel, int64_t num_vecs, int64_t vecs_per_thread) {
      p.num_vecs = num_vecs;
      const int64_t wanted = div_ceil<int64_t>(num_vecs, vecs_per_thread);
      const int64_t threads = round_up<int64_t>(wanted > 0 ? wanted : 1, kWarpSize);
      const int block = static_cast<int>(threads < kMaxThreads ? threads : kMaxThreads);
      KernelLauncher(dim3(static_cast<unsigned>(shape.rows)), dim3(block), device)(kernel, p);
    };
    const int64_t n = shape.cols;
    if (aligned && n / W <= int64_t{kMaxThreads} * kCachedVecs) {
      run(per_token_quant_kernel<T, W, true>, n / W, kCachedVecs);
    } else if (aligned) {
      run(per_token_quant_kernel<T, W, false>, n / W, 1);
    } else {
      run(per_token_quant_kernel<T, 1, false>, n, 1);
    }
  });
}

}  // namespace per_token_quant

/// x_q = round(x / scale) as int8 and scales = max|x| / 127 per row of x's last dim.
/// `x_q` has x's shape (int8, contiguous); `scales` has one fp32 entry per row
/// (x's shape with the last dim 1, contiguous).
inline void per_token_quant_int8(TensorView x_q, TensorView scales, TensorView x) {
  SymbolicDevice device;
  TensorMatcher().dtype<fp32_t, fp16_t, bf16_t>().device(kDLCUDA, device).verify(x, "x");
  TensorMatcher()
      .dtype<int8_t>()
      .device(kDLCUDA, device)
      .same_shape_as(x, "x")
      .contiguous()
      .verify(x_q, "x_q");
  TensorMatcher().dtype<fp32_t>().device(kDLCUDA, device).contiguous().verify(scales, "scales");
  verify_output(x_q, "x_q", {{x, "x"}, {scales, "scales"}});
  verify_output(scales, "scales", {{x, "x"}});
  const RowMatrix in = as_rows(x, "x");
  const RowMatrix out = as_rows(x_q, "x_q");
  const RowMatrix scale_rows = as_rows(scales, "scales");
  ValueCheck(scale_rows.cols == 1 && scale_rows.rows == in.rows, "argument 'scales': expected ",
             in.rows, " rows of 1 scale (x's shape with the last dim 1), got ", scale_rows.rows,
             " x ", scale_rows.cols);
  const int64_t size = x.dtype().bits / 8;
  const int64_t width = 16 / size;
  const bool aligned = in.vec_aligned(size, width) && out.vec_aligned(1, width);
  per_token_quant::Params p{};
  p.out = out.ptr<int8_t>();
  p.out_stride = out.row_stride;
  p.in = in.data;
  p.in_stride = in.row_stride;
  p.scales = scale_rows.ptr<float>();
  per_token_quant::launch(p, x.dtype(), in, aligned, device.value());
}

}  // namespace mllm_kernel::cuda
