// Times the CUDA virtual-memory calls of a pool miss one by one (median and p90 of many), on device 0.
// Build: gcc -O2 -o vmm_probe vmm_probe.c -I"$CUDA_HOME/include" -lcuda   (or nvcc -o vmm_probe vmm_probe.c -lcuda)
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define CK(x) do { CUresult r = (x); if (r != CUDA_SUCCESS) { const char *s; cuGetErrorString(r, &s); fprintf(stderr, "%s: %s (line %d)\n", #x, s, __LINE__); exit(1);} } while (0)
#define N 400
#define PAGES 8
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
static int cmp(const void *a, const void *b) { double x = *(double*)a, y = *(double*)b; return x < y ? -1 : x > y; }
static void report(const char *name, double *v, int n) {
  qsort(v, n, sizeof(double), cmp);
  printf("{\"call\":\"%s\",\"n\":%d,\"median_us\":%.2f,\"p90_us\":%.2f,\"min_us\":%.2f}\n", name, n, v[n/2]/1e3, v[n*9/10]/1e3, v[0]/1e3);
}
int main(void) {
  CUdevice dev; CUcontext ctx; CK(cuInit(0)); CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  char name[128]; CK(cuDeviceGetName(name, sizeof name, dev)); printf("{\"device\":\"%s\"}\n", name);
  CUmemAllocationProp prop = {0}; prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = dev;
  size_t g; CK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CUdeviceptr va, vb; CK(cuMemAddressReserve(&va, g * PAGES, 0, 0, 0)); CK(cuMemAddressReserve(&vb, g * PAGES, 0, 0, 0));
  CUmemGenericAllocationHandle h[PAGES]; for (int i = 0; i < PAGES; i++) CK(cuMemCreate(&h[i], g, &prop, 0));
  static double create[N], release[N], map1[N], unmap1[N], acc1[N], map8[N], acc8[N], unmap8[N], sync[N], alias[N], aliasacc[N], ev[N];
  CUstream s; CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)); CUevent e; CK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  for (int k = 0; k < N; k++) {
    double t;
    CUmemGenericAllocationHandle x; t = now(); CK(cuMemCreate(&x, g, &prop, 0)); create[k] = now() - t;
    t = now(); CK(cuMemRelease(x)); release[k] = now() - t;
    t = now(); CK(cuMemMap(va, g, 0, h[0], 0)); map1[k] = now() - t;
    t = now(); CK(cuMemSetAccess(va, g, &acc, 1)); acc1[k] = now() - t;
    // the same physical page mapped at a second address while the first mapping stays
    t = now(); CK(cuMemMap(vb, g, 0, h[0], 0)); alias[k] = now() - t;
    t = now(); CK(cuMemSetAccess(vb, g, &acc, 1)); aliasacc[k] = now() - t;
    CK(cuMemUnmap(vb, g));
    t = now(); CK(cuMemUnmap(va, g)); unmap1[k] = now() - t;
    t = now(); for (int i = 0; i < PAGES; i++) CK(cuMemMap(va + i * g, g, 0, h[i], 0)); map8[k] = now() - t;
    t = now(); CK(cuMemSetAccess(va, g * PAGES, &acc, 1)); acc8[k] = now() - t;
    t = now(); CK(cuMemUnmap(va, g * PAGES)); unmap8[k] = now() - t;
    t = now(); CK(cuStreamSynchronize(s)); sync[k] = now() - t;
    t = now(); CK(cuEventRecord(e, s)); CK(cuEventQuery(e)); ev[k] = now() - t;
  }
  report("cuMemCreate 1 page", create, N); report("cuMemRelease 1 page", release, N);
  report("cuMemMap 1 kept page", map1, N); report("cuMemSetAccess 1 page", acc1, N);
  report("cuMemMap alias (page mapped elsewhere too)", alias, N); report("cuMemSetAccess alias 1 page", aliasacc, N);
  report("cuMemUnmap 1 page", unmap1, N);
  report("cuMemMap 8 kept pages (8 calls)", map8, N); report("cuMemSetAccess 8 pages (1 call)", acc8, N); report("cuMemUnmap 8 pages (1 call)", unmap8, N);
  report("cuStreamSynchronize idle stream", sync, N); report("cuEventRecord+cuEventQuery", ev, N);
  // Does a call cost per byte or per physical allocation? One handle of 2, 16 and 64 MiB, and
  // access granted again on a range that already has it.
  static double hc[N], hm[N], ha[N], hr[N], hu[N], hrel[N];
  CUdeviceptr big; CK(cuMemAddressReserve(&big, (size_t)1 << 30, 0, 0, 0));
  size_t sizes[] = {2 << 20, 16 << 20, 64 << 20, 256 << 20, (size_t)1 << 30};
  for (int z = 0; z < 5; z++) {
    size_t sz = sizes[z]; char label[96];
    for (int k = 0; k < N / 4; k++) {
      double t; CUmemGenericAllocationHandle x;
      t = now(); CK(cuMemCreate(&x, sz, &prop, 0)); hc[k] = now() - t;
      t = now(); CK(cuMemMap(big, sz, 0, x, 0)); hm[k] = now() - t;
      t = now(); CK(cuMemSetAccess(big, sz, &acc, 1)); ha[k] = now() - t;
      t = now(); CK(cuMemSetAccess(big, sz, &acc, 1)); hr[k] = now() - t;
      t = now(); CK(cuMemUnmap(big, sz)); hu[k] = now() - t;
      t = now(); CK(cuMemRelease(x)); hrel[k] = now() - t;
    }
    snprintf(label, sizeof label, "one handle %zu MiB: cuMemCreate", sz >> 20); report(label, hc, N / 4);
    snprintf(label, sizeof label, "one handle %zu MiB: cuMemMap", sz >> 20); report(label, hm, N / 4);
    snprintf(label, sizeof label, "one handle %zu MiB: cuMemSetAccess", sz >> 20); report(label, ha, N / 4);
    snprintf(label, sizeof label, "one handle %zu MiB: cuMemSetAccess again", sz >> 20); report(label, hr, N / 4);
    snprintf(label, sizeof label, "one handle %zu MiB: cuMemUnmap", sz >> 20); report(label, hu, N / 4);
    snprintf(label, sizeof label, "one handle %zu MiB: cuMemRelease", sz >> 20); report(label, hrel, N / 4);
  }
  // The driver pool growing from empty: a 16 MiB cuMemAllocAsync on a trimmed pool.
  CUmemoryPool pool; CK(cuDeviceGetDefaultMemPool(&pool, dev));
  static double grow[N], again[N];
  for (int k = 0; k < N / 4; k++) {
    CUdeviceptr p; double t;
    CK(cuStreamSynchronize(s)); CK(cuMemPoolTrimTo(pool, 0));
    t = now(); CK(cuMemAllocAsync(&p, 16 << 20, s)); grow[k] = now() - t;
    CK(cuMemFreeAsync(p, s));
    t = now(); CK(cuMemAllocAsync(&p, 16 << 20, s)); again[k] = now() - t;
    CK(cuMemFreeAsync(p, s));
  }
  report("driver pool 16 MiB from a trimmed pool", grow, N / 4); report("driver pool 16 MiB reused", again, N / 4);
  return 0;
}
