// Activation functions in fp32, shared by the gated activations (silu_and_mul,
// gelu_and_mul, gelu_tanh_and_mul) and the gated RMSNorm.
#pragma once

#include <cuda_runtime.h>

namespace mllm_kernel::cuda {

/// silu(x) = x * sigmoid(x). The fast reciprocal division (2 ulp) instead of an IEEE
/// one: it is a third of the instructions per element, which the gated norm's
/// throughput feels. For x < -87 the denominator overflows its range and the
/// result is 0 (the true value is below 1e-36).
struct Silu {
  __device__ __forceinline__ float operator()(float x) const {
    return __fdividef(x, 1.0f + __expf(-x));
  }
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
