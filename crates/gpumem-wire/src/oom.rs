//! One out-of-memory refusal, as snapshots and flight records carry it.

use serde::{Deserialize, Serialize};

/// One refused allocation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OomEvent {
    /// The device's OOM count including this one (`gpumem_ooms_total` right after it), so a
    /// reader can tell which refusals it has already seen.
    pub seq: u64,
    /// When it happened, in seconds since the Unix epoch.
    pub timestamp_seconds: f64,
    pub requested_bytes: u64,
    /// The allocation's tag; `None` for untagged requests.
    pub tag: Option<String>,
    /// The pool that refused (`small`, `large`, `direct`).
    pub pool: String,
    /// Why: `out_of_memory` (the driver), `pool_limit` (the configured cap) or
    /// `pressure_critical` (the minimum kept free at critical pressure).
    pub kind: String,
    /// The error as the caller got it, with the numbers at that moment.
    pub message: String,
}
