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
//! (In v1 hierarchies also `spare<N>/`: directories made ahead for the next new tasks.)
//! Writing 1 to the node directory's `cgroup.kill` kills everything of the node at once.
//!
//! The pids and memory controllers serve tasks from the v2 tree when its root offers them,
//! else from their v1 hierarchies, where the node's directory mirrors the v2 path
//! (`<pids v1 mount>/clan.<cluster>/node<N>/job<J>/`); a process joins those by writing
//! itself (`0`) to their `tasks` before exec, and as root-owned directories they are as
//! inescapable as the v2 one. `tasks`, not `cgroup.procs`: the new process has one thread,
//! so moving it moves the process, and the kernel moves the writing thread itself without
//! its global threadgroup lock, whose taking waits for an RCU grace period (5 to 16 ms
//! measured here) unless cgroup2 is mounted with `favordynmods`.

use std::io;
use std::path::{Path, PathBuf};

/// Finds the cgroup v2 mount in /proc/self/mountinfo (it is not always /sys/fs/cgroup);
/// read once per process.
pub fn cgroup2_mount() -> Option<PathBuf> {
    static MOUNT: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    MOUNT.get_or_init(find_cgroup2_mount).clone()
}

fn find_cgroup2_mount() -> Option<PathBuf> {
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

/// Controllers a task uses besides cgroup v2's core (freeze, kill, cpu.stat): `pids` for
/// its process limit, `memory` for its usage.
pub const CONTROLLERS: [&str; 2] = ["pids", "memory"];

/// Where a controller serves the node: in the v2 tree itself, or (hybrid setups, where the
/// v2 root does not offer it) in the controller's v1 hierarchy, under the same relative path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtlDir {
    pub name: &'static str,
    pub v1: bool,
    /// The node's directory in that hierarchy.
    pub root: PathBuf,
}

/// The v1 hierarchies (mount points) that carry `controller`, from /proc/self/mountinfo.
pub fn v1_mount(controller: &str) -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let mut post = post.split_whitespace();
        if post.next()? != "cgroup" {
            return None;
        }
        let opts = post.nth(1)?;
        if !opts.split(',').any(|o| o == controller) {
            return None;
        }
        Some(PathBuf::from(pre.split_whitespace().nth(4)?))
    })
}

/// The directories mirroring v2 directory `dir` in the v1 hierarchies of our controllers.
pub fn v1_mirrors(dir: &Path) -> Vec<PathBuf> {
    let Some(rel) = cgroup2_mount().and_then(|m| dir.strip_prefix(m).ok().map(Path::to_path_buf))
    else {
        return Vec::new();
    };
    CONTROLLERS
        .iter()
        .filter_map(|c| v1_mount(c))
        .map(|m| m.join(&rel))
        .collect()
}

fn offers(dir: &Path, controller: &str) -> bool {
    clan_core::sys::read_small(dir.join("cgroup.controllers"))
        .is_ok_and(|t| t.split_whitespace().any(|c| c == controller))
}

#[derive(Clone)]
pub struct NodeCgroup {
    pub root: PathBuf,
    pub ctls: Vec<CtlDir>,
    /// Empty directories made ahead in the v1 hierarchies (`spare<N>`), one set per
    /// number: a new task takes a set and renames it `job<J>` (v1 cgroups can be renamed,
    /// v2 ones can not), so that a start does not wait for their making (a memory cgroup's
    /// `mkdir` allocates its per-CPU statistics: 50 to 80 µs here).
    spares: std::sync::Arc<clan_core::NamedMutex<Spares>>,
}

impl std::fmt::Debug for NodeCgroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCgroup")
            .field("root", &self.root)
            .field("ctls", &self.ctls)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Spares {
    ready: Vec<u64>,
    next: u64,
}

/// v1 directory sets kept made ahead ([`NodeCgroup::make_spares`]).
const SPARES: usize = 2;

impl NodeCgroup {
    /// Creates (or reuses) the node's subtree.
    pub fn create(root: PathBuf) -> io::Result<NodeCgroup> {
        for sub in ["", "daemon", "init", "shepherds"] {
            std::fs::create_dir_all(root.join(sub))?;
        }
        Ok(NodeCgroup {
            root,
            ctls: Vec::new(),
            spares: std::sync::Arc::new(clan_core::NamedMutex::new(
                "cgroup.spares",
                Spares::default(),
            )),
        })
    }

