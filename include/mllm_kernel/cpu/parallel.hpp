// Splitting CPU work over OpenMP threads. Kernels that include this are built
// with -fopenmp (mllm_kernel/cpu/jit/compile_flags.py); without it the loops run
// serially, so a kernel stays correct either way.
#pragma once

#include <algorithm>
#include <cstdint>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "mllm_kernel/utils.hpp"

namespace mllm_kernel::cpu {

/// Work is measured in element accesses (a load or a store, with a few flops):
/// an element-wise op costs 2 per element, a norm reading its input twice 3.
/// Below this much work per thread, waking another thread costs more than it
/// saves: a parallel region costs a few microseconds, about this much work.
inline constexpr int64_t kMinWorkPerThread = int64_t{1} << 16;

/// The extra cost, in element accesses, of an element that needs an exp.
inline constexpr int64_t kExpCost = 8;

/// How many threads `num_items` items of `item_cost` work each deserve, at
/// most `max_threads` (the caller's budget, e.g. torch.get_num_threads()).
inline int threads_for(int64_t num_items, int64_t item_cost, int64_t max_threads) {
  const int64_t total = num_items * std::max<int64_t>(item_cost, 1);
  const int64_t by_work = std::max<int64_t>(total / kMinWorkPerThread, 1);
  return static_cast<int>(
      std::clamp<int64_t>(std::min(by_work, num_items), 1, std::max<int64_t>(max_threads, 1)));
}

/// Calls body(begin, end) on disjoint contiguous chunks covering [0, num_items),
/// one chunk per thread. `body` must not throw (check arguments before).
template <typename Body>
void parallel_for(int64_t num_items, int64_t item_cost, int64_t max_threads, const Body& body) {
  if (num_items <= 0) return;
  const int threads = threads_for(num_items, item_cost, max_threads);
  if (threads == 1) {
    body(int64_t{0}, num_items);
    return;
  }
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
  {
    const int64_t parts = omp_get_num_threads();
    const int64_t part = omp_get_thread_num();
    const int64_t chunk = div_ceil(num_items, parts);
    const int64_t begin = std::min(part * chunk, num_items);
    const int64_t end = std::min(begin + chunk, num_items);
    if (begin < end) body(begin, end);
  }
#else
  body(int64_t{0}, num_items);
#endif
}

}  // namespace mllm_kernel::cpu
