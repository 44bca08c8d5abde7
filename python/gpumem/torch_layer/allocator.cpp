// GpumemAllocator's calls (allocator.h); the statistics, snapshot and install live in
// stats_snapshot.cpp and install.cpp.
#include "allocator.h"

#include "gpumem_api.h"

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <cstdio>

namespace gpumem_torch {

GpumemAllocator* GpumemAllocator::instance = nullptr;

void delete_gpumem_block(void* ptr) {
  if (ptr != nullptr) {
    GpumemAllocator::instance->free_gpumem_block(ptr);
  }
}

void delete_pool_block(void* ptr) {
  if (ptr != nullptr) {
    GpumemAllocator::instance->free_pool_block(ptr);
  }
}

namespace {
struct Current {
  c10::DeviceIndex device = 0;
  cudaStream_t stream = nullptr;
};

Current current() {
  Current now;
  C10_CUDA_CHECK(c10::cuda::GetDevice(&now.device));
  now.stream = c10::cuda::getCurrentCUDAStream(now.device).stream();
  return now;
}
} // namespace

c10::DataPtr GpumemAllocator::allocate(size_t size) {
  Current now = current();
  return malloc(size, now.device, now.stream);
}

c10::DeleterFnPtr GpumemAllocator::raw_deleter() const {
  return &delete_gpumem_block;
}

void GpumemAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
}

bool GpumemAllocator::routed_pool(c10::DeviceIndex device, cudaStream_t stream,
                                  c10::MempoolId_t& pool) {
  std::lock_guard<std::mutex> lock(routes_mutex_);
  // The latest route first, as nested use_mem_pool blocks expect.
  for (auto it = routes_.rbegin(); it != routes_.rend(); ++it) {
    if (it->device == device && it->filter(stream)) {
      pool = it->pool;
      return true;
    }
  }
  return false;
}

c10::DataPtr GpumemAllocator::malloc(size_t size, c10::DeviceIndex device,
                                     cudaStream_t stream) {
  if (size == 0) {
    return {nullptr, nullptr, &delete_gpumem_block, c10::Device(c10::DeviceType::CUDA, device)};
  }
  c10::MempoolId_t pool{0, 0};
  if (routes_active_.load(std::memory_order_relaxed) > 0 && routed_pool(device, stream, pool)) {
    std::string why;
    void* ptr = pools_.malloc(device, pool, size, stream, why);
    if (ptr == nullptr) {
      out_of_memory(device, size, stream, why);
    }
    return handed_out(ptr, size, device, stream, pool, &delete_pool_block);
  }
  void* ptr = api.alloc_routed(static_cast<ssize_t>(size), device, stream);
  if (ptr == nullptr) {
    std::string reason = api.error_or("the allocation was refused");
    // Graph pools nobody uses any more may hold what is missing.
    if (pools_.release_free_segments(nullptr) > 0) {
      ptr = api.alloc_routed(static_cast<ssize_t>(size), device, stream);
    }
    if (ptr == nullptr) {
      out_of_memory(device, size, stream, reason);
    }
  }
  return handed_out(ptr, size, device, stream, pool, &delete_gpumem_block);
}

c10::DataPtr GpumemAllocator::handed_out(void* ptr, size_t size, c10::DeviceIndex device,
                                         cudaStream_t stream, c10::MempoolId_t pool,
                                         c10::DeleterFnPtr deleter) {
  if (history_.active()) {
    history_.allocated(device, ptr, size, stream, pool);
  }
  report_to_profiler(ptr, static_cast<int64_t>(size), device);
  return {ptr, ptr, deleter, c10::Device(c10::DeviceType::CUDA, device)};
}

void GpumemAllocator::out_of_memory(c10::DeviceIndex device, size_t size, cudaStream_t stream,
                                    const std::string& reason) {
  if (device >= 0 && device < kMaxDevices) {
    ooms_[device].fetch_add(1, std::memory_order_relaxed);
  }
  size_t device_free = 0;
  size_t device_total = 0;
  if (cudaMemGetInfo(&device_free, &device_total) != cudaSuccess) {
    (void)cudaGetLastError();
  }
  cda::DeviceStats stats = getDeviceStats(device);
  auto allocated = static_cast<size_t>(stats.allocated_bytes[0].current);
  if (history_.active()) {
    history_.out_of_memory(device, size, device_free, stream);
  }
  {
    std::lock_guard<std::mutex> lock(observers_mutex_);
    for (const auto& observer : observers_) {
      observer(device, allocated, device_total, device_free);
    }
  }
  c10::reportOutOfMemoryToProfiler(static_cast<int64_t>(size), allocated,
                                   static_cast<size_t>(stats.reserved_bytes[0].current),
                                   c10::Device(c10::DeviceType::CUDA, device));
  std::string message = api.take(api.oom_message(device, static_cast<ssize_t>(size)));
  if (message.empty()) {
    message = "CUDA out of memory. Tried to allocate " + std::to_string(size) +
        " bytes. gpumem: " + reason;
  }
  TORCH_CHECK_WITH(OutOfMemoryError, false, message);
}

