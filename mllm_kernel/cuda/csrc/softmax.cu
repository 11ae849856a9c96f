// Softmax over the last dim and its backward, fp32 math.
//
// Forward, y = exp(x / t - max) / sum, in four tiers by row length:
//   registers  up to 2048 vectors (8k fp32 / 16k bf16), one CTA of up to 512 threads
//              per row, the row in registers: read once, write once. Past that a
//              1024-thread CTA fills an SM and drops to 59% of a copy (H200).
//   cluster    few rows (decode) of up to 16 CTAs' registers (256k fp32 / 512k bf16;
//              8 CTAs where the device cannot schedule 16): the row is split over a
//              thread-block cluster, read once, write once, and up to 16 SMs on a row.
//   shared     the rest: each row split into slices of at most 64 KiB over a cluster
//              of up to 16 CTAs, each slice kept in shared memory. Pass 1 reads the
//              slice once with an online max/sum, pass 2 normalises it from shared
//              memory. Small slices let several CTAs share an SM, so one's loads
//              overlap another's stores: at 32k fp32 a row-sized CTA filling an SM
//              reached 78% / 61% of a copy (H100 / H200), 64 KiB slices 92% / 88%.
//              Slices are loaded with cp.async, all of a thread's loads (8 vectors,
//              backward 8 of each input) in flight at once: at 16k fp32 90% of a
//              copy against 83% for plain loads (H200); 8 vectors per thread beat 16
//              by 1-4%, the most at 128k (87% against 83%). Before sm_80 (no
//              cp.async) they are plain loads, so that the op runs on every arch.
//   global     rows too long even for that (> 8 x 227 KiB): pass 2 re-reads the row.
// The online pass keeps a running (max m, sum s) per thread and rescales s when m
// grows, so max and sum come from one read; the block, then the cluster (through
// distributed shared memory), merge the pairs.
//
// Backward, dx = y * (dy - sum(dy * y)): the register (up to 2048 vectors), shared and
// global tiers, with y and dy both cached. Rows whose length or alignment does not
// allow 16-byte vectors use the register tier (up to 4096 elements) or the global tier
// one element at a time.
#include <cooperative_groups.h>

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "mllm_kernel/cuda/cp_async.cuh"
#include "mllm_kernel/rows.hpp"
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.cuh"

namespace mllm_kernel::cuda {
namespace softmax {

inline constexpr int kCachedVecs = 4;
inline constexpr int kMaxThreads = 1024;
inline constexpr int kMaxCluster = 8;         // the portable cluster size limit
inline constexpr int kClusterCtaVecs = 1024;  // preferred slice: 256 threads x 4 vectors
// Rows of up to kRegisterVecs vectors take the register tiers, at most
// kRegisterThreads threads per row.
inline constexpr int64_t kRegisterVecs = 2048;
inline constexpr int kRegisterThreads = 512;
// The shared tier: the slice of a row one CTA prefers, and the most CTAs sharing a row.
inline constexpr int64_t kSliceBytes = 64 * 1024;
inline constexpr int kMaxSliceCluster = 16;

struct Params {
  void* out;
  int64_t out_stride;
  const void* in;  // forward: x; backward: y (the forward output)
  int64_t in_stride;
  const void* grad;  // backward: dy
  int64_t grad_stride;
  int64_t num_vecs;    // per row
  int64_t slice_vecs;  // per CTA (shared, global and cluster tiers)
  float scale;         // forward: log2(e) / temperature, so exp(x / t) = 2^(x * scale)
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

  /// Loads the slice as it is; returns the block's max of x * scale (each product
  /// rounded: m is one of them). Every load is issued before any math: math between
  /// the guarded loads serialises them (measured on the backward: 91% -> 106% of a
  /// copy, H200).
  __device__ __forceinline__ float load(const T* in, float scale) {
    Vec<T, N> raw[kCachedVecs];
#pragma unroll
    for (int k = 0; k < kCachedVecs; ++k) {
      if (vec(k) < end) raw[k].load(in + vec(k) * N);
    }
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < kCachedVecs; ++k) {
      if (vec(k) < end) {
#pragma unroll
        for (int i = 0; i < N; ++i) {
          x[k][i] = to_float(raw[k][i]);
          m = fmaxf(m, x[k][i] * scale);
        }
      }
    }
    return block_reduce_max(m);
  }

