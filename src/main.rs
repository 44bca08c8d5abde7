//! The `gpumem` binary: the command line (the only crate that knows flags), the demo workload,
//! `gpumem bench` and the replay plots, over the library crates.

mod bench;
mod cli;
mod demo;
mod plot;

/// The heap allocator of the binary, not the C library's (that one is its host's): `gpumem serve`
/// runs for months as a sidecar or node agent under a memory limit, and what it frees should go
/// back to the system. glibc's malloc kept it: after 44,000 publishers came and went and every
/// table that had held them was empty again (0.55 MiB of heap in use, 0.24 MiB at the start),
/// the process stayed 6.8 MiB above its start: glibc gives back the end of a heap, not the free
/// pages between pieces still in use. mimalloc gives free pages back on its own.
/// docs/reliability.md ("A hostile node") has the measurements.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(cli::run());
}
