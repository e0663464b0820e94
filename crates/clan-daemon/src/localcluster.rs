//! Local clusters (DESIGN.md 5): N clands on this machine, each with its own state
//! directory, port on 127.0.0.1, cgroup subtree and, as root, pid namespace. `up` writes the
//! cluster file and a fresh key and starts the daemons; `down` stops them and removes every
//! process, cgroup, namespace and file they had.

use crate::cgroup;
use anyhow::{bail, Context};
use clan_core::{ClusterConfig, NodeId};
use clan_proto::pb;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The cgroup of a local cluster.
pub fn cluster_cgroup(mount: &Path, name: &str) -> PathBuf {
    mount.join(format!("clan.{name}"))
}

/// The cgroup subtree of one node of a local cluster.
pub fn node_cgroup(mount: &Path, name: &str, node: NodeId) -> PathBuf {
    cluster_cgroup(mount, name).join(format!("node{node}"))
}

#[derive(Debug, Clone)]
pub struct UpOptions {
    pub dir: PathBuf,
    pub nodes: u32,
    pub base_port: u16,
    pub heartbeat_ms: u64,
    pub dead_after_ms: u64,
    pub exit_retention_ms: u64,
    pub reattach_ms: u64,
    /// Whether nodes use the cgroup freezer and `cgroup.kill` for jobs (`clan up
    /// --no-freezer`: `freezer = false` in every node's entry, so jobs are suspended and
    /// killed by signals, as on kernels without them).
    pub freezer: bool,
    /// Directory holding `cland` and `clan-shepherd`.
    pub bin_dir: PathBuf,
    /// Run node N in the network namespace `PREFIX<N>`, listening on `ip_base` + N.
    pub netns: Option<(String, std::net::Ipv4Addr)>,
}

fn pid_of(file: &Path) -> Option<i32> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

fn alive(pid: i32) -> bool {
    crate::pid_alive(pid)
}

/// A name for the cluster's cgroup, unique per directory.
fn cluster_name(dir: &Path) -> String {
    let s = dir.display().to_string();
    let mut h: u32 = 0x811c9dc5;
    for b in s.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x01000193);
    }
    let base: String = dir
        .file_name()
        .map(|f| {
            f.to_string_lossy()
                .chars()
                .filter(|c| c.is_ascii_alphanumeric())
                .take(16)
                .collect()
        })
        .unwrap_or_default();
    format!("{base}-{h:08x}")
}

/// Whether a cluster is running in `dir`.
pub fn running(dir: &Path) -> bool {
    let Ok(cfg) = ClusterConfig::load(&dir.join("cluster.toml")) else {
        return false;
    };
    let any = cfg
        .node_ids()
        .any(|n| pid_of(&cfg.state_dir(n).join("cland.pid")).is_some_and(alive));
    any
}

