// Softmax over the last dim and its backward, one CTA per row, fp32 math.
//
// Forward, y = exp(x / t - max) / sum, in four tiers by row length:
//   registers  up to 4 vectors per thread (16k fp32 / 32k bf16): read once, write once.
//   cluster    few rows (decode) of up to 8 CTAs' registers (128k fp32 / 256k bf16):
//              the row is split over a thread-block cluster; each CTA reduces its
//              slice to a (max, sum) pair and the CTAs trade pairs through distributed
//              shared memory. Read once, write once, and up to 8x the SMs on a row.
//   shared     the row fits the block's shared memory (~56k fp32 / ~113k bf16 on
//              Hopper): pass 1 reads global memory once, keeping the row in shared
//              memory, with an online max/sum; pass 2 normalises from shared memory.
//   global     longer rows: the same single online pass, then pass 2 re-reads the row.
// The online pass keeps a running (max m, sum s) per thread and rescales s when m
// grows, so max and sum come from one read; the block then merges the pairs.
//
// Backward, dx = y * (dy - sum(dy * y)): a register tier and a two-pass tier.
// Rows whose length or alignment does not allow 16-byte vectors use the register
// tier (up to 4096 elements) or the global tier one element at a time.
#include <cooperative_groups.h>

#include <cmath>

#include "mllm_kernel/cuda/rows.hpp"
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.cuh"

namespace mllm_kernel::cuda {
namespace softmax {

inline constexpr int kCachedVecs = 4;
inline constexpr int kMaxThreads = 1024;
inline constexpr int kMaxCluster = 8;         // the portable cluster size limit
inline constexpr int kClusterCtaVecs = 2048;  // preferred slice: 512 threads x 4 vectors

struct Params {
  void* out;
  int64_t out_stride;
  const void* in;  // forward: x; backward: y (the forward output)
  int64_t in_stride;
  const void* grad;  // backward: dy
  int64_t grad_stride;
  int64_t num_vecs;
  float scale;  // forward: log2(e) / temperature, so exp(x / t) = 2^(x * scale)
};

template <typename T, int N>
__device__ __forceinline__ const T* row_of(const void* base, int64_t stride, int64_t row) {
  return static_cast<const T*>(base) + row * stride;
}

/// Merges the threads' running (max, sum) pairs; every thread gets the row's.
__device__ __forceinline__ void block_merge(float& m, float& s) {
  const float row_max = block_reduce_max(m);
  const float rescaled = s == 0.0f ? 0.0f : s * fast_exp2(m - row_max);
  s = block_reduce_sum(rescaled);
  m = row_max;
}

// --- forward ----------------------------------------------------------------

/// Vectors [begin, end) of a row, held in registers: thread t keeps vectors
/// begin + t + k * blockDim.x, k < kCachedVecs (the register and cluster tiers).
template <typename T, int N>
struct RegisterSlice {
  float x[kCachedVecs][N];
  int64_t begin, end;

  __device__ __forceinline__ int64_t vec(int k) const {
    return begin + threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
  }

  /// Loads the slice times `scale`; returns the block's max.
  __device__ __forceinline__ float load(const T* in, float scale) {
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < kCachedVecs; ++k) {
      if (vec(k) < end) {
        Vec<T, N> a;
        a.load_stream(in + vec(k) * N);
#pragma unroll
        for (int i = 0; i < N; ++i) {
          x[k][i] = to_float(a[i]) * scale;
          m = fmaxf(m, x[k][i]);
        }
      }
    }
    return block_reduce_max(m);
  }

  /// Replaces x by 2^(x - m); returns the block's sum (0 for a slice all -inf).
  __device__ __forceinline__ float exp_sum(float m) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < kCachedVecs; ++k) {
      if (vec(k) < end) {
#pragma unroll
        for (int i = 0; i < N; ++i) {
          x[k][i] = m == -INFINITY ? 0.0f : fast_exp2(x[k][i] - m);
          s += x[k][i];
        }
      }
    }
    return block_reduce_sum(s);
  }

  __device__ __forceinline__ void store(T* out, float factor) const {
#pragma unroll
    for (int k = 0; k < kCachedVecs; ++k) {
      if (vec(k) < end) {
        Vec<T, N> y;
#pragma unroll
        for (int i = 0; i < N; ++i) y[i] = from_float<T>(x[k][i] * factor);
        y.store(out + vec(k) * N);
      }
    }
  }
};

