// Flattens the request-to-token table into FlashInfer's kv_indices: for request i,
//   kv_indices[kv_indptr[i] + j] = req_to_token[req_pool_indices[i], kv_start_idx[i] + j]
// for j < page_kernel_lens[i]. grid.x walks requests, grid.y splits long requests
// so that a small batch still spreads over the GPU. The 1-D inputs may be int32 or
// int64 and strided; their dtype is a runtime switch (uniform across the grid).
//
// A request whose row, range or output span falls outside its tensor copies
// nothing; the checked export counts it in `errors` (int32 [1]).
#include <tvm/ffi/optional.h>

#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.cuh"

namespace mllm_kernel::cuda {
namespace kv_indices {

/// A strided 1-D int32 or int64 tensor read as int64.
struct IndexArray {
  const void* data;
  int64_t stride;
  bool is_int64;

  __device__ __forceinline__ int64_t operator[](int64_t i) const {
    return is_int64 ? static_cast<const int64_t*>(data)[i * stride]
                    : static_cast<const int32_t*>(data)[i * stride];
  }
};

struct Params {
  const void* req_to_token;
  int64_t req_to_token_stride;
  int64_t num_req_slots;
  int64_t max_context;
  IndexArray req_pool_indices, page_kernel_lens, kv_indptr, kv_start_idx;
  bool has_start;
  void* kv_indices;
  int64_t kv_indices_size;
  int32_t* errors;  // nullptr unless checking
};

inline constexpr int kThreads = 256;
inline constexpr int kMaxSplits = 32;

template <typename Token>
__global__ void create_kv_indices_kernel(const Params p) {
  const int64_t req = blockIdx.x;
  const int64_t row = p.req_pool_indices[req];
  const int64_t len = p.page_kernel_lens[req];
  const int64_t begin = p.kv_indptr[req];
  const int64_t start = p.has_start ? p.kv_start_idx[req] : 0;
  // Differences, not sums: int64 inputs near 2^63 must not wrap into range.
  const bool in_range = row >= 0 && row < p.num_req_slots && len >= 0 && start >= 0 &&
                        len <= p.max_context - start && begin >= 0 &&
                        len <= p.kv_indices_size - begin;
  if (!in_range) {
    if (p.errors != nullptr && blockIdx.y == 0 && threadIdx.x == 0) atomicAdd(p.errors, 1);
    return;
  }
  const Token* src =
      static_cast<const Token*>(p.req_to_token) + row * p.req_to_token_stride + start;
  Token* dst = static_cast<Token*>(p.kv_indices) + begin;
  for (int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; j < len;
       j += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    dst[j] = src[j];
  }
}

inline IndexArray index_array(const TensorView& t) {
  return IndexArray{data_ptr<void>(t), t.stride(0), is_dtype<int64_t>(t.dtype())};
}

}  // namespace kv_indices

inline void create_kv_indices(TensorView req_to_token, TensorView req_pool_indices,
                              TensorView page_kernel_lens, TensorView kv_indptr,
                              tvm::ffi::Optional<TensorView> kv_start_idx, TensorView kv_indices,
                              tvm::ffi::Optional<TensorView> errors) {
  SymbolicDevice device;
  SymbolicDtype token_dtype;
  SymbolicSize batch{"batch"}, slots{"num_req_slots"}, context{"max_context"};
  TensorMatcher({slots, context})
      .dtype<int32_t, int64_t>(token_dtype)
      .device(kDLCUDA, device)
      .last_dim_contiguous()
      .verify(req_to_token, "req_to_token");
  TensorMatcher({batch})
      .dtype<int32_t, int64_t>()
      .device(kDLCUDA, device)
      .verify(req_pool_indices, "req_pool_indices");
  TensorMatcher({batch})
      .dtype<int32_t, int64_t>()
      .device(kDLCUDA, device)
      .verify(page_kernel_lens, "page_kernel_lens");
  SymbolicSize batch_plus_one{"batch + 1"};
  batch_plus_one.bind(batch.value() + 1, "req_pool_indices");
  TensorMatcher({batch_plus_one})
      .dtype<int32_t, int64_t>()
      .device(kDLCUDA, device)
      .verify(kv_indptr, "kv_indptr");
  TensorMatcher({kAnySize})
      .dtype(token_dtype)
      .device(kDLCUDA, device)
      .verify(kv_indices, "kv_indices");
  ValueCheck(kv_indices.size(0) <= 1 || kv_indices.stride(0) == 1,
             "argument 'kv_indices': expected a contiguous tensor, got stride ",
             kv_indices.stride(0));

  verify_output(kv_indices, "kv_indices",
                {{req_to_token, "req_to_token"},
                 {req_pool_indices, "req_pool_indices"},
                 {page_kernel_lens, "page_kernel_lens"},
                 {kv_indptr, "kv_indptr"}});
  if (kv_start_idx.has_value()) {
    verify_output(kv_indices, "kv_indices", {{*kv_start_idx, "kv_start_idx"}});
  }
  kv_indices::Params p{};
  p.req_to_token = data_ptr<void>(req_to_token);
  p.req_to_token_stride = req_to_token.stride(0);
  p.num_req_slots = slots.value();
  p.max_context = context.value();
  p.req_pool_indices = kv_indices::index_array(req_pool_indices);
  p.page_kernel_lens = kv_indices::index_array(page_kernel_lens);
  p.kv_indptr = kv_indices::index_array(kv_indptr);
  if (kv_start_idx.has_value()) {
    TensorMatcher({batch})
        .dtype<int32_t, int64_t>()
        .device(kDLCUDA, device)
        .verify(*kv_start_idx, "kv_start_idx");
    p.kv_start_idx = kv_indices::index_array(*kv_start_idx);
    p.has_start = true;
  }
  p.kv_indices = data_ptr<void>(kv_indices);
  p.kv_indices_size = kv_indices.size(0);
  if (errors.has_value()) {
    TensorMatcher({1}).dtype<int32_t>().device(kDLCUDA, device).verify(*errors, "errors");
    p.errors = data_ptr<int32_t>(*errors);
  }
  const int64_t num_requests = batch.value();
  if (num_requests == 0) return;
  RuntimeCheck(num_requests < (int64_t{1} << 31), "create_kv_indices: batch too large");

  // Enough CTAs for two waves when the batch is small; a split with nothing to copy exits.
  const int64_t wanted = div_ceil<int64_t>(2 * num_sms(device.value()), num_requests);
  const unsigned splits =
      static_cast<unsigned>(wanted < kv_indices::kMaxSplits ? wanted : kv_indices::kMaxSplits);
  const dim3 grid(static_cast<unsigned>(num_requests), splits);
  dispatch_dtype<int32_t, int64_t>(req_to_token.dtype(), "req_to_token", [&](auto tag) {
    using Token = typename decltype(tag)::type;
    KernelLauncher(grid, dim3(kv_indices::kThreads), device.value())(
        kv_indices::create_kv_indices_kernel<Token>, p);
  });
}

}  // namespace mllm_kernel::cuda
