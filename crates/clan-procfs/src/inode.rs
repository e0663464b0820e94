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
//! | `gpid << 24 \| t << 21 \| 1 << 20 \| i` | a name of `/GPID` (i below 4096: its index in a table shared by every process, never renumbered) or a deeper path (i from 4096: its index in the gpid's own table), of the process that tag `t` (one of eight, [`Inodes::bind`]) stands for |
//! | `1 << 63 \| i` | a path passed through to the local /proc (i: index in that table) |
//!
//! Gpids are below 2^31 (213 nodes of 10^7), so `gpid << 24` stays below 2^55.
//!
//! A gpid names one process at a time, known by its start time ([`Inodes::bind`]); one that
//! takes the pid of one that exited is a new one: the kernel gets its directory with a new
//! generation (the start time, [`Inodes::start_of`]), and its paths get numbers of their
//! own (the tag `t`), so a handle on the old process's files stays the old process's, and
//! the view answers it as the kernel does for an exited process. A new process takes a
//! tag of which the kernel holds no number ([`Inodes::bind`]), so that a tag's start time
//! is replaced only once nothing can ask about the process it stood for (unless the
//! kernel holds numbers of all eight).
//!
//! The tables hold what the kernel may still ask about, no more (FUSE's forget): the
//! kernel holds a number from each lookup that answered it until it forgets that many
//! ([`Inodes::looked_up`], [`Inodes::forget`]). A path that is gone (its process, or a
//! thread or descriptor a listing no longer has: [`Inodes::retire_listed`]) is
//! dropped once the kernel holds it no more, and its number is given again; a path that
//! is there keeps its number (the names of `/GPID` always do).

use std::collections::{BTreeSet, HashMap};

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
/// in bits 21 to 23, one the kernel holds no number of (of eight, while it holds some of
/// each, the one after the current: a handle kept on that process is then this one's).
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

/// A numbered path, and how many lookups of its number the kernel has not forgotten.
#[derive(Debug)]
struct Entry {
    path: String,
    lookups: u64,
}

/// Paths interned to small numbers. A number is given again only once its path is gone
/// and the kernel has forgotten it.
#[derive(Debug, Default)]
struct PathTable {
    /// The paths that are there.
    by_path: HashMap<String, u64>,
    /// Every number: of a path that is there, or of one gone that the kernel still holds.
    by_index: HashMap<u64, Entry>,
    next: u64,
    /// Numbers given back, the lowest given first.
    free: BTreeSet<u64>,
}

impl PathTable {
    fn intern(&mut self, path: &str, limit: u64) -> Option<u64> {
        if let Some(&i) = self.by_path.get(path) {
            return Some(i);
        }
        let i = match self.free.pop_first() {
            Some(i) => i,
            None if self.next > limit => return None,
            None => {
                self.next += 1;
                self.next - 1
            }
        };
        self.by_path.insert(path.to_string(), i);
        self.by_index.insert(
            i,
            Entry {
                path: path.to_string(),
                lookups: 0,
            },
        );
        Some(i)
    }

    fn get(&self, i: u64) -> Option<&String> {
        self.by_index.get(&i).map(|e| &e.path)
    }

    fn looked_up(&mut self, i: u64) {
        if let Some(e) = self.by_index.get_mut(&i) {
            e.lookups += 1;
        }
    }

    /// The kernel forgot `n` lookups of number `i`. A path gone that it holds no more is
    /// dropped; `also_there`: one that is there too (its number changes at its next
    /// lookup).
    fn forget(&mut self, i: u64, n: u64, also_there: bool) {
        let Some(e) = self.by_index.get_mut(&i) else {
            return;
        };
        e.lookups = e.lookups.saturating_sub(n);
        if e.lookups == 0 {
            if also_there && self.by_path.get(&e.path) == Some(&i) {
                self.by_path.remove(&e.path);
            }
            self.drop_if_gone(i);
        }
    }

    /// Drops number `i` if its path is gone and the kernel holds it no more.
    fn drop_if_gone(&mut self, i: u64) {
        let Some(e) = self.by_index.get(&i) else {
            return;
        };
        if e.lookups == 0 && self.by_path.get(&e.path) != Some(&i) {
            self.by_index.remove(&i);
            self.free.insert(i);
        }
    }

    /// The paths for which `gone` is true are gone: dropped now if the kernel holds them
    /// no more, else once it has forgotten them.
    fn retire(&mut self, gone: impl Fn(&str) -> bool) {
        let numbers: Vec<u64> = self
            .by_path
            .iter()
            .filter(|(p, _)| gone(p))
            .map(|(_, &i)| i)
            .collect();
        for i in numbers {
            if let Some(e) = self.by_index.get(&i) {
                let path = e.path.clone();
                self.by_path.remove(&path);
            }
            self.drop_if_gone(i);
        }
    }