template <typename T, int N>
__global__ void __launch_bounds__(kMaxThreads) softmax_registers_kernel(const Params p) {
  const int64_t row = blockIdx.x;
  RegisterSlice<T, N> slice{{}, 0, p.num_vecs};
  const float m = slice.load(row_of<T, N>(p.in, p.in_stride, row), p.scale);
  // A row that is -inf throughout: the sum is 0 and 0 * inf gives NaN, as in torch.
  const float inv_sum = 1.0f / slice.exp_sum(m);
  slice.store(static_cast<T*>(p.out) + row * p.out_stride, inv_sum);
}

/// Cluster tier: CTA `rank` of a cluster holds vectors [rank * slice, (rank + 1) * slice)
/// of row blockIdx.x / cluster size in registers.
template <typename T, int N>
__global__ void __launch_bounds__(kMaxThreads) softmax_cluster_kernel(const Params p) {
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const unsigned size = cluster.num_blocks();
  const int64_t row = blockIdx.x / size;
  const int64_t per_cta = div_ceil<int64_t>(p.num_vecs, size);
  const int64_t begin = cluster.block_rank() * per_cta;
  RegisterSlice<T, N> slice{{}, begin, begin + per_cta < p.num_vecs ? begin + per_cta : p.num_vecs};
  const float m = slice.load(row_of<T, N>(p.in, p.in_stride, row), p.scale);
  const float s = slice.exp_sum(m);

  // Trade (max, sum) with the other CTAs of the row and merge them.
  __shared__ float2 slice_stats;
  if (threadIdx.x == 0) slice_stats = make_float2(m, s);
  cluster.sync();
  float row_max = -INFINITY;
  for (unsigned r = 0; r < size; ++r)
    row_max = fmaxf(row_max, cluster.map_shared_rank(&slice_stats, r)->x);
  float row_sum = 0.0f;
  for (unsigned r = 0; r < size; ++r) {
    const float2 peer = *cluster.map_shared_rank(&slice_stats, r);
    if (peer.y != 0.0f) row_sum += peer.y * fast_exp2(peer.x - row_max);
  }
  cluster.sync();  // no CTA leaves (freeing its slice_stats) while a peer still reads it

  // A row that is -inf throughout gives NaN, as in the other tiers (and torch).
  const float factor = row_max == -INFINITY ? NAN
                       : m == -INFINITY     ? 0.0f
                                            : fast_exp2(m - row_max) / row_sum;
  slice.store(static_cast<T*>(p.out) + row * p.out_stride, factor);
}

/// Shared tier (kShared) and global tier: one online pass, one normalising pass.
template <typename T, int N, bool kShared>
__global__ void __launch_bounds__(kMaxThreads) softmax_two_pass_kernel(const Params p) {
  extern __shared__ uint4 shared_row[];  // kShared: the row, num_vecs * N elements of T
  T* cached = reinterpret_cast<T*>(shared_row);
  const int64_t row = blockIdx.x;
  const T* in = row_of<T, N>(p.in, p.in_stride, row);

  float m = -INFINITY, s = 0.0f;
#pragma unroll 4
  for (int64_t v = threadIdx.x; v < p.num_vecs; v += blockDim.x) {
    Vec<T, N> a;
    if constexpr (kShared) {
      a.load_stream(in + v * N);
      a.store(cached + v * N);
    } else {
      a.load(in + v * N);  // read again in pass 2: keep it in cache
    }
    float x[N];
    float vec_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      x[i] = to_float(a[i]) * p.scale;
      vec_max = fmaxf(vec_max, x[i]);
    }
    const float new_m = fmaxf(m, vec_max);
    if (new_m == -INFINITY) continue;  // everything so far is -inf: nothing to add
    float added = 0.0f;
#pragma unroll
    for (int i = 0; i < N; ++i) added += fast_exp2(x[i] - new_m);
    s = (s == 0.0f ? 0.0f : s * fast_exp2(m - new_m)) + added;
    m = new_m;
  }
  block_merge(m, s);  // its reductions also order the shared-memory writes before pass 2
  const float inv_sum = 1.0f / s;

  T* out = static_cast<T*>(p.out) + row * p.out_stride;
#pragma unroll 4
  for (int64_t v = threadIdx.x; v < p.num_vecs; v += blockDim.x) {
    Vec<T, N> a, y;
    if constexpr (kShared) {
      a.load(cached + v * N);
    } else {
      a.load(in + v * N);
    }
#pragma unroll
    for (int i = 0; i < N; ++i)
      y[i] = from_float<T>(fast_exp2(to_float(a[i]) * p.scale - m) * inv_sum);
    y.store(out + v * N);
  }
}

// --- backward ---------------------------------------------------------------

