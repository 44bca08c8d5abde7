//! [`StreamOrder`] on CUDA: fences as CUDA events, and whether a stream has work left (waiting
//! for a stream and a graph capture's id are `graph_capture`'s, called from here). One event recorded on a stream
//! marks the work queued so far, and a query says whether that work has run. Events are created
//! per fence and destroyed once it has passed (or its query failed): the backend holds events
//! only for fences still outstanding. Pools record and query fences as their pages go idle,
//! from whatever thread frees, so every fence and query here runs with the thread's capture mode relaxed:
//! a CUDA graph captured in global mode on another thread would otherwise count them as unsafe
//! and end its capture (none of them touches a capturing stream).

use super::{check, stream_handle, CudaBackend};
use crate::backend::{Fence, StreamId, StreamOrder};
use crate::error::BackendError;
use cudarc::driver::sys::{self, CUevent, CUevent_flags, CUresult};

/// Each call under the trait's own name, so a fence is recorded, queried and waited for under
/// one name in every backend.
impl StreamOrder for CudaBackend {
    fn synchronize_stream(&self, device: usize, stream: StreamId) -> Result<(), BackendError> {
        self.wait_for(device, stream)
    }

    fn capture_of(&self, device: usize, stream: StreamId) -> Result<Option<u64>, BackendError> {
        self.capture_id(device, stream)
    }

    fn record_fence(&self, device: usize, stream: StreamId) -> Result<Fence, BackendError> {
        self.make_current(device)?;
        if self.capture_id(device, stream)?.is_some() {
            // Recorded on a capturing stream, the event would become a node of the graph and
            // mark nothing that runs now.
            return Err(BackendError::StreamCapturing {
                device,
                stream: stream.0,
            });
        }
        let raw = stream_handle("record_fence", stream)?;
        let mut event: CUevent = std::ptr::null_mut();
        let flags = CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        let created = self.relaxed(|| {
            // SAFETY: valid out-pointer; a context for `device` is current.
            unsafe { sys::cuEventCreate(&mut event, flags) }
        });
        check("cuEventCreate", created)?;
        let recorded = self.relaxed(|| {
            // SAFETY: `event` was just created in the current context; the stream handle comes
            // from the host, which created it in that context (or is 0, the legacy stream).
            unsafe { sys::cuEventRecord(event, raw) }
        });
        let recorded = check("cuEventRecord", recorded);
        if let Err(error) = recorded {
            // SAFETY: created above and never handed out.
            unsafe { sys::cuEventDestroy_v2(event) };
            return Err(error);
        }
        Ok(Fence(event as u64))
    }

    fn stream_idle(&self, device: usize, stream: StreamId) -> Result<bool, BackendError> {
        if stream == StreamId::ANY || self.capture_id(device, stream)?.is_some() {
            return Ok(false);
        }
        let raw = stream_handle("stream_idle", stream)?;
        // SAFETY: the handle comes from the host, which created it in this device's context
        // (made current by `capture_id`), or is 0, the legacy stream; the driver only reads it.
        match self.relaxed(|| unsafe { sys::cuStreamQuery(raw) }) {
            CUresult::CUDA_SUCCESS => Ok(true),
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => check("cuStreamQuery", other).map(|()| false),
        }
    }

    fn fence_passed(&self, device: usize, fence: Fence) -> Result<bool, BackendError> {
        self.make_current(device)?;
        let event = fence.0 as CUevent;
        // SAFETY: `fence` came from `record_fence` and has not passed yet (the trait's
        // contract), so the event is alive.
        let status = self.relaxed(|| unsafe { sys::cuEventQuery(event) });
        if status == CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        // SAFETY: as above; after this the fence is gone and never queried again.
        unsafe { sys::cuEventDestroy_v2(event) };
        check("cuEventQuery", status).map(|()| true)
    }

    fn wait_fence(&self, device: usize, fence: Fence) -> Result<(), BackendError> {
        self.make_current(device)?;
        let event = fence.0 as CUevent;
        // SAFETY: `fence` came from `record_fence` and has not passed yet (the trait's
        // contract), so the event is alive; waiting only reads it.
        let status = self.relaxed(|| unsafe { sys::cuEventSynchronize(event) });
        // SAFETY: as above; after this the fence is gone and never used again.
        unsafe { sys::cuEventDestroy_v2(event) };
        check("cuEventSynchronize", status)
    }
}
