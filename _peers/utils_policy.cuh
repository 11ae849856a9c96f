// Shared CUDA helpers: float conversion for the dtype aliases, vectorised
// global loads/stores, warp and block reductions, and the kernel launcher that
// every op uses (torch's current stream, the tensor's device, launch checked).
#pragma once

#include <cstdlib>

#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/cuda/device_guard.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "mllm_kernel/utils.hpp"

namespace mllm_kernel {

// ---------------------------------------------------------------------------
// Conversions: kernels compute in float and store in the tensor's dtype.
// ---------------------------------------------------------------------------
__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(fp16_t x) {
  return __half2float(x);
}
__device__ __forceinline__ float to_float(bf16_t x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ fp16_t from_float<fp16_t>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ bf16_t from_float<bf16_t>(float x) {
  return __float2bfloat16_rn(x);
}

// ---------------------------------------------------------------------------
// Vectorised access: N elements of T moved as one aligned transaction
// (16 bytes is the widest single load a thread can issue).
// ---------------------------------------------------------------------------
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  static_assert((N & (N - 1)) == 0, "vector width must be a power of two");
  T data[N];

  __device__ __forceinline__ void load(const T* ptr) { *this = *reinterpret_cast<const Vec*>(ptr); }

  /// Stores to global memory in one instruction. A plain struct copy was split by the
  /// compiler into per-element stores in some unrolled loops (247 in softmax.cu; 171
  /// still when copied through a uint4), so 8- and 16-byte vectors go through st.global
  /// (__stwb). Measured on the H200: softmax backward at 128k fp32 82% -> 90% of a
  /// copy, forward 81% -> 83%.
  __device__ __forceinline__ void store(T* ptr) const {
    if constexpr (sizeof(Vec) == 16) {
      __stwb(reinterpret_cast<uint4*>(ptr), make_uint4(word(0), word(1), word(2), word(3)));
    } else if constexpr (sizeof(Vec) == 8) {
      __stwb(reinterpret_cast<uint2*>(ptr), make_uint2(word(0), word(1)));
    } else {
      *reinterpret_cast<Vec*>(ptr) = *this;
    }
  }

  __device__ __forceinline__ T& operator[](int i) { return data[i]; }
  __device__ __forceinline__ const T& operator[](int i) const { return data[i]; }

 private:
  /// Bytes [4k, 4k + 4) of the vector as a 32-bit word (memcpy: __builtin_bit_cast of
  /// the half types crashes nvcc 13.0's front end).
  __device__ __forceinline__ unsigned word(int k) const {
    unsigned bits;
    memcpy(&bits, reinterpret_cast<const char*>(data) + 4 * k, 4);
    return bits;
  }
};

/// Elements of T per 16-byte vector.
template <typename T>
inline constexpr int kVecWidth = 16 / sizeof(T);

/// True when `ptr` is aligned for Vec<T, N> access.
template <typename T, int N>
__host__ __device__ __forceinline__ bool is_vec_aligned(const void* ptr) {
  return reinterpret_cast<std::uintptr_t>(ptr) % (sizeof(T) * N) == 0;
}

/// 2^x with the hardware approximation (2 ulp; 2^-inf = 0). Softmax-style code
/// folds log2(e) into its scale and calls this instead of expf.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

inline constexpr float kLog2e = 1.4426950408889634f;

// ---------------------------------------------------------------------------
// Reductions.
// ---------------------------------------------------------------------------
inline constexpr int kWarpSize = 32;

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
  static constexpr float kIdentity = 0.0f;
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
  static constexpr float kIdentity = -INFINITY;
};

/// Reduces `value` across the warp; every lane gets the result.
template <typename Op>
__device__ __forceinline__ float warp_reduce(float value, Op op = Op{}) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

__device__ __forceinline__ float warp_reduce_sum(float value) {
  return warp_reduce<SumOp>(value);
}
__device__ __forceinline__ float warp_reduce_max(float value) {
  return warp_reduce<MaxOp>(value);
}

