// What a miss pays per physical handle: one cycle of create, map, one cuMemSetAccess over the
// whole range, unmap and release for 16 MiB, 256 MiB and 1 GiB cut into one handle, 8 MiB handles
// or 2 MiB handles (medians of 15); whether part of a handle can be mapped (cuMemMap at an
// offset); and how one grant of access over 64 MiB grows with the handles behind it. Device 0.
// Build: nvcc -O2 -o handle_probe handle_probe.cu -lcuda
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <vector>
#include <algorithm>
#define CK(x) do { CUresult r = (x); if (r != CUDA_SUCCESS) { const char* s; cuGetErrorString(r, &s); fprintf(stderr, "%s:%d %s -> %s\n", __FILE__, __LINE__, #x, s); exit(1);} } while (0)
static double now_us() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
static CUmemAllocationProp prop; static CUmemAccessDesc acc; static size_t G = 2 << 20;
struct Times { double create, map, access, unmap, release; };
// One cycle over `size` bytes at `va` cut into `handles` handles of equal size.
static Times cycle(CUdeviceptr va, size_t size, int handles) {
  Times t{};
  size_t hsize = size / handles;
  std::vector<CUmemGenericAllocationHandle> h(handles);
  double a = now_us();
  for (int i = 0; i < handles; i++) CK(cuMemCreate(&h[i], hsize, &prop, 0));
  double b = now_us();
  for (int i = 0; i < handles; i++) CK(cuMemMap(va + i * hsize, hsize, 0, h[i], 0));
  double c = now_us();
  CK(cuMemSetAccess(va, size, &acc, 1));
  double d = now_us();
  for (int i = 0; i < handles; i++) CK(cuMemUnmap(va + i * hsize, hsize));
  double e = now_us();
  for (int i = 0; i < handles; i++) CK(cuMemRelease(h[i]));
  double f = now_us();
  t.create = b - a; t.map = c - b; t.access = d - c; t.unmap = e - d; t.release = f - e;
  return t;
}
int main() {
  CK(cuInit(0)); CUdevice dev; CK(cuDeviceGet(&dev, 0)); CUcontext ctx; CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  prop = {}; prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = 0;
  acc = {}; acc.location = prop.location; acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  size_t sizes[] = {16ull << 20, 256ull << 20, 1024ull << 20};
  CUdeviceptr va; CK(cuMemAddressReserve(&va, 2048ull << 20, 0, 0, 0));
  printf("size_mib,layout,handles,create_us,map_us,access_us,unmap_us,release_us,total_us\n");
  for (size_t size : sizes) {
    int pages = size / G;
    struct L { const char* name; int handles; } layouts[] = {
      {"one handle", 1},
      {"a handle per 2 MiB", pages},
      {"8 MiB handles", std::max(1, pages / 4)},
    };
    for (auto& l : layouts) {
      std::vector<Times> ts;
      for (int r = 0; r < 15; r++) ts.push_back(cycle(va, size, l.handles));
      auto med = [&](double Times::*f) { std::vector<double> v; for (auto& t : ts) v.push_back(t.*f); std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
      double c = med(&Times::create), m = med(&Times::map), a = med(&Times::access), u = med(&Times::unmap), r = med(&Times::release);
      printf("%zu,%s,%d,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f\n", size >> 20, l.name, l.handles, c, m, a, u, r, c + m + a + u + r);
    }
  }
  // A range of 2 MiB mappings from several handles, granted once: is access charged per handle?
  printf("# access over 64 MiB mapped as k handles of 64/k MiB, granted once\n");
  // cuMemMap's offset into a handle must be 0 (CUDA 13): a handle is mapped whole or not at all.
  {
    CUmemGenericAllocationHandle h; CK(cuMemCreate(&h, 4 * G, &prop, 0));
    CUresult r = cuMemMap(va, G, G, h, 0); const char* s; cuGetErrorString(r, &s);
    printf("map 2 MiB at offset 2 MiB of an 8 MiB handle: %s\n", s);
    if (r == CUDA_SUCCESS) CK(cuMemUnmap(va, G));
    CK(cuMemRelease(h));
  }
  size_t size = 64ull << 20;
  for (int k : {1, 2, 4, 8, 16, 32}) {
    std::vector<double> v;
    for (int r = 0; r < 15; r++) v.push_back(cycle(va, size, k).access);
    std::sort(v.begin(), v.end());
    printf("access,64 MiB,handles=%d,%.1f us\n", k, v[v.size() / 2]);
  }
  return 0;
}
