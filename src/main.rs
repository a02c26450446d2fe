//! The `rayshift` binary: CLI and wiring only.

mod cli;

use std::process::ExitCode;

use clap::Parser;

/// glibc's allocator serialises the webhook's two worker threads on its arena lock under load
/// (BENCHMARKS.md, "webhook cost").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Installed as `kubectl-rayshift` (krew), the same binary is the kubectl plugin.
    let result = if cli::kubectl::invoked_as_plugin() {
        cli::kubectl::run(cli::kubectl::Plugin::parse())
    } else {
        cli::run(cli::Cli::parse())
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
