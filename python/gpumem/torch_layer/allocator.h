// gpumem as PyTorch's CUDA allocator: an implementation of c10's CUDAAllocator interface (the
// one PyTorch's own caching allocator implements) over the gpumem library, so that every
// torch.cuda memory call — statistics, empty_cache, the memory fraction, snapshots and their
// history, CUDA graph pools, MemPool, out-of-memory errors — is answered by gpumem.
#pragma once

#include "gpumem_api.h"
#include "history.h"
#include "private_pools.h"

#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <vector>

namespace gpumem_torch {

namespace cca = c10::cuda::CUDACachingAllocator;

// The tensor deleter of memory from gpumem's pools.
void delete_gpumem_block(void* ptr);

class GpumemAllocator final : public cca::CUDAAllocator {
 public:
  // The allocator everything in this library reports to (one per process).
  static GpumemAllocator* instance;

  // c10::Allocator and DeviceAllocator.
  c10::DataPtr allocate(size_t size) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;
  bool initialized() override;
  void emptyCache(c10::MempoolId_t mempool_id) override;
  cda::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;

  // CUDAAllocator.
  void* raw_alloc(size_t nbytes) override;
  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override;
  void raw_delete(void* ptr) override;
  void init(int device_count) override;
  double getMemoryFraction(c10::DeviceIndex device) override;
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override;
  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(
      c10::DeviceIndex device) override;
  void enable(bool value) override;
  bool isEnabled() const override;
  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override;
  void* getBaseAllocation(void* ptr, size_t* size) override;
  using cca::CUDAAllocator::recordStream;
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override;
  cca::SnapshotInfo snapshot(c10::MempoolId_t mempool_id, bool include_traces) override;
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override;
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                          std::shared_ptr<cca::CUDAAllocator> allocator) override;
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                   bool use_on_oom) override;
  void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                const std::unordered_set<void*>& expected) override;
  cca::ShareableHandle shareIpcHandle(void* ptr) override;
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override;
  bool isHistoryEnabled() override;
  void recordHistory(bool enabled, cda::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, cda::RecordContext when,
                     bool clearHistory, const std::vector<std::string>& skip_actions) override;
  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override;
  void attachAllocatorTraceTracker(cda::AllocatorTraceTracker tracker) override;
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override;
  cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice,
                          size_t count, cudaStream_t stream, bool p2p_enabled) override;
  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                          c10::MempoolId_t id) override;
  cca::CheckpointDelta setCheckpointPoolState(
      c10::DeviceIndex device, std::shared_ptr<cca::AllocatorState> pps) override;
  std::string name() override;

  // The deleters' work.
  void free_gpumem_block(void* ptr);
  void free_pool_block(void* ptr);

 private:
  static constexpr int kMaxDevices = 64;
  struct Route {
    c10::DeviceIndex device;
    c10::MempoolId_t pool;
    std::function<bool(cudaStream_t)> filter;
  };

  // Memory for `size` bytes on `stream`: from the private pool a running capture or
  // use_mem_pool routes it to, else from gpumem. Raises OutOfMemoryError when refused.
  c10::DataPtr malloc(size_t size, c10::DeviceIndex device, cudaStream_t stream);
  bool routed_pool(c10::DeviceIndex device, cudaStream_t stream, c10::MempoolId_t& pool);
  // What every allocation handed out goes through: the history, the profiler, the DataPtr.
  c10::DataPtr handed_out(void* ptr, size_t size, c10::DeviceIndex device, cudaStream_t stream,
                          c10::MempoolId_t pool, c10::DeleterFnPtr deleter);
  [[noreturn]] void out_of_memory(c10::DeviceIndex device, size_t size, cudaStream_t stream,
                                  const std::string& reason);
  void report_to_profiler(void* ptr, int64_t size, c10::DeviceIndex device);
  void append_gpumem_segments(c10::DeviceIndex device, cca::SnapshotInfo& info);
  DeviceStatsC read_stats(c10::DeviceIndex device);

  // Refusals raised as OutOfMemoryError, per device (gpumem's own count leaves out requests
  // that could never fit, which PyTorch counts).
  std::atomic<int64_t> ooms_[kMaxDevices] = {};
  std::atomic<bool> initialized_{false};
  std::atomic<bool> enabled_{true};
  std::atomic<int> device_count_{0};
  std::atomic<int> routes_active_{0};
  std::mutex routes_mutex_;
  std::vector<Route> routes_;
  std::mutex observers_mutex_;
  std::vector<cca::OutOfMemoryObserver> observers_;
  std::mutex baseline_mutex_;
  std::vector<cda::DeviceStats> accumulated_baseline_;
  PrivatePools pools_;
  History history_;
};

} // namespace gpumem_torch
