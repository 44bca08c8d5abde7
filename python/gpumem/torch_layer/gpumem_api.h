// The gpumem library's C ABI as the PyTorch layer calls it: a table of function pointers looked
// up once, by dlopen, in the very library file the Python package loaded (so both share one
// manager). See ../gpumem.h for what each call does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <sys/types.h>

namespace gpumem_torch {

struct Stat {
  uint64_t current, peak, allocated, freed;
};

// gpumem_device_stats_t: each array is all, small pool, large pool.
struct DeviceStatsC {
  Stat allocation[3], segment[3], active[3], inactive_split[3];
  Stat allocated_bytes[3], reserved_bytes[3], active_bytes[3], inactive_split_bytes[3];
  Stat requested_bytes[3];
  uint64_t num_alloc_retries, num_ooms, num_device_alloc, num_device_free;
};

struct Api {
  void* (*alloc_routed)(ssize_t, int, void*);
  void (*free_ptr)(void*);
  int (*record_stream)(void*, void*);
  int64_t (*empty_cache)();
  int (*reset_peak_stats)();
  int (*device_stats)(int, DeviceStatsC*);
  int (*set_memory_fraction)(int, double);
  double (*memory_fraction)(int);
  int64_t (*largest_free_block)(int);
  int64_t (*allocation_size)(void*);
  char* (*segments_text)(int);
  char* (*oom_message)(int, ssize_t);
  int (*print_errors)(int);
  char* (*last_error)();
  void (*string_free)(char*);

  // Loads every entry from the library at `path`; false with `why` set when one is missing.
  bool load(const char* path, std::string& why);

  // Takes a string the library returned (null is "") and releases it.
  std::string take(char* text) const;

  // This thread's latest gpumem error, or `fallback`.
  std::string error_or(const char* fallback) const;
};

// The table every part of the layer uses; loaded once by gpumem_torch_install.
extern Api api;

} // namespace gpumem_torch
