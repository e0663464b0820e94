//! Jobs and their tasks (DESIGN.md 12; the process tracking paper's M1 to M5).
//!
//! A job's task on a node is the job's cgroup there (`job<J>/`): every process clan starts
//! for the job is born in it (`CLONE_INTO_CGROUP`), and every descendant stays in it however
//! it was created (double forks, setsid, daemon(3)); a non-root process can not leave it.
//! The operations act on the cgroup, so they reach every process of the task, known to clan
//! or not:
//!
//! - suspend: `cgroup.freeze` = 1, then wait until the kernel reports the cgroup `frozen`
//!   in `cgroup.events` (every process really stopped, verified by the kernel); frozen
//!   processes are not *stopped* in the job-control sense, so their parents see nothing
//!   (no SIGCHLD, no WUNTRACED report) and shells inside the job are not confused;
//! - resume: `cgroup.freeze` = 0 and wait until `frozen 0`;
//! - kill: `cgroup.kill` for SIGKILL (the kernel kills every process, also frozen ones,
//!   also ones forking), then wait until the cgroup is empty and check the node's /proc
//!   for any process still in it; other signals go to each process of the task.
//!
//! Where the kernel has no `cgroup.freeze` (before Linux 5.2), or the node does not use it
//! (`freezer = false` in the cluster file), a task is still a task: it is suspended and
//! resumed by the signal method (the process tracking paper's algorithm over the task's
//! genealogy), and killed by SIGKILL top-down, as where `cgroup.kill` is missing (before
//! Linux 5.14).
//!
//! The job is cluster-wide: the node a request reaches asks every node for its task at once
//! and reports per node.

use crate::error::{Error, Result};
use crate::node::Node;
use clan_core::Gpid;
use clan_proto::pb;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a freeze, thaw or kill may take before it is reported as failed.
const SETTLE: Duration = Duration::from_secs(10);

/// What `parse` finds in one read of a `cgroup.events` through `f` from its start (which
/// also re-arms the kernel's notification on that descriptor).
fn with_events<T>(f: &std::fs::File, parse: impl FnOnce(&str) -> Option<T>) -> Option<T> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 256];
    let n = f.read_at(&mut buf, 0).ok()?;
    parse(std::str::from_utf8(&buf[..n]).ok()?)
}

/// `key` of a `cgroup.events` text.
fn key_in(text: &str, key: &str) -> Option<bool> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse::<u8>().ok())
        .map(|v| v == 1)
}

/// `key` of a `cgroup.events` read through `f`.
fn event_of(f: &std::fs::File, key: &str) -> Option<bool> {
    with_events(f, |text| key_in(text, key))
}

/// Waits until `cgroup.events` of `dir`, open as `f`, says `key` is `want`, woken by the
/// kernel's notification on the file (poll(2) with POLLPRI on the descriptor it is read
/// through), not by sleeping. The kernel sends at most one notification per file every few
/// milliseconds and delays the next: the poll is bounded by 1 ms so a change right after
/// one is not waited for.
fn wait_on(f: &std::fs::File, dir: &Path, key: &str, want: bool, limit: Duration) -> Result<()> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let deadline = Instant::now() + limit;
    loop {
        if event_of(f, key) == Some(want) {
            return Ok(());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Internal(format!(
                "{}: {key} is not {} after {:?}",
                dir.display(),
                u8::from(want),
                limit
            )));
        }
        let mut fds = [PollFd::new(f.as_fd(), PollFlags::POLLPRI)];
        let ms = left.min(Duration::from_millis(1)).as_millis().max(1) as u16;
        let _ = poll(&mut fds, PollTimeout::from(ms));
    }
}

/// How a request asks to suspend and resume (`--method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    /// None given: the freezer where the node has one, else signals.
    Default,
    /// The cgroup v2 freezer, which the node must have.
    Freeze,
    /// The paper's algorithm.
    Signals,
}

impl Method {
    /// The method `req` asks for.
    fn of(req: &pb::JobRequest) -> Result<Method> {
        match req.method.as_str() {
            "" => Ok(Method::Default),
            "freeze" => Ok(Method::Freeze),
            "signals" => Ok(Method::Signals),
            other => Err(Error::Invalid(format!(
                "unknown method {other:?} (freeze or signals)"
            ))),
        }
    }
}

/// A task here: its cgroup, descriptors on its control files, its processes.
pub struct Task {
    pub dir: PathBuf,
    files: Arc<TaskFiles>,
    pub pids: Vec<u32>,
    /// Whether every process was held by a job-control stop, when read ahead (a switch's
    /// next task, read while the kernel freezes the old one).
    held: Option<bool>,
    /// Whether `pids` was read. A freezer switch asked by root reads its tasks'
    /// `cgroup.procs` only once the switch is verified, for the report
    /// ([`Node::task_unlisted`]): `pids` is empty until then.
    listed: bool,
    /// The kernel's `frozen`, when read with `populated` in the same read of
    /// `cgroup.events` that found the task ([`Node::task_unlisted`]). Found under the
    /// task's lock, which every freeze and thaw of the task holds: still what the kernel
    /// says until the action under that lock freezes or thaws it.
    frozen: Option<bool>,
}

impl Task {
    /// Whether the kernel reports the task frozen: as found, else read now.
    fn frozen(&self) -> bool {
        self.frozen.unwrap_or_else(|| self.files.frozen())
    }

    /// Whether every process of the task is held by a job-control stop: from its list
    /// when read, else through the kept first process ([`TaskFiles::all_held_unlisted`]).
    fn all_held(&self) -> bool {
        if self.listed {
            self.files.all_held(&self.pids)
        } else {
            self.files.all_held_unlisted()
        }
    }
}

/// Descriptors on a task's `cgroup.freeze`, `cgroup.events` and `cgroup.procs`, kept from
/// one request to the next (`Node::task_files`): a job switch, on a gang scheduler's every
/// time slice, reads and writes them without walking a path through cgroupfs each time.
/// Once the cgroup is removed they fail (ENODEV), and [`Node::task`] opens them again.
pub struct TaskFiles {
    /// `None`: no freezer for this task (the kernel has no `cgroup.freeze`, or the node
    /// does not use it); it is suspended by signals.
    freeze: Option<std::fs::File>,
    events: std::fs::File,
    procs: std::fs::File,
    /// `stat` of the task's first process, with its pid, kept open for the check a resume
    /// makes on every switch (are all its processes held by a job-control stop?), which
    /// reads the first process and stops at the first that runs.
    first: clan_core::lock::NamedMutex<Option<(u32, std::fs::File)>>,
}

