// Activation functions in fp32, shared by the gated activations (silu_and_mul,
// gelu_and_mul, gelu_tanh_and_mul) and the gated RMSNorm.
#pragma once

#include <cuda_runtime.h>

#include "mllm_kernel/utils.cuh"

namespace mllm_kernel::cuda {

/// 1/x with the hardware approximation (rcp.approx.ftz: within 1 ulp, one MUFU.RCP;
/// 1/inf = 0). __fdividef(1, x) adds a range check and a rescale for subnormals.
__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// silu(x) = x * sigmoid(x). The fast reciprocal division (2 ulp) instead of an IEEE
/// one: it is a third of the instructions per element, which the gated norm's
/// throughput feels. For x < -87 the denominator overflows its range and the
/// result is 0 (the true value is below 1e-36).
struct Silu {
  __device__ __forceinline__ float operator()(float x) const {
    return __fdividef(x, 1.0f + __expf(-x));
  }
};

/// The exact gelu, x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2))), without erff (25
/// instructions per element, which bound gelu_and_mul on compute). With a = |x| and
/// q = Phi(-a) (Phi(x) = 1 - Phi(-x)):
///
///   gelu(x) = max(x, 0) - a q,   q = 2^(-K a^2) (1/2 - a P(a) / Q(a)),   K = log2(e) / 2,
///
/// P/Q (degree 3/4) a weighted minimax fit of (1/2 - erfcx(a / sqrt 2) / 2) / a on
/// [0, 13.25]; the coefficients, their derivation and an fp32 emulation of this code come
/// from scripts/fit_gelu_erf.py. Phi(-a) rather than 1 + erf keeps gelu's relative
/// accuracy for x < 0, where 1 + erf cancels (to 0 below x = -5.5). Measured on an H100
/// over all fp32 x: |Phi error| 0.9e-7 (1.2e-7 as gelu(x) / x, as erff's form); gelu within
/// 2.7 ulp for x >= 0 and 4.3 ulp on [-1, 0] (erff's form: 1.8 and 2.4), then growing like
/// x^2 with the rounding of the exponent's argument: 17 ulp on [-3, -1], 118 ulp (8e-6)
/// near -10 (erff's form: 196 ulp, and 100% below -5.5).
///
/// 18 instructions (13 FFMA/FMUL, 3 FMNMX, MUFU.RCP, MUFU.EX2), no branch or select. Past
/// |x| ~ 13.2 the exponential flushes to 0: gelu(x) = x above, 0 below (true value under
/// 6e-39). a is clamped so P and Q stay finite; m only from above, so gelu(-inf) =
/// -inf * 0 = NaN as in torch; gelu(+inf) = +inf, gelu(NaN) = NaN.
struct Gelu {
  __device__ __forceinline__ float operator()(float x) const {
    const float a = fminf(fabsf(x), 13.25f);
    const float m = fminf(x, 13.25f);
    float p = fmaf(a, 0.015671685f, 0.111182846f);
    float q = fmaf(a, 0.031344347f, 0.24733457f);
    p = fmaf(p, a, 0.32639247f);
    q = fmaf(q, a, 0.85083044f);
    p = fmaf(p, a, 0.39894167f);
    q = fmaf(q, a, 1.444782f);
    q = fmaf(q, a, 1.0f);
    const float r = fmaf(-a, p * fast_rcp(q), 0.5f);   // erfcx(a / sqrt 2) / 2
    const float e = fast_exp2((x * -0.7213475f) * x);  // exp(-x^2 / 2)
    return fmaf(-fabsf(m), e * r, fmaxf(x, 0.0f));
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
