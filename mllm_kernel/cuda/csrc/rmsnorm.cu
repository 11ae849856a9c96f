// The RMSNorm family, one CTA per row, fp32 accumulation:
//   rmsnorm:            out = x * rsqrt(mean(x^2) + eps) * weight
//   fused_add_rmsnorm:  residual += input; input = rmsnorm(residual) * weight (in place)
//   rms_norm_gated:     out = rmsnorm(x) * weight * silu(z)
//   rmsnorm_backward:   grad_input and grad_weight of rmsnorm (see its section below)
// Stage 1 reads the row and block-reduces its sum of squares; stage 2 scales and
// writes it. Rows up to 4 vectors per thread (32k bf16 / 16k fp32 elements) stay
// in registers between the stages, so the row is read from memory once; longer
// rows are read again (from L1/L2). Rows whose length or alignment does not
// allow 16-byte vectors take the same path one element at a time.
#include <algorithm>
#include <initializer_list>
#include <type_traits>

#include "mllm_kernel/cuda/activation.cuh"
#include "mllm_kernel/rows.hpp"
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
      // 2 vectors each up to 512 vectors. Past that, and for the plain and fused norms, 4
      // each measured faster (benchmarks/RESULTS.md, "norm.cu: vectors per thread").
      const int64_t per_thread = kMode == Mode::kGated && n / W <= 512 ? 2 : kCachedVecs;
      run(rmsnorm_kernel<T, W, true, kMode>, n / W, per_thread);
    } else if (aligned) {
      run(rmsnorm_kernel<T, W, false, kMode>, n / W, 1);
    } else {
      run(rmsnorm_kernel<T, 1, false, kMode>, n, 1);
    }
  });
}

// --- backward ----------------------------------------------------------------
// rmsnorm_backward, per row, with r = rsqrt(mean(x^2) + eps):
//   grad_input  = r * g * w - x * (r^3 / hidden) * sum(g * w * x)
//   grad_weight = sum over all rows of g * x * r
// grad_weight sums over rows without atomics, so the result depends on the shape only:
// a grid of backward_partials(rows) CTAs (a function of the row count alone, so the
// caller can size the workspace) each takes a block of consecutive rows, kRows at a
// time, every thread owning the same columns in each row. A CTA writes grad_input row
// by row and keeps its threads' shares of grad_weight in registers, then stores them as
// row blockIdx.x of the fp32 workspace [partials, hidden]; a second kernel sums the
// workspace's columns in row order. Rows too long for registers accumulate in the
// workspace row instead (read again from L1/L2).

inline constexpr int64_t kMinRowsPerPartial = 8;
// Two CTAs per SM on a 132-SM H100/H200: one wave when two fit, two even waves when one.
inline constexpr int64_t kMaxPartials = 264;
inline constexpr int kBackwardThreads = 512;
inline constexpr int kBackwardSlots = 4;  // rows x vectors each thread keeps in registers

/// The workspace rows rmsnorm_backward needs for `rows` rows:
/// clamp(ceil(rows / 8), 1, 264).
inline int64_t backward_partials(int64_t rows) {
  return std::clamp<int64_t>(div_ceil<int64_t>(rows, kMinRowsPerPartial), 1, kMaxPartials);
}

struct BackwardParams {
  void* grad_input;
  int64_t grad_input_stride;
  const void* grad_output;
  int64_t grad_output_stride;
  const void* input;
  int64_t input_stride;
  const void* weight;
  float* workspace;  // [gridDim.x, cols]
  int64_t rows;
  int64_t cols;
  int64_t num_vecs;  // vectors per row
  float eps;
  float inv_cols;
};

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_vec(const void* base, int64_t stride, int64_t row,
                                              int64_t v) {
  Vec<T, N> a;
  a.load(static_cast<const T*>(base) + row * stride + v * N);
  return a;
}

/// The rows [first, last) this CTA owns.
__device__ __forceinline__ void block_rows(int64_t rows, int64_t& first, int64_t& last) {
  first = rows * blockIdx.x / gridDim.x;
  last = rows * (blockIdx.x + 1) / gridDim.x;
}

/// Stage 2 for one vector of a row: writes its grad_input, and its share of grad_weight
/// (g * x * r per element) into `share`.
template <typename T, int N>
__device__ __forceinline__ void store_grad_input(const BackwardParams& p, int64_t row, int64_t v,
                                                 const Vec<T, N>& x, const Vec<T, N>& g,
                                                 const Vec<T, N>& w, float scale, float x_coef,
                                                 float (&share)[N]) {
  Vec<T, N> dx;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const float xf = to_float(x[i]), gf = to_float(g[i]);
    share[i] = gf * xf * scale;
    dx[i] = from_float<T>(scale * gf * to_float(w[i]) - x_coef * xf);
  }
  dx.store(static_cast<T*>(p.grad_input) + row * p.grad_input_stride + v * N);
}

