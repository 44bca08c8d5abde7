//! Which pool a request on a stream other than the default one goes to. Memory freed on a
//! stream is reused at once on that stream (it runs its work in order), so each stream gets
//! pools of its own — but each such pool keeps at least a page (2 MiB) mapped while it holds
//! anything, and a host may pass thousands of stream values (a stream per request). So at most
//! [`MAX_STREAMS_WITH_OWN_POOLS`] streams per device have pools of their own; requests of the
//! others go to the device's shared pools, where a freed block comes back only once its stream
//! is past it (`pool/shared.rs`), so the streams share pages without one ever being handed
//! memory another may still use. A stream's own pools that hold nothing live and have not been
//! used for `release_idle_after` give their pages to the device's page reserve and are dropped
//! at upkeep, which makes room for the next new stream.

use super::buffer::PooledBlock;
use super::{handles, ManagedDevice, MemoryManager};
use crate::backend::StreamId;
use crate::error::{AllocError, BackendError};
use crate::pool::{BusyStreams, LiveInfo, Pool};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// Streams per device (besides the default one) with pools of their own: more than the side
/// streams an engine keeps (NCCL's, a copy stream, a few for overlap), few enough that their
/// pages — a page each at least — and address ranges stay small.
pub const MAX_STREAMS_WITH_OWN_POOLS: usize = 16;

/// The pools of one stream, a pool per shard, and when it was last seen used.
pub(super) struct StreamPools {
    pub(super) pools: Box<[Arc<Pool>]>,
    /// Requests the pools had counted at the last look, and the tick from which that count
    /// has not changed.
    seen_requests: AtomicU64,
    unchanged_since: AtomicU64,
}

impl StreamPools {
    fn new(pools: Vec<Arc<Pool>>) -> Self {
        StreamPools {
            pools: pools.into_boxed_slice(),
            seen_requests: AtomicU64::new(0),
            unchanged_since: AtomicU64::new(crate::clock::now()),
        }
    }

    fn requests(&self) -> u64 {
        let kinds = [crate::pool::PoolKind::Small, crate::pool::PoolKind::Large];
        self.pools
            .iter()
            .flat_map(|pool| kinds.map(|kind| pool.slot(kind).counters.read().requests))
            .sum()
    }

    /// Whether the pools served no request for `age` (looked at from upkeep only).
    fn unused_for(&self, age: Duration, now: u64) -> bool {
        let requests = self.requests();
        if self.seen_requests.swap(requests, Relaxed) != requests {
            self.unchanged_since.store(now, Relaxed);
            return false;
        }
        crate::clock::between(self.unchanged_since.load(Relaxed), now) >= age
    }
}

impl ManagedDevice {
    /// A pool per shard for `stream`.
    pub(super) fn shards(&self, stream: StreamId, count: usize) -> Vec<Arc<Pool>> {
        (0..count)
            .map(|_| Arc::new(Pool::new(Arc::clone(&self.pages), stream, self.settings)))
            .collect()
    }

    /// The shared pools, a pool per shard.
    pub(super) fn shared_shards(&self, count: usize) -> Vec<Arc<Pool>> {
        (0..count)
            .map(|_| {
                Arc::new(Pool::for_shared_streams(
                    Arc::clone(&self.pages),
                    self.settings,
                ))
            })
            .collect()
    }
}

impl MemoryManager {
    /// The pool of `stream` for this thread's shard: the stream's own, or a shared one when
    /// [`MAX_STREAMS_WITH_OWN_POOLS`] other streams have pools already.
    #[inline]
    pub(super) fn pool_for(
        &self,
        managed: &ManagedDevice,
        stream: StreamId,
        thread_slot: usize,
    ) -> Arc<Pool> {
        let shard = thread_slot & (self.shared().shard_count - 1);
        if stream == StreamId::DEFAULT {
            return handles::take(&managed.default_stream[shard]);
        }
        let streams = managed.other_streams.read();
        if let Some(own) = streams.get(&stream) {
            return handles::take(&own.pools[shard]);
        }
        let full = streams.len() >= MAX_STREAMS_WITH_OWN_POOLS;
        drop(streams);
        if full {
            return handles::take(&managed.shared_streams[shard]);
        }
        self.pool_of_new_stream(managed, stream, shard)
    }

