//! The cluster file (TOML, like slurm.conf): node ids, addresses, the cluster key.
//!
//! ```toml
//! name = "prod"
//! key_file = "/etc/clan/cluster.key"   # 32+ random bytes, mode 0600
//! heartbeat_ms = 500
//! suspect_after_ms = 1500
//! dead_after_ms = 3000
//! reattach_ms = 10000                  # how long an attached process waits for its stub
//! log_max_bytes = 16777216             # output of a detached process kept (0: all)
//!
//! [[node]]
//! id = 1
//! addr = "10.0.0.1:7100"
//! # freezer = false                  # suspend and kill jobs by signals, not the cgroup freezer
//! # workers = 2                      # cland's runtime worker threads (CLAN_WORKERS overrides)
//! # switch_priority = 1              # SCHED_FIFO priority of a freeze or thaw (0: ordinary)
//! ```

use crate::id::NodeId;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Why a cluster file can not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    // `err`, not `source`: the message carries it, and a chain printed with `{:#}` would
    // say it twice.
    #[error("cannot read {path}: {err}")]
    Read { path: PathBuf, err: std::io::Error },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("cannot read cluster key {path}: {err}")]
    Key { path: PathBuf, err: std::io::Error },
    #[error("cluster key {0} is shorter than 16 bytes")]
    ShortKey(PathBuf),
    #[error("node {0} is not in the cluster file")]
    NoSuchNode(u32),
}

/// One node of the cluster file.
#[derive(Debug, Clone, Deserialize)]
pub struct NodeEntry {
    pub id: u32,
    pub addr: SocketAddr,
    /// Local clusters: the named network namespace (`/run/netns/NAME`, as `ip netns add`
    /// makes) the node's daemon and processes run in, for tests that cut links.
    #[serde(default)]
    pub netns: Option<String>,
    /// Whether the node suspends its jobs' tasks with the cgroup v2 freezer
    /// (`cgroup.freeze`) and kills them with `cgroup.kill` where the kernel has them
    /// [default: true]. `false`: both by the signal method (SIGSTOP top-down, SIGCONT
    /// bottom-up, SIGKILL top-down over the task's genealogy), as on kernels without them.
    #[serde(default = "default_freezer")]
    pub freezer: bool,
    /// Worker threads of the node daemon's runtime [default: [`DEFAULT_WORKERS`]];
    /// `CLAN_WORKERS` in cland's environment overrides it. A local cluster's nodes share
    /// one machine: `clan up` gives each its share of the CPUs.
    #[serde(default)]
    pub workers: Option<usize>,
    /// The real-time (`SCHED_FIFO`) priority of the daemon's thread while it freezes or
    /// thaws a task with the cgroup freezer (a suspend, a resume, a job switch)
    /// [default: [`DEFAULT_SWITCH_PRIORITY`]]; 0: the thread's ordinary priority. Busy
    /// processes just thawed would otherwise each run a time slice before the switch
    /// is done.
    #[serde(default = "default_switch_priority")]
    pub switch_priority: u8,
}

/// [`NodeEntry::switch_priority`] when the cluster file does not say: the lowest
/// real-time priority, above every ordinary thread and below every other real-time one.
pub const DEFAULT_SWITCH_PRIORITY: u8 = 1;

fn default_switch_priority() -> u8 {
    DEFAULT_SWITCH_PRIORITY
}

/// Worker threads of a node daemon's runtime when neither the cluster file nor
/// `CLAN_WORKERS` says.
pub const DEFAULT_WORKERS: usize = 2;

fn default_freezer() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    name: String,
    key_file: PathBuf,
    #[serde(default = "default_heartbeat")]
    heartbeat_ms: u64,
    #[serde(default)]
    suspect_after_ms: Option<u64>,
    #[serde(default)]
    dead_after_ms: Option<u64>,
    #[serde(default = "default_exit_retention")]
    exit_retention_ms: u64,
    #[serde(default = "default_reattach")]
    reattach_ms: u64,
    #[serde(default = "default_log_max")]
    log_max_bytes: u64,
    /// Local clusters: every node gets its own pid namespace and cgroup subtree.
    #[serde(default)]
    local: bool,
    /// Where node state lives; `{node}` is replaced by the node id.
    #[serde(default)]
    state_dir: Option<String>,
    /// Root of the clan tree for CLI lookups (sockets live in `dir/node<N>/`).
    #[serde(default)]
    dir: Option<PathBuf>,
    /// Where each cland (as root) mounts its node's cluster /proc view, the one `clan shell`
    /// uses; `{node}` is replaced by the node id [default: `<state_dir>/proc`].
    #[serde(default)]
    proc_view: Option<String>,
    node: Vec<NodeEntry>,
}

fn default_heartbeat() -> u64 {
    500
}

