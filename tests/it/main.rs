//! The integration test binary: one crate, one module per area.

mod allocator;
mod backend_contract;
mod cli;
mod cuda_loading;
mod manager_features;
mod demo;
mod estimate;
mod support;
mod web;
