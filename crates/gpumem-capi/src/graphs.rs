//! CUDA graph capture through the C ABI. An allocation on a stream that is capturing goes to a
//! graph pool (see `manager/graphs.rs`): the one the host named for that capture with
//! `gpumem_graph_pool_begin` (PyTorch's mempool id, which graphs share with
//! `torch.cuda.graph(pool=...)`), or else a pool of the capture's own. A named pool is released
//! when the host has said, once per graph captured into it, that the graph is gone; a pool of
//! a capture nobody named is never released, since nothing says when its graph is.

use super::runtime::Runtime;
use gpumem::backend::StreamId;
use gpumem::manager::GraphPoolId;
use parking_lot::Mutex;
use std::collections::HashMap;

/// The captures the host named a pool for, and how many graphs each named pool serves.
#[derive(Default)]
pub(super) struct GraphCaptures {
    inner: Mutex<Named>,
}

#[derive(Default)]
struct Named {
    /// (device, capture id) -> the pool its allocations go to.
    pool_of_capture: HashMap<(usize, u64), GraphPoolId>,
    /// (device, pool) -> graphs captured into it and not yet released.
    graphs: HashMap<(usize, GraphPoolId), u64>,
}

/// PyTorch names a pool with two 64-bit ids; the first is a counter that never reaches
/// `u64::MAX`, which therefore marks the pools of unnamed captures.
pub(super) fn named_pool(high: u64, low: u64) -> GraphPoolId {
    GraphPoolId(u128::from(high) << 64 | u128::from(low))
}

fn unnamed_pool(capture: u64) -> GraphPoolId {
    GraphPoolId(u128::from(u64::MAX) << 64 | u128::from(capture))
}

impl Runtime {
    /// The graph pool an allocation on `stream` goes to: `None` when the stream is not
    /// capturing. An error when the driver cannot tell (it refuses for the legacy default stream
    /// while another stream captures in global mode): memory handed out then could be either
    /// the graph's or not, so none is.
    pub(super) fn graph_pool_for(
        &self,
        device: usize,
        stream: StreamId,
    ) -> Result<Option<GraphPoolId>, String> {
        match self.manager.backend().capture_of(device, stream) {
            Ok(None) => Ok(None),
            Ok(Some(capture)) => {
                let named = self.graphs.inner.lock();
                let pool = named.pool_of_capture.get(&(device, capture)).copied();
                Ok(Some(pool.unwrap_or_else(|| unnamed_pool(capture))))
            }
            Err(invalid @ gpumem::error::BackendError::InvalidDevice { .. }) => {
                Err(invalid.to_string())
            }
            Err(why) => Err(format!(
                "cannot tell whether stream {:#x} is capturing a CUDA graph ({why}); allocate on \
                 a stream of your own while another stream captures",
                stream.0
            )),
        }
    }

    /// The capture now running on `stream` allocates from `pool`, and one more graph uses it.
    pub(super) fn begin_graph_pool(
        &self,
        device: usize,
        stream: StreamId,
        pool: GraphPoolId,
    ) -> Result<(), String> {
        self.manager
            .device_indices()
            .contains(&device)
            .then_some(())
            .ok_or_else(|| format!("device {device} is not managed by gpumem"))?;
        let capture = self
            .keeping_host_context(|| self.manager.backend().capture_of(device, stream))
            .map_err(|e| e.to_string())?
            .ok_or_else(|| {
                format!(
                    "stream {:#x} is not capturing a CUDA graph: call this after the capture \
                     has begun",
                    stream.0
                )
            })?;
        let mut named = self.graphs.inner.lock();
        named.pool_of_capture.insert((device, capture), pool);
        *named.graphs.entry((device, pool)).or_default() += 1;
        Ok(())
    }

    /// One graph captured into `pool` is gone; with the last, the pool's memory is released.
    /// Returns the bytes released now (0 while other graphs still use the pool).
    pub(super) fn release_graph_pool(
        &self,
        device: usize,
        pool: GraphPoolId,
    ) -> Result<u64, String> {
        let mut named = self.graphs.inner.lock();
        let Some(graphs) = named.graphs.get_mut(&(device, pool)) else {
            return Err(format!(
                "no graph was captured into pool {:#x} on device {device} (or all were released)",
                pool.0
            ));
        };
        *graphs -= 1;
        if *graphs > 0 {
            return Ok(0);
        }
        named.graphs.remove(&(device, pool));
        named
            .pool_of_capture
            .retain(|&(d, _), named_pool| d != device || *named_pool != pool);
        drop(named);
        self.keeping_host_context(|| self.manager.release_graph_pool(device, pool))
            .map_err(|e| e.to_string())
    }
}
