// Do the driver's virtual-memory calls run in parallel when several threads make them at once?
// Each thread maps a kept 2 MiB handle into its own address range, grants access and unmaps it,
// over and over; printed per thread count: the median and p90 of one cycle, and the cycles per
// second of all threads together. If the driver serialised these calls, a cycle would take
// about as many times longer as there are threads and the total rate would stay flat. Device 0.
// Build: nvcc -O2 -o threads_probe threads_probe.c -lcuda -lpthread
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define CK(x) do { CUresult r = (x); if (r != CUDA_SUCCESS) { const char *s; cuGetErrorString(r, &s); fprintf(stderr, "%s: %s (line %d)\n", #x, s, __LINE__); exit(1);} } while (0)
#define CYCLES 400
#define MAX_THREADS 16
#define PAGE (2u << 20)
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
static int cmp(const void *a, const void *b) { double x = *(double*)a, y = *(double*)b; return x < y ? -1 : x > y; }

static CUcontext ctx;
static CUdevice dev;
static pthread_barrier_t start;

struct worker { CUdeviceptr range; CUmemGenericAllocationHandle handle; double cycle_ns[CYCLES]; };

static void *run(void *arg) {
  struct worker *w = arg;
  CK(cuCtxSetCurrent(ctx));
  CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  pthread_barrier_wait(&start);
  for (int k = 0; k < CYCLES; k++) {
    CUdeviceptr at = w->range + PAGE * (k % 4);
    double t = now();
    CK(cuMemMap(at, PAGE, 0, w->handle, 0));
    CK(cuMemSetAccess(at, PAGE, &acc, 1));
    CK(cuMemUnmap(at, PAGE));
    w->cycle_ns[k] = now() - t;
  }
  return NULL;
}

int main(void) {
  CK(cuInit(0)); CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  CUmemAllocationProp prop = {0}; prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = dev;
  static struct worker workers[MAX_THREADS];
  for (int i = 0; i < MAX_THREADS; i++) {
    CK(cuMemAddressReserve(&workers[i].range, PAGE * 8, 0, 0, 0));
    CK(cuMemCreate(&workers[i].handle, PAGE, &prop, 0));
  }
  int counts[] = {1, 2, 4, 8, 16};
  for (int c = 0; c < 5; c++) {
    int n = counts[c];
    pthread_t threads[MAX_THREADS];
    pthread_barrier_init(&start, NULL, n + 1);
    for (int i = 0; i < n; i++) pthread_create(&threads[i], NULL, run, &workers[i]);
    pthread_barrier_wait(&start);
    double began = now();
    for (int i = 0; i < n; i++) pthread_join(threads[i], NULL);
    double wall = now() - began;
    pthread_barrier_destroy(&start);
    static double all[MAX_THREADS * CYCLES];
    for (int i = 0; i < n; i++) for (int k = 0; k < CYCLES; k++) all[i * CYCLES + k] = workers[i].cycle_ns[k];
    qsort(all, n * CYCLES, sizeof(double), cmp);
    printf("{\"threads\":%d,\"cycle_median_us\":%.1f,\"cycle_p90_us\":%.1f,\"cycles_per_s\":%.0f}\n",
           n, all[n * CYCLES / 2] / 1e3, all[n * CYCLES * 9 / 10] / 1e3, n * CYCLES / (wall / 1e9));
  }
  return 0;
}
