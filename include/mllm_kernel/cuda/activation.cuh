// Activation functions in fp32, shared by the gated activations (silu_and_mul,
// gelu_and_mul, gelu_tanh_and_mul) and the gated RMSNorm.
#pragma once

#include <cuda_runtime.h>

namespace mllm_kernel::cuda {

/// silu(x) = x * sigmoid(x).
struct Silu {
  __device__ __forceinline__ float operator()(float x) const { return x / (1.0f + __expf(-x)); }
};

/// The exact gelu: x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2))).
struct Gelu {
  __device__ __forceinline__ float operator()(float x) const {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
  }
};

/// The tanh approximation: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
struct GeluTanh {
  __device__ __forceinline__ float operator()(float x) const {
    const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
  }
};

}  // namespace mllm_kernel::cuda
