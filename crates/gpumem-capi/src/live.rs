//! The live buffers handed out through the C ABI, by device pointer: a C caller frees by address,
//! so every `DeviceBuffer` waits here until then, with the other streams the host said it used
//! the buffer on. Sharded by address, so threads allocating at
//! once rarely meet on a lock, and hashed with one multiplication instead of SipHash.

use gpumem::backend::StreamId;
use gpumem::manager::DeviceBuffer;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

const SHARD_BITS: u32 = 6;

/// Device pointers are at least 256-byte aligned and spread over a few ranges: a multiplication
/// by an odd constant mixes their middle bits into the top ones, which both the shard and the
/// table's buckets use.
#[derive(Default)]
struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(byte)).wrapping_mul(MIX);
        }
    }

    fn write_u64(&mut self, value: u64) {
        let mixed = value.wrapping_mul(MIX);
        // The table picks a key's bucket by the hash's low bits and tags it with the top seven;
        // a product of aligned addresses has its low bits all zero, so fold the top half down.
        self.0 = mixed ^ (mixed >> 32);
    }
}

const MIX: u64 = 0x9E37_79B9_7F4A_7C15;

/// A buffer handed out, and the streams other than its own that the host has used it on
/// (`Tensor.record_stream`): its memory is free only once their work queued before the free
/// has run.
pub(super) struct LiveBuffer {
    pub buffer: DeviceBuffer,
    pub used_on: Vec<StreamId>,
}

type Shard = HashMap<u64, LiveBuffer, BuildHasherDefault<AddressHasher>>;

pub(super) struct LiveBuffers {
    shards: Box<[Mutex<Shard>]>,
}

impl LiveBuffers {
    pub(super) fn new() -> Self {
        LiveBuffers {
            shards: (0..1 << SHARD_BITS)
                .map(|_| Mutex::new(Shard::default()))
                .collect(),
        }
    }

    fn shard(&self, ptr: u64) -> &Mutex<Shard> {
        &self.shards[(ptr.wrapping_mul(MIX) >> (64 - SHARD_BITS)) as usize]
    }

    /// Keeps `buffer` until its pointer is freed. A pointer already present means the manager
    /// handed out memory that is still live, which it never does; the old entry is returned so
    /// the caller can report it rather than silently lose it.
    pub(super) fn insert(&self, buffer: DeviceBuffer) -> Option<DeviceBuffer> {
        let ptr = buffer.ptr();
        let live = LiveBuffer {
            buffer,
            used_on: Vec::new(),
        };
        self.shard(ptr)
            .lock()
            .insert(ptr, live)
            .map(|old| old.buffer)
    }

    pub(super) fn remove(&self, ptr: u64) -> Option<LiveBuffer> {
        self.shard(ptr).lock().remove(&ptr)
    }

    /// Notes that the buffer at `ptr` is used on `stream` too; false when no live buffer is there.
    pub(super) fn record_use(&self, ptr: u64, stream: StreamId) -> bool {
        let mut shard = self.shard(ptr).lock();
        let Some(live) = shard.get_mut(&ptr) else {
            return false;
        };
        if live.buffer.stream() != stream && !live.used_on.contains(&stream) {
            live.used_on.push(stream);
        }
        true
    }

    /// The size the host asked for at `ptr`, if a live buffer is there.
    pub(super) fn size_of(&self, ptr: u64) -> Option<u64> {
        self.shard(ptr)
            .lock()
            .get(&ptr)
            .map(|live| live.buffer.size())
    }

    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.lock().len()).sum()
    }
}
