//! Local clusters (DESIGN.md 5): N clands on this machine, each with its own state
//! directory, port on 127.0.0.1, cgroup subtree and, as root, pid namespace. `up` writes the
//! cluster file and a fresh key in an empty (or new) directory and starts the daemons;
//! `down` stops them and removes every process, cgroup, namespace and file they had, and
//! nothing else: not a file it did not make, not a process a stale pid file names.

use crate::cgroup;
use crate::pidfile;
use anyhow::{bail, Context};
use clan_core::{ClusterConfig, NodeId};
use clan_proto::pb;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
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
    /// Worker threads of each node's runtime (`workers` in every node's entry); `None`:
    /// the machine's CPUs shared among the nodes, at least one each.
    pub workers: Option<usize>,
}

/// A `clan up` refused before anything was created or changed: a bad option, or a
/// directory that holds something other than a local cluster (`clan up` exits 2).
#[derive(Debug)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// The fewest heartbeat intervals `dead_after_ms` may span: less, and a node is declared
/// dead between two of its heartbeats (or for one late one), so nodes flap.
pub const MIN_DEAD_AFTER_HEARTBEATS: u64 = 3;

/// The kernel's range of ephemeral ports (`net.ipv4.ip_local_port_range`): the source
/// ports it gives outgoing connections.
pub fn ephemeral_ports() -> Option<(u32, u32)> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut it = text.split_whitespace().map(|v| v.parse::<u32>().ok());
    Some((it.next()??, it.next()??))
}

/// Whether `port` is reserved (`net.ipv4.ip_local_reserved_ports`: "8000,9000-9100"): the
/// kernel gives it to no outgoing connection, even inside the ephemeral range.
pub fn reserved_port(port: u32) -> bool {
    let text =
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_reserved_ports").unwrap_or_default();
    text.trim().split(',').any(|r| {
        let mut ends = r
            .trim()
            .splitn(2, '-')
            .map(|v| v.trim().parse::<u32>().ok());
        match (ends.next().flatten(), ends.next()) {
            (Some(lo), None) => port == lo,
            (Some(lo), Some(Some(hi))) => (lo..=hi).contains(&port),
            _ => false,
        }
    })
}

impl UpOptions {
    /// The kernel's range of ephemeral ports ([`ephemeral_ports`]) when a node of this
    /// cluster would listen on 127.0.0.1 inside it: an outgoing connection (a node's dial
    /// to a peer not yet listening, connected to itself, or any program's) can take such a
    /// port as its source port before its node binds it.
    pub fn ephemeral_overlap(&self) -> Option<(u32, u32)> {
        if self.netns.is_some() {
            return None;
        }
        let (lo, hi) = ephemeral_ports()?;
        let (first, last) = (
            u32::from(self.base_port) + 1,
            u32::from(self.base_port) + self.nodes,
        );
        (first <= hi && last >= lo).then_some((lo, hi))
    }

    /// Checks the options alone, touching nothing.
    pub fn check(&self) -> Result<(), Refused> {
        let bad = |m: String| Err(Refused(m));
        if self.nodes == 0 || self.nodes > clan_core::MAX_NODE {
            return bad(format!(
                "--nodes {}: a local cluster has 1 to {} nodes",
                self.nodes,
                clan_core::MAX_NODE
            ));
        }
        if self.heartbeat_ms == 0 {
            return bad("--heartbeat-ms 0: the heartbeat interval must be positive".into());
        }
        let min_dead = self.heartbeat_ms.saturating_mul(MIN_DEAD_AFTER_HEARTBEATS);
        if self.dead_after_ms < min_dead {
            return bad(format!(
                "--dead-after-ms {} is shorter than {MIN_DEAD_AFTER_HEARTBEATS} heartbeats \
                 (--heartbeat-ms {}): nodes would be declared dead between heartbeats; give \
                 at least {min_dead}",
                self.dead_after_ms, self.heartbeat_ms
            ));
        }
        if self.dead_after_ms > u64::from(u32::MAX) {
            return bad(format!(
                "--dead-after-ms {}: at most {}",
                self.dead_after_ms,
                u32::MAX
            ));
        }
        if u32::from(self.base_port) + self.nodes > 65535 {
            return bad(format!(
                "--base-port {}: the ports of {} nodes, up to {}, do not fit below 65536",
                self.base_port,
                self.nodes,
                u32::from(self.base_port) + self.nodes
            ));
        }
        if let Some((_, base)) = &self.netns {
            if u32::from(*base).checked_add(self.nodes).is_none() {
                return bad(format!(
                    "--ip-base {base}: the addresses of {} nodes do not fit",
                    self.nodes
                ));
            }
        }
        if let Some(w) = self.workers.filter(|w| !(1..=MAX_WORKERS).contains(w)) {
            return bad(format!("--workers {w}: 1 to {MAX_WORKERS}"));
        }
        Ok(())
    }

