//! Process genealogy of each task (the process tracking paper's M4), from the kernel's
//! proc connector: every fork and exit of the machine, as it happens.
//!
//! A process is tracked when its parent is, or when it is born in one of the node's job
//! cgroups (the processes clan starts are: `CLONE_INTO_CGROUP`); a tracked process's child
//! belongs to the same task, so the cgroup is read once per root, not per fork. When a
//! tracked process exits, its children are adopted by its nearest living tracked ancestor
//! (the paper's policy), not by init, so the forest of a task keeps its shape however its
//! processes daemonize, double-fork or outlive their parents. Threads are not processes and
//! are skipped. If the kernel drops events (the socket overflows), the forest is rebuilt
//! from the task cgroups and the kernel's parent links.

use crate::node::Node;
use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use tracing::{debug, info, warn};

/// One tracked process (host pid numbers, as the connector reports them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GNode {
    /// Nearest living tracked ancestor (0: a root of its task).
    pub parent: u32,
    pub job: u64,
}

/// The forests of the node's tasks, with each process's children indexed so that an exit
/// costs its own children, not a scan of the node.
#[derive(Default)]
pub struct Genealogy {
    nodes: HashMap<u32, GNode>,
    kids: HashMap<u32, HashSet<u32>>,
}

impl Genealogy {
    /// Tracks `pid` (again: a reused pid replaces what was known of the old process).
    pub fn insert(&mut self, pid: u32, node: GNode) {
        self.exit(pid);
        if node.parent != 0 {
            self.kids.entry(node.parent).or_default().insert(pid);
        }
        self.nodes.insert(pid, node);
    }

    pub fn get(&self, pid: u32) -> Option<GNode> {
        self.nodes.get(&pid).copied()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// A fork seen: returns true when the child is now tracked.
    pub fn fork(&mut self, parent: u32, child: u32, root_job: impl FnOnce() -> u64) -> bool {
        if let Some(p) = self.get(parent) {
            self.insert(child, GNode { parent, job: p.job });
            return true;
        }
        let job = root_job();
        if job != 0 {
            self.insert(child, GNode { parent: 0, job });
            return true;
        }
        false
    }

    /// An exit seen: the process leaves its forest, its children go to its parent.
    pub fn exit(&mut self, pid: u32) {
        let Some(gone) = self.nodes.remove(&pid) else {
            return;
        };
        if let Some(s) = self.kids.get_mut(&gone.parent) {
            s.remove(&pid);
            if s.is_empty() {
                self.kids.remove(&gone.parent);
            }
        }
        let Some(orphans) = self.kids.remove(&pid) else {
            return;
        };
        for k in &orphans {
            if let Some(n) = self.nodes.get_mut(k) {
                n.parent = gone.parent;
            }
        }
        if gone.parent != 0 {
            self.kids.entry(gone.parent).or_default().extend(orphans);
        }
    }

    /// Tracked processes of `job`.
    pub fn of_job(&self, job: u64) -> Vec<(u32, GNode)> {
        let mut v: Vec<(u32, GNode)> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.job == job)
            .map(|(p, n)| (*p, *n))
            .collect();
        v.sort_by_key(|(p, _)| *p);
        v
    }
}

/// cland's own line of processes outside the tasks: its children and their descendants that
/// are not in a task (shepherd launchers, the shepherds proper, the view server). A task
/// root is only ever forked by one of them (a shepherd, into the job's cgroup), so an
/// untracked fork whose parent is not of this line is no root, and costs no read of
/// `/proc/PID/cgroup` (the host's own fork-heavy work is most forks).
#[derive(Debug, Default)]
pub struct Lineage(HashSet<u32>);

impl Lineage {
    /// What an untracked fork of `parent` into `child` is, for `me` (cland's pid): `true`
    /// when the child may be a task root (its cgroup says); the child joins the line when it
    /// is cland's or a child of the line (the caller removes it again if it is a root).
    pub fn forked(&mut self, me: u32, parent: u32, child: u32) -> bool {
        if parent == me {
            self.0.insert(child);
            return false;
        }
        if self.0.contains(&parent) {
            self.0.insert(child);
            return true;
        }
        false
    }

    pub fn exited(&mut self, pid: u32) {
        self.0.remove(&pid);
    }

