//! The `rayshift` binary: CLI and wiring only.

mod cli;

use std::process::ExitCode;

use clap::Parser;

/// glibc's allocator serialises the webhook's two worker threads on its arena lock under load
/// (BENCHMARKS.md, "webhook cost").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