impl TaskFiles {
    /// Opens a task's control files; `cgroup.freeze` only if `freezer` (the node uses the
    /// freezer) and the kernel has it. `cgroup.events` and `cgroup.procs` are cgroup v2's
    /// core, there on every kernel cland runs on.
    fn open(dir: &Path, freezer: bool) -> std::io::Result<TaskFiles> {
        let ro = |name: &str| std::fs::File::open(dir.join(name));
        let freeze = if freezer {
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(dir.join("cgroup.freeze"))
            {
                Ok(f) => Some(f),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        Ok(TaskFiles {
            freeze,
            events: ro("cgroup.events")?,
            procs: ro("cgroup.procs")?,
            first: clan_core::lock::NamedMutex::new("task.first", None),
        })
    }

    /// [`all_held`] of `pids`, the task's processes, the first read through the kept
    /// `stat` of the task's first process.
    fn all_held(&self, pids: &[u32]) -> bool {
        let Some((&first, rest)) = pids.split_first() else {
            return true;
        };
        let state = {
            let mut kept = self.first.lock();
            let open = || {
                std::fs::File::open(format!("/proc/{first}/stat"))
                    .ok()
                    .map(|f| (first, f))
            };
            if kept.as_ref().map(|(p, _)| *p) != Some(first) {
                *kept = open();
            }
            let read = |k: &Option<(u32, std::fs::File)>| {
                k.as_ref()
                    .and_then(|(_, f)| clan_core::sys::state_and_start_of(f))
                    .map(|(s, _)| s)
            };
            match read(&kept) {
                Some(s) => Some(s),
                // The kept one's process is gone: the pid may be another process's now
                // (its number taken again, and in the task), read afresh.
                None => {
                    *kept = open();
                    read(&kept)
                }
            }
        };
        held_or_gone(state) && all_held(rest)
    }

    /// [`TaskFiles::all_held`] without the task's process list: the kept first process
    /// answers when it is not held (the usual case: one read); else the list is read.
    fn all_held_unlisted(&self) -> bool {
        let runs = self
            .first
            .lock()
            .as_ref()
            .and_then(|(_, f)| clan_core::sys::state_and_start_of(f))
            .is_some_and(|(state, _)| !held_or_gone(Some(state)));
        !runs && self.all_held(&self.procs().unwrap_or_default())
    }

    /// Whether this task has a freezer cland uses.
    fn has_freezer(&self) -> bool {
        self.freeze.is_some()
    }

    /// Whether the kernel reports the task frozen (never without a freezer: job state comes
    /// from the processes' states then, not from `cgroup.events`).
    fn frozen(&self) -> bool {
        self.freeze.is_some() && self.event("frozen") == Some(true)
    }

    /// The host pids in the task (`cgroup.procs`, read afresh).
    fn procs(&self) -> std::io::Result<Vec<u32>> {
        use std::os::unix::fs::FileExt;
        // `cgroup.procs` is a seq_file: one read fills the kernel's page of whole lines (a
        // pid and a newline, at most 8 bytes), so a read that leaves more room than a line
        // holds it all, and the second read that would return 0 is not needed.
        let mut page = [0u8; 4096];
        let n = self.procs.read_at(&mut page, 0)?;
        if n + 16 < page.len() {
            return Ok(pids_in(&String::from_utf8_lossy(&page[..n])));
        }
        let text = clan_core::sys::read_whole_at(&self.procs)?;
        Ok(pids_in(&String::from_utf8_lossy(&text)))
    }

    fn event(&self, key: &str) -> Option<bool> {
        event_of(&self.events, key)
    }

    /// `populated` and `frozen` of one read of `cgroup.events` (a task with a freezer).
    fn populated_frozen(&self) -> Option<(bool, bool)> {
        with_events(&self.events, |text| {
            Some((key_in(text, "populated")?, key_in(text, "frozen")?))
        })
    }

    /// Whether `cgroup.freeze` asks for the task frozen (it may not be yet).
    fn freezing(&self) -> bool {
        use std::os::unix::fs::FileExt;
        let mut b = [0u8; 8];
        self.freeze.as_ref().is_some_and(|f| {
            f.read_at(&mut b, 0)
                .is_ok_and(|n| b[..n].first() == Some(&b'1'))
        })
    }

    /// Freezes (`on`) or thaws the task and waits until the kernel says it is. A freeze
    /// that does not complete in time is undone (`cgroup.freeze` back to 0, the task
    /// thawed): the suspend failed, so the job must not freeze later behind the caller's
    /// back, nor refuse runs into it, nor stay held by a switch that reported an error.
    fn set_frozen(&self, dir: &Path, on: bool) -> Result<()> {
        self.set_frozen_within(dir, on, SETTLE, &mut || {})
    }

    /// [`Self::set_frozen`] within `limit`, calling `meanwhile` once the kernel has been
    /// asked and before it is waited for (work that overlaps the freeze).
    fn set_frozen_within(
        &self,
        dir: &Path,
        on: bool,
        limit: Duration,
        meanwhile: &mut dyn FnMut(),
    ) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let Some(freeze) = &self.freeze else {
            return Err(Error::Internal(format!(
                "{}: no cgroup freezer for this task",
                dir.display()
            )));
        };
        freeze
            .write_at(if on { b"1" } else { b"0" }, 0)
            .map_err(|e| Error::internal("cgroup.freeze", e))?;
        meanwhile();
        let res = self.wait(dir, "frozen", on, limit);
        if on && res.is_err() {
            let _ = freeze.write_at(b"0", 0);
            if let Err(e) = self.wait(dir, "frozen", false, limit) {
                tracing::warn!("{}: a failed freeze not undone: {e}", dir.display());
            }
        }
        res
    }

    fn wait(&self, dir: &Path, key: &str, want: bool, limit: Duration) -> Result<()> {
        wait_on(&self.events, dir, key, want, limit)
    }
}

/// The host pids in a cgroup (not its descendants: a task has none).
fn procs(dir: &Path) -> Vec<u32> {
    pids_in(&clan_core::sys::read_small(dir.join("cgroup.procs")).unwrap_or_default())
}

/// The pids of a `cgroup.procs` text.
fn pids_in(text: &str) -> Vec<u32> {
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// Real uid of a host process.
fn uid_of(pid: u32) -> Option<u32> {
    let s = clan_core::sys::read_small(format!("/proc/{pid}/status")).ok()?;
    clan_core::sys::status_numbers(&s, "Uid").first().copied()
}

fn cpu_usec(dir: &Path) -> u64 {
    clan_core::sys::read_small(dir.join("cpu.stat"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("usage_usec "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The state letter of a host process (`None` once it is gone).
fn proc_state(pid: u32) -> Option<char> {
    clan_core::sys::state_and_start(pid).map(|(state, _)| state)
}

/// Whether a host process is stopped (or gone): a job-control stop (`T`) or a ptrace stop
/// (`t`: a traced process takes a SIGSTOP as a stop its tracer must let through; while
/// the tracer, in the task too, is stopped first, it stays there).
fn stopped(pid: u32) -> bool {
    matches!(proc_state(pid), Some('T' | 't' | 'Z' | 'X') | None)
}

/// Whether a host process is in a stop a SIGCONT ends (job control, or under a tracer).
fn held(pid: u32) -> bool {
    matches!(proc_state(pid), Some('T' | 't'))
}

/// Whether every one of `pids` is stopped or gone (read until the first that runs).
fn all_held(pids: &[u32]) -> bool {
    pids.iter().all(|p| held_or_gone(proc_state(*p)))
}

/// Whether a process in state `state` (`None`: gone) counts as held for [`all_held`].
fn held_or_gone(state: Option<char>) -> bool {
    matches!(state, Some('T' | 't') | None)
}

fn send(pid: u32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
}

/// Sends signal number `sig` (any, real-time ones too) to a host process.
fn send_raw(pid: u32, sig: i32) {
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// The signal a kill request names, checked (1 to SIGRTMAX; 0 is handled before).
fn signal_number(sig: i32) -> Result<i32> {
    if (1..=libc::SIGRTMAX()).contains(&sig) {
        Ok(sig)
    } else {
        Err(Error::Invalid(format!("invalid signal {sig}")))
    }
}

/// The children of a host process, forked by any of its threads (the kernel's list).
fn kernel_children(pid: u32) -> Vec<u32> {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    threads
        .flatten()
        .flat_map(|t| {
            clan_core::sys::read_small(t.path().join("children"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|k| k.parse::<u32>().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// The parent of a host process, as the kernel has it (`None`: it is gone).
fn ppid_of(pid: u32) -> Option<u32> {
    let s = clan_core::sys::read_small(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The processes of a task (or a subtree of it) top-down, each with its parent in the task
/// (0: a root of the forest).
struct Forest {
    order: Vec<u32>,
    parents: std::collections::HashMap<u32, u32>,
}

impl Forest {
    /// The forest of the task whose cgroup holds `members` now, the genealogy having
    /// `tracked` of the job (each with its nearest living tracked ancestor); `ppid_of` gives
    /// a process's kernel parent. See [`Node::forest`].
    fn new(
        tracked: &[(u32, crate::genealogy::GNode)],
        members: Vec<u32>,
        ppid_of: impl Fn(u32) -> Option<u32>,
    ) -> Forest {
        use std::collections::{HashMap, HashSet};
        let inside: HashSet<u32> = members.iter().copied().collect();
        let known: HashSet<u32> = tracked.iter().map(|(p, _)| *p).collect();
        let kernel_parent = |p: u32| {
            ppid_of(p)
                .filter(|pp| *pp != p && inside.contains(pp))
                .unwrap_or(0)
        };
        let mut parents: HashMap<u32, u32> = HashMap::with_capacity(tracked.len());
        let mut listed = Vec::with_capacity(tracked.len() + 1);
        for (p, n) in tracked {
            let parent = if n.parent != 0 && known.contains(&n.parent) {
                n.parent
            } else if inside.contains(p) {
                kernel_parent(*p)
            } else {
                0
            };
            parents.insert(*p, parent);
            listed.push(*p);
        }
        let mut unknown: Vec<u32> = members
            .iter()
            .copied()
            .filter(|p| !known.contains(p))
            .collect();
        unknown.sort_unstable();
        for p in unknown {
            parents.insert(p, kernel_parent(p));
            listed.push(p);
        }
        let mut kids: HashMap<u32, Vec<u32>> = HashMap::new();
        let mut roots = Vec::new();
        for p in listed {
            match parents.get(&p).copied().unwrap_or(0) {
                0 => roots.push(p),
                parent => kids.entry(parent).or_default().push(p),
            }
        }
        let mut order = Vec::with_capacity(members.len());
        let mut seen = HashSet::with_capacity(parents.len());
        let mut stack: Vec<u32> = roots.into_iter().rev().collect();
        while let Some(p) = stack.pop() {
            if !seen.insert(p) {
                continue;
            }
            if inside.contains(&p) {
                order.push(p);
            }
            if let Some(k) = kids.get(&p) {
                stack.extend(k.iter().rev());
            }
        }
        // Out of reach only through a cycle (pids reused between the genealogy's and the
        // kernel's view): roots, last, so none is left out.
        let mut rest: Vec<u32> = members.into_iter().filter(|p| !seen.contains(p)).collect();
        rest.sort_unstable();
        for p in rest {
            parents.insert(p, 0);
            order.push(p);
        }
        Forest { order, parents }
    }
}

/// The cgroup v2 directory of a host process (`None`: it is gone).
fn cgroup_dir_of(pid: u32) -> Option<PathBuf> {
    let text = clan_core::sys::read_small(format!("/proc/{pid}/cgroup")).ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(crate::cgroup::cgroup2_mount()?.join(rel.trim().trim_start_matches('/')))
}

/// Where a host process is, for putting it back: its v2 directory, then its directories
/// in the v1 hierarchies of the node's controllers.
fn places_of(cg: &crate::cgroup::NodeCgroup, pid: u32) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = cgroup_dir_of(pid).into_iter().collect();
    let text = clan_core::sys::read_small(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    for c in cg.ctls.iter().filter(|c| c.v1) {
        let rel = text.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctls, path) = (f.next()?, f.next()?, f.next()?);
            ctls.split(',').any(|x| x == c.name).then_some(path)
        });
        if let (Some(rel), Some(mount)) = (rel, crate::cgroup::v1_mount(c.name)) {
            out.push(mount.join(rel.trim().trim_start_matches('/')));
        }
    }
    out
}

/// Whether `creds` may write `file` by its owner, group and mode (access(2) for the caller,
/// who is not root).
fn may_write(creds: &pb::Creds, file: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(file) else {
        return false;
    };
    let mode = m.mode();
    if m.uid() == creds.uid {
        mode & 0o200 != 0
    } else if m.gid() == creds.gid || creds.groups.contains(&m.gid()) {
        mode & 0o020 != 0
    } else {
        mode & 0o002 != 0
    }
}

/// The deepest directory both paths are in.
fn common_ancestor(a: &Path, b: &Path) -> PathBuf {
    a.components()
        .zip(b.components())
        .take_while(|(x, y)| x == y)
        .map(|(x, _)| x)
        .collect()
}

/// Nanoseconds since `start` (a task's `took_ns`).
fn nanos_since(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// How long the signal method may go without progress for a task of `n` processes (each
/// must be scheduled to take its signal, so a big busy task on few CPUs needs more than the
/// freezer's limit); a suspend that keeps stopping processes goes on up to [`SIGNALS_MAX`].
fn signals_limit(n: usize) -> Duration {
    SETTLE
        .max(Duration::from_millis(20) * n as u32)
        .min(SIGNALS_MAX)
}

/// The most the signal method may take, whatever the task.
const SIGNALS_MAX: Duration = Duration::from_secs(120);

/// How long the signal method waits before it tries again (the paper's retry interval).
const RETRY: Duration = Duration::from_millis(1);

impl Node {
    /// The task's forest as the signal method walks it: every process the kernel has in
    /// the task's cgroup now, parents before children (depth first), each with its parent
    /// in the task. Parents come from the genealogy; a process it does not know (no proc
    /// connector, or a fork whose event is not handled yet), or one it has as a root, takes
    /// its kernel parent (`/proc/PID/stat`) when that is in the task, so it is still
    /// stopped after its parent and continued before it.
    fn forest(&self, job: u64, dir: &Path) -> Forest {
        let tracked = self.genealogy.lock().of_job(job);
        // Only what the kernel has in the task now: a tracked pid that left it (exited, and
        // perhaps reused by a process elsewhere before the genealogy heard) is not signalled.
        Forest::new(&tracked, procs(dir), ppid_of)
    }

    /// Why a caller that is not root may not have process `p` moved into a new task of this
    /// node (`None`: it may). cland moves it as root, so it checks what the kernel would
    /// check of the caller itself: the process is the caller's, it is in no clan task (a
    /// process can not leave its job, M2), and the caller could move it out of its cgroup
    /// into the new task (the cgroup v2 delegation rule: write access to `cgroup.procs` of
    /// the deepest cgroup that holds both, which excludes, say, a systemd service's).
    fn adopt_refusal(
        &self,
        cg: &crate::cgroup::NodeCgroup,
        creds: &pb::Creds,
        p: u32,
        into: u64,
    ) -> Option<String> {
        let task = cg.task_of(p, true);
        if into != 0 && task == Some(into) {
            return None; // forked meanwhile by a process already moved: in the task already
        }
        match uid_of(p) {
            None => return None, // gone: nothing to move
            Some(u) if u != creds.uid => {
                return Some(format!("process {p} is not yours (uid {u})"))
            }
            Some(_) => {}
        }
        if let Some(j) = task {
            return Some(format!(
                "process {p} is in job {j}'s task, and a process can not leave its job"
            ));
        }
        let from = cgroup_dir_of(p)?; // gone: nothing to move
                                      // The new task is a directory of the node's cgroup: both are in their common part.
        let both = common_ancestor(&from, &cg.root.join("job"));
        if may_write(creds, &both.join("cgroup.procs")) {
            return None;
        }
        let mount = crate::cgroup::cgroup2_mount().unwrap_or_default();
        let show = |d: &Path| format!("/{}", d.strip_prefix(&mount).unwrap_or(d).display());
        Some(format!(
            "you could not move process {p} out of cgroup {} yourself (no write access to \
             {}/cgroup.procs)",
            show(&from),
            show(&both).trim_end_matches('/')
        ))
    }

    /// `clan job adopt PID`: a process started outside clan and all its descendants become a
    /// new job's task on this node (M1). They are moved into the task's cgroup parents
    /// first; the walk repeats until it finds no process it has not moved, so children
    /// forked meanwhile (born in their parent's cgroup, old or new) are caught. A caller
    /// that is not root may only adopt what it could move itself ([`Node::adopt_refusal`]):
    /// the whole tree is checked before anything moves, and a process found refused during
    /// the move (forked meanwhile) puts back every process moved so far.
    fn adopt_into_task(&self, pid: u32, creds: &pb::Creds) -> Result<pb::TaskInfo> {
        let Some(cg) = &self.cgroup else {
            return Err(Error::Invalid(format!(
                "node {} has no cgroup subtree: it can not make tasks",
                self.id
            )));
        };
        if pid <= 1 {
            return Err(Error::Invalid(format!("can not adopt process {pid}")));
        }
        let owner = uid_of(pid).ok_or_else(|| Error::NotFound(format!("no such process {pid}")))?;
        let refused = |why: String| {
            Error::Permission(format!("permission denied to adopt process {pid}: {why}"))
        };
        if creds.uid != 0 {
            let mut todo = vec![pid];
            let mut seen = std::collections::HashSet::new();
            while let Some(p) = todo.pop() {
                if !seen.insert(p) {
                    continue;
                }
                if let Some(why) = self.adopt_refusal(cg, creds, p, 0) {
                    return Err(refused(why));
                }
                todo.extend(kernel_children(p));
            }
        }
        let job = self.new_job_for(owner)?.raw();
        *self.spawning.lock().entry(job).or_insert(0) += 1;
        // Where each moved process was, to put it back if the adoption is refused midway.
        let mut was: Vec<(u32, Vec<PathBuf>)> = Vec::new();
        let mut moved = std::collections::HashSet::new();
        let res = (|| -> Result<PathBuf> {
            let dir = cg
                .job(job)
                .map_err(|e| Error::internal("create the task's cgroup", e))?;
            let procs_file = dir.join("cgroup.procs");
            loop {
                let mut todo = vec![(pid, 0u32)];
                let mut progress = false;
                while let Some((p, parent)) = todo.pop() {
                    if !moved.contains(&p) {
                        if creds.uid != 0 {
                            if let Some(why) = self.adopt_refusal(cg, creds, p, job) {
                                return Err(refused(why));
                            }
                        }
                        let places = places_of(cg, p);
                        match std::fs::write(&procs_file, p.to_string()) {
                            Ok(()) => {}
                            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => continue,
                            Err(e) => return Err(Error::internal(&format!("move {p}"), e)),
                        }
                        was.push((p, places));
                        for d in cg.v1_job_dirs(job) {
                            let _ = std::fs::write(d.join("cgroup.procs"), p.to_string());
                        }
                        // Tracked as soon as it is moved, so that its exit and its forks
                        // from now on are seen (not only once every process has moved).
                        self.genealogy.lock().insert(
                            p,
                            crate::genealogy::GNode {
                                parent: if moved.contains(&parent) { parent } else { 0 },
                                job,
                            },
                        );
                        moved.insert(p);
                        progress = true;
                    }
                    todo.extend(kernel_children(p).into_iter().map(|k| (k, p)));
                }
                if !progress {
                    break;
                }
            }
            // One that exited between its move and its entry (its exit seen before it was
            // tracked) is in the task no more: no entry stays for it.
            let now: std::collections::HashSet<u32> = procs(&dir).into_iter().collect();
            let mut g = self.genealogy.lock();
            for p in moved.iter().filter(|p| !now.contains(p)) {
                if g.get(*p).is_some_and(|n| n.job == job) {
                    g.exit(*p);
                }
            }
            Ok(dir)
        })();
        if res.is_err() {
            let mut g = self.genealogy.lock();
            for p in &moved {
                if g.get(*p).is_some_and(|n| n.job == job) {
                    g.exit(*p);
                }
            }
        }
        if res.is_err() {
            // Put back, parents first (what they fork from then on is born where they were);
            // what was forked into the task meanwhile goes where its parent is.
            for (p, places) in &was {
                for d in places {
                    let _ = std::fs::write(d.join("cgroup.procs"), p.to_string());
                }
            }
            for _ in 0..100 {
                let rest = procs(&cg.job_dir(job));
                if rest.is_empty() {
                    break;
                }
                for p in rest {
                    let parent = ppid_of(p);
                    for d in parent.map(|pp| places_of(cg, pp)).unwrap_or_default() {
                        let _ = std::fs::write(d.join("cgroup.procs"), p.to_string());
                    }
                }
                std::thread::sleep(RETRY);
            }
            for d in cg.v1_job_dirs(job) {
                let _ = std::fs::remove_dir(d);
            }
            let _ = std::fs::remove_dir(cg.job_dir(job));
        }
        {
            let mut sp = self.spawning.lock();
            if let Some(n) = sp.get_mut(&job) {
                *n -= 1;
                if *n == 0 {
                    sp.remove(&job);
                }
            }
        }
        res?;
        self.task(job)
            .and_then(|task| self.task_info(job, &task))
            .ok_or_else(|| Error::NotFound(format!("process {pid} exited while adopted")))
    }

    /// The task's processes top-down, or only the subtree rooted at the process whose
    /// number in the node's namespace is `subtree` (empty if it is not in the task).
    fn order(&self, job: u64, dir: &Path, subtree: Option<u32>) -> Vec<u32> {
        self.forest_of(job, dir, subtree).order
    }

    /// The task's forest ([`Node::forest`]), its order limited to the subtree rooted at the
    /// process whose number in the node's namespace is `subtree` (none if it is not in the
    /// task).
    fn forest_of(&self, job: u64, dir: &Path, subtree: Option<u32>) -> Forest {
        let mut forest = self.forest(job, dir);
        let Some(root_ns) = subtree else {
            return forest;
        };
        let level = self.pid_level();
        let Some(root) = forest
            .order
            .iter()
            .copied()
            .find(|h| clan_core::sys::ns_pid_at(*h, level) == Some(root_ns))
        else {
            forest.order.clear();
            return forest;
        };
        let parents = &forest.parents;
        let under = |mut p: u32| {
            // Bounded: the forest has no cycle, but a walk must not trust that.
            for _ in 0..=parents.len() {
                if p == root {
                    return true;
                }
                if p == 0 {
                    return false;
                }
                p = parents.get(&p).copied().unwrap_or(0);
            }
            false
        };
        let order = forest.order.iter().copied().filter(|p| under(*p)).collect();
        forest.order = order;
        forest
    }

    /// Where the node's pid namespace is in the `NSpid` list of its processes: 0 on a real
    /// node (cland's own namespace), else the level of the node's namespace init (its
    /// entries less one). A process of a task may live in a namespace nested deeper
    /// (`unshare -pf`), whose innermost number means nothing to the node.
    pub(crate) fn pid_level(&self) -> usize {
        if self.view.ns_init == 0 {
            return 0;
        }
        clan_core::sys::read_small(format!("/proc/{}/status", self.view.ns_init))
            .map(|s| {
                clan_core::sys::status_numbers::<u32>(&s, "NSpid")
                    .len()
                    .saturating_sub(1)
            })
            .unwrap_or(1)
    }

    /// The paper's task suspend: SIGSTOP top-down, each process verified stopped before
    /// its children are signalled; a process not stopped yet (EAGAIN) holds back its
    /// descendants until the next pass, retried after the retry interval, without
    /// signalling again the processes already signalled. Children forked meanwhile are in
    /// the next pass's tree. A whole task is done once every process of its cgroup is
    /// stopped; a subtree once, besides its processes, the kernel's children of each of
    /// them (forks whose events the genealogy has not handled yet, made just before their
    /// parent stopped) are stopped too, and theirs, down to the last.
    fn suspend_by_signals(&self, job: u64, dir: &Path, subtree: Option<u32>) -> Result<()> {
        use nix::sys::signal::Signal;
        // A whole job stopped takes no new process until it is resumed.
        if subtree.is_none() {
            self.mark_stopping(job, true);
        }
        // The job's processes that clan started: their shepherds stop them, and do not
        // report the suspension's stops to their stubs and parents.
        let vps: std::collections::HashMap<u32, std::sync::Arc<crate::process::vproc::VProc>> =
            self.vprocs
                .read()
                .values()
                .filter(|v| v.job == job)
                .map(|v| (v.gpid.local(), v.clone()))
                .collect();
        // A level of a busy tree waits for its slowest process to be scheduled, so a big
        // tree on a loaded machine takes long: it fails only when no process has stopped
        // for the stall limit (or after SIGNALS_MAX in all).
        let stall = signals_limit(procs(dir).len());
        let level = self.pid_level();
        let start = Instant::now();
        let (mut most, mut progress_at) = (0, start);
        let mut signalled = std::collections::HashSet::new();
        loop {
            // Each pass goes down the forest: a process is stopped once its tracked parent
            // is verified stopped (or it has none in the task). One not stopped yet does not
            // end the pass (the paper's EAGAIN), it only holds back its own descendants, so a
            // busy tree on few CPUs stops in a few passes rather than one process per pass.
            let Forest { order, parents } = self.forest_of(job, dir, subtree);
            let inside: std::collections::HashSet<u32> = order.iter().copied().collect();
            let mut verified: std::collections::HashSet<u32> = std::collections::HashSet::new();
            let mut done = true;
            for &p in &order {
                if stopped(p) {
                    verified.insert(p);
                    continue;
                }
                done = false;
                let parent = parents.get(&p).copied().unwrap_or(0);
                let ready = parent == 0 || !inside.contains(&parent) || verified.contains(&parent);
                if ready && signalled.insert(p) {
                    // Those clan started are roots of the task's forest (their parent is a
                    // shepherd), known by their number in the node's pid namespace.
                    let root = parent == 0 || !inside.contains(&parent);
                    let ns = root.then(|| clan_core::sys::ns_pid_at(p, level)).flatten();
                    match ns.and_then(|n| vps.get(&n)) {
                        Some(v) => v.send(clan_proto::pb::shepherd_in::Msg::JobStop(true)),
                        None => send(p, Signal::SIGSTOP),
                    }
                }
            }
            // A subtree whose every process is stopped: the kernel's children of them (final
            // lists, as their parents are stopped) that the tree above does not have yet.
            // (Read only then: on the way, the next pass's tree has them.)
            let mut late = 0;
            if done && subtree.is_some() {
                let in_task: std::collections::HashSet<u32> = procs(dir).into_iter().collect();
                let mut todo: Vec<u32> = verified.iter().copied().collect();
                let mut seen = std::collections::HashSet::new();
                while let Some(p) = todo.pop() {
                    for k in kernel_children(p) {
                        if !in_task.contains(&k) || inside.contains(&k) || !seen.insert(k) {
                            continue;
                        }
                        if stopped(k) {
                            late += 1;
                            todo.push(k);
                            continue;
                        }
                        done = false;
                        if signalled.insert(k) {
                            send(k, Signal::SIGSTOP);
                        }
                    }
                }
            }
            if done && (subtree.is_some() || procs(dir).into_iter().all(stopped)) {
                return Ok(());
            }
            if verified.len() + late > most {
                (most, progress_at) = (verified.len() + late, Instant::now());
            }
            if progress_at.elapsed() > stall || start.elapsed() > SIGNALS_MAX {
                return Err(Error::Internal(format!(
                    "job {job}: {most} of {} processes stopped after {:?}, none in the last {:?}",
                    order.len(),
                    start.elapsed(),
                    progress_at.elapsed()
                )));
            }
            std::thread::sleep(RETRY);
        }
    }

    /// The paper's task resume: SIGCONT bottom-up (children before their parents), each
    /// verified running before its parent is continued.
    fn resume_by_signals(&self, job: u64, dir: &Path, subtree: Option<u32>) -> Result<()> {
        use nix::sys::signal::Signal;
        // (The shepherds of the processes clan started hide the continues that undo the
        // suspension's stops.)
        if subtree.is_none() {
            self.mark_stopping(job, false);
        }
        let limit = signals_limit(procs(dir).len());
        let deadline = Instant::now() + limit;
        loop {
            let mut done = true;
            let mut order = self.order(job, dir, subtree);
            order.reverse();
            for p in order {
                if !held(p) {
                    continue;
                }
                send(p, Signal::SIGCONT);
                // A traced process (`t`) runs again once its tracer, continued after it,
                // lets it: only a job-control stop is checked here.
                if proc_state(p) == Some('T') {
                    done = false;
                    break;
                }
            }
            if done {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Internal(format!(
                    "job {job}: not every process continued after {limit:?}"
                )));
            }
            std::thread::sleep(RETRY);
        }
    }

    /// The paper's task kill: `sig` to every process of the task top-down (a parent dies
    /// before its children can be reparented and reported to it); a SIGKILL is then
    /// repeated over whatever is still in the task until the kernel reports it empty.
    fn kill_by_signals(&self, job: u64, dir: &Path, files: &TaskFiles, sig: i32) -> Result<()> {
        for p in self.order(job, dir, None) {
            send_raw(p, sig);
        }
        if sig == libc::SIGKILL {
            self.kill_rest_by_signals(job, dir, files)?;
        }
        Ok(())
    }

    /// Whether this node may use the cgroup freezer and `cgroup.kill` (`freezer` in its
    /// entry of the cluster file; they are used by default where the kernel has them).
    pub(crate) fn freezer_allowed(&self) -> bool {
        self.cfg.node(self.id).map_or(true, |n| n.freezer)
    }

    /// Why this node's tasks have no freezer.
    fn no_freezer_reason(&self) -> &'static str {
        if self.freezer_allowed() {
            "no cgroup freezer on this node (the kernel has no cgroup.freeze, Linux 5.2+)"
        } else {
            "no cgroup freezer on this node (freezer = false in its entry of the cluster file)"
        }
    }

    /// After a top-down SIGKILL pass: rounds of the same over what is still in the task
    /// (children forked while the pass ran, processes the genealogy had not seen yet) until
    /// the kernel reports the task empty.
    fn kill_rest_by_signals(&self, job: u64, dir: &Path, files: &TaskFiles) -> Result<()> {
        let deadline = Instant::now() + SETTLE;
        loop {
            let mut left = self.order(job, dir, None);
            for p in procs(dir) {
                if !left.contains(&p) {
                    left.push(p);
                }
            }
            let live: Vec<u32> = left
                .into_iter()
                .filter(|p| !matches!(proc_state(*p), Some('Z' | 'X') | None))
                .collect();
            if live.is_empty() {
                return files.wait(dir, "populated", false, SETTLE);
            }
            if Instant::now() > deadline {
                return Err(Error::Internal(format!(
                    "job {job}: processes still alive after {SETTLE:?} of SIGKILL: {live:?}"
                )));
            }
            for p in live {
                send(p, nix::sys::signal::Signal::SIGKILL);
            }
            std::thread::sleep(RETRY);
        }
    }

    /// Job `job`'s task here, if the node has cgroups and the task has a process: its
    /// control files from the last request when they still answer (the cgroup was not
    /// removed since), else opened now. A task whose processes are all gone is no task,
    /// for every action and listing, although its cgroup stays while cland still knows a
    /// process of the job (a zombie waiting for `clan wait`, up to `exit_retention_ms`):
    /// the job has finished here.
    pub fn task(&self, job: u64) -> Option<Task> {
        let dir = self.cgroup.as_ref()?.job_dir(job);
        let kept = self.task_files.lock().get(&job).cloned();
        if let Some(files) = kept {
            if let Ok(pids) = files.procs() {
                return (!pids.is_empty()).then_some(Task {
                    dir,
                    files,
                    pids,
                    held: None,
                    listed: true,
                    frozen: None,
                });
            }
            self.task_files.lock().remove(&job);
        }
        let files = Arc::new(TaskFiles::open(&dir, self.freezer_allowed()).ok()?);
        let pids = files.procs().ok()?;
        let mut kept = self.task_files.lock();
        if kept.len() >= 4096 {
            kept.clear();
        }
        kept.insert(job, files.clone());
        (!pids.is_empty()).then_some(Task {
            dir,
            files,
            pids,
            held: None,
            listed: true,
            frozen: None,
        })
    }

    /// [`Node::task`] without its process list (`pids` empty, `listed` false), for a
    /// freezer switch that reads the lists for its report once it is verified, not on
    /// its way: from the kept files, whose `cgroup.events` says whether the task has a
    /// process (and fails once the cgroup is gone). A task whose files are not kept, or
    /// that has no freezer, is read in full.
    fn task_unlisted(&self, job: u64) -> Option<Task> {
        let kept = self.task_files.lock().get(&job).cloned();
        match kept {
            Some(files) if files.has_freezer() => match files.populated_frozen() {
                Some((populated, frozen)) => populated.then(|| Task {
                    dir: self
                        .cgroup
                        .as_ref()
                        .map(|cg| cg.job_dir(job))
                        .unwrap_or_default(),
                    files,
                    pids: Vec::new(),
                    held: None,
                    listed: false,
                    frozen: Some(frozen),
                }),
                None => self.task(job),
            },
            _ => self.task(job),
        }
    }

    /// The jobs with a cgroup on this node (a task, or one whose processes are gone and
    /// whose cgroup is not yet removed).
    fn local_jobs(&self) -> Vec<u64> {
        let Some(cg) = &self.cgroup else {
            return Vec::new();
        };
        let Ok(rd) = std::fs::read_dir(&cg.root) else {
            return Vec::new();
        };
        rd.flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_prefix("job")?.parse().ok())
            .collect()
    }

    /// Every task of this node (or only `job`'s), with what the kernel says of it.
    fn tasks_local(&self, job: u64) -> Vec<pb::TaskInfo> {
        let mut out: Vec<pb::TaskInfo> = self
            .local_jobs()
            .into_iter()
            .filter(|&j| job == 0 || j == job)
            .filter_map(|j| self.task_info(j, &self.task(j)?))
            .collect();
        out.sort_by_key(|t| t.job);
        out
    }

    /// The state of a task with processes `pids` (one read of its `cgroup.events`, and of
    /// the processes' states only when it is not frozen and may be stopped by signals).
    /// Without a freezer it comes from the processes' states and `marked` (the whole job is
    /// being suspended by signals, or was, by a suspend that stopped only some).
    fn task_state(files: &TaskFiles, pids: &[u32], marked: bool) -> &'static str {
        let frozen = || files.frozen();
        Self::task_state_by(files, pids.is_empty(), frozen, || all_held(pids), marked)
    }

    /// [`Self::task_state`] from whether the task is `empty`, and checks that the freezer
    /// holds it and that every process is held, each asked only when needed.
    fn task_state_by(
        files: &TaskFiles,
        empty: bool,
        frozen: impl FnOnce() -> bool,
        all_held: impl FnOnce() -> bool,
        marked: bool,
    ) -> &'static str {
        if empty {
            "empty"
        } else if frozen() || all_held() {
            "suspended"
        } else if files.freezing() || marked {
            "suspending"
        } else {
            "running"
        }
    }

    /// What a suspend, resume, switch or kill reports of a task (`whole`), or of a subtree
    /// of it, with processes `pids`: its state and processes, nothing that costs more reads
    /// (a switch is on a gang scheduler's every time slice).
    fn task_brief(&self, job: u64, files: &TaskFiles, pids: &[u32], whole: bool) -> pb::TaskInfo {
        let marked = whole && self.stopping_jobs.lock().contains(&job);
        self.task_brief_as(job, pids, Self::task_state(files, pids, marked))
    }

    /// [`Self::task_brief`] of a task whose state is known.
    fn task_brief_as(&self, job: u64, pids: &[u32], state: &str) -> pb::TaskInfo {
        pb::TaskInfo {
            job,
            node: self.id.get(),
            procs: pids.len() as u32,
            state: if pids.is_empty() { "empty" } else { state }.into(),
            ..Default::default()
        }
    }

    /// What the kernel says of a task, for listings (its owner reads every process's
    /// status: too slow for a suspend or resume of a big task, which use `task_brief`).
    /// `None` when its processes have all exited since its `cgroup.procs` was read.
    fn task_info(&self, job: u64, task: &Task) -> Option<pb::TaskInfo> {
        let (dir, pids) = (&task.dir, &task.pids);
        // The owner: the lowest uid among its processes (none left: no task, not root's).
        let uid = pids.iter().filter_map(|p| uid_of(*p)).min()?;
        let marked = self.stopping_jobs.lock().contains(&job);
        let state = Self::task_state(&task.files, pids, marked);
        let peak = self.task_peaks.lock().get(&job).copied().unwrap_or(0);
        let (mem, mem_peak) = self
            .cgroup
            .as_ref()
            .map(|cg| cg.memory(job))
            .unwrap_or((0, 0));
        Some(pb::TaskInfo {
            job,
            node: self.id.get(),
            procs: pids.len() as u32,
            state: state.into(),
            cpu_usec: cpu_usec(dir),
            peak_procs: peak.max(pids.len() as u32),
            mem_bytes: mem,
            mem_peak_bytes: mem_peak,
            max_procs: self
                .cgroup
                .as_ref()
                .and_then(|cg| cg.max_procs(job))
                .unwrap_or(0),
            uid,
            ..Default::default()
        })
    }

    /// Records each task's process count for its peak (the sampler calls this, at every
    /// heartbeat): one read of each task's `cgroup.procs`, not the listing's read of
    /// every process's `status`.
    pub fn sample_task_peaks(&self) {
        let counts: std::collections::HashMap<u64, u32> = self
            .local_jobs()
            .into_iter()
            .filter_map(|j| Some((j, self.task(j)?.pids.len() as u32)))
            .collect();
        let mut peaks = self.task_peaks.lock();
        peaks.retain(|j, _| counts.contains_key(j));
        for (j, n) in counts {
            let p = peaks.entry(j).or_default();
            *p = (*p).max(n);
        }
    }

    /// May `creds` act on the processes `pids`? Root, or the owner of every one of them.
    fn may_act(&self, creds: &pb::Creds, job: u64, pids: &[u32]) -> Result<()> {
        if creds.uid == 0 {
            return Ok(());
        }
        if pids
            .iter()
            .filter_map(|p| uid_of(*p))
            .all(|u| u == creds.uid)
        {
            Ok(())
        } else {
            Err(Error::Permission(format!(
                "job {job} on node {}: permission denied (not all its processes are yours)",
                self.id
            )))
        }
    }

    /// This node's part of a job request (runs on a blocking thread).
    pub fn job_local(&self, req: &pb::JobRequest, creds: &pb::Creds) -> Result<Vec<pb::TaskInfo>> {
        use pb::JobAction as A;
        let action = A::try_from(req.action)
            .map_err(|_| Error::Invalid(format!("unknown job action {}", req.action)))?;
        if action == A::JobList {
            return Ok(self.tasks_local(req.job));
        }
        if action == A::JobAdopt {
            return self.adopt_into_task(req.pid, creds).map(|t| vec![t]);
        }
        if action == A::JobOwner {
            let uid = self
                .job_owner(req.job)
                .ok_or_else(|| Error::NotFound(format!("no such job {}", req.job)))?;
            return Ok(vec![pb::TaskInfo {
                job: req.job,
                node: self.id.get(),
                uid,
                ..Default::default()
            }]);
        }
        if action == A::JobTree {
            let mut tasks = self.tasks_local(req.job);
            for t in &mut tasks {
                let g = |p: u32| Gpid::new(self.id, p).map(|g| g.raw()).unwrap_or(0);
                t.tree = self
                    .job_tree(t.job)
                    .into_iter()
                    .map(|l| pb::TreeProc {
                        gpid: g(l.pid),
                        parent: if l.parent == 0 { 0 } else { g(l.parent) },
                        cmd: l.cmd,
                    })
                    .collect();
            }
            return Ok(tasks);
        }
        Method::of(req)?;
        if action == A::JobSwitch {
            return self.switch(req, creds);
        }
        Ok(self.act(action, req, req.job, creds)?.into_iter().collect())
    }

    /// `action` on job `job`'s task here (`None`: the job has no task here). One operation
    /// on a task at a time: a resume that ran while a (slow) signals suspend of the same
    /// task was stopping processes would leave some of them stopped behind it. A kill of
    /// the whole task is not held behind a suspend (the kernel's `cgroup.kill` and the
    /// rounds of SIGKILL reach every process whatever its state). Timed from the moment it
    /// asks for the task's lock (`took_ns`).
    fn act(
        &self,
        action: pb::JobAction,
        req: &pb::JobRequest,
        job: u64,
        creds: &pb::Creds,
    ) -> Result<Option<pb::TaskInfo>> {
        use pb::JobAction as A;
        let start = Instant::now();
        // A whole task frozen or thawed: at the node's switch priority.
        let freezer_action = matches!(action, A::JobSuspend | A::JobResume)
            && req.subtree == 0
            && Method::of(req)? != Method::Signals;
        let run = || match self.task(job) {
            Some(t) => {
                let _rt = (freezer_action && t.files.has_freezer())
                    .then(|| self.switch_priority())
                    .flatten();
                let mut i = self.act_on_task(action, req, job, &t, creds, &mut || {})?;
                i.took_ns = nanos_since(start);
                Ok(Some(i))
            }
            None => Ok(None),
        };
        if action == A::JobKill && req.subtree == 0 {
            run()
        } else {
            self.one_at_a_time(&[job], run)
        }
    }

    /// The calling thread at this node's `switch_priority` (real-time, cluster file) until
    /// the guard drops, so that processes just thawed do not each run a time slice
    /// before the thread that thawed them has verified it; `None` when it is 0, or when
    /// the kernel refuses (said once in the log).
    fn switch_priority(&self) -> Option<clan_core::sys::RealTime> {
        static REFUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let priority = self
            .cfg
            .node(self.id)
            .map_or(clan_core::config::DEFAULT_SWITCH_PRIORITY, |n| {
                n.switch_priority
            });
        clan_core::sys::RealTime::enter(priority)
            .inspect_err(|e| {
                if !REFUSED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::info!(
                        "task freezes and thaws at ordinary priority: SCHED_FIFO {priority} \
                         refused: {e}"
                    );
                }
            })
            .ok()
            .flatten()
    }

    /// A gang scheduler's row switch: job `req.job`'s task stops before job `req.resume`'s
    /// runs. With the freezer, both tasks are held for the whole switch, and what the
    /// resume reads of the new task (its processes, whether they are all held by a
    /// job-control stop) it reads while the kernel freezes the old one, which leaves the
    /// switch little more than the kernel's freeze and thaw; `took_ns` of the suspend then
    /// runs from the request for both tasks' locks to the old task's verified freeze, that
    /// of the resume from there on. By signals, one task after the other.
    fn switch(&self, req: &pb::JobRequest, creds: &pb::Creds) -> Result<Vec<pb::TaskInfo>> {
        use pb::JobAction as A;
        let (old, new) = (req.job, req.resume);
        // Without the freezer (the signal method's suspend, which may take long), the tasks
        // are taken one after the other, as two requests would: nothing is read meanwhile.
        if Method::of(req)? == Method::Signals || req.subtree != 0 || !self.freezer_allowed() {
            let mut out = Vec::with_capacity(2);
            out.extend(self.act(A::JobSuspend, req, old, creds)?);
            out.extend(self.act(A::JobResume, req, new, creds)?);
            return Ok(out);
        }
        let start = Instant::now();
        self.one_at_a_time(&[old, new], || {
            // Asked by root, and neither task suspended by signals (whose state comes from
            // its processes'), the tasks' process lists are read for the report once the
            // switch is verified, not on its way: the kernel's `frozen` is the verification.
            let unlisted = creds.uid == 0 && {
                let marked = self.stopping_jobs.lock();
                !marked.contains(&old) && !marked.contains(&new)
            };
            let task_of = |job: u64| {
                if unlisted {
                    self.task_unlisted(job)
                } else {
                    self.task(job)
                }
            };
            // The new task, with whether its processes are held: a process stopped by job
            // control reads `T` while the freezer holds it too, so this is what a read
            // after the thaw would find.
            let ready = |job: u64| {
                task_of(job).map(|mut t| {
                    t.held = Some(t.all_held());
                    t
                })
            };
            // Until both tasks' results are taken, with the freezer (never for the signal
            // method's verification loops): the thaw wakes the new task's processes, and
            // each of them would otherwise run first.
            let mut rt = None;
            let mut out = Vec::with_capacity(2);
            let mut to_count = Vec::new();
            let mut next = None;
            if let Some(t) = task_of(old) {
                if t.files.has_freezer() {
                    rt = self.switch_priority();
                }
                let mut ahead = || {
                    if old != new {
                        next = Some(ready(new));
                    }
                };
                let mut i = self.act_on_task(A::JobSuspend, req, old, &t, creds, &mut ahead)?;
                i.took_ns = nanos_since(start);
                if !t.listed {
                    to_count.push((out.len(), t.files.clone()));
                }
                out.push(i);
            }
            let start = Instant::now();
            if let Some(t) = next.unwrap_or_else(|| task_of(new)) {
                let mut i = self.act_on_task(A::JobResume, req, new, &t, creds, &mut || {})?;
                i.took_ns = nanos_since(start);
                if !t.listed {
                    to_count.push((out.len(), t.files.clone()));
                }
                out.push(i);
            }
            drop(rt);
            // Verified: the reports' process counts (a task emptied meanwhile is reported
            // so, as a listed one would have been).
            for (at, files) in to_count {
                let procs = files.procs().unwrap_or_default().len();
                out[at].procs = procs as u32;
                if procs == 0 {
                    out[at].state = "empty".into();
                }
            }
            Ok(out)
        })
    }

    /// Runs `f` (an operation on the tasks of `jobs`) while no other operation on those
    /// tasks runs on this node. A task's lock (`task.op` in `clan stats locks`) is made on
    /// first use and dropped once no operation holds or waits for it; several are taken in
    /// the order of their jobs, so that two operations on the same two never deadlock.
    fn one_at_a_time<T>(&self, jobs: &[u64], f: impl FnOnce() -> T) -> T {
        let mut jobs = jobs.to_vec();
        jobs.sort_unstable();
        jobs.dedup();
        let locks: Vec<_> = {
            let mut map = self.task_ops.lock();
            jobs.iter()
                .map(|j| {
                    map.entry(*j)
                        .or_insert_with(|| {
                            Arc::new(clan_core::lock::NamedMutex::new("task.op", ()))
                        })
                        .clone()
                })
                .collect()
        };
        let out = {
            let _held: Vec<_> = locks.iter().map(|l| l.lock()).collect();
            f()
        };
        let mut map = self.task_ops.lock();
        for (job, lock) in jobs.iter().zip(&locks) {
            // The table's reference and ours: nobody else waits for it.
            if Arc::strong_count(lock) == 2 {
                map.remove(job);
            }
        }
        out
    }

    /// Suspend, resume or kill (`action`) job `job`'s task (or the subtree `req` names),
    /// verified; reports the task (or the subtree) after. A kill with signal 0 is kill(1)'s:
    /// the task exists and the caller may signal it, and nothing is sent. A task without a
    /// freezer (the kernel has none, or the node does not use it) is acted on by signals;
    /// a suspend that asks for the freezer there fails, naming the node and why.
    fn act_on_task(
        &self,
        action: pb::JobAction,
        req: &pb::JobRequest,
        job: u64,
        task: &Task,
        creds: &pb::Creds,
        meanwhile: &mut dyn FnMut(),
    ) -> Result<pb::TaskInfo> {
        use pb::JobAction as A;
        let method = Method::of(req)?;
        let (dir, files) = (&task.dir, &*task.files);
        let subtree = match Gpid::from_raw(req.subtree) {
            None if req.subtree == 0 => None,
            Some(g) if g.node() == self.id => {
                if self.order(job, dir, Some(g.local())).is_empty() {
                    return Err(Error::NotFound(format!(
                        "process {g} is not a process of job {} on node {}",
                        job, self.id
                    )));
                }
                Some(g.local())
            }
            _ => return Err(Error::Invalid(format!("invalid subtree {}", req.subtree))),
        };
        if task.listed {
            self.may_act(creds, job, &task.pids)?;
        } else if creds.uid != 0 {
            // Only a switch asked by root reads its tasks unlisted today: this keeps the
            // check for any other caller that would.
            self.may_act(creds, job, &files.procs().unwrap_or_default())?;
        }
        let signals = match method {
            Method::Signals => true,
            _ if files.has_freezer() => false,
            Method::Freeze if action == A::JobSuspend && subtree.is_none() => {
                return Err(Error::Invalid(format!(
                    "job {job} on node {}: can not suspend with --method freeze: {}; \
                     use --method signals",
                    self.id,
                    self.no_freezer_reason()
                )));
            }
            // A resume undoes a suspension by either method, and a kill needs no freezer:
            // by signals here.
            _ => true,
        };
        // What the action reaches: the subtree's processes, or the task's.
        let reached = |me: &Self| match subtree {
            Some(_) => me.order(job, dir, subtree),
            None => files.procs().unwrap_or_default(),
        };
        let members = match subtree {
            Some(_) => reached(self),
            None => task.pids.clone(),
        };
        let whole = subtree.is_none();
        // Suspended as a whole with signals (perhaps only partly: a suspend that failed).
        let marked = self.stopping_jobs.lock().contains(&job);
        // The state before the action, read by the actions whose report needs it (before
        // they act).
        let state_before = || {
            if task.listed {
                Self::task_state(files, &members, whole && marked)
            } else {
                // Not marked (a switch reads its lists first then), and not empty.
                Self::task_state_by(files, false, || task.frozen(), || task.all_held(), false)
            }
        };
        let frozen = || files.frozen() || files.freezing();
        let mut changed;
        let mut left = Vec::new();
        // The task's state after the action when the action itself has just read it from the
        // kernel (a freeze or thaw verified): a switch, on a gang scheduler's every time
        // slice, does not read `cgroup.events`, `cgroup.freeze` and `cgroup.procs` again
        // (it reports the processes it acted on).
        let mut known = None;
        match action {
            A::JobSuspend if signals || subtree.is_some() => {
                changed = state_before() != "suspended";
                // A task the freezer holds is suspended already, and its processes could
                // not take a SIGSTOP before they are thawed.
                if !files.frozen() {
                    self.suspend_by_signals(job, dir, subtree)?;
                    if !files.has_freezer() && method == Method::Default && changed {
                        tracing::info!(
                            "job {job}: suspended by signals: {}",
                            self.no_freezer_reason()
                        );
                    }
                }
            }
            A::JobResume if subtree.is_some() => {
                // The freezer holds the whole task: the subtree would stay frozen.
                if frozen() {
                    return Err(Error::Invalid(format!(
                        "job {job} on node {} is frozen as a whole (suspended with the freezer): \
                         resume the job, not a subtree",
                        self.id
                    )));
                }
                changed = members.iter().any(|p| held(*p));
                self.resume_by_signals(job, dir, subtree)?;
            }
            A::JobResume if signals => {
                changed = state_before() != "running" || marked || members.iter().any(|p| held(*p));
                // A resume undoes a suspension by either method.
                if files.freezing() {
                    files.set_frozen(dir, false)?;
                }
                self.resume_by_signals(job, dir, None)?;
            }
            A::JobKill if req.signal == 0 => {
                // kill(1)'s signal 0: the job is there and the caller may signal it.
                changed = false;
            }
            A::JobKill if subtree.is_some() => {
                let sig = signal_number(req.signal)?;
                let root = subtree.unwrap_or_default();
                let (killed, alive) = self.kill_subtree(job, dir, files, root, sig);
                changed = !killed.is_empty();
                left = alive;
                let mut after = self.task_brief(job, files, &reached(self), whole);
                after.procs = killed.len() as u32; // how many it reached
                after.changed = changed;
                let level = self.pid_level();
                after.pids = left
                    .into_iter()
                    .map(|h| clan_core::sys::ns_pid_at(h, level).unwrap_or(h))
                    .collect();
                return Ok(after);
            }
            A::JobKill if signals => {
                let sig = signal_number(req.signal)?;
                changed = !members.is_empty();
                self.kill_by_signals(job, dir, files, sig)?;
            }
            A::JobSuspend => {
                // Already suspended by clan: frozen, or stopped as a whole by signals (a
                // task's processes are not read on a gang scheduler's every time slice).
                changed = !(task.frozen() || marked && files.all_held(&members));
                files.set_frozen_within(dir, true, SETTLE, meanwhile)?;
                // The kernel has just said `frozen 1`: not read again below.
                known = Some("suspended");
            }
            A::JobResume => {
                changed = state_before() != "running";
                // Read before the thaw (a process stopped by job control reads `T` while
                // frozen too), or by a switch while it froze the other task.
                let held = task.held.unwrap_or_else(|| task.all_held());
                files.set_frozen(dir, false)?;
                // Thawed (the kernel has just said `frozen 0`, and nothing asks for a
                // freeze): stopped only if every process is held by a job-control stop.
                known = Some(if held {
                    "suspended"
                } else if marked {
                    "suspending"
                } else {
                    "running"
                });
            }
            A::JobKill => {
                let sig = signal_number(req.signal)?;
                if sig == libc::SIGKILL {
                    match std::fs::write(dir.join("cgroup.kill"), "1") {
                        Ok(()) => files.wait(dir, "populated", false, SETTLE)?,
                        // No cgroup.kill (before Linux 5.14; ENOENT), or it failed: the
                        // signal method's kill, which also ends with the task empty.
                        Err(e) => {
                            tracing::debug!("job {job}: cgroup.kill: {e}; killing by signals");
                            self.kill_by_signals(job, dir, files, sig)?;
                        }
                    }
                } else {
                    for p in files.procs().unwrap_or_default() {
                        send_raw(p, sig);
                    }
                }
                changed = !members.is_empty();
            }
            A::JobList | A::JobTree | A::JobAdopt | A::JobOwner | A::JobSwitch => {
                unreachable!("handled above")
            }
        }
        if action == A::JobKill && req.signal == libc::SIGKILL {
            // Nothing of it is left to be stopped.
            self.mark_stopping(job, false);
        }
        let mut after = match known {
            // Its processes are counted by the caller, once the switch is verified.
            Some(state) if !task.listed => pb::TaskInfo {
                state: state.into(),
                ..self.task_brief_as(job, &[], state)
            },
            Some(state) => self.task_brief_as(job, &members, state),
            None => self.task_brief(job, files, &reached(self), whole),
        };
        if action == A::JobResume
            && !signals
            && subtree.is_none()
            && (after.state == "suspended" || marked)
        {
            // Thawed, yet every process stopped, or a suspension by signals recorded (also
            // one that failed midway, which stopped only some): continued the same way.
            changed = true;
            self.resume_by_signals(job, dir, None)?;
            after = self.task_brief(job, files, &reached(self), whole);
        }
        after.changed = changed;
        if action == A::JobKill {
            after.procs = members.len() as u32; // how many it reached
        }
        if action == A::JobKill && subtree.is_none() && req.signal == libc::SIGKILL {
            // Verified, not assumed: no process of the node's view is still in the job.
            // A task leaves its cgroup a moment before it becomes a zombie, so processes
            // seen dying right after the cgroup emptied get a little time to finish.
            let deadline = Instant::now() + Duration::from_secs(2);
            loop {
                left = self
                    .view
                    .pids()
                    .into_iter()
                    .filter(|p| {
                        // Zombies are dead: they wait for their parent, out of the cgroup.
                        self.view
                            .attrs(*p, true)
                            .is_some_and(|a| a.job == job && a.state != 'Z' && a.state != 'X')
                    })
                    .collect();
                if left.is_empty() || Instant::now() > deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        after.pids = left;
        Ok(after)
    }

    /// `kill --subtree`: signal `sig` to the subtree of the process numbered `root` in the
    /// node's namespace. SIGKILL reaches every descendant, also ones forked while it acts:
    /// the subtree is first stopped top-down (the signal method's suspend, unless the
    /// freezer holds the task), then the kernel's children of every stopped process are
    /// added and stopped until none is missing (forks the genealogy has not seen yet), then
    /// each is killed, and the kill is repeated until every one of them is verified dead
    /// (by pid and start time, so no later process with a reused pid is signalled).
    /// Another signal goes once to each process of the subtree, top-down. Returns the
    /// processes signalled and those still alive after [`SETTLE`].
    fn kill_subtree(
        &self,
        job: u64,
        dir: &Path,
        files: &TaskFiles,
        root: u32,
        sig: i32,
    ) -> (Vec<u32>, Vec<u32>) {
        use nix::sys::signal::Signal;
        if sig != libc::SIGKILL {
            let order = self.order(job, dir, Some(root));
            for &p in &order {
                send_raw(p, sig);
            }
            return (order, Vec::new());
        }
        // Frozen processes can not fork (nor take a SIGSTOP before they are thawed).
        let frozen = files.frozen();
        if !frozen {
            if let Err(e) = self.suspend_by_signals(job, dir, Some(root)) {
                tracing::debug!("job {job}: subtree kill: {e}; killing what is stopped");
            }
        }
        let mut members: Vec<(u32, u64)> = Vec::new();
        let mut known = std::collections::HashSet::new();
        let add =
            |p: u32, members: &mut Vec<(u32, u64)>, known: &mut std::collections::HashSet<u32>| {
                if let Some((_, start)) = clan_core::sys::state_and_start(p) {
                    if known.insert(p) {
                        members.push((p, start));
                    }
                }
            };
        for p in self.order(job, dir, Some(root)) {
            add(p, &mut members, &mut known);
        }
        let mut stop_sent = std::collections::HashSet::new();
        let deadline = Instant::now() + SETTLE;
        loop {
            let in_task: std::collections::HashSet<u32> = procs(dir).into_iter().collect();
            let mut complete = true;
            let mut i = 0;
            while i < members.len() {
                let (p, start) = members[i];
                i += 1;
                if !clan_core::sys::lives(p, start) {
                    continue;
                }
                if !frozen && proc_state(p) != Some('T') {
                    // Its list of children is final only once it is stopped.
                    complete = false;
                    if stop_sent.insert(p) {
                        send(p, Signal::SIGSTOP);
                    }
                    continue;
                }
                for k in kernel_children(p) {
                    if in_task.contains(&k) && !known.contains(&k) {
                        complete = false;
                        add(k, &mut members, &mut known);
                    }
                }
            }
            if complete || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(RETRY);
        }
        let deadline = Instant::now() + SETTLE;
        loop {
            let alive: Vec<u32> = members
                .iter()
                .filter(|(p, start)| clan_core::sys::lives(*p, *start))
                .map(|(p, _)| *p)
                .collect();
            if alive.is_empty() || Instant::now() > deadline {
                return (members.into_iter().map(|(p, _)| p).collect(), alive);
            }
            for p in alive {
                send(p, Signal::SIGKILL);
            }
            std::thread::sleep(RETRY);
        }
    }

    /// This node's part of a job request, off the workers' loop (cgroup files, waits for
    /// the kernel, the signal method's rounds).
    pub async fn job_here(
        self: &Arc<Self>,
        req: pb::JobRequest,
        creds: pb::Creds,
    ) -> Result<Vec<pb::TaskInfo>> {
        let node = self.clone();
        crate::fanout::blocking(move || node.job_local(&req, &creds))
            .await
            .unwrap_or_else(|e| Err(Error::Internal(e.to_string())))
    }

    /// A job request from a local caller: every target node at once, reported per node.
    pub async fn job_cluster(
        self: &Arc<Self>,
        req: pb::JobRequest,
        creds: pb::Creds,
    ) -> Result<pb::JobReply> {
        let adopt = req.action == pb::JobAction::JobAdopt as i32;
        let targets = if adopt {
            vec![self.id] // the caller's own process, on the node it asked
        } else if let Some(g) = Gpid::from_raw(req.subtree) {
            vec![g.node()] // a subtree lives on its root's node
        } else {
            self.target_nodes(&req.nodes)?
        };
        let answers = crate::fanout::on_each(targets, |n| {
            let (node, mut req, creds) = (self.clone(), req.clone(), creds.clone());
            req.nodes.clear();
            async move {
                let res = if n == node.id {
                    node.job_here(req, creds).await
                } else {
                    // The signal method's own limit grows with the task (signals_limit), and
                    // a subtree is always acted on with signals (a kill: stopped, then
                    // killed and verified, each bounded by SETTLE). A resume by the freezer
                    // goes on with signals when the task was stopped that way; a switch
                    // freezes one task and then thaws another, and a freeze that fails is
                    // thawed back before it is reported. A suspend or switch with no method
                    // named uses signals on a node without a freezer (which this node can
                    // not tell when the kernel lacks one); a kill without `cgroup.kill`
                    // kills by signals (rounds, then the wait for the task to empty: SETTLE
                    // each).
                    use pb::JobAction as A;
                    let action = A::try_from(req.action).ok();
                    let stops = matches!(action, Some(A::JobSwitch | A::JobSuspend));
                    let settle = if req.method != "freeze" && stops
                        || req.method == "signals"
                        || req.subtree != 0
                        || action == Some(A::JobResume)
                    {
                        SIGNALS_MAX + 2 * SETTLE
                    } else if stops || action == Some(A::JobKill) {
                        2 * SETTLE
                    } else {
                        SETTLE
                    };
                    let limit = node.cfg.dead_after() + settle;
                    let op = pb::peer_request::Op::Job(req);
                    match node.call_within(n, creds, op, limit).await {
                        Ok(pb::peer_reply::Reply::Job(j)) => match j.error {
                            None => Ok(j.tasks),
                            Some(e) => Err(e.into()),
                        },
                        Ok(other) => Err(Error::Internal(format!("unexpected reply {other:?}"))),
                        Err(e) => Err(e),
                    }
                };
                match res {
                    Ok(tasks) => pb::NodeJobs {
                        node: n.get(),
                        tasks,
                        error: None,
                    },
                    Err(e) => pb::NodeJobs {
                        node: n.get(),
                        tasks: vec![],
                        error: Some(e.into()),
                    },
                }
            }
        })
        .await;
        Ok(pb::JobReply {
            nodes: answers.into_iter().map(|(_, a)| a).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A freeze the kernel does not complete in time is undone: `cgroup.freeze` is back to
    /// 0 when the failure is reported, so the task does not freeze later.
    #[test]
    fn a_freeze_that_times_out_is_undone() {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in [
            ("cgroup.freeze", "0\n"),
            ("cgroup.events", "populated 1\nfrozen 0\n"),
            ("cgroup.procs", "4242\n"),
        ] {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let files = TaskFiles::open(dir.path(), true).unwrap();
        let res = files.set_frozen_within(dir.path(), true, Duration::from_millis(20), &mut || {});
        assert!(res.is_err(), "{res:?}");
        let freeze = std::fs::read_to_string(dir.path().join("cgroup.freeze")).unwrap();
        assert_eq!(freeze.trim_end_matches('\n').chars().next(), Some('0'));
        assert!(!files.freezing());
    }

    /// A task without `cgroup.freeze` (a kernel before 5.2), or on a node that does not use
    /// the freezer, is still a task: its files open, it is never seen frozen (whatever
    /// `cgroup.events` says), and a freeze is refused rather than attempted.
    #[test]
    fn a_task_without_a_freezer_is_a_task() {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in [
            ("cgroup.events", "populated 1\nfrozen 1\n"),
            ("cgroup.procs", "4242\n4243\n"),
        ] {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let files = TaskFiles::open(dir.path(), true).unwrap();
        assert!(!files.has_freezer());
        assert!(!files.frozen() && !files.freezing());
        assert_eq!(files.procs().unwrap(), vec![4242, 4243]);
        assert!(files.set_frozen(dir.path(), true).is_err());
        // The kernel has one, the node does not use it.
        std::fs::write(dir.path().join("cgroup.freeze"), "1\n").unwrap();
        let files = TaskFiles::open(dir.path(), false).unwrap();
        assert!(!files.has_freezer() && !files.frozen() && !files.freezing());
        let files = TaskFiles::open(dir.path(), true).unwrap();
        assert!(files.has_freezer() && files.frozen() && files.freezing());
    }

    /// `cgroup.procs` is read in one call when it fits a page with room to spare, and
    /// whole otherwise: a list longer than a page loses no pid.
    #[test]
    fn a_long_procs_list_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let pids: Vec<u32> = (1_000_000..1_000_700).collect();
        let text: String = pids.iter().map(|p| format!("{p}\n")).collect();
        assert!(text.len() > 4096);
        for (name, text) in [
            ("cgroup.events", "populated 1\nfrozen 0\n".to_string()),
            ("cgroup.procs", text),
        ] {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let files = TaskFiles::open(dir.path(), false).unwrap();
        assert_eq!(files.procs().unwrap(), pids);
        std::fs::write(dir.path().join("cgroup.procs"), "42\n43\n").unwrap();
        assert_eq!(files.procs().unwrap(), vec![42, 43]);
    }

    /// A process's state is read from the start of its `stat`, after the last `)` (a
    /// command name may hold one): running, stopped, gone.
    #[test]
    fn process_states_are_read() {
        // This thread runs (the test binary's main thread waits for it).
        let me = nix::unistd::gettid().as_raw() as u32;
        assert_eq!(proc_state(me), Some('R'));
        let mut child = std::process::Command::new("sleep")
            .arg("100")
            .spawn()
            .unwrap();
        let pid = child.id();
        // A signal to the child, and waitpid(2) with `flag` until it reports its effect
        // (a stop or a continue is asynchronous).
        let signal_and_wait = |sig, flag| {
            let child = nix::unistd::Pid::from_raw(pid as i32);
            nix::sys::signal::kill(child, sig).unwrap();
            nix::sys::wait::waitpid(child, Some(flag)).unwrap()
        };
        use nix::sys::signal::Signal::{SIGCONT, SIGSTOP};
        use nix::sys::wait::WaitPidFlag;
        let st = signal_and_wait(SIGSTOP, WaitPidFlag::WUNTRACED);
        assert!(
            matches!(st, nix::sys::wait::WaitStatus::Stopped(..)),
            "{st:?}"
        );
        assert_eq!(proc_state(pid), Some('T'));
        assert!(all_held(&[pid]));
        assert!(!all_held(&[pid, me]));
        // The same through a task's kept `stat` of its first process.
        let dir = tempfile::tempdir().unwrap();
        for name in ["cgroup.events", "cgroup.procs"] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        let files = TaskFiles::open(dir.path(), false).unwrap();
        assert!(files.all_held(&[pid]));
        assert!(!files.all_held(&[pid, me]));
        assert!(!files.all_held(&[me, pid]));
        let st = signal_and_wait(SIGCONT, WaitPidFlag::WCONTINUED);
        assert!(
            matches!(st, nix::sys::wait::WaitStatus::Continued(..)),
            "{st:?}"
        );
        assert!(
            !files.all_held(&[pid]),
            "read afresh through the kept descriptor"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(proc_state(pid), None);
        // Gone: its kept descriptor reads nothing, and a gone process counts as held.
        assert!(files.all_held(&[pid]));
    }

    /// Processes the genealogy does not know (no proc connector, or forks not handled yet)
    /// go under their kernel parent when it is in the task, not among the roots: a parent
    /// is still stopped before its children. A tracked pid no longer in the task is not
    /// listed, its children are; one whose kernel parent is outside the task is a root.
    #[test]
    fn unknown_members_go_under_their_kernel_parent() {
        use crate::genealogy::GNode;
        let g = |parent| GNode { parent, job: 7 };
        // Tracked: 10 (a root), 11 under 10, 12 (gone from the task) under 10, 13 under 12.
        let tracked = vec![(10, g(0)), (11, g(10)), (12, g(10)), (13, g(12))];
        // Untracked: 20 forked by 11, 21 by 20, 5 by a process outside the task (1), and
        // 30, 31 each other's parent (pids reused): a cycle no walk can enter.
        let ppids: std::collections::HashMap<u32, u32> =
            [(20, 11), (21, 20), (5, 1), (30, 31), (31, 30), (10, 1)].into();
        let members = vec![31, 30, 21, 5, 13, 20, 11, 10];
        let f = Forest::new(&tracked, members, |p| ppids.get(&p).copied());
        let at = |p: u32| f.order.iter().position(|x| *x == p).unwrap();
        assert_eq!(f.order.len(), 8, "{:?}", f.order);
        assert!(!f.order.contains(&12));
        assert!(
            at(10) < at(11) && at(11) < at(20) && at(20) < at(21),
            "{:?}",
            f.order
        );
        assert!(at(10) < at(13), "{:?}", f.order);
        assert_eq!(f.parents[&20], 11);
        assert_eq!(f.parents[&21], 20);
        assert_eq!(f.parents[&5], 0);
        assert_eq!(f.parents[&10], 0);
        // The cycle's processes are listed, last, as roots.
        assert_eq!(&f.order[6..], &[30, 31]);
        assert_eq!((f.parents[&30], f.parents[&31]), (0, 0));
    }

    #[test]
    fn ppid_is_the_kernel_parent() {
        assert_eq!(
            ppid_of(std::process::id()),
            Some(std::os::unix::process::parent_id())
        );
        assert_eq!(ppid_of(u32::MAX), None);
    }

    /// A traced process that takes a SIGSTOP stops for its tracer (`t`), and stays so
    /// while the tracer does not let it go: it counts as stopped.
    #[test]
    fn ptrace_stops_count_as_stopped() {
        assert!(!stopped(std::process::id()));
        // SAFETY: the child makes only raw system calls before it ends.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: async-signal-safe calls only, then _exit.
            unsafe {
                libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0);
                libc::raise(libc::SIGSTOP);
                libc::_exit(0);
            }
        }
        let mut st = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
        assert!(libc::WIFSTOPPED(st));
        let (stop, hold) = (stopped(pid as u32), held(pid as u32));
        let state = proc_state(pid as u32);
        // SAFETY: kills and reaps our own child.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, &mut st, 0);
        }
        assert_eq!(state, Some('t'));
        assert!(stop && hold);
    }
}