    /// Starts again from what the kernel says: cland's children, their descendants, and
    /// the processes of the node's shepherds cgroup (shepherds proper outlive their
    /// launchers and are adopted by the node's init).
    fn seed(me: u32, shepherds: Option<&std::path::Path>) -> Lineage {
        let mut l = Lineage::default();
        let mut todo = vec![me];
        if let Some(dir) = shepherds {
            todo.extend(
                clan_core::sys::read_small(dir.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|p| p.trim().parse::<u32>().ok()),
            );
        }
        while let Some(p) = todo.pop() {
            if p != me && !l.0.insert(p) {
                continue;
            }
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
                continue;
            };
            for t in tasks.flatten() {
                let kids =
                    clan_core::sys::read_small(t.path().join("children")).unwrap_or_default();
                todo.extend(
                    kids.split_whitespace()
                        .filter_map(|k| k.parse::<u32>().ok()),
                );
            }
        }
        l
    }
}

const NETLINK_CONNECTOR: i32 = 11;
const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const PROC_EVENT_FORK: u32 = 0x1;
const PROC_EVENT_EXIT: u32 = 0x8000_0000;
const NLMSG_HDR: usize = 16;
const CN_MSG_HDR: usize = 20;
/// what, cpu, timestamp
const EVENT_HDR: usize = 16;

/// A decoded proc connector event (only what genealogy needs).
#[derive(Debug, PartialEq, Eq)]
pub enum ProcEvent {
    Fork {
        parent_tgid: u32,
        child_pid: u32,
        child_tgid: u32,
    },
    Exit {
        pid: u32,
        tgid: u32,
    },
    Other,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Decodes the netlink messages in one datagram; malformed bytes end the decoding.
pub fn decode(buf: &[u8]) -> Vec<ProcEvent> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + NLMSG_HDR <= buf.len() {
        let Some(len) = u32_at(buf, off).map(|l| l as usize) else {
            break;
        };
        if len < NLMSG_HDR || off + len > buf.len() {
            break;
        }
        let msg = &buf[off..off + len];
        let ev = NLMSG_HDR + CN_MSG_HDR;
        if let (Some(idx), Some(what)) = (u32_at(msg, NLMSG_HDR), u32_at(msg, ev)) {
            if idx == CN_IDX_PROC {
                let data = ev + EVENT_HDR;
                let e = match what {
                    PROC_EVENT_FORK => (|| {
                        Some(ProcEvent::Fork {
                            parent_tgid: u32_at(msg, data + 4)?,
                            child_pid: u32_at(msg, data + 8)?,
                            child_tgid: u32_at(msg, data + 12)?,
                        })
                    })(),
                    PROC_EVENT_EXIT => (|| {
                        Some(ProcEvent::Exit {
                            pid: u32_at(msg, data)?,
                            tgid: u32_at(msg, data + 4)?,
                        })
                    })(),
                    _ => Some(ProcEvent::Other),
                };
                out.extend(e);
            }
        }
        // Messages are 4-byte aligned.
        off += (len + 3) & !3;
    }
    out
}

/// Whether the kernel filters proc connector events per listener (Linux 6.6: the listen
/// request may carry an event mask, and events outside it wake nobody). Older kernels
/// ignore a listen request of that size, so they get the plain one.
fn filters_events() -> bool {
    let Ok(u) = nix::sys::utsname::uname() else {
        return false;
    };
    let release = u.release().to_string_lossy().into_owned();
    let mut nums = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse::<u32>().ok());
    matches!((nums.next(), nums.next()), (Some(major), Some(minor)) if (major, minor) >= (6, 6))
}

/// The netlink message that subscribes socket `port` to the proc connector: with `mask`,
/// to forks and exits only (`struct proc_input`), else to every event.
fn listen_request(port: u32, mask: bool) -> Vec<u8> {
    let payload: usize = if mask { 8 } else { 4 };
    let total = NLMSG_HDR + CN_MSG_HDR + payload;
    let mut msg = Vec::with_capacity(total);
    msg.extend_from_slice(&(total as u32).to_ne_bytes());
    msg.extend_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
    msg.extend_from_slice(&0u16.to_ne_bytes()); // flags
    msg.extend_from_slice(&0u32.to_ne_bytes()); // seq
    msg.extend_from_slice(&port.to_ne_bytes());
    msg.extend_from_slice(&CN_IDX_PROC.to_ne_bytes());
    msg.extend_from_slice(&CN_VAL_PROC.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes()); // seq
    msg.extend_from_slice(&0u32.to_ne_bytes()); // ack
    msg.extend_from_slice(&(payload as u16).to_ne_bytes()); // len
    msg.extend_from_slice(&0u16.to_ne_bytes()); // flags
    msg.extend_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
    if mask {
        msg.extend_from_slice(&(PROC_EVENT_FORK | PROC_EVENT_EXIT).to_ne_bytes());
    }
    msg
}

