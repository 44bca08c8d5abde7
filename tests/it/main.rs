//! The integration test binary: one crate, one module per area.

mod allocator;
mod backend_contract;
mod browser;
mod cli;
mod cuda_loading;
mod demo;
mod e2e;
mod estimate;
mod ffi;
mod manager_features;
mod reliability;
mod sidecar;
mod support;
mod web;
