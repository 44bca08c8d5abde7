// What `torch.cuda.memory._record_memory_history` asks of an allocator: the trace of alloc and
// free events (with Python and C++ stacks gathered by PyTorch's recorder), the stack each live
// block was allocated at, and the trace trackers PyTorch attaches. Costs one relaxed load per
// allocation while nothing records and no tracker is attached.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace gpumem_torch {

namespace cda = c10::CachingDeviceAllocator;
using Context = std::shared_ptr<c10::GatheredContext>;

class History {
 public:
  void configure(bool enabled, cda::CreateContextFn recorder, size_t max_entries,
                 cda::RecordContext when, bool clear, const std::vector<std::string>& skip);
  void attach(cda::AllocatorTraceTracker tracker);

  // Whether anything needs to hear of allocations.
  bool active() const {
    return active_.load(std::memory_order_relaxed);
  }
  bool recording() const {
    return recording_.load(std::memory_order_relaxed);
  }

  void allocated(c10::DeviceIndex device, void* ptr, size_t size, cudaStream_t stream,
                 c10::MempoolId_t pool);
  void freed(c10::DeviceIndex device, void* ptr, size_t size, cudaStream_t stream,
             c10::MempoolId_t pool);
  void out_of_memory(c10::DeviceIndex device, size_t size, size_t device_free,
                     cudaStream_t stream);
  void snapshot_taken(c10::DeviceIndex device);

  Context context_of(uintptr_t address);
  // The recorded trace of each of `devices` devices, oldest first.
  std::vector<std::vector<cda::TraceEntry>> traces(size_t devices);

 private:
  Context gather(cda::RecordContext level);
  void record(cda::TraceEntry::Action action, c10::DeviceIndex device, uintptr_t address,
              size_t size, cudaStream_t stream, c10::MempoolId_t pool, Context context);

  std::atomic<bool> active_{false};
  std::atomic<bool> recording_{false};
  std::mutex mutex_;
  cda::CreateContextFn recorder_ = nullptr;
  cda::RecordContext when_ = cda::RecordContext::NEVER;
  size_t max_entries_ = 1;
  std::vector<bool> skipped_; // by action
  // A ring per device: entries and where the next goes once it is full.
  std::vector<std::vector<cda::TraceEntry>> traces_;
  std::vector<size_t> next_;
  std::unordered_map<uintptr_t, Context> contexts_;
  std::vector<cda::AllocatorTraceTracker> trackers_;
};

} // namespace gpumem_torch
