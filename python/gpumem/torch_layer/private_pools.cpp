// Private pools: segments taken whole, blocks cut and merged here (private_pools.h).
#include "private_pools.h"

#include "gpumem_api.h"

#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <algorithm>

namespace gpumem_torch {

namespace {
// PyTorch's block alignment, and the granularity gpumem maps in: a pool asks for segments of
// whole pages, small blocks sharing one page-sized segment.
constexpr size_t kAlignment = 512;
constexpr size_t kSegmentGranularity = size_t(2) << 20;

size_t round_up(size_t size, size_t to) {
  return (size + to - 1) / to * to;
}
} // namespace

Pool* PrivatePools::find(c10::DeviceIndex device, MempoolId_t id) {
  auto it = pools_.find({device, id});
  return it == pools_.end() ? nullptr : &it->second;
}

void PrivatePools::incref(c10::DeviceIndex device, MempoolId_t id,
                          std::shared_ptr<cca::CUDAAllocator> source) {
  std::lock_guard<std::mutex> lock(mutex_);
  Pool& pool = pools_[{device, id}];
  if (pool.use_count == 0 && pool.segments.empty()) {
    pool.device = device;
    pool.id = id;
    pool.source = std::move(source);
  }
  pool.use_count += 1;
}

int PrivatePools::use_count(c10::DeviceIndex device, MempoolId_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  Pool* pool = find(device, id);
  return pool == nullptr ? 0 : pool->use_count;
}

void PrivatePools::release(c10::DeviceIndex device, MempoolId_t id, bool capture_underway) {
  std::lock_guard<std::mutex> lock(mutex_);
  Pool* pool = find(device, id);
  if (pool == nullptr || pool->use_count == 0) {
    return;
  }
  pool->use_count -= 1;
  if (pool->use_count == 0 && !capture_underway) {
    release_segments_of(*pool);
  }
}

void PrivatePools::give_free(Pool& pool, Segment& segment, uintptr_t address) {
  // Merge with free neighbours in the segment, then index the merged block.
  auto it = segment.blocks.find(address);
  it->second.allocated = false;
  it->second.requested = 0;
  if (it != segment.blocks.begin()) {
    auto before = std::prev(it);
    if (!before->second.allocated) {
      pool.free_blocks.erase({segment.stream, before->second.size, before->first});
      before->second.size += it->second.size;
      segment.blocks.erase(it);
      it = before;
    }
  }
  auto after = std::next(it);
  if (after != segment.blocks.end() && !after->second.allocated) {
    pool.free_blocks.erase({segment.stream, after->second.size, after->first});
    it->second.size += after->second.size;
    segment.blocks.erase(after);
  }
  pool.free_blocks.insert({segment.stream, it->second.size, it->first});
}

void PrivatePools::settle_waiting(Pool& pool) {
  // Blocks whose other streams have passed the events recorded at their free become free.
  for (auto it = pool.waiting.begin(); it != pool.waiting.end();) {
    bool passed = true;
    for (cudaEvent_t event : it->second) {
      if (cudaEventQuery(event) != cudaSuccess) {
        passed = false;
        break;
      }
    }
    if (!passed) {
      (void)cudaGetLastError(); // cudaErrorNotReady is not an error
      ++it;
      continue;
    }
    for (cudaEvent_t event : it->second) {
      cudaEventDestroy(event);
    }
    auto segment = std::prev(pool.segments.upper_bound(it->first));
    give_free(pool, segment->second, it->first);
    it = pool.waiting.erase(it);
  }
}

void* PrivatePools::cut(Pool& pool, size_t size, cudaStream_t stream, std::string& why) {
  size_t rounded = round_up(size == 0 ? 1 : size, kAlignment);
  auto fit = pool.free_blocks.lower_bound({stream, rounded, 0});
  if (fit == pool.free_blocks.end() || std::get<0>(*fit) != stream) {
    // No free block fits: a new segment of whole pages.
    size_t segment_size = round_up(rounded, kSegmentGranularity);
    void* base = nullptr;
    if (pool.source) {
      base = pool.source->raw_alloc_with_stream(segment_size, stream);
    } else {
      base = api.alloc_routed(static_cast<ssize_t>(segment_size), pool.device, stream);
    }
    if (base == nullptr) {
      why = api.error_or("the segment could not be allocated");
      return nullptr;
    }
    auto address = reinterpret_cast<uintptr_t>(base);
    Segment& segment = pool.segments[address];
    segment.base = address;
    segment.size = segment_size;
    segment.stream = stream;
    segment.blocks[address] = BlockState{segment_size, 0, false};
    segment_of_[address] = &pool;
    fit = pool.free_blocks.insert({stream, segment_size, address}).first;
  }
  uintptr_t address = std::get<2>(*fit);
  size_t block_size = std::get<1>(*fit);
  pool.free_blocks.erase(fit);
  Segment& segment = std::prev(pool.segments.upper_bound(address))->second;
  BlockState& block = segment.blocks[address];
  if (block_size - rounded >= kAlignment) {
    // Split: the rest stays free.
    uintptr_t rest = address + rounded;
    segment.blocks[rest] = BlockState{block_size - rounded, 0, false};
    pool.free_blocks.insert({stream, block_size - rounded, rest});
    block.size = rounded;
  }
  block.allocated = true;
  block.requested = size;
  live_[address] = &pool;
  return reinterpret_cast<void*>(address);
}

void* PrivatePools::malloc(c10::DeviceIndex device, MempoolId_t id, size_t size,
                           cudaStream_t stream, std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  Pool* pool = find(device, id);
  if (pool == nullptr) {
    // Allocating to a pool nobody created: create it, as PyTorch's allocator does.
    pool = &pools_[{device, id}];
    pool->device = device;
    pool->id = id;
  }
  settle_waiting(*pool);
  return cut(*pool, size, stream, why);
}

bool PrivatePools::free(void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto address = reinterpret_cast<uintptr_t>(ptr);
  auto live = live_.find(address);
  if (live == live_.end()) {
    return false;
  }
  Pool& pool = *live->second;
  live_.erase(live);
  auto segment = std::prev(pool.segments.upper_bound(address));
  auto used = pool.used_on.find(address);
  if (used == pool.used_on.end()) {
    give_free(pool, segment->second, address);
    return true;
  }
  // Used on other streams too: free once their work queued so far has run.
  std::vector<cudaEvent_t> events;
  bool fenced = true;
  for (cudaStream_t other : used->second) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaEvent_t event = nullptr;
    if (cudaStreamIsCapturing(other, &status) != cudaSuccess ||
        status != cudaStreamCaptureStatusNone ||
        cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventRecord(event, other) != cudaSuccess) {
      fenced = false;
      if (event != nullptr) {
        cudaEventDestroy(event);
      }
      break;
    }
    events.push_back(event);
  }
  pool.used_on.erase(used);
  if (!fenced) {
    // A stream that cannot be fenced (capturing): the block stays taken until the pool goes.
    (void)cudaGetLastError();
    for (cudaEvent_t event : events) {
      cudaEventDestroy(event);
    }
    return true;
  }
  pool.waiting.emplace_back(address, std::move(events));
  return true;
}