void GpumemAllocator::report_to_profiler(void* ptr, int64_t size, c10::DeviceIndex device) {
  if (!c10::memoryProfilingEnabled()) {
    return;
  }
  cda::DeviceStats stats = getDeviceStats(device);
  c10::reportMemoryUsageToProfiler(ptr, size,
                                   static_cast<size_t>(stats.allocated_bytes[0].current),
                                   static_cast<size_t>(stats.reserved_bytes[0].current),
                                   c10::Device(c10::DeviceType::CUDA, device));
}

void GpumemAllocator::free_gpumem_block(void* ptr) {
  bool profiling = c10::memoryProfilingEnabled();
  if (history_.active() || profiling) {
    int64_t size = std::max<int64_t>(0, api.allocation_size(ptr));
    c10::DeviceIndex device = 0;
    (void)c10::cuda::GetDevice(&device);
    if (history_.active()) {
      history_.freed(device, ptr, static_cast<size_t>(size), nullptr, {0, 0});
    }
    api.free_ptr(ptr);
    if (profiling) {
      report_to_profiler(ptr, -size, device);
    }
    return;
  }
  api.free_ptr(ptr);
}

void GpumemAllocator::free_pool_block(void* ptr) {
  if (history_.active()) {
    c10::DeviceIndex device = 0;
    (void)c10::cuda::GetDevice(&device);
    history_.freed(device, ptr, 0, nullptr, {0, 0});
  }
  if (!pools_.free(ptr)) {
    char address[32];
    std::snprintf(address, sizeof(address), "%p", ptr);
    TORCH_WARN(std::string("gpumem: ") + address +
               " is not a live block of a private pool (freed twice?)");
  }
}

bool GpumemAllocator::initialized() {
  return initialized_.load();
}

void GpumemAllocator::emptyCache(c10::MempoolId_t mempool_id) {
  if (mempool_id.first != 0 || mempool_id.second != 0) {
    pools_.release_free_segments(&mempool_id);
    return;
  }
  if (routes_active_.load() == 0) {
    pools_.release_free_segments(nullptr);
  }
  if (api.empty_cache() < 0) {
    TORCH_WARN("gpumem could not empty its cache: ", api.error_or("unknown error"));
  }
}

void* GpumemAllocator::raw_alloc(size_t nbytes) {
  Current now = current();
  return raw_alloc_with_stream(nbytes, now.stream);
}

void* GpumemAllocator::raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) {
  c10::DeviceIndex device = 0;
  C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
  // The caller frees with raw_delete: keep the pointer, drop the DataPtr's ownership.
  c10::DataPtr data = malloc(nbytes, device, stream);
  return data.release_context();
}

void GpumemAllocator::raw_delete(void* ptr) {
  if (ptr == nullptr) {
    return;
  }
  if (!pools_.free(ptr)) {
    free_gpumem_block(ptr);
  }
}

void GpumemAllocator::init(int device_count) {
  device_count_.store(device_count);
  // PYTORCH_CUDA_ALLOC_CONF's per_process_memory_fraction becomes gpumem's budget.
  double fraction = cca::CUDAAllocatorConfig::per_process_memory_fraction();
  if (fraction > 0.0 && fraction < 1.0) {
    for (int device = 0; device < device_count; ++device) {
      if (api.set_memory_fraction(device, fraction) != 0) {
        TORCH_WARN("gpumem ignores per_process_memory_fraction: ",
                   api.error_or("unknown error"));
      }
    }
  }
  initialized_.store(true);
}

double GpumemAllocator::getMemoryFraction(c10::DeviceIndex device) {
  double fraction = api.memory_fraction(device);
  TORCH_CHECK(fraction >= 0.0, api.error_or("gpumem could not read the memory fraction"));
  return fraction;
}

void GpumemAllocator::setMemoryFraction(double fraction, c10::DeviceIndex device) {
  TORCH_CHECK(api.set_memory_fraction(device, fraction) == 0,
              api.error_or("gpumem could not set the memory fraction"));
}

std::vector<cca::StreamSegmentSize> GpumemAllocator::getExpandableSegmentSizes(
    c10::DeviceIndex /*device*/) {
  return {};
}

void GpumemAllocator::enable(bool value) {
  enabled_.store(value);
}

bool GpumemAllocator::isEnabled() const {
  return enabled_.load();
}

void GpumemAllocator::cacheInfo(c10::DeviceIndex device, size_t* largestBlock) {
  // What a workspace (cuDNN's benchmark sizes its own by this) could get now: the largest
  // cached block, or the device's free memory, which gpumem maps on a miss.
  int64_t cached = api.largest_free_block(device);
  size_t free = 0;
  size_t total = 0;
  c10::cuda::CUDAGuard guard(device);
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    (void)cudaGetLastError();
  }
  *largestBlock = std::max(free, cached < 0 ? size_t(0) : static_cast<size_t>(cached));
}

