//! Inode numbers of the view.
//!
//! A number says what it stands for, so that it is stable for a process's life and a
//! program holding an fd on `/GPID` can read the gpid back from `fstat`:
//!
//! | inode | what |
//! |---|---|
//! | 1 ... 10 | the root, `self`, `thread-self`, `nodes`, the six cluster files (room up to 15) |
//! | 16, 17 ... 22 | the hidden `.clan-walk` and its files (`crate::walk`) |
//! | `1 << 20 \| n << 4 \| k` | `nodes/n` (k = 0) and its files (k = 1 ... 6) |
//! | `gpid << 24` | the directory `/GPID` |
//! | `gpid << 24 \| t << 21 \| 1 << 20 \| i` | a name of `/GPID` (i below 4096: its index in a table shared by every process, never renumbered) or a deeper path (i from 4096: its index in the gpid's own table), of the `t`th process to have the gpid (modulo 8) |
//! | `1 << 63 \| i` | a path passed through to the local /proc (i: index in that table) |
//!
//! Gpids are below 2^31 (213 nodes of 10^7), so `gpid << 24` stays below 2^55.
//!
//! A gpid names one process at a time, known by its start time ([`Inodes::bind`]); one that
//! takes the pid of one that exited is a new one: the kernel gets its directory with a new
//! generation (the start time, [`Inodes::start_of`]), and its paths get numbers of their
//! own (the tag `t`), so a handle on the old process's files stays the old process's, and
//! the view answers it as the kernel does for an exited process.

use std::collections::HashMap;

pub const ROOT: u64 = 1;
pub const SELF: u64 = 2;
pub const THREAD_SELF: u64 = 3;
pub const NODES: u64 = 4;
const CLUSTER_BASE: u64 = 5;
const WALK_DIR: u64 = 16;
const WALK_BASE: u64 = 17;
const NODE_BASE: u64 = 1 << 20;
const _: () = assert!(CLUSTER_BASE + (NodeFile::ALL.len() as u64) <= WALK_DIR);
const PROC_SHIFT: u32 = 24;
const PROC_PATH: u64 = 1 << 20;
const PROC_INDEX: u64 = (1 << 20) - 1;
/// Processes one after the other with one gpid whose paths have numbers apart: the tag
/// in bits 21 to 23 (a handle kept on the 8th process before is taken for this one's).
const TAGS: usize = 8;
const TAG_SHIFT: u32 = 21;
const TAG_MASK: u64 = (TAGS as u64 - 1) << TAG_SHIFT;
/// Indices below this are the names of `/GPID` itself (a fixed set: the kernel's names
/// of a process directory), the same number in every process and never renumbered, so
/// that an entry the kernel keeps for long ([`crate::view::PROC_NAMES_TTL`]) keeps
/// standing for its name however often processes are forgotten.
const PROC_NAMES: u64 = 1 << 12;
const PASS: u64 = 1 << 63;

/// The files every node has and the cluster merges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeFile {
    Loadavg,
    Meminfo,
    Stat,
    Uptime,
    Cpuinfo,
    Locks,
}

impl NodeFile {
    pub const ALL: [NodeFile; 6] = [
        NodeFile::Loadavg,
        NodeFile::Meminfo,
        NodeFile::Stat,
        NodeFile::Uptime,
        NodeFile::Cpuinfo,
        NodeFile::Locks,
    ];

    pub fn name(self) -> &'static str {
        match self {
            NodeFile::Loadavg => "loadavg",
            NodeFile::Meminfo => "meminfo",
            NodeFile::Stat => "stat",
            NodeFile::Uptime => "uptime",
            NodeFile::Cpuinfo => "cpuinfo",
            NodeFile::Locks => "locks",
        }
    }

    pub fn from_name(name: &str) -> Option<NodeFile> {
        NodeFile::ALL.into_iter().find(|f| f.name() == name)
    }

    fn index(self) -> u64 {
        NodeFile::ALL.iter().position(|&f| f == self).unwrap_or(0) as u64
    }
}

