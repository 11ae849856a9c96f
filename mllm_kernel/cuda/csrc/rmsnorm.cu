// The RMSNorm family, one CTA per row, fp32 accumulation:
//   rmsnorm:            out = x * rsqrt(mean(x^2) + eps) * weight
//   fused_add_rmsnorm:  residual += input; input = rmsnorm(residual) * weight (in place)
//   rms_norm_gated:     out = rmsnorm(x) * weight * silu(z)
// Stage 1 reads the row and block-reduces its sum of squares; stage 2 scales and
// writes it. Rows up to 4 vectors per thread (32k bf16 / 16k fp32 elements) stay
// in registers between the stages, so the row is read from memory once; longer
// rows are read again (from L1/L2). Rows whose length or alignment does not
// allow 16-byte vectors take the same path one element at a time.
#include "mllm_kernel/cuda/activation.cuh"
#include "mllm_kernel/cuda/rows.hpp"
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.cuh"

namespace mllm_kernel::cuda {
namespace norm {

enum class Mode { kPlain, kFusedAdd, kGated };

struct Params {
  void* out;  // for kFusedAdd: the input, overwritten
  int64_t out_stride;
  const void* in;
  int64_t in_stride;
  void* residual;  // kFusedAdd only
  int64_t residual_stride;
  const void* gate;  // kGated only
  int64_t gate_stride;
  const void* weight;
  int64_t num_vecs;  // vectors per row
  float eps;
  float inv_cols;
};

inline constexpr int kCachedVecs = 4;  // vectors per thread kept in registers
inline constexpr int kMaxThreads = 1024;

template <typename T, int N>
__device__ __forceinline__ T* residual_at(const Params& p, int64_t row, int64_t v) {
  return static_cast<T*>(p.residual) + row * p.residual_stride + v * N;
}

/// kFusedAdd: stores input `a` + residual `r` as the new residual vector `v` and returns
/// that sum as stored (the row is normalised as stored, so the output matches it).
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> add_residual(const Params& p, int64_t row, int64_t v,
                                                  const Vec<T, N>& a, Vec<T, N> r) {
#pragma unroll
  for (int i = 0; i < N; ++i) r[i] = from_float<T>(to_float(a[i]) + to_float(r[i]));
  r.store(residual_at<T, N>(p, row, v));
  return r;
}

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_input(const Params& p, int64_t row, int64_t v) {
  Vec<T, N> a;
  a.load(static_cast<const T*>(p.in) + row * p.in_stride + v * N);
  return a;
}

/// Row vector `v` as stage 1 of the uncached path reads it (kFusedAdd: the new residual).
template <typename T, int N, Mode kMode>
__device__ __forceinline__ Vec<T, N> load_row(const Params& p, int64_t row, int64_t v) {
  const Vec<T, N> a = load_input<T, N>(p, row, v);
  if constexpr (kMode == Mode::kFusedAdd) {
    Vec<T, N> r;
    r.load(residual_at<T, N>(p, row, v));
    return add_residual<T, N>(p, row, v, a, r);
  }
  return a;
}

/// Row vector `v` again, for stage 2 of rows too long to keep in registers.
template <typename T, int N, Mode kMode>
__device__ __forceinline__ Vec<T, N> reload_row(const Params& p, int64_t row, int64_t v) {
  if constexpr (kMode == Mode::kFusedAdd) {
    Vec<T, N> r;
    r.load(residual_at<T, N>(p, row, v));
    return r;
  }
  return load_input<T, N>(p, row, v);
}

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_gate(const Params& p, int64_t row, int64_t v) {
  Vec<T, N> z;
  z.load(static_cast<const T*>(p.gate) + row * p.gate_stride + v * N);
  return z;
}

template <typename T, int N>
__device__ __forceinline__ float sum_squares(const Vec<T, N>& a) {
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i) sum += to_float(a[i]) * to_float(a[i]);
  return sum;
}

template <typename T, int N, Mode kMode>
__device__ __forceinline__ void store_scaled(const Params& p, int64_t row, int64_t v,
                                             const Vec<T, N>& x, const Vec<T, N>& gate,
                                             float scale) {
  Vec<T, N> w, y;
  w.load(static_cast<const T*>(p.weight) + v * N);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    float value = to_float(x[i]) * scale * to_float(w[i]);
    if constexpr (kMode == Mode::kGated) value *= Silu{}(to_float(gate[i]));
    y[i] = from_float<T>(value);
  }
  y.store(static_cast<T*>(p.out) + row * p.out_stride + v * N);
}