template <typename T, int N>
__device__ __forceinline__ void add_row_sums(const Vec<T, N>& x, const Vec<T, N>& g,
                                             const Vec<T, N>& w, float& sum_sq, float& dot) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const float xf = to_float(x[i]);
    sum_sq += xf * xf;
    dot += to_float(g[i]) * to_float(w[i]) * xf;
  }
}

// Rows of up to kVecs vectors per thread, kRows = kBackwardSlots / kVecs rows at a time:
// every load of the kRows rows is issued before any math, one block reduction serves them.
// The weight is read again where it is used (from L1): kept in registers it would cost
// the 16-bit types' widest tier a spill.
template <typename T, int N, int kVecs>
__global__ void __launch_bounds__(kBackwardThreads)
    rmsnorm_backward_kernel(const BackwardParams p) {
  constexpr int kRows = kBackwardSlots / kVecs;
  int64_t first, last;
  block_rows(p.rows, first, last);
  float grad_weight[kVecs][N];
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
#pragma unroll
    for (int i = 0; i < N; ++i) grad_weight[k][i] = 0.0f;
  }
  for (int64_t row0 = first; row0 < last; row0 += kRows) {
    Vec<T, N> x[kRows][kVecs], g[kRows][kVecs];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        const int64_t v = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
        if (row0 + r < last && v < p.num_vecs) {
          x[r][k] = load_vec<T, N>(p.input, p.input_stride, row0 + r, v);
          g[r][k] = load_vec<T, N>(p.grad_output, p.grad_output_stride, row0 + r, v);
        }
      }
    }
    float sums[2 * kRows];  // per row: sum(x^2), sum(g * w * x)
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      sums[2 * r] = sums[2 * r + 1] = 0.0f;
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        const int64_t v = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
        if (row0 + r < last && v < p.num_vecs) {
          add_row_sums(x[r][k], g[r][k], load_vec<T, N>(p.weight, 0, 0, v), sums[2 * r],
                       sums[2 * r + 1]);
        }
      }
    }
    block_reduce_sum(sums);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (row0 + r >= last) break;  // uniform over the block
      const float scale = rsqrtf(sums[2 * r] * p.inv_cols + p.eps);
      const float x_coef = sums[2 * r + 1] * scale * scale * scale * p.inv_cols;
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
        const int64_t v = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
        if (v < p.num_vecs) {
          float share[N];
          store_grad_input<T, N>(p, row0 + r, v, x[r][k], g[r][k],
                                 load_vec<T, N>(p.weight, 0, 0, v), scale, x_coef, share);
#pragma unroll
          for (int i = 0; i < N; ++i) grad_weight[k][i] += share[i];
        }
      }
    }
  }
  float* partial = p.workspace + blockIdx.x * p.cols;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int64_t v = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (v < p.num_vecs) {
#pragma unroll
      for (int i = 0; i < N; ++i) partial[v * N + i] = grad_weight[k][i];
    }
  }
}

// Rows too long for registers: two reads of each row, the shares of grad_weight added
// into this CTA's workspace row (each element by the one thread that owns it).
template <typename T, int N>
__global__ void __launch_bounds__(kMaxThreads)
    rmsnorm_backward_uncached_kernel(const BackwardParams p) {
  int64_t first, last;
  block_rows(p.rows, first, last);
  float* partial = p.workspace + blockIdx.x * p.cols;
  for (int64_t v = threadIdx.x; v < p.num_vecs; v += blockDim.x) {
#pragma unroll
    for (int i = 0; i < N; ++i) partial[v * N + i] = 0.0f;
  }
  for (int64_t row = first; row < last; ++row) {
    float sums[2] = {0.0f, 0.0f};
    for (int64_t v = threadIdx.x; v < p.num_vecs; v += blockDim.x) {
      add_row_sums(load_vec<T, N>(p.input, p.input_stride, row, v),
                   load_vec<T, N>(p.grad_output, p.grad_output_stride, row, v),
                   load_vec<T, N>(p.weight, 0, 0, v), sums[0], sums[1]);
    }
    block_reduce_sum(sums);
    const float scale = rsqrtf(sums[0] * p.inv_cols + p.eps);
    const float x_coef = sums[1] * scale * scale * scale * p.inv_cols;
    for (int64_t v = threadIdx.x; v < p.num_vecs; v += blockDim.x) {
      float share[N];
      store_grad_input<T, N>(p, row, v, load_vec<T, N>(p.input, p.input_stride, row, v),
                             load_vec<T, N>(p.grad_output, p.grad_output_stride, row, v),
                             load_vec<T, N>(p.weight, 0, 0, v), scale, x_coef, share);
#pragma unroll
      for (int i = 0; i < N; ++i) partial[v * N + i] += share[i];
    }
  }
}

