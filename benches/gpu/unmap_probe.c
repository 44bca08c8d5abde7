// What one cuMemUnmap over several handles mapped side by side costs against one call per handle
// (back to back, and with pauses between the calls), and what the driver does with a range that
// is not all mapped or that cuts a handle, on device 0. Prints JSON lines.
// Build: nvcc -O2 -o unmap_probe unmap_probe.c -lcuda
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define CK(x) do { CUresult r = (x); if (r != CUDA_SUCCESS) { const char *s; cuGetErrorString(r, &s); fprintf(stderr, "%s: %s (line %d)\n", #x, s, __LINE__); exit(1);} } while (0)
#define ROUNDS 60
#define MAX_HANDLES 32
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
static int cmp(const void *a, const void *b) { double x = *(double*)a, y = *(double*)b; return x < y ? -1 : x > y; }
static double median(double *v, int n) { qsort(v, n, sizeof(double), cmp); return v[n / 2]; }

static CUmemGenericAllocationHandle handles[MAX_HANDLES];
static CUmemAccessDesc access;
static size_t page;

static void map_side_by_side(CUdeviceptr va, int n) {
  for (int i = 0; i < n; i++) CK(cuMemMap(va + i * page, page, 0, handles[i], 0));
  CK(cuMemSetAccess(va, page * n, &access, 1));
}

static int still_mapped(CUdeviceptr at) {
  CUmemGenericAllocationHandle h;
  if (cuMemRetainAllocationHandle(&h, (void *)at) != CUDA_SUCCESS) return 0;
  CK(cuMemRelease(h));
  return 1;
}

int main(void) {
  CUdevice dev; CUcontext ctx; CK(cuInit(0)); CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  char name[128]; CK(cuDeviceGetName(name, sizeof name, dev)); printf("{\"device\":\"%s\"}\n", name);
  CUmemAllocationProp prop = {0}; prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = dev;
  CK(cuMemGetAllocationGranularity(&page, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE; access.location.id = dev; access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (int i = 0; i < MAX_HANDLES; i++) CK(cuMemCreate(&handles[i], page, &prop, 0));
  CUdeviceptr va; CK(cuMemAddressReserve(&va, page * (MAX_HANDLES + 1), 0, 0, 0));

  int counts[] = {1, 2, 4, 8, 32};
  for (int c = 0; c < 5; c++) {
    int n = counts[c];
    static double one_call[ROUNDS], per_handle[ROUNDS];
    for (int k = 0; k < ROUNDS; k++) {
      map_side_by_side(va, n);
      double t = now(); CK(cuMemUnmap(va, page * n)); one_call[k] = now() - t;
      map_side_by_side(va, n);
      t = now(); for (int i = 0; i < n; i++) CK(cuMemUnmap(va + i * page, page)); per_handle[k] = now() - t;
    }
    printf("{\"handles\":%d,\"one_call_us\":%.1f,\"one_call_per_handle_us\":%.1f}\n", n, median(one_call, ROUNDS) / 1e3, median(per_handle, ROUNDS) / 1e3);
  }

  // Eight handles unmapped one call each, with a pause between calls: does a call after a pause
  // pay again what the first of a burst pays?
  double gaps_us[] = {10, 100, 1000};
  for (int g = 0; g < 3; g++) {
    static double spent[ROUNDS];
    for (int k = 0; k < ROUNDS; k++) {
      map_side_by_side(va, 8);
      spent[k] = 0;
      for (int i = 0; i < 8; i++) {
        double until = now() + gaps_us[g] * 1e3;
        while (now() < until) {}
        double t = now(); CK(cuMemUnmap(va + i * page, page)); spent[k] += now() - t;
      }
    }
    printf("{\"handles\":8,\"pause_us\":%.0f,\"in_calls_us\":%.1f}\n", gaps_us[g], median(spent, ROUNDS) / 1e3);
  }

  // A range of four mapped handles and one unmapped page after them: does the driver refuse it,
  // and which of the four are still mapped afterwards?
  map_side_by_side(va, 4);
  CUresult r = cuMemUnmap(va, page * 5);
  const char *err = "CUDA_SUCCESS"; if (r != CUDA_SUCCESS) cuGetErrorName(r, &err);
  int left = 0; for (int i = 0; i < 4; i++) left += still_mapped(va + i * page);
  printf("{\"unmap_past_the_mapped_pages\":\"%s\",\"handles_still_mapped\":%d,\"of\":4}\n", err, left);
  // A range that cuts the last of four handles in two (granularity 2 MiB, a 4 MiB handle).
  for (int i = 0; i < 4; i++) if (still_mapped(va + i * page)) CK(cuMemUnmap(va + i * page, page));
  CUmemGenericAllocationHandle wide; CK(cuMemCreate(&wide, 2 * page, &prop, 0));
  for (int i = 0; i < 3; i++) CK(cuMemMap(va + i * page, page, 0, handles[i], 0));
  CK(cuMemMap(va + 3 * page, 2 * page, 0, wide, 0));
  CK(cuMemSetAccess(va, page * 5, &access, 1));
  r = cuMemUnmap(va, page * 4);
  err = "CUDA_SUCCESS"; if (r != CUDA_SUCCESS) cuGetErrorName(r, &err);
  left = 0; for (int i = 0; i < 4; i++) left += still_mapped(va + i * page);
  printf("{\"unmap_cutting_a_handle\":\"%s\",\"handles_still_mapped\":%d,\"of\":4}\n", err, left);
  return 0;
}
