//! `switchyard`: a thin entry point that dispatches into the library's commands. Started as
//! `kube-proxy`, or with a flag first, it takes kube-proxy's command line instead.
#![forbid(unsafe_code)]

use clap::Parser;
use std::process::ExitCode;
use switchyard::{cli, commands, kube_proxy_cli, logging};

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