inline constexpr int kColumnSumWarps = 8;

/// out[c] = sum over rows r of in[r, c], rows added in order: each warp of a CTA sums
/// every kColumnSumWarps-th row of 32 columns, then warp 0 adds the warps' sums in order.
__global__ void __launch_bounds__(kColumnSumWarps* kWarpSize)
    column_sum_kernel(const float* in, int64_t rows, int64_t cols, float* out) {
  __shared__ float sums[kColumnSumWarps][kWarpSize];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kWarpSize + lane;
  float sum = 0.0f;
  if (col < cols) {
#pragma unroll 8
    for (int64_t r = warp; r < rows; r += kColumnSumWarps) sum += in[r * cols + col];
  }
  sums[warp][lane] = sum;
  __syncthreads();
  if (warp == 0 && col < cols) {
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kColumnSumWarps; ++w) total += sums[w][lane];
    out[col] = total;
  }
}

/// Launches the row kernel that fits `p.cols` elements of T (vectorised when `aligned`),
/// then the column sum of its workspace into grad_weight.
template <typename T>
void launch_backward(BackwardParams p, int64_t partials, bool aligned, float* grad_weight,
                     DLDevice device) {
  constexpr int W = kVecWidth<T>;
  const int64_t n = p.cols;
  const dim3 grid(static_cast<unsigned>(partials));
  auto run = [&](auto kernel, int64_t num_vecs, int64_t vecs_per_thread, int max_threads) {
    p.num_vecs = num_vecs;
    const int64_t threads =
        round_up<int64_t>(div_ceil<int64_t>(num_vecs, vecs_per_thread), kWarpSize);
    const int block = static_cast<int>(threads < max_threads ? threads : max_threads);
    KernelLauncher(grid, dim3(block), device)(kernel, p);
  };
  // Up to 1024 vectors a row takes at most 256 threads, so two CTAs share an SM and one's
  // loads overlap the other's reduction; longer rows take 4 vectors in up to 512 threads.
  auto run_cached = [&](auto vec_width, int64_t num_vecs) {
    constexpr int kN = decltype(vec_width)::value;
    if (num_vecs <= kBackwardThreads / 2) {
      run(rmsnorm_backward_kernel<T, kN, 1>, num_vecs, 1, kBackwardThreads);
    } else if (num_vecs <= kBackwardThreads) {
      run(rmsnorm_backward_kernel<T, kN, 2>, num_vecs, 2, kBackwardThreads);
    } else {
      run(rmsnorm_backward_kernel<T, kN, 4>, num_vecs, 4, kBackwardThreads);
    }
  };
  constexpr int64_t kCachedVecs = int64_t{kBackwardThreads} * kBackwardSlots;
  if (aligned && n / W <= kCachedVecs) {
    run_cached(std::integral_constant<int, W>{}, n / W);
  } else if (n <= kCachedVecs) {
    run_cached(std::integral_constant<int, 1>{}, n);
  } else if (aligned) {
    run(rmsnorm_backward_uncached_kernel<T, W>, n / W, 1, kMaxThreads);
  } else {
    run(rmsnorm_backward_uncached_kernel<T, 1>, n, 1, kMaxThreads);
  }
  KernelLauncher(dim3(static_cast<unsigned>(div_ceil<int64_t>(n, kWarpSize))),
                 dim3(kColumnSumWarps * kWarpSize),
                 device)(column_sum_kernel, p.workspace, partials, n, grad_weight);
}

/// True when every matrix (of `dtype` elements) allows 16-byte vectors.
inline bool vec_aligned(DLDataType dtype, std::initializer_list<RowMatrix> matrices) {
  const int64_t size = dtype.bits / 8;
  for (const RowMatrix& m : matrices) {
    if (!m.vec_aligned(size, 16 / size)) return false;
  }
  return true;
}

}  // namespace norm