/// Reduces `value` across the block (blockDim.x a multiple of 32, at most 1024);
/// every thread gets the result. Safe to call several times in a row.
template <typename Op>
__device__ __forceinline__ float block_reduce(float value, Op op = Op{}) {
  __shared__ float partials[kWarpSize];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  value = warp_reduce(value, op);
  __syncthreads();  // `partials` may still be read by a previous call
  if (lane == 0) partials[warp] = value;
  __syncthreads();
  value = lane < num_warps ? partials[lane] : Op::kIdentity;
  return warp_reduce(value, op);
}

__device__ __forceinline__ float block_reduce_sum(float value) {
  return block_reduce<SumOp>(value);
}
__device__ __forceinline__ float block_reduce_max(float value) {
  return block_reduce<MaxOp>(value);
}

/// Sums each of `values` across the block in one pass (one pair of barriers for all
/// K, where K calls of block_reduce_sum take K pairs); every thread gets the sums.
/// Same conditions as block_reduce.
template <int K>
__device__ __forceinline__ void block_reduce_sum(float (&values)[K]) {
  __shared__ float partials[K][kWarpSize];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
#pragma unroll
  for (int k = 0; k < K; ++k) values[k] = warp_reduce_sum(values[k]);
  __syncthreads();  // `partials` may still be read by a previous call
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) partials[k][warp] = values[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k)
    values[k] = warp_reduce_sum(lane < num_warps ? partials[k][lane] : 0.0f);
}

// ---------------------------------------------------------------------------
// Launching.
// ---------------------------------------------------------------------------

/// A launch of `grid` x `block` (clusters of `attribute`'s size along x, which must
/// outlive the config) with `shared_bytes` of dynamic shared memory, on `stream`.
inline cudaLaunchConfig_t cluster_config(dim3 grid, dim3 block, std::size_t shared_bytes,
                                         cudaStream_t stream, unsigned size,
                                         cudaLaunchAttribute& attribute) {
  attribute = cudaLaunchAttribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = size;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return config;
}

namespace detail {
/// Raises a function attribute of `kernel` on `device` (the current one) to at least
/// `value`, calling cudaFuncSetAttribute only when it grows: a driver call, paid on every
/// launch otherwise (softmax's decode clusters of 16 launch in microseconds). Never
/// lowers it, so an occupancy query cannot undo what a launch needs.
inline cudaError_t raise_func_attribute(const void* kernel, int device, cudaFuncAttribute attribute,
                                        int value) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int>, int> raised;  // 0 until set
  const std::lock_guard<std::mutex> lock(mutex);
  int& current = raised[{kernel, device, attribute}];
  if (value <= current) return cudaSuccess;
  const cudaError_t status = cudaFuncSetAttribute(kernel, attribute, value);
  if (status == cudaSuccess) current = value;
  return status;
}

/// For an occupancy query: opts `kernel` in to `shared_bytes` of dynamic shared memory
/// as a launch does (KernelLauncher says why); false, the error cleared (it is not
/// sticky), where the device refuses.
inline bool opt_in_for_query(const void* kernel, int device, std::size_t shared_bytes) {
  if (shared_bytes == 0 ||
      raise_func_attribute(kernel, device, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(shared_bytes)) == cudaSuccess) {
    return true;
  }
  cudaGetLastError();
  return false;
}
}  // namespace detail

/// The stream torch (or whichever framework) has current for `device`.
inline cudaStream_t current_stream(DLDevice device) {
  return static_cast<cudaStream_t>(TVMFFIEnvGetStream(device.device_type, device.device_id));
}

/// Launches on `device` (guarded: the caller's current device is restored) and
/// on that device's current stream, then raises RuntimeError naming the call
/// site if the launch failed. An empty grid launches nothing.
///
///   KernelLauncher(grid, block, input.device())(my_kernel<T>, out_ptr, in_ptr, n);
///   KernelLauncher(grid, block, device).cluster(4)(kernel, ...);  // 4-CTA clusters along x
class KernelLauncher {
 public:
  KernelLauncher(dim3 grid, dim3 block, DLDevice device, std::size_t shared_mem_bytes = 0,
                 source_location loc = source_location::current())
      : grid_(grid), block_(block), device_(device), shared_mem_(shared_mem_bytes), loc_(loc) {}