/// What an inode stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Root,
    SelfLink,
    ThreadSelf,
    /// `nodes/`
    Nodes,
    /// A cluster file in the root (merged by cland).
    Cluster(NodeFile),
    /// `nodes/N/`
    NodeDir(u32),
    /// `nodes/N/FILE`: that node's own file.
    NodeFile(u32, NodeFile),
    /// `/GPID`
    Proc(u64),
    /// `/GPID/PATH` (`status`, `task/TID/stat`, `fd/3`)
    ProcPath(u64, String),
    /// `PATH` of the local /proc (`sys/kernel/pid_max`, `1234/status`)
    Pass(String),
    /// `.clan-walk/`, hidden in the root
    WalkDir,
    /// `.clan-walk/NAME`: file `crate::walk::FILES[i]` of every process
    Walk(usize),
}

impl Node {
    /// The node of `name` inside a process (`""`: the process directory itself).
    pub fn in_proc(gpid: u64, path: &str) -> Node {
        if path.is_empty() {
            Node::Proc(gpid)
        } else {
            Node::ProcPath(gpid, path.to_string())
        }
    }

    /// The directory that holds this node (the root for the root).
    pub fn parent(&self) -> Node {
        match self {
            Node::Root
            | Node::SelfLink
            | Node::ThreadSelf
            | Node::Nodes
            | Node::Cluster(_)
            | Node::WalkDir
            | Node::Proc(_) => Node::Root,
            Node::Walk(_) => Node::WalkDir,
            Node::NodeDir(_) => Node::Nodes,
            Node::NodeFile(n, _) => Node::NodeDir(*n),
            Node::ProcPath(g, p) => match p.rsplit_once('/') {
                Some((dir, _)) => Node::ProcPath(*g, dir.to_string()),
                None => Node::Proc(*g),
            },
            Node::Pass(p) => match p.rsplit_once('/') {
                Some((dir, _)) => Node::Pass(dir.to_string()),
                None => Node::Root,
            },
        }
    }
}

/// Paths interned to small numbers that are never reused (while the table lives).
#[derive(Debug, Default)]
struct PathTable {
    by_path: HashMap<String, u64>,
    by_index: HashMap<u64, String>,
    next: u64,
}

impl PathTable {
    fn intern(&mut self, path: &str, limit: u64) -> Option<u64> {
        if let Some(&i) = self.by_path.get(path) {
            return Some(i);
        }
        if self.next > limit {
            return None;
        }
        let i = self.next;
        self.next += 1;
        self.by_path.insert(path.to_string(), i);
        self.by_index.insert(i, path.to_string());
        Some(i)
    }

    fn get(&self, i: u64) -> Option<&String> {
        self.by_index.get(&i)
    }

    fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.by_path.retain(|p, _| keep(p));
        self.by_index.retain(|_, p| keep(p));
    }
}

/// What the view keeps of one gpid.
#[derive(Debug)]
struct ProcState {
    /// The start times of the processes that have had the gpid, by tag (0: none or not
    /// known); `current` is the tag of the one the gpid names now.
    starts: [u64; TAGS],
    current: usize,
    /// Deeper paths (indices from [`PROC_NAMES`]).
    paths: PathTable,
}

impl ProcState {
    fn new() -> ProcState {
        ProcState {
            starts: [0; TAGS],
            current: 0,
            paths: PathTable {
                next: PROC_NAMES,
                ..PathTable::default()
            },
        }
    }
}

/// The tables behind the numbers that are not computed.
#[derive(Debug, Default)]
pub struct Inodes {
    /// The names of `/GPID` itself, shared by every process (indices below
    /// [`PROC_NAMES`]).
    names: PathTable,
    /// Per gpid: its processes and deeper paths.
    procs: HashMap<u64, ProcState>,
    pass: PathTable,
}

/// The gpid an inode belongs to (`/GPID` or a path inside it).
pub fn gpid_of(ino: u64) -> Option<u64> {
    (ino & PASS == 0 && ino >> PROC_SHIFT != 0).then_some(ino >> PROC_SHIFT)
}

