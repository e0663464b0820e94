//! `clan node crash N` and `clan node start N`: a power cut and a restart of one node of a
//! local cluster, for tests and demos (issue 3, node failure).

use clan_client::Client;
use clan_core::{ExitCode as X, NodeId};
use clan_daemon::localcluster;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(clap::Subcommand)]
pub enum Args {
    /// Kill node N's daemon, shepherds and processes at once, as a power cut would.
    Crash {
        /// The node.
        node: u32,
    },
    /// Start node N again; it rejoins the cluster.
    Start {
        /// The node.
        node: u32,
    },
}

pub async fn run(a: Args, dir: Option<PathBuf>) -> ExitCode {
    let dir = dir.unwrap_or_else(|| PathBuf::from(clan_client::DEFAULT_DIR));
    if !nix::unistd::geteuid().is_root() {
        crate::fail(&"node crash and node start need root");
        return ExitCode::from(X::PERMISSION);
    }
    match a {
        Args::Crash { node } => match localcluster::crash(&dir, node) {
            Ok(true) => {
                println!("clan: node {node} crashed");
                ExitCode::SUCCESS
            }
            Ok(false) => {
                crate::fail(&format!("node {node} is not running"));
                ExitCode::from(X::NODE_DOWN)
            }
            Err(e) => {
                crate::fail(&format!("{e:#}"));
                ExitCode::from(if e.to_string().contains("not in the cluster") {
                    X::NOT_FOUND
                } else {
                    X::FAILURE
                })
            }
        },
        Args::Start { node } => {
            let bin_dir = std::env::current_exe()
                .ok()
                .and_then(|p| p.parent().map(PathBuf::from))
                .unwrap_or_default();
            let id = match localcluster::start_node(&dir, node, &bin_dir) {
                Ok(id) => id,
                Err(e) => {
                    crate::fail(&format!("{e:#}"));
                    return ExitCode::from(if e.to_string().contains("not in the cluster") {
                        X::NOT_FOUND
                    } else {
                        X::FAILURE
                    });
                }
            };
            if wait_up(&dir, id).await {
                println!("clan: node {node} started");
                ExitCode::SUCCESS
            } else {
                crate::fail(&format!(
                    "node {node} did not come up; see {}",
                    dir.join(format!("node{node}/cland.log")).display()
                ));
                ExitCode::from(X::FAILURE)
            }
        }
    }
}

/// Until every node whose daemon runs (the new one included) answers and sees every other
/// such node up (at most 20 s).
async fn wait_up(dir: &std::path::Path, id: NodeId) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    let running = |n: NodeId| {
        std::os::unix::net::UnixStream::connect(clan_client::socket_path(dir, n)).is_ok()
    };
    while Instant::now() < deadline {
        let me = Client::at(clan_client::socket_path(dir, id), id);
        if let Ok(ns) = me.nodes().await {
            let live: Vec<NodeId> = ns
                .iter()
                .filter_map(|n| NodeId::new(n.id))
                .filter(|&n| running(n))
                .collect();
            let mut all = true;
            for &k in &live {
                let seen = Client::at(clan_client::socket_path(dir, k), k)
                    .nodes()
                    .await;
                let ok = seen.is_ok_and(|v| {
                    v.iter().all(|n| {
                        n.state == "up" || !NodeId::new(n.id).is_some_and(|x| live.contains(&x))
                    })
                });
                all &= ok;
            }
            if all {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}
