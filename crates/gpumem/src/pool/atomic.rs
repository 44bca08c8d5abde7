//! The atomic integer behind the lock-free statistics ([`PoolCounters`](super::PoolCounters),
//! [`DeviceReserve`](super::DeviceReserve)): std's, or loom's when the crate is built with
//! `RUSTFLAGS="--cfg gpumem_loom"` for the model check in `tests/it/reliability/model_check.rs`.

#[cfg(gpumem_loom)]
pub(super) use loom::sync::atomic::AtomicU64;
#[cfg(not(gpumem_loom))]
pub(super) use std::sync::atomic::AtomicU64;
