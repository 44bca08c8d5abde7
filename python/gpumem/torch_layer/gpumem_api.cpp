// Looks up the gpumem library's entry points (gpumem_api.h).
#include "gpumem_api.h"

#include <dlfcn.h>

namespace gpumem_torch {

Api api;

namespace {
template <typename F>
bool find(void* library, const char* name, F& slot, std::string& why) {
  slot = reinterpret_cast<F>(dlsym(library, name));
  if (slot == nullptr) {
    why = std::string("the gpumem library has no ") + name +
        " (a build older than this package?)";
    return false;
  }
  return true;
}
} // namespace

bool Api::load(const char* path, std::string& why) {
  // The Python package loaded this file already: dlopen returns that same copy.
  void* library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    why = std::string("cannot load ") + path + ": " + (error ? error : "unknown error");
    return false;
  }
  return find(library, "gpumem_alloc_routed", alloc_routed, why) &&
      find(library, "gpumem_free_ptr", free_ptr, why) &&
      find(library, "gpumem_record_stream", record_stream, why) &&
      find(library, "gpumem_empty_cache", empty_cache, why) &&
      find(library, "gpumem_reset_peak_stats", reset_peak_stats, why) &&
      find(library, "gpumem_device_stats", device_stats, why) &&
      find(library, "gpumem_set_memory_fraction", set_memory_fraction, why) &&
      find(library, "gpumem_memory_fraction", memory_fraction, why) &&
      find(library, "gpumem_largest_free_block", largest_free_block, why) &&
      find(library, "gpumem_allocation_size", allocation_size, why) &&
      find(library, "gpumem_segments_text", segments_text, why) &&
      find(library, "gpumem_export_chunks", export_chunks, why) &&
      find(library, "gpumem_oom_message", oom_message, why) &&
      find(library, "gpumem_print_errors", print_errors, why) &&
      find(library, "gpumem_last_error", last_error, why) &&
      find(library, "gpumem_string_free", string_free, why);
}

std::string Api::take(char* text) const {
  if (text == nullptr) {
    return "";
  }
  std::string copy(text);
  string_free(text);
  return copy;
}

std::string Api::error_or(const char* fallback) const {
  std::string error = take(last_error());
  return error.empty() ? std::string(fallback) : error;
}

} // namespace gpumem_torch