/// Writes the cluster file and starts one cland per node. Returns the cluster.
pub fn up(o: &UpOptions) -> anyhow::Result<ClusterConfig> {
    if o.nodes == 0 || o.nodes > clan_core::MAX_NODE {
        bail!("a local cluster has 1..={} nodes", clan_core::MAX_NODE);
    }
    if running(&o.dir) {
        bail!(
            "a cluster is already running in {} (stop it with `clan down`)",
            o.dir.display()
        );
    }
    if u32::from(o.base_port) + o.nodes > 65535 {
        bail!("ports {}+{} do not fit", o.base_port, o.nodes);
    }
    let addr = |i: u32| -> anyhow::Result<std::net::SocketAddrV4> {
        let port = o.base_port + i as u16;
        Ok(match &o.netns {
            None => std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, port),
            Some((prefix, base)) => {
                let ns = format!("{prefix}{i}");
                if !Path::new("/run/netns").join(&ns).exists() {
                    bail!("network namespace {ns} does not exist (create it with `ip netns add {ns}`)");
                }
                let ip = u32::from(*base)
                    .checked_add(i)
                    .context("--ip-base + node overflows")?;
                std::net::SocketAddrV4::new(ip.into(), port)
            }
        })
    };
    if o.netns.is_none() {
        for i in 1..=o.nodes {
            let port = o.base_port + i as u16;
            std::net::TcpListener::bind(("127.0.0.1", port))
                .with_context(|| format!("port {port} is in use (choose another --base-port)"))?;
        }
    }
    let cland = o.bin_dir.join("cland");
    if !cland.exists() {
        bail!("{} not found", cland.display());
    }
    std::fs::create_dir_all(&o.dir).with_context(|| format!("create {}", o.dir.display()))?;
    let mut key = [0u8; 32];
    getrandom::getrandom(&mut key).map_err(|e| anyhow::anyhow!("random key: {e}"))?;
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let key_path = o.dir.join("cluster.key");
    std::fs::write(&key_path, hex + "\n")?;
    std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600))?;
    let mut toml = format!(
        "# A local clan cluster written by `clan up`.\nname = \"{}\"\nkey_file = \"cluster.key\"\nlocal = true\nheartbeat_ms = {}\nsuspect_after_ms = {}\ndead_after_ms = {}\nexit_retention_ms = {}\nreattach_ms = {}\n",
        cluster_name(&o.dir),
        o.heartbeat_ms,
        (o.dead_after_ms / 2).max(o.heartbeat_ms * 2),
        o.dead_after_ms,
        o.exit_retention_ms,
        o.reattach_ms
    );
    for i in 1..=o.nodes {
        toml.push_str(&format!("\n[[node]]\nid = {i}\naddr = \"{}\"\n", addr(i)?));
        if let Some((prefix, _)) = &o.netns {
            toml.push_str(&format!("netns = \"{prefix}{i}\"\n"));
        }
        if !o.freezer {
            toml.push_str("freezer = false\n");
        }
    }
    let cfg_path = o.dir.join("cluster.toml");
    std::fs::write(&cfg_path, toml)?;
    let cfg = ClusterConfig::load(&cfg_path)?;
    for n in cfg.node_ids() {
        spawn_cland(&cfg_path, &cfg, n, &cland)?;
    }
    Ok(cfg)
}

fn spawn_cland(
    cfg_path: &Path,
    cfg: &ClusterConfig,
    n: NodeId,
    cland: &Path,
) -> anyhow::Result<()> {
    let state = cfg.state_dir(n);
    std::fs::create_dir_all(&state)?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(state.join("cland.log"))?;
    let netns = match &cfg.node(n)?.netns {
        Some(name) => {
            let p = Path::new("/run/netns").join(name);
            Some(std::fs::File::open(&p).with_context(|| format!("network namespace {name}"))?)
        }
        None => None,
    };
    let mut cmd = std::process::Command::new(cland);
    cmd.arg("--config")
        .arg(cfg_path)
        .arg("--node")
        .arg(n.to_string());
    cmd.stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: setsid and setns in the child before exec only detach it from our terminal
    // and move it into the node's network namespace (both async-signal-safe syscalls).
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            if let Some(ns) = &netns {
                nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(std::io::Error::from)?;
            }
            Ok(())
        });
    }
    cmd.spawn()
        .with_context(|| format!("start cland for node {n}"))?;
    Ok(())
}

fn local_config(dir: &Path) -> anyhow::Result<ClusterConfig> {
    let cfg_path = dir.join("cluster.toml");
    let cfg = ClusterConfig::load(&cfg_path)
        .with_context(|| format!("no local cluster in {}", dir.display()))?;
    if !cfg.local {
        bail!("{} is not a local cluster", cfg_path.display());
    }
    Ok(cfg)
}

fn node_of(cfg: &ClusterConfig, n: u32) -> anyhow::Result<NodeId> {
    NodeId::new(n)
        .filter(|id| cfg.node(*id).is_ok())
        .with_context(|| format!("node {n} is not in the cluster"))
}

