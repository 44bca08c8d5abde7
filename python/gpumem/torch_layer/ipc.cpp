// CUDA IPC: what a CUDA tensor sent to another process through torch.multiprocessing asks of the
// allocator on each side. PyTorch's handle is a string: a version byte, a type byte, then
//   'c'  the cudaIpcMemHandle_t of a cudaMalloc allocation (PyTorch's allocator by default);
//   'e'  an expandable segment: a header {pid, 4 zero bytes, segment size, count}, then `count`
//        ints, descriptors in the sender's process, each one physical allocation of `segment
//        size` bytes, mapped one after another from the segment's start.
// gpumem's memory is mapped through CUDA's virtual-memory API, which cudaIpcGetMemHandle refuses,
// so it sends 'e' from its own chunks (exported by the library as descriptors that stay open
// until the chunk is released); it opens both kinds, from PyTorch's allocator or from gpumem.
#include "allocator.h"

#include "gpumem_api.h"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <cuda.h>
#include <dlfcn.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <unordered_map>
#include <vector>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace gpumem_torch {

namespace {

// PyTorch 2.11's SHAREABLE_HANDLE_VERSION: a receiver refuses versions newer than its own.
constexpr char kHandleVersion = 2;
constexpr char kCudaMalloc = 'c';
constexpr char kExpandableSegment = 'e';

// PyTorch's ShareHeader {pid_t pid; size_t segment_size; size_t num_handles;}, value
// initialised so that the padding after the pid is zero (the string is a cache key).
struct ShareHeader {
  int32_t pid = 0;
  int32_t padding = 0;
  uint64_t segment_size = 0;
  uint64_t num_handles = 0;
};
static_assert(sizeof(ShareHeader) == 24, "PyTorch's ShareHeader is 24 bytes");

// The driver calls importing needs, from the libcuda the process already loaded (c10's own
// table would need NVML's headers to compile).
struct Driver {
  decltype(&cuMemImportFromShareableHandle) import_handle = nullptr;
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuGetErrorString) error_string = nullptr;
};

template <typename F>
void look_up(void* library, const char* name, F& function) {
  function = reinterpret_cast<F>(dlsym(library, name));
  TORCH_CHECK(function != nullptr, "the CUDA driver has no ", name);
}

const Driver& driver() {
  static const Driver table = [] {
    Driver d;
    void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    TORCH_CHECK(library != nullptr, "libcuda.so.1 is not loaded in this process");
    look_up(library, "cuMemImportFromShareableHandle", d.import_handle);
    look_up(library, "cuMemAddressReserve", d.reserve);
    look_up(library, "cuMemAddressFree", d.address_free);
    look_up(library, "cuMemMap", d.map);
    look_up(library, "cuMemSetAccess", d.set_access);
    look_up(library, "cuMemUnmap", d.unmap);
    look_up(library, "cuMemRelease", d.release);
    look_up(library, "cuGetErrorString", d.error_string);
    return d;
  }();
  return table;
}

void check(CUresult result, const char* call) {
  if (result != CUDA_SUCCESS) {
    const char* text = nullptr;
    driver().error_string(result, &text);
    TORCH_CHECK(false, call, " failed: ", text != nullptr ? text : "unknown CUDA error");
  }
}

struct Chunk {
  uintptr_t addr = 0;
  uint64_t bytes = 0;
  int fd = -1;
};

// "C addr size fd" lines (gpumem_export_chunks), read without iostreams (see stats_snapshot.cpp).
std::vector<Chunk> parse_chunks(const std::string& text) {
  std::vector<Chunk> chunks;
  const char* at = text.c_str();
  while (*at == 'C') {
    char* end = nullptr;
    Chunk chunk;
    chunk.addr = std::strtoull(at + 1, &end, 10);
    chunk.bytes = std::strtoull(end, &end, 10);
    chunk.fd = static_cast<int>(std::strtol(end, &end, 10));
    chunks.push_back(chunk);
    at = end;
    while (*at == '\n') {
      ++at;
    }
  }
  return chunks;
}

std::string chunk_sizes(const std::vector<Chunk>& chunks) {
  std::string sizes;
  for (const Chunk& chunk : chunks) {
    sizes += (sizes.empty() ? "" : ", ") + std::to_string(chunk.bytes >> 20) + " MiB";
  }
  return sizes;
}