    /// Finds (and enables) the pids and memory controllers for the node's tasks: in the v2
    /// tree when its root offers them (enabled down to the node; call this once cland has
    /// left the node's directory), else in their v1 hierarchies. One without either is
    /// left out: its limits can not be set, its figures read 0.
    pub fn setup_controllers(&mut self) {
        let mount = cgroup2_mount();
        for name in CONTROLLERS {
            if let Some(m) = &mount {
                if let Ok(rel) = self.root.strip_prefix(m) {
                    let mut dir = m.clone();
                    for part in rel.components().map(|c| c.as_os_str().to_owned()) {
                        if offers(&dir, name) {
                            let _ = std::fs::write(
                                dir.join("cgroup.subtree_control"),
                                format!("+{name}"),
                            );
                        }
                        dir.push(part);
                    }
                }
                if offers(&self.root, name)
                    && std::fs::write(self.root.join("cgroup.subtree_control"), format!("+{name}"))
                        .is_ok()
                {
                    self.ctls.push(CtlDir {
                        name,
                        v1: false,
                        root: self.root.clone(),
                    });
                    continue;
                }
            }
            let Some(mirror) = mount
                .as_ref()
                .and_then(|m| self.root.strip_prefix(m).ok())
                .and_then(|rel| Some(v1_mount(name)?.join(rel)))
            else {
                continue;
            };
            match std::fs::create_dir_all(&mirror) {
                Ok(()) => self.ctls.push(CtlDir {
                    name,
                    v1: true,
                    root: mirror,
                }),
                Err(e) => {
                    tracing::warn!("{}: {e}; no {name} controller for tasks", mirror.display())
                }
            }
        }
    }

    /// The directory of job `job`'s task for controller `name`, if the node has it.
    pub fn ctl_dir(&self, name: &str, job: u64) -> Option<PathBuf> {
        self.ctls
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.root.join(format!("job{job}")))
    }

    /// The task's directories in v1 hierarchies (the process joins them by writing to their
    /// `tasks`; the v2 one it is born in).
    pub fn v1_job_dirs(&self, job: u64) -> Vec<PathBuf> {
        self.v1_ctls()
            .map(|c| c.root.join(format!("job{job}")))
            .collect()
    }

    pub fn sub(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// The job whose task holds host process `pid`, from its cgroup: a task of this node,
    /// or with `siblings` also one of another node of the same local cluster.
    pub fn task_of(&self, pid: u32, siblings: bool) -> Option<u64> {
        let text = clan_core::sys::read_small(format!("/proc/{pid}/cgroup")).ok()?;
        let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
        let path = cgroup2_mount()?.join(rel.trim_start_matches('/'));
        let mut under = match path.strip_prefix(&self.root) {
            Ok(p) => p.components(),
            Err(_) if siblings => {
                let mut c = path.strip_prefix(self.root.parent()?).ok()?.components();
                c.next()?; // the sibling node's directory
                c
            }
            Err(_) => return None,
        };
        under
            .next()?
            .as_os_str()
            .to_str()?
            .strip_prefix("job")?
            .parse()
            .ok()
    }

    /// Where job `job`'s task is (or would be) in the v2 tree.
    pub fn job_dir(&self, job: u64) -> PathBuf {
        self.root.join(format!("job{job}"))
    }

    /// The task directory of a job, created on first use (with its v1 directories: for a
    /// new task, a spare set renamed when there is one).
    pub fn job(&self, job: u64) -> io::Result<PathBuf> {
        let p = self.job_dir(job);
        // The v2 directory says whether the task is new: only a new one takes a spare.
        let new = match std::fs::create_dir(&p) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
            Err(_) => {
                std::fs::create_dir_all(&p)?;
                true
            }
        };
        let spare = if new {
            self.spares.lock().ready.pop()
        } else {
            None
        };
        for c in self.v1_ctls() {
            let dir = c.root.join(format!("job{job}"));
            if let Some(n) = spare {
                // Made meanwhile by another start of the job (EEXIST), or the spare went:
                // the directory is made as without spares.
                if std::fs::rename(Self::spare_dir(c, n), &dir).is_ok() {
                    continue;
                }
                let _ = std::fs::remove_dir(Self::spare_dir(c, n));
            }
            std::fs::create_dir_all(&dir)?;
        }
        Ok(p)
    }

    /// The controllers served from v1 hierarchies.
    fn v1_ctls(&self) -> impl Iterator<Item = &CtlDir> {
        self.ctls.iter().filter(|c| c.v1)
    }

    /// Spare set `n`'s directory in `c`'s hierarchy.
    fn spare_dir(c: &CtlDir, n: u64) -> PathBuf {
        c.root.join(format!("spare{n}"))
    }

    /// Makes v1 directory sets ahead, up to `SPARES` (two; off a start's path). Sets left by
    /// an earlier cland are removed first, once (`fresh`).
    pub fn make_spares(&self, fresh: bool) {
        if self.v1_ctls().next().is_none() {
            return;
        }
        if fresh {
            for c in self.v1_ctls() {
                for e in std::fs::read_dir(&c.root).into_iter().flatten().flatten() {
                    if e.file_name().to_string_lossy().starts_with("spare") {
                        let _ = std::fs::remove_dir(e.path());
                    }
                }
            }
        }
        loop {
            let n = {
                let mut sp = self.spares.lock();
                if sp.ready.len() >= SPARES {
                    return;
                }
                sp.next += 1;
                sp.next
            };
            if !self
                .v1_ctls()
                .all(|c| std::fs::create_dir(Self::spare_dir(c, n)).is_ok())
            {
                for c in self.v1_ctls() {
                    let _ = std::fs::remove_dir(Self::spare_dir(c, n));
                }
                return;
            }
            self.spares.lock().ready.push(n);
        }
    }

    /// Sets the most processes the task may have at once (`pids.max`).
    pub fn set_max_procs(&self, job: u64, max: u32) -> io::Result<()> {
        let dir = self.ctl_dir("pids", job).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                "no pids controller (neither in cgroup v2 nor in a v1 hierarchy)",
            )
        })?;
        std::fs::write(dir.join("pids.max"), max.to_string())
    }

    /// The task's memory use and its peak, in bytes (0 without the memory controller).
    pub fn memory(&self, job: u64) -> (u64, u64) {
        let Some(c) = self.ctls.iter().find(|c| c.name == "memory") else {
            return (0, 0);
        };
        let dir = c.root.join(format!("job{job}"));
        let read = |f: &str| -> u64 {
            clan_core::sys::read_small(dir.join(f))
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        if c.v1 {
            (
                read("memory.usage_in_bytes"),
                read("memory.max_usage_in_bytes"),
            )
        } else {
            (read("memory.current"), read("memory.peak"))
        }
    }

    /// The task's process limit (`None`: no limit or no pids controller).
    pub fn max_procs(&self, job: u64) -> Option<u32> {
        let dir = self.ctl_dir("pids", job)?;
        clan_core::sys::read_small(dir.join("pids.max"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    pub fn enter(&self, sub: &str) -> io::Result<()> {
        std::fs::write(self.sub(sub).join("cgroup.procs"), "0")
    }

    /// Removes job directories that hold no process any more; returns their jobs.
    /// Jobs in `busy` (processes being started or still known to cland) are kept.
    pub fn prune_jobs(&self, busy: &std::collections::HashSet<u64>) -> Vec<u64> {
        let mut removed = Vec::new();
        let Ok(rd) = std::fs::read_dir(&self.root) else {
            return removed;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(job) = name.strip_prefix("job").and_then(|j| j.parse::<u64>().ok()) else {
                continue;
            };
            if !busy.contains(&job) && !populated(&e.path()) {
                for d in self.v1_job_dirs(job) {
                    let _ = std::fs::remove_dir(d);
                }
                if std::fs::remove_dir(e.path()).is_ok() {
                    removed.push(job);
                }
            }
        }
        removed
    }
}

/// Whether a cgroup (with its descendants) holds any process.
pub fn populated(dir: &Path) -> bool {
    clan_core::sys::read_small(dir.join("cgroup.events"))
        .map(|t| t.lines().any(|l| l == "populated 1"))
        .unwrap_or(false)
}

/// The processes in `dir` and its descendant cgroups.
fn procs_below(dir: &Path, out: &mut Vec<u32>) {
    let text = clan_core::sys::read_small(dir.join("cgroup.procs")).unwrap_or_default();
    out.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                procs_below(&e.path(), out);
            }
        }
    }
}