    /// Worker threads of each node's runtime: as given, else the machine's CPUs shared
    /// among the nodes (every node of a local cluster runs on this machine), at least one.
    /// On two CPUs a 4-node cluster's nodes take one each: with two each, eight workers
    /// woke one another across two vCPUs (a remote `clan run` took about 5% longer and
    /// more CPU; docs/performance.md).
    pub fn node_workers(&self) -> usize {
        self.workers.unwrap_or_else(|| {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            (cpus / self.nodes.max(1) as usize).clamp(1, clan_core::config::DEFAULT_WORKERS)
        })
    }
}

/// The most worker threads `clan up --workers` gives a node.
pub const MAX_WORKERS: usize = 256;

/// A live process that a pid file of a node names and that is the one recorded (see
/// [`pidfile`]).
fn recorded(state: &Path, file: &str) -> Option<pidfile::Recorded> {
    let comm = if file == "init.pid" {
        "clan-shepherd"
    } else {
        "cland"
    };
    pidfile::read(&state.join(file), comm)
}

/// The servers of the cluster /proc mounts made for the cluster in `dir` (`clan proc
/// mount`), and their watchers (`clan-procfs-w`, which ignore SIGTERM and end with their
/// server's mount), found among the processes of this machine's mount namespace: a
/// `clan-procfs` whose cluster directory (its `--cluster-dir`, else `CLAN_DIR` in its
/// environment, else `/run/clan`, as it chose) is `dir`. A node's own view servers
/// (`--for-shells`) are not among them: they live in the node's namespaces and end with
/// it.
fn view_servers(dir: &Path) -> (Vec<pidfile::Recorded>, Vec<pidfile::Recorded>) {
    use std::os::unix::ffi::OsStrExt;
    let mut found = (Vec::new(), Vec::new());
    let (Ok(want), Ok(procs)) = (std::fs::canonicalize(dir), std::fs::read_dir("/proc")) else {
        return found;
    };
    let our_ns = std::fs::read_link("/proc/self/ns/mnt").ok();
    for e in procs.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(comm) = clan_core::sys::read_small(format!("/proc/{pid}/comm")) else {
            continue;
        };
        let watcher = match comm.trim_end() {
            "clan-procfs" => false,
            "clan-procfs-w" => true,
            _ => continue,
        };
        // Another mount namespace's paths are not ours (a container's /run/clan).
        if std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok() != our_ns {
            continue;
        }
        let Some((state, start)) = clan_core::sys::state_and_start(pid) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        // Its own options, before the mount point's `--`.
        let own = &args[..args.iter().position(|a| *a == b"--").unwrap_or(args.len())];
        if own.contains(&&b"--for-shells"[..]) || matches!(state, 'Z' | 'X') {
            continue;
        }
        let from_env = || {
            let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            env.split(|b| *b == 0)
                .find_map(|v| v.strip_prefix(b"CLAN_DIR=").map(<[u8]>::to_vec))
        };
        let named = match own.iter().position(|a| *a == b"--cluster-dir") {
            Some(at) => own.get(at + 1).map(|d| d.to_vec()),
            None => from_env(),
        }
        .unwrap_or_else(|| clan_core::DEFAULT_DIR.as_bytes().to_vec());
        // A relative directory is the server's working directory's.
        let named =
            Path::new(&format!("/proc/{pid}/cwd")).join(std::ffi::OsStr::from_bytes(&named));
        if std::fs::canonicalize(named).is_ok_and(|d| d == want) {
            let r = pidfile::Recorded {
                pid: pid as i32,
                start,
                verified: false,
            };
            if watcher {
                found.1.push(r);
            } else {
                found.0.push(r);
            }
        }
    }
    found
}

/// A name for the cluster's cgroup, unique per directory (give it the canonical path: a
/// relative one names different directories from different working directories).
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

