// The allocation trace and stacks of _record_memory_history (history.h).
#include "history.h"

#include <c10/util/ApproximateClock.h>

namespace gpumem_torch {

void History::configure(bool enabled, cda::CreateContextFn recorder, size_t max_entries,
                        cda::RecordContext when, bool clear,
                        const std::vector<std::string>& skip) {
  std::lock_guard<std::mutex> lock(mutex_);
  recorder_ = enabled ? recorder : nullptr;
  when_ = enabled ? when : cda::RecordContext::NEVER;
  max_entries_ = std::max<size_t>(1, max_entries);
  skipped_.assign(16, false);
  for (const std::string& name : skip) {
    skipped_[static_cast<size_t>(cda::parseTraceEntryAction(name))] = true;
  }
  if (!enabled || clear) {
    traces_.clear();
    next_.clear();
  }
  if (!enabled) {
    contexts_.clear();
  }
  recording_.store(enabled, std::memory_order_relaxed);
  active_.store(enabled || !trackers_.empty(), std::memory_order_relaxed);
}

void History::attach(cda::AllocatorTraceTracker tracker) {
  std::lock_guard<std::mutex> lock(mutex_);
  trackers_.push_back(std::move(tracker));
  active_.store(true, std::memory_order_relaxed);
}

Context History::gather(cda::RecordContext level) {
  cda::CreateContextFn recorder = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (when_ < level) {
      return nullptr;
    }
    recorder = recorder_;
  }
  // Outside the lock: the recorder takes the GIL, which another thread may hold while it
  // waits for this lock.
  return recorder == nullptr ? nullptr : recorder();
}

void History::record(cda::TraceEntry::Action action, c10::DeviceIndex device,
                     uintptr_t address, size_t size, cudaStream_t stream,
                     c10::MempoolId_t pool, Context context) {
  // Called with mutex_ held.
  cda::TraceEntry entry(action, device, address, size, stream, pool,
                        c10::getApproximateTime(), std::move(context));
  for (const auto& tracker : trackers_) {
    tracker(entry);
  }
  if (!recording_.load(std::memory_order_relaxed) ||
      skipped_[static_cast<size_t>(action)]) {
    return;
  }
  auto index = static_cast<size_t>(device);
  if (traces_.size() <= index) {
    traces_.resize(index + 1);
    next_.resize(index + 1, 0);
  }
  auto& ring = traces_[index];
  if (ring.size() < max_entries_) {
    ring.push_back(std::move(entry));
  } else {
    ring[next_[index]] = std::move(entry);
    next_[index] = (next_[index] + 1) % max_entries_;
  }
}

void History::allocated(c10::DeviceIndex device, void* ptr, size_t size, cudaStream_t stream,
                        c10::MempoolId_t pool) {
  Context context = gather(cda::RecordContext::STATE);
  std::lock_guard<std::mutex> lock(mutex_);
  auto address = reinterpret_cast<uintptr_t>(ptr);
  if (context) {
    contexts_[address] = context;
  }
  record(cda::TraceEntry::ALLOC, device, address, size, stream, pool,
         when_ >= cda::RecordContext::ALLOC ? context : nullptr);
}

void History::freed(c10::DeviceIndex device, void* ptr, size_t size, cudaStream_t stream,
                    c10::MempoolId_t pool) {
  Context context = gather(cda::RecordContext::ALL);
  std::lock_guard<std::mutex> lock(mutex_);
  auto address = reinterpret_cast<uintptr_t>(ptr);
  auto allocated_at = contexts_.find(address);
  if (!context && allocated_at != contexts_.end()) {
    context = allocated_at->second;
  }
  if (allocated_at != contexts_.end()) {
    contexts_.erase(allocated_at);
  }
  // gpumem frees at once (a block used on other streams waits inside gpumem): both events.
  record(cda::TraceEntry::FREE_REQUESTED, device, address, size, stream, pool, context);
  record(cda::TraceEntry::FREE_COMPLETED, device, address, size, stream, pool, context);
}

void History::out_of_memory(c10::DeviceIndex device, size_t size, size_t device_free,
                            cudaStream_t stream) {
  Context context = gather(cda::RecordContext::STATE);
  std::lock_guard<std::mutex> lock(mutex_);
  record(cda::TraceEntry::OOM, device, device_free, size, stream, {0, 0}, context);
}

void History::snapshot_taken(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (recording_.load(std::memory_order_relaxed)) {
    record(cda::TraceEntry::SNAPSHOT, device, 0, 0, nullptr, {0, 0}, nullptr);
  }
}

Context History::context_of(uintptr_t address) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = contexts_.find(address);
  return found == contexts_.end() ? nullptr : found->second;
}

std::vector<std::vector<cda::TraceEntry>> History::traces(size_t devices) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::vector<cda::TraceEntry>> out(devices);
  for (size_t device = 0; device < devices && device < traces_.size(); ++device) {
    const auto& ring = traces_[device];
    size_t start = ring.size() < max_entries_ ? 0 : next_[device];
    for (size_t i = 0; i < ring.size(); ++i) {
      out[device].push_back(ring[(start + i) % ring.size()]);
    }
  }
  return out;
}

} // namespace gpumem_torch