  /// Launches thread-block clusters of `size` CTAs along x (grid.x a multiple of it).
  KernelLauncher& cluster(unsigned size) {
    cluster_ = size;
    return *this;
  }

  /// Lets the kernel start before the previous kernel on the stream has finished
  /// (programmatic dependent launch, sm_90): once every CTA of that kernel has called
  /// allow_dependent_launch(). Only for a kernel that reads nothing the previous one
  /// writes and writes nothing it touches; it calls wait_for_previous_grid() before it
  /// exits, so that whatever follows it on the stream also follows the previous kernel.
  KernelLauncher& overlap_previous(bool enable = true) {
    overlap_previous_ = enable;
    return *this;
  }

  template <typename... KernelArgs, typename... Args>
  void operator()(void (*kernel)(KernelArgs...), Args&&... args) const {
    if (grid_.x == 0 || grid_.y == 0 || grid_.z == 0) return;
    ::tvm::ffi::CUDADeviceGuard guard(device_.device_id);
    const auto* address = reinterpret_cast<const void*>(kernel);
    // Without opting in, a kernel may use 48 KiB less its static shared memory: a
    // 48 KiB request of a kernel that declares a __shared__ int fails. So any dynamic
    // request opts in (a cached lookup after the first launch).
    if (shared_mem_ > 0) {
      check(detail::raise_func_attribute(address, device_.device_id,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(shared_mem_)));
    }
    if (cluster_ > 8) {  // past the portable limit: Hopper allows 16 when asked
      check(detail::raise_func_attribute(address, device_.device_id,
                                         cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    }
    if (cluster_ > 1 || overlap_previous_) {
      cudaLaunchAttribute attributes[2];
      cudaLaunchConfig_t config = cluster_config(grid_, block_, shared_mem_,
                                                 current_stream(device_), cluster_, attributes[0]);
      if (const char* policy = std::getenv("MLLM_PROBE_CLUSTER_POLICY"); policy && cluster_ > 1) {
        attributes[1] = cudaLaunchAttribute{};
        attributes[1].id = cudaLaunchAttributeClusterSchedulingPolicyPreference;
        attributes[1].val.clusterSchedulingPolicyPreference =
            static_cast<cudaClusterSchedulingPolicy>(std::atoi(policy));
        config.attrs = attributes;
        config.numAttrs = 2;
      }
      if (overlap_previous_) {
        attributes[1] = cudaLaunchAttribute{};
        attributes[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attributes[1].val.programmaticStreamSerializationAllowed = 1;
        config.attrs = attributes;
        config.numAttrs = 2;
      }
      check(cudaLaunchKernelEx(&config, kernel,
                               static_cast<KernelArgs>(std::forward<Args>(args))...));
    } else {
      kernel<<<grid_, block_, shared_mem_, current_stream(device_)>>>(
          static_cast<KernelArgs>(std::forward<Args>(args))...);
    }
    check(cudaGetLastError());
  }

 private:
  void check(cudaError_t status) const {
    if (status != cudaSuccess) {
      detail::throw_error("RuntimeError",
                          detail::concat("CUDA launch failed: ", cudaGetErrorName(status), ": ",
                                         cudaGetErrorString(status)),
                          loc_);
    }
  }

  dim3 grid_;
  dim3 block_;
  DLDevice device_;
  std::size_t shared_mem_;
  source_location loc_;
  unsigned cluster_ = 1;
  bool overlap_previous_ = false;
};

/// Lets a kernel launched with overlap_previous() after this one start (sm_90; a no-op
/// elsewhere and when there is none). Takes effect once every CTA has called it or exited.
__device__ __forceinline__ void allow_dependent_launch() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// In a kernel launched with overlap_previous(): waits until the previous kernel on the
/// stream has finished and its writes are visible. Returns at once otherwise.
__device__ __forceinline__ void wait_for_previous_grid() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// How many clusters of `cluster` CTAs of `kernel` (`threads` each, `shared_bytes` of
/// dynamic shared memory) `device` runs at once; 0 when it cannot run one.
template <typename... KernelArgs>
int max_active_clusters(void (*kernel)(KernelArgs...), int cluster, int threads,
                        std::size_t shared_bytes, DLDevice device) {
  ::tvm::ffi::CUDADeviceGuard guard(device.device_id);
  const auto* address = reinterpret_cast<const void*>(kernel);
  if (!detail::opt_in_for_query(address, device.device_id, shared_bytes)) return 0;
  if (cluster > 8 && detail::raise_func_attribute(address, device.device_id,
                                                  cudaFuncAttributeNonPortableClusterSizeAllowed,
                                                  1) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config =
      cluster_config(dim3(static_cast<unsigned>(cluster)), dim3(static_cast<unsigned>(threads)),
                     shared_bytes, nullptr, static_cast<unsigned>(cluster), attribute);
  int count = 0;
  if (cudaOccupancyMaxActiveClusters(&count, kernel, &config) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

/// How many CTAs of `kernel` (`threads` each, `shared_bytes` of dynamic shared memory)
/// one SM of `device` runs at once; 0 when it cannot run one.
template <typename... KernelArgs>
int max_active_blocks_per_sm(void (*kernel)(KernelArgs...), int threads, std::size_t shared_bytes,
                             DLDevice device) {
  ::tvm::ffi::CUDADeviceGuard guard(device.device_id);
  if (!detail::opt_in_for_query(reinterpret_cast<const void*>(kernel), device.device_id,
                                shared_bytes)) {
    return 0;
  }
  int count = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&count, kernel, threads, shared_bytes) !=
      cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

/// CTAs in this CTA's thread-block cluster: 1 without a cluster launch, and before
/// Hopper, which has no clusters.
__device__ __forceinline__ unsigned cluster_num_blocks() {
#if __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().num_blocks();
#else
  return 1;
#endif
}

/// True when `device` launches thread-block clusters (Hopper on; cached per device).
inline bool has_clusters(DLDevice device) {
  static int cache[64] = {};  // 0 unknown, 1 no, 2 yes
  int& known = cache[device.device_id % 64];
  if (known == 0) {
    int value = 0;
    cudaDeviceGetAttribute(&value, cudaDevAttrClusterLaunch, device.device_id);
    known = value ? 2 : 1;
  }
  return known == 2;
}

/// The number of streaming multiprocessors of `device` (cached per device).
inline int num_sms(DLDevice device) {
  static int cache[64] = {};
  const int id = device.device_id;
  if (id >= 0 && id < 64 && cache[id] > 0) return cache[id];
  int count = 0;
  cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, id);
  if (id >= 0 && id < 64) cache[id] = count;
  return count;
}

/// The most dynamic shared memory one block of `device` may opt in to, in bytes
/// (227 KiB on Hopper; cached per device).
inline std::size_t max_shared_memory_per_block(DLDevice device) {
  static int cache[64] = {};
  const int id = device.device_id;
  if (id >= 0 && id < 64 && cache[id] > 0) return static_cast<std::size_t>(cache[id]);
  int bytes = 0;
  cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, id);
  if (id >= 0 && id < 64) cache[id] = bytes;
  return static_cast<std::size_t>(bytes);
}

// ---------------------------------------------------------------------------
// Grid sizing (host). dtype dispatch is utils.hpp's dispatch_dtype.
// ---------------------------------------------------------------------------

/// Blocks for a grid-stride loop over `work_items` with `threads` per block: enough
/// to cover the work, at most what fits on the device at once (full occupancy).
inline unsigned grid_stride_blocks(int64_t work_items, int threads, DLDevice device) {
  const int64_t needed = div_ceil<int64_t>(work_items, threads);
  const int64_t resident = static_cast<int64_t>(num_sms(device)) * (2048 / threads);
  return static_cast<unsigned>(needed < resident ? needed : resident);
}

}  // namespace mllm_kernel
