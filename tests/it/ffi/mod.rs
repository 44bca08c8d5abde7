//! The C ABI (`src/ffi`): called from Rust on a simulated device installed as its manager
//! (`abi`), and from Python through ctypes, without PyTorch (`python`: the package's own
//! tests, and its installation from a clean copy of the repository).

mod abi;
mod python;