impl Inodes {
    /// The number of `node`; `None` when a table is full or the node can not be numbered
    /// (a gpid out of range).
    pub fn ino(&mut self, node: &Node) -> Option<u64> {
        Some(match node {
            Node::Root => ROOT,
            Node::SelfLink => SELF,
            Node::ThreadSelf => THREAD_SELF,
            Node::Nodes => NODES,
            Node::Cluster(f) => CLUSTER_BASE + f.index(),
            Node::NodeDir(n) if *n < 1 << 16 => NODE_BASE | u64::from(*n) << 4,
            Node::NodeFile(n, f) if *n < 1 << 16 => {
                NODE_BASE | u64::from(*n) << 4 | (f.index() + 1)
            }
            Node::NodeDir(_) | Node::NodeFile(..) => return None,
            Node::Proc(g) if (1..1 << 39).contains(g) => g << PROC_SHIFT,
            Node::ProcPath(g, p) if (1..1 << 39).contains(g) => {
                let named = (!p.contains('/'))
                    .then(|| self.names.intern(p, PROC_NAMES - 1))
                    .flatten();
                let state = self.procs.entry(*g).or_insert_with(ProcState::new);
                let i = match named {
                    Some(i) => i,
                    None => state.paths.intern(p, PROC_INDEX)?,
                };
                g << PROC_SHIFT | (state.current as u64) << TAG_SHIFT | PROC_PATH | i
            }
            Node::Proc(_) | Node::ProcPath(..) => return None,
            Node::Pass(p) => PASS | self.pass.intern(p, PASS - 1)?,
            Node::WalkDir => WALK_DIR,
            Node::Walk(i) if *i < crate::walk::FILES.len() => WALK_BASE + *i as u64,
            Node::Walk(_) => return None,
        })
    }

    /// What `ino` stands for, if it was numbered.
    pub fn node(&self, ino: u64) -> Option<Node> {
        if ino & PASS != 0 {
            return self.pass.get(ino & !PASS).cloned().map(Node::Pass);
        }
        if let Some(g) = gpid_of(ino) {
            let low = ino & ((1 << PROC_SHIFT) - 1);
            let path = low & !(PROC_INDEX | TAG_MASK) == PROC_PATH;
            return match low {
                0 => Some(Node::Proc(g)),
                _ if path && low & PROC_INDEX < PROC_NAMES => self
                    .names
                    .get(low & PROC_INDEX)
                    .cloned()
                    .map(|p| Node::ProcPath(g, p)),
                _ if path => self
                    .procs
                    .get(&g)?
                    .paths
                    .get(low & PROC_INDEX)
                    .cloned()
                    .map(|p| Node::ProcPath(g, p)),
                _ => None,
            };
        }
        match ino {
            ROOT => Some(Node::Root),
            SELF => Some(Node::SelfLink),
            THREAD_SELF => Some(Node::ThreadSelf),
            NODES => Some(Node::Nodes),
            WALK_DIR => Some(Node::WalkDir),
            i if (WALK_BASE..WALK_BASE + crate::walk::FILES.len() as u64).contains(&i) => {
                Some(Node::Walk((i - WALK_BASE) as usize))
            }
            i if (CLUSTER_BASE..CLUSTER_BASE + NodeFile::ALL.len() as u64).contains(&i) => {
                NodeFile::ALL
                    .get((i - CLUSTER_BASE) as usize)
                    .map(|&f| Node::Cluster(f))
            }
            i if i & NODE_BASE != 0 && i < NODE_BASE << 1 => {
                let n = ((i & !NODE_BASE) >> 4) as u32;
                match i & 0xf {
                    0 => Some(Node::NodeDir(n)),
                    k => NodeFile::ALL
                        .get(k as usize - 1)
                        .map(|&f| Node::NodeFile(n, f)),
                }
            }
            _ => None,
        }
    }

    /// The start time of the process `ino` stands for (the one its gpid names now, for
    /// `/GPID` itself); 0 when not known or not a process's.
    pub fn start_of(&self, ino: u64) -> u64 {
        let Some(state) = gpid_of(ino).and_then(|g| self.procs.get(&g)) else {
            return 0;
        };
        let low = ino & ((1 << PROC_SHIFT) - 1);
        let tag = if low == 0 {
            state.current
        } else {
            ((low & TAG_MASK) >> TAG_SHIFT) as usize
        };
        state.starts[tag]
    }