template <typename T, int N>
__global__ void __launch_bounds__(kMaxThreads) softmax_backward_registers_kernel(const Params p) {
  const int64_t row = blockIdx.x;
  const T* y_row = row_of<T, N>(p.in, p.in_stride, row);
  const T* g_row = row_of<T, N>(p.grad, p.grad_stride, row);
  Vec<T, N> y[kCachedVecs], g[kCachedVecs];
  float dot = 0.0f;
#pragma unroll
  for (int k = 0; k < kCachedVecs; ++k) {
    const int64_t v = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (v < p.num_vecs) {
      y[k].load_stream(y_row + v * N);
      g[k].load_stream(g_row + v * N);
#pragma unroll
      for (int i = 0; i < N; ++i) dot += to_float(y[k][i]) * to_float(g[k][i]);
    }
  }
  dot = block_reduce_sum(dot);
  T* out = static_cast<T*>(p.out) + row * p.out_stride;
#pragma unroll
  for (int k = 0; k < kCachedVecs; ++k) {
    const int64_t v = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (v < p.num_vecs) {
      Vec<T, N> dx;
#pragma unroll
      for (int i = 0; i < N; ++i) {
        dx[i] = from_float<T>(to_float(y[k][i]) * (to_float(g[k][i]) - dot));
      }
      dx.store(out + v * N);
    }
  }
}

template <typename T, int N>
__global__ void __launch_bounds__(kMaxThreads) softmax_backward_two_pass_kernel(const Params p) {
  const int64_t row = blockIdx.x;
  const T* y_row = row_of<T, N>(p.in, p.in_stride, row);
  const T* g_row = row_of<T, N>(p.grad, p.grad_stride, row);
  float dot = 0.0f;
#pragma unroll 4
  for (int64_t v = threadIdx.x; v < p.num_vecs; v += blockDim.x) {
    Vec<T, N> y, g;
    y.load(y_row + v * N);
    g.load(g_row + v * N);
#pragma unroll
    for (int i = 0; i < N; ++i) dot += to_float(y[i]) * to_float(g[i]);
  }
  dot = block_reduce_sum(dot);
  T* out = static_cast<T*>(p.out) + row * p.out_stride;
#pragma unroll 4
  for (int64_t v = threadIdx.x; v < p.num_vecs; v += blockDim.x) {
    Vec<T, N> y, g, dx;
    y.load(y_row + v * N);
    g.load(g_row + v * N);
#pragma unroll
    for (int i = 0; i < N; ++i) dx[i] = from_float<T>(to_float(y[i]) * (to_float(g[i]) - dot));
    dx.store(out + v * N);
  }
}

// --- launching --------------------------------------------------------------

inline int threads_for(int64_t num_vecs, int64_t vecs_per_thread) {
  const int64_t threads =
      round_up<int64_t>(div_ceil<int64_t>(num_vecs, vecs_per_thread), kWarpSize);
  return static_cast<int>(threads < kMaxThreads ? threads : kMaxThreads);
}

template <typename Kernel>
void run(Kernel kernel, Params p, int64_t rows, int64_t num_vecs, int threads, DLDevice device,
         std::size_t shared_bytes = 0) {
  p.num_vecs = num_vecs;
  KernelLauncher(dim3(static_cast<unsigned>(rows)), dim3(threads), device, shared_bytes)(kernel, p);
}

}  // namespace softmax

