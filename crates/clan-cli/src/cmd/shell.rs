//! `clan shell [--node N] [CMD ARGS...]`: a shell (or CMD) as a process of a node, in which
//! /proc is the cluster view and the signal calls take gpids, so that unmodified `ps`, `top`,
//! `pgrep`, `pkill`, `pstree` and the shell's own `kill` see and act on one machine.

use super::run::{run_spec, winsize};
use clan_client::{Client, RunSpec};
use std::ffi::OsString;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// The node the shell runs on [default: the node clan talks to].
    #[arg(long)]
    node: Option<u32>,
    /// What to run instead of $SHELL (default /bin/bash).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<OsString>,
}

pub async fn run(c: Client, a: Args) -> ExitCode {
    use std::os::unix::ffi::OsStrExt;
    let node = match a.node {
        None => c.node(),
        Some(n) => match clan_core::NodeId::new(n) {
            Some(n) => n,
            None => {
                crate::fail(&format!("node {n} is not in the cluster"));
                return ExitCode::from(clan_core::ExitCode::RUN_FAILED);
            }
        },
    };
    let command = if a.command.is_empty() {
        vec![std::env::var_os("SHELL")
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "/bin/bash".into())]
    } else {
        a.command
    };
    let spec = RunSpec {
        argv: command.iter().map(|s| s.as_bytes().to_vec()).collect(),
        node: Some(node),
        tty: nix::unistd::isatty(0).unwrap_or(false),
        winsize: winsize(),
        detached: false,
        cluster_proc: true,
        ..RunSpec::default()
    };
    run_spec(c, spec, false).await
}
