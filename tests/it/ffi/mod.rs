//! The C ABI (`crates/gpumem-capi`): called from Rust on a simulated device installed as its
//! manager (`abi`), its three declarations checked against each other (`declarations`), and
//! from Python through ctypes, without PyTorch (`python`: the package's own tests, and its
//! installation from a clean copy of the repository), and hostile tags (`tags`).

mod abi;
mod declarations;
mod python;
mod tags;
