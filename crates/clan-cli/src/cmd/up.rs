use clan_client::Client;
use clan_core::ExitCode as X;
use clan_core::NodeId;
use clan_daemon::localcluster::{self, UpOptions};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    /// Number of nodes.
    #[arg(short = 'n', long, default_value_t = 4)]
    nodes: u32,
    /// Node N listens on 127.0.0.1:BASE+N.
    #[arg(long, default_value_t = 7100)]
    base_port: u16,
    /// Heartbeat interval.
    #[arg(long, default_value_t = 500)]
    heartbeat_ms: u64,
    /// A node not heard from for this long is dead.
    #[arg(long, default_value_t = 3000)]
    dead_after_ms: u64,
    /// How long the exit status of a detached process started from outside the cluster
    /// is kept for `clan wait` before the process is reaped; also how long a detached
    /// process's log is kept after its process was collected (at least 5 s).
    #[arg(long, default_value_t = clan_core::config::DEFAULT_EXIT_RETENTION_MS)]
    exit_retention_ms: u64,
    /// How long an attached process whose session broke (a cland restarted) waits for its
    /// `clan run` to reattach before it is hung up.
    #[arg(long, default_value_t = clan_core::config::DEFAULT_REATTACH_MS)]
    reattach_ms: u64,
    /// Do not use the cgroup freezer nor `cgroup.kill` for jobs, even where the kernel has
    /// them: nodes suspend, resume and kill jobs by signals (`freezer = false` in each
    /// node's entry of the cluster file), as on kernels without them.
    #[arg(long)]
    no_freezer: bool,
    /// Run node N in the existing network namespace `PREFIX<N>` (e.g. made with
    /// `ip netns add`), listening on --ip-base + N; for testing partitions.
    #[arg(long, value_name = "PREFIX", requires = "ip_base")]
    netns: Option<String>,
    /// With --netns: node N listens on this IPv4 address + N.
    #[arg(long, value_name = "IPV4", requires = "netns")]
    ip_base: Option<std::net::Ipv4Addr>,
    /// Worker threads of each node daemon's runtime [default: this machine's CPUs shared
    /// among the nodes, 1 to 2 each] (`workers` in each node's entry of the cluster file;
    /// `CLAN_WORKERS` in the daemons' environment overrides it).
    #[arg(long)]
    workers: Option<usize>,
}

fn dir_or_default(dir: Option<PathBuf>) -> PathBuf {
    dir.unwrap_or_else(|| PathBuf::from(clan_client::DEFAULT_DIR))
}

pub async fn run(a: Args, dir: Option<PathBuf>) -> ExitCode {
    let dir = dir_or_default(dir);
    // From now on a Ctrl-C, SIGTERM or SIGHUP is ours to handle: the daemons run in
    // sessions of their own, so `clan up` stops what it started before it goes.
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        crate::fail(&"cannot handle signals");
        return ExitCode::from(X::FAILURE);
    };
    if !nix::unistd::geteuid().is_root() {
        eprintln!("clan: warning: not root: nodes get no pid namespace and no cgroup subtree");
    }
    let bin_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(PathBuf::from))
        .unwrap_or_default();
    let opts = UpOptions {
        dir,
        nodes: a.nodes,
        base_port: a.base_port,
        heartbeat_ms: a.heartbeat_ms,
        dead_after_ms: a.dead_after_ms,
        exit_retention_ms: a.exit_retention_ms,
        reattach_ms: a.reattach_ms,
        freezer: !a.no_freezer,
        bin_dir,
        netns: a.netns.zip(a.ip_base),
        workers: a.workers,
    };
    if let Some((lo, hi)) = opts.ephemeral_overlap() {
        eprintln!(
            "clan: warning: ports {}-{} are in the kernel's ephemeral range {lo}-{hi} \
             (net.ipv4.ip_local_port_range): an outgoing connection can take one before its \
             node listens; choose a --base-port of at most {}",
            u32::from(opts.base_port) + 1,
            u32::from(opts.base_port) + opts.nodes,
            lo.saturating_sub(opts.nodes + 1)
        );
    }
    let started = match localcluster::up(&opts) {
        Ok(c) => c,
        Err(e) => {
            crate::fail(&format!("{e:#}"));
            return ExitCode::from(if e.is::<localcluster::Refused>() {
                X::USAGE
            } else {
                X::FAILURE
            });
        }
    };
    let outcome = tokio::select! {
        biased;
        _ = int.recv() => Err((libc::SIGINT, None)),
        _ = term.recv() => Err((libc::SIGTERM, None)),
        _ = hup.recv() => Err((libc::SIGHUP, None)),
        r = ready(&started, a.nodes) => r.map_err(|msg| (0, Some(msg))),
    };
    let (sig, msg) = match outcome {
        Ok(()) => {
            println!(
                "clan: {} nodes up in {} (stop with `clan down`)",
                a.nodes,
                started.dir.display()
            );
            return ExitCode::SUCCESS;
        }
        Err(e) => e,
    };
    let dir = started.dir.clone();
    match msg {
        Some(m) => crate::fail(&m),
        None => crate::fail(&format!(
            "interrupted (SIG{}): stopping the nodes started in {}",
            nix::sys::signal::Signal::try_from(sig)
                .map(|s| s.as_str().trim_start_matches("SIG"))
                .unwrap_or("?"),
            dir.display()
        )),
    }
    // Blocking, but nothing else runs now; more signals meanwhile only queue up.
    if let Err(e) = started.abort() {
        crate::fail(&format!("removing the cluster in {}: {e:#}", dir.display()));
    }
    ExitCode::from(if sig == 0 {
        X::FAILURE
    } else {
        128 + sig as u8
    })
}