void* GpumemAllocator::getBaseAllocation(void* ptr, size_t* size) {
  int64_t bytes = api.allocation_size(ptr);
  if (size != nullptr && bytes >= 0) {
    *size = static_cast<size_t>(bytes);
  }
  return ptr;
}

void GpumemAllocator::recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) {
  if (ptr.get() == nullptr) {
    return;
  }
  if (ptr.get_deleter() == &delete_pool_block) {
    pools_.record_stream(ptr.get(), stream.stream());
  } else if (ptr.get_deleter() == &delete_gpumem_block) {
    TORCH_CHECK(api.record_stream(ptr.get(), stream.stream()) == 0,
                api.error_or("gpumem could not record the stream"));
  }
}

void GpumemAllocator::beginAllocateToPool(c10::DeviceIndex device,
                                          c10::MempoolId_t mempool_id,
                                          std::function<bool(cudaStream_t)> filter) {
  pools_.incref(device, mempool_id, nullptr);
  std::lock_guard<std::mutex> lock(routes_mutex_);
  for (const Route& route : routes_) {
    TORCH_CHECK(route.device != device || route.pool != mempool_id,
                "beginAllocateToPool: already allocating to this pool");
  }
  routes_.push_back(Route{device, mempool_id, std::move(filter)});
  routes_active_.fetch_add(1);
}

void GpumemAllocator::endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  std::lock_guard<std::mutex> lock(routes_mutex_);
  for (auto it = routes_.begin(); it != routes_.end(); ++it) {
    if (it->device == device && it->pool == mempool_id) {
      routes_.erase(it);
      routes_active_.fetch_sub(1);
      return;
    }
  }
}

void GpumemAllocator::releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  pools_.release(device, mempool_id, routes_active_.load() > 0);
}

int GpumemAllocator::getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  return pools_.use_count(device, mempool_id);
}

void GpumemAllocator::createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                         std::shared_ptr<cca::CUDAAllocator> allocator) {
  pools_.incref(device, mempool_id, std::move(allocator));
}

void GpumemAllocator::setUseOnOOM(c10::DeviceIndex, c10::MempoolId_t, bool) {
  // A MemPool's memory as a fallback when gpumem refuses: not offered; gpumem's own refusal
  // already releases every cache it has (docs/pytorch.md).
}

void GpumemAllocator::setNoSplit(c10::DeviceIndex, c10::MempoolId_t) {
  // Every block of a private pool may be split: gpumem maps whole pages, nothing to keep whole.
}

bool GpumemAllocator::checkPoolLiveAllocations(c10::DeviceIndex device,
                                               c10::MempoolId_t mempool_id,
                                               const std::unordered_set<void*>& expected) {
  return pools_.live_blocks_are(device, mempool_id, expected);
}

bool GpumemAllocator::isHistoryEnabled() {
  return history_.recording();
}

void GpumemAllocator::recordHistory(bool enabled, cda::CreateContextFn context_recorder,
                                    size_t alloc_trace_max_entries, cda::RecordContext when,
                                    bool clearHistory,
                                    const std::vector<std::string>& skip_actions) {
  history_.configure(enabled, context_recorder, alloc_trace_max_entries, when, clearHistory,
                     skip_actions);
}

void GpumemAllocator::attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) {
  std::lock_guard<std::mutex> lock(observers_mutex_);
  observers_.push_back(std::move(observer));
}

void GpumemAllocator::attachAllocatorTraceTracker(cda::AllocatorTraceTracker tracker) {
  history_.attach(std::move(tracker));
}

void GpumemAllocator::enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) {
  c10::cuda::CUDAGuard guard(dev);
  cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();
  } else {
    C10_CUDA_CHECK(err);
  }
}

cudaError_t GpumemAllocator::memcpyAsync(void* dst, int dstDevice, const void* src,
                                         int srcDevice, size_t count, cudaStream_t stream,
                                         bool p2p_enabled) {
  // Memory mapped through the virtual-memory API crosses devices only through the peer copy
  // unless peer access is on.
  if (p2p_enabled || dstDevice == srcDevice) {
    return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
  }
  return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
}

std::shared_ptr<cca::AllocatorState> GpumemAllocator::getCheckpointState(
    c10::DeviceIndex device, c10::MempoolId_t id) {
  return pools_.checkpoint(device, id);
}

cca::CheckpointDelta GpumemAllocator::setCheckpointPoolState(
    c10::DeviceIndex device, std::shared_ptr<cca::AllocatorState> pps) {
  auto* state = dynamic_cast<PoolCheckpoint*>(pps.get());
  TORCH_CHECK(state != nullptr, "gpumem: the checkpoint is not one of gpumem's");
  return pools_.restore(device, *state);
}

std::string GpumemAllocator::name() {
  return "gpumem";
}

} // namespace gpumem_torch