    /// `gpid` names the process that started at `start` from now on (what a lookup of
    /// `/GPID` found). Another one than before is a new process: its paths get a tag of
    /// their own. 0 (not known) changes nothing.
    pub fn bind(&mut self, gpid: u64, start: u64) {
        if start == 0 {
            return;
        }
        let state = self.procs.entry(gpid).or_insert_with(ProcState::new);
        if state.starts[state.current] == start {
            return;
        }
        if state.starts[state.current] != 0 {
            state.current = (state.current + 1) % TAGS;
        }
        state.starts[state.current] = start;
    }

    /// Forgets the paths of processes for which `keep` is false (they are gone).
    pub fn retain_procs(&mut self, keep: impl Fn(u64) -> bool) {
        self.procs.retain(|&g, _| keep(g));
    }

    /// Forgets passed-through paths for which `keep` is false.
    pub fn retain_pass(&mut self, keep: impl Fn(&str) -> bool) {
        self.pass.retain(keep);
    }

    /// How many paths are interned (processes, passed through).
    pub fn sizes(&self) -> (usize, usize) {
        (
            self.names.by_path.len()
                + self
                    .procs
                    .values()
                    .map(|t| t.paths.by_path.len())
                    .sum::<usize>(),
            self.pass.by_path.len(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_round_trip() {
        let mut t = Inodes::default();
        let nodes = [
            Node::Root,
            Node::SelfLink,
            Node::ThreadSelf,
            Node::Nodes,
            Node::Cluster(NodeFile::Loadavg),
            Node::Cluster(NodeFile::Cpuinfo),
            Node::NodeDir(3),
            Node::NodeFile(3, NodeFile::Meminfo),
            Node::NodeFile(213, NodeFile::Cpuinfo),
            Node::Proc(20_000_005),
            Node::ProcPath(20_000_005, "status".into()),
            Node::ProcPath(20_000_005, "task/20000007/stat".into()),
            Node::ProcPath(2_130_000_000, "fd/3".into()),
            Node::Pass("sys/kernel/pid_max".into()),
            Node::Pass("1234".into()),
            Node::WalkDir,
            Node::Walk(0),
            Node::Walk(5),
        ];
        let mut seen = std::collections::HashSet::new();
        for n in &nodes {
            let i = t.ino(n).expect("numbered");
            assert!(seen.insert(i), "{n:?} got a number already taken");
            assert_eq!(t.node(i).as_ref(), Some(n), "ino {i:#x}");
            assert_eq!(t.ino(n), Some(i), "stable");
        }
    }

    #[test]
    fn gpid_readable_from_the_number() {
        let mut t = Inodes::default();
        let d = t.ino(&Node::Proc(30_004_711)).unwrap();
        let f = t.ino(&Node::ProcPath(30_004_711, "stat".into())).unwrap();
        assert_eq!(gpid_of(d), Some(30_004_711));
        assert_eq!(gpid_of(f), Some(30_004_711));
        assert_eq!(gpid_of(ROOT), None);
        let p = t.ino(&Node::Pass("1".into())).unwrap();
        assert_eq!(gpid_of(p), None);
        let n = t.ino(&Node::NodeFile(7, NodeFile::Stat)).unwrap();
        assert_eq!(gpid_of(n), None);
    }

    #[test]
    fn unknown_numbers_are_nothing() {
        let t = Inodes::default();
        assert_eq!(t.node(0), None);
        assert_eq!(t.node(40), None);
        assert_eq!(t.node(PASS | 5), None);
        assert_eq!(t.node(20_000_005 << 24 | PROC_PATH | 9), None);
        assert_eq!(t.node(20_000_005 << 24 | 3), None);
        assert_eq!(t.node(NODE_BASE | 3 << 4 | 9), None);
    }

    #[test]
    fn forgotten_processes_keep_their_numbers_apart() {
        let mut t = Inodes::default();
        let a = t.ino(&Node::ProcPath(10_000_001, "fd/3".into())).unwrap();
        t.retain_procs(|g| g != 10_000_001);
        assert_eq!(t.node(a), None);
        let b = t.ino(&Node::ProcPath(10_000_001, "fd/4".into())).unwrap();
        assert_eq!(t.node(b), Some(Node::ProcPath(10_000_001, "fd/4".into())));
    }

    #[test]
    fn names_of_a_process_directory_are_never_renumbered() {
        let mut t = Inodes::default();
        let p = |g: u64, name: &str| Node::ProcPath(g, name.to_string());
        let status = t.ino(&p(10_000_001, "status")).unwrap();
        let fd = t.ino(&p(10_000_001, "fd/3")).unwrap();
        // Another process: the same name has the same index.
        let other = t.ino(&p(20_000_005, "status")).unwrap();
        assert_eq!(
            other & ((1 << PROC_SHIFT) - 1),
            status & ((1 << PROC_SHIFT) - 1)
        );
        // A sweep forgets the process (wrongly, say: it was left out of one listing)
        // while the kernel keeps its `/GPID/status` entry: the number still stands for
        // `status`, and a name numbered afterwards gets a number of its own.
        t.retain_procs(|_| false);
        assert_eq!(t.node(status), Some(p(10_000_001, "status")));
        let stat = t.ino(&p(10_000_001, "stat")).unwrap();
        assert_ne!(stat, status);
        assert_eq!(t.ino(&p(10_000_001, "status")), Some(status));
        assert_eq!(t.node(stat), Some(p(10_000_001, "stat")));
        // The deeper path's number is gone with its table, and is not a name's.
        assert_eq!(t.node(fd), None);
        let fd4 = t.ino(&p(10_000_001, "fd/4")).unwrap();
        assert!(fd4 & PROC_INDEX >= PROC_NAMES);
        assert_eq!(t.node(fd4), Some(p(10_000_001, "fd/4")));
    }

    /// Regression: a process that takes the pid of one that exited gets numbers of its own
    /// for its paths and a new generation for its directory; the old numbers stay the old
    /// process's.
    #[test]
    fn a_process_that_reuses_a_gpid_gets_numbers_of_its_own() {
        let mut t = Inodes::default();
        let p = |name: &str| Node::ProcPath(20_000_005, name.to_string());
        t.bind(20_000_005, 700);
        let dir = t.ino(&Node::Proc(20_000_005)).unwrap();
        let status = t.ino(&p("status")).unwrap();
        let fd = t.ino(&p("fd/3")).unwrap();
        assert_eq!(
            (t.start_of(dir), t.start_of(status), t.start_of(fd)),
            (700, 700, 700)
        );
        t.bind(20_000_005, 700);
        assert_eq!(t.ino(&p("status")), Some(status), "the same process");
        t.bind(20_000_005, 900);
        let status2 = t.ino(&p("status")).unwrap();
        let fd2 = t.ino(&p("fd/3")).unwrap();
        assert_ne!(status2, status);
        assert_ne!(fd2, fd);
        assert_eq!(
            t.ino(&Node::Proc(20_000_005)),
            Some(dir),
            "/GPID keeps its number"
        );
        assert_eq!(gpid_of(status2), Some(20_000_005));
        assert_eq!(t.node(status2), Some(p("status")));
        assert_eq!(t.node(status), Some(p("status")));
        assert_eq!((t.start_of(dir), t.start_of(status2)), (900, 900));
        assert_eq!((t.start_of(status), t.start_of(fd)), (700, 700));
        // Not known: no start; other numbers: none.
        let other = t.ino(&Node::ProcPath(30_000_001, "status".into())).unwrap();
        assert_eq!(t.start_of(other), 0);
        assert_eq!(t.start_of(ROOT), 0);
    }

    #[test]
    fn parents() {
        assert_eq!(
            Node::ProcPath(10_000_001, "task/10000002/fd".into()).parent(),
            Node::ProcPath(10_000_001, "task/10000002".into())
        );
        assert_eq!(
            Node::ProcPath(10_000_001, "task".into()).parent(),
            Node::Proc(10_000_001)
        );
        assert_eq!(Node::Pass("sys".into()).parent(), Node::Root);
        assert_eq!(
            Node::Pass("sys/kernel".into()).parent(),
            Node::Pass("sys".into())
        );
        assert_eq!(Node::NodeFile(2, NodeFile::Stat).parent(), Node::NodeDir(2));
    }
}