size_t PrivatePools::live_size(void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto address = reinterpret_cast<uintptr_t>(ptr);
  auto live = live_.find(address);
  if (live == live_.end()) {
    return 0;
  }
  const Segment& segment = std::prev(live->second->segments.upper_bound(address))->second;
  return segment.blocks.at(address).size;
}

bool PrivatePools::record_stream(void* ptr, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto address = reinterpret_cast<uintptr_t>(ptr);
  auto live = live_.find(address);
  if (live == live_.end()) {
    return false;
  }
  Pool& pool = *live->second;
  auto segment = std::prev(pool.segments.upper_bound(address));
  if (segment->second.stream != stream) {
    auto& streams = pool.used_on[address];
    if (std::find(streams.begin(), streams.end(), stream) == streams.end()) {
      streams.push_back(stream);
    }
  }
  return true;
}

bool PrivatePools::live_blocks_are(c10::DeviceIndex device, MempoolId_t id,
                                   const std::unordered_set<void*>& expected) {
  std::lock_guard<std::mutex> lock(mutex_);
  Pool* pool = find(device, id);
  size_t live = 0;
  if (pool != nullptr) {
    for (const auto& [ptr, owner] : live_) {
      if (owner != pool) {
        continue;
      }
      if (expected.count(reinterpret_cast<void*>(ptr)) == 0) {
        return false;
      }
      live += 1;
    }
  }
  return live == expected.size();
}

std::shared_ptr<PoolCheckpoint> PrivatePools::checkpoint(c10::DeviceIndex device,
                                                         MempoolId_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto state = std::make_shared<PoolCheckpoint>();
  state->device = device;
  state->pool = id;
  if (Pool* pool = find(device, id)) {
    for (const auto& [base, segment] : pool->segments) {
      state->segments[base] = segment.blocks;
    }
  }
  return state;
}

