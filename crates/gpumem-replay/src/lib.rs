//! Allocation traces and their replay: the [`trace`] format (one event per line, gzip or plain;
//! `benches/traces/README.md`) and [`replay`], which runs a trace through a memory manager and
//! reports waste, driver calls, hit ratio and time per operation.

pub mod replay;
pub mod trace;