// Memory another process shared as 'e', imported and mapped here; unmapped when the last
// tensor on it goes.
struct ImportedSegment {
  c10::DeviceIndex device = 0;
  CUdeviceptr base = 0;
  uint64_t segment_size = 0;
  std::vector<CUmemGenericAllocationHandle> handles;
  size_t mapped = 0;
  bool reserved = false;

  ~ImportedSegment() {
    const Driver& d = driver();
    c10::cuda::CUDAGuard guard(device);
    if (mapped > 0) {
      // Work queued on this memory must be done before it is unmapped.
      (void)cudaDeviceSynchronize();
    }
    for (size_t i = 0; i < mapped; ++i) {
      d.unmap(base + i * segment_size, segment_size);
    }
    for (CUmemGenericAllocationHandle handle : handles) {
      d.release(handle);
    }
    if (reserved) {
      d.address_free(base, segment_size * handles.size());
    }
  }
};

std::shared_ptr<void> open_expandable_segment(const std::string& handle) {
  ShareHeader header;
  TORCH_CHECK(handle.size() >= 2 + sizeof(header), "a CUDA IPC handle of type 'e' too short (",
              handle.size(), " bytes)");
  std::memcpy(&header, handle.data() + 2, sizeof(header));
  TORCH_CHECK(header.num_handles > 0 && header.segment_size > 0 &&
                  handle.size() == 2 + sizeof(header) + header.num_handles * sizeof(int),
              "a CUDA IPC handle of type 'e' whose length does not match its ",
              header.num_handles, " descriptors");
  auto segment = std::make_shared<ImportedSegment>();
  segment->device = c10::cuda::current_device();
  segment->segment_size = header.segment_size;
  long pidfd = syscall(SYS_pidfd_open, header.pid, 0);
  TORCH_CHECK(pidfd >= 0, "gpumem cannot open the CUDA memory process ", header.pid,
              " shared: pidfd_open: ", std::strerror(errno),
              " (the receiver must be allowed to take descriptors from the sender: same user, "
              "or CAP_SYS_PTRACE)");
  const Driver& d = driver();
  const char* fds = handle.data() + 2 + sizeof(header);
  for (uint64_t i = 0; i < header.num_handles; ++i) {
    int remote = 0;
    std::memcpy(&remote, fds + i * sizeof(int), sizeof(int));
    long local = syscall(SYS_pidfd_getfd, pidfd, remote, 0);
    if (local < 0) {
      int error = errno;
      close(static_cast<int>(pidfd));
      TORCH_CHECK(false, "gpumem cannot take descriptor ", remote, " of process ", header.pid,
                  ": pidfd_getfd: ", std::strerror(error),
                  " (has the sender freed the tensor, or exited?)");
    }
    CUmemGenericAllocationHandle imported = 0;
    CUresult result = d.import_handle(
        &imported, reinterpret_cast<void*>(static_cast<uintptr_t>(local)),
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    close(static_cast<int>(local));
    if (result != CUDA_SUCCESS) {
      close(static_cast<int>(pidfd));
      check(result, "cuMemImportFromShareableHandle");
    }
    segment->handles.push_back(imported);
  }
  close(static_cast<int>(pidfd));
  uint64_t total = header.segment_size * header.num_handles;
  check(d.reserve(&segment->base, total, 0, 0, 0), "cuMemAddressReserve");
  segment->reserved = true;
  for (CUmemGenericAllocationHandle imported : segment->handles) {
    check(d.map(segment->base + segment->mapped * header.segment_size, header.segment_size, 0,
                imported, 0),
          "cuMemMap");
    segment->mapped += 1;
  }
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = segment->device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  check(d.set_access(segment->base, total, &access, 1), "cuMemSetAccess");
  void* base = reinterpret_cast<void*>(segment->base);
  return std::shared_ptr<void>(segment, base);
}

std::shared_ptr<void> open_cuda_malloc(const std::string& handle) {
  TORCH_CHECK(handle.size() == 2 + CUDA_IPC_HANDLE_SIZE, "a CUDA IPC handle of type 'c' of ",
              handle.size(), " bytes");
  cudaIpcMemHandle_t ipc;
  std::memcpy(&ipc, handle.data() + 2, CUDA_IPC_HANDLE_SIZE);
  void* ptr = nullptr;
  C10_CUDA_CHECK(cudaIpcOpenMemHandle(&ptr, ipc, cudaIpcMemLazyEnablePeerAccess));
  c10::DeviceIndex device = c10::cuda::current_device();
  return std::shared_ptr<void>(ptr, [device](void* opened) {
    c10::cuda::CUDAGuard guard(device);
    (void)cudaIpcCloseMemHandle(opened);
  });
}

// The receiver takes the sender's descriptors with pidfd_getfd, which Yama's ptrace_scope 1 (the
// default of many distributions) allows only to ancestors: a worker receiving from the process
// that started it would be refused. So, once a process shares, it lets processes of its own
// user do that (PR_SET_PTRACER_ANY), which PyTorch's expandable segments need as much.
void allow_descriptor_takers() {
  static const bool done = [] {
    char scope = '0';
    int file = open("/proc/sys/kernel/yama/ptrace_scope", O_RDONLY);
    if (file >= 0) {
      if (read(file, &scope, 1) != 1) {
        scope = '0';
      }
      close(file);
    }
    if (scope == '1') {
      (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    }
    return true;
  }();
  (void)done;
}

// Handles opened here, so that a storage received twice maps once (as PyTorch does). Leaked:
// tensors may be freed by static destructors at exit.
std::mutex& opened_mutex = *new std::mutex();
auto& opened = *new std::unordered_map<std::string, std::weak_ptr<void>>();

} // namespace

cca::ShareableHandle GpumemAllocator::shareIpcHandle(void* ptr) {
  size_t size = pools_.live_size(ptr);
  if (size == 0) {
    int64_t bytes = api.allocation_size(ptr);
    TORCH_CHECK(bytes >= 0, "gpumem cannot share ", ptr,
                " with another process: it is not the start of a live allocation of gpumem");
    size = static_cast<size_t>(bytes);
  }
  std::string text = api.take(api.export_chunks(c10::cuda::current_device(), ptr, size));
  std::vector<Chunk> chunks = parse_chunks(text);
  TORCH_CHECK(!chunks.empty(), "gpumem cannot share this tensor with another process: ",
              api.error_or("its memory could not be exported"));
  for (const Chunk& chunk : chunks) {
    TORCH_CHECK(chunk.bytes == chunks.front().bytes,
                "gpumem cannot share this tensor with another process: its ", size,
                " bytes lie on chunks of different sizes (", chunk_sizes(chunks),
                "), which PyTorch's CUDA IPC handle cannot describe");
  }
  allow_descriptor_takers();
  ShareHeader header;
  header.pid = static_cast<int32_t>(getpid());
  header.segment_size = chunks.front().bytes;
  header.num_handles = chunks.size();
  std::string handle;
  handle.push_back(kHandleVersion);
  handle.push_back(kExpandableSegment);
  handle.append(reinterpret_cast<const char*>(&header), sizeof(header));
  for (const Chunk& chunk : chunks) {
    handle.append(reinterpret_cast<const char*>(&chunk.fd), sizeof(int));
  }
  auto offset = static_cast<ptrdiff_t>(reinterpret_cast<uintptr_t>(ptr) - chunks.front().addr);
  return cca::ShareableHandle{offset, handle};
}

std::shared_ptr<void> GpumemAllocator::getIpcDevPtr(std::string handle) {
  std::lock_guard<std::mutex> lock(opened_mutex);
  auto known = opened.find(handle);
  if (known != opened.end()) {
    if (std::shared_ptr<void> live = known->second.lock()) {
      return live;
    }
  }
  TORCH_CHECK(handle.size() >= 2, "an empty CUDA IPC handle");
  TORCH_CHECK(handle[0] >= 1 && handle[0] <= kHandleVersion,
              "a CUDA IPC handle of version ", static_cast<int>(handle[0]),
              ", which this layer (built for handle version ", static_cast<int>(kHandleVersion),
              ") does not know");
  std::shared_ptr<void> ptr;
  if (handle[1] == kCudaMalloc) {
    ptr = open_cuda_malloc(handle);
  } else if (handle[1] == kExpandableSegment) {
    ptr = open_expandable_segment(handle);
  } else {
    TORCH_CHECK(false, "a CUDA IPC handle of unknown type '", handle[1], "'");
  }
  opened[handle] = ptr;
  return ptr;
}

} // namespace gpumem_torch
