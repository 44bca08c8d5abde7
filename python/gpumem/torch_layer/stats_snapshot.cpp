// GpumemAllocator's statistics and memory snapshot (allocator.h): gpumem's counters under
// PyTorch's names, and its segments and blocks in PyTorch's snapshot format, with the private
// pools' own segments and the recorded history.
#include "allocator.h"

#include "gpumem_api.h"

#include <c10/util/Exception.h>

#include <cstdlib>

namespace gpumem_torch {

namespace {
void copy_stat(const Stat& from, const c10::CachingAllocator::Stat& baseline,
               c10::CachingAllocator::Stat& to) {
  to.current = static_cast<int64_t>(from.current);
  to.peak = static_cast<int64_t>(from.peak);
  to.allocated = static_cast<int64_t>(from.allocated) - baseline.allocated;
  to.freed = static_cast<int64_t>(from.freed) - baseline.freed;
}

void copy_array(const Stat (&from)[3], const cda::StatArray& baseline, cda::StatArray& to) {
  for (size_t i = 0; i < 3; ++i) {
    copy_stat(from[i], baseline[i], to[i]);
  }
}

cda::DeviceStats convert(const DeviceStatsC& c, const cda::DeviceStats& base) {
  cda::DeviceStats stats;
  copy_array(c.allocation, base.allocation, stats.allocation);
  copy_array(c.segment, base.segment, stats.segment);
  copy_array(c.active, base.active, stats.active);
  copy_array(c.inactive_split, base.inactive_split, stats.inactive_split);
  copy_array(c.allocated_bytes, base.allocated_bytes, stats.allocated_bytes);
  copy_array(c.reserved_bytes, base.reserved_bytes, stats.reserved_bytes);
  copy_array(c.active_bytes, base.active_bytes, stats.active_bytes);
  copy_array(c.inactive_split_bytes, base.inactive_split_bytes, stats.inactive_split_bytes);
  copy_array(c.requested_bytes, base.requested_bytes, stats.requested_bytes);
  stats.num_alloc_retries = static_cast<int64_t>(c.num_alloc_retries) - base.num_alloc_retries;
  stats.num_ooms = static_cast<int64_t>(c.num_ooms) - base.num_ooms;
  stats.num_device_alloc = static_cast<int64_t>(c.num_device_alloc) - base.num_device_alloc;
  stats.num_device_free = static_cast<int64_t>(c.num_device_free) - base.num_device_free;
  return stats;
}

} // namespace

DeviceStatsC GpumemAllocator::read_stats(c10::DeviceIndex device) {
  DeviceStatsC raw{};
  TORCH_CHECK(api.device_stats(device, &raw) == 0,
              api.error_or("gpumem could not read its statistics"));
  if (device >= 0 && device < kMaxDevices) {
    raw.num_ooms = static_cast<uint64_t>(ooms_[device].load(std::memory_order_relaxed));
  }
  return raw;
}

cda::DeviceStats GpumemAllocator::getDeviceStats(c10::DeviceIndex device) {
  DeviceStatsC raw = read_stats(device);
  std::lock_guard<std::mutex> lock(baseline_mutex_);
  auto index = static_cast<size_t>(device);
  static const cda::DeviceStats zero;
  return convert(raw, index < accumulated_baseline_.size() ? accumulated_baseline_[index] : zero);
}

void GpumemAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  // gpumem's counters also feed its exporter, whose counters must not go back: the reset is
  // a baseline subtracted here.
  DeviceStatsC raw = read_stats(device);
  std::lock_guard<std::mutex> lock(baseline_mutex_);
  auto index = static_cast<size_t>(device);
  if (accumulated_baseline_.size() <= index) {
    accumulated_baseline_.resize(index + 1);
  }
  accumulated_baseline_[index] = convert(raw, cda::DeviceStats{});
}

void GpumemAllocator::resetPeakStats(c10::DeviceIndex /*device*/) {
  // gpumem's peaks restart for every device at once.
  TORCH_CHECK(api.reset_peak_stats() == 0,
              api.error_or("gpumem could not reset its peak statistics"));
}