/// out = rmsnorm(input) * weight over the last dim; `out` may alias `input`.
inline void rmsnorm(TensorView out, TensorView input, TensorView weight, double eps) {
  SymbolicSize hidden{"hidden"};
  SymbolicDtype dtype;
  SymbolicDevice device;
  TensorMatcher()
      .dtype<fp32_t, fp16_t, bf16_t>(dtype)
      .device(kDLCUDA, device)
      .rows(hidden)
      .verify(input, "input");
  TensorMatcher()
      .dtype(dtype)
      .device(kDLCUDA, device)
      .same_shape_as(input, "input")
      .verify(out, "out");
  TensorMatcher({hidden})
      .dtype(dtype)
      .device(kDLCUDA, device)
      .contiguous()
      .verify(weight, "weight");
  verify_output(out, "out", {{input, "input", Aliasing::kSameView}, {weight, "weight"}});
  check_norm_eps(eps);
  const RowMatrix x = as_rows(input, "input"), y = as_rows(out, "out"),
                  w = as_rows(weight, "weight");
  norm::Params p{};
  p.out = y.data;
  p.out_stride = y.row_stride;
  p.in = x.data;
  p.in_stride = x.row_stride;
  p.weight = w.data;
  p.eps = static_cast<float>(eps);
  norm::launch<norm::Mode::kPlain>(p, dtype.value(), x, norm::vec_aligned(dtype.value(), {x, y, w}),
                                   device.value());
}

/// residual += input; input = rmsnorm(residual) * weight, both in place.
inline void fused_add_rmsnorm(TensorView input, TensorView residual, TensorView weight,
                              double eps) {
  SymbolicSize hidden{"hidden"};
  SymbolicDtype dtype;
  SymbolicDevice device;
  TensorMatcher()
      .dtype<fp32_t, fp16_t, bf16_t>(dtype)
      .device(kDLCUDA, device)
      .rows(hidden)
      .verify(input, "input");
  TensorMatcher()
      .dtype(dtype)
      .device(kDLCUDA, device)
      .same_shape_as(input, "input")
      .verify(residual, "residual");
  TensorMatcher({hidden})
      .dtype(dtype)
      .device(kDLCUDA, device)
      .contiguous()
      .verify(weight, "weight");
  verify_output(input, "input", {{residual, "residual"}, {weight, "weight"}});
  verify_output(residual, "residual", {{weight, "weight"}});
  check_norm_eps(eps);
  const RowMatrix x = as_rows(input, "input"), r = as_rows(residual, "residual"),
                  w = as_rows(weight, "weight");
  norm::Params p{};
  p.out = x.data;
  p.out_stride = x.row_stride;
  p.in = x.data;
  p.in_stride = x.row_stride;
  p.residual = r.data;
  p.residual_stride = r.row_stride;
  p.weight = w.data;
  p.eps = static_cast<float>(eps);
  norm::launch<norm::Mode::kFusedAdd>(p, dtype.value(), x,
                                      norm::vec_aligned(dtype.value(), {x, r, w}), device.value());
}

/// out = rmsnorm(x) * weight * silu(z).
inline void rms_norm_gated(TensorView out, TensorView x, TensorView z, TensorView weight,
                           double eps) {
  SymbolicSize hidden{"hidden"};
  SymbolicDtype dtype;
  SymbolicDevice device;
  TensorMatcher()
      .dtype<fp32_t, fp16_t, bf16_t>(dtype)
      .device(kDLCUDA, device)
      .rows(hidden)
      .verify(x, "x");
  TensorMatcher().dtype(dtype).device(kDLCUDA, device).same_shape_as(x, "x").verify(z, "z");
  TensorMatcher().dtype(dtype).device(kDLCUDA, device).same_shape_as(x, "x").verify(out, "out");
  TensorMatcher({hidden})
      .dtype(dtype)
      .device(kDLCUDA, device)
      .contiguous()
      .verify(weight, "weight");
  verify_output(out, "out", {{x, "x", Aliasing::kSameView}, {z, "z"}, {weight, "weight"}});
  check_norm_eps(eps);
  const RowMatrix xs = as_rows(x, "x"), zs = as_rows(z, "z"), ys = as_rows(out, "out"),
                  w = as_rows(weight, "weight");
  norm::Params p{};
  p.out = ys.data;
  p.out_stride = ys.row_stride;
  p.in = xs.data;
  p.in_stride = xs.row_stride;
  p.gate = zs.data;
  p.gate_stride = zs.row_stride;
  p.weight = w.data;
  p.eps = static_cast<float>(eps);
  norm::launch<norm::Mode::kGated>(
      p, dtype.value(), xs, norm::vec_aligned(dtype.value(), {xs, zs, ys, w}), device.value());
}