/// A power cut on node `n` of the local cluster in `dir`: its cland, its shepherds and every
/// process of the node killed at once (cgroup.kill of the node's subtree, else cland and the
/// namespace init by SIGKILL). Returns whether the node was running.
pub fn crash(dir: &Path, n: u32) -> anyhow::Result<bool> {
    let cfg = local_config(dir)?;
    let id = node_of(&cfg, n)?;
    let state = cfg.state_dir(id);
    let cland = pid_of(&state.join("cland.pid")).filter(|&p| alive(p));
    let init = pid_of(&state.join("init.pid")).filter(|&p| alive(p));
    let sub = cgroup::cgroup2_mount()
        .map(|m| node_cgroup(&m, &cfg.name, id))
        .filter(|p| p.join("cgroup.kill").exists());
    if let Some(cg) = &sub {
        std::fs::write(cg.join("cgroup.kill"), "1")
            .with_context(|| format!("kill {}", cg.display()))?;
    } else {
        for pid in cland.iter().chain(init.iter()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    // Gone when its cland and init are and, with a cgroup, when nothing is left in it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while (cland.is_some_and(alive)
        || init.is_some_and(alive)
        || sub.as_deref().is_some_and(cgroup::populated))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(cland.is_some())
}

/// Starts node `n` of the local cluster in `dir` again (after a crash or a stop).
pub fn start_node(dir: &Path, n: u32, bin_dir: &Path) -> anyhow::Result<NodeId> {
    let cfg = local_config(dir)?;
    let id = node_of(&cfg, n)?;
    if pid_of(&cfg.state_dir(id).join("cland.pid")).is_some_and(alive) {
        bail!("node {n} is already running");
    }
    // A fresh cgroup subtree: what is left of the old one (after a crash, empty) goes. Not
    // only tidiness: on this kernel a process cloned (CLONE_INTO_CGROUP) from a cgroup that
    // saw cgroup.kill into one that did not is killed at birth (their kill sequence numbers
    // differ), so the old subtree can not be reused.
    if let Some(cg) = cgroup::cgroup2_mount().map(|m| node_cgroup(&m, &cfg.name, id)) {
        if cg.exists() {
            cgroup::kill_and_remove(&cg, Duration::from_secs(15))
                .with_context(|| format!("remove {}", cg.display()))?;
        }
    }
    spawn_cland(&dir.join("cluster.toml"), &cfg, id, &bin_dir.join("cland"))?;
    Ok(id)
}

/// Sends a request to a node's local socket and reads the reply (blocking).
pub fn request(
    sock: &Path,
    op: pb::local_request::Op,
    timeout: Duration,
) -> anyhow::Result<pb::LocalReply> {
    let mut s = std::os::unix::net::UnixStream::connect(sock)?;
    s.set_read_timeout(Some(timeout))?;
    clan_proto::write_frame_sync(
        &mut s,
        &pb::LocalRequest {
            id: 1,
            op: Some(op),
        },
    )?;
    clan_proto::read_frame_sync::<pb::LocalReply, _>(&mut s)?.context("no reply")
}

/// What `down` did.
#[derive(Debug, Default)]
pub struct DownReport {
    pub stopped: Vec<u32>,
    pub killed: Vec<u32>,
}

/// Stops every node of the cluster in `dir` and removes all it left.
pub fn down(dir: &Path) -> anyhow::Result<DownReport> {
    let cfg = local_config(dir)?;
    let mut report = DownReport::default();
    for n in cfg.node_ids() {
        let state = cfg.state_dir(n);
        let pid = pid_of(&state.join("cland.pid")).filter(|&p| alive(p));
        if let Some(pid) = pid {
            let asked = request(
                &crate::socket_path(&state),
                pb::local_request::Op::Shutdown(pb::ShutdownRequest {
                    kill_processes: true,
                }),
                Duration::from_secs(5),
            )
            .is_ok();
            let deadline = Instant::now() + Duration::from_secs(15);
            while asked && alive(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if alive(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
                report.killed.push(n.get());
            } else {
                report.stopped.push(n.get());
            }
        }
        // A node whose cland died leaves its namespace init: kill it (and with it the node).
        if let Some(init) = pid_of(&state.join("init.pid")).filter(|&p| alive(p)) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(init),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    if let Some(mount) = cgroup::cgroup2_mount() {
        let cg = cluster_cgroup(&mount, &cfg.name);
        cgroup::kill_and_remove(&cg, Duration::from_secs(15))
            .with_context(|| format!("remove {}", cg.display()))?;
    }
    std::fs::remove_dir_all(dir).with_context(|| format!("remove {}", dir.display()))?;
    Ok(report)
}