    #[cold]
    fn pool_of_new_stream(
        &self,
        managed: &ManagedDevice,
        stream: StreamId,
        shard: usize,
    ) -> Arc<Pool> {
        // The shared pools' mark is nobody's stream: served as "any stream", conservatively.
        let stream = if stream == StreamId::SHARED {
            StreamId::ANY
        } else {
            stream
        };
        let mut streams = managed.other_streams.write();
        if !streams.contains_key(&stream) && streams.len() >= MAX_STREAMS_WITH_OWN_POOLS {
            return handles::take(&managed.shared_streams[shard]);
        }
        let own = streams.entry(stream).or_insert_with(|| {
            Arc::new(StreamPools::new(
                managed.shards(stream, self.shared().shard_count),
            ))
        });
        handles::take(&own.pools[shard])
    }

    /// The stream's own pools were retired (unused for `release_idle_after`) after this thread
    /// took one: the stream's pool now serves the request (its own new ones, or a shared one).
    #[cold]
    #[inline(never)]
    pub(super) fn alloc_after_retirement(
        &self,
        managed: &ManagedDevice,
        stream: StreamId,
        size: u64,
        align: u64,
        live: LiveInfo,
    ) -> Result<(u64, Arc<Pool>, PooledBlock), AllocError> {
        let pool = self.pool_for(managed, stream, super::thread_ids::current_thread_slot());
        self.alloc_pooled(managed, pool, size, align, live)
    }

    /// Streams of `device` with pools of their own now (at most
    /// [`MAX_STREAMS_WITH_OWN_POOLS`]; the default stream's are not counted).
    pub fn streams_with_own_pools(&self, device: usize) -> Result<usize, BackendError> {
        Ok(self.device(device)?.other_streams.read().len())
    }

    /// Drops the own pools of streams unused for `age` that hold nothing live, once their
    /// cached pages could be unmapped into the device's page reserve without waiting (the
    /// stream is idle, or its fences have passed): upkeep's work, so a stream whose queued work
    /// cannot be checked keeps its pools until a later round.
    pub(super) fn retire_unused_streams(&self, age: Duration) {
        let now = crate::clock::now();
        for managed in &self.shared().devices {
            let candidates: Vec<(StreamId, Arc<StreamPools>)> = managed
                .other_streams
                .read()
                .iter()
                .map(|(stream, own)| (*stream, Arc::clone(own)))
                .collect();
            for (stream, own) in candidates {
                if own.unused_for(age, now) && self.unmap_all_of(managed, &own) {
                    self.retire_stream(managed, stream, &own);
                }
            }
        }
    }

    /// Unmaps every cached page of `own`'s pools that can go without waiting; true when nothing
    /// is live and nothing is mapped any more.
    fn unmap_all_of(&self, managed: &ManagedDevice, own: &StreamPools) -> bool {
        if own.pools.iter().any(|pool| pool.in_use_bytes() > 0) {
            return false;
        }
        for pool in own.pools.iter() {
            if let Err(error) = pool.release_idle(BusyStreams::Skip, |_, _| true) {
                tracing::warn!(device = managed.index, %error, "could not unmap an unused stream's pages");
                return false;
            }
        }
        own.pools.iter().all(|pool| pool.page_census().0 == 0)
    }

    /// Retired pools the driver would not take every page back from, tried again; they stay
    /// listed (and counted) until they are wound down.
    pub(super) fn wind_down_retired(&self) {
        for managed in &self.shared().devices {
            let retiring: Vec<Arc<Pool>> = managed.retiring.lock().clone();
            for pool in retiring {
                pool.wind_down();
            }
        }
    }

    fn retire_stream(&self, managed: &ManagedDevice, stream: StreamId, own: &Arc<StreamPools>) {
        let mut streams = managed.other_streams.write();
        if !streams
            .get(&stream)
            .is_some_and(|now| Arc::ptr_eq(now, own))
        {
            return;
        }
        streams.remove(&stream);
        drop(streams);
        // A thread that took one of these pools just before may allocate from it still: after
        // the retirement that fails and it asks again; before, its block keeps the pool (and
        // its counters in every total) until freed.
        for pool in own.pools.iter() {
            pool.retire();
            if !pool.is_wound_down() {
                managed.retiring.lock().push(Arc::clone(pool));
            }
        }
    }
}
