// Rotary position embedding applied in place to query and key, with a cos/sin
// cache [max_pos, rot_dim] (fp32; first half cos, second half sin).
//   neox: element i of the rotated part pairs with i + rot_dim / 2
//   gptj: element 2i pairs with 2i + 1 (interleaved)
// Each pair (x1, x2) at frequency i becomes (x1 cos - x2 sin, x2 cos + x1 sin);
// elements past rot_dim (partial rotary) are left as they are.
// One CTA per token; a thread rotates P consecutive pairs of one head, moved as
// 16-byte vectors when head layout and alignment allow, else one element at a time.
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.cuh"

namespace mllm_kernel::cuda {
namespace rope {

struct Heads {
  void* data;
  int64_t token_stride;
  int64_t head_stride;
  int64_t num_heads;
};

struct Params {
  Heads q;
  Heads k;
  const void* positions;
  int64_t positions_stride;
  bool positions_int64;
  const float* cache;
  int64_t max_pos;
  int64_t half;  // rot_dim / 2
};

/// N elements of T at `ptr` into fp32, as N / L loads of L elements.
template <int L, typename T, int N>
__device__ __forceinline__ void load_elems(const T* ptr, float (&x)[N]) {
#pragma unroll
  for (int i = 0; i < N; i += L) {
    Vec<T, L> v;
    v.load(ptr + i);
#pragma unroll
    for (int j = 0; j < L; ++j) x[i + j] = to_float(v[j]);
  }
}

template <int L, typename T, int N>
__device__ __forceinline__ void store_elems(T* ptr, const float (&x)[N]) {
#pragma unroll
  for (int i = 0; i < N; i += L) {
    Vec<T, L> v;
#pragma unroll
    for (int j = 0; j < L; ++j) v[j] = from_float<T>(x[i + j]);
    v.store(ptr + i);
  }
}

template <typename T, bool kVec, bool kNeox>
struct Layout {
  static constexpr int kPairs = kVec ? (kNeox ? kVecWidth<T> : kVecWidth<T> / 2) : 1;
  static constexpr int kLoad = kVec ? kVecWidth<T> : 1;                    // elements per load
  static constexpr int kCacheLoad = kVec ? (kPairs < 4 ? kPairs : 4) : 1;  // floats per load
};

template <typename T, bool kVec, bool kNeox>
__global__ void rope_kernel(const Params p) {
  using L = Layout<T, kVec, kNeox>;
  constexpr int P = L::kPairs;
  const int64_t token = blockIdx.x;
  const int64_t at = token * p.positions_stride;
  const int64_t pos = p.positions_int64 ? static_cast<const int64_t*>(p.positions)[at]
                                        : static_cast<const int32_t*>(p.positions)[at];
  if (pos < 0 || pos >= p.max_pos) return;  // never read outside the cache
  const float* cos_row = p.cache + pos * 2 * p.half;

  const int units_per_head = static_cast<int>(p.half / P);
  const int units = static_cast<int>((p.q.num_heads + p.k.num_heads) * units_per_head);
  for (int u = threadIdx.x; u < units; u += blockDim.x) {
    const int head = u / units_per_head;
    const int64_t pair = static_cast<int64_t>(u - head * units_per_head) * P;
    const Heads& h = head < p.q.num_heads ? p.q : p.k;
    const int64_t h_index = head < p.q.num_heads ? head : head - p.q.num_heads;
    T* base = static_cast<T*>(h.data) + token * h.token_stride + h_index * h.head_stride;

    float c[P], s[P];
    load_elems<L::kCacheLoad>(cos_row + pair, c);
    load_elems<L::kCacheLoad>(cos_row + p.half + pair, s);
    if constexpr (kNeox) {
      float x1[P], x2[P];
      load_elems<L::kLoad>(base + pair, x1);
      load_elems<L::kLoad>(base + p.half + pair, x2);
      float y1[P], y2[P];
#pragma unroll
      for (int i = 0; i < P; ++i) {
        y1[i] = x1[i] * c[i] - x2[i] * s[i];
        y2[i] = x2[i] * c[i] + x1[i] * s[i];
      }
      store_elems<L::kLoad>(base + pair, y1);
      store_elems<L::kLoad>(base + p.half + pair, y2);
    } else {
      float x[2 * P], y[2 * P];
      load_elems<L::kLoad>(base + 2 * pair, x);
#pragma unroll
      for (int i = 0; i < P; ++i) {
        y[2 * i] = x[2 * i] * c[i] - x[2 * i + 1] * s[i];
        y[2 * i + 1] = x[2 * i + 1] * c[i] + x[2 * i] * s[i];
      }
      store_elems<L::kLoad>(base + 2 * pair, y);
    }
  }
}

/// query/key as [tokens, heads * head_size] or [tokens, heads, head_size].
inline Heads check_heads(const TensorView& t, const char* arg, SymbolicSize& tokens,
                         int64_t head_size, SymbolicDtype& dtype, SymbolicDevice& device) {
  TensorMatcher().dtype(dtype).device(kDLCUDA, device).verify(t, arg);
  ValueCheck(t.ndim() == 2 || t.ndim() == 3, "argument '", arg,
             "': expected [tokens, heads * head_size] or [tokens, heads, head_size], got ",
             t.ndim(), " dims");
  if (t.ndim() == 2) {
    ValueCheck(t.size(1) % head_size == 0, "argument '", arg, "': last dim ", t.size(1),
               " is not a multiple of head_size ", head_size);
    TensorMatcher({tokens, kAnySize}).last_dim_contiguous().verify(t, arg);
    return Heads{data_ptr<void>(t), t.stride(0), head_size, t.size(1) / head_size};
  }
  ValueCheck(t.size(2) == head_size, "argument '", arg, "': last dim ", t.size(2),
             " must equal head_size ", head_size);
  TensorMatcher({tokens, kAnySize, head_size}).last_dim_contiguous().verify(t, arg);
  return Heads{data_ptr<void>(t), t.stride(0), t.stride(1), t.size(1)};
}

inline bool heads_aligned(const Heads& h, int64_t bytes, int64_t elems) {
  return reinterpret_cast<std::uintptr_t>(h.data) % bytes == 0 && h.token_stride % elems == 0 &&
         h.head_stride % elems == 0;
}

}  // namespace rope

inline void apply_rope_inplace(TensorView positions, TensorView query, TensorView key,
                               TensorView cos_sin_cache, int64_t head_size, bool is_neox) {
  SymbolicDevice device;
  SymbolicSize tokens{"num_tokens"}, rot_dim{"rot_dim"};
  ValueCheck(head_size > 0, "argument 'head_size': expected > 0, got ", head_size);
  TensorMatcher({tokens})
      .dtype<int32_t, int64_t>()
      .device(kDLCUDA, device)
      .verify(positions, "positions");
  SymbolicDtype dtype;
  TensorMatcher()
      .dtype<fp32_t, fp16_t, bf16_t>(dtype)
      .device(kDLCUDA, device)
      .verify(query, "query");
  TensorMatcher({kAnySize, rot_dim})
      .dtype<fp32_t>()
      .device(kDLCUDA, device)
      .contiguous()
      .verify(cos_sin_cache, "cos_sin_cache");
  ValueCheck(rot_dim.value() % 2 == 0 && rot_dim.value() > 0 && rot_dim.value() <= head_size,
             "argument 'cos_sin_cache': rot_dim (last dim) must be even and in [2, head_size=",
             head_size, "], got ", rot_dim.value());
  rope::Params p{};
  p.q = rope::check_heads(query, "query", tokens, head_size, dtype, device);
  p.k = rope::check_heads(key, "key", tokens, head_size, dtype, device);
  // q and k are often two column blocks of one qkv buffer: disjoint, and accepted.
  verify_output(query, "query",
                {{key, "key"}, {positions, "positions"}, {cos_sin_cache, "cos_sin_cache"}});
  verify_output(key, "key", {{positions, "positions"}, {cos_sin_cache, "cos_sin_cache"}});
  p.positions = data_ptr<void>(positions);
  p.positions_stride = positions.stride(0);
  p.positions_int64 = is_dtype<int64_t>(positions.dtype());
  p.cache = data_ptr<float>(cos_sin_cache);
  p.max_pos = cos_sin_cache.size(0);
  p.half = rot_dim.value() / 2;
  const int64_t num_tokens = tokens.value();
  if (num_tokens == 0 || p.q.num_heads + p.k.num_heads == 0) return;
  RuntimeCheck(num_tokens < (int64_t{1} << 31), "rope: at most 2^31 - 1 tokens, got ", num_tokens);

  dispatch_dtype<fp32_t, fp16_t, bf16_t>(dtype.value(), "query", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int W = kVecWidth<T>;
    auto run = [&](auto kernel, int pairs) {
      const int64_t units = (p.q.num_heads + p.k.num_heads) * (p.half / pairs);
      RuntimeCheck(units < (int64_t{1} << 31), "rope: too many heads");
      const int64_t threads = round_up<int64_t>(units, kWarpSize);
      const int block = static_cast<int>(threads < 256 ? threads : 256);
      KernelLauncher(dim3(static_cast<unsigned>(num_tokens)), dim3(block), device.value())(kernel,
                                                                                           p);
    };
    const bool heads_ok = rope::heads_aligned(p.q, 16, W) && rope::heads_aligned(p.k, 16, W);
    const auto cache_addr = reinterpret_cast<std::uintptr_t>(p.cache);
    if (is_neox) {
      using L = rope::Layout<T, true, true>;
      if (heads_ok && p.half % W == 0 && cache_addr % (4 * L::kCacheLoad) == 0) {
        run(rope::rope_kernel<T, true, true>, L::kPairs);
      } else {
        run(rope::rope_kernel<T, false, true>, 1);
      }
    } else {
      using L = rope::Layout<T, true, false>;
      if (heads_ok && p.half % L::kPairs == 0 && cache_addr % (4 * L::kCacheLoad) == 0) {
        run(rope::rope_kernel<T, true, false>, L::kPairs);
      } else {
        run(rope::rope_kernel<T, false, false>, 1);
      }
    }
  });
}

}  // namespace mllm_kernel::cuda
