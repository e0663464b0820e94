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

/// `key` of a `cgroup.events` read through `f` from its start (which also re-arms the
/// kernel's notification on that descriptor).
fn event_of(f: &std::fs::File, key: &str) -> Option<bool> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 256];
    let n = f.read_at(&mut buf, 0).ok()?;
    std::str::from_utf8(&buf[..n])
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse::<u8>().ok())
        .map(|v| v == 1)
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

/// A task here: its cgroup, descriptors on its control files, its processes.
pub struct Task {
    pub dir: PathBuf,
    files: Arc<TaskFiles>,
    pub pids: Vec<u32>,
}

/// Descriptors on a task's `cgroup.freeze`, `cgroup.events` and `cgroup.procs`, kept from
/// one request to the next (`Node::task_files`): a job switch, on a gang scheduler's every
/// time slice, reads and writes them without walking a path through cgroupfs each time.
/// Once the cgroup is removed they fail (ENODEV), and [`Node::task`] opens them again.
pub struct TaskFiles {
    freeze: std::fs::File,
    events: std::fs::File,
    procs: std::fs::File,
}

impl TaskFiles {
    fn open(dir: &Path) -> std::io::Result<TaskFiles> {
        let ro = |name: &str| std::fs::File::open(dir.join(name));
        Ok(TaskFiles {
            freeze: std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(dir.join("cgroup.freeze"))?,
            events: ro("cgroup.events")?,
            procs: ro("cgroup.procs")?,
        })
    }

    /// The host pids in the task (`cgroup.procs`, read afresh).
    fn procs(&self) -> std::io::Result<Vec<u32>> {
        let text = clan_core::sys::read_whole_at(&self.procs)?;
        Ok(pids_in(&String::from_utf8_lossy(&text)))
    }

    fn event(&self, key: &str) -> Option<bool> {
        event_of(&self.events, key)
    }

    /// Whether `cgroup.freeze` asks for the task frozen (it may not be yet).
    fn freezing(&self) -> bool {
        use std::os::unix::fs::FileExt;
        let mut b = [0u8; 8];
        self.freeze
            .read_at(&mut b, 0)
            .is_ok_and(|n| b[..n].first() == Some(&b'1'))
    }

    /// Freezes (`on`) or thaws the task and waits until the kernel says it is. A freeze
    /// that does not complete in time is undone (`cgroup.freeze` back to 0, the task
    /// thawed): the suspend failed, so the job must not freeze later behind the caller's
    /// back, nor refuse runs into it, nor stay held by a switch that reported an error.
    fn set_frozen(&self, dir: &Path, on: bool) -> Result<()> {
        self.set_frozen_within(dir, on, SETTLE)
    }

