//! `clan-procfs`: serves the cluster /proc at a mount point (a thin layer over
//! `clan_procfs::mount::serve`). Exit codes as in docs/proc.md.

use clan_core::{ExitCode as X, NodeId};
use clan_procfs::mount::{self, MountError, ServeOptions};
use clap::Parser;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "clan-procfs",
    version,
    about = "Mount the cluster /proc (every process of every node as /GPID) at MOUNTPOINT"
)]
struct Args {
    /// Cluster directory holding the nodes' sockets [default: $CLAN_DIR or /run/clan].
    #[arg(long, env = "CLAN_DIR", value_name = "DIR")]
    cluster_dir: Option<PathBuf>,
    /// The node whose cland serves the view [default: $CLAN_NODE, else the lowest local
    /// node].
    #[arg(long, value_name = "N")]
    node: Option<NodeId>,
    /// Stay in the foreground (otherwise detach once mounted).
    #[arg(long)]
    foreground: bool,
    /// Write `ready` (or `error CODE MESSAGE`) to this fd once mounted, then close it.
    #[arg(long, value_name = "FD")]
    ready_fd: Option<i32>,
    /// How long one request to cland may take before the reader gets EIO.
    #[arg(long, value_name = "MS", default_value_t = 5000)]
    timeout_ms: u64,
    /// Mount in the mount namespace of this process (a local-cluster node's init: how
    /// cland mounts its node's view for `clan shell`); the server stays in ours.
    #[arg(long, value_name = "PID")]
    mount_ns: Option<u32>,
    /// Where the node's `clan shell`s have the node's own procfs: `self` and `thread-self`
    /// point there for them, so its magic links (`/proc/self/fd/N`) keep working.
    #[arg(long, value_name = "DIR")]
    node_proc: Option<PathBuf>,
    /// The node's view for `clan shell`s (how cland mounts it): mount on a shared bind of
    /// MOUNTPOINT onto itself, kept when the view goes, so that the view of a restarted
    /// server reaches the shells already running.
    #[arg(long)]
    for_shells: bool,
    /// Threads per CPU that serve the view over io_uring, when the kernel offers it
    /// (Linux 6.14 and later, with `/sys/module/fuse/parameters/enable_uring` set to Y):
    /// each pinned to its CPU, so that a read is served on the reader's CPU; 0 serves it
    /// on /dev/fuse only.
    #[arg(
        long,
        env = "CLAN_PROC_URING_THREADS",
        value_name = "N",
        default_value_t = 2
    )]
    uring_threads: usize,
    /// Where to mount.
    mountpoint: PathBuf,
}

fn fail(e: &dyn std::fmt::Display) {
    eprintln!("clan-procfs: {e}");
}

fn main() -> ExitCode {
    clan_core::sys::no_fast_bins();
    let a = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut ready: Vec<OwnedFd> = Vec::new();
    if let Some(n) = a.ready_fd {
        match mount::fd_from_number(n) {
            Some(fd) => ready.push(fd),
            None => {
                fail(&format!("--ready-fd {n} is not an open file descriptor"));
                return ExitCode::from(X::USAGE);
            }
        }
    }
    let client = match clan_client::Client::locate(a.cluster_dir.as_deref(), a.node) {
        Ok(c) => c,
        Err(e) => {
            let e = MountError::NoDaemon(e.to_string());
            mount::tell(&mut ready, Err(&e));
            fail(&e);
            return ExitCode::from(e.exit_code());
        }
    };
    let cluster_dir = a
        .cluster_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(clan_client::DEFAULT_DIR));
    if !a.foreground {
        match detach(&mut ready) {
            Ok(Some(code)) => return code,
            Ok(None) => {} // the detached server
            Err(e) => {
                fail(&e);
                return ExitCode::from(X::FAILURE);
            }
        }
    }
    // Up to eight descriptors per node of the cluster (its lane's connections to cland and
    // their direct links to the node): as many as the hard limit allows.
    clan_core::sys::raise_open_files();
    let o = ServeOptions {
        mountpoint: a.mountpoint,
        cluster_dir,
        node: client.node(),
        ready,
        timeout: Duration::from_millis(a.timeout_ms),
        // As many as the blocking links to a node (`source::BLOCKING_LINKS`). More threads
        // would let others go on while a node that stopped answering holds two for a
        // moment ([`source::WAIT_ON_LINK`], once per `RETRY_AFTER`), but cost every read:
        // the kernel wakes the thread idle longest, more often on the other CPU (reads of
        // 40 µs instead of 15 with four threads, performance.md, 2026-11-26).
        threads: clan_procfs::source::BLOCKING_LINKS,
        uring_threads: a.uring_threads,
        mount_ns: a.mount_ns,
        node_proc: a.node_proc,
        for_shells: a.for_shells,
    };
    match mount::serve(o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            fail(&e);
            ExitCode::from(e.exit_code())
        }
    }
}

/// Splits into a parent that waits until the server is ready and exits with its outcome
/// (`Some(code)`), and the server (`None`) in a session of its own with stdio on
/// /dev/null, which tells the parent through a pipe.
fn detach(ready: &mut Vec<OwnedFd>) -> std::io::Result<Option<ExitCode>> {
    let (rd, wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    // SAFETY: no thread has been started yet (the runtime comes later, in serve).
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Parent { child } => {
            drop(wr);
            ready.clear();
            let mut line = String::new();
            let _ = std::fs::File::from(rd).read_to_string(&mut line);
            if line.trim() == "ready" {
                return Ok(Some(ExitCode::SUCCESS));
            }
            if let Some(rest) = line.trim().strip_prefix("error ") {
                let (code, msg) = rest.split_once(' ').unwrap_or((rest, ""));
                fail(&msg);
                return Ok(Some(ExitCode::from(
                    code.parse::<u8>().unwrap_or(X::FAILURE),
                )));
            }
            let code = match nix::sys::wait::waitpid(child, None) {
                Ok(nix::sys::wait::WaitStatus::Exited(_, c)) if c != 0 => c as u8,
                _ => X::FAILURE,
            };
            fail(&"the server ended before the view was mounted");
            Ok(Some(ExitCode::from(code)))
        }
        nix::unistd::ForkResult::Child => {
            drop(rd);
            nix::unistd::setsid()?;
            let null = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")?;
            for fd in 0..3 {
                nix::unistd::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), fd)?;
            }
            ready.push(wr);
            Ok(None)
        }
    }
}
