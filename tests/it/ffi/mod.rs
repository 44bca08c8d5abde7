//! The C ABI (`crates/gpumem-capi`): called from Rust on a simulated device installed as its
//! manager (`abi`), its three declarations checked against each other (`declarations`), and
//! from Python through ctypes, without PyTorch (`python`: the package's own tests, from the
//! source tree and against its wheel installed where no cargo is; the wheel's tag and contents;
//! `pip install ./python`), and hostile tags (`tags`).

mod abi;
mod declarations;
mod python;
mod tags;