// The cached path keeps the row (and the gate) as raw 16-byte vectors, not fp32:
// half the registers, so more rows are in flight per SM.
template <typename T, int N, bool kCached, Mode kMode>
__global__ void __launch_bounds__(kMaxThreads) rmsnorm_kernel(const Params p) {
  constexpr int kSlots = kCached ? kCachedVecs : 1;
  constexpr int kGateSlots = kMode == Mode::kGated ? kSlots : 1;
  const int64_t row = blockIdx.x;
  float sum_sq = 0.0f;
  Vec<T, N> cache[kSlots];
  Vec<T, N> gates[kGateSlots];
  Vec<T, N> residuals[kMode == Mode::kFusedAdd ? kSlots : 1];

  // Stage 1: read the row (and its gate or residual), every load issued before any
  // math (math between the guarded loads serialises them), then sum squares.
  if constexpr (kCached) {
#pragma unroll
    for (int k = 0; k < kCachedVecs; ++k) {
      const int64_t v = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      if (v < p.num_vecs) {
        cache[k] = load_input<T, N>(p, row, v);
        if constexpr (kMode == Mode::kGated) gates[k] = load_gate<T, N>(p, row, v);
        if constexpr (kMode == Mode::kFusedAdd) residuals[k].load(residual_at<T, N>(p, row, v));
      }
    }
#pragma unroll
    for (int k = 0; k < kCachedVecs; ++k) {
      const int64_t v = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      if (v < p.num_vecs) {
        if constexpr (kMode == Mode::kFusedAdd) {
          cache[k] = add_residual<T, N>(p, row, v, cache[k], residuals[k]);
        }
        sum_sq += sum_squares(cache[k]);
      }
    }
  } else {
    for (int64_t v = threadIdx.x; v < p.num_vecs; v += blockDim.x) {
      sum_sq += sum_squares(load_row<T, N, kMode>(p, row, v));
    }
  }
  const float scale = rsqrtf(block_reduce_sum(sum_sq) * p.inv_cols + p.eps);

  // Stage 2: scale and write.
  if constexpr (kCached) {
#pragma unroll
    for (int k = 0; k < kCachedVecs; ++k) {
      const int64_t v = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      if (v < p.num_vecs) {
        store_scaled<T, N, kMode>(p, row, v, cache[k], gates[kMode == Mode::kGated ? k : 0], scale);
      }
    }
  } else {
    for (int64_t v = threadIdx.x; v < p.num_vecs; v += blockDim.x) {
      const Vec<T, N> gate = kMode == Mode::kGated ? load_gate<T, N>(p, row, v) : Vec<T, N>{};
      store_scaled<T, N, kMode>(p, row, v, reload_row<T, N, kMode>(p, row, v), gate, scale);
    }
  }
}

template <Mode kMode>
void launch(Params p, DLDataType dtype, const RowMatrix& shape, bool aligned, DLDevice device) {
  if (shape.rows == 0 || shape.cols == 0) return;
  RuntimeCheck(shape.rows < (int64_t{1} << 31), "rmsnorm: at most 2^31 - 1 rows, got ", shape.rows);
  p.inv_cols = 1.0f / static_cast<float>(shape.cols);
  dispatch_dtype<fp32_t, fp16_t, bf16_t>(dtype, "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int W = kVecWidth<T>;
    auto run = [&](auto kernel, int64_t num_vecs, int64_t vecs_per_thread) {
      p.num_vecs = num_vecs;
      const int64_t threads =
          round_up<int64_t>(div_ceil<int64_t>(num_vecs, vecs_per_thread), kWarpSize);
      const int block = static_cast<int>(threads < kMaxThreads ? threads : kMaxThreads);
      KernelLauncher(dim3(static_cast<unsigned>(shape.rows)), dim3(block), device)(kernel, p);
    };
    const int64_t n = shape.cols;
    if (aligned && n / W <= int64_t{kMaxThreads} * kCachedVecs) {
      // The gated norm (three streams and a silu per element) wants more threads per row:
      // 2 vectors each up to 512 vectors. H200, 8192 rows of bf16, % of a same-size copy:
      // hidden 4096 97% (4 each: 94%); at 8192, 4 each stays ahead (96% vs 95%), and the
      // plain and fused norms lose with 2 (94% vs 96%, 88% vs 94%).
      const int64_t per_thread = kMode == Mode::kGated && n / W <= 512 ? 2 : kCachedVecs;
      run(rmsnorm_kernel<T, W, true, kMode>, n / W, per_thread);
    } else if (aligned) {
      run(rmsnorm_kernel<T, W, false, kMode>, n / W, 1);
    } else {
      run(rmsnorm_kernel<T, 1, false, kMode>, n, 1);
    }
  });
}

inline void check_eps(double eps) {
  ValueCheck(eps >= 0.0 && eps < 1e30, "argument 'eps': expected a finite value >= 0, got ", eps);
}

