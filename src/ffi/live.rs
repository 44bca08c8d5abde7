//! The live buffers handed out through the C ABI, by device pointer: a C caller frees by address,
//! so every `DeviceBuffer` waits here until then. Sharded by address, so threads allocating at
//! once rarely meet on a lock, and hashed with one multiplication instead of SipHash.

use crate::manager::DeviceBuffer;
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
        self.0 = value.wrapping_mul(MIX);
    }
}

const MIX: u64 = 0x9E37_79B9_7F4A_7C15;

type Shard = HashMap<u64, DeviceBuffer, BuildHasherDefault<AddressHasher>>;

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
        self.shard(ptr).lock().insert(ptr, buffer)
    }

    pub(super) fn remove(&self, ptr: u64) -> Option<DeviceBuffer> {
        self.shard(ptr).lock().remove(&ptr)
    }

    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.lock().len()).sum()
    }
}