cca::CheckpointDelta PrivatePools::restore(c10::DeviceIndex device,
                                           const PoolCheckpoint& state) {
  std::lock_guard<std::mutex> lock(mutex_);
  Pool* pool = find(device, state.pool);
  // Messages built from strings only: streaming numbers would run this build's locale code
  // against the libstdc++ PyTorch loaded (see stats_snapshot.cpp).
  TORCH_CHECK(pool != nullptr,
              "gpumem: no private pool (" + std::to_string(state.pool.first) + ", " +
                  std::to_string(state.pool.second) + ") on device " +
                  std::to_string(static_cast<int>(device)) + " to restore a checkpoint into");
  for (const auto& [base, blocks] : state.segments) {
    TORCH_CHECK(pool->segments.count(base) == 1, "gpumem: a segment of the checkpointed pool ",
                "was released since the checkpoint");
  }
  cca::CheckpointDelta delta;
  for (auto it = live_.begin(); it != live_.end();) {
    if (it->second == pool) {
      delta.ptrs_freed.push_back(reinterpret_cast<void*>(it->first));
      it = live_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& [address, events] : pool->waiting) {
    for (cudaEvent_t event : events) {
      cudaEventDestroy(event);
    }
  }
  pool->waiting.clear();
  pool->used_on.clear();
  pool->free_blocks.clear();
  for (auto& [base, segment] : pool->segments) {
    auto saved = state.segments.find(base);
    if (saved == state.segments.end()) {
      segment.blocks.clear();
      segment.blocks[base] = BlockState{segment.size, 0, false};
    } else {
      segment.blocks = saved->second;
    }
    for (const auto& [address, block] : segment.blocks) {
      if (block.allocated) {
        live_[address] = pool;
        delta.dataptrs_allocd.emplace_back(
            reinterpret_cast<void*>(address), reinterpret_cast<void*>(address),
            &delete_pool_block, c10::Device(c10::DeviceType::CUDA, device));
      } else {
        pool->free_blocks.insert({segment.stream, block.size, address});
      }
    }
  }
  return delta;
}

size_t PrivatePools::release_segments_of(Pool& pool) {
  settle_waiting(pool);
  size_t released = 0;
  bool synced = false;
  for (auto it = pool.segments.begin(); it != pool.segments.end();) {
    Segment& segment = it->second;
    bool whole_free = segment.blocks.size() == 1 && !segment.blocks.begin()->second.allocated;
    if (!whole_free) {
      ++it;
      continue;
    }
    if (!synced) {
      // A graph may still be replaying into these addresses on any stream.
      cudaDeviceSynchronize();
      synced = true;
    }
    pool.free_blocks.erase({segment.stream, segment.size, segment.base});
    segment_of_.erase(segment.base);
    if (pool.source) {
      pool.source->raw_delete(reinterpret_cast<void*>(segment.base));
    } else {
      api.free_ptr(reinterpret_cast<void*>(segment.base));
    }
    released += segment.size;
    it = pool.segments.erase(it);
  }
  if (pool.use_count == 0 && pool.segments.empty()) {
    pools_.erase({pool.device, pool.id});
  }
  return released;
}

size_t PrivatePools::release_free_segments(const MempoolId_t* only) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Pool*> unused;
  for (auto& [key, pool] : pools_) {
    bool chosen = only == nullptr ? pool.use_count == 0 : key.second == *only;
    if (chosen) {
      unused.push_back(&pool);
    }
  }
  size_t released = 0;
  for (Pool* pool : unused) {
    released += release_segments_of(*pool);
  }
  return released;
}

std::vector<cca::SegmentInfo> PrivatePools::segment_infos(c10::DeviceIndex device,
                                                          const MempoolId_t* only) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<cca::SegmentInfo> infos;
  for (const auto& [key, pool] : pools_) {
    if (key.first != device || (only != nullptr && key.second != *only)) {
      continue;
    }
    for (const auto& [base, segment] : pool.segments) {
      cca::SegmentInfo info;
      info.device = device;
      info.address = base;
      info.total_size = segment.size;
      info.stream = segment.stream;
      info.is_large = segment.size > kSegmentGranularity;
      info.owner_private_pool_id = pool.id;
      for (const auto& [address, state] : segment.blocks) {
        cca::BlockInfo block;
        block.size = state.size;
        block.requested_size = state.requested;
        block.allocated = state.allocated;
        block.active = state.allocated;
        info.requested_size += state.requested;
        if (state.allocated) {
          info.allocated_size += state.size;
          info.active_size += state.size;
        }
        info.blocks.push_back(block);
      }
      infos.push_back(std::move(info));
    }
  }
  return infos;
}

bool PrivatePools::is_segment_base(uintptr_t address) {
  std::lock_guard<std::mutex> lock(mutex_);
  return segment_of_.count(address) == 1;
}

} // namespace gpumem_torch
