//! `clan`: a thin command line over the client library (one file per command in `cmd/`).
//! Exit codes are documented in docs/cli.md; `clan run` ends as its process ended.
//!
//! The command line is a library so that the `clan` binary (`src/main.rs`) is only a call
//! to [`main`]: the release build links that binary statically (see docs/deployment.md),
//! which relinks it without recompiling the command line.

mod cmd;
mod users;

use clan_client::{Client, ClientError};
use clan_core::{ExitCode as X, NodeId};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "clan",
    version,
    about = "A single-system image for Linux clusters"
)]
struct Cli {
    /// Cluster directory holding the nodes' sockets [default: $CLAN_DIR or /run/clan].
    #[arg(long, global = true, env = "CLAN_DIR")]
    dir: Option<PathBuf>,
    /// Talk to this node's cland [default: $CLAN_NODE, else the lowest local node].
    #[arg(long, global = true, value_name = "N")]
    from: Option<NodeId>,
    #[command(subcommand)]
    cmd: Cmd,
}

// A subcommand's arguments are built only when it is the one invoked (clap's `defer`): less
// to allocate and page in at every start (about 35 µs of `clan run`).
#[derive(Subcommand)]
#[command(defer = true)]
enum Cmd {
    /// Start a local cluster of N node daemons on this machine.
    Up(cmd::up::Args),
    /// Stop the local cluster and remove everything it left.
    Down,
    /// List the nodes with state (up, suspect, dead, no-quorum), address, load, processes
    /// and memory.
    Nodes(cmd::nodes::Args),
    /// Crash or start one node of a local cluster (for tests and demos).
    #[command(subcommand)]
    Node(cmd::node::Args),
    /// Run a command on a node of the cluster (the `clan run` process stands for it).
    Run(cmd::run::Args),
    /// List the processes of the whole cluster.
    Ps(cmd::ps::Args),
    /// Send a signal to processes on any node.
    Kill(cmd::kill::Args),
    /// Jobs: list, show, suspend, resume, kill (every task of the job on every node).
    #[command(subcommand)]
    Job(cmd::job::Args),
    /// Signal the set of processes an expression describes (sigsendset).
    Sigsend(cmd::sigsend::Args),
    /// Wait for processes you started and print how they ended.
    Wait(cmd::wait::Args),
    /// Print the output of a detached process.
    Logs(cmd::logs::Args),
    /// Daemon statistics.
    Stats(cmd::stats::Args),
    /// Register, remove or show this node's load manager.
    Loadmgr(cmd::loadmgr::Args),
    /// Mount or unmount the cluster /proc (every process of every node as /GPID).
    #[command(subcommand)]
    Proc(cmd::proc::Args),
    /// A shell (or CMD) on a node in which /proc is the cluster view and kill, pkill, ps,
    /// top and pstree act on every node.
    Shell(cmd::shell::Args),
}

/// Turns `clan kill -9 G` and `clan kill -TERM G` into `clan kill -s 9 G`, as kill(1) allows.
fn normalize(mut args: Vec<String>) -> Vec<String> {
    if let Some(i) = args.iter().position(|a| a == "kill" || a == "sigsend") {
        if let Some(a) = args.get(i + 1).cloned() {
            if let Some(sig) = a.strip_prefix('-') {
                if !sig.starts_with('-') && sig != "s" && clan_core::parse_signal(sig).is_some() {
                    args[i + 1] = sig.to_string();
                    args.insert(i + 1, "-s".into());
                }
            }
        }
    }
    args
}

pub(crate) fn fail(e: &dyn std::fmt::Display) {
    eprintln!("clan: {e}");
}

/// Prints what node `node` answered as an error, named once ("node 3 is dead", not
/// "node 3: node 3 is dead").
pub(crate) fn fail_node(node: u32, e: &str) {
    if e.starts_with(&format!("node {node} ")) {
        fail(&e);
    } else {
        fail(&format!("node {node}: {e}"));
    }
}

/// Prints a client error and returns its exit code.
pub(crate) fn client_error(e: &ClientError) -> ExitCode {
    fail(e);
    ExitCode::from(e.exit_code())
}

/// The `clan` command: parses the arguments and runs the subcommand.
pub fn main() -> ExitCode {
    let cli = Cli::parse_from(normalize(std::env::args().collect()));
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            fail(&e);
            return ExitCode::from(X::FAILURE);
        }
    };
    let dir = cli.dir.clone();
    let client = || Client::locate(dir.as_deref(), cli.from);
    rt.block_on(async {
        match cli.cmd {
            Cmd::Up(a) => cmd::up::run(a, cli.dir.clone()).await,
            Cmd::Down => cmd::up::down(cli.dir.clone()),
            Cmd::Job(a) => with(client(), |c| cmd::job::run(c, a)).await,
            Cmd::Nodes(a) => with(client(), |c| cmd::nodes::run(c, a)).await,
            Cmd::Node(a) => cmd::node::run(a, cli.dir.clone()).await,
            Cmd::Run(a) => match client() {
                Ok(c) => cmd::run::run(c, a).await,
                Err(e) => {
                    fail(&e);
                    ExitCode::from(X::RUN_FAILED)
                }
            },
            Cmd::Ps(a) => with(client(), |c| cmd::ps::run(c, a)).await,
            Cmd::Kill(a) => with(client(), |c| cmd::kill::run(c, a)).await,
            Cmd::Sigsend(a) => with(client(), |c| cmd::sigsend::run(c, a)).await,
            Cmd::Wait(a) => with(client(), |c| cmd::wait::run(c, a)).await,
            Cmd::Logs(a) => with(client(), |c| cmd::logs::run(c, a)).await,
            Cmd::Stats(a) => with(client(), |c| cmd::stats::run(c, a)).await,
            Cmd::Loadmgr(a) => with(client(), |c| cmd::loadmgr::run(c, a)).await,
            Cmd::Proc(a) => cmd::proc::run(a, cli.dir.clone(), cli.from).await,
            Cmd::Shell(a) => match client() {
                Ok(c) => cmd::shell::run(c, a).await,
                Err(e) => {
                    fail(&e);
                    ExitCode::from(X::RUN_FAILED)
                }
            },
        }
    })
}

async fn with<F, Fut>(c: Result<Client, ClientError>, f: F) -> ExitCode
where
    F: FnOnce(Client) -> Fut,
    Fut: std::future::Future<Output = ExitCode>,
{
    match c {
        Ok(c) => f(c).await,
        Err(e) => client_error(&e),
    }
}
