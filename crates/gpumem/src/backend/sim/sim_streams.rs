//! Streams on the simulated device ([`StreamOrder`]): CUDA graph captures begun and ended by
//! tests, fences that pass at once unless held (then when waited for, or a set number of fences
//! later), and the synchronisations counted.

use super::costs::spend;
use super::SimBackend;
use super::{Fence, StreamId, StreamOrder};
use crate::error::BackendError;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Streams capturing a CUDA graph, as a test sets them up with
/// [`SimBackend::begin_capture`]: what a host such as PyTorch does around the allocator.
#[derive(Debug, Default)]
pub(super) struct SimCaptures {
    /// (device, stream) -> capture id.
    active: Mutex<HashMap<(usize, StreamId), u64>>,
    next_id: AtomicU64,
    /// Synchronisations refused because they would have waited on a capture.
    refused_syncs: AtomicU64,
    /// Synchronisations done (each would have stalled the host on a GPU).
    syncs: AtomicU64,
}

/// Fences recorded and not yet seen passed. Simulated work finishes as it is queued, so a
/// fence passes at once, unless a test holds them ([`SimBackend::hold_fences`]) to play a
/// stream still busy. Held work still runs in stream order: waiting for a fence, or for a
/// stream, finishes everything queued on that stream before it, as on a GPU; with a lag
/// ([`SimBackend::set_gpu_lag`]) the work before a fence also finishes by itself once that
/// many more fences have been recorded on its stream.
#[derive(Debug, Default)]
pub(super) struct SimFences {
    /// (device, fence) -> its stream, its place among that stream's fences, and whether the
    /// work before it has finished.
    outstanding: Mutex<HashMap<(usize, u64), OutstandingFence>>,
    /// (device, stream) -> fences recorded on it so far.
    recorded: Mutex<HashMap<(usize, StreamId), u64>>,
    next: AtomicU64,
    held: AtomicBool,
    /// While held, how many later fences on its stream finish a fence's work (0: none do).
    lag_fences: AtomicU64,
    /// How long a wait for held work takes, in nanoseconds ([`SimBackend::set_gpu_backlog`]).
    backlog_ns: AtomicU64,
    /// Fences waited for (`wait_fence`).
    waits: AtomicU64,
}

#[derive(Clone, Copy, Debug)]
struct OutstandingFence {
    stream: StreamId,
    /// 1 for the first fence recorded on `stream`, and so on.
    place: u64,
    finished: bool,
}

impl SimBackend {
    /// Synchronisations done so far: on a GPU, each stalls the calling thread until the stream
    /// drains, and the stream then idles until the host queues more.
    pub fn syncs(&self) -> u64 {
        self.captures.syncs.load(Ordering::Relaxed)
    }

    /// While held, no fence passes (but those a lag has finished, [`SimBackend::set_gpu_lag`])
    /// and every stream is busy, as a GPU still running a long kernel.
    pub fn hold_fences(&self, held: bool) {
        self.fences.held.store(held, Ordering::Relaxed);
    }

    /// While fences are held, the GPU runs `fences` fences behind the host on every stream: a
    /// fence passes once that many more have been recorded on its stream, as on a GPU whose
    /// queue stays that deep. 0 (the default) leaves held work unfinished until waited for.
    pub fn set_gpu_lag(&self, fences: u64) {
        self.fences.lag_fences.store(fences, Ordering::Relaxed);
    }

    /// How long a wait for held work takes (none by default): how far the GPU lags behind a
    /// host that ran ahead of it, as a deep queue of long kernels does.
    pub fn set_gpu_backlog(&self, backlog: std::time::Duration) {
        let ns = u64::try_from(backlog.as_nanos()).unwrap_or(u64::MAX);
        self.fences.backlog_ns.store(ns, Ordering::Relaxed);
    }

    /// A wait has finished the work queued on `stream` (every stream: [`StreamId::ANY`]) up to
    /// fence `upto`: the fences before it have passed, whatever is held.
    fn finish_queued(&self, device: usize, stream: StreamId, upto: u64) {
        for (&(d, fence), queued) in self.fences.outstanding.lock().iter_mut() {
            if d == device && fence <= upto && (queued.stream == stream || stream == StreamId::ANY)
            {
                queued.finished = true;
            }
        }
    }

    /// Waits out the backlog if work is held: the held work finishes during the wait.
    fn wait_out_backlog(&self) {
        if self.fences.held.load(Ordering::Relaxed) {
            let ns = self.fences.backlog_ns.load(Ordering::Relaxed);
            std::thread::sleep(std::time::Duration::from_nanos(ns));
        }
    }

    /// Fences waited for so far.
    pub fn fence_waits(&self) -> u64 {
        self.fences.waits.load(Ordering::Relaxed)
    }

    /// Fences recorded and not yet seen passed.
    pub fn outstanding_fences(&self) -> usize {
        self.fences.outstanding.lock().len()
    }

    /// `stream` starts capturing a CUDA graph (as `cuStreamBeginCapture`); returns the
    /// capture's id. An error when it is capturing already.
    pub fn begin_capture(&self, device: usize, stream: StreamId) -> Result<u64, BackendError> {
        self.device(device)?;
        let mut active = self.captures.active.lock();
        if active.contains_key(&(device, stream)) {
            return Err(BackendError::InvalidArgument {
                call: "begin_capture",
                reason: format!("stream {:#x} is capturing already", stream.0),
            });
        }
        let id = self.captures.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        active.insert((device, stream), id);
        Ok(id)
    }

