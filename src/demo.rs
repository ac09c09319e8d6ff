//! The `demo` subcommand (being built).

use std::process::ExitCode;

pub async fn run(_args: crate::cli::DemoArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("demo not available yet")
}
