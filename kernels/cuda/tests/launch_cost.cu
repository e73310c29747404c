// The host cost of one kernel launch, the floor under an eager collective's time per call: a
// trivial kernel (a 136-byte parameter, like the collectives' CollArgs) launched 2000 times on
// one stream through the runtime (<<<>>>), cuLaunchKernel, and cuCtxSetCurrent + cuLaunchKernel
// (what the HAL does per launch), on 1 and 64 blocks. Prints the host's us per launch and the
// us per launch until the GPU finished. Run it alone and under MPS:
//
//   nvcc -O2 -arch=sm_90 kernels/cuda/tests/launch_cost.cu -lcuda -o launch_cost
//   ./launch_cost
//
// H200, 2026-12-06 (docs/perf.md, round 17): 3.45-4.04 us per launch, one process, no MPS.
#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>

struct Args {
  unsigned long long a[17];
};

__global__ void k(Args x) {
  if (x.a[0] == 12345 && threadIdx.x == 0) x.a[1] = 1;
}

int main() {
  const int n = 2000;
  cudaSetDevice(0);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  Args a{};
  CUcontext ctx;
  cuCtxGetCurrent(&ctx);
  CUfunction f;
  cudaGetFuncBySymbol(&f, (const void*)k);
  void* params[] = {&a};
  auto time = [&](const char* name, auto body, int blocks, int threads) {
    for (int i = 0; i < 50; i++) body(blocks, threads);
    cudaStreamSynchronize(s);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; i++) body(blocks, threads);
    auto t1 = std::chrono::steady_clock::now();
    cudaStreamSynchronize(s);
    auto t2 = std::chrono::steady_clock::now();
    printf("%-34s grid %3d x %4d: host %.2f us/launch, with the GPU %.2f us/launch\n", name, blocks, threads,
           std::chrono::duration<double, std::micro>(t1 - t0).count() / n,
           std::chrono::duration<double, std::micro>(t2 - t0).count() / n);
  };
  for (int g : {1, 64}) {
    time("runtime <<<>>>", [&](int b, int th) { k<<<b, th, 0, s>>>(a); }, g, 512);
    time("cuLaunchKernel", [&](int b, int th) { cuLaunchKernel(f, b, 1, 1, th, 1, 1, 0, s, params, nullptr); }, g, 512);
    time("cuCtxSetCurrent + cuLaunchKernel",
         [&](int b, int th) {
           cuCtxSetCurrent(ctx);
           cuLaunchKernel(f, b, 1, 1, th, 1, 1, 0, s, params, nullptr);
         },
         g, 512);
  }
  return 0;
}
