/* The C ABI of the gpumem library (libgpumem.so); see docs/pytorch.md in the repository.
 *
 * gpumem_alloc and gpumem_free have the signatures of PyTorch's CUDAPluggableAllocator. Calls
 * that fail return NULL or -1 and leave a message for gpumem_last_error(); none of them aborts
 * or throws. Strings returned by the library are released with gpumem_string_free().
 *
 * In a child forked after the parent's first call, no call blocks or touches the device: frees
 * are ignored (the memory is the parent's), tags and gpumem_empty_cache do nothing, and every
 * other call fails at once ("CUDA cannot be used in a forked child ..."). */
#ifndef GPUMEM_H
#define GPUMEM_H

#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *gpumem_stream_t; /* cudaStream_t; NULL is the default stream */

void *gpumem_alloc(ssize_t size, int device, gpumem_stream_t stream);
void gpumem_free(void *ptr, ssize_t size, int device, gpumem_stream_t stream);

/* The allocation is used on `stream` too (Tensor.record_stream): freed, its memory waits for
 * that stream's work queued by then. 0, or -1 for a pointer that is not a live allocation. */
int gpumem_record_stream(void *ptr, gpumem_stream_t stream);

int gpumem_set_tag(const char *tag);          /* this thread; NULL or "" clears */
int gpumem_set_default_tag(const char *tag);  /* threads without a tag of their own */
int64_t gpumem_empty_cache(void);             /* bytes released, or -1 */
int gpumem_reset_peak_stats(void);

/* CUDA graphs: the capture running on `stream` allocates from PyTorch's pool (high, low), which
 * one more graph now uses; release once per graph when it is gone (bytes released, or -1). */
int gpumem_graph_pool_begin(int device, gpumem_stream_t stream, uint64_t pool_high,
                            uint64_t pool_low);
int64_t gpumem_graph_pool_release(int device, uint64_t pool_high, uint64_t pool_low);

char *gpumem_snapshot_json(void);             /* the /api/v1/snapshot document */
char *gpumem_memory_stats_json(int device);   /* torch.cuda.memory_stats() keys */
int gpumem_serve(const char *listen);         /* port bound, or -1; NULL: 127.0.0.1:9400 */
/* 0, or -1; NULL: $GPUMEM_PUBLISH_DIR or /run/gpumem. OOM flight records go to DIR/oom. */
int gpumem_publish(const char *dir);
/* For the PyTorch layer (torch_layer/, PyTorch's CUDAAllocator interface over this library). */

/* One of PyTorch's allocator statistics. */
typedef struct {
  uint64_t current, peak, allocated, freed;
} gpumem_stat_t;

/* torch.cuda.memory_stats() of one device; each array is all, small pool, large pool. */
typedef struct {
  gpumem_stat_t allocation[3], segment[3], active[3], inactive_split[3];
  gpumem_stat_t allocated_bytes[3], reserved_bytes[3], active_bytes[3];
  gpumem_stat_t inactive_split_bytes[3], requested_bytes[3];
  uint64_t num_alloc_retries, num_ooms, num_device_alloc, num_device_free;
} gpumem_device_stats_t;

/* gpumem_alloc for a caller that routes allocations made during graph capture itself: never
 * to one of gpumem's graph pools, and no driver call to ask whether `stream` captures. */
void *gpumem_alloc_routed(ssize_t size, int device, gpumem_stream_t stream);
void gpumem_free_ptr(void *ptr);              /* frees by pointer alone (a tensor's deleter) */
int gpumem_device_stats(int device, gpumem_device_stats_t *out);   /* 0, or -1 */
int gpumem_set_memory_fraction(int device, double fraction);      /* 0, or -1 */
double gpumem_memory_fraction(int device);    /* the share the pools may map, or -1 */
int64_t gpumem_largest_free_block(int device); /* bytes handed out without a miss, or -1 */
int64_t gpumem_allocation_size(void *ptr);    /* size asked for, or -1 when not live */
/* "S addr size stream small|large|direct graph" per segment, then "B addr size requested
 * allocated tag" per block, one a line, decimal; NULL on failure. */
char *gpumem_segments_text(int device);
/* The chunks mapped under [ptr, ptr + len) on `device`, exported for CUDA IPC: "C addr size fd"
 * a line, decimal; each descriptor stays open until its chunk is released. NULL on failure
 * (part of the range not mapped by gpumem, the simulated device, a chunk not shareable). */
char *gpumem_export_chunks(int device, void *ptr, uint64_t len);
/* torch.cuda.OutOfMemoryError's message for `size` bytes refused on `device` (gpumem's reason:
 * this thread's latest error). */
char *gpumem_oom_message(int device, ssize_t size);
int gpumem_print_errors(int on);              /* 0: failures only kept for gpumem_last_error */

char *gpumem_last_error(void);                /* NULL when nothing failed */
void gpumem_string_free(char *text);

#ifdef __cplusplus
}
#endif

#endif