  /// Replaces x by 2^(x scale - m); returns the block's sum (0 for a slice all -inf,
  /// NaN for one holding a NaN). The exponent is one fma: its error is relative to its
  /// own size, where a rounded x * scale carried that of |x * scale| into every term
  /// (4e-4 relative at |x| = 1e4).
  __device__ __forceinline__ float exp_sum(float m, float scale) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < kCachedVecs; ++k) {
      if (vec(k) < end) {
#pragma unroll
        for (int i = 0; i < N; ++i) {
          const float v = x[k][i];
          x[k][i] = m == -INFINITY ? (v != v ? v : 0.0f) : fast_exp2(fmaf(v, scale, -m));
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
  const float inv_sum = 1.0f / slice.exp_sum(m, p.scale);
  slice.store(static_cast<T*>(p.out) + row * p.out_stride, inv_sum);
}

/// Cluster launches call this first, before their loads: cluster_merge waits on it,
/// since a CTA may write into a peer's shared memory only once that peer runs.
__device__ __forceinline__ void cluster_arrive_started() {
#if __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().barrier_arrive();
#endif
}

/// Trades a CTA's (max, sum) pair of its slice (forward; backward: only the sum, of
/// dy * y) with the other CTAs of its cluster; every thread gets the row's. Each CTA
/// pushes its pair into every peer's shared memory, so after one barrier all reads are
/// local and no CTA waits for its peers again before it exits (pulling the pairs from
/// the peers took a second barrier, to keep each CTA alive until read).
template <bool kBackward>
__device__ __forceinline__ void cluster_merge(float& m, float& s) {
#if __CUDA_ARCH__ >= 900  // clusters exist from Hopper on; the host launches none before
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  __shared__ float2 slice_stats[kMaxSliceCluster];  // the pair of peer r at r
  const unsigned size = cluster.num_blocks();
  cluster.barrier_wait();  // of cluster_arrive_started: every peer runs
  if (threadIdx.x < size) {
    *cluster.map_shared_rank(&slice_stats[cluster.block_rank()], threadIdx.x) = make_float2(m, s);
  }
  cluster.sync();
  float row_max = -INFINITY, row_sum = 0.0f;
  if constexpr (!kBackward) {
    for (unsigned r = 0; r < size; ++r) row_max = fmaxf(row_max, slice_stats[r].x);
  }
  for (unsigned r = 0; r < size; ++r) {
    const float2 peer = slice_stats[r];
    if (kBackward) {
      row_sum += peer.y;
    } else if (peer.y != 0.0f) {  // a slice all -inf adds nothing (and -inf - -inf is NaN)
      row_sum += peer.y * fast_exp2(peer.x - row_max);
    }
  }
  m = row_max;
  s = row_sum;
#endif
}

/// Cluster tier: CTA `rank` of a cluster holds vectors [rank * slice, (rank + 1) * slice)
/// of row blockIdx.x / cluster size in registers.
template <typename T, int N>
__global__ void __launch_bounds__(kMaxThreads) softmax_cluster_kernel(const Params p) {
  cluster_arrive_started();
  const unsigned size = cluster_num_blocks();
  const int64_t row = blockIdx.x / size;
  const int64_t begin = (blockIdx.x % size) * p.slice_vecs;
  RegisterSlice<T, N> slice{
      {}, begin, begin + p.slice_vecs < p.num_vecs ? begin + p.slice_vecs : p.num_vecs};
  const float m = slice.load(row_of<T, N>(p.in, p.in_stride, row), p.scale);
  float row_max = m, row_sum = slice.exp_sum(m, p.scale);
  cluster_merge<false>(row_max, row_sum);
  // A row that is -inf throughout gives NaN, as in the other tiers (and torch); so does
  // a row whose sum is NaN (a NaN in some slice), also in slices all -inf here.
  const float factor = row_max == -INFINITY ? NAN
                       : m == -INFINITY     ? (row_sum == row_sum ? 0.0f : NAN)
                                            : fast_exp2(m - row_max) / row_sum;
  slice.store(static_cast<T*>(p.out) + row * p.out_stride, factor);
}

/// Folds the vector `x` into a running (max m, sum s) of 2^(x scale): m is a rounded
/// product, each exponent one fma (RegisterSlice::exp_sum says why). A NaN makes s NaN,
/// which every merge after keeps, so that the row's outputs are NaN.
template <int N>
__device__ __forceinline__ void online_add(float& m, float& s, const float (&x)[N], float scale) {
  float vec_max = -INFINITY;
  bool nan = false;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    vec_max = fmaxf(vec_max, x[i] * scale);
    nan |= x[i] != x[i];
  }
  const float new_m = fmaxf(m, vec_max);
  if (nan) s = NAN;
  if (new_m == -INFINITY) return;  // everything so far is -inf: nothing to add
  float added = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i) added += fast_exp2(fmaf(x[i], scale, -new_m));
  s = (s == 0.0f ? 0.0f : s * fast_exp2(m - new_m)) + added;
  m = new_m;
}

/// How the shared and global tiers read a slice: (kShared) each thread copies its
/// vectors into shared memory with cp.async, all in flight at once, before pass 1, and
/// pass 2 reads the copy; or (kGlobal) both passes read global memory, pass 2 from L2.
enum class Load { kGlobal, kShared };

/// Starts copying vector `src` into shared memory at `dst`, for this thread to read back
/// after wait_shared_copies(). cp.async from sm_80 on; before it (no cp.async) a plain
/// load and store, done by the time it returns.
template <typename T, int N>
__device__ __forceinline__ void copy_to_shared(Vec<T, N>* dst, const T* src) {
#if __CUDA_ARCH__ >= 800
  cp_async_16(dst, src);
#else
  dst->load(src);
#endif
}

/// Waits for this thread's copy_to_shared() copies.
__device__ __forceinline__ void wait_shared_copies() {
#if __CUDA_ARCH__ >= 800
  cp_async_wait_all();
#endif
}

/// The shared and global tiers, forward and backward: CTA blockIdx.x % cluster size
/// takes slice [rank * slice_vecs, (rank + 1) * slice_vecs) of row blockIdx.x / cluster
/// size (a cluster of one: the whole row). Pass 1 reads the slice once and reduces it
/// (forward: online max and sum; backward: sum(dy * y)); the CTAs of a row trade
/// their partial results; pass 2 writes the slice.
template <typename T, int N, bool kBackward, Load kLoad>
__global__ void __launch_bounds__(kMaxThreads) softmax_rows_kernel(const Params p) {
  constexpr bool kShared = kLoad == Load::kShared;
  extern __shared__ uint4 shared_slice[];  // kShared: the slice of in, then of grad
  Vec<T, N>* cached_in = reinterpret_cast<Vec<T, N>*>(shared_slice);
  Vec<T, N>* cached_grad = cached_in + p.slice_vecs;
  const unsigned size = cluster_num_blocks();
  if (size > 1) cluster_arrive_started();
  const int64_t row = blockIdx.x / size;
  const int64_t begin = (blockIdx.x % size) * p.slice_vecs;
  const int64_t end = begin + p.slice_vecs < p.num_vecs ? begin + p.slice_vecs : p.num_vecs;
  const T* in = row_of<T, N>(p.in, p.in_stride, row);
  const T* grad = kBackward ? row_of<T, N>(p.grad, p.grad_stride, row) : nullptr;

  // Vector v of `src` (in or grad), from its shared copy or from global memory.
  auto vec_of = [&](const T* src, const Vec<T, N>* cache, int64_t v) {
    Vec<T, N> a;
    if constexpr (kShared) {
      a = cache[v - begin];
    } else {
      a.load(src + v * N);
    }
    return a;
  };

  float m = -INFINITY, s = 0.0f;  // backward: s is the dot product
  if constexpr (kShared) {
    // Each thread reads back only what it copied: no barrier needed.
    for (int64_t v = begin + threadIdx.x; v < end; v += blockDim.x) {
      copy_to_shared(&cached_in[v - begin], in + v * N);
      if constexpr (kBackward) copy_to_shared(&cached_grad[v - begin], grad + v * N);
    }
    wait_shared_copies();
  }
#pragma unroll 4
  for (int64_t v = begin + threadIdx.x; v < end; v += blockDim.x) {
    const Vec<T, N> a = vec_of(in, cached_in, v);
    if constexpr (kBackward) {
      const Vec<T, N> g = vec_of(grad, cached_grad, v);
#pragma unroll
      for (int i = 0; i < N; ++i) s += to_float(a[i]) * to_float(g[i]);
    } else {
      float x[N];
#pragma unroll
      for (int i = 0; i < N; ++i) x[i] = to_float(a[i]);
      online_add(m, s, x, p.scale);
    }
  }
  if constexpr (kBackward) {
    s = block_reduce_sum(s);
  } else {
    block_merge(m, s);
  }
  if (size > 1) cluster_merge<kBackward>(m, s);
  // Forward: a row that is -inf throughout gives 2^(-inf - -inf) = NaN, as in torch.
  const float inv_sum = 1.0f / s;

  T* out = static_cast<T*>(p.out) + row * p.out_stride;
#pragma unroll 4
  for (int64_t v = begin + threadIdx.x; v < end; v += blockDim.x) {
    const Vec<T, N> a = vec_of(in, cached_in, v);
    Vec<T, N> y;
    if constexpr (kBackward) {
      const Vec<T, N> g = vec_of(grad, cached_grad, v);
#pragma unroll
      for (int i = 0; i < N; ++i) y[i] = from_float<T>(to_float(a[i]) * (to_float(g[i]) - s));
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) {
        y[i] = from_float<T>(fast_exp2(fmaf(to_float(a[i]), p.scale, -m)) * inv_sum);
      }
    }
    y.store(out + v * N);
  }
}

