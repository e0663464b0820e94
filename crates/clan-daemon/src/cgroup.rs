//! The node's cgroup v2 subtree (DESIGN.md 5, 12).
//!
//! ```text
//! <cgroup2 mount>/clan.<cluster>/node<N>/     local clusters
//! <cgroup2 mount>/<cland's own cgroup>/       real nodes (systemd Delegate=yes)
//!     daemon/      cland itself
//!     init/        the node's namespace init (local clusters)
//!     shepherds/   one shepherd per managed process
//!     job<J>/      the task of job J on this node
//! ```
//! Writing 1 to the node directory's `cgroup.kill` kills everything of the node at once.

use std::io;
use std::path::{Path, PathBuf};

/// Finds the cgroup v2 mount in /proc/self/mountinfo (it is not always /sys/fs/cgroup).
pub fn cgroup2_mount() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        if post.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        Some(PathBuf::from(pre.split_whitespace().nth(4)?))
    })
}

/// Our own cgroup v2 path relative to the mount ("/system.slice/cland.service").
pub fn own_cgroup() -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_string))
}

#[derive(Debug, Clone)]
pub struct NodeCgroup {
    pub root: PathBuf,
}

impl NodeCgroup {
    /// Creates (or reuses) the node's subtree.
    pub fn create(root: PathBuf) -> io::Result<NodeCgroup> {
        for sub in ["", "daemon", "init", "shepherds"] {
            std::fs::create_dir_all(root.join(sub))?;
        }
        Ok(NodeCgroup { root })
    }

    pub fn sub(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// The task directory of a job, created on first use.
    pub fn job(&self, job: u64) -> io::Result<PathBuf> {
        let p = self.root.join(format!("job{job}"));
        std::fs::create_dir_all(&p)?;
        Ok(p)
    }

    pub fn enter(&self, sub: &str) -> io::Result<()> {
        std::fs::write(self.sub(sub).join("cgroup.procs"), "0")
    }

    /// Removes job directories that hold no process any more.
    /// Jobs in `busy` (processes being started or still known to cland) are kept.
    pub fn prune_jobs(&self, busy: &std::collections::HashSet<u64>) {
        let Ok(rd) = std::fs::read_dir(&self.root) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(job) = name.strip_prefix("job").and_then(|j| j.parse::<u64>().ok()) else {
                continue;
            };
            if !busy.contains(&job) && !populated(&e.path()) {
                let _ = std::fs::remove_dir(e.path());
            }
        }
    }
}

/// Whether a cgroup (with its descendants) holds any process.
pub fn populated(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.events"))
        .map(|t| t.lines().any(|l| l == "populated 1"))
        .unwrap_or(false)
}

/// Kills every process in `dir` and below (cgroup.kill) and removes the directories once empty.
pub fn kill_and_remove(dir: &Path, timeout: std::time::Duration) -> io::Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    std::fs::write(dir.join("cgroup.kill"), "1")?;
    let deadline = std::time::Instant::now() + timeout;
    while populated(dir) {
        if std::time::Instant::now() > deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{} still populated", dir.display()),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    remove_tree(dir)
}

/// Removes a cgroup directory and its children, deepest first.
pub fn remove_tree(dir: &Path) -> io::Result<()> {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_tree(&e.path())?;
            }
        }
    }
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