namespace {
// One line of gpumem_segments_text: its kind letter and up to five fields, then the rest.
// Parsed by hand: iostreams would run the locale code of the libstdc++ this file was built
// with against PyTorch's (its wheels link their own), which crashed on the GPU host.
struct Line {
  char kind = 0;
  unsigned long long numbers[5] = {0, 0, 0, 0, 0};
  std::string word; // S lines: the pool kind (4th field)
};

bool next_line(const char*& at, Line& line) {
  while (*at == '\n') {
    ++at;
  }
  if (*at == '\0') {
    return false;
  }
  line = Line();
  line.kind = *at++;
  for (int field = 0; field < 5 && *at != '\n' && *at != '\0'; ++field) {
    while (*at == ' ') {
      ++at;
    }
    if (line.kind == 'S' && field == 3) {
      const char* start = at;
      while (*at != ' ' && *at != '\n' && *at != '\0') {
        ++at;
      }
      line.word.assign(start, at);
      continue;
    }
    char* end = nullptr;
    line.numbers[field] = std::strtoull(at, &end, 10);
    at = end;
  }
  while (*at != '\n' && *at != '\0') { // the tag: not needed here
    ++at;
  }
  return true;
}
} // namespace

void GpumemAllocator::append_gpumem_segments(c10::DeviceIndex device, cca::SnapshotInfo& info) {
  std::string text = api.take(api.segments_text(device));
  cca::SegmentInfo segment;
  cca::SegmentInfo kind;
  bool open = false;
  auto close = [&]() {
    if (open && !segment.blocks.empty()) {
      info.segments.push_back(segment);
    }
    open = false;
  };
  auto start = [&]() {
    segment = cca::SegmentInfo();
    segment.device = device;
    segment.stream = kind.stream;
    segment.is_large = kind.is_large;
    segment.is_expandable = kind.is_expandable;
    open = true;
  };
  const char* at = text.c_str();
  Line line;
  while (next_line(at, line)) {
    if (line.kind == 'S') {
      close();
      kind = cca::SegmentInfo();
      kind.stream = reinterpret_cast<void*>(static_cast<uintptr_t>(line.numbers[2]));
      kind.is_large = line.word != "small";
      // A run of mapped pages grows and shrinks page by page, as PyTorch's expandable
      // segments do; a direct allocation is one driver allocation.
      kind.is_expandable = line.word != "direct";
      start();
      continue;
    }
    if (line.kind != 'B') {
      continue;
    }
    size_t address = line.numbers[0], size = line.numbers[1], requested = line.numbers[2];
    bool allocated = line.numbers[3] != 0;
    if (allocated && pools_.is_segment_base(address)) {
      // A private pool's segment: listed with its own blocks (segment_infos), not as one.
      close();
      start();
      continue;
    }
    if (!open) {
      start();
    }
    if (segment.blocks.empty()) {
      segment.address = address;
    }
    cca::BlockInfo block;
    block.size = size;
    block.requested_size = requested;
    block.allocated = allocated;
    block.active = allocated;
    if (allocated) {
      block.context_when_allocated = history_.context_of(address);
      segment.allocated_size += size;
      segment.active_size += size;
      segment.requested_size += requested;
    }
    segment.total_size += size;
    segment.blocks.push_back(std::move(block));
  }
  close();
}

cca::SnapshotInfo GpumemAllocator::snapshot(c10::MempoolId_t mempool_id, bool include_traces) {
  cca::SnapshotInfo info;
  bool every_pool = mempool_id.first == 0 && mempool_id.second == 0;
  int devices = device_count_.load();
  for (int device = 0; device < devices; ++device) {
    history_.snapshot_taken(static_cast<c10::DeviceIndex>(device));
    if (every_pool) {
      append_gpumem_segments(static_cast<c10::DeviceIndex>(device), info);
    }
    auto pooled = pools_.segment_infos(static_cast<c10::DeviceIndex>(device),
                                       every_pool ? nullptr : &mempool_id);
    info.segments.insert(info.segments.end(), pooled.begin(), pooled.end());
  }
  if (include_traces) {
    info.device_traces = history_.traces(static_cast<size_t>(devices));
  }
  info.config_metadata.garbage_collection_threshold = 0.0;
  info.config_metadata.max_split_size = SIZE_MAX;
  info.config_metadata.pinned_num_register_threads = 1;
  info.config_metadata.expandable_segments = false;
  info.config_metadata.release_lock_on_malloc = false;
  info.config_metadata.pinned_use_host_register = false;
  info.config_metadata.graph_capture_record_stream_reuse = false;
  info.config_metadata.last_allocator_settings = "gpumem";
  return info;
}

} // namespace gpumem_torch
