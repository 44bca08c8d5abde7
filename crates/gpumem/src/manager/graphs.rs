//! Pools for CUDA graphs. A captured graph replays into the addresses it saw during capture,
//! those of buffers freed before the capture ended included, so its memory must stay mapped and
//! out of every other allocation's reach for as long as the graph may be replayed. Each graph
//! pool is a pinned [`Pool`] of its own: allocations name it ([`AllocOptions::graph_pool`]),
//! frees return to it, and only [`MemoryManager::release_graph_pool`] lets its pages go.
//!
//! [`AllocOptions::graph_pool`]: super::AllocOptions::graph_pool

use super::{GraphPoolId, ManagedDevice, MemoryManager};
use crate::error::BackendError;
use crate::pool::{BusyStreams, Pool};
use std::sync::Arc;

impl ManagedDevice {
    /// The pool `id` names, made if new and pinned again if it had been released (a graph
    /// captured into it now depends on it).
    pub(super) fn graph_pool(&self, id: GraphPoolId) -> Arc<Pool> {
        let existing = self.graph_pools.read().get(&id).cloned();
        let pool = existing.unwrap_or_else(|| {
            let mut pools = self.graph_pools.write();
            let pool = pools.entry(id).or_insert_with(|| {
                Arc::new(Pool::for_graphs(Arc::clone(&self.pages), self.settings))
            });
            Arc::clone(pool)
        });
        if !pool.is_pinned() {
            pool.pin();
        }
        pool
    }
}

impl MemoryManager {
    /// The graphs captured into pool `id` on `device` are gone: its free memory becomes ordinary
    /// cache and is unmapped now (after waiting for the device, where a replay may still run),
    /// and buffers still live in it go the same way when freed. Returns the bytes unmapped into
    /// the device's page reserve (0 for a pool nothing was allocated from).
    pub fn release_graph_pool(&self, device: usize, id: GraphPoolId) -> Result<u64, BackendError> {
        let managed = self.device(device)?;
        let Some(pool) = managed.graph_pools.read().get(&id).cloned() else {
            return Ok(0);
        };
        pool.unpin();
        pool.release_idle(BusyStreams::Wait, |_, _| true)
    }

    /// The graph pools of `device`, by id: whether each is still held, its bytes in use and
    /// its bytes mapped.
    pub fn graph_pools(&self, device: usize) -> Result<Vec<GraphPoolView>, BackendError> {
        let managed = self.device(device)?;
        let pools = managed.graph_pools.read();
        let mut views: Vec<GraphPoolView> = pools
            .iter()
            .map(|(&id, pool)| {
                let (mapped_pages, _) = pool.page_census();
                GraphPoolView {
                    id,
                    pinned: pool.is_pinned(),
                    in_use_bytes: pool.in_use_bytes(),
                    mapped_bytes: mapped_pages * managed.page_size,
                }
            })
            .collect();
        views.sort_by_key(|view| view.id);
        Ok(views)
    }
}

/// One graph pool as [`MemoryManager::graph_pools`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphPoolView {
    pub id: GraphPoolId,
    /// Still held for its graphs (not released).
    pub pinned: bool,
    pub in_use_bytes: u64,
    pub mapped_bytes: u64,
}
