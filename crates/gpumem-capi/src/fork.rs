//! Children forked from a process that uses the library (PyTorch's data-loader workers fork
//! the training process). Only the forking thread lives on in a child, and every lock another
//! thread held at that moment stays held there for good; the driver's context does not survive
//! a fork either, so the parent's memory cannot be used or given back from the child.
//!
//! The rule: once a process has called the library (its first call registers the handler
//! below), a child of it takes none of the library's locks and never calls the driver. Its
//! frees are ignored (the memory is the parent's), tags and `gpumem_empty_cache` do nothing,
//! and every other call that needs the manager (allocations, statistics, snapshots, the
//! exporter) fails at once with [`IN_FORKED_CHILD`] through
//! `gpumem_last_error`. A process forked before its parent's first call is not a child in this
//! sense: it opens a manager of its own, as PyTorch lets a child use CUDA if its parent had not.

use std::sync::atomic::{AtomicBool, Ordering};

/// Why a forked child cannot allocate (what PyTorch says in the same place, adapted).
pub(super) const IN_FORKED_CHILD: &str =
    "CUDA cannot be used in a forked child of a process that has used gpumem (the driver's \
     context does not survive fork); allocate GPU memory in the parent, or start workers with \
     the 'spawn' method (multiprocessing.set_start_method(\"spawn\"), DataLoader's \
     multiprocessing_context=\"spawn\"); frees of the parent's memory are ignored here";

/// Set in a child by the handler below; never cleared (a child's children are children too).
static FORKED: AtomicBool = AtomicBool::new(false);
/// A handler is registered.
static WATCHING: AtomicBool = AtomicBool::new(false);

/// Whether this process is a fork of one that had called the library.
#[inline]
pub(super) fn in_forked_child() -> bool {
    FORKED.load(Ordering::Relaxed)
}

/// Runs in the child, on the forking thread, right after `fork` returns there: only an atomic
/// store, which is safe whatever state the parent's threads left behind.
extern "C" fn mark_child() {
    FORKED.store(true, Ordering::Relaxed);
}

/// Makes sure a child of this process will know it is one. Called first by every entry point
/// (one load once done), before the manager is opened or any of its locks taken. Never
/// blocks: threads arriving together may each register the handler (running it twice is
/// harmless), but none goes on before one of them has registered it, so a fork while any
/// thread is inside the library marks the child.
#[inline]
pub(super) fn watch() {
    if WATCHING.load(Ordering::Acquire) {
        return;
    }
    // SAFETY: `mark_child` is an `extern "C" fn()` that lives as long as the process (the library
    // is never unloaded while its code may run, and PyTorch never unloads its allocator); the
    // other two handlers are none.
    let registered = unsafe { libc::pthread_atfork(None, None, Some(mark_child)) };
    if registered == 0 {
        WATCHING.store(true, Ordering::Release);
    } else {
        // Out of memory for the handler list (its only failure): the child would not know.
        super::record_error(
            "gpumem",
            "could not register a fork handler: a forked child may block in the library",
        );
    }
}

/// Writes `line` to stderr with one system call, taking no lock: in a child, a thread of the
/// parent may have held the standard library's stderr lock at the fork.
pub(super) fn print_unlocked(line: &str) {
    let text = format!("{line}\n");
    // SAFETY: the pointer and length describe `text`, alive for the call; fd 2 is stderr (a
    // closed one only makes the call fail, which is ignored as `eprintln!` would lose it too).
    unsafe { libc::write(2, text.as_ptr().cast(), text.len()) };
}
