//! `clan-bench`: clan's figures, each as a ratio against a baseline run in the same
//! invocation. `bench/run` builds and runs it; results go to docs/performance.md.

mod baselines;
mod clan;
mod cluster;
mod idle;
mod jobs;
mod placement;
mod posix;
mod procview;
mod report;
mod stats;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "clan-bench")]
struct Args {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// Directory with clan, cland and clan-shepherd [default: next to this binary].
    #[arg(long, global = true)]
    bin_dir: Option<PathBuf>,
    /// The same binaries built with `--features clan-daemon/giant-lock`.
    #[arg(long, global = true)]
    giant_bin_dir: Option<PathBuf>,
    /// Iterations per latency measurement.
    #[arg(long, global = true, default_value_t = 200)]
    iterations: usize,
    /// Processes per node for the ps comparison.
    #[arg(long, global = true, default_value_t = 1000)]
    per_node: usize,
    /// Seconds per throughput point.
    #[arg(long, global = true, default_value_t = 3.0)]
    seconds: f64,
    /// Tree sizes for `jobs` (comma-separated, from 3, 7, 15, 63, 255, 1023) [default: all].
    #[arg(long, global = true, value_delimiter = ',')]
    tree_sizes: Vec<usize>,
    /// Node crashes for the death-notice measurement.
    #[arg(long, global = true, default_value_t = 5)]
    crashes: usize,
    /// Write the results as JSON here.
    #[arg(long, global = true)]
    json: Option<PathBuf>,
    /// Write the results as a Markdown table here.
    #[arg(long, global = true)]
    markdown: Option<PathBuf>,
    /// Hold a CPU latency request of this many microseconds (`/dev/cpu_dma_latency`, the
    /// PM QoS interface tuned's latency-performance profile uses) for the whole run,
    /// baselines included: 0 keeps idle CPUs polling instead of halting.
    #[arg(long, global = true)]
    cpu_latency_us: Option<i32>,
}

/// A held PM QoS CPU latency request: the kernel keeps it while the file is open.
fn hold_cpu_latency(us: i32) -> anyhow::Result<std::fs::File> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/cpu_dma_latency")
        .map_err(|e| anyhow::anyhow!("/dev/cpu_dma_latency: {e} (needs root)"))?;
    f.write_all(&us.to_ne_bytes())?;
    eprintln!("holding a CPU latency request of {us} µs for the run");
    Ok(f)
}

#[derive(Subcommand)]
enum Cmd {
    /// Every measurement (the default).
    All,
    /// Only the native baselines.
    Baselines,
    /// Remote exec latency.
    Run,
    /// Remote signal latency.
    Signal,
    /// Cluster-wide ps.
    Ps,
    /// Throughput with concurrent clients.
    Rps,
    /// Fork/exit/wait of a remote child, waited for by its parent (issue 3).
    Fork,
    /// A signal to a process group of 100 spread over 4 nodes (issue 3).
    Group,
    /// Time until waiting parents learn of a node's death, on a cluster of its own (issue 3).
    Death,
    /// Task switches (suspend one job, resume another) for trees of 3 to 1,023 processes
    /// against a bare cgroup freeze + thaw, Slurm's suspend/resume, and the fork rate under
    /// genealogy tracking, on a one-node cluster of its own (issue 4; not part of `all`:
    /// several minutes).
    Jobs,
    /// The cluster /proc: `status` of a process on another node through the API and the
    /// mount, and `ps aux` in `clan shell` over every node's processes (issue 5).
    Proc,
    /// Each cland's CPU per second on an idle cluster, with PER_NODE sleeping processes
    /// per node against none.
    Idle,
    #[command(hide = true)]
    NativePong,
    #[command(hide = true)]
    TcpEcho {
        #[arg(long)]
        port: u16,
    },
    #[command(hide = true)]
    Sigping {
        #[arg(long)]
        peer_file: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        iters: usize,
        /// The vCPU of the TCP baselines' echo [default: where the kernel puts it].
        #[arg(long)]
        echo_cpu: Option<usize>,
    },
    #[command(hide = true)]
    Forkping {
        #[arg(long)]
        node: u32,
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        iters: usize,
    },
    #[command(hide = true)]
    Sigpong {
        #[arg(long)]
        peer: clan_core::Gpid,
    },
    /// A complete binary tree of PROCS processes (2^k - 1), idle or spinning.
    #[command(hide = true)]
    Tree {
        #[arg(long)]
        procs: usize,
        #[arg(long)]
        busy: bool,
        #[arg(long)]
        ignore_tstp: bool,
    },
    /// ITERS reads of FILE of process GPID through the client library (of the node in
    /// CLAN_NODE, under CLAN_DIR), on a direct link unless NO_LINK; prints the median, for
    /// profiling one kind of request alone.
    #[command(hide = true)]
    ProcLoop {
        #[arg(long)]
        gpid: clan_core::Gpid,
        #[arg(long, default_value = "status")]
        file: String,
        #[arg(long)]
        iters: usize,
        #[arg(long)]
        no_link: bool,
    },
    /// ITERS forks of a child that exits at once, each waited for; prints forks per second.
    #[command(hide = true)]
    Forks {
        #[arg(long)]
        iters: usize,
    },
}