    fn is_empty(&self) -> bool {
        self.by_index.is_empty()
    }
}

/// Whether `path` is in directory `dir` (any depth) under a name not in `names`.
fn under_but_not(path: &str, dir: &str, names: &[&str]) -> bool {
    let rest = if dir.is_empty() {
        Some(path)
    } else {
        path.strip_prefix(dir).and_then(|r| r.strip_prefix('/'))
    };
    rest.is_some_and(|r| !names.contains(&r.split('/').next().unwrap_or(r)))
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
    /// Lookups of `/GPID` and of its names the kernel has not forgotten.
    held: u64,
    /// Lookups the kernel has not forgotten of the numbers of each tag (the names of
    /// `/GPID` and the deeper paths of the process the tag stands for).
    held_tags: [u64; TAGS],
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
            held: 0,
            held_tags: [0; TAGS],
        }
    }

    /// Whether the kernel holds nothing of the gpid and no path of it is kept.
    fn is_empty(&self) -> bool {
        self.held == 0 && self.paths.is_empty()
    }
}

/// What a number of a process stands for in its tables.
enum ProcIno {
    /// `/GPID` or one of its names (counted together).
    Named(u64),
    /// A deeper path: (gpid, index).
    Deeper(u64, u64),
}

fn proc_ino(ino: u64) -> Option<ProcIno> {
    let g = gpid_of(ino)?;
    let low = ino & ((1 << PROC_SHIFT) - 1);
    match low & PROC_INDEX {
        _ if low == 0 => Some(ProcIno::Named(g)),
        i if i < PROC_NAMES => Some(ProcIno::Named(g)),
        i => Some(ProcIno::Deeper(g, i)),
    }
}

