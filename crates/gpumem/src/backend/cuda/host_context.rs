//! Living inside a host that drives CUDA itself (PyTorch, through the C ABI of `crates/gpumem-capi`): leave the
//! calling thread's current context as the host set it. The driver call this needs is one the
//! rest of the backend does not, so its symbol is checked when first used instead of at `open`.

use super::{check, CudaBackend};
use crate::error::BackendError;
use cudarc::driver::sys::{self, CUcontext};
use std::cell::Cell;
use std::sync::OnceLock;

const HOST_CONTEXT_SYMBOLS: [&str; 1] = ["cuCtxGetCurrent"];

thread_local! {
    /// How many `keeping_current_context` scopes are open on this thread.
    static SCOPE_DEPTH: Cell<u32> = const { Cell::new(0) };
    /// The context that was current before the backend first switched inside the open scope
    /// (`Some(null)` when none was), to be made current again when the scope closes.
    static SWITCHED_FROM: Cell<Option<usize>> = const { Cell::new(None) };
}

impl CudaBackend {
    /// Checks once whether the driver has the calls of this module.
    fn host_context_calls(&self) -> Result<(), BackendError> {
        static PRESENT: OnceLock<Result<(), String>> = OnceLock::new();
        let present = PRESENT.get_or_init(|| {
            for symbol in HOST_CONTEXT_SYMBOLS {
                // SAFETY: looking a symbol up only reads the library's symbol table; the pointer
                // is discarded, never called.
                if unsafe { self.library().get::<*const ()>(symbol) }.is_err() {
                    return Err(format!("the driver lacks {symbol}"));
                }
            }
            Ok(())
        });
        present
            .clone()
            .map_err(|reason| BackendError::DriverUnavailable { reason })
    }

    /// Runs `f` and then, if the backend switched the thread's current context inside it (to
    /// reach another device's memory), makes the host's context current again: a host such as
    /// the CUDA runtime reads "the current device" from it. A pool hit calls no driver at all, so
    /// this costs two thread-local reads unless the driver was really called.
    pub fn keeping_current_context<R>(&self, f: impl FnOnce() -> R) -> R {
        if self.host_context_calls().is_err() {
            return f();
        }
        SCOPE_DEPTH.with(|depth| depth.set(depth.get() + 1));
        let result = f();
        let outermost = SCOPE_DEPTH.with(|depth| {
            depth.set(depth.get() - 1);
            depth.get() == 0
        });
        if outermost {
            if let Some(previous) = SWITCHED_FROM.with(Cell::take) {
                // SAFETY: `previous` was the thread's current context a moment ago (or null, which
                // unbinds); the host owns it and has not destroyed it while its own call runs.
                let restored = unsafe { sys::cuCtxSetCurrent(previous as CUcontext) };
                if let Err(err) = check("cuCtxSetCurrent", restored) {
                    tracing::warn!(%err, "could not make the host's CUDA context current again");
                }
            }
        }
        result
    }

    /// Inside a [`keeping_current_context`](Self::keeping_current_context) scope: whether
    /// `target` is already current (then nothing needs setting), remembering what was current
    /// before the first switch. Outside a scope: `false`, the backend sets its context as always.
    pub(super) fn already_current(&self, target: CUcontext) -> bool {
        if SCOPE_DEPTH.with(Cell::get) == 0 {
            return false;
        }
        let mut current: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the symbol was checked when the scope opened.
        if check("cuCtxGetCurrent", unsafe {
            sys::cuCtxGetCurrent(&mut current)
        })
        .is_err()
        {
            return false;
        }
        if current == target {
            return true;
        }
        if current.is_null() {
            // A thread of the host with no context yet (PyTorch's autograd threads, before their
            // first runtime call): binding the device's primary context is what the runtime
            // would do itself on that call, so it stays bound.
            return false;
        }
        SWITCHED_FROM.with(|from| {
            if from.get().is_none() {
                from.set(Some(current as usize));
            }
        });
        false
    }
}

impl crate::backend::HostContext for CudaBackend {
    fn keep_current_context(&self, f: &mut dyn FnMut()) {
        self.keeping_current_context(f)
    }
}