fn main() -> anyhow::Result<()> {
    // Before any thread exists: SIGUSR1 and SIGUSR2 are taken with sigwaitinfo by the
    // ping-pong roles.
    baselines::block_usr_signals();
    let a = Args::parse();
    let cmd = a.cmd.unwrap_or(Cmd::All);
    match cmd {
        Cmd::NativePong => {
            baselines::native_pong();
            return Ok(());
        }
        Cmd::TcpEcho { port } => {
            baselines::tcp_echo(port);
            return Ok(());
        }
        Cmd::Sigping {
            peer_file,
            out,
            iters,
            echo_cpu,
        } => return clan::sigping(&peer_file, &out, iters, echo_cpu),
        Cmd::Sigpong { peer } => return clan::sigpong(peer),
        Cmd::Forkping { node, out, iters } => return posix::forkping(node, &out, iters),
        Cmd::Tree {
            procs,
            busy,
            ignore_tstp,
        } => return jobs::tree(procs, busy, ignore_tstp),
        Cmd::Forks { iters } => return jobs::forks(iters),
        Cmd::ProcLoop {
            gpid,
            file,
            iters,
            no_link,
        } => return procview::proc_loop(gpid, &file, iters, no_link),
        _ => {}
    }
    cluster::stop_on_signals();
    let _latency = a.cpu_latency_us.map(hold_cpu_latency).transpose()?;
    let bin = a.bin_dir.clone().unwrap_or_else(|| {
        std::env::current_exe()
            .expect("self")
            .parent()
            .expect("dir")
            .to_path_buf()
    });
    let n = a.iterations;
    let mut r = report::Report::default();
    if let Some(us) = a.cpu_latency_us {
        r.note(&format!(
            "Run with a CPU latency request of {us} µs held (`--cpu-latency-us`), baselines included."
        ));
    }
    let all = matches!(cmd, Cmd::All);
    let mut failed = None;
    if matches!(cmd, Cmd::Baselines) {
        println!("baselines:");
        r.latency(
            "baselines",
            "local sh -c true",
            &baselines::spawn_sh_true(n),
            None,
        );
        r.latency(
            "baselines",
            baselines::TCP_RTT,
            &baselines::tcp_rtt(n * 10),
            None,
        );
        r.latency(
            "baselines",
            "local kill(2) ping-pong, one way",
            &baselines::kill_pingpong(n * 10),
            None,
        );
        r.latency("baselines", "ps -e", &baselines::ps_e(n / 10 + 1), None);
    } else {
        if !matches!(cmd, Cmd::Death | Cmd::Jobs) {
            let c = cluster::Cluster::up(&bin, "fine", 4, 7900)?;
            // First, while the cluster has run nothing yet.
            if all || matches!(cmd, Cmd::Idle) {
                idle::idle_cost(&c, &mut r, a.per_node);
            }
            if all || matches!(cmd, Cmd::Run) {
                clan::run_latency(&c, &mut r, n);
            }
            if all || matches!(cmd, Cmd::Signal) {
                clan::signal_latency(&c, &mut r, n);
            }
            if all || matches!(cmd, Cmd::Fork) {
                posix::fork_wait(&c, &mut r, n);
            }
            if all || matches!(cmd, Cmd::Group) {
                posix::group_signal(&c, &mut r, n);
            }
            if all || matches!(cmd, Cmd::Rps) {
                // Both with two workers per node: the locks matter where requests run in
                // parallel, which a local cluster's default share of two CPUs (one worker
                // per node of four) does not do.
                let two = ["--workers", "2"];
                let fine = cluster::Cluster::up_with(&bin, "fine2", 4, 8100, &two)?;
                let giant = match &a.giant_bin_dir {
                    Some(d) => Some(cluster::Cluster::up_with(d, "giant", 4, 7950, &two)?),
                    None => {
                        println!("  (no --giant-bin-dir: no one-big-lock comparison)");
                        None
                    }
                };
                clan::throughput_rows(&fine, giant.as_ref(), &mut r, a.seconds);
            }
            if all || matches!(cmd, Cmd::Ps) {
                clan::ps_scale(&c, &mut r, a.per_node, (n / 10).max(5));
            }
            if all || matches!(cmd, Cmd::Proc) {
                procview::status_read(&c, &mut r, n);
                procview::ps_aux(&c, &mut r, a.per_node, (n / 10).max(5));
            }
        }
        // On a cluster of its own, after the others are down: it crashes a node.
        if all || matches!(cmd, Cmd::Death) {
            failed = posix::death_notice(&bin, &mut r, a.crashes, 8000).err();
        }
        if matches!(cmd, Cmd::Jobs) {
            failed = jobs::jobs(&bin, &mut r, n, 8050, &a.tree_sizes).err();
        }
    }
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&r.rows)?)?;
    }
    if let Some(p) = &a.markdown {
        std::fs::write(p, r.markdown())?;
    }
    failed.map_or(Ok(()), Err)
}