/// An hour, an order of magnitude above Slurm's default `MinJobAge` (300 s): long enough
/// to `clan wait` for a detached process after a coffee, short enough that unwaited ones do
/// not pile up.
pub const DEFAULT_EXIT_RETENTION_MS: u64 = 3_600_000;

fn default_exit_retention() -> u64 {
    DEFAULT_EXIT_RETENTION_MS
}

/// Ten seconds: a cland restarted by systemd (`RestartSec=1`) is back well within it.
pub const DEFAULT_REATTACH_MS: u64 = 10_000;

fn default_reattach() -> u64 {
    DEFAULT_REATTACH_MS
}

/// 16 MiB: the newest output of a detached process kept in its log (`GPID.log` and
/// `GPID.log.1`, 8 MiB each at most), as kubelet keeps 10 MiB per container log file.
/// Node state lives in /run (RAM) by default: a log must not grow with its output.
pub const DEFAULT_LOG_MAX_BYTES: u64 = 16 << 20;

/// The smallest cap a cluster file may set (0 aside, which keeps everything).
pub const MIN_LOG_MAX_BYTES: u64 = 64 << 10;

fn default_log_max() -> u64 {
    DEFAULT_LOG_MAX_BYTES
}

/// A parsed cluster file with its key.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub name: String,
    pub key: Vec<u8>,
    pub heartbeat_ms: u64,
    pub suspect_after_ms: u64,
    pub dead_after_ms: u64,
    /// How long the exit status of a detached process with no parent in the cluster
    /// (started from outside it) waits for a `clan wait` before the process is reaped,
    /// as init would (Slurm's `MinJobAge`).
    pub exit_retention_ms: u64,
    /// How long an attached process whose session broke while its stub's node lives (a
    /// cland restarted on either end) waits for the stub to reattach before it is hung up,
    /// and how long the stub keeps trying.
    pub reattach_ms: u64,
    /// How much of a detached process's newest output its log keeps (0: all of it).
    pub log_max_bytes: u64,
    pub local: bool,
    pub dir: PathBuf,
    state_dir: String,
    proc_view: Option<String>,
    pub nodes: Vec<NodeEntry>,
    pub path: PathBuf,
}

