// Whether a miss could map idle chunks at a new address while work queued on the old one still
// runs, and unmap the old address later: what cuMemMap, cuMemSetAccess and cuMemUnmap cost with
// the GPU idle and with it far behind the host, whether any of them waits for the GPU, and
// whether work on the new address sees what stream order promises. Device 0, one stream, the
// driver API only (copies and memsets keep the GPU busy; no kernels). Prints JSON lines.
// Build: gcc -O2 -o detach_probe detach_probe.c -I/usr/local/cuda/include -lcuda
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define CK(x) do { CUresult r = (x); if (r != CUDA_SUCCESS) { const char *s; cuGetErrorString(r, &s); fprintf(stderr, "%s: %s (line %d)\n", #x, s, __LINE__); exit(1);} } while (0)
#define CHUNKS 4              /* chunks moved, of CHUNK_MIB each */
#define CHUNK_MIB 64
#define ROUNDS 15
#define BUSY_MIB 4096         /* the buffer the busy work fills, over and over */
static double now_us(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
static double median(double *v, int n) { qsort(v, n, sizeof(double), cmp); return v[n / 2]; }

static CUmemGenericAllocationHandle handles[CHUNKS];
static CUmemAccessDesc access;
static const size_t chunk = (size_t)CHUNK_MIB << 20;

static double map_all(CUdeviceptr va) {
  double t = now_us();
  for (int i = 0; i < CHUNKS; i++) CK(cuMemMap(va + i * chunk, chunk, 0, handles[i], 0));
  return now_us() - t;
}
static double grant(CUdeviceptr va) {
  double t = now_us();
  CK(cuMemSetAccess(va, chunk * CHUNKS, &access, 1));
  return now_us() - t;
}
static double unmap_all(CUdeviceptr va) {
  double t = now_us();
  for (int i = 0; i < CHUNKS; i++) CK(cuMemUnmap(va + i * chunk, chunk));
  return now_us() - t;
}
static int busy(CUstream s) { return cuStreamQuery(s) == CUDA_ERROR_NOT_READY; }

int main(void) {
  CUdevice dev; CUcontext ctx; CK(cuInit(0)); CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  char name[128]; CK(cuDeviceGetName(name, sizeof name, dev)); printf("{\"device\":\"%s\"}\n", name);
  CUmemAllocationProp prop = {0}; prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = dev;
  access.location = prop.location; access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (int i = 0; i < CHUNKS; i++) CK(cuMemCreate(&handles[i], chunk, &prop, 0));
  CUdeviceptr old_va, new_va, fresh_va;
  CK(cuMemAddressReserve(&old_va, chunk * CHUNKS, 0, 0, 0));
  CK(cuMemAddressReserve(&new_va, chunk * CHUNKS, 0, 0, 0));
  CK(cuMemAddressReserve(&fresh_va, chunk * CHUNKS, 0, 0, 0));
  CUstream s; CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr scratch; CK(cuMemAlloc(&scratch, (size_t)BUSY_MIB << 20));
  size_t words = chunk * CHUNKS / 4;

  // 1. GPU idle: mapping and granting the chunks at a second address while they stay mapped at
  // the first, against mapping them where they are mapped nowhere.
  double map_again[ROUNDS], grant_again[ROUNDS], unmap_again[ROUNDS], map_only[ROUNDS], grant_only[ROUNDS];
  for (int r = 0; r < ROUNDS; r++) {
    map_all(old_va); grant(old_va);
    map_again[r] = map_all(new_va); grant_again[r] = grant(new_va);
    unmap_again[r] = unmap_all(old_va);   // the old address goes; the new one stays
    unmap_all(new_va);
    map_only[r] = map_all(fresh_va); grant_only[r] = grant(fresh_va);
    unmap_all(fresh_va);
  }
  printf("{\"gpu\":\"idle\",\"chunks\":%d,\"chunk_mib\":%d,\"map_us_mapped_elsewhere\":%.1f,\"grant_us_mapped_elsewhere\":%.1f,"
         "\"unmap_old_us\":%.1f,\"map_us_mapped_nowhere\":%.1f,\"grant_us_mapped_nowhere\":%.1f}\n",
         CHUNKS, CHUNK_MIB, median(map_again, ROUNDS), median(grant_again, ROUNDS), median(unmap_again, ROUNDS),
         median(map_only, ROUNDS), median(grant_only, ROUNDS));

  // 2. The GPU far behind: work queued on the old address (a fill with 1), then a long queue of
  // other work; the host maps the chunks at the new address at once, queues a fill with 2 there
  // (after the old work, in stream order), and unmaps the old address once the event after the
  // old work has passed, while the rest still runs. Timed per call; "busy" says the stream still
  // had work when the call returned (a call that waited for the GPU would find it idle).
  double busy_work_ms = 0;
  for (int r = 0; r < 3; r++) {
    map_all(old_va); grant(old_va);
    CUevent old_done; CK(cuEventCreate(&old_done, CU_EVENT_DISABLE_TIMING));
    double queued = now_us();
    for (int i = 0; i < 8; i++) CK(cuMemsetD32Async(scratch, i, ((size_t)BUSY_MIB << 20) / 4, s));
    CK(cuMemsetD32Async(old_va, 1, words, s));
    CK(cuEventRecord(old_done, s));
    for (int i = 0; i < 24; i++) CK(cuMemsetD32Async(scratch, i, ((size_t)BUSY_MIB << 20) / 4, s));
    double m = map_all(new_va); int busy_after_map = busy(s);
    double g = grant(new_va); int busy_after_grant = busy(s);
    CK(cuMemsetD32Async(new_va, 2, words, s));
    double waited = now_us();
    while (cuEventQuery(old_done) == CUDA_ERROR_NOT_READY) {}
    waited = now_us() - waited;
    int busy_before_unmap = busy(s);
    double u = unmap_all(old_va); int busy_after_unmap = busy(s);
    CK(cuStreamSynchronize(s));
    busy_work_ms = (now_us() - queued) / 1e3;
    unsigned int *host = malloc(chunk * CHUNKS);
    CK(cuMemcpyDtoH(host, new_va, chunk * CHUNKS));
    size_t wrong = 0;
    for (size_t i = 0; i < words; i++) wrong += host[i] != 2;
    free(host);
    printf("{\"gpu\":\"behind\",\"round\":%d,\"queue_ms\":%.1f,\"map_us\":%.1f,\"busy_after_map\":%d,\"grant_us\":%.1f,"
           "\"busy_after_grant\":%d,\"old_work_waited_ms\":%.1f,\"busy_before_unmap\":%d,\"unmap_old_us\":%.1f,"
           "\"busy_after_unmap\":%d,\"words_not_2\":%zu}\n",
           r, busy_work_ms, m, busy_after_map, g, busy_after_grant, waited / 1e3, busy_before_unmap, u,
           busy_after_unmap, wrong);
    unmap_all(new_va);
    CK(cuEventDestroy(old_done));
  }
  for (int i = 0; i < CHUNKS; i++) CK(cuMemRelease(handles[i]));
  return 0;
}
