// The cheapest allocator PyTorch's pluggable interface can call: a baseline for what that
// interface costs by itself, so a step-time gap between PyTorch's own allocator and gpumem can be
// split into the interface's share and gpumem's. Blocks are kept per exact size (rounded up to
// 512 bytes) and handed out again in O(1); nothing is ever returned to the driver, streams are
// not told apart (the workloads run on one stream), and memory grows to the sum of every size's
// peak. Not an allocator to use: a floor to measure against.
//
// Build (GPU host): nvcc -O2 -shared -Xcompiler -fPIC -o floor_allocator.so floor_allocator.c
// Load: torch.cuda.memory.CUDAPluggableAllocator(path, "floor_alloc", "floor_free")
#include <cuda_runtime.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>

#define BUCKETS 4096 // size classes hashed; a class's list is found by linear probing

struct block {
    struct block *next; // host-side list node; the device memory is `ptr`
    void *ptr;
};

struct size_class {
    size_t size; // 0: empty slot
    struct block *free;
};

static struct size_class classes[BUCKETS];
static struct block *spare_nodes; // nodes of blocks handed out, reused for the next free
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static size_t allocations;

static struct size_class *class_of(size_t size) {
    size_t slot = (size >> 9) * 0x9E3779B97F4A7C15ull % BUCKETS;
    for (size_t probe = 0; probe < BUCKETS; probe++) {
        struct size_class *c = &classes[(slot + probe) % BUCKETS];
        if (c->size == size || c->size == 0) {
            c->size = size;
            return c;
        }
    }
    return NULL; // more than BUCKETS distinct sizes: fall through to the driver
}

// Where a block's size is kept while it is out: a small open-addressed table keyed by address.
#define LIVE_SLOTS (1u << 20)
static struct {
    void *ptr;
    size_t size;
} live[LIVE_SLOTS];

static size_t live_slot(void *ptr) {
    return ((uintptr_t)ptr >> 9) * 0x9E3779B97F4A7C15ull >> 44; // 20 bits
}

static void remember(void *ptr, size_t size) {
    for (size_t i = live_slot(ptr);; i = (i + 1) & (LIVE_SLOTS - 1)) {
        if (live[i].ptr == NULL || live[i].ptr == (void *)1) {
            live[i].ptr = ptr;
            live[i].size = size;
            return;
        }
    }
}

static size_t forget(void *ptr) {
    for (size_t i = live_slot(ptr);; i = (i + 1) & (LIVE_SLOTS - 1)) {
        if (live[i].ptr == ptr) {
            live[i].ptr = (void *)1; // a tombstone keeps later probes going
            return live[i].size;
        }
        if (live[i].ptr == NULL)
            return 0;
    }
}

void *floor_alloc(ssize_t requested, int device, void *stream) {
    (void)device;
    (void)stream;
    if (requested <= 0)
        return NULL;
    size_t size = ((size_t)requested + 511) & ~(size_t)511;
    void *ptr = NULL;
    pthread_mutex_lock(&lock);
    allocations++;
    struct size_class *c = class_of(size);
    if (c && c->free) {
        struct block *b = c->free;
        c->free = b->next;
        ptr = b->ptr;
        b->next = spare_nodes;
        spare_nodes = b;
    }
    pthread_mutex_unlock(&lock);
    if (!ptr && cudaMalloc(&ptr, size) != cudaSuccess)
        return NULL;
    pthread_mutex_lock(&lock);
    remember(ptr, size);
    pthread_mutex_unlock(&lock);
    return ptr;
}

void floor_free(void *ptr, ssize_t requested, int device, void *stream) {
    (void)requested;
    (void)device;
    (void)stream;
    if (!ptr)
        return;
    pthread_mutex_lock(&lock);
    size_t size = forget(ptr);
    struct size_class *c = size ? class_of(size) : NULL;
    struct block *b = spare_nodes;
    if (c && b) {
        spare_nodes = b->next;
    } else if (c) {
        b = malloc(sizeof *b);
    }
    if (c && b) {
        b->ptr = ptr;
        b->next = c->free;
        c->free = b;
        ptr = NULL;
    }
    pthread_mutex_unlock(&lock);
    if (ptr)
        cudaFree(ptr);
}

// Allocations made so far (each call of floor_alloc with a positive size).
size_t floor_allocations(void) {
    pthread_mutex_lock(&lock);
    size_t n = allocations;
    pthread_mutex_unlock(&lock);
    return n;
}