impl ClusterConfig {
    /// `dead_after_ms`: how long a silent node takes to be dead, and so the bound of any
    /// wait for another node.
    pub fn dead_after(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.dead_after_ms)
    }

    /// `reattach_ms` as a duration.
    pub fn reattach(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.reattach_ms)
    }

    /// Reads and checks a cluster file and the key it names.
    pub fn load(path: &Path) -> Result<ClusterConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|err| ConfigError::Read {
            path: path.into(),
            err,
        })?;
        let raw: RawConfig = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.into(),
            message: e.to_string(),
        })?;
        let perr = |message: String| ConfigError::Parse {
            path: path.into(),
            message,
        };
        if raw.node.is_empty() {
            return Err(perr("no [[node]] entries".into()));
        }
        let mut seen = std::collections::HashSet::new();
        for n in &raw.node {
            if NodeId::new(n.id).is_none() {
                return Err(perr(format!("node id {} outside 1..=213", n.id)));
            }
            if !seen.insert(n.id) {
                return Err(perr(format!("node {} listed twice", n.id)));
            }
        }
        if raw.log_max_bytes != 0 && raw.log_max_bytes < MIN_LOG_MAX_BYTES {
            return Err(perr(format!(
                "log_max_bytes must be 0 (no cap) or at least {MIN_LOG_MAX_BYTES}"
            )));
        }
        if raw.heartbeat_ms == 0 {
            return Err(perr("heartbeat_ms must be positive".into()));
        }
        let base = path.parent().unwrap_or(Path::new("/"));
        let key_path = if raw.key_file.is_absolute() {
            raw.key_file.clone()
        } else {
            base.join(&raw.key_file)
        };
        let key = std::fs::read(&key_path).map_err(|err| ConfigError::Key {
            path: key_path.clone(),
            err,
        })?;
        let key: Vec<u8> = String::from_utf8(key.clone())
            .map(|s| s.trim().as_bytes().to_vec())
            .unwrap_or(key);
        if key.len() < 16 {
            return Err(ConfigError::ShortKey(key_path));
        }
        let dir = raw.dir.clone().unwrap_or_else(|| base.to_path_buf());
        let mut nodes = raw.node;
        nodes.sort_by_key(|n| n.id);
        Ok(ClusterConfig {
            name: raw.name,
            key,
            heartbeat_ms: raw.heartbeat_ms,
            suspect_after_ms: raw.suspect_after_ms.unwrap_or(raw.heartbeat_ms * 3),
            dead_after_ms: raw.dead_after_ms.unwrap_or(raw.heartbeat_ms * 6),
            exit_retention_ms: raw.exit_retention_ms,
            reattach_ms: raw.reattach_ms,
            log_max_bytes: raw.log_max_bytes,
            local: raw.local,
            state_dir: raw
                .state_dir
                .unwrap_or_else(|| dir.join("node{node}").display().to_string()),
            dir,
            proc_view: raw.proc_view,
            nodes,
            path: path.into(),
        })
    }

    pub fn node(&self, id: NodeId) -> Result<&NodeEntry, ConfigError> {
        self.nodes
            .iter()
            .find(|n| n.id == id.get())
            .ok_or(ConfigError::NoSuchNode(id.get()))
    }

    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes.iter().filter_map(|n| NodeId::new(n.id))
    }

    /// The state directory of `node`.
    pub fn state_dir(&self, node: NodeId) -> PathBuf {
        PathBuf::from(self.state_dir.replace("{node}", &node.to_string()))
    }

    /// Where `node`'s cland mounts its cluster /proc view (`proc_view`, else in its state
    /// directory).
    pub fn proc_view(&self, node: NodeId) -> PathBuf {
        match &self.proc_view {
            Some(p) => PathBuf::from(p.replace("{node}", &node.to_string())),
            None => self.state_dir(node).join("proc"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_a_cluster_file() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("k"), "0123456789abcdef0123\n").unwrap();
        let p = d.path().join("cluster.toml");
        std::fs::write(
            &p,
            "name = \"t\"\nkey_file = \"k\"\nlocal = true\n[[node]]\nid = 2\naddr = \"127.0.0.1:7002\"\n[[node]]\nid = 1\naddr = \"127.0.0.1:7001\"\n",
        )
        .unwrap();
        let c = ClusterConfig::load(&p).unwrap();
        assert_eq!(c.nodes[0].id, 1);
        assert!(
            c.nodes.iter().all(|n| n.freezer),
            "the freezer is used by default"
        );
        assert!(c
            .nodes
            .iter()
            .all(|n| n.switch_priority == DEFAULT_SWITCH_PRIORITY));
        assert_eq!(c.key, b"0123456789abcdef0123");
        assert_eq!(c.dead_after_ms, 3000);
        assert_eq!(c.exit_retention_ms, DEFAULT_EXIT_RETENTION_MS);
        assert_eq!(c.log_max_bytes, DEFAULT_LOG_MAX_BYTES);
        assert_eq!(c.state_dir(NodeId::new(2).unwrap()), d.path().join("node2"));
        assert_eq!(
            c.proc_view(NodeId::new(2).unwrap()),
            d.path().join("node2").join("proc")
        );
        std::fs::write(
            &p,
            "name = \"t\"\nkey_file = \"k\"\nproc_view = \"/run/v{node}\"\n[[node]]\nid = 1\naddr = \"127.0.0.1:7001\"\nfreezer = false\nworkers = 3\nswitch_priority = 0\n",
        )
        .unwrap();
        let c = ClusterConfig::load(&p).unwrap();
        assert!(!c.nodes[0].freezer);
        assert_eq!(c.nodes[0].workers, Some(3));
        assert_eq!(c.nodes[0].switch_priority, 0);
        assert_eq!(
            c.proc_view(NodeId::new(1).unwrap()),
            PathBuf::from("/run/v1")
        );
        // The example shipped for real deployments loads (its key aside).
        let example = include_str!("../../../deploy/cluster.toml.example")
            .replace("/etc/clan/cluster.key", "k");
        std::fs::write(&p, example).unwrap();
        let c = ClusterConfig::load(&p).unwrap();
        assert_eq!(c.exit_retention_ms, 3_600_000);
        assert_eq!(c.log_max_bytes, DEFAULT_LOG_MAX_BYTES);
    }

    #[test]
    fn rejects_bad_files() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("k"), "short").unwrap();
        let p = d.path().join("c.toml");
        for (text, want) in [
            ("name = \"t\"\nkey_file = \"k\"\nnode = []\n", "no [[node]]"),
            (
                "name = \"t\"\nkey_file = \"k\"\n[[node]]\nid = 0\naddr = \"127.0.0.1:1\"\n",
                "outside",
            ),
            (
                "name = \"t\"\nkey_file = \"k\"\n[[node]]\nid = 1\naddr = \"127.0.0.1:1\"\n",
                "shorter",
            ),
            (
                "name = \"t\"\nkey_file = \"k\"\nlog_max_bytes = 100\n[[node]]\nid = 1\naddr = \"127.0.0.1:1\"\n",
                "log_max_bytes must be 0",
            ),
            ("name = 3\n", "invalid type"),
        ] {
            std::fs::write(&p, text).unwrap();
            let e = ClusterConfig::load(&p).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
    }
}
