//! The `gpumem` binary: everything lives in the library's `cli` module; this only sets the exit code.

fn main() {
    std::process::exit(gpumem::run_cli());
}