/// Kills every process in `dir` and below (cgroup.kill; where the kernel has none, before
/// Linux 5.14, SIGKILL to each process, in rounds until none is left, frozen or stopped
/// ones too) and removes the directories once empty.
pub fn kill_and_remove(dir: &Path, timeout: std::time::Duration) -> io::Result<()> {
    if !dir.exists() {
        remove_v1_mirrors(dir);
        return Ok(());
    }
    let by_signals = match std::fs::write(dir.join("cgroup.kill"), "1") {
        Ok(()) => false,
        Err(e) if e.kind() == io::ErrorKind::NotFound && dir.exists() => true,
        Err(e) => return Err(e),
    };
    let deadline = std::time::Instant::now() + timeout;
    while populated(dir) {
        if by_signals {
            let mut pids = Vec::new();
            procs_below(dir, &mut pids);
            for p in pids {
                // SAFETY: kill(2) takes plain integers and touches no memory of ours.
                unsafe {
                    libc::kill(p as libc::pid_t, libc::SIGKILL);
                }
            }
        }
        if std::time::Instant::now() > deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{} still populated", dir.display()),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    remove_v1_mirrors(dir);
    remove_tree(dir)
}

/// Removes the v1 directories mirroring v2 directory `dir` (its processes are gone).
pub fn remove_v1_mirrors(dir: &Path) {
    for m in v1_mirrors(dir) {
        if let Err(e) = remove_tree(&m) {
            tracing::warn!("{}: {e}", m.display());
        }
    }
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
