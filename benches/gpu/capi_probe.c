// What an allocation costs the host through the C ABI PyTorch's pluggable interface calls:
// alloc + free pairs of mixed sizes (512 B to 1 MiB, four tensors live, the oldest freed each
// time, as a framework's temporaries are) through any allocator library given by its two entry
// points, on the legacy stream as PyTorch's default stream is, and beside them the driver calls
// gpumem makes on every such call (cuCtxGetCurrent, cuStreamGetCaptureInfo), timed alone.
// Medians of 9 rounds of 100,000 pairs. Device 0.
// Build: nvcc -O2 -o capi_probe capi_probe.c -lcuda -ldl
// Run:   capi_probe LIBRARY ALLOC_SYMBOL FREE_SYMBOL   (e.g. libgpumem.so gpumem_alloc gpumem_free)
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define CK(x) do { CUresult r = (x); if (r != CUDA_SUCCESS) { const char *s; cuGetErrorString(r, &s); fprintf(stderr, "%s: %s\n", #x, s); exit(1);} } while (0)
#define ROUNDS 9
#define PAIRS 100000
typedef void *(*alloc_fn)(long, int, void *);
typedef void (*free_fn)(void *, long, int, void *);
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
static double median(double *v) { qsort(v, ROUNDS, sizeof *v, cmp); return v[ROUNDS / 2]; }

int main(int argc, char **argv) {
  if (argc != 4) { fprintf(stderr, "usage: %s LIBRARY ALLOC_SYMBOL FREE_SYMBOL\n", argv[0]); return 2; }
  CK(cuInit(0)); CUdevice dev; CK(cuDeviceGet(&dev, 0));
  CUcontext ctx; CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  void *lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 1; }
  alloc_fn alloc = (alloc_fn)dlsym(lib, argv[2]);
  free_fn release = (free_fn)dlsym(lib, argv[3]);
  if (!alloc || !release) { fprintf(stderr, "%s lacks %s or %s\n", argv[1], argv[2], argv[3]); return 1; }
  long sizes[16];
  for (int i = 0; i < 16; i++) sizes[i] = (512L << (i % 12)) + 512L * i;
  void *live[4] = {0}; long live_size[4] = {0};
  double pair[ROUNDS], ctx_ns[ROUNDS], capture_ns[ROUNDS];
  for (int r = 0; r < ROUNDS; r++) {
    double t0 = now();
    for (int i = 0; i < PAIRS; i++) {
      int k = i & 3;
      if (live[k]) release(live[k], live_size[k], 0, NULL);
      live_size[k] = sizes[(i * 7) & 15];
      live[k] = alloc(live_size[k], 0, NULL);
      if (!live[k]) { fprintf(stderr, "allocation of %ld bytes failed\n", live_size[k]); return 1; }
    }
    pair[r] = (now() - t0) / PAIRS;
    CUcontext current;
    t0 = now();
    for (int i = 0; i < PAIRS; i++) CK(cuCtxGetCurrent(&current));
    ctx_ns[r] = (now() - t0) / PAIRS;
    CUstreamCaptureStatus status; cuuint64_t id;
    t0 = now();
    for (int i = 0; i < PAIRS; i++) CK(cuStreamGetCaptureInfo(NULL, &status, &id, NULL, NULL, NULL, NULL));
    capture_ns[r] = (now() - t0) / PAIRS;
  }
  printf("%s: %.0f ns a pair; cuCtxGetCurrent %.0f ns; cuStreamGetCaptureInfo %.0f ns (medians of %d rounds)\n",
         argv[2], median(pair), median(ctx_ns), median(capture_ns), ROUNDS);
  return 0;
}
