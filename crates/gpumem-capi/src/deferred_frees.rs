//! Memory a host used on streams other than its own (PyTorch's `Tensor.record_stream`, which
//! the Python package forwards): when freed, a fence is recorded on each of those streams and
//! the memory goes back to its pool only once all have passed. Until then it waits here; every
//! allocation and free looks at what waits, which costs one atomic read when nothing does.

use super::live::LiveBuffer;
use super::runtime::Runtime;
use gpumem::backend::Fence;
use gpumem::manager::DeviceBuffer;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

#[derive(Default)]
pub(super) struct DeferredFrees {
    waiting: Mutex<Vec<Waiting>>,
    count: AtomicUsize,
}

struct Waiting {
    buffer: DeviceBuffer,
    /// Fences not yet seen passed.
    fences: Vec<Fence>,
}

impl DeferredFrees {
    /// Buffers whose memory waits for other streams.
    pub(super) fn len(&self) -> usize {
        self.count.load(Relaxed)
    }
}

impl Runtime {
    /// Frees `live` now when no other stream used it; else once the work queued so far on
    /// those streams has run. Memory used on a stream that is capturing a graph cannot be
    /// fenced: it is kept until the process ends, and the error says so.
    pub(super) fn free_when_streams_done(&self, live: LiveBuffer) -> Result<(), String> {
        let LiveBuffer { buffer, used_on } = live;
        if used_on.is_empty() {
            return buffer.free().map_err(|e| e.to_string());
        }
        let backend = self.manager.backend();
        let device = buffer.device();
        // Every stream is checked before any fence is recorded, so that a refusal leaves no
        // event behind that nobody would ever query (and destroy).
        let unfenceable =
            used_on
                .iter()
                .find_map(|&stream| match backend.capture_of(device, stream) {
                    Ok(None) => None,
                    Ok(Some(_)) => Some((stream, "it is capturing a CUDA graph".to_string())),
                    Err(why) => Some((stream, why.to_string())),
                });
        let mut fences = Vec::with_capacity(used_on.len());
        let refused = match unfenceable {
            Some(refusal) => Some(refusal),
            None => used_on
                .iter()
                .find_map(|&stream| match backend.record_fence(device, stream) {
                    Ok(fence) => {
                        fences.push(fence);
                        None
                    }
                    Err(why) => Some((stream, why.to_string())),
                }),
        };
        if let Some((stream, why)) = refused {
            let ptr = buffer.ptr();
            // Dropping the buffer would free it for reuse while `stream` may use it.
            std::mem::forget(buffer);
            return Err(format!(
                "{ptr:#x} was used on stream {:#x}, whose work cannot be waited for ({why}); \
                 its memory is kept until the process ends",
                stream.0
            ));
        }
        let mut waiting = self.deferred.waiting.lock();
        waiting.push(Waiting { buffer, fences });
        self.deferred.count.store(waiting.len(), Relaxed);
        Ok(())
    }

    /// Frees the waiting buffers whose fences have all passed.
    pub(super) fn free_what_streams_finished(&self) {
        if self.deferred.len() == 0 {
            return;
        }
        let backend = self.manager.backend();
        let mut ready = Vec::new();
        {
            let mut waiting = self.deferred.waiting.lock();
            let mut index = 0;
            while index < waiting.len() {
                let entry = &mut waiting[index];
                let device = entry.buffer.device();
                entry
                    .fences
                    .retain(|&fence| match backend.fence_passed(device, fence) {
                        Ok(passed) => !passed,
                        Err(why) => {
                            // The fence is gone either way; a failed query means the device is in
                            // error, and holding the memory back would help nobody.
                            super::record_error(
                                "gpumem_free",
                                &format!("fence query failed: {why}"),
                            );
                            false
                        }
                    });
                if entry.fences.is_empty() {
                    ready.push(waiting.swap_remove(index).buffer);
                } else {
                    index += 1;
                }
            }
            self.deferred.count.store(waiting.len(), Relaxed);
        }
        // Freed outside the lock: a free may call the driver.
        for buffer in ready {
            if let Err(why) = buffer.free() {
                super::record_error("gpumem_free", &why.to_string());
            }
        }
    }
}