/// Opens the proc connector and subscribes to its events (needs CAP_NET_ADMIN).
fn connect() -> std::io::Result<OwnedFd> {
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            NETLINK_CONNECTOR,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by socket(2) and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_nl is plain data; zeroed is a valid value.
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as u16;
    sa.nl_groups = CN_IDX_PROC;
    // SAFETY: bind with a properly sized sockaddr_nl.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &sa as *const libc::sockaddr_nl as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // A bigger receive buffer: fork storms come in bursts.
    let size: libc::c_int = 4 << 20;
    // SAFETY: setsockopt with an int option value.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            &size as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as u32,
        )
    };
    let msg = listen_request(std::process::id(), filters_events());
    // SAFETY: send(2) of a buffer we own.
    let n = unsafe {
        libc::send(
            fd.as_raw_fd(),
            msg.as_ptr() as *const libc::c_void,
            msg.len(),
            0,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// [`connect`] from the initial network namespace, the only one the proc connector
/// answers in (a cland in another, a node of a cluster made with `clan up --netns`, is
/// refused): on a thread of its own that enters it (a thread's network namespace is its
/// own; the socket stays in the namespace it was made in). The namespace is init's, or
/// kthreadd's (pid 2, the kernel's own, always there) where init's can not be opened.
fn connect_from_initial_netns() -> std::io::Result<OwnedFd> {
    std::thread::Builder::new()
        .name("proc-events-ns".into())
        .spawn(|| {
            let ns = std::fs::File::open("/proc/1/ns/net")
                .or_else(|_| std::fs::File::open("/proc/2/ns/net"))?;
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(std::io::Error::from)?;
            connect()
        })?
        .join()
        .map_err(|_| std::io::Error::other("the proc connector's thread panicked"))?
}

/// One line of `clan job tree`: a process, its tracked parent, its command.
pub struct TreeLine {
    pub pid: u32,
    pub parent: u32,
    pub cmd: String,
}

fn cmdline(host: u32) -> String {
    static READS: std::sync::LazyLock<crate::process::view::MapReads> =
        std::sync::LazyLock::new(|| crate::process::view::MapReads::new("tree.mapreads"));
    // A process whose memory map is busy (`MapReads`) shows without its command line.
    let b = match READS.begin(host) {
        Some(_reading) => std::fs::read(format!("/proc/{host}/cmdline")).unwrap_or_default(),
        None => Vec::new(),
    };
    let s: String = String::from_utf8_lossy(&b).replace('\0', " ");
    s.trim_end().to_string()
}

impl Node {
    /// The forest of job `job`'s task here, in the node's pid numbers (also for processes
    /// of a pid namespace nested in the node's, whose inner numbers would collide).
    pub fn job_tree(&self, job: u64) -> Vec<TreeLine> {
        let procs = self.genealogy.lock().of_job(job);
        let level = self.pid_level();
        let node_pid = |host: u32| clan_core::sys::ns_pid_at(host, level);
        procs
            .into_iter()
            .filter_map(|(host, n)| {
                Some(TreeLine {
                    pid: node_pid(host)?,
                    parent: if n.parent == 0 {
                        0
                    } else {
                        node_pid(n.parent)?
                    },
                    cmd: cmdline(host),
                })
            })
            .collect()
    }

    /// The job of a host process by its cgroup, if it is one of this node's tasks.
    fn job_of_host_pid(&self, pid: u32) -> u64 {
        // Only the node's own subtree: other nodes of a local cluster share the host.
        self.cgroup
            .as_ref()
            .and_then(|cg| cg.task_of(pid, false))
            .unwrap_or(0)
    }

    /// Rebuilds the forests from the task cgroups and the kernel's parent links (at start,
    /// and after lost events). Parents outside the task make roots.
    pub fn rebuild_genealogy(&self) {
        let Some(cg) = &self.cgroup else { return };
        let mut g = Genealogy::default();
        let Ok(rd) = std::fs::read_dir(&cg.root) else {
            return;
        };
        let mut members: Vec<(u32, u64)> = Vec::new();
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(job) = name.strip_prefix("job").and_then(|j| j.parse::<u64>().ok()) else {
                continue;
            };
            let procs =
                clan_core::sys::read_small(e.path().join("cgroup.procs")).unwrap_or_default();
            members.extend(
                procs
                    .lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .map(|p| (p, job)),
            );
        }
        let set: HashMap<u32, u64> = members.iter().copied().collect();
        for (pid, job) in &members {
            let ppid = clan_core::sys::read_small(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')
                        .and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<u32>().ok())
                })
                .unwrap_or(0);
            let parent = if set.get(&ppid) == Some(job) { ppid } else { 0 };
            g.insert(*pid, GNode { parent, job: *job });
        }
        *self.genealogy.lock() = g;
    }

    /// Follows the proc connector for the life of the daemon (a thread of its own).
    pub fn follow_proc_events(self: &Arc<Self>) {
        if self.cgroup.is_none() {
            return;
        }
        let fd = match connect().or_else(|e| match e.raw_os_error() {
            Some(libc::ECONNREFUSED) => connect_from_initial_netns(),
            _ => Err(e),
        }) {
            Ok(fd) => fd,
            Err(e) => {
                warn!("proc connector unavailable ({e}): no job genealogy");
                return;
            }
        };
        info!("following process events for job genealogy");
        self.rebuild_genealogy();
        let me = std::process::id();
        let shepherds = self.cgroup.as_ref().map(|cg| cg.sub("shepherds"));
        let mut line = Lineage::seed(me, shepherds.as_deref());
        let node = self.clone();
        std::thread::Builder::new()
            .name("proc-events".into())
            .spawn(move || {
                // Every fork and exit of the machine wakes this thread: it must not preempt
                // the processes (and the spawns) those events are about.
                if let Err(e) = clan_core::sys::batch_scheduling(true) {
                    debug!("proc events thread stays SCHED_OTHER: {e}");
                }
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    // SAFETY: recv(2) into a buffer we own, within its length.
                    let n = unsafe {
                        libc::recv(
                            fd.as_raw_fd(),
                            buf.as_mut_ptr() as *mut libc::c_void,
                            buf.len(),
                            0,
                        )
                    };
                    if n < 0 {
                        let e = std::io::Error::last_os_error();
                        match e.raw_os_error() {
                            Some(libc::EINTR) => continue,
                            Some(libc::ENOBUFS) => {
                                debug!("proc events lost: rebuilding genealogy");
                                node.rebuild_genealogy();
                                line = Lineage::seed(me, shepherds.as_deref());
                                continue;
                            }
                            _ => {
                                warn!("proc connector: {e}");
                                return;
                            }
                        }
                    }
                    for ev in decode(&buf[..n as usize]) {
                        match ev {
                            ProcEvent::Fork {
                                parent_tgid,
                                child_pid,
                                child_tgid,
                            } if child_pid == child_tgid => {
                                let tracked =
                                    node.genealogy.lock().fork(parent_tgid, child_tgid, || 0);
                                if !tracked && line.forked(me, parent_tgid, child_tgid) {
                                    // A root, if born in one of our task cgroups (read
                                    // outside the lock); a root leaves cland's line.
                                    let job = node.job_of_host_pid(child_tgid);
                                    if job != 0 {
                                        line.exited(child_tgid);
                                        node.genealogy.lock().fork(parent_tgid, child_tgid, || job);
                                    }
                                }
                            }
                            ProcEvent::Exit { pid, tgid } if pid == tgid => {
                                node.genealogy.lock().exit(tgid);
                                line.exited(tgid);
                            }
                            _ => {}
                        }
                    }
                }
            })
            .map(|_| ())
            .unwrap_or_else(|e| warn!("proc events thread: {e}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_forks_of_clands_line_may_make_roots() {
        let mut l = Lineage::default();
        let me = 100;
        assert!(!l.forked(me, me, 200)); // a launcher: of the line, not a root
        assert!(l.forked(me, 200, 201)); // its child: may be a root (a shepherd, here)
        assert!(l.forked(me, 201, 202)); // the shepherd proper
        assert!(l.forked(me, 202, 300)); // what it forks: asked (a root leaves the line)
        l.exited(300);
        assert!(
            !l.forked(me, 300, 301),
            "a root's children are the genealogy's"
        );
        assert!(
            !l.forked(me, 7, 8),
            "the host's own forks are not asked about"
        );
        l.exited(200);
        assert!(!l.forked(me, 200, 203), "gone");
        assert!(l.forked(me, 202, 302), "the shepherd outlives its launcher");
    }

    #[test]
    fn the_line_is_seeded_from_the_kernel() {
        // This test process's own children (none) and itself: the seed walks from `me`.
        let me = std::process::id();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let l = Lineage::seed(me, None);
        assert!(l.0.contains(&child.id()), "{l:?}");
        assert!(!l.0.contains(&me));
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn orphans_go_to_their_nearest_living_ancestor() {
        let mut g = Genealogy::default();
        assert!(g.fork(1, 10, || 7)); // a root of job 7
        assert!(g.fork(10, 11, || 0));
        assert!(g.fork(11, 12, || 0));
        assert!(!g.fork(99, 100, || 0)); // not ours
        g.exit(11);
        assert_eq!(
            g.get(12).unwrap().parent,
            10,
            "adopted by its grandparent, not init"
        );
        g.exit(10);
        assert_eq!(
            g.get(12).unwrap().parent,
            0,
            "a root once no ancestor is left"
        );
        assert_eq!(g.of_job(7).len(), 1);
    }

    #[test]
    fn a_reused_pid_is_a_new_process() {
        let mut g = Genealogy::default();
        assert!(g.fork(1, 10, || 7));
        assert!(g.fork(10, 11, || 0));
        assert!(g.fork(11, 12, || 0));
        // 11 exits; its pid comes back as a child of 12, in the same task.
        g.exit(11);
        assert!(g.fork(12, 11, || 0));
        assert_eq!(g.get(11).unwrap().parent, 12);
        assert_eq!(g.get(12).unwrap().parent, 10);
        // The new 11's exit hands nothing of the old one's children around.
        g.exit(11);
        assert_eq!(g.get(12).unwrap().parent, 10);
        // A pid reused outside any task, then seen again as a root of another job.
        g.exit(12);
        assert!(!g.fork(99, 12, || 0));
        assert!(g.get(12).is_none());
        assert!(g.fork(1, 12, || 8));
        assert_eq!(g.of_job(8), vec![(12, GNode { parent: 0, job: 8 })]);
        g.exit(10);
        assert!(g.of_job(7).is_empty());
        assert!(g.kids.is_empty(), "{:?}", g.kids);
    }

    #[test]
    fn many_exits_stay_consistent() {
        // A chain of 2,000 and a fan of 2,000 under its head; the chain exits from the top.
        let mut g = Genealogy::default();
        assert!(g.fork(1, 2, || 5));
        for p in 3..2002 {
            assert!(g.fork(p - 1, p, || 0));
        }
        for k in 3000..5000 {
            assert!(g.fork(2, k, || 0));
        }
        for p in 2..2001 {
            g.exit(p);
        }
        assert_eq!(g.get(2001).unwrap().parent, 0);
        assert!((3000..5000).all(|k| g.get(k).unwrap().parent == 0));
        assert_eq!(g.len(), 2001);
        assert!(g.kids.is_empty());
    }

    #[test]
    fn listen_requests_carry_a_mask_only_when_asked() {
        for (mask, payload) in [(false, 4usize), (true, 8)] {
            let m = listen_request(7, mask);
            assert_eq!(m.len(), NLMSG_HDR + CN_MSG_HDR + payload);
            assert_eq!(u32_at(&m, 0), Some(m.len() as u32));
            let len_at = NLMSG_HDR + 16;
            assert_eq!(
                u16::from_ne_bytes([m[len_at], m[len_at + 1]]) as usize,
                payload
            );
            let op = NLMSG_HDR + CN_MSG_HDR;
            assert_eq!(u32_at(&m, op), Some(PROC_CN_MCAST_LISTEN));
            let want = mask.then_some(PROC_EVENT_FORK | PROC_EVENT_EXIT);
            assert_eq!(u32_at(&m, op + 4), want);
        }
    }

    #[test]
    fn decoding_never_panics_and_reads_forks() {
        for len in 0..80 {
            let junk: Vec<u8> = (0..len).map(|i| (i * 37) as u8).collect();
            let _ = decode(&junk);
        }
        let mut m = Vec::new();
        let total = (NLMSG_HDR + CN_MSG_HDR + EVENT_HDR + 16) as u32;
        m.extend_from_slice(&total.to_ne_bytes());
        m.extend_from_slice(&[0u8; 12]);
        m.extend_from_slice(&CN_IDX_PROC.to_ne_bytes());
        m.extend_from_slice(&[0u8; 16]);
        m.extend_from_slice(&PROC_EVENT_FORK.to_ne_bytes());
        m.extend_from_slice(&[0u8; 12]);
        for v in [5u32, 5, 6, 6] {
            m.extend_from_slice(&v.to_ne_bytes());
        }
        assert_eq!(
            decode(&m),
            vec![ProcEvent::Fork {
                parent_tgid: 5,
                child_pid: 6,
                child_tgid: 6
            }]
        );
    }
}
