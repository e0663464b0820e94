//! cland, the node daemon, as a library (the `cland` binary is a thin wrapper).
//!
//! A node is Solaris MC's process manager: it starts processes under shepherds
//! (`process::vproc`), answers for the processes of its pid namespace (`process::view`),
//! signals (`process::signal`), collects exit statuses for parents (`process::wait`), places
//! new processes (`placement`), links to the other nodes (`peer`), relays attached
//! processes (`session`) and serves the local API (`local`). See docs/architecture.md.

pub mod cgroup;
pub mod clusterinit;
pub mod error;
pub mod fanout;
pub mod genealogy;
pub mod job;
pub mod link;
pub mod local;
pub mod localcluster;
pub mod membership;
pub mod node;
pub mod peer;
pub use clan_core::pidfile;
pub mod placement;
pub mod process;
pub mod procfs;
pub mod session;
pub mod viewserver;

use anyhow::Context;
use clan_core::{ClusterConfig, NodeId};
use node::Node;
use process::view::ProcView;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

pub use error::{Error, Result};

/// How cland was asked to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The cluster file, read (cland reads it once, before its runtime, whose size it sets).
    pub config: ClusterConfig,
    pub node: NodeId,
    /// Directory holding `clan-shepherd` (default: next to the running executable).
    pub bin_dir: Option<PathBuf>,
}

/// The local socket of `node` under a cluster directory.
pub fn socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join("cland.sock")
}

/// Whether `pid` is a running process (a zombie is not: it answers kill(pid, 0)).
pub fn pid_alive(pid: i32) -> bool {
    let Ok(stat) = clan_core::sys::read_small(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next().map(str::to_string));
    pid > 0 && !matches!(state.as_deref(), Some("Z") | Some("X") | None)
}

/// Finds or starts the node's namespace init (local clusters as root).
fn ensure_init(
    state: &Path,
    node: NodeId,
    cg: Option<&cgroup::NodeCgroup>,
    bin: &Path,
) -> anyhow::Result<u32> {
    let pidfile = state.join("init.pid");
    // Only the init recorded (pid, start time and boot; or, from an older cland, its name),
    // never a process that got its number after a reboot or its death.
    if let Some(init) = pidfile::read(&pidfile, "clan-shepherd") {
        let pid = init.pid;
        let ours = std::fs::read_link("/proc/self/ns/pid").ok();
        let theirs = std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
        if init.alive() && theirs.is_some() && theirs != ours {
            info!(pid, "reusing the node's namespace init");
            return Ok(pid as u32);
        }
    }
    let mut cmd = std::process::Command::new(bin.join("clan-shepherd"));
    clan_core::sys::first_open_files_for(&mut cmd);
    cmd.args(["node-init", "--hostname", &format!("node{node}")]);
    if let Some(cg) = cg {
        cmd.arg("--cgroup").arg(cg.sub("init"));
    }
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("start the node's namespace init")?;
    if !out.status.success() {
        anyhow::bail!("the node's namespace init failed to start");
    }
    let pid: u32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .context("namespace init pid")?;
    pidfile::write(&pidfile, pid).with_context(|| format!("write {}", pidfile.display()))?;
    Ok(pid)
}

