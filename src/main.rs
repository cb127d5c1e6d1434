//! `switchyard`: a thin entry point that dispatches into the agent's modules.
#![forbid(unsafe_code)]

mod agent;
mod cli;
mod commands;
mod config;
mod convert;
mod ipvs_link;
mod manifests;
mod nodeaddr;
mod rtnl;
mod snapshot;
mod status;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&cli.log_level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    match commands::run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("switchyard: {e}");
            ExitCode::FAILURE
        }
    }
}