/// The rows of rmsnorm_backward's workspace for an input of `rows` rows (the product of
/// its leading dims): clamp(ceil(rows / 8), 1, 264). The workspace is float32
/// [rmsnorm_backward_workspace_rows(rows), hidden], contiguous; its contents on entry do
/// not matter and are overwritten.
inline int64_t rmsnorm_backward_workspace_rows(int64_t rows) {
  ValueCheck(rows >= 0, "argument 'rows': expected >= 0, got ", rows);
  return norm::backward_partials(rows);
}

/// The backward of out = rmsnorm(input) * weight (rmsnorm above), per row of `input`
/// with r = rsqrt(mean(input^2) + eps):
///   grad_input  = r * grad_output * weight - input * (r^3 / hidden) * sum(grad_output * weight *
///   input) grad_weight = sum over all rows of grad_output * input * r  (float32 [hidden],
///   overwritten)
/// grad_output and grad_input have input's shape and dtype (grad_input may be grad_output
/// itself); weight is [hidden] of input's dtype; workspace as rmsnorm_backward_workspace_rows
/// says. Deterministic: the sums' order depends on the shape only.
inline void rmsnorm_backward(TensorView grad_input, TensorView grad_weight, TensorView workspace,
                             TensorView grad_output, TensorView input, TensorView weight,
                             double eps) {
  SymbolicSize hidden{"hidden"}, partials{"num_partials"};
  SymbolicDtype dtype;
  SymbolicDevice device;
  TensorMatcher()
      .dtype<fp32_t, fp16_t, bf16_t>(dtype)
      .device(kDLCUDA, device)
      .rows(hidden)
      .verify(input, "input");
  TensorMatcher()
      .dtype(dtype)
      .device(kDLCUDA, device)
      .same_shape_as(input, "input")
      .verify(grad_output, "grad_output");
  TensorMatcher()
      .dtype(dtype)
      .device(kDLCUDA, device)
      .same_shape_as(input, "input")
      .verify(grad_input, "grad_input");
  TensorMatcher({hidden})
      .dtype(dtype)
      .device(kDLCUDA, device)
      .contiguous()
      .verify(weight, "weight");
  TensorMatcher({hidden})
      .dtype<fp32_t>()
      .device(kDLCUDA, device)
      .contiguous()
      .verify(grad_weight, "grad_weight");
  check_norm_eps(eps);
  const RowMatrix x = as_rows(input, "input"), g = as_rows(grad_output, "grad_output"),
                  dx = as_rows(grad_input, "grad_input"), w = as_rows(weight, "weight");
  partials.bind(norm::backward_partials(x.rows), "rmsnorm_backward_workspace_rows(input rows)");
  TensorMatcher({partials, hidden})
      .dtype<fp32_t>()
      .device(kDLCUDA, device)
      .contiguous()
      .verify(workspace, "workspace");
  verify_output(grad_input, "grad_input",
                {{grad_output, "grad_output", Aliasing::kSameView},
                 {input, "input"},
                 {weight, "weight"},
                 {grad_weight, "grad_weight"},
                 {workspace, "workspace"}});
  verify_output(grad_weight, "grad_weight",
                {{grad_output, "grad_output"},
                 {input, "input"},
                 {weight, "weight"},
                 {workspace, "workspace"}});
  verify_output(workspace, "workspace",
                {{grad_output, "grad_output"}, {input, "input"}, {weight, "weight"}});
  if (x.cols == 0) return;
  RuntimeCheck(x.rows < (int64_t{1} << 40), "rmsnorm_backward: at most 2^40 rows, got ", x.rows);
  norm::BackwardParams p{};
  p.grad_input = dx.data;
  p.grad_input_stride = dx.row_stride;
  p.grad_output = g.data;
  p.grad_output_stride = g.row_stride;
  p.input = x.data;
  p.input_stride = x.row_stride;
  p.weight = w.data;
  p.workspace = data_ptr<float>(workspace);
  p.rows = x.rows;
  p.cols = x.cols;
  p.eps = static_cast<float>(eps);
  p.inv_cols = 1.0f / static_cast<float>(x.cols);
  const bool aligned = norm::vec_aligned(dtype.value(), {x, g, dx, w});
  dispatch_dtype<fp32_t, fp16_t, bf16_t>(dtype.value(), "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    norm::launch_backward<T>(p, partials.value(), aligned, data_ptr<float>(grad_weight),
                             device.value());
  });
}

}  // namespace mllm_kernel::cuda