    fn set_frozen_within(&self, dir: &Path, on: bool, limit: Duration) -> Result<()> {
        use std::os::unix::fs::FileExt;
        self.freeze
            .write_at(if on { b"1" } else { b"0" }, 0)
            .map_err(|e| Error::internal("cgroup.freeze", e))?;
        let res = self.wait(dir, "frozen", on, limit);
        if on && res.is_err() {
            let _ = self.freeze.write_at(b"0", 0);
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
    let s = clan_core::sys::read_small(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(')')?.1.trim_start().chars().next()
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
    /// The task's processes, parents before children (depth first, from the genealogy),
    /// then any process of the task's cgroup the genealogy does not know.
    fn top_down(&self, job: u64, dir: &Path) -> Vec<u32> {
        let forest = self.genealogy.lock().of_job(job);
        let known: std::collections::HashSet<u32> = forest.iter().map(|(p, _)| *p).collect();
        let mut kids: std::collections::HashMap<u32, Vec<u32>> = Default::default();
        let mut roots = Vec::new();
        for (p, n) in &forest {
            if n.parent != 0 && known.contains(&n.parent) {
                kids.entry(n.parent).or_default().push(*p);
            } else {
                roots.push(*p);
            }
        }
        let mut order = Vec::with_capacity(forest.len());
        let mut stack: Vec<u32> = roots.into_iter().rev().collect();
        // Only what the kernel has in the task now: a tracked pid that left it (exited, and
        // perhaps reused by a process elsewhere before the genealogy heard) is not signalled.
        let members: std::collections::HashSet<u32> = procs(dir).into_iter().collect();
        while let Some(p) = stack.pop() {
            if members.contains(&p) {
                order.push(p);
            }
            if let Some(k) = kids.get(&p) {
                stack.extend(k.iter().rev());
            }
        }
        let mut unknown: Vec<u32> = members.into_iter().filter(|p| !known.contains(p)).collect();
        unknown.sort_unstable();
        order.extend(unknown);
        order
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
        let res = (|| -> Result<PathBuf> {
            let dir = cg
                .job(job)
                .map_err(|e| Error::internal("create the task's cgroup", e))?;
            let procs_file = dir.join("cgroup.procs");
            let mut moved = std::collections::HashSet::new();
            let mut genealogy = Vec::new();
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
                        moved.insert(p);
                        genealogy.push((p, parent));
                        progress = true;
                    }
                    todo.extend(kernel_children(p).into_iter().map(|k| (k, p)));
                }
                if !progress {
                    break;
                }
            }
            let mut g = self.genealogy.lock();
            for (p, parent) in genealogy {
                g.insert(
                    p,
                    crate::genealogy::GNode {
                        parent: if moved.contains(&parent) { parent } else { 0 },
                        job,
                    },
                );
            }
            Ok(dir)
        })();
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
                    let parent = clan_core::sys::read_small(format!("/proc/{p}/stat"))
                        .ok()
                        .and_then(|s| {
                            s.rsplit_once(')')?
                                .1
                                .split_whitespace()
                                .nth(1)?
                                .parse()
                                .ok()
                        });
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
        let all = self.top_down(job, dir);
        let Some(root_ns) = subtree else {
            return all;
        };
        let level = self.pid_level();
        let Some(root) = all
            .iter()
            .copied()
            .find(|h| clan_core::sys::ns_pid_at(*h, level) == Some(root_ns))
        else {
            return Vec::new();
        };
        let parents = self.parents(job);
        let under = |mut p: u32| {
            while p != 0 {
                if p == root {
                    return true;
                }
                p = parents.get(&p).copied().unwrap_or(0);
            }
            false
        };
        all.into_iter().filter(|p| under(*p)).collect()
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

    /// Each tracked process of the task with its nearest living tracked ancestor (0: none).
    fn parents(&self, job: u64) -> std::collections::HashMap<u32, u32> {
        self.genealogy
            .lock()
            .of_job(job)
            .into_iter()
            .map(|(p, n)| (p, n.parent))
            .collect()
    }

    /// The paper's task suspend: SIGSTOP top-down, each process verified stopped before
    /// its children are signalled; a process not stopped yet (EAGAIN) holds back its
    /// descendants until the next pass, retried after the retry interval, without
    /// signalling again the processes already signalled. Children forked meanwhile are in
    /// the next pass's tree.
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
            let parents = self.parents(job);
            let order = self.order(job, dir, subtree);
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
            if done && (subtree.is_some() || procs(dir).into_iter().all(stopped)) {
                return Ok(());
            }
            if verified.len() > most {
                (most, progress_at) = (verified.len(), Instant::now());
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
                return (!pids.is_empty()).then_some(Task { dir, files, pids });
            }
            self.task_files.lock().remove(&job);
        }
        let files = Arc::new(TaskFiles::open(&dir).ok()?);
        let pids = files.procs().ok()?;
        let mut kept = self.task_files.lock();
        if kept.len() >= 4096 {
            kept.clear();
        }
        kept.insert(job, files.clone());
        (!pids.is_empty()).then_some(Task { dir, files, pids })
    }

    /// Every task of this node (or only `job`'s), with what the kernel says of it.
    fn tasks_local(&self, job: u64) -> Vec<pb::TaskInfo> {
        let Some(cg) = &self.cgroup else {
            return Vec::new();
        };
        let Ok(rd) = std::fs::read_dir(&cg.root) else {
            return Vec::new();
        };
        let mut out: Vec<pb::TaskInfo> = rd
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let j: u64 = name.strip_prefix("job")?.parse().ok()?;
                let t = (job == 0 || j == job).then(|| self.task(j))??;
                self.task_info(j, &t)
            })
            .collect();
        out.sort_by_key(|t| t.job);
        out
    }

    /// The state of a task with processes `pids` (one read of its `cgroup.events`, and of
    /// the processes' states only when it is not frozen and may be stopped by signals).
    fn task_state(files: &TaskFiles, pids: &[u32]) -> &'static str {
        if pids.is_empty() {
            "empty"
        } else if files.event("frozen") == Some(true)
            || pids
                .iter()
                .all(|p| matches!(proc_state(*p), Some('T' | 't') | None))
        {
            "suspended"
        } else if files.freezing() {
            "suspending"
        } else {
            "running"
        }
    }

    /// What a suspend, resume, switch or kill reports of a task: its state and processes,
    /// nothing that costs more reads (a switch is on a gang scheduler's every time slice).
    fn task_brief(&self, job: u64, files: &TaskFiles, pids: &[u32]) -> pb::TaskInfo {
        pb::TaskInfo {
            job,
            node: self.id.get(),
            procs: pids.len() as u32,
            state: Self::task_state(files, pids).into(),
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
        let state = Self::task_state(&task.files, pids);
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

    /// Records each task's process count for its peak (the sampler calls this).
    pub fn sample_task_peaks(&self) {
        let tasks = self.tasks_local(0);
        let mut peaks = self.task_peaks.lock();
        peaks.retain(|j, _| tasks.iter().any(|t| t.job == *j));
        for t in tasks {
            let p = peaks.entry(t.job).or_default();
            *p = (*p).max(t.procs);
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
        let signals = match req.method.as_str() {
            "" | "freeze" => false,
            "signals" => true,
            other => {
                return Err(Error::Invalid(format!(
                    "unknown method {other:?} (freeze or signals)"
                )))
            }
        };
        // One operation on a task at a time: a resume that ran while a (slow) signals
        // suspend of the same task was stopping processes would leave some of them stopped
        // behind it. A kill of the whole task is not held behind a suspend (the kernel's
        // `cgroup.kill` and the rounds of SIGKILL reach every process whatever its state).
        let act = |action: A, job: u64| -> Result<Option<pb::TaskInfo>> {
            let run = || match self.task(job) {
                Some(t) => self
                    .act_on_task(action, req, job, &t, signals, creds)
                    .map(Some),
                None => Ok(None), // no task of the job here
            };
            if action == A::JobKill && req.subtree == 0 {
                run()
            } else {
                self.one_at_a_time(job, run)
            }
        };
        if action == A::JobSwitch {
            // A gang scheduler's row switch: the old row stops before the new one runs.
            let mut out = Vec::with_capacity(2);
            out.extend(act(A::JobSuspend, req.job)?);
            out.extend(act(A::JobResume, req.resume)?);
            return Ok(out);
        }
        Ok(act(action, req.job)?.into_iter().collect())
    }

    /// Runs `f` (an operation on job `job`'s task) while no other operation on that task
    /// runs on this node. The task's lock (`task.op` in `clan stats locks`) is made on
    /// first use and dropped once no operation holds or waits for it.
    fn one_at_a_time<T>(&self, job: u64, f: impl FnOnce() -> T) -> T {
        type Locks = clan_core::lock::NamedMutex<
            std::collections::HashMap<(u32, u64), Arc<clan_core::lock::NamedMutex<()>>>,
        >;
        static LOCKS: std::sync::OnceLock<Locks> = std::sync::OnceLock::new();
        let locks =
            LOCKS.get_or_init(|| clan_core::lock::NamedMutex::new("task.ops", Default::default()));
        let key = (self.id.get(), job);
        let lock = locks
            .lock()
            .entry(key)
            .or_insert_with(|| Arc::new(clan_core::lock::NamedMutex::new("task.op", ())))
            .clone();
        let out = {
            let _held = lock.lock();
            f()
        };
        let mut map = locks.lock();
        // The table's reference and ours: nobody else waits for it.
        if Arc::strong_count(&lock) == 2 {
            map.remove(&key);
        }
        out
    }

    /// Suspend, resume or kill (`action`) job `job`'s task (or the subtree `req` names),
    /// verified; reports the task (or the subtree) after. A kill with signal 0 is kill(1)'s:
    /// the task exists and the caller may signal it, and nothing is sent.
    fn act_on_task(
        &self,
        action: pb::JobAction,
        req: &pb::JobRequest,
        job: u64,
        task: &Task,
        signals: bool,
        creds: &pb::Creds,
    ) -> Result<pb::TaskInfo> {
        use pb::JobAction as A;
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
        self.may_act(creds, job, &task.pids)?;
        // What the action reaches: the subtree's processes, or the task's.
        let reached = |me: &Self| match subtree {
            Some(_) => me.order(job, dir, subtree),
            None => files.procs().unwrap_or_default(),
        };
        let members = match subtree {
            Some(_) => reached(self),
            None => task.pids.clone(),
        };
        let before = self.task_brief(job, files, &members);
        // Suspended as a whole with signals (perhaps only partly: a suspend that failed).
        let marked = self.stopping_jobs.lock().contains(&job);
        let frozen = || files.event("frozen") == Some(true) || files.freezing();
        let mut changed;
        let mut left = Vec::new();
        match action {
            A::JobSuspend if signals || subtree.is_some() => {
                changed = before.state != "suspended";
                // A task the freezer holds is suspended already, and its processes could
                // not take a SIGSTOP before they are thawed.
                if files.event("frozen") != Some(true) {
                    self.suspend_by_signals(job, dir, subtree)?;
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
                changed = before.state != "running" || marked || members.iter().any(|p| held(*p));
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
                let mut after = self.task_brief(job, files, &reached(self));
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
                // Top-down, as the paper's task kill: a parent dies before its children
                // can be reparented and reported to it.
                let sig = signal_number(req.signal)?;
                changed = !members.is_empty();
                for p in self.order(job, dir, None) {
                    send_raw(p, sig);
                }
                if sig == libc::SIGKILL {
                    self.kill_rest_by_signals(job, dir, files)?;
                }
            }
            A::JobSuspend => {
                changed = before.state != "suspended";
                files.set_frozen(dir, true)?;
            }
            A::JobResume => {
                changed = before.state != "running";
                files.set_frozen(dir, false)?;
            }
            A::JobKill => {
                let sig = signal_number(req.signal)?;
                if sig == libc::SIGKILL {
                    std::fs::write(dir.join("cgroup.kill"), "1")
                        .map_err(|e| Error::internal("cgroup.kill", e))?;
                    files.wait(dir, "populated", false, SETTLE)?;
                } else {
                    for p in files.procs().unwrap_or_default() {
                        send_raw(p, sig);
                    }
                }
                changed = before.procs > 0;
            }
            A::JobList | A::JobTree | A::JobAdopt | A::JobOwner | A::JobSwitch => {
                unreachable!("handled above")
            }
        }
        if action == A::JobKill && req.signal == libc::SIGKILL {
            // Nothing of it is left to be stopped.
            self.mark_stopping(job, false);
        }
        let mut after = self.task_brief(job, files, &reached(self));
        if action == A::JobResume
            && !signals
            && subtree.is_none()
            && (after.state == "suspended" || marked)
        {
            // Thawed, yet every process stopped, or a suspension by signals recorded (also
            // one that failed midway, which stopped only some): continued the same way.
            changed = true;
            self.resume_by_signals(job, dir, None)?;
            after = self.task_brief(job, files, &reached(self));
        }
        after.changed = changed;
        if action == A::JobKill {
            after.procs = before.procs; // how many it reached
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
        let frozen = files.event("frozen") == Some(true);
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
                    // thawed back before it is reported.
                    use pb::JobAction as A;
                    let action = A::try_from(req.action).ok();
                    let settle = if req.method == "signals"
                        || req.subtree != 0
                        || action == Some(A::JobResume)
                    {
                        SIGNALS_MAX + 2 * SETTLE
                    } else if matches!(action, Some(A::JobSwitch | A::JobSuspend)) {
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
        let files = TaskFiles::open(dir.path()).unwrap();
        let res = files.set_frozen_within(dir.path(), true, Duration::from_millis(20));
        assert!(res.is_err(), "{res:?}");
        let freeze = std::fs::read_to_string(dir.path().join("cgroup.freeze")).unwrap();
        assert_eq!(freeze.trim_end_matches('\n').chars().next(), Some('0'));
        assert!(!files.freezing());
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