/// Whether a node of `cfg` has its cland running.
fn any_running(cfg: &ClusterConfig) -> bool {
    cfg.node_ids()
        .any(|n| recorded(&cfg.state_dir(n), "cland.pid").is_some())
}

/// Whether a cluster is running in `dir`.
pub fn running(dir: &Path) -> bool {
    local_config(dir).is_ok_and(|cfg| any_running(&cfg))
}

/// What `dir` holds before `up`: nothing (or does not exist), or a local cluster (running,
/// or what a crashed or interrupted one left). Anything else is refused: `up` and `down`
/// must not take files of others for the cluster's.
fn examine(dir: &Path) -> anyhow::Result<Option<ClusterConfig>> {
    let mut entries = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("read {}", dir.display())),
    };
    if entries.next().is_none() {
        return Ok(None);
    }
    let toml = dir.join("cluster.toml");
    if !toml.exists() {
        return Err(Refused(format!(
            "{} is not empty and holds no local cluster: give an empty or new directory (--dir)",
            dir.display()
        ))
        .into());
    }
    match ClusterConfig::load(&toml) {
        Ok(cfg) if cfg.local => Ok(Some(cfg)),
        Ok(_) => Err(Refused(format!(
            "{} is not a local cluster's (`clan up` writes only local ones): give an empty or new directory (--dir)",
            toml.display()
        ))
        .into()),
        Err(e) => Err(Refused(format!(
            "{} is not empty and its cluster file is unusable ({e}): give an empty or new directory (--dir)",
            dir.display()
        ))
        .into()),
    }
}

/// A cluster `up` started: its daemons run, maybe not ready yet.
#[derive(Debug)]
pub struct Started {
    pub cfg: ClusterConfig,
    /// The cluster directory, canonical.
    pub dir: PathBuf,
    /// The clands, our children until `clan up` exits: sure to be ours to kill even before
    /// they wrote their pid files.
    children: Vec<std::process::Child>,
}

impl Started {
    /// Stops and removes it all, as `down` does, also the daemons that have not yet written
    /// their pid files (`clan up` failed or was interrupted).
    pub fn abort(mut self) -> anyhow::Result<DownReport> {
        teardown(&self.cfg, &self.dir, &mut self.children)
    }
}

/// Writes the cluster file and starts one cland per node. Checks the options and `o.dir`
/// first (a [`Refused`] error when they will not do) and creates nothing before; over what a
/// crashed cluster left in `o.dir`, removes that first (as `down`); if starting fails, removes
/// what it made.
pub fn up(o: &UpOptions) -> anyhow::Result<Started> {
    o.check()?;
    let old = examine(&o.dir)?;
    if old.as_ref().is_some_and(any_running) {
        bail!(
            "a cluster is already running in {} (stop it with `clan down`)",
            o.dir.display()
        );
    }
    let mut addrs = Vec::new();
    for i in 1..=o.nodes {
        let port = o.base_port + i as u16;
        addrs.push(match &o.netns {
            None => std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, port),
            Some((prefix, base)) => {
                let ns = format!("{prefix}{i}");
                if !Path::new("/run/netns").join(&ns).exists() {
                    bail!("network namespace {ns} does not exist (create it with `ip netns add {ns}`)");
                }
                std::net::SocketAddrV4::new((u32::from(*base) + i).into(), port)
            }
        });
    }
    if o.netns.is_none() {
        for a in &addrs {
            std::net::TcpListener::bind(a).with_context(|| {
                format!("port {} is in use (choose another --base-port)", a.port())
            })?;
        }
    }
    let cland = o.bin_dir.join("cland");
    if !cland.exists() {
        bail!("{} not found", cland.display());
    }
    if let Some(cfg) = &old {
        // What a crashed or interrupted cluster left goes first: its namespace inits and
        // view servers, its cgroup tree (a subtree that saw cgroup.kill kills the processes
        // cloned into it), its state files (jobs, load manager, owners).
        teardown(cfg, &o.dir, &mut Vec::new())
            .with_context(|| format!("remove the crashed cluster in {}", o.dir.display()))?;
    }
    std::fs::create_dir_all(&o.dir).with_context(|| format!("create {}", o.dir.display()))?;
    let dir =
        std::fs::canonicalize(&o.dir).with_context(|| format!("resolve {}", o.dir.display()))?;
    let key_path = dir.join("cluster.key");
    let cfg_path = dir.join("cluster.toml");
    let mut created = Vec::new();
    let written = write_files(o, &dir, &addrs, &key_path, &cfg_path, &mut created)
        .and_then(|()| ClusterConfig::load(&cfg_path).map_err(Into::into));
    let cfg = match written {
        Ok(cfg) => cfg,
        Err(e) => {
            for f in &created {
                let _ = std::fs::remove_file(f);
            }
            let _ = std::fs::remove_dir(&dir);
            return Err(e);
        }
    };
    let mut started = Started {
        cfg,
        dir,
        children: Vec::new(),
    };
    for n in started.cfg.node_ids().collect::<Vec<_>>() {
        match spawn_cland(&cfg_path, &started.cfg, n, &cland) {
            Ok(child) => started.children.push(child),
            Err(e) => {
                // The nodes started so far go too.
                return match teardown(&started.cfg, &started.dir, &mut started.children) {
                    Ok(_) => Err(e),
                    Err(e2) => Err(anyhow::anyhow!(
                        "{e:#}; then removing the cluster failed: {e2:#}"
                    )),
                };
            }
        }
    }
    Ok(started)
}