/// The tag of a number of a process's path (`None` for `/GPID` itself, which has none).
fn tag_of(ino: u64) -> Option<usize> {
    let low = ino & ((1 << PROC_SHIFT) - 1);
    (gpid_of(ino).is_some() && low != 0).then_some(((low & TAG_MASK) >> TAG_SHIFT) as usize)
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
    /// their own, the first after the current of which the kernel holds no number (the
    /// one after the current when it holds numbers of every tag). 0 (not known) changes
    /// nothing.
    pub fn bind(&mut self, gpid: u64, start: u64) {
        if start == 0 {
            return;
        }
        let state = self.procs.entry(gpid).or_insert_with(ProcState::new);
        if state.starts[state.current] == start {
            return;
        }
        if state.starts[state.current] != 0 {
            let after = |k: usize| (state.current + k) % TAGS;
            state.current = (1..TAGS)
                .map(after)
                .find(|&t| state.held_tags[t] == 0)
                .unwrap_or(after(1));
        }
        state.starts[state.current] = start;
    }

    /// The kernel was given `ino` by a lookup: it holds it until it forgets it.
    pub fn looked_up(&mut self, ino: u64) {
        if ino & PASS != 0 {
            return self.pass.looked_up(ino & !PASS);
        }
        let tag = tag_of(ino);
        let state = match proc_ino(ino) {
            Some(ProcIno::Named(g)) => {
                let state = self.procs.entry(g).or_insert_with(ProcState::new);
                state.held += 1;
                state
            }
            Some(ProcIno::Deeper(g, i)) => match self.procs.get_mut(&g) {
                Some(state) if state.paths.get(i).is_some() => {
                    state.paths.looked_up(i);
                    state
                }
                _ => return,
            },
            None => return,
        };
        if let Some(t) = tag {
            state.held_tags[t] += 1;
        }
    }

    /// The kernel forgot `n` lookups of `ino` (FUSE forget): what is gone and no longer
    /// held is dropped. A passed-through path goes then even if it is there (the kernel's
    /// own /proc numbers its entries anew too; a host pid's are many over time).
    pub fn forget(&mut self, ino: u64, n: u64) {
        if ino & PASS != 0 {
            return self.pass.forget(ino & !PASS, n, true);
        }
        let g = match proc_ino(ino) {
            Some(ProcIno::Named(g)) => {
                if let Some(state) = self.procs.get_mut(&g) {
                    state.held = state.held.saturating_sub(n);
                }
                g
            }
            Some(ProcIno::Deeper(g, i)) => {
                if let Some(state) = self.procs.get_mut(&g) {
                    state.paths.forget(i, n, false);
                }
                g
            }
            None => return,
        };
        if let (Some(state), Some(t)) = (self.procs.get_mut(&g), tag_of(ino)) {
            state.held_tags[t] = state.held_tags[t].saturating_sub(n);
        }
        if self.procs.get(&g).is_some_and(ProcState::is_empty) {
            self.procs.remove(&g);
        }
    }

    /// The processes for which `keep` is false are gone: their paths go (once the kernel
    /// holds them no more), and with them what is known of the gpid.
    pub fn retain_procs(&mut self, keep: impl Fn(u64) -> bool) {
        self.procs.retain(|&g, state| {
            if !keep(g) {
                state.paths.retire(|_| true);
            }
            !state.is_empty()
        });
    }

    /// `gpid`'s process is gone: as [`Inodes::retain_procs`], for one.
    pub fn retire_proc(&mut self, gpid: u64) {
        if let Some(state) = self.procs.get_mut(&gpid) {
            state.paths.retire(|_| true);
            if state.is_empty() {
                self.procs.remove(&gpid);
            }
        }
    }

    /// A listing of directory `dir` of `gpid`'s process has `names`: paths in it under
    /// other names are gone (threads, descriptors).
    pub fn retire_listed(&mut self, gpid: u64, dir: &str, names: &[&str]) {
        if let Some(state) = self.procs.get_mut(&gpid) {
            state.paths.retire(|p| under_but_not(p, dir, names));
            if state.is_empty() {
                self.procs.remove(&gpid);
            }
        }
    }

    /// Passed-through paths for which `keep` is false are gone.
    pub fn retain_pass(&mut self, keep: impl Fn(&str) -> bool) {
        self.pass.retire(|p| !keep(p));
    }

    /// A listing of the passed-through directory `dir` has `names`: paths in it under
    /// other names are gone.
    pub fn retire_pass_listed(&mut self, dir: &str, names: &[&str]) {
        self.pass
            .retire(|p| !dir.is_empty() && under_but_not(p, dir, names));
    }

    /// How many paths are numbered (processes' own, passed through).
    pub fn sizes(&self) -> (usize, usize) {
        (
            self.procs
                .values()
                .map(|t| t.paths.by_index.len())
                .sum::<usize>(),
            self.pass.by_index.len(),
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
        t.looked_up(a);
        t.retain_procs(|g| g != 10_000_001);
        // Gone, but the kernel holds it: its number stands for it, and is not given.
        assert_eq!(t.node(a), Some(Node::ProcPath(10_000_001, "fd/3".into())));
        let b = t.ino(&Node::ProcPath(10_000_001, "fd/4".into())).unwrap();
        assert_ne!(a, b);
        assert_eq!(t.node(b), Some(Node::ProcPath(10_000_001, "fd/4".into())));
        // Forgotten by the kernel: dropped, its number given again.
        t.forget(a, 1);
        assert_eq!(t.node(a), None);
        t.retain_procs(|_| false);
        assert_eq!(t.sizes(), (0, 0));
    }

    /// Regression: tables of paths grew for the life of the mount (`task/TID` of every
    /// thread a process ever had). Paths a listing no longer has go once the kernel has
    /// forgotten them, and their numbers are given again; paths that are there keep theirs.
    #[test]
    fn paths_of_gone_threads_go_and_live_ones_keep_their_numbers() {
        let mut t = Inodes::default();
        let g = 20_000_005;
        let p = |path: String| Node::ProcPath(g, path);
        let dir = t.ino(&Node::Proc(g)).unwrap();
        t.looked_up(dir);
        let main = t.ino(&p(format!("task/{g}/stat"))).unwrap();
        t.looked_up(main);
        let mut highest = 0;
        for tid in 20_000_006..20_010_000u64 {
            let listed = [g.to_string(), tid.to_string()];
            let names: Vec<&str> = listed.iter().map(String::as_str).collect();
            // top -H: list task/, look at each thread's stat.
            t.retire_listed(g, "task", &names);
            let d = t.ino(&p(format!("task/{tid}"))).unwrap();
            let st = t.ino(&p(format!("task/{tid}/stat"))).unwrap();
            t.looked_up(d);
            t.looked_up(st);
            highest = highest.max(st & PROC_INDEX);
            // The kernel forgets the thread's entries some time after it ended.
            if tid % 10 == 0 {
                for old in tid - 10..tid {
                    for path in [format!("task/{old}"), format!("task/{old}/stat")] {
                        if let Some(&i) = t
                            .procs
                            .get(&g)
                            .and_then(|s| s.paths.by_index.iter().find(|(_, e)| e.path == path))
                            .map(|(i, _)| i)
                        {
                            t.forget(g << PROC_SHIFT | PROC_PATH | i, 1);
                        }
                    }
                }
            }
        }
        assert!(highest < PROC_NAMES + 64, "numbers grew to {highest}");
        assert!(t.sizes().0 < 64, "{:?}", t.sizes());
        assert_eq!(
            t.ino(&p(format!("task/{g}/stat"))),
            Some(main),
            "a live thread's"
        );
        // The kernel forgets the live thread's too: it keeps its number all the same.
        t.forget(main, 1);
        assert_eq!(t.ino(&p(format!("task/{g}/stat"))), Some(main));
        // The process goes: what the kernel holds stays until it forgets it all, then
        // nothing is left of it.
        t.retain_procs(|_| false);
        assert_eq!(t.node(main), None, "gone and forgotten");
        let held: Vec<(u64, u64)> = t.procs[&g]
            .paths
            .by_index
            .iter()
            .map(|(&i, e)| (i, e.lookups))
            .collect();
        for (i, n) in held {
            t.forget(g << PROC_SHIFT | PROC_PATH | i, n);
        }
        assert!(t.procs.contains_key(&g), "the kernel holds /GPID");
        t.forget(dir, 1);
        assert_eq!(t.sizes(), (0, 0));
        assert!(t.procs.is_empty());
    }

    #[test]
    fn passed_through_paths_go_when_forgotten_or_gone() {
        let mut t = Inodes::default();
        let pass = |p: &str| Node::Pass(p.to_string());
        let a = t.ino(&pass("4711/status")).unwrap();
        t.looked_up(a);
        t.forget(a, 1);
        assert_eq!(t.node(a), None, "forgotten by the kernel");
        let task = t.ino(&pass("4711/task/4712")).unwrap();
        t.ino(&pass("4711/task/4711")).unwrap();
        t.retire_pass_listed("4711/task", &["4711"]);
        assert_eq!(t.node(task), None, "a thread the listing no longer has");
        t.retain_pass(|p| !p.starts_with("4711"));
        assert_eq!(t.sizes(), (0, 0));
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
        t.looked_up(status);
        t.retain_procs(|_| false);
        assert_eq!(t.node(status), Some(p(10_000_001, "status")));
        let stat = t.ino(&p(10_000_001, "stat")).unwrap();
        assert_ne!(stat, status);
        assert_eq!(t.ino(&p(10_000_001, "status")), Some(status));
        assert_eq!(t.node(stat), Some(p(10_000_001, "stat")));
        // The deeper path's number is gone with its table (not held by the kernel), and is
        // not a name's.
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

    /// Regression: the ninth process to have a gpid took the tag of the first, whose
    /// start time it replaced, while the kernel still held a number of the first: an
    /// attribute asked of that handle was the new process's. A tag the kernel holds a
    /// number of is now passed over.
    #[test]
    fn a_tag_the_kernel_holds_is_not_given_to_a_new_process() {
        let mut t = Inodes::default();
        let g = 20_000_005;
        let p = |name: &str| Node::ProcPath(g, name.to_string());
        t.bind(g, 100);
        let first = t.ino(&p("status")).unwrap();
        t.looked_up(first);
        // Twenty processes after it, each looked up and forgotten again.
        for start in 101..121 {
            t.bind(g, start);
            let n = t.ino(&p("status")).unwrap();
            assert_ne!(n, first, "start {start} took the held tag");
            assert_eq!(t.start_of(n), start);
            t.looked_up(n);
            t.forget(n, 1);
            assert_eq!(t.start_of(first), 100, "after start {start}");
        }
        // Once the kernel forgot it, the tag is free again.
        t.forget(first, 1);
        let mut seen = std::collections::HashSet::new();
        for start in 200..208 {
            t.bind(g, start);
            seen.insert(t.ino(&p("status")).unwrap());
        }
        assert!(seen.contains(&first), "the forgotten tag is given again");
        // The kernel holding numbers of all eight: the one after the current, as before.
        let mut held = Vec::new();
        for start in 300..308 {
            t.bind(g, start);
            let n = t.ino(&p("fd/3")).unwrap();
            t.looked_up(n);
            held.push(n);
        }
        let current = t.ino(&p("fd/3")).unwrap();
        t.bind(g, 400);
        let next = t.ino(&p("fd/3")).unwrap();
        assert_ne!(next, current);
        assert_eq!(t.start_of(next), 400);
        for n in held {
            t.forget(n, 1);
        }
        t.retain_procs(|_| false);
        assert_eq!(t.sizes(), (0, 0));
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
