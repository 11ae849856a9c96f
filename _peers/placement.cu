// Where the block scheduler puts the streaming W4A16 kernel's CTAs: the stream kernel's
// launch shapes (grid split x column tiles, 128 threads, clusters of `split` along x, at
// most 4 CTAs an SM as its launch bounds allow) under each cluster scheduling policy,
// each CTA spinning 20 us and recording its SM. Prints the SMs used and how many CTAs each
// SM got. nvcc -arch=sm_90a -o placement placement.cu && ./placement
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <vector>

__global__ void probe(unsigned* smid, unsigned long long* start, long long spin_ns) {
  extern __shared__ unsigned char smem[];
  unsigned long long s, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(s));
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  smem[threadIdx.x] = 1;
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - s < static_cast<unsigned long long>(spin_ns));
  const int b = blockIdx.x + gridDim.x * blockIdx.y;
  if (threadIdx.x == 0) {
    smid[b] = id;
    start[b] = s;
  }
}

int main() {
  struct Shape { const char* name; int split, tiles; };
  const Shape shapes[] = {{"4096^2 M1 (split 16)", 16, 16},      {"6144x4096 (split 16)", 16, 24},
                          {"4096x14336 (split 16)", 16, 16},     {"14336x4096 (split 8)", 8, 56},
                          {"28672x4096 (split 4)", 4, 112},      {"4096^2 split 8", 8, 16},
                          {"4096^2 split 16, no cluster", -16, 16}};
  const size_t smem = 50 * 1024;  // at most 4 CTAs an SM, as the kernel's launch bounds
  cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(probe, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  int sms;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  for (const Shape& sh : shapes) {
    const int split = sh.split < 0 ? -sh.split : sh.split, cluster = sh.split < 0 ? 1 : sh.split;
    const int n = split * sh.tiles;
    unsigned* d_sm;
    unsigned long long* d_t;
    cudaMalloc(&d_sm, n * 4);
    cudaMalloc(&d_t, n * 8);
    for (int policy = 0; policy < (cluster > 1 ? 3 : 1); ++policy) {
      cudaLaunchAttribute attr[2] = {};
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim = {static_cast<unsigned>(cluster), 1, 1};
      attr[1].id = cudaLaunchAttributeClusterSchedulingPolicyPreference;
      attr[1].val.clusterSchedulingPolicyPreference = static_cast<cudaClusterSchedulingPolicy>(policy);
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(split, sh.tiles);
      cfg.blockDim = dim3(128);
      cfg.dynamicSmemBytes = smem;
      cfg.attrs = attr;
      cfg.numAttrs = 2;
      int clusters = -1;
      cudaOccupancyMaxActiveClusters(&clusters, probe, &cfg);
      cudaLaunchKernelEx(&cfg, probe, d_sm, d_t, 20000LL);
      cudaError_t e = cudaDeviceSynchronize();
      std::vector<unsigned> sm(n);
      std::vector<unsigned long long> t(n);
      cudaMemcpy(sm.data(), d_sm, n * 4, cudaMemcpyDeviceToHost);
      cudaMemcpy(t.data(), d_t, n * 8, cudaMemcpyDeviceToHost);
      std::map<unsigned, int> per_sm;
      for (unsigned s : sm) per_sm[s]++;
      std::map<int, int> hist;
      for (auto& [s, c] : per_sm) hist[c]++;
      const auto [lo, hi] = std::minmax_element(t.begin(), t.end());
      printf("%-30s policy %d (%s): %d CTAs, max active clusters %d, %zu of %d SMs used, start spread %.1f us; SMs holding k CTAs:",
             sh.name, policy, cudaGetErrorString(e), n, clusters, per_sm.size(), sms, (*hi - *lo) / 1e3);
      for (auto& [k, c] : hist) printf(" %d:%d", k, c);
      printf("\n");
    }
    cudaFree(d_sm);
    cudaFree(d_t);
  }
  return 0;
}
