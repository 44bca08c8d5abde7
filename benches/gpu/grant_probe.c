// Does granting access (cuMemSetAccess) cost less for a kept handle than a fresh one, for one
// mapped again where it was before, or in a range beside other mapped chunks? Device 0.
// Build: nvcc -O2 -o grant_probe grant_probe.c -lcuda
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define CK(x) do { CUresult r = (x); if (r != CUDA_SUCCESS) { const char *s; cuGetErrorString(r, &s); fprintf(stderr, "%s: %s (line %d)\n", #x, s, __LINE__); exit(1);} } while (0)
#define N 300
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
static int cmp(const void *a, const void *b) { double x = *(double*)a, y = *(double*)b; return x < y ? -1 : x > y; }
static void report(const char *name, size_t mib, double *acc, double *un, int n) {
  qsort(acc, n, sizeof(double), cmp); qsort(un, n, sizeof(double), cmp);
  printf("{\"case\":\"%s\",\"mib\":%zu,\"grant_median_us\":%.2f,\"grant_p90_us\":%.2f,\"unmap_median_us\":%.2f}\n", name, mib, acc[n/2]/1e3, acc[n*9/10]/1e3, un[n/2]/1e3);
}
int main(void) {
  CUdevice dev; CUcontext ctx; CK(cuInit(0)); CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  CUmemAllocationProp prop = {0}; prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = dev;
  CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  static double a[N], u[N];
  size_t sizes[] = {2u << 20, 6u << 20};
  for (int z = 0; z < 2; z++) {
    size_t sz = sizes[z];
    CUdeviceptr base; CK(cuMemAddressReserve(&base, sz * 64, 0, 0, 0));
    CUdeviceptr X = base, Y = base + sz * 8;
    CUmemGenericAllocationHandle h[8];
    for (int i = 0; i < 8; i++) CK(cuMemCreate(&h[i], sz, &prop, 0));
    double t;
    // fresh handle each time, same VA
    for (int k = 0; k < N; k++) { CUmemGenericAllocationHandle x; CK(cuMemCreate(&x, sz, &prop, 0)); CK(cuMemMap(X, sz, 0, x, 0));
      t = now(); CK(cuMemSetAccess(X, sz, &acc, 1)); a[k] = now() - t; t = now(); CK(cuMemUnmap(X, sz)); u[k] = now() - t; CK(cuMemRelease(x)); }
    report("fresh handle", sz >> 20, a, u, N);
    // one kept handle, always at the same VA
    for (int k = 0; k < N; k++) { CK(cuMemMap(X, sz, 0, h[0], 0));
      t = now(); CK(cuMemSetAccess(X, sz, &acc, 1)); a[k] = now() - t; t = now(); CK(cuMemUnmap(X, sz)); u[k] = now() - t; }
    report("kept handle, same address as last time", sz >> 20, a, u, N);
    // one kept handle, alternating between two addresses
    for (int k = 0; k < N; k++) { CUdeviceptr at = (k & 1) ? Y : X; CK(cuMemMap(at, sz, 0, h[1], 0));
      t = now(); CK(cuMemSetAccess(at, sz, &acc, 1)); a[k] = now() - t; t = now(); CK(cuMemUnmap(at, sz)); u[k] = now() - t; }
    report("kept handle, other address than last time", sz >> 20, a, u, N);
    // eight kept handles rotating through eight addresses (each handle lands somewhere new)
    for (int k = 0; k < N; k++) { CUdeviceptr at = base + sz * (k % 8) + sz * 16; CK(cuMemMap(at, sz, 0, h[(k * 3) % 8], 0));
      t = now(); CK(cuMemSetAccess(at, sz, &acc, 1)); a[k] = now() - t; t = now(); CK(cuMemUnmap(at, sz)); u[k] = now() - t; }
    report("kept handles rotating over addresses", sz >> 20, a, u, N);
    // two kept handles alternating at one address
    for (int k = 0; k < N; k++) { CK(cuMemMap(X, sz, 0, h[2 + (k & 1)], 0));
      t = now(); CK(cuMemSetAccess(X, sz, &acc, 1)); a[k] = now() - t; t = now(); CK(cuMemUnmap(X, sz)); u[k] = now() - t; }
    report("two kept handles alternating at one address", sz >> 20, a, u, N);
    // kept handle mapped while 40 other chunks stay mapped nearby (a busy arena)
    CUdeviceptr busy; CK(cuMemAddressReserve(&busy, sz * 48, 0, 0, 0));
    CUmemGenericAllocationHandle other[40];
    for (int i = 0; i < 40; i++) { CK(cuMemCreate(&other[i], sz, &prop, 0)); CK(cuMemMap(busy + sz * i, sz, 0, other[i], 0)); }
    CK(cuMemSetAccess(busy, sz * 40, &acc, 1));
    for (int k = 0; k < N; k++) { CUdeviceptr at = busy + sz * (40 + (k & 3)); CK(cuMemMap(at, sz, 0, h[4 + (k % 4)], 0));
      t = now(); CK(cuMemSetAccess(at, sz, &acc, 1)); a[k] = now() - t; t = now(); CK(cuMemUnmap(at, sz)); u[k] = now() - t; }
    report("kept handle beside 40 mapped chunks", sz >> 20, a, u, N);
    // fresh handles in a busy arena
    for (int k = 0; k < N; k++) { CUmemGenericAllocationHandle x; CK(cuMemCreate(&x, sz, &prop, 0)); CUdeviceptr at = busy + sz * (40 + (k & 3)); CK(cuMemMap(at, sz, 0, x, 0));
      t = now(); CK(cuMemSetAccess(at, sz, &acc, 1)); a[k] = now() - t; t = now(); CK(cuMemUnmap(at, sz)); u[k] = now() - t; CK(cuMemRelease(x)); }
    report("fresh handle beside 40 mapped chunks", sz >> 20, a, u, N);
    for (int i = 0; i < 40; i++) { CK(cuMemUnmap(busy + sz * i, sz)); CK(cuMemRelease(other[i])); }
    for (int i = 0; i < 8; i++) CK(cuMemRelease(h[i]));
  }
  return 0;
}