/// Runs a node until it is told to stop.
pub async fn run(opts: Options) -> anyhow::Result<()> {
    let cfg = opts.config;
    cfg.node(opts.node)?;
    let state = cfg.state_dir(opts.node);
    std::fs::create_dir_all(state.join("sh"))
        .with_context(|| format!("create {}", state.display()))?;
    std::fs::create_dir_all(state.join("logs"))?;
    // The cluster /proc of `clan shell`: where the node's view is mounted, where a shell
    // binds the node's own procfs, and the preload shim.
    for d in ["proc", "nodeproc"] {
        std::fs::create_dir_all(state.join(d))?;
    }
    if let Err(e) = clan_shim::install(&state) {
        warn!(
            "cannot install the clan shell shim in {}: {e}",
            state.display()
        );
    }
    let pidfile = state.join("cland.pid");
    if let Some(other) = pidfile::read(&pidfile, "cland") {
        if other.pid != std::process::id() as i32 {
            anyhow::bail!("node {} already has a cland (pid {})", opts.node, other.pid);
        }
    }
    pidfile::write(&pidfile, std::process::id())
        .with_context(|| format!("write {}", pidfile.display()))?;
    let bin_dir = match opts.bin_dir.clone() {
        Some(d) => d,
        None => std::env::current_exe()?
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default(),
    };
    let root = nix::unistd::geteuid().is_root();
    let cg = if root {
        match cgroup::cgroup2_mount() {
            Some(mount) => {
                let base = if cfg.local {
                    localcluster::node_cgroup(&mount, &cfg.name, opts.node)
                } else {
                    mount.join(
                        cgroup::own_cgroup()
                            .unwrap_or_default()
                            .trim_start_matches('/'),
                    )
                };
                match cgroup::NodeCgroup::create(base.clone()) {
                    Ok(mut cg) => {
                        if let Err(e) = cg.enter("daemon") {
                            warn!("cannot move cland into {}: {e}", cg.sub("daemon").display());
                        }
                        cg.setup_controllers();
                        cg.make_spares(true);
                        info!(controllers = ?cg.ctls, "task cgroups");
                        // Load manager runs a crashed cland left (each in a cgroup of its own).
                        let runs = cg.sub(placement::MANAGER_CGROUP);
                        if let Err(e) = cgroup::kill_and_remove(&runs, Duration::from_secs(5)) {
                            warn!("{}: {e}", runs.display());
                        }
                        Some(cg)
                    }
                    Err(e) => {
                        warn!(
                            "no cgroup subtree at {}: {e}; tasks are not confined",
                            base.display()
                        );
                        None
                    }
                }
            }
            None => {
                warn!("no cgroup v2 mount found; tasks are not confined");
                None
            }
        }
    } else {
        None
    };
    let (view_path, ns_init) = if cfg.local && root {
        let pid = ensure_init(&state, opts.node, cg.as_ref(), &bin_dir)?;
        (PathBuf::from(format!("/proc/{pid}/root/proc")), pid)
    } else {
        (PathBuf::from("/proc"), 0)
    };
    let shepherd_bin = bin_dir.join("clan-shepherd");
    let view = ProcView::open(opts.node, view_path.clone(), ns_init, shepherd_bin.clone())
        .with_context(|| format!("open {}", view_path.display()))?;
    let placement = placement::Placement::load(state.join("loadmgr.json"));
    let node = Arc::new(Node::new(
        opts.node,
        cfg.clone(),
        state.clone(),
        view,
        cg,
        shepherd_bin,
        placement,
    ));
    node.follow_proc_events();
    let found = node.recover().await;
    node.set_incarnation(node.incarnation());
    if found == 0 {
        // Nothing taken over from the previous cland: nothing of it to fence.
        node.prev_incarnation
            .store(0, std::sync::atomic::Ordering::Release);
    }
    {
        let node = node.clone();
        tokio::spawn(async move { node.refill_pool().await });
    }
    {
        // A first load sample before the first heartbeat, so peers never show zeros.
        let n = node.clone();
        let _ = tokio::task::spawn_blocking(move || {
            n.sample_load(1.0, &process::view::TickScan::new(&n.view))
        })
        .await;
    }
    node.start_peers().await?;
    // The cluster /proc of `clan shell` (needs FUSE; cland runs without it), started now
    // and again by the sampler whenever it is gone.
    let view_server = {
        let view = cfg.proc_view(opts.node);
        let (st, dir, id, init, cgroup, bin) = (
            state.clone(),
            cfg.dir.clone(),
            opts.node,
            node.view.ns_init,
            node.cgroup.clone(),
            bin_dir.clone(),
        );
        let failed = std::sync::atomic::AtomicBool::new(false);
        // One start at a time (the sampler and the start may both find it missing).
        let one = std::sync::Mutex::new(());
        Arc::new(move || {
            let _one = one.lock().unwrap_or_else(|e| e.into_inner());
            // Not before this cland serves its socket, which the server connects to.
            if !root
                || !socket_path(&st).exists()
                || viewserver::running(&st.join("procfs.pid")).is_some()
            {
                return;
            }
            if let Err(e) = std::fs::create_dir_all(&view) {
                if !failed.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    warn!("no cluster /proc view: {}: {e}", view.display());
                }
                return;
            }
            match viewserver::ensure(&st, &view, &dir, id, init, cgroup.as_ref(), &bin) {
                Ok(()) => failed.store(false, std::sync::atomic::Ordering::Relaxed),
                // Said once, not at every tick.
                Err(e) if !failed.swap(true, std::sync::atomic::Ordering::Relaxed) => {
                    warn!("no cluster /proc view on this node (clan shell will refuse): {e:#}")
                }
                Err(_) => {}
            }
        })
    };
    {
        let node = node.clone();
        let view_server = view_server.clone();
        tokio::spawn(async move {
            let mut tick =
                tokio::time::interval(Duration::from_millis(node.cfg.heartbeat_ms.max(250)));
            loop {
                tick.tick().await;
                let n = node.clone();
                let v = view_server.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    v();
                    // One scan of the node's processes serves the samplers that need it.
                    let before = n.aliases_before_scan();
                    let scan = process::view::TickScan::new(&n.view);
                    n.sample_load(0.2, &scan);
                    n.prune_jobs();
                    n.prune_group_aliases(&before, &scan);
                    n.check_link_holders();
                    n.recheck_deferred_orphans();
                    n.sample_task_peaks();
                })
                .await;
            }
        });
    }
    let sock = socket_path(&state);
    node.serve_local(&sock).await?;
    {
        let v = view_server.clone();
        let _ = tokio::task::spawn_blocking(move || v()).await;
        node.view_tried.send_replace(true);
    }
    info!(
        node = %opts.node,
        incarnation = node.incarnation(),
        previous = node.prev_incarnation.load(std::sync::atomic::Ordering::Relaxed),
        "cland ready"
    );

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut stop = node.shutdown.subscribe();
    let kill = tokio::select! {
        _ = term.recv() => false,
        _ = int.recv() => false,
        r = stop.wait_for(|s| s.is_some()) => r.map(|v| v.unwrap_or(false)).unwrap_or(false),
    };
    info!(kill_processes = kill, "stopping");
    node.say_goodbye().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    if kill {
        stop_processes(&node);
    }
    let _ = std::fs::remove_file(&sock);
    pidfile::remove(&pidfile);
    Ok(())
}

/// Kills every process of the node (its init, shepherds and tasks) for a local-cluster `down`.
fn stop_processes(node: &Node) {
    viewserver::stop(&node.state_dir);
    if let Some(cg) = &node.cgroup {
        let mut dirs = vec![cg.sub("procfs"), cg.sub("init"), cg.sub("shepherds")];
        if let Ok(rd) = std::fs::read_dir(&cg.root) {
            dirs.extend(
                rd.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("job"))
                    .map(|e| e.path()),
            );
        }
        for d in dirs {
            if let Err(e) = cgroup::kill_and_remove(&d, Duration::from_secs(10)) {
                warn!("{}: {e}", d.display());
            }
        }
    } else {
        for vp in node.vprocs.read().values() {
            node.kill_node_pid(vp.gpid.local(), libc::SIGKILL);
        }
        if node.view.ns_init != 0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(node.view.ns_init as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    let _ = std::fs::remove_dir_all(node.state_dir.join("sh"));
    pidfile::remove(&node.state_dir.join("init.pid"));
}