/// out = softmax(x / temperature) over the last dim; `out` may alias `x`.
inline void softmax_forward(TensorView out, TensorView x, double temperature) {
  using namespace softmax;
  SymbolicDevice device;
  TensorMatcher().dtype<fp32_t, fp16_t, bf16_t>().device(kDLCUDA, device).verify(x, "x");
  TensorMatcher().dtype(x.dtype()).device(kDLCUDA, device).verify(out, "out");
  check_same_shape(out, "out", x, "x");
  ValueCheck(temperature > 0.0 && std::isfinite(temperature),
             "argument 'temperature': expected a finite value > 0, got ", temperature);
  const RowMatrix xs = as_rows(x, "x");
  const RowMatrix ys = as_rows(out, "out");
  if (xs.rows == 0 || xs.cols == 0) return;
  RuntimeCheck(xs.rows < (int64_t{1} << 31), "softmax: at most 2^31 - 1 rows, got ", xs.rows);
  Params p{ys.data, ys.row_stride,
           xs.data, xs.row_stride,
           nullptr, 0,
           0,       static_cast<float>(kLog2e / temperature)};
  const DLDevice dev = device.value();

  dispatch_dtype<fp32_t, fp16_t, bf16_t>(x.dtype(), "x", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int W = kVecWidth<T>;
    const int64_t n = xs.cols;
    const bool aligned = rows_vec_aligned(xs, sizeof(T), W) && rows_vec_aligned(ys, sizeof(T), W);
    // Leave room for the reductions' static shared memory.
    const std::size_t shared_limit = max_shared_memory_per_block(dev) - 1024;
    const std::size_t row_bytes = static_cast<std::size_t>(n) * sizeof(T);
    const int64_t vecs = n / W;
    if (aligned && vecs <= kMaxThreads * kCachedVecs) {
      run(softmax_registers_kernel<T, W>, p, xs.rows, vecs, threads_for(vecs, kCachedVecs), dev);
    } else if (aligned && vecs <= int64_t{kMaxCluster} * kMaxThreads * kCachedVecs &&
               xs.rows * kMaxCluster <= 2 * num_sms(dev)) {
      // Few long rows (decode): spread each over a cluster. With many rows every SM
      // is busy anyway, and the tiers below overlap one row's loads with another's
      // stores better than a cluster of one-CTA-per-SM slices does (measured, H200).
      // The smallest cluster whose CTAs hold at most kClusterCtaVecs, up to kMaxCluster.
      int cluster = 2;
      while (cluster < kMaxCluster && vecs > int64_t{cluster} * kClusterCtaVecs) cluster *= 2;
      const int64_t slice = div_ceil<int64_t>(vecs, cluster);
      p.num_vecs = vecs;
      KernelLauncher(dim3(static_cast<unsigned>(xs.rows * cluster)),
                     dim3(threads_for(slice, kCachedVecs)), dev)
          .cluster(static_cast<unsigned>(cluster))(softmax_cluster_kernel<T, W>, p);
    } else if (aligned && row_bytes <= shared_limit) {
      run(softmax_two_pass_kernel<T, W, true>, p, xs.rows, n / W, kMaxThreads, dev, row_bytes);
    } else if (aligned) {
      run(softmax_two_pass_kernel<T, W, false>, p, xs.rows, n / W, kMaxThreads, dev);
    } else if (n <= kMaxThreads * kCachedVecs) {
      run(softmax_registers_kernel<T, 1>, p, xs.rows, n, threads_for(n, kCachedVecs), dev);
    } else {
      run(softmax_two_pass_kernel<T, 1, false>, p, xs.rows, n, kMaxThreads, dev);
    }
  });
}

/// grad_input = out * (grad_out - sum(grad_out * out)) over the last dim.
inline void softmax_backward(TensorView grad_input, TensorView grad_out, TensorView out) {
  using namespace softmax;
  SymbolicDevice device;
  TensorMatcher().dtype<fp32_t, fp16_t, bf16_t>().device(kDLCUDA, device).verify(out, "out");
  TensorMatcher().dtype(out.dtype()).device(kDLCUDA, device).verify(grad_out, "grad_out");
  TensorMatcher().dtype(out.dtype()).device(kDLCUDA, device).verify(grad_input, "grad_input");
  check_same_shape(grad_out, "grad_out", out, "out");
  check_same_shape(grad_input, "grad_input", out, "out");
  const RowMatrix ys = as_rows(out, "out");
  const RowMatrix gs = as_rows(grad_out, "grad_out");
  const RowMatrix dxs = as_rows(grad_input, "grad_input");
  if (ys.rows == 0 || ys.cols == 0) return;
  RuntimeCheck(ys.rows < (int64_t{1} << 31), "softmax_backward: at most 2^31 - 1 rows, got ",
               ys.rows);
  Params p{dxs.data, dxs.row_stride, ys.data, ys.row_stride, gs.data, gs.row_stride, 0, 1.0f};
  const DLDevice dev = device.value();

  dispatch_dtype<fp32_t, fp16_t, bf16_t>(out.dtype(), "out", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int W = kVecWidth<T>;
    const int64_t n = ys.cols;
    const bool aligned = rows_vec_aligned(ys, sizeof(T), W) && rows_vec_aligned(gs, sizeof(T), W) &&
                         rows_vec_aligned(dxs, sizeof(T), W);
    if (aligned && n / W <= kMaxThreads * kCachedVecs) {
      run(softmax_backward_registers_kernel<T, W>, p, ys.rows, n / W,
          threads_for(n / W, kCachedVecs), dev);
    } else if (aligned) {
      run(softmax_backward_two_pass_kernel<T, W>, p, ys.rows, n / W, kMaxThreads, dev);
    } else if (n <= kMaxThreads * kCachedVecs) {
      run(softmax_backward_registers_kernel<T, 1>, p, ys.rows, n, threads_for(n, kCachedVecs), dev);
    } else {
      run(softmax_backward_two_pass_kernel<T, 1>, p, ys.rows, n, kMaxThreads, dev);
    }
  });
}

}  // namespace mllm_kernel::cuda