/// Creates `cluster.key` (a fresh random key, mode 0600) and `cluster.toml`, each new
/// (never over a file already there), listing in `created` what it made.
fn write_files(
    o: &UpOptions,
    dir: &Path,
    addrs: &[std::net::SocketAddrV4],
    key_path: &Path,
    cfg_path: &Path,
    created: &mut Vec<PathBuf>,
) -> anyhow::Result<()> {
    let mut create = |path: &Path, mode: u32, text: &str| -> anyhow::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)
            .with_context(|| format!("create {}", path.display()))?;
        created.push(path.to_path_buf());
        f.write_all(text.as_bytes())
            .and_then(|()| f.set_permissions(std::fs::Permissions::from_mode(mode)))
            .with_context(|| format!("write {}", path.display()))
    };
    let mut key = [0u8; 32];
    getrandom::getrandom(&mut key).map_err(|e| anyhow::anyhow!("random key: {e}"))?;
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    create(key_path, 0o600, &(hex + "\n"))?;
    let mut toml = format!(
        "# A local clan cluster written by `clan up`.\nname = \"{}\"\nkey_file = \"cluster.key\"\nlocal = true\nheartbeat_ms = {}\nsuspect_after_ms = {}\ndead_after_ms = {}\nexit_retention_ms = {}\nreattach_ms = {}\n",
        cluster_name(dir),
        o.heartbeat_ms,
        (o.dead_after_ms / 2).max(o.heartbeat_ms * 2),
        o.dead_after_ms,
        o.exit_retention_ms,
        o.reattach_ms
    );
    for (i, addr) in (1..).zip(addrs) {
        toml.push_str(&format!("\n[[node]]\nid = {i}\naddr = \"{addr}\"\n"));
        if let Some((prefix, _)) = &o.netns {
            toml.push_str(&format!("netns = \"{prefix}{i}\"\n"));
        }
        if !o.freezer {
            toml.push_str("freezer = false\n");
        }
        toml.push_str(&format!("workers = {}\n", o.node_workers()));
    }
    create(cfg_path, 0o644, &toml)
}