/// Until every node answers and sees every other node up (at most 20 s); else a message
/// naming the node that did not, what it last said of the others, and the end of the log
/// of each node concerned.
async fn ready(started: &localcluster::Started, nodes: u32) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let log_tail = |n: NodeId| {
        let log =
            std::fs::read_to_string(started.cfg.state_dir(n).join("cland.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        format!(
            "node {n}'s log ends:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    };
    for n in started.cfg.node_ids() {
        let c = Client::at(clan_client::socket_path(&started.dir, n), n);
        // What it said last of the nodes that were not up to it.
        let mut not_up: Vec<(u32, String)> = Vec::new();
        loop {
            // A daemon that accepts but does not answer (stopped) must not hold us past the
            // deadline.
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left.max(Duration::from_millis(100)), c.nodes()).await {
                Ok(Ok(ns)) if ns.len() == nodes as usize && ns.iter().all(|i| i.state == "up") => {
                    break
                }
                Ok(Ok(ns)) => {
                    not_up = ns
                        .iter()
                        .filter(|i| i.state != "up")
                        .map(|i| (i.id, i.state.clone()))
                        .collect()
                }
                _ => {}
            }
            if Instant::now() > deadline {
                let mut msg = if not_up.is_empty() {
                    format!("node {n} did not come up (it did not answer)")
                } else {
                    let seen: Vec<String> = not_up
                        .iter()
                        .map(|(id, st)| format!("node {id} {st}"))
                        .collect();
                    format!(
                        "node {n} did not see every node up: it sees {}",
                        seen.join(", ")
                    )
                };
                msg.push_str(&format!("; {}", log_tail(n)));
                for (id, _) in &not_up {
                    if let Some(other) = NodeId::new(*id).filter(|o| *o != n) {
                        msg.push_str(&format!("\n{}", log_tail(other)));
                    }
                }
                return Err(msg);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}

pub fn down(dir: Option<PathBuf>) -> ExitCode {
    let dir = dir_or_default(dir);
    match localcluster::down(&dir) {
        Ok(r) => {
            let mut msg = format!("clan: stopped {} node(s)", r.stopped.len());
            if !r.killed.is_empty() {
                msg.push_str(&format!(", killed {:?} that did not stop", r.killed));
            }
            if r.removed_dir {
                println!("{msg}; removed {}", dir.display());
            } else {
                println!(
                    "{msg}; removed the cluster's files from {}, which holds others",
                    dir.display()
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            crate::fail(&format!("{e:#}"));
            ExitCode::from(X::FAILURE)
        }
    }
}
