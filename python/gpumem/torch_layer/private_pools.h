// PyTorch's private memory pools over gpumem: the pools CUDA graphs capture into and
// `torch.cuda.MemPool`s. A pool takes whole segments (from gpumem, or from the MemPool's own
// allocator) and cuts its blocks from them itself, so that it can do what PyTorch's graph code
// asks of a pool and gpumem's pools do not offer: list exactly which blocks are live, and put
// back a checkpointed layout block for block (torch.compile's CUDA-graph trees).
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace gpumem_torch {

using c10::MempoolId_t;
namespace cca = c10::cuda::CUDACachingAllocator;

// The tensor deleter of blocks cut from a private pool.
void delete_pool_block(void* ptr);

struct BlockState {
  size_t size = 0;
  size_t requested = 0;
  bool allocated = false;
};

struct Segment {
  uintptr_t base = 0;
  size_t size = 0;
  cudaStream_t stream = nullptr;
  std::map<uintptr_t, BlockState> blocks; // every byte of the segment, by address
};

// A pool's layout at one moment (getCheckpointState).
struct PoolCheckpoint : cca::AllocatorState {
  c10::DeviceIndex device = 0;
  MempoolId_t pool{0, 0};
  std::map<uintptr_t, std::map<uintptr_t, BlockState>> segments; // by segment base
};

struct Pool {
  c10::DeviceIndex device = 0;
  MempoolId_t id{0, 0};
  int use_count = 0;
  // Where segments come from: a MemPool's own allocator, or gpumem when null.
  std::shared_ptr<cca::CUDAAllocator> source;
  std::map<uintptr_t, Segment> segments; // by base
  // Free blocks by (stream, size, address): best fit on the same stream.
  std::set<std::tuple<cudaStream_t, size_t, uintptr_t>> free_blocks;
  // Blocks freed while other streams may still use them: (address, events to pass).
  std::vector<std::pair<uintptr_t, std::vector<cudaEvent_t>>> waiting;
  std::unordered_map<uintptr_t, std::vector<cudaStream_t>> used_on;
};

class PrivatePools {
 public:
  // Pool bookkeeping, as PyTorch's allocator does it: each creates the pool when missing.
  void incref(c10::DeviceIndex device, MempoolId_t id,
              std::shared_ptr<cca::CUDAAllocator> source);
  // One user fewer; with none left, the pool's free segments go back (after the device has
  // finished with them) unless a capture is running.
  void release(c10::DeviceIndex device, MempoolId_t id, bool capture_underway);
  int use_count(c10::DeviceIndex device, MempoolId_t id);

  // A block of `size` bytes on `stream`; null (with `why`) when no segment could be had.
  void* malloc(c10::DeviceIndex device, MempoolId_t id, size_t size, cudaStream_t stream,
               std::string& why);
  // Whether `ptr` was a live block of some pool (and is now free).
  bool free(void* ptr);
  // The size of the live block at `ptr`; 0 when it is none of ours.
  size_t live_size(void* ptr);
  // Other streams the live block at `ptr` is used on; false when it is none of ours.
  bool record_stream(void* ptr, cudaStream_t stream);

  bool live_blocks_are(c10::DeviceIndex device, MempoolId_t id,
                       const std::unordered_set<void*>& expected);
  std::shared_ptr<PoolCheckpoint> checkpoint(c10::DeviceIndex device, MempoolId_t id);
  cca::CheckpointDelta restore(c10::DeviceIndex device, const PoolCheckpoint& state);

  // Gives back the free segments of pools nobody uses (or of `only`); bytes released.
  size_t release_free_segments(const MempoolId_t* only);

  // Every pool segment of `device` (or of pool `only`), for the memory snapshot.
  std::vector<cca::SegmentInfo> segment_infos(c10::DeviceIndex device, const MempoolId_t* only);
  // Whether `address` is the base of a pool segment (which gpumem lists as one allocation).
  bool is_segment_base(uintptr_t address);

 private:
  Pool* find(c10::DeviceIndex device, MempoolId_t id);
  void give_free(Pool& pool, Segment& segment, uintptr_t address);
  void* cut(Pool& pool, size_t size, cudaStream_t stream, std::string& why);
  void settle_waiting(Pool& pool);
  size_t release_segments_of(Pool& pool);

  std::mutex mutex_;
  std::map<std::pair<c10::DeviceIndex, MempoolId_t>, Pool> pools_;
  // Live block -> its pool.
  std::unordered_map<uintptr_t, Pool*> live_;
  // Segment base -> its pool.
  std::unordered_map<uintptr_t, Pool*> segment_of_;
};

} // namespace gpumem_torch
