//! The shared library `libgpumem.so`: every entry point of the C ABI, which lives in the
//! `gpumem-capi` crate. Linking that crate is enough: its `#[no_mangle] extern "C"` functions
//! are exported from the cdylib as they are.

extern crate gpumem_capi;
