// SwiGLU's gate: out = silu(x[..., :d]) * x[..., d:] for x of last dim 2d.
// Rows may be strided; each row must be contiguous. Computed in float32.
#include <cstdint>

#include "mllm_kernel/cpu/dtype_dispatch.hpp"
#include "mllm_kernel/cpu/parallel.hpp"
#include "mllm_kernel/cpu/rows.hpp"
#include "mllm_kernel/cpu/vec_math.hpp"
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.hpp"

namespace mllm_kernel::cpu {

inline void silu_and_mul(TensorView out, TensorView x, int64_t num_threads) {
  SymbolicDevice device;
  FloatDtypes::allow(TensorMatcher()).device(kDLCPU, device).last_dim_contiguous().verify(x, "x");
  ValueCheck(x.ndim() >= 1 && x.size(-1) % 2 == 0,
             "argument 'x': expected an even last dim (gate and up halves), got shape ",
             dims_str(x.shape()));
  const int64_t d = x.size(-1) / 2;
  TensorMatcher().dtype(x.dtype()).device(kDLCPU, device).last_dim_contiguous().verify(out, "out");
  verify_shape_like(out, "out", x, "x", d);
  verify_output(out, "out", {{x, "x"}});

  const RowLayout x_rows(x), out_rows(out);
  FloatDtypes::dispatch(x.dtype(), "x", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x_data = data_ptr<const T>(x);
    T* out_data = data_ptr<T>(out);
    parallel_for(x_rows.rows(), d * (3 + kExpCost), num_threads, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* gate = x_data + x_rows.row_offset(r);
        const T* up = gate + d;
        T* yr = out_data + out_rows.row_offset(r);
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) {
          yr[i] = from_float<T>(vec_silu(to_float(gate[i])) * to_float(up[i]));
        }
      }
    });
  });
}

}  // namespace mllm_kernel::cpu
