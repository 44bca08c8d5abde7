//! The tag each allocation through the C ABI gets: the calling thread's own
//! (`gpumem_set_tag`), else the process-wide default (`gpumem_set_default_tag`; PyTorch runs
//! the backward pass on threads of its own, which a thread's tag cannot reach).
//!
//! Each thread keeps its allocation options with the tag already in them and only changes the
//! stream and graph pool per call, so an allocation clones no `Tag`: a clone updates a counter
//! that every thread tagging with that name shares, which on many threads costs more than the
//! allocation. A thread notices a new default by a version number it reads (no write).

use gpumem::manager::AllocOptions;
use gpumem::Tag;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

/// The default tag, and its version (bumped at every change; threads start at 0, "not seen").
static DEFAULT: parking_lot::RwLock<Option<Tag>> = parking_lot::RwLock::new(None);
static DEFAULT_VERSION: AtomicU64 = AtomicU64::new(1);

/// One thread's options; `options.tag` is its own tag when `own`, else its copy of the default
/// as of `seen_default`.
struct ThreadOptions {
    own: bool,
    seen_default: u64,
    options: AllocOptions,
}

impl Drop for ThreadOptions {
    /// In a forked child the thread's tag is left as it is: its name may be the last use of a
    /// table entry, whose release would take a lock a thread of the parent may have held at the
    /// fork (a child that leaves through `exit` runs this).
    fn drop(&mut self) {
        if super::fork::in_forked_child() {
            std::mem::forget(self.options.tag.take());
        }
    }
}

thread_local! {
    static THREAD: RefCell<ThreadOptions> = RefCell::new(ThreadOptions {
        own: false,
        seen_default: 0,
        options: AllocOptions::default(),
    });
}

/// Sets this thread's own tag (`None`: back to the default). Holding the handle keeps the name;
/// replacing it lets the old name go once its allocations are freed.
pub(super) fn set_own(tag: Option<Tag>) {
    THREAD.with(|thread| {
        let mut thread = thread.borrow_mut();
        thread.own = tag.is_some();
        thread.options.tag = tag;
        thread.seen_default = 0;
    });
}

/// Sets the default tag of threads without their own.
pub(super) fn set_default(tag: Option<Tag>) {
    *DEFAULT.write() = tag;
    DEFAULT_VERSION.fetch_add(1, Ordering::Release);
}

/// Runs `allocate` with this thread's options, its tag up to date (the caller sets the rest).
pub(super) fn with_options<R>(allocate: impl FnOnce(&mut AllocOptions) -> R) -> R {
    THREAD.with(|thread| {
        let mut thread = thread.borrow_mut();
        if !thread.own {
            let version = DEFAULT_VERSION.load(Ordering::Acquire);
            if version != thread.seen_default {
                thread.options.tag = DEFAULT.read().clone();
                thread.seen_default = version;
            }
        }
        allocate(&mut thread.options)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn current() -> Option<String> {
        with_options(|options| options.tag.as_ref().map(Tag::name))
    }

    #[test]
    fn a_thread_uses_its_own_tag_else_the_latest_default() {
        set_default(Some(Tag::new("capi_test_default")));
        assert_eq!(current().as_deref(), Some("capi_test_default"));
        set_own(Some(Tag::new("capi_test_own")));
        assert_eq!(current().as_deref(), Some("capi_test_own"));
        let elsewhere = std::thread::spawn(current).join().expect("thread");
        assert_eq!(elsewhere.as_deref(), Some("capi_test_default"));
        set_own(None);
        set_default(Some(Tag::new("capi_test_default_2")));
        assert_eq!(current().as_deref(), Some("capi_test_default_2"));
        set_default(None);
        assert_eq!(current(), None);
    }
}