// --- backward ---------------------------------------------------------------

// Vectorised rows (up to kRegisterVecs) take 2 vectors per thread (4 past 1024 vectors),
// at most kRegisterThreads threads: the bound leaves room for y and dy in registers
// without spilling.
template <typename T, int N>
__global__ void __launch_bounds__(N == 1 ? kMaxThreads : kRegisterThreads)
    softmax_backward_registers_kernel(const Params p) {
  const int64_t row = blockIdx.x;
  const T* y_row = row_of<T, N>(p.in, p.in_stride, row);
  const T* g_row = row_of<T, N>(p.grad, p.grad_stride, row);
  Vec<T, N> y[kCachedVecs], g[kCachedVecs];
  // All loads first, then the math (see RegisterSlice::load).
#pragma unroll
  for (int k = 0; k < kCachedVecs; ++k) {
    const int64_t v = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (v < p.num_vecs) y[k].load(y_row + v * N);
  }
#pragma unroll
  for (int k = 0; k < kCachedVecs; ++k) {
    const int64_t v = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (v < p.num_vecs) g[k].load(g_row + v * N);
  }
  float dot = 0.0f;
#pragma unroll
  for (int k = 0; k < kCachedVecs; ++k) {
    const int64_t v = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (v < p.num_vecs) {
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

/// How the shared / global tiers lay rows out: slices per row (a cluster), threads
/// per slice, and how slices are read.
struct RowsPlan {
  int cluster;
  int threads;
  Load load;
};

/// The plan for rows of `vecs` vectors (backward: of y and of dy), on clusters of at most
/// `max_cluster` CTAs. Slices of at most kSliceBytes let several CTAs share an SM, so
/// one's loads overlap another's stores (a row-sized CTA that fills an SM cannot); past
/// what max_cluster such slices hold, 8 bigger slices (the portable cluster size, which
/// any Hopper schedules even with CTAs that fill an SM) up to what shared memory takes;
/// past that, the global tier. Threads and load style as measured best (H100, H200).
inline RowsPlan plan_rows(int64_t vecs, bool backward, int max_cluster, DLDevice dev) {
  // Leave room for the reductions' static shared memory.
  const auto limit = static_cast<int64_t>(max_shared_memory_per_block(dev)) - 1024;
  const auto slice_bytes = [&](int cluster) {
    return div_ceil<int64_t>(vecs, cluster) * 16 * (backward ? 2 : 1);
  };
  int cluster = 1;
  while (cluster < max_cluster && slice_bytes(cluster) > kSliceBytes) cluster *= 2;
  if (slice_bytes(cluster) > kSliceBytes && max_cluster >= kMaxCluster) cluster = kMaxCluster;
  if (slice_bytes(cluster) > limit) return {1, kMaxThreads, Load::kGlobal};
  const int64_t slice = div_ceil<int64_t>(vecs, cluster);
  return {cluster, threads_for(slice, 8), Load::kShared};
}

/// Launches softmax_rows_kernel over `rows` rows of `vecs` vectors as `plan` says.
template <typename T, int N, bool kBackward, Load kLoad>
void launch_rows(Params p, int64_t rows, int64_t vecs, const RowsPlan& plan, DLDevice dev) {
  RuntimeCheck(rows * plan.cluster < (int64_t{1} << 31), "softmax: too many rows (", rows, ")");
  p.num_vecs = vecs;
  p.slice_vecs = div_ceil<int64_t>(vecs, plan.cluster);
  const int64_t shared_bytes =
      kLoad == Load::kGlobal ? 0 : p.slice_vecs * N * sizeof(T) * (kBackward ? 2 : 1);
  KernelLauncher(dim3(static_cast<unsigned>(rows * plan.cluster)), dim3(plan.threads), dev,
                 static_cast<std::size_t>(shared_bytes))
      .cluster(static_cast<unsigned>(plan.cluster))(softmax_rows_kernel<T, N, kBackward, kLoad>, p);
}

template <typename T, int N, bool kBackward>
void run_rows(Params p, int64_t rows, int64_t vecs, const RowsPlan& plan, DLDevice dev) {
  switch (plan.load) {
    case Load::kGlobal:
      return launch_rows<T, N, kBackward, Load::kGlobal>(p, rows, vecs, plan, dev);
    case Load::kShared:
      return launch_rows<T, N, kBackward, Load::kShared>(p, rows, vecs, plan, dev);
  }
}

/// The largest cluster `kKernel` may be launched with on `dev`: 16 (beyond the portable
/// 8) where the device schedules a cluster of 16 of its biggest CTAs (kMaxThreads
/// threads, kSharedBytes of dynamic shared memory), else 8; 1 before Hopper.
template <auto kKernel, std::size_t kSharedBytes>
int max_cluster(DLDevice dev) {
  static int cache[64] = {};
  int& result = cache[dev.device_id % 64];
  if (result == 0 && !has_clusters(dev)) result = 1;
  if (result == 0) {
    const bool fits =
        max_active_clusters(kKernel, kMaxSliceCluster, kMaxThreads, kSharedBytes, dev) > 0;
    result = fits ? kMaxSliceCluster : kMaxCluster;
  }
  return result;
}

template <typename T, int N, bool kBackward>
int max_rows_cluster(DLDevice dev) {
  // The kernel that plan_rows launches in clusters.
  return max_cluster<softmax_rows_kernel<T, N, kBackward, Load::kShared>, kSliceBytes>(dev);
}

/// The cluster size of the cluster tier for `rows` rows of `vecs` vectors, 0 where the
/// tier does not apply: more rows than 2 x SMs / 8 keep every SM busy anyway, and the
/// shared tier's several CTAs per SM overlap better (measured). The smallest cluster
/// whose CTAs hold at most kClusterCtaVecs, up to 16 where the device schedules it and
/// the rows' CTAs stay within 2 per SM, else 8. More SMs on a row pay: 1 / 8 / 16 rows
/// of 128k fp32 took 5.9 / 7.4 / 12.0 us through softmax() in clusters of 16, against
/// 7.9 / 8.3 / 15.8 us for a bare launch in clusters of 8 (H200, before the one-
/// instruction vector stores; after them 6.4 / 7.0 / 11.3 us against 6.5 / 6.7 / 12.5 us,
/// softmax() costing about 0.4 us more than a bare launch).
template <typename T, int N>
int register_cluster(int64_t rows, int64_t vecs, DLDevice dev) {
  const int64_t sms = num_sms(dev);
  if (!has_clusters(dev) || rows * kMaxCluster > 2 * sms) return 0;
  const int largest = max_cluster<softmax_cluster_kernel<T, N>, 0>(dev);
  int cluster = 2;
  while (cluster < largest && vecs > int64_t{cluster} * kClusterCtaVecs) cluster *= 2;
  if (rows * cluster > 2 * sms) cluster = kMaxCluster;
  return vecs <= int64_t{cluster} * kMaxThreads * kCachedVecs ? cluster : 0;
}

/// The shared or global tier for `rows` rows of `vecs` aligned vectors.
template <typename T, int N, bool kBackward>
void run_rows(Params p, int64_t rows, int64_t vecs, DLDevice dev) {
  run_rows<T, N, kBackward>(
      p, rows, vecs, plan_rows(vecs, kBackward, max_rows_cluster<T, N, kBackward>(dev), dev), dev);
}

}  // namespace softmax

/// out = softmax(x / temperature) over the last dim; `out` may alias `x`.
inline void softmax_forward(TensorView out, TensorView x, double temperature) {
  using namespace softmax;
  SymbolicSize cols{"cols"};
  SymbolicDtype dtype;
  SymbolicDevice device;
  TensorMatcher()
      .dtype<fp32_t, fp16_t, bf16_t>(dtype)
      .device(kDLCUDA, device)
      .rows(cols)
      .verify(x, "x");
  TensorMatcher().dtype(dtype).device(kDLCUDA, device).same_shape_as(x, "x").verify(out, "out");
  verify_output(out, "out", {{x, "x", Aliasing::kSameView}});
  ValueCheck(temperature > 0.0 && std::isfinite(temperature),
             "argument 'temperature': expected a finite value > 0, got ", temperature);
  const RowMatrix xs = as_rows(x, "x"), ys = as_rows(out, "out");
  if (xs.rows == 0 || xs.cols == 0) return;
  RuntimeCheck(xs.rows < (int64_t{1} << 31), "softmax: at most 2^31 - 1 rows, got ", xs.rows);
  Params p{.out = ys.data,
           .out_stride = ys.row_stride,
           .in = xs.data,
           .in_stride = xs.row_stride,
           // Capped where log2(e) / t passes FLT_MAX (t < 4.2e-39): as the CPU kernel's
           // scale, so that the max's (x - max) * scale is 0, not 0 * inf = NaN.
           .scale = static_cast<float>(std::fmin(kLog2e / temperature, FLT_MAX))};
  const DLDevice dev = device.value();

  dispatch_dtype<fp32_t, fp16_t, bf16_t>(dtype.value(), "x", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int W = kVecWidth<T>;
    const int64_t n = xs.cols;
    const bool aligned = xs.vec_aligned(sizeof(T), W) && ys.vec_aligned(sizeof(T), W);
    const int64_t vecs = n / W;
    if (aligned && vecs <= kRegisterVecs) {
      // At most 512 threads: threads_for(kRegisterVecs, kCachedVecs).
      run(softmax_registers_kernel<T, W>, p, xs.rows, vecs, threads_for(vecs, kCachedVecs), dev);
    } else if (const int cluster = aligned ? register_cluster<T, W>(xs.rows, vecs, dev) : 0) {
      // Few long rows (decode): spread each over a cluster's registers, read once.
      p.num_vecs = vecs;
      p.slice_vecs = div_ceil<int64_t>(vecs, cluster);
      KernelLauncher(dim3(static_cast<unsigned>(xs.rows * cluster)),
                     dim3(threads_for(p.slice_vecs, kCachedVecs)), dev)
          .cluster(static_cast<unsigned>(cluster))(softmax_cluster_kernel<T, W>, p);
    } else if (aligned) {
      run_rows<T, W, false>(p, xs.rows, vecs, dev);
    } else if (n <= kMaxThreads * kCachedVecs) {
      run(softmax_registers_kernel<T, 1>, p, xs.rows, n, threads_for(n, kCachedVecs), dev);
    } else {
      run_rows<T, 1, false>(p, xs.rows, n, RowsPlan{1, kMaxThreads, Load::kGlobal}, dev);
    }
  });
}

/// grad_input = out * (grad_out - sum(grad_out * out)) over the last dim.
inline void softmax_backward(TensorView grad_input, TensorView grad_out, TensorView out) {
  using namespace softmax;
  SymbolicSize cols{"cols"};
  SymbolicDtype dtype;
  SymbolicDevice device;
  TensorMatcher()
      .dtype<fp32_t, fp16_t, bf16_t>(dtype)
      .device(kDLCUDA, device)
      .rows(cols)
      .verify(out, "out");
  TensorMatcher()
      .dtype(dtype)
      .device(kDLCUDA, device)
      .same_shape_as(out, "out")
      .verify(grad_out, "grad_out");
  TensorMatcher()
      .dtype(dtype)
      .device(kDLCUDA, device)
      .same_shape_as(out, "out")
      .verify(grad_input, "grad_input");
  verify_output(grad_input, "grad_input", {{grad_out, "grad_out"}, {out, "out"}});
  const RowMatrix ys = as_rows(out, "out"), gs = as_rows(grad_out, "grad_out"),
                  dxs = as_rows(grad_input, "grad_input");
  if (ys.rows == 0 || ys.cols == 0) return;
  RuntimeCheck(ys.rows < (int64_t{1} << 31), "softmax_backward: at most 2^31 - 1 rows, got ",
               ys.rows);
  Params p{.out = dxs.data,
           .out_stride = dxs.row_stride,
           .in = ys.data,
           .in_stride = ys.row_stride,
           .grad = gs.data,
           .grad_stride = gs.row_stride,
           .scale = 1.0f};
  const DLDevice dev = device.value();

  dispatch_dtype<fp32_t, fp16_t, bf16_t>(dtype.value(), "out", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int W = kVecWidth<T>;
    const int64_t n = ys.cols;
    const bool aligned = ys.vec_aligned(sizeof(T), W) && gs.vec_aligned(sizeof(T), W) &&
                         dxs.vec_aligned(sizeof(T), W);
    if (aligned && n / W <= kRegisterVecs) {
      // 2 vectors of each per thread: measured a little ahead of 4 (H200); past 1024
      // vectors, up to 4 in kRegisterThreads threads (104% of a copy at 8k fp32, H200).
      const int threads = std::min(threads_for(n / W, 2), kRegisterThreads);
      run(softmax_backward_registers_kernel<T, W>, p, ys.rows, n / W, threads, dev);
    } else if (aligned) {
      run_rows<T, W, true>(p, ys.rows, n / W, dev);
    } else if (n <= kMaxThreads * kCachedVecs) {
      run(softmax_backward_registers_kernel<T, 1>, p, ys.rows, n, threads_for(n, kCachedVecs), dev);
    } else {
      run_rows<T, 1, true>(p, ys.rows, n, RowsPlan{1, kMaxThreads, Load::kGlobal}, dev);
    }
  });
}

}  // namespace mllm_kernel::cuda
