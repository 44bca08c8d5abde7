//! The `gpumem` binary: the command line (the only crate that knows flags), the demo workload,
//! `gpumem bench` and the replay plots, over the library crates.

mod bench;
mod cli;
mod demo;
mod plot;

fn main() {
    std::process::exit(cli::run());
}
