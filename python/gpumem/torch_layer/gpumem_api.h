// The gpumem library's C ABI as the PyTorch layer calls it: a table of function pointers looked
// up once, by dlopen, in the very library file the Python package loaded (so both share one
// manager). See ../gpumem.h for what each call does.
#pragma once

#include "../gpumem.h"

#include <string>

namespace gpumem_torch {

using Stat = gpumem_stat_t;
using DeviceStatsC = gpumem_device_stats_t;

struct Api {
  decltype(&gpumem_alloc_routed) alloc_routed;
  decltype(&gpumem_free_ptr) free_ptr;
  decltype(&gpumem_record_stream) record_stream;
  decltype(&gpumem_empty_cache) empty_cache;
  decltype(&gpumem_reset_peak_stats) reset_peak_stats;
  decltype(&gpumem_device_stats) device_stats;
  decltype(&gpumem_set_memory_fraction) set_memory_fraction;
  decltype(&gpumem_memory_fraction) memory_fraction;
  decltype(&gpumem_largest_free_block) largest_free_block;
  decltype(&gpumem_allocation_size) allocation_size;
  decltype(&gpumem_segments_text) segments_text;
  decltype(&gpumem_export_chunks) export_chunks;
  decltype(&gpumem_oom_message) oom_message;
  decltype(&gpumem_print_errors) print_errors;
  decltype(&gpumem_last_error) last_error;
  decltype(&gpumem_string_free) string_free;

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
