// The layer's one C entry point, which makes gpumem PyTorch's CUDA allocator.
#include "allocator.h"

#include "gpumem_api.h"

#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>

#include <csignal>
#include <execinfo.h>
#include <unistd.h>

namespace gpumem_torch {

namespace {
// GPUMEM_TORCH_LAYER_DEBUG=1: a crash prints the C++ frames on stderr before the default
// handler runs (Python's faulthandler prints only Python's).
void print_frames(int signal) {
  void* frames[64];
  int count = backtrace(frames, 64);
  backtrace_symbols_fd(frames, count, STDERR_FILENO);
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

// Keeps the allocator alive for the life of the process, static destructors included: PyTorch
// holds a raw pointer, and tensors freed by other libraries' destructors at exit still call it.
std::shared_ptr<GpumemAllocator>* installed = nullptr;

void copy_message(const std::string& message, char* out, size_t out_len) {
  if (out == nullptr || out_len == 0) {
    return;
  }
  size_t n = std::min(out_len - 1, message.size());
  std::memcpy(out, message.data(), n);
  out[n] = '\0';
}
} // namespace

} // namespace gpumem_torch

// Makes gpumem (the library at `library`, the file the Python package loaded) PyTorch's CUDA
// allocator. Returns 0, or -1 with the reason in `error`. Call before the first CUDA tensor.
extern "C" __attribute__((visibility("default"))) int gpumem_torch_install(const char* library,
                                                                          char* error,
                                                                          size_t error_len) {
  using namespace gpumem_torch;
  try {
    if (installed != nullptr) {
      return 0;
    }
    std::string why;
    if (!api.load(library, why)) {
      copy_message(why, error, error_len);
      return -1;
    }
    const char* debug = std::getenv("GPUMEM_TORCH_LAYER_DEBUG");
    if (debug != nullptr && std::strcmp(debug, "1") == 0) {
      std::signal(SIGSEGV, print_frames);
    }
    auto allocator = std::make_shared<GpumemAllocator>();
    GpumemAllocator::instance = allocator.get();
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
    // Code that asks c10 for the CUDA allocator by device type gets gpumem too.
    c10::SetAllocator(c10::DeviceType::CUDA, allocator.get(), /*priority=*/1);
    // Failures now reach the caller as exceptions: no second report on stderr.
    api.print_errors(0);
    installed = new std::shared_ptr<GpumemAllocator>(std::move(allocator)); // never freed
    return 0;
  } catch (const c10::Error& e) {
    gpumem_torch::GpumemAllocator::instance = nullptr;
    copy_message(e.what_without_backtrace(), error, error_len);
  } catch (const std::exception& e) {
    gpumem_torch::GpumemAllocator::instance = nullptr;
    copy_message(e.what(), error, error_len);
  }
  return -1;
}
