//! cland: the clan node daemon. All logic lives in the clan-daemon library.
use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;

/// The clan node daemon.
#[derive(Parser)]
#[command(name = "cland", version)]
struct Args {
    /// Cluster file (TOML: name, key_file, a `[[node]]` table per node with id and addr).
    #[arg(long, default_value = "/etc/clan/cluster.toml", env = "CLAN_CONFIG")]
    config: PathBuf,
    /// This node's id in the cluster file.
    #[arg(long)]
    node: clan_core::NodeId,
}

fn main() -> ExitCode {
    clan_core::sys::no_fast_bins();
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CLAN_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // Colours for a terminal only, not in cland.log or the journal.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // Sockets and /proc handles for every peer, session and link: the hard limit, not
    // the usual soft 1,024 (the programs it starts get the limit it started with).
    clan_core::sys::raise_open_files();
    let config = match clan_core::config::ClusterConfig::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cland: node {}: {:#}", args.node, anyhow::Error::from(e));
            return ExitCode::FAILURE;
        }
    };
    // Worker threads of the daemon's runtime: CLAN_WORKERS, else the node's `workers` in
    // the cluster file, else 2. (A node the file does not have is reported by the daemon
    // itself, below.)
    let workers = std::env::var("CLAN_WORKERS")
        .ok()
        .and_then(|w| w.parse().ok())
        .or_else(|| config.node(args.node).ok()?.workers)
        .unwrap_or(clan_core::config::DEFAULT_WORKERS)
        .max(1);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cland: {e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(node = %args.node, "runtime of {workers} worker thread(s)");
    match rt.block_on(clan_daemon::run(clan_daemon::Options {
        config,
        node: args.node,
        bin_dir: None,
    })) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cland: node {}: {e:#}", args.node);
            ExitCode::FAILURE
        }
    }
}
