//! The `gpumem` binary: parses the command line and hands over to `gpumem::cli`.

fn main() {}
