//! Per-thread numbers for the allocation path: the shard a thread's requests go to and the
//! allocation ids it hands out, both without a shared counter after the thread's first request.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Each thread gets a small number once: it picks the thread's shard and prefixes its
/// allocation ids, so neither needs a shared counter on the hot path.
static NEXT_THREAD_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The thread's next allocation id: its slot in the top 24 bits, a counter below. Zero
    /// means "no slot yet".
    static NEXT_ID: Cell<u64> = const { Cell::new(0) };
}

/// The calling thread's slot and a process-unique allocation id.
#[inline]
pub(super) fn next_allocation_id() -> (usize, u64) {
    NEXT_ID.with(|next| {
        let mut id = next.get();
        if id == 0 {
            let slot = NEXT_THREAD_SLOT.fetch_add(1, Relaxed) as u64 + 1;
            id = slot << 40;
        }
        next.set(id + 1);
        (((id >> 40) - 1) as usize, id)
    })
}

/// The calling thread's slot, once it has allocated (else 0).
pub(super) fn current_thread_slot() -> usize {
    NEXT_ID.with(|next| ((next.get() >> 40).max(1) - 1) as usize)
}