fn spawn_cland(
    cfg_path: &Path,
    cfg: &ClusterConfig,
    n: NodeId,
    cland: &Path,
) -> anyhow::Result<std::process::Child> {
    let state = cfg.state_dir(n);
    std::fs::create_dir_all(&state).with_context(|| format!("create {}", state.display()))?;
    let log_path = state.join("cland.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("open {}", log_path.display()))?;
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
        .with_context(|| format!("start {} for node {n}", cland.display()))
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
    let cland = recorded(&state, "cland.pid");
    let init = recorded(&state, "init.pid");
    let sub = cgroup::cgroup2_mount()
        .map(|m| node_cgroup(&m, &cfg.name, id))
        .filter(|p| p.join("cgroup.kill").exists());
    if let Some(cg) = &sub {
        std::fs::write(cg.join("cgroup.kill"), "1")
            .with_context(|| format!("kill {}", cg.display()))?;
    } else {
        for p in cland.iter().chain(init.iter()) {
            p.signal(libc::SIGKILL);
        }
    }
    // Gone when its cland and init are and, with a cgroup, when nothing is left in it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while (cland.is_some_and(|p| p.alive())
        || init.is_some_and(|p| p.alive())
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
    if recorded(&cfg.state_dir(id), "cland.pid").is_some() {
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
    spawn_cland(&cfg.path, &cfg, id, &bin_dir.join("cland"))?;
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
    /// Nodes whose cland stopped when asked.
    pub stopped: Vec<u32>,
    /// Nodes whose cland had to be killed.
    pub killed: Vec<u32>,
    /// Whether the directory went too (it did not when it holds files of others).
    pub removed_dir: bool,
}

/// Stops every node of the cluster in `dir` and removes all it left: its processes, its
/// cgroup tree and the files `up` and the nodes made (`cluster.toml`, `cluster.key`,
/// `nodeN/`), then `dir` if that left it empty. Files of others stay.
pub fn down(dir: &Path) -> anyhow::Result<DownReport> {
    let cfg = local_config(dir)?;
    teardown(&cfg, dir, &mut Vec::new())
}

/// `down` of the cluster `cfg` in `dir`; `children` are clands this process started (when
/// `up` fails), killed even if they have not yet written their pid files.
fn teardown(
    cfg: &ClusterConfig,
    dir: &Path,
    children: &mut [std::process::Child],
) -> anyhow::Result<DownReport> {
    let mut report = DownReport::default();
    // The cluster /proc mounts of this cluster (`clan proc mount`): each server unmounts
    // its view when asked to stop; one that does not is killed, and its watcher takes the
    // mount away.
    let (servers, watchers) = view_servers(dir);
    for v in &servers {
        v.signal(libc::SIGTERM);
    }
    for v in &servers {
        if !v.wait_gone(Duration::from_secs(5)) {
            v.signal(libc::SIGKILL);
            v.wait_gone(Duration::from_secs(5));
        }
    }
    // A watcher ends once its server's mount is gone (taking it away itself when its
    // server was killed).
    for w in &watchers {
        if !w.wait_gone(Duration::from_secs(5)) {
            w.signal(libc::SIGKILL);
        }
    }
    for n in cfg.node_ids() {
        let state = cfg.state_dir(n);
        // Only the cland recorded there, never a process that got its pid since.
        let Some(cland) = recorded(&state, "cland.pid") else {
            continue;
        };
        let asked = request(
            &crate::socket_path(&state),
            pb::local_request::Op::Shutdown(pb::ShutdownRequest {
                kill_processes: true,
            }),
            Duration::from_secs(5),
        )
        .is_ok();
        if asked && cland.wait_gone(Duration::from_secs(15)) {
            report.stopped.push(n.get());
        } else {
            cland.signal(libc::SIGKILL);
            cland.wait_gone(Duration::from_secs(5));
            report.killed.push(n.get());
        }
    }
    for c in children.iter_mut() {
        // Our child, so its pid is its own until we reap it.
        if matches!(c.try_wait(), Ok(None)) {
            let _ = c.kill();
        }
        let _ = c.wait();
    }
    // A node whose cland died leaves its namespace init: kill it (and with it the node).
    for n in cfg.node_ids() {
        if let Some(init) = recorded(&cfg.state_dir(n), "init.pid") {
            init.signal(libc::SIGKILL);
            init.wait_gone(Duration::from_secs(5));
        }
    }
    if let Some(mount) = cgroup::cgroup2_mount() {
        let cg = cluster_cgroup(&mount, &cfg.name);
        cgroup::kill_and_remove(&cg, Duration::from_secs(15))
            .with_context(|| format!("remove {}", cg.display()))?;
    }
    report.removed_dir = remove_files(cfg, dir)?;
    Ok(report)
}

/// Removes what `up` and the nodes made in `dir`, `cluster.toml` last (so that a `down`
/// cut short can be run again), then `dir` if nothing else is in it. Returns whether `dir`
/// went.
fn remove_files(cfg: &ClusterConfig, dir: &Path) -> anyhow::Result<bool> {
    // The directory itself, not a symbolic link to it.
    let dir = &std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let gone = |r: std::io::Result<()>, p: &Path| match r {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("remove {}", p.display()))
        }
        _ => Ok(()),
    };
    for n in cfg.node_ids() {
        let node = dir.join(format!("node{n}"));
        gone(std::fs::remove_dir_all(&node), &node)?;
    }
    for f in ["cluster.key", "cluster.toml"] {
        let p = dir.join(f);
        gone(std::fs::remove_file(&p), &p)?;
    }
    match std::fs::remove_dir(dir) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => Ok(false),
        Err(e) => Err(e).with_context(|| format!("remove {}", dir.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> UpOptions {
        UpOptions {
            dir: PathBuf::from("/nonexistent/clan-up-test"),
            nodes: 4,
            base_port: 7100,
            heartbeat_ms: 500,
            dead_after_ms: 3000,
            exit_retention_ms: 1000,
            reattach_ms: 1000,
            freezer: true,
            bin_dir: PathBuf::from("/nonexistent"),
            netns: None,
            workers: None,
        }
    }

    #[test]
    fn options_are_checked_naming_the_flag() {
        assert!(opts().check().is_ok());
        let bad = |f: &dyn Fn(&mut UpOptions), flag: &str| {
            let mut o = opts();
            f(&mut o);
            let e = o.check().expect_err(flag).0;
            assert!(e.starts_with(flag), "{e}");
            // Refused before anything is made.
            let e = up(&o).expect_err(flag);
            assert!(e.is::<Refused>(), "{e:#}");
        };
        bad(&|o| o.nodes = 0, "--nodes 0");
        bad(&|o| o.nodes = clan_core::MAX_NODE + 1, "--nodes 214");
        bad(&|o| o.heartbeat_ms = 0, "--heartbeat-ms 0");
        bad(&|o| o.dead_after_ms = 1499, "--dead-after-ms 1499");
        bad(&|o| o.dead_after_ms = u64::MAX, "--dead-after-ms");
        bad(&|o| o.base_port = 65532, "--base-port 65532");
        bad(
            &|o| o.netns = Some(("x".into(), std::net::Ipv4Addr::new(255, 255, 255, 254))),
            "--ip-base",
        );
        bad(&|o| o.workers = Some(0), "--workers 0");
        bad(&|o| o.workers = Some(MAX_WORKERS + 1), "--workers 257");
        let mut o = opts();
        o.dead_after_ms = 1500;
        assert!(o.check().is_ok());
        assert!(!o.dir.exists());
    }

    /// Each node gets the workers asked for, else its share of the machine's CPUs: one at
    /// least, two at most (the daemon's default).
    #[test]
    fn nodes_share_the_machine_s_cpus_among_their_workers() {
        let mut o = opts();
        o.workers = Some(3);
        assert_eq!(o.node_workers(), 3);
        o.workers = None;
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        for nodes in [1, 2, 4, 64] {
            o.nodes = nodes;
            let w = o.node_workers();
            assert!((1..=clan_core::config::DEFAULT_WORKERS).contains(&w), "{w}");
            assert_eq!(w, (cpus / nodes as usize).clamp(1, 2), "{nodes} nodes");
        }
    }

    /// A cluster whose node ports lie in the kernel's ephemeral range is told so (the
    /// default ports lie below it); one in network namespaces is not concerned.
    #[test]
    fn node_ports_among_the_ephemeral_ones_are_noticed() {
        let (lo, _) = ephemeral_ports().unwrap();
        let mut o = opts();
        if lo > 7104 {
            assert_eq!(o.ephemeral_overlap(), None);
        }
        // The last node's port is the range's first.
        o.base_port = u16::try_from(lo - 4).unwrap();
        assert_eq!(o.ephemeral_overlap().map(|r| r.0), Some(lo));
        o.base_port = u16::try_from(lo - 5).unwrap();
        assert_eq!(o.ephemeral_overlap(), None);
        o.base_port = u16::try_from(lo - 4).unwrap();
        o.netns = Some(("x".into(), std::net::Ipv4Addr::new(10, 0, 0, 0)));
        assert_eq!(o.ephemeral_overlap(), None);
    }

    #[test]
    fn cluster_names_differ_per_directory() {
        let a = cluster_name(Path::new("/tmp/a/rel"));
        let b = cluster_name(Path::new("/tmp/b/rel"));
        assert_ne!(a, b);
        assert!(a.starts_with("rel-") && b.starts_with("rel-"));
        assert_eq!(a, cluster_name(Path::new("/tmp/a/rel")));
    }
}