    /// `stream` stops capturing (as `cuStreamEndCapture`). An error when it was not capturing.
    pub fn end_capture(&self, device: usize, stream: StreamId) -> Result<(), BackendError> {
        match self.captures.active.lock().remove(&(device, stream)) {
            Some(_) => Ok(()),
            None => Err(BackendError::InvalidArgument {
                call: "end_capture",
                reason: format!("stream {:#x} is not capturing", stream.0),
            }),
        }
    }

    /// How many synchronisations were refused because they would have waited on a capture: on
    /// CUDA each would have been an error, and without the backend's check, a broken capture.
    pub fn refused_syncs(&self) -> u64 {
        self.captures.refused_syncs.load(Ordering::Relaxed)
    }
}

/// Each call under the trait's own name, as in the CUDA backend.
impl StreamOrder for SimBackend {
    fn synchronize_stream(&self, device: usize, stream: StreamId) -> Result<(), BackendError> {
        // Simulated work completes as it is queued, so there is never anything to wait for,
        // except on a capturing stream, whose work runs only when the graph is replayed.
        self.device(device)?;
        let waits_on_capture = self
            .captures
            .active
            .lock()
            .keys()
            .any(|&(d, s)| d == device && (s == stream || stream == StreamId::ANY));
        if waits_on_capture {
            self.captures.refused_syncs.fetch_add(1, Ordering::Relaxed);
            return Err(BackendError::StreamCapturing {
                device,
                stream: stream.0,
            });
        }
        self.captures.syncs.fetch_add(1, Ordering::Relaxed);
        self.finish_queued(device, stream, u64::MAX);
        self.wait_out_backlog();
        spend(self.costs.sync());
        Ok(())
    }

    fn stream_idle(&self, device: usize, stream: StreamId) -> Result<bool, BackendError> {
        let capturing = self.capture_on(device, stream)?.is_some();
        let busy = self.fences.held.load(Ordering::Relaxed);
        Ok(!capturing && !busy && stream != StreamId::ANY)
    }

    fn record_fence(&self, device: usize, stream: StreamId) -> Result<Fence, BackendError> {
        self.device(device)?;
        if self.capture_on(device, stream)?.is_some() {
            return Err(BackendError::StreamCapturing {
                device,
                stream: stream.0,
            });
        }
        let fence = self.fences.next.fetch_add(1, Ordering::Relaxed) + 1;
        let place = {
            let mut recorded = self.fences.recorded.lock();
            let count = recorded.entry((device, stream)).or_insert(0);
            *count += 1;
            *count
        };
        let mut outstanding = self.fences.outstanding.lock();
        outstanding.insert(
            (device, fence),
            OutstandingFence {
                stream,
                place,
                finished: false,
            },
        );
        let lag = self.fences.lag_fences.load(Ordering::Relaxed);
        if lag > 0 {
            // The GPU keeps `lag` fences behind: the work before this stream's fence `lag`
            // places back has run.
            for (&(d, _), queued) in outstanding.iter_mut() {
                if d == device && queued.stream == stream && queued.place + lag <= place {
                    queued.finished = true;
                }
            }
        }
        drop(outstanding);
        spend(self.costs.fence());
        Ok(Fence(fence))
    }

    fn fence_passed(&self, device: usize, fence: Fence) -> Result<bool, BackendError> {
        self.device(device)?;
        let mut outstanding = self.fences.outstanding.lock();
        let Some(&OutstandingFence { finished, .. }) = outstanding.get(&(device, fence.0)) else {
            return Err(BackendError::InvalidArgument {
                call: "fence_passed",
                reason: format!("fence {} of device {device} is unknown or passed", fence.0),
            });
        };
        if !finished && self.fences.held.load(Ordering::Relaxed) {
            return Ok(false);
        }
        outstanding.remove(&(device, fence.0));
        Ok(true)
    }

    fn wait_fence(&self, device: usize, fence: Fence) -> Result<(), BackendError> {
        self.device(device)?;
        // Waiting makes held work finish, as `synchronize_stream` does: simulated work is
        // only ever held back from queries, never from a wait.
        let Some(OutstandingFence { stream, .. }) =
            self.fences.outstanding.lock().remove(&(device, fence.0))
        else {
            return Err(BackendError::InvalidArgument {
                call: "wait_fence",
                reason: format!("fence {} of device {device} is unknown or passed", fence.0),
            });
        };
        self.finish_queued(device, stream, fence.0);
        self.fences.waits.fetch_add(1, Ordering::Relaxed);
        self.wait_out_backlog();
        spend(self.costs.sync());
        Ok(())
    }

    fn capture_of(&self, device: usize, stream: StreamId) -> Result<Option<u64>, BackendError> {
        self.capture_on(device, stream)
    }
}

impl SimBackend {
    pub(super) fn capture_on(
        &self,
        device: usize,
        stream: StreamId,
    ) -> Result<Option<u64>, BackendError> {
        self.device(device)?;
        Ok(self.captures.active.lock().get(&(device, stream)).copied())
    }
}
