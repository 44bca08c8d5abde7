//! A per-thread stash of pool handles. Every pooled buffer holds an `Arc<Pool>` so that it
//! can outlive its manager; cloning and dropping that handle per allocation would be two
//! atomic read-modify-writes on the hot path. A buffer's free instead parks its handle here
//! and the thread's next allocation from the same pool takes it back: no shared write.
//!
//! A parked handle may outlive its manager. It then keeps only the pool's shell: the manager
//! retires its pools when it is dropped, which releases their memory and backend (see
//! `Pool::retire`), and retired handles are not parked.

use crate::pool::Pool;
use std::cell::RefCell;
use std::sync::Arc;

/// Handles parked per thread: enough for a few pools in flight without a search that costs.
const CAPACITY: usize = 8;

thread_local! {
    static PARKED: RefCell<Vec<Arc<Pool>>> = const { RefCell::new(Vec::new()) };
}

/// A handle to `pool`: a parked one if this thread has one, else a new clone.
#[inline]
pub(super) fn take(pool: &Arc<Pool>) -> Arc<Pool> {
    let parked = PARKED.try_with(|parked| {
        let mut parked = parked.borrow_mut();
        let at = parked.iter().rposition(|p| Arc::ptr_eq(p, pool))?;
        Some(parked.swap_remove(at))
    });
    match parked {
        Ok(Some(handle)) => handle,
        _ => Arc::clone(pool),
    }
}

/// Parks a handle whose buffer was freed, making room by dropping the oldest parked one. A
/// handle to a retired pool, or freed while the thread exits, is dropped instead.
#[inline]
pub(super) fn park(handle: Arc<Pool>) {
    if handle.is_retired() {
        return;
    }
    let _ = PARKED.try_with(|parked| {
        let mut parked = parked.borrow_mut();
        if parked.len() == CAPACITY {
            parked.remove(0);
        }
        parked.push(handle);
    });
}