/// Checks `weight` against the rows of `input` and returns its aligned-ness.
inline bool check_weight(const TensorView& weight, const TensorView& input, const RowMatrix& rows,
                         SymbolicDevice& device) {
  SymbolicSize hidden{"hidden"};
  hidden.bind(rows.cols, "input");
  TensorMatcher({hidden})
      .dtype(input.dtype())
      .device(kDLCUDA, device)
      .contiguous()
      .verify(weight, "weight");
  const int64_t size = input.dtype().bits / 8;
  const RowMatrix w{data_ptr<void>(weight), 1, rows.cols, rows.cols};
  return rows_vec_aligned(w, size, 16 / size);
}

}  // namespace norm

/// out = rmsnorm(input) * weight over the last dim; `out` may alias `input`.
inline void rmsnorm(TensorView out, TensorView input, TensorView weight, double eps) {
  SymbolicDevice device;
  TensorMatcher().dtype<fp32_t, fp16_t, bf16_t>().device(kDLCUDA, device).verify(input, "input");
  TensorMatcher().dtype(input.dtype()).device(kDLCUDA, device).verify(out, "out");
  check_same_shape(out, "out", input, "input");
  verify_output(out, "out", {{input, "input", Aliasing::kSameView}, {weight, "weight"}});
  norm::check_eps(eps);
  const RowMatrix x = as_rows(input, "input");
  const RowMatrix y = as_rows(out, "out");
  const int64_t size = input.dtype().bits / 8;
  const bool aligned = norm::check_weight(weight, input, x, device) &&
                       rows_vec_aligned(x, size, 16 / size) && rows_vec_aligned(y, size, 16 / size);
  norm::Params p{};
  p.out = y.data;
  p.out_stride = y.row_stride;
  p.in = x.data;
  p.in_stride = x.row_stride;
  p.weight = data_ptr<void>(weight);
  p.eps = static_cast<float>(eps);
  norm::launch<norm::Mode::kPlain>(p, input.dtype(), x, aligned, device.value());
}

/// residual += input; input = rmsnorm(residual) * weight, both in place.
inline void fused_add_rmsnorm(TensorView input, TensorView residual, TensorView weight,
                              double eps) {
  SymbolicDevice device;
  TensorMatcher().dtype<fp32_t, fp16_t, bf16_t>().device(kDLCUDA, device).verify(input, "input");
  TensorMatcher().dtype(input.dtype()).device(kDLCUDA, device).verify(residual, "residual");
  check_same_shape(residual, "residual", input, "input");
  verify_output(input, "input", {{residual, "residual"}, {weight, "weight"}});
  verify_output(residual, "residual", {{weight, "weight"}});
  norm::check_eps(eps);
  const RowMatrix x = as_rows(input, "input");
  const RowMatrix r = as_rows(residual, "residual");
  const int64_t size = input.dtype().bits / 8;
  const bool aligned = norm::check_weight(weight, input, x, device) &&
                       rows_vec_aligned(x, size, 16 / size) && rows_vec_aligned(r, size, 16 / size);
  norm::Params p{};
  p.out = x.data;
  p.out_stride = x.row_stride;
  p.in = x.data;
  p.in_stride = x.row_stride;
  p.residual = r.data;
  p.residual_stride = r.row_stride;
  p.weight = data_ptr<void>(weight);
  p.eps = static_cast<float>(eps);
  norm::launch<norm::Mode::kFusedAdd>(p, input.dtype(), x, aligned, device.value());
}

/// out = rmsnorm(x) * weight * silu(z).
inline void rms_norm_gated(TensorView out, TensorView x, TensorView z, TensorView weight,
                           double eps) {
  SymbolicDevice device;
  TensorMatcher().dtype<fp32_t, fp16_t, bf16_t>().device(kDLCUDA, device).verify(x, "x");
  TensorMatcher().dtype(x.dtype()).device(kDLCUDA, device).verify(z, "z");
  TensorMatcher().dtype(x.dtype()).device(kDLCUDA, device).verify(out, "out");
  check_same_shape(z, "z", x, "x");
  check_same_shape(out, "out", x, "x");
  verify_output(out, "out", {{x, "x", Aliasing::kSameView}, {z, "z"}, {weight, "weight"}});
  norm::check_eps(eps);
  const RowMatrix xs = as_rows(x, "x");
  const RowMatrix zs = as_rows(z, "z");
  const RowMatrix ys = as_rows(out, "out");
  const int64_t size = x.dtype().bits / 8;
  const bool aligned =
      norm::check_weight(weight, x, xs, device) && rows_vec_aligned(xs, size, 16 / size) &&
      rows_vec_aligned(zs, size, 16 / size) && rows_vec_aligned(ys, size, 16 / size);
  norm::Params p{};
  p.out = ys.data;
  p.out_stride = ys.row_stride;
  p.in = xs.data;
  p.in_stride = xs.row_stride;
  p.gate = zs.data;
  p.gate_stride = zs.row_stride;
  p.weight = data_ptr<void>(weight);
  p.eps = static_cast<float>(eps);
  norm::launch<norm::Mode::kGated>(p, x.dtype(), xs, aligned, device.value());
}

}  // namespace mllm_kernel::cuda
