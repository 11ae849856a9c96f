// The Marlin weight format as kernels read it: the operands' kernel view (`Params`,
// checked on the host by `check_operands`, the one place that checks gptq_marlin_gemm's
// tensors), the zero modes, and where a column's scale and zero point sit in their
// permuted rows and packed words (mllm_kernel/cuda/jit/marlin_format.py writes them).
// Weights: int32 [K / 16, N * 16 * bits / 32], one k16 x n64 tile per 512 (4-bit) or
// 1024 (8-bit) contiguous bytes; lane l = 4 g + t of a warp owns 16 or 32 bytes of each
// tile, its mma.sync B fragments: 4-bit word w holds columns 8 (2 w) + g (pairs 0 and 1:
// rows 2 t + {0, 1} and 2 t + {8, 9}) and 8 (2 w + 1) + g (pairs 2, 3), a pair being the
// nibbles at bits 4 i and 16 + 4 i (dequant.cuh).
#pragma once

#include <tvm/ffi/optional.h>

#include <cstdint>

#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.cuh"

namespace mllm_kernel::cuda {
namespace marlin {

// How a weight becomes a value: q minus the type's zero (kBias), an int or a float zero
// point, or, for fp8 e4m3 weights (kFp8), the float itself (dequant.cuh's Fp8Dequant),
// or for NVFP4 (kFp4) the e2m1 value times its group's fp8 scale and the global scale
// (marlin_nvfp4.cuh).
enum ZeroMode : int { kBias = 0, kIntZero = 1, kFloatZero = 2, kFp8 = 3, kFp4 = 4 };

struct Params {
  const void* a;  // [M, K], row stride lda
  int64_t lda;
  const uint32_t* b;         // Marlin words, [K / 16, N * 16 * bits / 32]
  const void* scales;        // [groups, N], Marlin-permuted (NVFP4: bytes, marlin_nvfp4.cuh)
  const void* global_scale;  // NVFP4: T [1], or nullptr
  const void* zeros;         // int32 [groups, N * bits / 32] or T [groups, N], or nullptr
  const int32_t* g_idx;      // [K] group of each Marlin row (act-order), or nullptr
  const int32_t* perm;       // [K] act-order: Marlin row k is column perm[k] of a, or nullptr
  void* c;                   // [M, N], row stride ldc
  int64_t ldc;
  float* partials;    // [split, M, N] when split > 1
  int32_t* counters;  // the workspace: one per CTA column, zero between launches
  int m, n, k;
  int groups;
  int group_shift;  // log2 of the rows per group; -1: one group over K (per channel)
  int zero_mode;
  int bias;               // the type's zero when zero_mode == kBias
  int split;              // CTAs along K
  int cluster_reduce;     // split-K sums through a cluster's shared memory (sm_90)
  int k_tiles_per_split;  // a multiple of kTurnTiles (marlin_config.cuh)
};

/// Position of column `c` (0..63) of a 64-column block in the permuted scales: groups
/// use [i * 8 + j] = column i + 8 j; per-channel scales permute 32-column blocks as
/// [8 i + j'] = column 2 i + {0, 1, 8, 9, 16, 17, 24, 25}[j'] (marlin_format.py's
/// SCALE_PERM and SCALE_PERM_SINGLE: tests/test_marlin_constants.py).
__host__ __device__ constexpr int grouped_scale_position(int c) {
  return (c % 8) * 8 + c / 8;
}
__host__ __device__ constexpr int channel_scale_position(int c) {
  const int within = c % 32, i = (within % 8) / 2, rest = within - 2 * i;
  return (c / 32) * 32 + 8 * i + (rest / 8) * 2 + rest % 2;
}

/// Slot (from the low bits up) of value j (0 .. 32 / Bits - 1) in a packed word, as the
/// weights interleave them: {0, 2, 4, 6, 1, 3, 5, 7} (4-bit) and {0, 2, 1, 3} (8-bit)
/// hold values 0, 1, 2, ... in that order. Zero points (permuted position j) and AWQ's
/// columns pack the same way.
template <int Bits>
__host__ __device__ constexpr int word_slot(int j) {
  constexpr int kHalf = 16 / Bits;  // values per 16-bit half
  return (j % 2) * kHalf + j / 2;
}

/// Zero point of permuted position j (0..7) from a lane's zero-point word(s).
template <int Bits>
__device__ __forceinline__ uint32_t zero_point(const uint32_t* words, int j) {
  constexpr uint32_t kMask = (1u << Bits) - 1;
  constexpr int kPerWord = 32 / Bits;
  return (words[j / kPerWord] >> (Bits * word_slot<Bits>(j % kPerWord))) & kMask;
}

/// ValueError naming `arg` unless `t` is [rows, cols], which `meaning` spells out in the
/// sizes ("size_k / 16, size_n * 16 * bits / 32" of `bits`-bit values): a packed
/// tensor's shape is a formula of them, clearer whole than dim by dim.
inline void check_packed_shape(const TensorView& t, const char* arg, int64_t rows, int64_t cols,
                               const char* meaning, int64_t bits,
                               source_location loc = source_location::current()) {
  if (t.ndim() == 2 && t.size(0) == rows && t.size(1) == cols) return;
  detail::throw_error(
      "ValueError",
      detail::concat("argument '", arg, "': expected shape [", rows, ", ", cols, "] (", meaning,
                     ", ", bits, "-bit values) but got ", dims_str(t.shape())),
      loc);
}

/// ValueError unless size_k and size_n cut into whole tiles of the format (16 k x 64 n).
inline void check_tile_sizes(int64_t size_k, int64_t size_n) {
  ValueCheck(size_k > 0 && size_k % 16 == 0,
             "argument 'size_k': expected a positive multiple of 16 (Marlin tiles are 16 k x "
             "64 n), got ",
             size_k);
  ValueCheck(size_n > 0 && size_n % 64 == 0,
             "argument 'size_n': expected a positive multiple of 64 (Marlin tiles are 16 k x "
             "64 n), got ",
             size_n);
}

/// Rows per group as the kernels take them (0: one group over K, or act-order, where
/// g_idx gives each row its group) for `groups` rows of scales over `size_k` (fp8
/// weights: one group or groups of 128; NVFP4: groups of 16, in pairs).
inline int64_t group_size(int64_t groups, int64_t size_k, bool act_order, bool is_k_full,
                          int zero_mode) {
  if (act_order) {
    ValueCheck(!is_k_full || (groups > 1 && size_k % groups == 0),
               "argument 'b_scales': act-order with is_k_full=True needs num_groups > 1 "
               "dividing size_k=",
               size_k, ", got ", groups, " groups");
    return 0;
  }
  const int64_t size = size_k % groups == 0 ? size_k / groups : 0;
  if (zero_mode == kFp4) {
    // The original's NVFP4 builds: groups of 16 only, whose scale rows pair up.
    ValueCheck(size == 16, "argument 'b_scales': ", groups, " groups over size_k=", size_k,
               " is not the group size NVFP4 weights take; expected size_k / 16 groups (16 "
               "rows each)");
    ValueCheck(groups % 2 == 0,
               "argument 'size_k': NVFP4 weights pair their groups' scale rows; expected a "
               "multiple of 32, got ",
               size_k);
    return size;
  }
  if (groups == 1) return 0;
  // The original's fp8 builds: per channel or groups of 128.
  ValueCheck(zero_mode != kFp8 || size == 128, "argument 'b_scales': ", groups,
             " groups over size_k=", size_k,
             " is not a group size fp8 weights take; expected -1 (one group: per channel) or "
             "128");
  ValueCheck(size >= 32 && (size & (size - 1)) == 0, "argument 'b_scales': ", groups,
             " groups over size_k=", size_k,
             " is not a supported group size; expected group sizes -1 (one group: per "
             "channel), 32, 64, 128 or a larger power of two");
  return size;
}

/// Every tensor of one gptq_marlin_gemm call, checked here for all its paths (the
/// streaming kernel, the fused one, dequantize + GEMM): `a` [size_m, size_k] in `dtype`
/// with rows on 16-byte boundaries (unless act-order permutes it into a scratch first),
/// `c` [size_m, size_n] in `dtype`, the Marlin weights, scales (in `dtype`; NVFP4's
/// float8_e4m3fn bytes), NVFP4's global scale (`dtype` [1]; an empty one is none, as
/// the original passes none), zero points (`zero_mode`) and act-order's g_idx and perm
/// (int32 [size_k]), the int32 workspace (one entry per SM at least), all on one GPU,
/// and the sizes (`check_tile_sizes`). Returns the kernels' view of them.
/// ValueError unless `t` starts on an `align`-byte boundary: the kernels copy it in
/// pieces of that size.
inline void check_start_aligned(const TensorView& t, const char* arg, int align) {
  ValueCheck(reinterpret_cast<uintptr_t>(data_ptr<const void>(t)) % align == 0, "argument '", arg,
             "': the data must start on a ", align, "-byte boundary (the kernels copy it in ",
             align, "-byte pieces); pass a tensor of its own memory (.clone())");
}

inline Params check_operands(
    SymbolicDevice& device, TensorView a, TensorView c, TensorView b_q_weight, TensorView b_scales,
    tvm::ffi::Optional<TensorView> global_scale, tvm::ffi::Optional<TensorView> b_zeros,
    tvm::ffi::Optional<TensorView> g_idx, tvm::ffi::Optional<TensorView> perm, TensorView workspace,
    DLDataType dtype, int bits, int zero_mode, bool act_order, int64_t size_m, int64_t size_n,
    int64_t size_k, bool is_k_full, int64_t bias) {
  SymbolicSize m{"size_m"}, k{"size_k"}, n{"size_n"}, groups{"num_groups"};
  TensorMatcher({m, k}).dtype(dtype).device(kDLCUDA, device).last_dim_contiguous().verify(a, "a");
  ValueCheck(size_m == m.value(), "argument 'size_m': expected ", m.value(), " (a.shape[0]), got ",
             size_m);
  ValueCheck(size_k == k.value(), "argument 'size_k': expected ", k.value(), " (a.shape[1]), got ",
             size_k);
  check_tile_sizes(size_k, size_n);
  n.bind(size_n, "size_n");
  Params p{};
  p.a = data_ptr<void>(a);
  p.lda = size_m > 1 ? a.stride(0) : size_k;
  // Act-order reads a through a permuted, contiguous copy.
  ValueCheck(act_order || (p.lda % 8 == 0 && reinterpret_cast<uintptr_t>(p.a) % 16 == 0),
             "argument 'a': rows must start on 16-byte boundaries (row stride ", p.lda,
             " elements); call .contiguous() on it first");
  TensorMatcher()
      .dtype<int32_t>()
      .device(kDLCUDA, device)
      .contiguous()
      .verify(b_q_weight, "b_q_weight");
  check_packed_shape(b_q_weight, "b_q_weight", size_k / 16, size_n * 16 * bits / 32,
                     "size_k / 16, size_n * 16 * bits / 32", bits);
  check_start_aligned(b_q_weight, "b_q_weight", 16);
  const bool fp4 = zero_mode == kFp4;
  TensorMatcher({groups, n})
      .dtype(fp4 ? dtype_trait<fp8_e4m3_t>::value : dtype)
      .device(kDLCUDA, device)
      .contiguous()
      .verify(b_scales, "b_scales");
  check_start_aligned(b_scales, "b_scales", fp4 ? 8 : 16);
  if (global_scale.has_value() && global_scale.value().numel() == 0) global_scale = std::nullopt;
  if (fp4) {
    ValueCheck(global_scale.has_value(),
               "argument 'global_scale': float4_e2m1f (NVFP4) weights need their global scale "
               "(nvfp4_marlin_process_global_scale), got none");
    // One value, [1] or 0-d, as vLLM's and sglang's processing leaves it.
    TensorMatcher().dtype(dtype).device(kDLCUDA, device).verify(*global_scale, "global_scale");
    ValueCheck(global_scale.value().numel() == 1 && global_scale.value().ndim() <= 1,
               "argument 'global_scale': expected one value ([1] or 0-d) but got shape ",
               dims_str(global_scale.value().shape()));
  } else {
    ValueCheck(!global_scale.has_value(),
               "argument 'global_scale': only float4_e2m1f (NVFP4) weights take a global "
               "scale; pass None or an empty tensor");
  }
  ValueCheck(groups.value() > 0,
             "argument 'b_scales': expected shape [num_groups, size_n] with a group at least, "
             "but got ",
             dims_str(b_scales.shape()));
  if (act_order) {
    const char* missing = g_idx.has_value() ? "perm" : "g_idx";
    ValueCheck(g_idx.has_value() && perm.has_value(), "argument '", missing,
               "': act-order needs both g_idx and perm, got ", g_idx.has_value() ? "g_idx" : "perm",
               " alone");
    TensorMatcher({k})
        .dtype<int32_t>()
        .device(kDLCUDA, device)
        .contiguous()
        .verify(*g_idx, "g_idx");
    TensorMatcher({k}).dtype<int32_t>().device(kDLCUDA, device).contiguous().verify(*perm, "perm");
    p.g_idx = data_ptr<int32_t>(*g_idx);
    p.perm = data_ptr<int32_t>(*perm);
  } else {
    RuntimeCheck(!g_idx.has_value() && !perm.has_value(),
                 "g_idx/perm given to a build without act-order");
  }
  const int64_t rows_per_group =
      group_size(groups.value(), size_k, act_order, is_k_full, zero_mode);
  if (zero_mode == kBias || zero_mode == kFp8 || fp4) {
    RuntimeCheck(!b_zeros.has_value(), "b_zeros given for zero_mode ", zero_mode);
    RuntimeCheck(zero_mode == kBias || (bits == (fp4 ? 4 : 8) && !act_order),
                 "fp8 weights: 8 bits, NVFP4: 4, without act-order");
  } else {
    RuntimeCheck(b_zeros.has_value(), "b_zeros missing for zero_mode ", zero_mode);
    if (zero_mode == kIntZero) {
      TensorMatcher()
          .dtype<int32_t>()
          .device(kDLCUDA, device)
          .contiguous()
          .verify(*b_zeros, "b_zeros");
      check_packed_shape(*b_zeros, "b_zeros", groups.value(), size_n * bits / 32,
                         "num_groups, size_n * bits / 32", bits);
    } else {
      TensorMatcher({groups, n})
          .dtype(dtype)
          .device(kDLCUDA, device)
          .contiguous()
          .verify(*b_zeros, "b_zeros");
      check_start_aligned(*b_zeros, "b_zeros", 16);
    }
    p.zeros = data_ptr<void>(*b_zeros);
  }
  TensorMatcher({kAnySize})
      .dtype<int32_t>()
      .device(kDLCUDA, device)
      .contiguous()
      .verify(workspace, "workspace");
  const int sms = num_sms(device.value());
  ValueCheck(workspace.size(0) >= sms, "argument 'workspace': expected at least ", sms,
             " entries (one per SM of cuda:", device.value().device_id, "), got ",
             workspace.size(0), "; use marlin_make_workspace(device)");
  TensorMatcher({m, n}).dtype(dtype).device(kDLCUDA, device).contiguous().verify(c, "c");
  // Outputs leave in pairs of 16-bit values.
  check_start_aligned(c, "c", 4);
  verify_output(c, "c", {{a, "a"}, {b_q_weight, "b_q_weight"}, {b_scales, "b_scales"}});
  p.b = data_ptr<uint32_t>(b_q_weight);
  p.scales = data_ptr<void>(b_scales);
  p.global_scale = fp4 ? data_ptr<void>(*global_scale) : nullptr;
  p.c = data_ptr<void>(c);
  p.ldc = size_n;
  p.m = static_cast<int>(size_m);
  p.n = static_cast<int>(size_n);
  p.k = static_cast<int>(size_k);
  p.groups = static_cast<int>(groups.value());
  p.group_shift =
      rows_per_group == 0 ? -1 : 31 - __builtin_clz(static_cast<unsigned>(rows_per_group));
  p.zero_mode = zero_mode;
  p.bias = static_cast<int>(bias);
  p.counters = data_ptr<int32_t>(workspace);
  return p;
}

}  // namespace marlin
}  // namespace mllm_kernel::cuda
