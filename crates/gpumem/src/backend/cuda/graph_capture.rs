//! CUDA graph capture as the backend meets it: which capture a stream takes part in, waiting on
//! streams without breaking a capture, and the thread's capture mode relaxed around the
//! virtual-memory calls, which a capture in PyTorch's default ("global") mode would otherwise
//! forbid on every thread of the process.

use super::{check, stream_handle, CudaBackend};
use crate::backend::StreamId;
use crate::error::BackendError;
use cudarc::driver::sys::{
    self, CUgraph, CUgraphNode, CUresult, CUstream, CUstreamCaptureMode, CUstreamCaptureStatus,
};
use std::sync::OnceLock;

/// `cuStreamGetCaptureInfo` in whichever form the driver exports: its ABI changed twice, and
/// drivers drop the oldest forms. Each takes the stream, status and id first; the later
/// outputs are optional and passed as null.
#[derive(Clone, Copy)]
enum CaptureInfoCall {
    V3(
        unsafe extern "C" fn(
            CUstream,
            *mut CUstreamCaptureStatus,
            *mut u64,
            *mut CUgraph,
            *mut *const CUgraphNode,
            *mut *const sys::CUgraphEdgeData,
            *mut usize,
        ) -> CUresult,
    ),
    V2(
        unsafe extern "C" fn(
            CUstream,
            *mut CUstreamCaptureStatus,
            *mut u64,
            *mut CUgraph,
            *mut *const CUgraphNode,
            *mut usize,
        ) -> CUresult,
    ),
    V1(unsafe extern "C" fn(CUstream, *mut CUstreamCaptureStatus, *mut u64) -> CUresult),
}

type ExchangeMode = unsafe extern "C" fn(*mut CUstreamCaptureMode) -> CUresult;

impl CudaBackend {
    fn capture_info_call(&self) -> Result<CaptureInfoCall, BackendError> {
        static CALL: OnceLock<Option<CaptureInfoCall>> = OnceLock::new();
        let library = self.library();
        let found = CALL.get_or_init(|| {
            // SAFETY: each symbol is looked up with the signature its CUDA version declares
            // (cuda.h 12.3+ for _v3, 11.3+ for _v2, 10.1+ for the first form).
            unsafe {
                library
                    .get(b"cuStreamGetCaptureInfo_v3\0")
                    .map(|f| CaptureInfoCall::V3(*f))
                    .or_else(|_| {
                        library
                            .get(b"cuStreamGetCaptureInfo_v2\0")
                            .map(|f| CaptureInfoCall::V2(*f))
                    })
                    .or_else(|_| {
                        library
                            .get(b"cuStreamGetCaptureInfo\0")
                            .map(|f| CaptureInfoCall::V1(*f))
                    })
                    .ok()
            }
        });
        found.ok_or_else(|| BackendError::DriverUnavailable {
            reason: "the driver lacks cuStreamGetCaptureInfo".to_string(),
        })
    }

    /// The capture `stream` takes part in, if any. An error means the driver refused to say,
    /// which it does for the legacy default stream while another stream captures in global
    /// mode: callers must not allocate for it then.
    pub(super) fn capture_id(
        &self,
        device: usize,
        stream: StreamId,
    ) -> Result<Option<u64>, BackendError> {
        let call = self.capture_info_call()?;
        // The driver answers only with a context current, which a host thread may not have yet.
        self.make_current(device)?;
        let raw = stream_handle("capture_of", stream)?;
        let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let mut id = 0u64;
        use std::ptr::null_mut as null;
        // SAFETY: status and id are valid out-pointers and the optional outputs are null, which
        // every form accepts; the handle comes from the host, which created it in the current
        // context (or is 0, the legacy stream); the driver only reads it.
        let result = unsafe {
            match call {
                CaptureInfoCall::V3(f) => {
                    f(raw, &mut status, &mut id, null(), null(), null(), null())
                }
                CaptureInfoCall::V2(f) => f(raw, &mut status, &mut id, null(), null(), null()),
                CaptureInfoCall::V1(f) => f(raw, &mut status, &mut id),
            }
        };
        check("cuStreamGetCaptureInfo", result)?;
        Ok(match status {
            CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => None,
            _ => Some(id),
        })
    }

    /// Waits for `stream` (`StreamId::ANY`: the whole device); refuses a capturing stream
    /// instead of calling the driver, whose synchronisation would invalidate the capture.
    pub(super) fn wait_for(&self, device: usize, stream: StreamId) -> Result<(), BackendError> {
        self.make_current(device)?;
        if stream == StreamId::ANY {
            // SAFETY: a context for `device` is current; the call takes no arguments.
            return self.relaxed(|| check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() }));
        }
        if self.capture_id(device, stream)?.is_some() {
            return Err(BackendError::StreamCapturing {
                device,
                stream: stream.0,
            });
        }
        let raw = stream_handle("synchronize_stream", stream)?;
        // SAFETY: the caller hands us a CUstream it created in this device's context (or 0, the
        // legacy default stream, which the null handle denotes); the driver only reads the handle.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(raw)
        })
    }

    /// Runs `f` with this thread's capture mode relaxed, then restores it. While any thread
    /// captures a graph in global mode, the driver refuses "potentially unsafe" calls on every
    /// thread and breaks that capture; creating, mapping and unmapping pages are among them,
    /// yet none of them touches a stream, so a capture loses nothing by allowing them here
    /// (PyTorch's own allocator relaxes the mode around `cudaMalloc` the same way).
    pub(super) fn relaxed<R>(&self, f: impl FnOnce() -> R) -> R {
        static EXCHANGE: OnceLock<Option<ExchangeMode>> = OnceLock::new();
        let library = self.library();
        let exchange = EXCHANGE.get_or_init(|| {
            // SAFETY: looked up with the signature cuda.h declares (CUDA 10.1+).
            unsafe { library.get::<ExchangeMode>(b"cuThreadExchangeStreamCaptureMode\0") }
                .map(|f| *f)
                .ok()
        });
        let Some(exchange) = *exchange else {
            return f();
        };
        let mut mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: `mode` is a valid in/out pointer; the call swaps the thread's mode with it.
        let swapped = unsafe { exchange(&mut mode) } == CUresult::CUDA_SUCCESS;
        let result = f();
        if swapped {
            // SAFETY: as above; `mode` now holds the thread's previous mode, put back.
            unsafe { exchange(&mut mode) };
        }
        result
    }
}
