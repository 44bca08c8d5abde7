//! The integration test binary: one crate, one module per area.

mod allocator;
mod backend_contract;
mod browser;
mod cli;
mod cuda_loading;
mod demo;
mod deploy;
mod doc_figures;
mod e2e;
mod estimate;
mod fenced_release;
mod ffi;
mod give_back_unlocked;
mod graphs;
mod guide_parity;
mod manager_features;
mod many_streams;
mod page_reserve;
mod reliability;
mod sidecar;
mod stream_ordered_reuse;
mod support;
mod traces;
mod web;
