//! `switchyard`: a thin entry point that dispatches into the library's commands. Started as
//! `kube-proxy`, or with a flag first, it takes kube-proxy's command line instead.
#![forbid(unsafe_code)]

use clap::Parser;
use std::process::ExitCode;
use switchyard::{cli, commands, kube_proxy_cli, logging};

/// jemalloc with its background thread, not glibc's malloc. glibc kept what each re-read of
/// a manifest file freed in its per-thread arenas and never gave it back: 10k services in
/// one file, 315 MiB after the first sync, 504 MiB after 30 edits and still after 15 s idle
/// (`benches/file_churn.rs`); with one arena (MALLOC_ARENA_MAX=1), 306 then 352 MiB by hand.
/// jemalloc: 284 MiB, 376 MiB during the edits, 270 MiB idle.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if kube_proxy_cli::wanted(&args) {
        return kube_proxy_main(&args[1..]);
    }
    let cli = cli::Cli::parse();
    logging::init(&cli.log_level, &cli.logging_format);
    match commands::run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("switchyard: {e}");
            ExitCode::FAILURE
        }
    }
}

/// kube-proxy's command line: an error in it is printed as kube-proxy prints its own, and
/// exits 1, as kube-proxy does.
fn kube_proxy_main(args: &[String]) -> ExitCode {
    let inv = match kube_proxy_cli::invocation(args) {
        Ok(inv) => inv,
        Err(e) => {
            eprintln!("Error: {e}");
            return ExitCode::FAILURE;
        }
    };
    logging::init(
        logging::level_for_verbosity(inv.config.logging.verbosity),
        &inv.config.logging.format,
    );
    match commands::kube_proxy(inv) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("Error: {e}");
            ExitCode::FAILURE
        }
    }
}
