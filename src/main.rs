//! The `gpumem` binary: everything lives in `gpumem::cli`; this only sets the exit code.

fn main() {
    std::process::exit(gpumem::cli::run());
}
