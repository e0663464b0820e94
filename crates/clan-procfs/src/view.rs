//! What the mount shows: names, attributes, contents (architecture.md, "One /proc for the
//! cluster"). The FUSE layer (`fs.rs`) only turns requests into calls of [`View`].
//!
//! - The root: a directory per gpid (from a snapshot), `self`, `thread-self`, the cluster
//!   files, `nodes/N/`, and every other non-numeric name of the local /proc passed through
//!   (`sys/kernel/pid_max` reads 99999999). Numbers below 10,000,000 are not listed but
//!   resolve to the local `/proc/N`, so a host process finds its own entry.
//! - `/GPID/...`: entries, files and links served by cland with the reader's identity.
//! - A listing of the root fetches a snapshot (`stat status cmdline statm` of every
//!   process) that serves opens of those files for a second, for the same reader, and for
//!   the listing thread while its walk goes on (`serves`). While it is fresh, names in `/GPID` come from a per-node template (every process directory
//!   of a kernel has the same names and modes; the owner is the process's), the first
//!   read of an `environ` or `cgroup` fetches that file for the whole node, and cluster
//!   files are fetched once: what ps, pgrep and top read of every process costs a few
//!   requests per node.

use crate::caller::{self, Caller, Locator, Reader};
use crate::inode::{Inodes, Node, NodeFile, NODES, SELF, THREAD_SELF};
use crate::pass;
use crate::source::{Failure, Source};
use crate::walk;
use clan_core::{Gpid, CLUSTER_INIT, GPID_SPAN};
use clan_proto::{followed_link, pb};
use fuser::{FileAttr, FileType, INodeNo};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// The names in a process's `ns` directory (Linux 5.6 and later; the shim's walks know
/// the same, `walk.c`).
const NS_NAMES: [&str; 10] = [
    "cgroup",
    "ipc",
    "mnt",
    "net",
    "pid",
    "pid_for_children",
    "time",
    "time_for_children",
    "user",
    "uts",
];

/// The longest a snapshot serves the thread that listed the root while its walk goes on
/// (see [`serves`]).
const WALK_TTL: Duration = Duration::from_secs(10);

/// Whether a snapshot `age` old, which last served its walker `idle` ago, may serve a
/// reader (`walker`: the thread that took it). Anyone for `ttl`; the walker for as long
/// as its walk goes on, each of its reads within `ttl` of the one before, and at most
/// [`WALK_TTL`]: one walk over thousands of processes is one snapshot however long it
/// takes, and a read after a pause (psutil's `cpu_percent(interval=1)`) is fresh.
fn serves(age: Duration, idle: Duration, walker: bool, ttl: Duration) -> bool {
    age < ttl || (walker && idle < ttl && age < WALK_TTL)
}

/// The files a snapshot carries for every process (what ps reads of each).
pub const SNAPSHOT_FILES: [&str; 4] = ["stat", "status", "cmdline", "statm"];

/// Files that tools read of every process besides the snapshot's (ps: `environ`, pgrep:
/// `cgroup`): read while a fresh snapshot holds the process, they are fetched for every
/// process of its node at once.
pub const BATCH_FILES: [&str; 2] = ["environ", "cgroup"];

/// Whether number `n` at the root names a process of the cluster view (a gpid, or the
/// cluster's init) rather than a pid of the caller's machine.
fn is_cluster_pid(n: u64) -> bool {
    n >= GPID_SPAN || n == CLUSTER_INIT
}

/// How long the kernel keeps the names of a process directory (see [`View::entry_ttl`]).
pub const PROC_NAMES_TTL: Duration = Duration::from_secs(3600);

/// What `sys/kernel/pid_max` reads: as many digits as the largest gpid of up to 9 nodes,
/// so tools size their PID columns for gpids.
pub const PID_MAX: &[u8] = b"99999999\n";

/// Names of the root that the view defines itself besides the cluster files (never passed
/// through).
const OWN_NAMES: [&str; 4] = [walk::DIR, "self", "thread-self", "nodes"];

/// An errno for the reader.
pub type Errno = i32;

/// How the view is set up.
#[derive(Debug, Clone)]
pub struct Options {
    /// The local /proc (the server's).
    pub proc_root: PathBuf,
    /// The cluster directory (`node<N>/init.pid` of a local cluster's nodes).
    pub cluster_dir: PathBuf,
    /// The node the server talks to.
    pub node: u32,
    /// How long a snapshot serves opens, and process entries stay in the kernel's cache.
    pub ttl: Duration,
    /// Where a `clan shell` of this node has the node's real procfs (`<state>/nodeproc`):
    /// `self` points there for its processes, so that magic links keep working.
    pub node_proc: Option<PathBuf>,
    /// Whether passed-through names are accessed with the reader's identity (the server
    /// is root); otherwise with the server's.
    pub switch_identity: bool,
}

impl Options {
    pub fn new(cluster_dir: PathBuf, node: u32) -> Options {
        Options {
            proc_root: PathBuf::from("/proc"),
            cluster_dir,
            node,
            ttl: Duration::from_secs(1),
            node_proc: None,
            switch_identity: nix::unistd::geteuid().is_root(),
        }
    }
}

/// The caller of one request, as FUSE reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Who {
    pub uid: u32,
    pub gid: u32,
    /// Thread id in the server's pid namespace (0: not visible there).
    pub pid: u32,
}

/// One name of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dirent {
    pub ino: u64,
    pub kind: FileType,
    pub name: OsString,
}

/// The contents of an open file.
#[derive(Debug)]
pub enum Contents {
    /// Fetched at open, read by offset.
    Data(Vec<u8>),
    /// A passed-through file, opened as the reader, read by offset as the reader too (the
    /// kernel decides some contents at read time by who reads: a `stat`'s addresses,
    /// `wchan`), with the identity switch when it is on.
    File(std::fs::File, Reader, bool),
}

struct Snapshot {
    at: Instant,
    reader: Reader,
    /// The thread that listed the root (a `ps` walking the processes): its own reads are
    /// served from the snapshot while its walk goes on ([`serves`]), so that one walk over
    /// thousands of processes is one snapshot however long it takes; anyone else reads
    /// live after a ttl.
    walker: u32,
    /// When the snapshot last served the walker.
    used: Mutex<Instant>,
    procs: HashMap<u64, pb::ProcEntry>,
}

/// A listing of a process directory as one reader sees it: (reader, gpid, path).
type ListKey = (Reader, u64, String);
/// A listing, with the start time of the process it is of.
type Listing = (u64, Arc<Vec<pb::DirEntry>>);
/// The owner of `/GPID` (uid, gid) and the start time of the process it is of.
type Owner = (u32, u32, u64);
/// A file of every process of a node, by gpid, with the start time of the process.
type Batch = HashMap<u64, (u64, pb::ProcFile)>;
/// Cached values with the time they were fetched.
type Timed<K, V> = Mutex<HashMap<K, (Instant, V)>>;

/// The view: the logic of the file system, independent of FUSE.
pub struct View<S> {
    src: S,
    opts: Options,
    locator: Locator,
    inodes: Mutex<Inodes>,
    snapshot: Mutex<Option<Arc<Snapshot>>>,
    /// Everything kept of a process is kept with its start time, and serves only for
    /// the process that started then: a process that takes its pid after it exited is
    /// another one.
    listings: Timed<ListKey, Listing>,
    /// The owner of `/GPID` for one reader: (reader, gpid). Per reader, as everything
    /// kept: a node's /proc mounted with `hidepid` shows a process to some readers only.
    owners: Timed<(Reader, u64), Owner>,
    nodes: Mutex<Option<(Instant, Vec<u32>)>>,
    readers: Timed<u32, Reader>,
    /// Per node: the names of a process directory and their modes.
    templates: Mutex<HashMap<u32, Arc<HashMap<String, u32>>>>,
    /// Files of [`BATCH_FILES`] for every process of a node: (reader, node, file).
    batches: Timed<(Reader, u32, String), Arc<Batch>>,
    /// Cluster and node files fetched during a walk: (reader, node, file).
    globals: Timed<(Reader, Option<u32>, NodeFile), Vec<u8>>,
    /// Processes a node said are gone, since when (newer than a snapshot: not served
    /// from it).
    gone: Timed<u64, ()>,
    /// The descriptor whose link last read as a target, by (gpid, descriptor directory,
    /// target): the one to try first when the kernel follows that target (it reads the
    /// link just before). A hint only: the node checks it.
    links: Timed<(u64, String, Vec<u8>), String>,
    swept: Mutex<Instant>,
}

fn attr(ino: u64, kind: FileType, perm: u32, uid: u32, gid: u32) -> FileAttr {
    let t = SystemTime::now();
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        kind,
        perm: (perm & 0o7777) as u16,
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid,
        gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// The file type of a kernel st_mode.
pub fn kind_of_mode(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        _ => FileType::RegularFile,
    }
}

fn io_errno(e: &std::io::Error) -> Errno {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// Marks the pass-table entries that are clan shells' pid aliases, not local paths.
const ALIAS: &str = "@";

fn is_number(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `dir`, a path inside a process directory, holds the links of its descriptors
/// (`fd`, `task/TID/fd`).
fn is_fd_dir(dir: &str) -> bool {
    let parts: Vec<&str> = dir.split('/').collect();
    matches!(parts[..], ["fd"] | ["task", _, "fd"])
}

/// The directory and the name of `path` (inside a process directory) when it is what a
/// descriptor's or a namespace's link reads ([`clan_proto::followed_link`]).
fn link_target_of(path: &str) -> Option<(&str, &str)> {
    let (dir, name) = path.rsplit_once('/')?;
    followed_link(dir, name).then_some((dir, name))
}

/// A time of a node's stat() as the kernel's FUSE takes it (never a panic on what a node
/// sent: out-of-range nanoseconds are clamped, times before the epoch kept).
fn node_time(sec: i64, nsec: i64) -> SystemTime {
    let nsec = nsec.clamp(0, 999_999_999) as u32;
    if sec >= 0 {
        SystemTime::UNIX_EPOCH + Duration::new(sec as u64, nsec)
    } else {
        SystemTime::UNIX_EPOCH - Duration::new(sec.unsigned_abs(), 0) + Duration::new(0, nsec)
    }
}

/// The attributes of what a descriptor's link leads to, from its node's stat() of it,
/// numbered `ino`. The file's type, as FUSE can tell it (an anonymous inode, of no type
/// in the kernel, is a regular file), its permissions, owner, size, links and times; the
/// device is the mount's, as for every file of the view.
pub fn link_attr(ino: u64, st: &pb::LinkStat) -> FileAttr {
    let kind = match st.mode & libc::S_IFMT {
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFDIR => FileType::Directory,
        _ => FileType::RegularFile,
    };
    let rdev = match kind {
        FileType::CharDevice | FileType::BlockDevice => {
            // The kernel's 32-bit encoding of a device number (new_encode_dev).
            let (major, minor) = (libc::major(st.rdev), libc::minor(st.rdev));
            (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
        }
        _ => 0,
    };
    FileAttr {
        ino: INodeNo(ino),
        size: u64::try_from(st.size).unwrap_or(0),
        blocks: u64::try_from(st.blocks).unwrap_or(0),
        atime: node_time(st.atime, st.atime_nsec),
        mtime: node_time(st.mtime, st.mtime_nsec),
        ctime: node_time(st.ctime, st.ctime_nsec),
        crtime: node_time(st.ctime, st.ctime_nsec),
        kind,
        perm: (st.mode & 0o7777) as u16,
        nlink: u32::try_from(st.nlink).unwrap_or(u32::MAX),
        uid: st.uid,
        gid: st.gid,
        rdev,
        blksize: u32::try_from(st.blksize).unwrap_or(4096),
        flags: 0,
    }
}

/// The first component of a passed-through path.
fn first(path: &str) -> &str {
    path.split('/').next().unwrap_or(path)
}

impl<S: Source> View<S> {
    pub fn new(src: S, opts: Options) -> View<S> {
        View {
            locator: Locator::new(opts.proc_root.clone(), opts.cluster_dir.clone(), opts.node)
                .with_node_proc(opts.node_proc.clone()),
            src,
            opts,
            inodes: Mutex::new(Inodes::default()),
            snapshot: Mutex::new(None),
            listings: Mutex::new(HashMap::new()),
            owners: Mutex::new(HashMap::new()),
            nodes: Mutex::new(None),
            readers: Mutex::new(HashMap::new()),
            gone: Mutex::new(HashMap::new()),
            links: Mutex::new(HashMap::new()),
            templates: Mutex::new(HashMap::new()),
            globals: Mutex::new(HashMap::new()),
            batches: Mutex::new(HashMap::new()),
            swept: Mutex::new(Instant::now()),
        }
    }

    /// How long the kernel may keep entries and attributes.
    pub fn ttl(&self) -> Duration {
        self.opts.ttl
    }

    /// How long the kernel may keep the answer of a lookup of `name` in `parent`: not at
    /// all for a number at the root, whose answer depends on the caller: a clan shell's
    /// process finds its node's procfs at a small one, other callers the local /proc; and
    /// a process directory is there for a reader only if its node's kernel shows it to
    /// that reader (a node's /proc mounted with `hidepid=2` hides other users' processes),
    /// while the kernel's cache of entries is one for every caller: it asks again at each
    /// walk through `/GPID`, for the caller of that walk.
    /// The names of a process directory are fixed for the life of the process (as the
    /// kernel's own are), so the kernel keeps them, present or absent, for
    /// [`PROC_NAMES_TTL`]: they go with the directory's own entry, which is asked for
    /// again at each walk and dropped, with them, once the process is gone.
    /// What a descriptor's link reads (`fd/pipe:[123]`) is asked for at each walk, as
    /// the kernel follows the link each time: the descriptor may be closed, and an open
    /// through it must be refused ([`View::lookup`]).
    pub fn entry_ttl(&self, parent: u64, name: &OsStr) -> Duration {
        match self.node(parent) {
            Ok(Node::Root) if name.to_str().is_some_and(is_number) => Duration::ZERO,
            Ok(Node::Proc(_)) => PROC_NAMES_TTL,
            Ok(Node::ProcPath(_, dir)) if name.to_str().is_some_and(|n| followed_link(&dir, n)) => {
                Duration::ZERO
            }
            _ => self.opts.ttl,
        }
    }

    /// How long the kernel may keep the attributes of `ino`: not at all for what a
    /// descriptor's link leads to, whose inode number (the pipe's, the socket's) comes with
    /// a getattr only (a lookup's answer carries the view's own number), and which lives no
    /// longer than the descriptor.
    pub fn attr_ttl(&self, ino: u64) -> Duration {
        match self.node(ino) {
            Ok(Node::ProcPath(_, p)) if link_target_of(&p).is_some() => Duration::ZERO,
            _ => self.opts.ttl,
        }
    }

    /// Whether the kernel may remember that `name` is not in `parent` (for
    /// [`View::entry_ttl`]): only in a process directory, whose names never change.
    pub fn caches_absence(&self, parent: u64) -> bool {
        matches!(self.node(parent), Ok(Node::Proc(_)))
    }

    /// What a lookup answers for a name known to be absent (inode 0: the kernel keeps
    /// the absence for the entry's ttl).
    pub fn absent() -> FileAttr {
        attr(0, FileType::RegularFile, 0, 0, 0)
    }

    /// The alias of number `n` (a pid of the caller's node) for a clan shell's process.
    fn alias_target(&self, who: &Who, n: &str) -> Option<String> {
        match self.caller(who) {
            Caller::Cluster {
                node_proc: Some((p, ..)),
                ..
            } => Some(format!("{}/{n}", p.display())),
            _ => None,
        }
    }

    fn ino(&self, node: &Node) -> Result<u64, Errno> {
        self.inodes.lock().ino(node).ok_or(libc::ENOMEM)
    }

    fn node(&self, ino: u64) -> Result<Node, Errno> {
        self.inodes.lock().node(ino).ok_or(libc::ENOENT)
    }

    /// The kernel was given `ino` by a lookup (it holds it until it forgets it).
    pub fn looked_up(&self, ino: u64) {
        self.inodes.lock().looked_up(ino);
    }

    /// The kernel forgot `n` lookups of `ino` (FUSE forget).
    pub fn forgot(&self, ino: u64, n: u64) {
        self.inodes.lock().forget(ino, n);
    }

    /// The reader behind `who` (its groups read at most once a second per thread).
    pub fn reader(&self, who: &Who) -> Reader {
        let mut m = self.readers.lock();
        if let Some((at, r)) = m.get(&who.pid) {
            if at.elapsed() < self.opts.ttl && r.uid == who.uid && r.gid == who.gid {
                return r.clone();
            }
        }
        let r = caller::reader(&self.opts.proc_root, who.uid, who.gid, who.pid);
        if m.len() > 4096 {
            let ttl = self.opts.ttl;
            m.retain(|_, (at, _)| at.elapsed() < ttl);
        }
        m.insert(who.pid, (Instant::now(), r.clone()));
        r
    }

    /// Asks the node of `gpid` about the process that started at `start` (0: whichever
    /// has the gpid): another one answers `NotFound`.
    async fn ask(
        &self,
        who: &Who,
        op: pb::ProcOp,
        gpid: u64,
        start: u64,
        path: &str,
    ) -> Result<pb::ProcReply, Failure> {
        let req = pb::ProcRequest {
            op: op as i32,
            gpid,
            path: path.to_string(),
            start_ticks: start,
            ..Default::default()
        };
        self.ask_with(who, req).await
    }

    /// [`View::ask`] of a request made by the caller (the reader is set here).
    async fn ask_with(
        &self,
        who: &Who,
        mut req: pb::ProcRequest,
    ) -> Result<pb::ProcReply, Failure> {
        let reader = self.reader(who);
        req.reader = Some(reader.to_creds(who.pid));
        let (gpid, path) = (req.gpid, req.path.clone());
        let path = path.as_str();
        let r = match self.src.proc_now(&req) {
            Some(r) => r,
            None => self.src.proc(req).await,
        };
        // Gone: its node is down, or a name every process has is not there.
        let always = path.is_empty() || SNAPSHOT_FILES.contains(&path);
        if matches!(r, Err(Failure::NodeDown(_)))
            || (always && matches!(r, Err(Failure::NotFound(_))))
        {
            self.forget(gpid);
        }
        r
    }

    /// Forgets what is cached of a process a node says is gone (the kernel may still
    /// hold its entry for a ttl).
    fn forget(&self, gpid: u64) {
        self.owners.lock().retain(|(_, g), _| *g != gpid);
        self.listings.lock().retain(|(_, g, _), _| *g != gpid);
        self.inodes.lock().retire_proc(gpid);
        let mut gone = self.gone.lock();
        if gone.len() > 4096 {
            let ttl = self.opts.ttl;
            gone.retain(|_, (at, _)| at.elapsed() < ttl);
        }
        gone.insert(gpid, (Instant::now(), ()));
    }

    /// Whether the snapshot `s` may still speak to thread `pid`: for a ttl, and to the
    /// thread that took it while its walk goes on ([`serves`]); a yes to that thread
    /// keeps the walk going.
    fn fresh(&self, s: &Snapshot, pid: u32) -> bool {
        let walker = pid != 0 && pid == s.walker;
        let mut used = s.used.lock();
        let yes = serves(s.at.elapsed(), used.elapsed(), walker, self.opts.ttl);
        if yes && walker {
            *used = Instant::now();
        }
        yes
    }

    /// Whether the snapshot `s` may still speak for `gpid` (not gone since) to thread `pid`.
    fn current(&self, s: &Snapshot, gpid: u64, pid: u32) -> bool {
        self.fresh(s, pid) && self.current_at(s.at, gpid)
    }

    // ------------------------------------------------------------------ processes

    /// A process directory's entries (`path` "" for `/GPID` itself), at most a ttl old,
    /// of the process that started at `start` (0: whichever has the gpid), with its start.
    async fn listing(
        &self,
        who: &Who,
        gpid: u64,
        start: u64,
        path: &str,
        fresh: bool,
    ) -> Result<Listing, Errno> {
        let key = (self.reader(who), gpid, path.to_string());
        if !fresh {
            if let Some((at, (of, v))) = self.listings.lock().get(&key) {
                if at.elapsed() < self.opts.ttl && (start == 0 || *of == start) {
                    return Ok((*of, v.clone()));
                }
            }
        }
        let reply = self
            .ask(who, pb::ProcOp::ProcReaddir, gpid, start, path)
            .await
            .map_err(|e| e.errno())?;
        let of = reply.start_ticks;
        let v = Arc::new(reply.entries);
        if !path.is_empty() {
            // Threads and descriptors come and go: the numbers of those gone go too.
            let names: Vec<&str> = v.iter().map(|e| e.name.as_str()).collect();
            self.inodes.lock().retire_listed(gpid, path, &names);
        }
        if path.is_empty() && !v.is_empty() {
            if let Some(node) = Gpid::from_raw(gpid).map(|g| g.node().get()) {
                let t = v.iter().map(|e| (e.name.clone(), e.mode)).collect();
                self.templates.lock().insert(node, Arc::new(t));
            }
            if let Some((uid, gid)) = owner_of_entries(&v) {
                let key = (key.0.clone(), gpid);
                self.owners
                    .lock()
                    .insert(key, (Instant::now(), (uid, gid, of)));
            }
        }
        let mut m = self.listings.lock();
        if m.len() > 4096 {
            let ttl = self.opts.ttl;
            m.retain(|_, (at, _)| at.elapsed() < ttl);
            self.owners.lock().retain(|_, (at, _)| at.elapsed() < ttl);
        }
        m.insert(key, (Instant::now(), (of, v.clone())));
        Ok((of, v))
    }

    /// `task/` of a process whose `stat` in the reader's fresh snapshot says it has one
    /// thread: that thread (the process itself), without asking its node. pstree lists
    /// `task/` of every process.
    fn lone_task(
        &self,
        who: &Who,
        gpid: u64,
        start: u64,
        path: &str,
    ) -> Option<Arc<Vec<pb::DirEntry>>> {
        if path != "task" {
            return None;
        }
        let reader = self.reader(who);
        let s = self.snapshot_for(gpid, &reader, who.pid)?;
        let e = s.procs.get(&gpid).filter(|e| of(start, e))?;
        let stat = e
            .files
            .iter()
            .find(|f| f.name == "stat" && f.error.is_none())?;
        use procfs_core::FromRead;
        let threads = procfs_core::process::Stat::from_read(stat.data.as_slice())
            .ok()?
            .num_threads;
        (threads == 1).then(|| {
            Arc::new(vec![pb::DirEntry {
                name: gpid.to_string(),
                mode: libc::S_IFDIR | 0o555,
                uid: e.uid,
                gid: e.gid,
            }])
        })
    }

    /// The owner of `/GPID` (uid, gid) as the reader sees it, and the start time of the
    /// process that has the gpid: from the reader's fresh snapshot, else from its listing
    /// for the reader (`ENOENT` where the process's node hides it from the reader). What
    /// was kept of a process that started before `since` is not taken (a process that took
    /// the pid later is known): it is asked for.
    async fn owner(&self, who: &Who, gpid: u64, since: u64) -> Result<Owner, Errno> {
        if gpid == CLUSTER_INIT {
            return Ok((0, 0, 0));
        }
        if Gpid::from_raw(gpid).is_none() {
            return Err(libc::ENOENT);
        }
        let reader = self.reader(who);
        if let Some(e) = self
            .snapshot_for(gpid, &reader, who.pid)
            .and_then(|s| s.procs.get(&gpid).cloned())
            .filter(|e| e.start_ticks >= since)
        {
            return Ok((e.uid, e.gid, e.start_ticks));
        }
        if let Some((at, o)) = self.owners.lock().get(&(reader, gpid)) {
            if at.elapsed() < self.opts.ttl && o.2 >= since {
                return Ok(*o);
            }
        }
        let (start, v) = self.listing(who, gpid, 0, "", true).await?;
        let (uid, gid) = owner_of_entries(&v).ok_or(libc::ENOENT)?;
        Ok((uid, gid, start))
    }

    /// The start time of the process `ino` stands for (0: not known, or not a process's).
    fn start_of(&self, ino: u64) -> u64 {
        self.inodes.lock().start_of(ino)
    }

    /// The generation of `ino` for the kernel: the start time of its process, so that the
    /// directory of a process that took the pid of one that exited is a new inode to it,
    /// and handles on the old one fail.
    pub fn generation(&self, ino: u64) -> u64 {
        self.start_of(ino)
    }

    /// The entry `name` of the process directory `dir`; `Ok(None)` when the directory's
    /// node answered and `name` is not among its names (an absence the kernel may keep),
    /// as opposed to an error (the process gone, its node down, cland not answering).
    async fn proc_entry(
        &self,
        who: &Who,
        gpid: u64,
        start: u64,
        dir: &str,
        name: &str,
    ) -> Result<Option<FileAttr>, Errno> {
        let path = if dir.is_empty() {
            name.to_string()
        } else {
            format!("{dir}/{name}")
        };
        if dir.is_empty() {
            if let Some(known) = self.template_entry(who, gpid, start, name, &path)? {
                return Ok(known);
            }
        }
        if followed_link(dir, name) {
            let st = self.link_stat(who, gpid, start, dir, name).await?;
            let ino = self.ino(&Node::ProcPath(gpid, path))?;
            return Ok(Some(link_attr(ino, &st)));
        }
        let v = match self.listing(who, gpid, start, dir, false).await {
            // The kernel lets anyone look up a namespace link of any process (`ns` is
            // `dr-x--x--x`) and refuses its listing and its target (readlink, a stat that
            // follows it: EACCES when read) to readers who may not trace the process:
            // names it has are links of the process's owner, others are not there.
            Err(libc::EACCES) if dir == "ns" || dir.ends_with("/ns") => {
                if !NS_NAMES.contains(&name) {
                    return Ok(None);
                }
                let (uid, gid, now) = self.owner(who, gpid, start).await?;
                if start != 0 && now != start {
                    return Err(libc::ENOENT);
                }
                let ino = self.ino(&Node::ProcPath(gpid, path))?;
                return Ok(Some(attr(ino, FileType::Symlink, 0o777, uid, gid)));
            }
            v => v?.1,
        };
        let Some(e) = v.iter().find(|e| e.name == name) else {
            return Ok(None);
        };
        let ino = self.ino(&Node::ProcPath(gpid, path))?;
        let kind = kind_of_mode(e.mode);
        Ok(Some(attr(ino, kind, e.mode, e.uid, e.gid)))
    }

    /// What stat() following a descriptor's link gives on the process's node, for the
    /// reader: of a descriptor in `dir` whose link reads `name` (the one whose link was
    /// read last with that target tried first, then the others by number: descriptors on
    /// one pipe lead to the same inode). `ENOENT` when none has it (closed, or never), and
    /// the kernel's errno where the reader may not follow the process's links.
    async fn link_stat(
        &self,
        who: &Who,
        gpid: u64,
        start: u64,
        dir: &str,
        name: &str,
    ) -> Result<pb::LinkStat, Errno> {
        let key = (gpid, dir.to_string(), name.as_bytes().to_vec());
        let hint = self
            .links
            .lock()
            .get(&key)
            .filter(|(at, _)| at.elapsed() < self.opts.ttl)
            .map(|(_, n)| n.clone())
            .unwrap_or_default();
        let req = pb::ProcRequest {
            op: pb::ProcOp::ProcStatLink as i32,
            gpid,
            path: dir.to_string(),
            start_ticks: start,
            link: name.to_string(),
            hint,
            ..Default::default()
        };
        let st = self
            .ask_with(who, req)
            .await
            .map_err(|e| e.errno())?
            .stat
            .ok_or(libc::EIO)?;
        self.hint_link(key, st.name.clone());
        Ok(*st)
    }

    /// The descriptor `fd` was seen with the link `key` names (its target).
    fn hint_link(&self, key: (u64, String, Vec<u8>), fd: String) {
        let mut m = self.links.lock();
        if m.len() > 4096 {
            let ttl = self.opts.ttl;
            m.retain(|_, (at, _)| at.elapsed() < ttl);
        }
        m.insert(key, (Instant::now(), fd));
    }

    /// A name of `/GPID` answered without asking: while the reader's fresh snapshot holds
    /// the process, from its node's template (the names and modes every process directory
    /// of that kernel has) with the process's owner, as the kernel gives every entry.
    /// `Ok(None)`: ask; `Ok(Some(None))`: not a name of the node's process directories.
    fn template_entry(
        &self,
        who: &Who,
        gpid: u64,
        start: u64,
        name: &str,
        path: &str,
    ) -> Result<Option<Option<FileAttr>>, Errno> {
        let reader = self.reader(who);
        let Some(owner) = self.snapshot_for(gpid, &reader, who.pid).and_then(|s| {
            s.procs
                .get(&gpid)
                .filter(|e| of(start, e))
                .map(|e| (e.uid, e.gid))
        }) else {
            return Ok(None);
        };
        let Some(node) = Gpid::from_raw(gpid).map(|g| g.node().get()) else {
            return Ok(None);
        };
        let Some(t) = self.templates.lock().get(&node).cloned() else {
            return Ok(None);
        };
        let Some(mode) = t.get(name).copied() else {
            return Ok(Some(None));
        };
        let ino = self.ino(&Node::ProcPath(gpid, path.to_string()))?;
        Ok(Some(Some(attr(
            ino,
            kind_of_mode(mode),
            mode,
            owner.0,
            owner.1,
        ))))
    }

    /// `files` of every process of `nodes` (empty: every node) as `reader` may read them
    /// (EACCES if the reader may not list them, EIO if cland does not answer).
    async fn files_of_every_process(
        &self,
        who: &Who,
        reader: &Reader,
        files: Vec<String>,
        nodes: Vec<u32>,
    ) -> Result<pb::ProcReply, Errno> {
        self.src
            .proc(pb::ProcRequest {
                op: pb::ProcOp::ProcSnapshot as i32,
                files,
                nodes,
                reader: Some(reader.to_creds(who.pid)),
                ..Default::default()
            })
            .await
            .map_err(|e| match e {
                Failure::Permission(_) => libc::EACCES,
                _ => libc::EIO,
            })
    }

    /// A snapshot of every process (for the reader), fetched now.
    async fn take_snapshot(&self, who: &Who) -> Result<Arc<Snapshot>, Errno> {
        let reader = self.reader(who);
        let files = SNAPSHOT_FILES.iter().map(|s| s.to_string()).collect();
        let reply = self
            .files_of_every_process(who, &reader, files, vec![])
            .await?;
        if !reply.down.is_empty() {
            tracing::debug!(down = ?reply.down, "nodes left out of the listing");
        }
        let procs: HashMap<u64, pb::ProcEntry> = reply
            .procs
            .into_iter()
            .filter(|e| e.gpid == CLUSTER_INIT || Gpid::from_raw(e.gpid).is_some())
            .map(|e| (e.gpid, e))
            .collect();
        let now = Instant::now();
        let s = Arc::new(Snapshot {
            at: now,
            reader,
            walker: who.pid,
            used: Mutex::new(now),
            procs,
        });
        *self.snapshot.lock() = Some(s.clone());
        self.sweep(&s, &reply.down);
        Ok(s)
    }

    /// Forgets the inode numbers of processes that are gone and of host processes that
    /// are gone (at most every ten seconds), once the kernel holds them no more.
    fn sweep(&self, s: &Snapshot, down: &[u32]) {
        let mut swept = self.swept.lock();
        if swept.elapsed() < Duration::from_secs(10) {
            return;
        }
        *swept = Instant::now();
        let root = self.opts.proc_root.clone();
        let mut inodes = self.inodes.lock();
        inodes.retain_procs(|g| {
            s.procs.contains_key(&g)
                || Gpid::from_raw(g).is_some_and(|g| down.contains(&g.node().get()))
        });
        inodes.retain_pass(|p| {
            let f = first(p);
            !is_number(f) || root.join(f).exists()
        });
    }

    /// The last snapshot if it may still speak for `gpid` and was taken for `reader`: never
    /// another reader's, which may show processes this one's node hides from it (`hidepid`).
    fn snapshot_for(&self, gpid: u64, reader: &Reader, pid: u32) -> Option<Arc<Snapshot>> {
        let snap = self.snapshot.lock().clone()?;
        (self.current(&snap, gpid, pid) && *reader == snap.reader).then_some(snap)
    }

    /// Contents of a file of a process: from the last snapshot when it is fresh, was
    /// taken for the same reader and holds the file; a file of [`BATCH_FILES`] read while
    /// such a snapshot holds the process, from one request for every process of its node;
    /// else asked for.
    async fn proc_file(
        &self,
        who: &Who,
        gpid: u64,
        start: u64,
        path: &str,
    ) -> Result<Vec<u8>, Errno> {
        let reader = self.reader(who);
        let served = |f: &pb::ProcFile| match &f.error {
            Some(e) => Err(Failure::from_pb(e).errno()),
            None => Ok(f.data.clone()),
        };
        if let Some(s) = self.snapshot_for(gpid, &reader, who.pid) {
            if let Some(e) = s.procs.get(&gpid).filter(|e| of(start, e)) {
                if let Some(f) = e.files.iter().find(|f| f.name == path) {
                    return served(f);
                }
                if BATCH_FILES.contains(&path) {
                    if let Some((started, f)) = self.batch(who, &reader, gpid, path).await {
                        if start == 0 || started == start {
                            return served(&f);
                        }
                    }
                }
            }
        }
        self.ask(who, pb::ProcOp::ProcRead, gpid, start, path)
            .await
            .map(|r| r.data)
            .map_err(|e| e.errno())
    }

    /// `path` of `gpid` from a batch: that file of every process of the node, fetched at
    /// most once per ttl and reader.
    async fn batch(
        &self,
        who: &Who,
        reader: &Reader,
        gpid: u64,
        path: &str,
    ) -> Option<(u64, pb::ProcFile)> {
        let node = Gpid::from_raw(gpid)?.node().get();
        let key = (reader.clone(), node, path.to_string());
        let cached = self.batches.lock().get(&key).cloned();
        let files = match cached {
            Some((at, m)) if at.elapsed() < self.opts.ttl && self.current_at(at, gpid) => m,
            _ => {
                let reply = self
                    .files_of_every_process(who, reader, vec![path.to_string()], vec![node])
                    .await
                    .ok()?;
                let m: Arc<Batch> = Arc::new(
                    reply
                        .procs
                        .into_iter()
                        .filter_map(|mut e| Some((e.gpid, (e.start_ticks, e.files.pop()?))))
                        .collect(),
                );
                let mut b = self.batches.lock();
                let ttl = self.opts.ttl;
                b.retain(|_, (at, _)| at.elapsed() < ttl);
                b.insert(key, (Instant::now(), m.clone()));
                m
            }
        };
        files.get(&gpid).filter(|(_, f)| f.name == path).cloned()
    }

    /// `.clan-walk/NAME` (`walk::FILES[i]`): that file of every process of the snapshot
    /// this reader's listing took (a new one if it is stale), each as the mount serves it
    /// to this reader; a file that is not in snapshots is fetched for every process.
    async fn walk(&self, who: &Who, i: usize) -> Result<Vec<u8>, Errno> {
        let name = *walk::FILES.get(i).ok_or(libc::ENOENT)?;
        let reader = self.reader(who);
        let last = self.snapshot.lock().clone();
        let snap = match last.filter(|s| s.reader == reader && self.fresh(s, who.pid)) {
            Some(s) => s,
            None => self.take_snapshot(who).await?,
        };
        let fetched: Option<HashMap<u64, pb::ProcFile>> = if SNAPSHOT_FILES.contains(&name) {
            None
        } else {
            let reply = self
                .files_of_every_process(who, &reader, vec![name.to_string()], vec![])
                .await?;
            Some(
                reply
                    .procs
                    .into_iter()
                    .filter_map(|mut e| Some((e.gpid, e.files.pop()?)))
                    .collect(),
            )
        };
        let mut gpids: Vec<u64> = snap
            .procs
            .keys()
            .copied()
            .filter(|g| self.current_at(snap.at, *g))
            .collect();
        gpids.sort_unstable();
        let templates = self.walk_templates(who, &gpids).await;
        let names: Vec<walk::Names> = templates
            .iter()
            .map(|(node, t)| walk::Names {
                node: *node,
                names: t.keys().map(String::as_str).collect(),
            })
            .collect();
        let records = gpids.iter().filter_map(|g| {
            let e = snap.procs.get(g)?;
            let f = match &fetched {
                Some(m) => m.get(g).filter(|f| f.name == name)?,
                None => e.files.iter().find(|f| f.name == name)?,
            };
            Some(walk::Record {
                gpid: *g,
                uid: e.uid,
                gid: e.gid,
                contents: match &f.error {
                    Some(err) => Err(Failure::from_pb(err).errno()),
                    None => Ok(&f.data[..]),
                },
            })
        });
        Ok(walk::encode(&names, records))
    }

    /// The names of a process directory on each node of `gpids` (asked for of one of its
    /// processes where not known yet), by node.
    async fn walk_templates(
        &self,
        who: &Who,
        gpids: &[u64],
    ) -> Vec<(u32, Arc<HashMap<String, u32>>)> {
        let mut one_of: std::collections::BTreeMap<u32, u64> = Default::default();
        for g in gpids {
            if let Some(node) = Gpid::from_raw(*g).map(|x| x.node().get()) {
                one_of.entry(node).or_insert(*g);
            }
        }
        let mut out = Vec::with_capacity(one_of.len());
        for (node, g) in one_of {
            if !self.templates.lock().contains_key(&node) {
                let _ = self.listing(who, g, 0, "", true).await;
            }
            if let Some(t) = self.templates.lock().get(&node).cloned() {
                out.push((node, t));
            }
        }
        out
    }

    /// Whether something fetched at `at` may still speak for `gpid` (not gone since).
    fn current_at(&self, at: Instant, gpid: u64) -> bool {
        self.gone
            .lock()
            .get(&gpid)
            .is_none_or(|(gone, _)| *gone < at)
    }

    // ------------------------------------------------------------------ nodes

    async fn node_ids(&self) -> Result<Vec<u32>, Errno> {
        if let Some((at, v)) = self.nodes.lock().as_ref() {
            if at.elapsed() < 2 * self.opts.ttl {
                return Ok(v.clone());
            }
        }
        let mut v = self.src.nodes().await.map_err(|_| libc::EIO)?;
        v.sort_unstable();
        *self.nodes.lock() = Some((Instant::now(), v.clone()));
        Ok(v)
    }

    /// A cluster file (`node` None) or a node's own. While a walk is going on (a fresh
    /// snapshot for this reader), one fetch serves the walk: pgrep and pstree read
    /// `uptime` once per process.
    async fn node_file(&self, who: &Who, node: Option<u32>, f: NodeFile) -> Result<Vec<u8>, Errno> {
        let reader = self.reader(who);
        let walk = self
            .snapshot
            .lock()
            .clone()
            .filter(|s| s.at.elapsed() < self.opts.ttl && s.reader == reader);
        let key = (reader.clone(), node, f);
        if let Some(s) = &walk {
            if let Some((at, data)) = self.globals.lock().get(&key) {
                if *at >= s.at && at.elapsed() < self.opts.ttl {
                    return Ok(data.clone());
                }
            }
        }
        let data = self
            .src
            .proc(pb::ProcRequest {
                op: pb::ProcOp::ProcGlobal as i32,
                path: f.name().to_string(),
                nodes: node.into_iter().collect(),
                reader: Some(reader.to_creds(who.pid)),
                ..Default::default()
            })
            .await
            .map(|r| r.data)
            .map_err(|e| match e {
                Failure::Permission(_) => libc::EACCES,
                Failure::NotFound(_) => libc::ENOENT,
                _ => libc::EIO,
            })?;
        if walk.is_some() {
            let mut g = self.globals.lock();
            let ttl = self.opts.ttl;
            g.retain(|_, (at, _)| at.elapsed() < ttl);
            g.insert(key, (Instant::now(), data.clone()));
        }
        Ok(data)
    }

    // ------------------------------------------------------------------ passed through

    fn pass_path(&self, path: &str) -> PathBuf {
        self.opts.proc_root.join(path)
    }

    async fn pass_io<T, F>(&self, who: &Who, f: F) -> Result<T, Errno>
    where
        T: Send + 'static,
        F: FnOnce() -> std::io::Result<T> + Send + 'static,
    {
        let reader = self.reader(who);
        let switch = self.opts.switch_identity;
        tokio::task::spawn_blocking(move || pass::as_reader(&reader, switch, f))
            .await
            .map_err(|_| libc::EIO)?
            .map_err(|e| io_errno(&e))
    }

    async fn pass_attr(&self, who: &Who, path: &str) -> Result<FileAttr, Errno> {
        let p = self.pass_path(path);
        let m = self
            .pass_io(who, move || std::fs::symlink_metadata(p))
            .await?;
        let ino = self.ino(&Node::Pass(path.to_string()))?;
        let ft = m.file_type();
        let kind = if ft.is_dir() {
            FileType::Directory
        } else if ft.is_symlink() {
            FileType::Symlink
        } else if ft.is_fifo() {
            FileType::NamedPipe
        } else if ft.is_socket() {
            FileType::Socket
        } else if ft.is_char_device() {
            FileType::CharDevice
        } else if ft.is_block_device() {
            FileType::BlockDevice
        } else {
            FileType::RegularFile
        };
        let mut a = attr(ino, kind, m.mode(), m.uid(), m.gid());
        a.size = m.size();
        a.nlink = m.nlink() as u32;
        let at = |s: i64, ns: i64| {
            SystemTime::UNIX_EPOCH + Duration::new(s.max(0) as u64, ns.clamp(0, 999_999_999) as u32)
        };
        a.atime = at(m.atime(), m.atime_nsec());
        a.mtime = at(m.mtime(), m.mtime_nsec());
        a.ctime = at(m.ctime(), m.ctime_nsec());
        a.crtime = a.ctime;
        Ok(a)
    }

    /// Whether a name of the root is passed through.
    fn passed_through(name: &str) -> bool {
        !OWN_NAMES.contains(&name)
            && NodeFile::from_name(name).is_none()
            && !name.is_empty()
            && !name.contains('/')
    }

    // ------------------------------------------------------------------ operations

    /// `name` in the directory `parent`, for the kernel: `Ok(None)` when `parent` is a
    /// process directory, whose names never change, and its node answered that `name` is
    /// not one of them (the kernel may keep that absence, [`View::entry_ttl`]); any other
    /// absence, or a failure to know (the process gone, its node down), is an error.
    pub async fn lookup_entry(
        &self,
        who: &Who,
        parent: u64,
        name: &OsStr,
    ) -> Result<Option<FileAttr>, Errno> {
        match self.node(parent)? {
            Node::Proc(g) => {
                let name = Self::plain_name(name)?;
                self.proc_entry(who, g, self.start_of(parent), "", name)
                    .await
            }
            _ => self.lookup(who, parent, name).await.map(Some),
        }
    }

    /// A name that can be in a directory (`.` and `..` are the kernel's).
    fn plain_name(name: &OsStr) -> Result<&str, Errno> {
        let name = name.to_str().ok_or(libc::ENOENT)?;
        if name == "." || name == ".." || name.contains('/') || name.is_empty() {
            return Err(libc::ENOENT);
        }
        Ok(name)
    }

    /// `name` in the directory `parent`.
    pub async fn lookup(&self, who: &Who, parent: u64, name: &OsStr) -> Result<FileAttr, Errno> {
        let name = Self::plain_name(name)?;
        match self.node(parent)? {
            Node::Root => {
                if let Some(f) = NodeFile::from_name(name) {
                    return self.getattr(who, self.ino(&Node::Cluster(f))?).await;
                }
                match name {
                    walk::DIR => return self.getattr(who, self.ino(&Node::WalkDir)?).await,
                    "self" => return self.getattr(who, SELF).await,
                    "thread-self" => return self.getattr(who, THREAD_SELF).await,
                    "nodes" => return self.getattr(who, NODES).await,
                    _ => {}
                }
                if is_number(name) {
                    let n: u64 = name.parse().map_err(|_| libc::ENOENT)?;
                    if is_cluster_pid(n) {
                        // The process the gpid names now (a later one than the view
                        // knows, if its pid was taken again: then a new inode).
                        let ino = self.ino(&Node::Proc(n))?;
                        let (uid, gid, start) = self.owner(who, n, self.start_of(ino)).await?;
                        self.inodes.lock().bind(n, start);
                        return Ok(attr(ino, FileType::Directory, 0o555, uid, gid));
                    }
                }
                // A pid of a clan shell's node, as getpid() gives it: a link into the node's
                // procfs (as `self`), so tools that read /proc/<getpid()> find themselves.
                if is_number(name) && self.alias_target(who, name).is_some() {
                    let ino = self.ino(&Node::Pass(format!("{ALIAS}{name}")))?;
                    return Ok(attr(ino, FileType::Symlink, 0o777, 0, 0));
                }
                if Self::passed_through(name) {
                    return self.pass_attr(who, name).await;
                }
                Err(libc::ENOENT)
            }
            Node::Nodes => {
                let n: u32 = name.parse().map_err(|_| libc::ENOENT)?;
                if !self.node_ids().await?.contains(&n) {
                    return Err(libc::ENOENT);
                }
                let ino = self.ino(&Node::NodeDir(n))?;
                Ok(attr(ino, FileType::Directory, 0o555, 0, 0))
            }
            Node::NodeDir(n) => {
                let f = NodeFile::from_name(name).ok_or(libc::ENOENT)?;
                let ino = self.ino(&Node::NodeFile(n, f))?;
                Ok(attr(ino, FileType::RegularFile, 0o444, 0, 0))
            }
            Node::Proc(g) => self
                .proc_entry(who, g, self.start_of(parent), "", name)
                .await?
                .ok_or(libc::ENOENT),
            Node::ProcPath(g, p) => {
                let a = self
                    .proc_entry(who, g, self.start_of(parent), &p, name)
                    .await?
                    .ok_or(libc::ENOENT)?;
                // A pipe of the process, looked up for an open through its descriptor's
                // link: the kernel opens a pipe of a FUSE file system itself, as a new,
                // empty one of this machine (whose read waits for a writer that never
                // comes); the process's pipe is on its node. Refused as the kernel refuses
                // to open a socket or an anonymous inode through such a link.
                if a.kind == FileType::NamedPipe
                    && is_fd_dir(&p)
                    && caller::opening(&self.opts.proc_root, who.pid)
                {
                    return Err(libc::ENXIO);
                }
                Ok(a)
            }
            Node::Pass(p) => self.pass_attr(who, &format!("{p}/{name}")).await,
            Node::WalkDir => {
                let i = walk::FILES
                    .iter()
                    .position(|f| *f == name)
                    .ok_or(libc::ENOENT)?;
                self.getattr(who, self.ino(&Node::Walk(i))?).await
            }
            Node::SelfLink
            | Node::ThreadSelf
            | Node::Cluster(_)
            | Node::NodeFile(..)
            | Node::Walk(_) => Err(libc::ENOTDIR),
        }
    }

    /// The attributes of `ino`.
    pub async fn getattr(&self, who: &Who, ino: u64) -> Result<FileAttr, Errno> {
        match self.node(ino)? {
            Node::Root | Node::Nodes | Node::NodeDir(_) | Node::WalkDir => {
                Ok(attr(ino, FileType::Directory, 0o555, 0, 0))
            }
            Node::SelfLink | Node::ThreadSelf => Ok(attr(ino, FileType::Symlink, 0o777, 0, 0)),
            Node::Cluster(_) | Node::NodeFile(..) | Node::Walk(_) => {
                Ok(attr(ino, FileType::RegularFile, 0o444, 0, 0))
            }
            Node::Proc(g) => {
                // The process the inode stands for, not one that took its pid since.
                let start = self.start_of(ino);
                let (uid, gid, now) = self.owner(who, g, start).await?;
                if start != 0 && now != start {
                    return Err(libc::ENOENT);
                }
                Ok(attr(ino, FileType::Directory, 0o555, uid, gid))
            }
            Node::ProcPath(g, p) => {
                if let Some((dir, name)) = link_target_of(&p) {
                    // The inode number is the pipe's (socket's, ...) own, as stat() of the
                    // link natively gives (the kernel takes a getattr's for st_ino).
                    let st = self
                        .link_stat(who, g, self.start_of(ino), dir, name)
                        .await?;
                    return Ok(link_attr(st.ino, &st));
                }
                let (dir, name) = p.rsplit_once('/').unwrap_or(("", p.as_str()));
                self.proc_entry(who, g, self.start_of(ino), dir, name)
                    .await?
                    .ok_or(libc::ENOENT)
            }
            Node::Pass(p) if p.starts_with(ALIAS) => Ok(attr(ino, FileType::Symlink, 0o777, 0, 0)),
            Node::Pass(p) => self.pass_attr(who, &p).await,
        }
    }

    /// The target of the link `ino`.
    pub async fn readlink(&self, who: &Who, ino: u64) -> Result<Vec<u8>, Errno> {
        match self.node(ino)? {
            Node::SelfLink => self
                .caller(who)
                .self_link()
                .map(String::into_bytes)
                .ok_or(libc::ENOENT),
            Node::ThreadSelf => self
                .caller(who)
                .thread_self_link()
                .map(String::into_bytes)
                .ok_or(libc::ENOENT),
            Node::ProcPath(_, p) if link_target_of(&p).is_some() => Err(libc::EINVAL),
            Node::ProcPath(g, p) => {
                let target = self
                    .ask(who, pb::ProcOp::ProcReadlink, g, self.start_of(ino), &p)
                    .await
                    .map(|r| r.data)
                    .map_err(|e| e.errno())?;
                // The kernel follows a link to a pipe by looking its target up next to it.
                if let Some((dir, fd)) = p.rsplit_once('/') {
                    let name = std::str::from_utf8(&target).unwrap_or("");
                    if followed_link(dir, name) {
                        self.hint_link((g, dir.to_string(), target.clone()), fd.to_string());
                    }
                }
                Ok(target)
            }
            Node::Pass(p) if p.starts_with(ALIAS) => self
                .alias_target(who, &p[ALIAS.len()..])
                .map(String::into_bytes)
                .ok_or(libc::ENOENT),
            Node::Pass(p) => {
                let path = self.pass_path(&p);
                let t = self.pass_io(who, move || std::fs::read_link(path)).await?;
                Ok(t.into_os_string().into_encoded_bytes())
            }
            _ => Err(libc::EINVAL),
        }
    }

    /// Whether the caller is a process of the cluster, and which.
    pub fn caller(&self, who: &Who) -> Caller {
        self.locator.caller(who.pid)
    }

    /// What `ino` stands for, when its contents are made anew for a read from its start on
    /// the same open file, as the kernel's are: a process's files and the cluster's, not a
    /// walk (the snapshot of its open) nor a constant. Kept with the open file and given
    /// back to [`View::open_node`]: the inode's number may stand for another file later.
    /// With the start time of its process: a read from the start of a process's file is
    /// that process's, never that of a process that took its pid since (`ENOENT`).
    pub fn made_anew(&self, ino: u64) -> Option<(Node, u64)> {
        self.node(ino)
            .ok()
            .filter(|n| {
                matches!(
                    n,
                    Node::Cluster(_) | Node::NodeFile(..) | Node::ProcPath(..)
                )
            })
            .map(|n| (n, self.start_of(ino)))
    }

    /// Opens the file `ino` for reading: its contents, or the local file to read.
    pub async fn open(&self, who: &Who, ino: u64) -> Result<Contents, Errno> {
        self.open_node(who, self.node(ino)?, self.start_of(ino))
            .await
    }

    /// [`View::open`] of what an inode stands for, of the process that started at `start`
    /// (0: whichever has its gpid).
    pub async fn open_node(&self, who: &Who, node: Node, start: u64) -> Result<Contents, Errno> {
        match node {
            Node::Cluster(f) => self.node_file(who, None, f).await.map(Contents::Data),
            Node::NodeFile(n, f) => self.node_file(who, Some(n), f).await.map(Contents::Data),
            // What a descriptor's link leads to (an anonymous inode: a pipe or a socket the
            // kernel opens itself) is on the process's node: ENXIO, as the kernel's answer
            // to an open of a socket or an anonymous inode through such a link.
            Node::ProcPath(_, p) if link_target_of(&p).is_some() => Err(libc::ENXIO),
            Node::ProcPath(g, p) => self.proc_file(who, g, start, &p).await.map(Contents::Data),
            Node::Pass(p) if p == "sys/kernel/pid_max" => Ok(Contents::Data(PID_MAX.to_vec())),
            Node::Pass(p) => {
                let path = self.pass_path(&p);
                let (reader, switch) = (self.reader(who), self.opts.switch_identity);
                self.pass_io(who, move || std::fs::File::open(path))
                    .await
                    .map(|f| Contents::File(f, reader, switch))
            }
            Node::Walk(i) => self.walk(who, i).await.map(Contents::Data),
            Node::Root | Node::Nodes | Node::NodeDir(_) | Node::Proc(_) | Node::WalkDir => {
                Err(libc::EISDIR)
            }
            Node::SelfLink | Node::ThreadSelf => Err(libc::ELOOP),
        }
    }

    /// The entries of the directory `ino`, `.` and `..` first.
    pub async fn readdir(&self, who: &Who, ino: u64) -> Result<Vec<Dirent>, Errno> {
        let node = self.node(ino)?;
        let parent = self.ino(&node.parent())?;
        let mut out = vec![
            Dirent {
                ino,
                kind: FileType::Directory,
                name: ".".into(),
            },
            Dirent {
                ino: parent,
                kind: FileType::Directory,
                name: "..".into(),
            },
        ];
        let mut add = |node: Node, kind: FileType, name: &str| -> Result<(), Errno> {
            out.push(Dirent {
                ino: self.ino(&node)?,
                kind,
                name: name.into(),
            });
            Ok(())
        };
        match node {
            Node::Root => {
                let snap = self.take_snapshot(who).await?;
                add(Node::SelfLink, FileType::Symlink, "self")?;
                add(Node::ThreadSelf, FileType::Symlink, "thread-self")?;
                for f in NodeFile::ALL {
                    add(Node::Cluster(f), FileType::RegularFile, f.name())?;
                }
                add(Node::Nodes, FileType::Directory, "nodes")?;
                let root = self.opts.proc_root.clone();
                let local = self
                    .pass_io(who, move || {
                        let mut v = Vec::new();
                        for e in std::fs::read_dir(root)? {
                            let e = e?;
                            let Some(name) = e.file_name().to_str().map(str::to_string) else {
                                continue;
                            };
                            let ft = e.file_type().ok();
                            v.push((name, ft));
                        }
                        Ok(v)
                    })
                    .await?;
                for (name, ft) in local {
                    if is_number(&name) || !Self::passed_through(&name) {
                        continue;
                    }
                    let kind = ft
                        .and_then(FileType::from_std)
                        .unwrap_or(FileType::RegularFile);
                    add(Node::Pass(name.clone()), kind, &name)?;
                }
                let mut gpids: Vec<u64> = snap.procs.keys().copied().collect();
                gpids.sort_unstable();
                // A process of the cluster does not find itself by gpid: tools that skip their
                // own pid (pgrep, pkill) compare with getpid(), the node's number.
                let me = match self.caller(who) {
                    Caller::Cluster { gpid, .. } => Some(gpid),
                    _ => None,
                };
                for g in gpids.into_iter().filter(|g| Some(*g) != me) {
                    add(Node::Proc(g), FileType::Directory, &g.to_string())?;
                }
            }
            Node::Nodes => {
                for n in self.node_ids().await? {
                    add(Node::NodeDir(n), FileType::Directory, &n.to_string())?;
                }
            }
            Node::NodeDir(n) => {
                for f in NodeFile::ALL {
                    add(Node::NodeFile(n, f), FileType::RegularFile, f.name())?;
                }
            }
            Node::WalkDir => {
                for (i, f) in walk::FILES.iter().enumerate() {
                    add(Node::Walk(i), FileType::RegularFile, f)?;
                }
            }
            Node::Proc(g) => {
                let start = self.start_of(ino);
                for e in self.listing(who, g, start, "", true).await?.1.iter() {
                    add(
                        Node::ProcPath(g, e.name.clone()),
                        kind_of_mode(e.mode),
                        &e.name,
                    )?;
                }
            }
            Node::ProcPath(g, p) => {
                let start = self.start_of(ino);
                let entries = match self.lone_task(who, g, start, &p) {
                    Some(v) => v,
                    None => self.listing(who, g, start, &p, true).await?.1,
                };
                for e in entries.iter() {
                    let path = format!("{p}/{}", e.name);
                    add(Node::ProcPath(g, path), kind_of_mode(e.mode), &e.name)?;
                }
            }
            Node::Pass(p) => {
                let path = self.pass_path(&p);
                let local = self
                    .pass_io(who, move || {
                        let mut v = Vec::new();
                        for e in std::fs::read_dir(path)? {
                            let e = e?;
                            v.push((e.file_name(), e.file_type().ok()));
                        }
                        Ok(v)
                    })
                    .await?;
                let names: Vec<&str> = local.iter().filter_map(|(n, _)| n.to_str()).collect();
                self.inodes.lock().retire_pass_listed(&p, &names);
                for (name, ft) in &local {
                    let Some(n) = name.to_str() else { continue };
                    let kind = ft
                        .and_then(FileType::from_std)
                        .unwrap_or(FileType::RegularFile);
                    add(Node::Pass(format!("{p}/{n}")), kind, n)?;
                }
            }
            Node::SelfLink
            | Node::ThreadSelf
            | Node::Cluster(_)
            | Node::NodeFile(..)
            | Node::Walk(_) => return Err(libc::ENOTDIR),
        }
        Ok(out)
    }
}

/// Whether a snapshot's entry is of the process that started at `start` (0: any).
fn of(start: u64, e: &pb::ProcEntry) -> bool {
    start == 0 || e.start_ticks == start
}

/// The owner of a process directory from its listing: the kernel gives every entry of
/// `/proc/PID` the owner of the directory itself (`status` first, it is always there).
fn owner_of_entries(v: &[pb::DirEntry]) -> Option<(u32, u32)> {
    v.iter()
        .find(|e| e.name == "status")
        .or_else(|| v.first())
        .map(|e| (e.uid, e.gid))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fake process's files: name → contents or the error its node gives.
    type Files = HashMap<String, Result<Vec<u8>, pb::ErrorCode>>;

    /// A cluster of fake processes; counts requests by operation.
    #[derive(Default)]
    struct Fake {
        /// gpid → (uid, gid, files)
        procs: Mutex<HashMap<u64, (u32, u32, Files)>>,
        reads: AtomicUsize,
        readdirs: AtomicUsize,
        snapshots: AtomicUsize,
        down: std::sync::atomic::AtomicBool,
        /// Nodes' /proc mounted with `hidepid=2`: a process is there for root and its owner.
        hidepid: std::sync::atomic::AtomicBool,
        /// Start times of processes (0 where not set).
        starts: Mutex<HashMap<u64, u64>>,
        /// `PROC_STAT_LINK` requests: (path, link, hint).
        stat_links: Mutex<Vec<(String, String, String)>>,
    }

    fn err(code: pb::ErrorCode) -> pb::Error {
        pb::Error {
            code: code as i32,
            message: format!("{code:?}"),
        }
    }

    impl Source for Arc<Fake> {
        async fn proc(&self, req: pb::ProcRequest) -> Result<pb::ProcReply, Failure> {
            if self.down.load(Ordering::SeqCst) {
                return Err(Failure::Unavailable("no cland".into()));
            }
            let mut procs = self.procs.lock().clone();
            if self.hidepid.load(Ordering::SeqCst) {
                let reader = req.reader.clone().unwrap_or_default().uid;
                procs.retain(|_, (uid, _, _)| reader == 0 || *uid == reader);
            }
            let start = |g: &u64| self.starts.lock().get(g).copied().unwrap_or(0);
            // Another process than the one meant has the gpid: not found.
            if req.start_ticks != 0 && req.start_ticks != start(&req.gpid) {
                procs.remove(&req.gpid);
            }
            let mut reply = pb::ProcReply {
                start_ticks: start(&req.gpid),
                ..Default::default()
            };
            match pb::ProcOp::try_from(req.op) {
                Ok(pb::ProcOp::ProcSnapshot) => {
                    self.snapshots.fetch_add(1, Ordering::SeqCst);
                    for (g, (uid, gid, files)) in procs.iter() {
                        reply.procs.push(pb::ProcEntry {
                            gpid: *g,
                            uid: *uid,
                            gid: *gid,
                            start_ticks: start(g),
                            files: req
                                .files
                                .iter()
                                .filter_map(|f| {
                                    let (data, error) = match files.get(f)? {
                                        Ok(d) => (d.clone(), None),
                                        Err(c) => (Vec::new(), Some(err(*c))),
                                    };
                                    Some(pb::ProcFile {
                                        name: f.clone(),
                                        data,
                                        error,
                                    })
                                })
                                .collect(),
                        });
                    }
                }
                Ok(pb::ProcOp::ProcRead) => {
                    self.reads.fetch_add(1, Ordering::SeqCst);
                    let (_, _, files) = procs
                        .get(&req.gpid)
                        .ok_or_else(|| Failure::from_pb(&err(pb::ErrorCode::NotFound)))?;
                    match files.get(&req.path) {
                        Some(Ok(d)) => reply.data = d.clone(),
                        Some(Err(c)) => return Err(Failure::from_pb(&err(*c))),
                        None => return Err(Failure::from_pb(&err(pb::ErrorCode::NotFound))),
                    }
                }
                Ok(pb::ProcOp::ProcReaddir) => {
                    self.readdirs.fetch_add(1, Ordering::SeqCst);
                    let (uid, gid, files) = procs
                        .get(&req.gpid)
                        .ok_or_else(|| Failure::from_pb(&err(pb::ErrorCode::NotFound)))?;
                    if !req.path.is_empty() {
                        // A deeper directory: its links (`fd/N`) among the files.
                        let dir = format!("{}/", req.path);
                        for name in files.keys().filter_map(|n| n.strip_prefix(&dir)) {
                            reply.entries.push(pb::DirEntry {
                                name: name.to_string(),
                                mode: libc::S_IFLNK | 0o700,
                                uid: *uid,
                                gid: *gid,
                            });
                        }
                        return Ok(reply);
                    }
                    for name in files.keys().filter(|n| !n.contains('/')) {
                        reply.entries.push(pb::DirEntry {
                            name: name.clone(),
                            mode: libc::S_IFREG | 0o444,
                            uid: *uid,
                            gid: *gid,
                        });
                    }
                    reply.entries.push(pb::DirEntry {
                        name: "cwd".into(),
                        mode: libc::S_IFLNK | 0o777,
                        uid: *uid,
                        gid: *gid,
                    });
                }
                Ok(pb::ProcOp::ProcReadlink) => {
                    reply.data = match procs.get(&req.gpid).and_then(|p| p.2.get(&req.path)) {
                        Some(Ok(t)) => t.clone(),
                        _ => b"/work".to_vec(),
                    }
                }
                // A descriptor's link is `fd/N` among the files, its target the contents:
                // `pipe:[N]` a pipe, `socket:[N]` a socket, numbered N; only the owner and
                // root may follow them.
                Ok(pb::ProcOp::ProcStatLink) => {
                    self.stat_links.lock().push((
                        req.path.clone(),
                        req.link.clone(),
                        req.hint.clone(),
                    ));
                    let (uid, gid, files) = procs
                        .get(&req.gpid)
                        .ok_or_else(|| Failure::from_pb(&err(pb::ErrorCode::NotFound)))?;
                    let reader = req.reader.clone().unwrap_or_default().uid;
                    if reader != 0 && reader != *uid {
                        return Err(Failure::from_pb(&err(pb::ErrorCode::Permission)));
                    }
                    let mut fds: Vec<u64> = files
                        .iter()
                        .filter(|(_, t)| t.as_deref() == Ok(req.link.as_bytes()))
                        .filter_map(|(n, _)| {
                            n.strip_prefix(&format!("{}/", req.path))?.parse().ok()
                        })
                        .collect();
                    fds.sort_unstable();
                    let fd = fds
                        .iter()
                        .find(|n| n.to_string() == req.hint)
                        .or(fds.first())
                        .ok_or_else(|| Failure::from_pb(&err(pb::ErrorCode::NotFound)))?;
                    let number = |prefix: &str| {
                        req.link
                            .strip_prefix(prefix)?
                            .strip_suffix(']')?
                            .parse::<u64>()
                            .ok()
                    };
                    let (mode, ino) = match (number("pipe:["), number("socket:[")) {
                        (Some(n), _) => (libc::S_IFIFO | 0o600, n),
                        (_, Some(n)) => (libc::S_IFSOCK | 0o777, n),
                        _ => (0o600, 18),
                    };
                    reply.stat = Some(Box::new(pb::LinkStat {
                        mode,
                        ino,
                        nlink: 1,
                        uid: *uid,
                        gid: *gid,
                        mtime: 1_700_000_000,
                        mtime_nsec: 5,
                        name: fd.to_string(),
                        ..Default::default()
                    }));
                }
                Ok(pb::ProcOp::ProcGlobal) => {
                    reply.data = format!("{} of {:?}\n", req.path, req.nodes).into_bytes()
                }
                _ => return Err(Failure::Invalid("op".into())),
            }
            Ok(reply)
        }

        async fn nodes(&self) -> Result<Vec<u32>, Failure> {
            Ok(vec![2, 1])
        }
    }

    struct Setup {
        _dir: tempfile::TempDir,
        fake: Arc<Fake>,
        view: View<Arc<Fake>>,
    }

    impl Setup {
        /// `name` in directory `parent`, looked up as [`ME`] (and held, as by the kernel
        /// when FUSE answers a lookup).
        async fn at(&self, parent: u64, name: &str) -> Result<FileAttr, Errno> {
            let a = self.view.lookup(&ME, parent, OsStr::new(name)).await?;
            self.view.looked_up(a.ino.0);
            Ok(a)
        }
    }

    const ME: Who = Who {
        uid: 0,
        gid: 0,
        pid: 0,
    };

    fn setup() -> Setup {
        setup_with_ttl(Duration::from_secs(30))
    }

    fn setup_with_ttl(ttl: Duration) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path().join("proc");
        for d in ["sys/kernel", "tty", "4711", "self/ns"] {
            std::fs::create_dir_all(proc.join(d)).unwrap();
        }
        std::fs::write(proc.join("sys/kernel/pid_max"), "4194304\n").unwrap();
        std::fs::write(proc.join("version"), "Linux\n").unwrap();
        std::fs::write(
            proc.join("locks"),
            "1: FLOCK  ADVISORY  WRITE 9 00:2d:1 0 EOF\n",
        )
        .unwrap();
        std::fs::write(proc.join("stat"), "the host's own\n").unwrap();
        std::fs::write(proc.join("4711/status"), "Name:\thost\n").unwrap();
        let fake = Arc::new(Fake::default());
        {
            let mut p = fake.procs.lock();
            let files = |pid: &str| {
                let mut m = HashMap::new();
                m.insert("stat".to_string(), Ok(format!("{pid} (x) S").into_bytes()));
                m.insert(
                    "status".to_string(),
                    Ok(format!("Pid:\t{pid}\n").into_bytes()),
                );
                m.insert("cmdline".to_string(), Ok(b"x\0".to_vec()));
                m.insert("environ".to_string(), Err(pb::ErrorCode::Permission));
                m
            };
            p.insert(10_000_001, (0, 0, files("10000001")));
            p.insert(20_000_005, (1000, 100, files("20000005")));
            p.insert(20_000_006, (1001, 100, files("20000006")));
        }
        let opts = Options {
            proc_root: proc,
            cluster_dir: dir.path().join("cluster"),
            node: 1,
            ttl,
            node_proc: None,
            switch_identity: false,
        };
        Setup {
            view: View::new(fake.clone(), opts),
            fake,
            _dir: dir,
        }
    }

    fn names(v: &[Dirent]) -> Vec<String> {
        v.iter()
            .map(|d| d.name.to_string_lossy().into_owned())
            .collect()
    }

    async fn read(v: &View<Arc<Fake>>, who: &Who, ino: u64) -> Result<Vec<u8>, Errno> {
        match v.open(who, ino).await? {
            Contents::Data(d) => Ok(d),
            Contents::File(f, _, _) => {
                let mut out = Vec::new();
                std::io::Read::read_to_end(&mut &f, &mut out).map_err(|e| io_errno(&e))?;
                Ok(out)
            }
        }
    }

    #[tokio::test]
    async fn root_lists_processes_own_names_and_the_local_rest() {
        let s = setup();
        let root = names(&s.view.readdir(&ME, crate::inode::ROOT).await.unwrap());
        for n in [
            ".",
            "..",
            "self",
            "thread-self",
            "loadavg",
            "stat",
            "nodes",
            "sys",
            "tty",
            "version",
            "10000001",
            "20000005",
        ] {
            assert!(root.contains(&n.to_string()), "{n} missing from {root:?}");
        }
        assert!(
            !root.contains(&"4711".to_string()),
            "local pids are not listed"
        );
        // The cluster's files, not the local node's.
        assert_eq!(root.iter().filter(|n| *n == "stat").count(), 1);
        assert_eq!(root.iter().filter(|n| *n == "locks").count(), 1);
        let locks = s.at(crate::inode::ROOT, "locks").await.unwrap();
        assert_eq!(
            s.view.node(locks.ino.0).unwrap(),
            Node::Cluster(NodeFile::Locks)
        );
    }

    #[tokio::test]
    async fn a_walk_file_holds_one_file_of_every_process_as_the_mount_serves_it() {
        let s = setup();
        assert_eq!(
            walk::FILES.to_vec(),
            [SNAPSHOT_FILES.as_slice(), BATCH_FILES.as_slice(), &["ns"]].concat(),
            "a walk carries the snapshot's files, the batched ones and the namespace links"
        );
        let root = names(&s.view.readdir(&ME, crate::inode::ROOT).await.unwrap());
        assert!(!root.contains(&walk::DIR.to_string()), "hidden: {root:?}");
        assert_eq!(s.fake.snapshots.load(Ordering::SeqCst), 1);
        let dir = s.at(crate::inode::ROOT, walk::DIR).await.unwrap();
        assert_eq!(dir.kind, FileType::Directory);
        let listed = names(&s.view.readdir(&ME, dir.ino.0).await.unwrap());
        assert_eq!(listed[2..], walk::FILES.map(String::from));
        let f = s.at(dir.ino.0, "status").await.unwrap();
        let bytes = read(&s.view, &ME, f.ino.0).await.unwrap();
        assert_eq!(
            s.fake.snapshots.load(Ordering::SeqCst),
            1,
            "the listing's snapshot serves the walk"
        );
        let (names, recs) = walk::decode(&bytes).expect("a walk file");
        let mut nodes: Vec<u32> = names.iter().map(|n| n.node).collect();
        nodes.sort_unstable();
        assert_eq!(nodes, vec![1, 2], "every node's names");
        assert!(names.iter().all(|n| n.names.contains(&"status")
            && n.names.contains(&"cwd")
            && !n.names.contains(&"ctty")));
        let rec = |gpid, uid, gid, data: &'static [u8]| walk::Record {
            gpid,
            uid,
            gid,
            contents: Ok(data),
        };
        assert_eq!(
            recs,
            vec![
                rec(10_000_001, 0, 0, b"Pid:\t10000001\n"),
                rec(20_000_005, 1000, 100, b"Pid:\t20000005\n"),
                rec(20_000_006, 1001, 100, b"Pid:\t20000006\n"),
            ]
        );
        // A file snapshots do not carry is fetched for every process, errors kept.
        let env = s.at(dir.ino.0, "environ").await.unwrap();
        let bytes = read(&s.view, &ME, env.ino.0).await.unwrap();
        assert_eq!(s.fake.snapshots.load(Ordering::SeqCst), 2);
        let (_, recs) = walk::decode(&bytes).unwrap();
        assert_eq!(recs.len(), 3);
        assert!(recs.iter().all(|r| r.contents == Err(libc::EACCES)));
        // A process gone since the snapshot is left out (the mount says ENOENT for it).
        s.fake.procs.lock().remove(&20_000_006);
        s.view.forget(20_000_006); // what a read that found it gone does
        let bytes = read(&s.view, &ME, f.ino.0).await.unwrap();
        let gpids: Vec<u64> = walk::decode(&bytes)
            .unwrap()
            .1
            .iter()
            .map(|r| r.gpid)
            .collect();
        assert_eq!(gpids, vec![10_000_001, 20_000_005]);
        assert_eq!(s.at(dir.ino.0, "maps").await.unwrap_err(), libc::ENOENT);
    }

    #[tokio::test]
    async fn process_directory_owner_and_files() {
        let s = setup();
        let d = s.at(crate::inode::ROOT, "20000005").await.unwrap();
        assert_eq!((d.uid, d.gid, d.kind), (1000, 100, FileType::Directory));
        assert_eq!(crate::inode::gpid_of(d.ino.0), Some(20_000_005));
        let st = s.at(d.ino.0, "status").await.unwrap();
        assert_eq!(st.kind, FileType::RegularFile);
        assert_eq!(
            read(&s.view, &ME, st.ino.0).await.unwrap(),
            b"Pid:\t20000005\n"
        );
        let cwd = s.at(d.ino.0, "cwd").await.unwrap();
        assert_eq!(cwd.kind, FileType::Symlink);
        assert_eq!(s.view.readlink(&ME, cwd.ino.0).await.unwrap(), b"/work");
        let env = s.at(d.ino.0, "environ").await.unwrap();
        assert_eq!(read(&s.view, &ME, env.ino.0).await, Err(libc::EACCES));
        assert_eq!(s.at(d.ino.0, "nothing").await.unwrap_err(), libc::ENOENT);
    }

    #[tokio::test]
    async fn names_of_a_process_directory_are_kept_long_present_or_absent() {
        let s = setup();
        let root = crate::inode::ROOT;
        let d = s.at(root, "10000001").await.unwrap();
        // A process directory is asked for again at each walk, for its caller.
        assert_eq!(
            s.view.entry_ttl(root, OsStr::new("10000001")),
            Duration::ZERO
        );
        assert_eq!(s.view.entry_ttl(root, OsStr::new("4711")), Duration::ZERO);
        assert_eq!(s.view.entry_ttl(root, OsStr::new("sys")), s.view.ttl());
        assert!(!s.view.caches_absence(root));
        assert_eq!(
            s.view.entry_ttl(d.ino.0, OsStr::new("status")),
            PROC_NAMES_TTL
        );
        assert!(s.view.caches_absence(d.ino.0));
        let fd = s.view.ino(&Node::ProcPath(10000001, "fd".into())).unwrap();
        // Open descriptors come and go: their names are not kept.
        assert_eq!(s.view.entry_ttl(fd, OsStr::new("0")), s.view.ttl());
        assert!(!s.view.caches_absence(fd));
        assert_eq!(View::<Arc<Fake>>::absent().ino.0, 0);
    }

    #[tokio::test]
    async fn snapshot_serves_opens_until_it_is_stale() {
        let s = setup();
        s.view.readdir(&ME, crate::inode::ROOT).await.unwrap();
        assert_eq!(s.fake.snapshots.load(Ordering::SeqCst), 1);
        let d = s.at(crate::inode::ROOT, "10000001").await.unwrap();
        for f in ["stat", "status", "cmdline"] {
            let a = s.at(d.ino.0, f).await.unwrap();
            read(&s.view, &ME, a.ino.0).await.unwrap();
        }
        assert_eq!(
            s.fake.reads.load(Ordering::SeqCst),
            0,
            "served from the snapshot"
        );
        // Another reader does not get this reader's snapshot.
        let other = Who {
            uid: 1000,
            gid: 100,
            pid: 0,
        };
        let a = s
            .view
            .lookup(&other, d.ino.0, OsStr::new("stat"))
            .await
            .unwrap();
        read(&s.view, &other, a.ino.0).await.unwrap();
        assert_eq!(s.fake.reads.load(Ordering::SeqCst), 1);
    }

    /// Regression: a reader never sees a process its node hides from it (`hidepid`), also
    /// right after another reader's listing and lookups.
    #[tokio::test]
    async fn a_process_hidden_from_a_reader_is_not_found_after_another_readers_listing() {
        let s = setup();
        s.fake.hidepid.store(true, Ordering::SeqCst);
        let root = crate::inode::ROOT;
        s.view.readdir(&ME, root).await.unwrap();
        let d = s.at(root, "20000006").await.unwrap();
        s.at(d.ino.0, "status").await.unwrap();
        let user = Who {
            uid: 1000,
            gid: 100,
            pid: 0,
        };
        let lookup = |name: &'static str| s.view.lookup(&user, root, OsStr::new(name));
        assert_eq!(lookup("20000006").await.unwrap_err(), libc::ENOENT);
        assert_eq!(
            s.view
                .lookup_entry(&user, d.ino.0, OsStr::new("status"))
                .await
                .unwrap_err(),
            libc::ENOENT
        );
        assert_eq!(
            s.view.getattr(&user, d.ino.0).await.unwrap_err(),
            libc::ENOENT
        );
        assert!(lookup("20000005").await.is_ok(), "the reader's own");
        let listed = names(&s.view.readdir(&user, root).await.unwrap());
        assert!(!listed.contains(&"20000006".to_string()), "{listed:?}");
        assert!(listed.contains(&"20000005".to_string()), "{listed:?}");
        // The kernel keeps no process directory for the next caller: it asks at each walk.
        assert_eq!(
            s.view.entry_ttl(root, OsStr::new("20000006")),
            Duration::ZERO
        );
    }

    /// Regression: a process that takes the gpid of one that exited is a new one: what was
    /// opened or kept of the old one never shows the new one, a new lookup finds it.
    #[tokio::test]
    async fn handles_on_a_process_whose_gpid_was_taken_again_are_its_own() {
        let s = setup();
        let root = crate::inode::ROOT;
        s.fake.starts.lock().insert(20_000_005, 100);
        s.view.readdir(&ME, root).await.unwrap();
        let d = s.at(root, "20000005").await.unwrap();
        assert_eq!(s.view.generation(d.ino.0), 100);
        let st = s.at(d.ino.0, "status").await.unwrap();
        let env = s.at(d.ino.0, "cmdline").await.unwrap();
        let (node, start) = s.view.made_anew(st.ino.0).unwrap();
        assert_eq!(start, 100);
        // The process exits; another takes its pid, while the snapshot is still fresh.
        {
            let mut p = s.fake.procs.lock();
            let e = p.get_mut(&20_000_005).unwrap();
            e.2.insert("status".into(), Ok(b"Pid:\t20000005\nnew\n".to_vec()));
            e.2.insert("cmdline".into(), Ok(b"new\0".to_vec()));
        }
        s.fake.starts.lock().insert(20_000_005, 200);
        s.view.readdir(&ME, root).await.unwrap();
        assert_eq!(read(&s.view, &ME, env.ino.0).await, Err(libc::ENOENT));
        assert_eq!(
            s.view.open_node(&ME, node, start).await.unwrap_err(),
            libc::ENOENT,
            "a read from the start of the old open file"
        );
        assert_eq!(
            s.view.readdir(&ME, d.ino.0).await.unwrap_err(),
            libc::ENOENT
        );
        // Looked up anew: the new process, with a new generation and numbers of its own.
        let d2 = s.at(root, "20000005").await.unwrap();
        assert_eq!(d2.ino, d.ino);
        assert_eq!(s.view.generation(d2.ino.0), 200);
        let st2 = s.at(d2.ino.0, "status").await.unwrap();
        assert_ne!(st2.ino, st.ino);
        assert_eq!(
            read(&s.view, &ME, st2.ino.0).await.unwrap(),
            b"Pid:\t20000005\nnew\n"
        );
        assert_eq!(read(&s.view, &ME, st.ino.0).await, Err(libc::ENOENT));
        assert_eq!(
            s.view.getattr(&ME, st.ino.0).await.unwrap_err(),
            libc::ENOENT
        );
    }

    #[tokio::test]
    async fn a_walk_over_every_process_asks_once_per_node() {
        // What ps does: list the root, then stat each /GPID and open five names in it.
        let s = setup();
        let root = crate::inode::ROOT;
        s.view.readdir(&ME, root).await.unwrap();
        for g in ["10000001", "20000005", "20000006"] {
            let d = s.at(root, g).await.unwrap();
            for f in ["stat", "status", "environ", "cmdline"] {
                let a = s.at(d.ino.0, f).await.unwrap();
                let _ = read(&s.view, &ME, a.ino.0).await;
            }
            let e = s.at(d.ino.0, "ctty").await;
            assert_eq!(e.unwrap_err(), libc::ENOENT);
        }
        assert_eq!(s.fake.reads.load(Ordering::SeqCst), 0);
        // One listing per node teaches the names; one batch per node gives environ.
        assert_eq!(s.fake.readdirs.load(Ordering::SeqCst), 2);
        assert_eq!(s.fake.snapshots.load(Ordering::SeqCst), 1 + 2);
        // Owners come from the snapshot, per process.
        let d = s.at(root, "20000006").await.unwrap();
        let st = s.at(d.ino.0, "stat").await.unwrap();
        assert_eq!((st.uid, st.gid), (1001, 100));
    }

    #[tokio::test]
    async fn a_gone_process_is_enoent_and_no_cland_is_eio() {
        let s = setup();
        let d = s.at(crate::inode::ROOT, "20000005").await.unwrap();
        let st = s.at(d.ino.0, "status").await.unwrap();
        s.fake.procs.lock().remove(&20_000_005);
        assert_eq!(read(&s.view, &ME, st.ino.0).await, Err(libc::ENOENT));
        assert_eq!(
            s.at(crate::inode::ROOT, "20000009").await.unwrap_err(),
            libc::ENOENT
        );
        s.fake.down.store(true, Ordering::SeqCst);
        assert_eq!(read(&s.view, &ME, st.ino.0).await, Err(libc::EIO));
        assert_eq!(
            s.view.readdir(&ME, crate::inode::ROOT).await.unwrap_err(),
            libc::EIO
        );
        s.fake.down.store(false, Ordering::SeqCst);
        assert!(s.view.readdir(&ME, crate::inode::ROOT).await.is_ok());
    }

    #[tokio::test]
    async fn passed_through_names_and_pid_max() {
        let s = setup();
        let root = crate::inode::ROOT;
        let sys = s.at(root, "sys").await.unwrap();
        let k = s.at(sys.ino.0, "kernel").await.unwrap();
        let pm = s.at(k.ino.0, "pid_max").await.unwrap();
        assert_eq!(read(&s.view, &ME, pm.ino.0).await.unwrap(), PID_MAX);
        let v = s.at(root, "version").await.unwrap();
        assert_eq!(read(&s.view, &ME, v.ino.0).await.unwrap(), b"Linux\n");
        // A local pid resolves, though it is not listed.
        let host = s.at(root, "4711").await.unwrap();
        assert_eq!(host.kind, FileType::Directory);
        let hs = s.at(host.ino.0, "status").await.unwrap();
        assert_eq!(
            read(&s.view, &ME, hs.ino.0).await.unwrap(),
            b"Name:\thost\n"
        );
        // The cluster's stat, not the host's.
        let st = s.at(root, "stat").await.unwrap();
        assert_eq!(read(&s.view, &ME, st.ino.0).await.unwrap(), b"stat of []\n");
    }

    #[tokio::test]
    async fn nodes_directory() {
        let s = setup();
        let n = s.at(crate::inode::ROOT, "nodes").await.unwrap();
        assert_eq!(
            names(&s.view.readdir(&ME, n.ino.0).await.unwrap()),
            [".", "..", "1", "2"]
        );
        let two = s.at(n.ino.0, "2").await.unwrap();
        let la = s.at(two.ino.0, "loadavg").await.unwrap();
        assert_eq!(
            read(&s.view, &ME, la.ino.0).await.unwrap(),
            b"loadavg of [2]\n"
        );
        assert_eq!(s.at(n.ino.0, "7").await.unwrap_err(), libc::ENOENT);
    }

    #[tokio::test]
    async fn only_a_name_its_node_does_not_have_is_absent() {
        let s = setup();
        let root = crate::inode::ROOT;
        let entry = |dir: u64, name: &'static str| {
            let view = &s.view;
            async move { view.lookup_entry(&ME, dir, OsStr::new(name)).await }
        };
        let d = s.at(root, "20000005").await.unwrap().ino.0;
        // The node answered (its listing, then its template while a snapshot holds the
        // process): `ctty` is not there, for the kernel to keep.
        assert_eq!(entry(d, "ctty").await, Ok(None));
        assert!(entry(d, "status").await.unwrap().is_some());
        s.view.readdir(&ME, root).await.unwrap();
        assert_eq!(entry(d, "ctty").await, Ok(None));
        assert_eq!(s.at(d, "ctty").await.unwrap_err(), libc::ENOENT);
        // Elsewhere an absence is an error, kept for a ttl only.
        let fd = s
            .view
            .ino(&Node::ProcPath(20_000_005, "fd".into()))
            .unwrap();
        assert_eq!(entry(fd, "3").await.unwrap_err(), libc::ENOENT);
        assert_eq!(entry(root, "nothing").await.unwrap_err(), libc::ENOENT);
        // A process gone (not in the snapshot): ENOENT, but no absence to keep.
        let g = s.view.ino(&Node::Proc(20_000_007)).unwrap();
        assert_eq!(entry(g, "status").await.unwrap_err(), libc::ENOENT);
        // cland not answering: EIO, nothing to keep.
        let g = s.view.ino(&Node::Proc(10_000_009)).unwrap();
        s.fake.down.store(true, Ordering::SeqCst);
        assert_eq!(entry(g, "ctty").await.unwrap_err(), libc::EIO);
    }

    /// The kernel follows a descriptor's link to a pipe or a socket by looking up its
    /// target (`pipe:[123]`) in the descriptor directory: the view answers with what stat()
    /// of the link gives on the process's node, never kept, and refuses to open it.
    #[tokio::test]
    async fn what_a_descriptors_link_leads_to_is_stated_on_its_node() {
        let s = setup();
        {
            let mut p = s.fake.procs.lock();
            let files = &mut p.get_mut(&20_000_005).unwrap().2;
            for (fd, target) in [
                ("fd/0", "/dev/null"),
                ("fd/1", "pipe:[123]"),
                ("fd/2", "pipe:[123]"),
                ("fd/3", "socket:[456]"),
                ("fd/4", "anon_inode:[eventfd]"),
                ("task/20000005/fd/1", "pipe:[123]"),
            ] {
                files.insert(fd.into(), Ok(target.as_bytes().to_vec()));
            }
        }
        let fd = s
            .view
            .ino(&Node::ProcPath(20_000_005, "fd".into()))
            .unwrap();
        let pipe = s.at(fd, "pipe:[123]").await.unwrap();
        assert_eq!(pipe.kind, FileType::NamedPipe);
        assert_eq!(
            (pipe.perm, pipe.uid, pipe.gid, pipe.size),
            (0o600, 1000, 100, 0)
        );
        // The lookup's number is the view's (the kernel's node id); a getattr gives the
        // pipe's own, which the kernel reports, and nothing of it is kept.
        assert_eq!(crate::inode::gpid_of(pipe.ino.0), Some(20_000_005));
        let a = s.view.getattr(&ME, pipe.ino.0).await.unwrap();
        assert_eq!((a.ino.0, a.kind), (123, FileType::NamedPipe));
        assert_eq!(
            a.mtime,
            SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 5)
        );
        assert_eq!(
            s.view.entry_ttl(fd, OsStr::new("pipe:[123]")),
            Duration::ZERO
        );
        assert_eq!(s.view.attr_ttl(pipe.ino.0), Duration::ZERO);
        assert_eq!(s.view.entry_ttl(fd, OsStr::new("1")), s.view.ttl());
        assert_eq!(s.view.attr_ttl(fd), s.view.ttl());
        // The first descriptor with that target; the one whose link was read last first.
        assert_eq!(
            s.fake.stat_links.lock()[0],
            ("fd".into(), "pipe:[123]".into(), "".into())
        );
        let two = s.at(fd, "2").await.unwrap();
        assert_eq!(
            s.view.readlink(&ME, two.ino.0).await.unwrap(),
            b"pipe:[123]"
        );
        s.at(fd, "pipe:[123]").await.unwrap();
        assert_eq!(s.fake.stat_links.lock().last().unwrap().2, "2");
        // A socket, an anonymous inode (of no type: a regular file to FUSE), a thread's.
        assert_eq!(
            s.at(fd, "socket:[456]").await.unwrap().kind,
            FileType::Socket
        );
        let anon = s.at(fd, "anon_inode:[eventfd]").await.unwrap();
        assert_eq!((anon.kind, anon.perm), (FileType::RegularFile, 0o600));
        let tfd = s
            .view
            .ino(&Node::ProcPath(20_000_005, "task/20000005/fd".into()))
            .unwrap();
        assert_eq!(
            s.at(tfd, "pipe:[123]").await.unwrap().kind,
            FileType::NamedPipe
        );
        // No descriptor leads there: ENOENT, asked each time; a name that is no target
        // is no descriptor either.
        assert_eq!(s.at(fd, "pipe:[124]").await.unwrap_err(), libc::ENOENT);
        assert_eq!(s.at(fd, "nothing").await.unwrap_err(), libc::ENOENT);
        // Not opened, not read as a link.
        assert_eq!(
            read(&s.view, &ME, anon.ino.0).await.unwrap_err(),
            libc::ENXIO
        );
        assert_eq!(
            s.view.readlink(&ME, pipe.ino.0).await.unwrap_err(),
            libc::EINVAL
        );
        // Another user may not follow the process's links: the kernel's EACCES.
        let other = Who {
            uid: 1001,
            gid: 100,
            pid: 0,
        };
        assert_eq!(
            s.view
                .lookup(&other, fd, OsStr::new("pipe:[123]"))
                .await
                .unwrap_err(),
            libc::EACCES
        );
        // The pipe is closed: gone at the next getattr.
        s.fake
            .procs
            .lock()
            .get_mut(&20_000_005)
            .unwrap()
            .2
            .retain(|n, _| !n.starts_with("fd/1") && !n.starts_with("fd/2"));
        assert_eq!(
            s.view.getattr(&ME, pipe.ino.0).await.unwrap_err(),
            libc::ENOENT
        );
    }

    proptest::proptest! {
        /// Whatever a node sends as a link's attributes, they become attributes, never a
        /// panic.
        #[test]
        fn any_link_stat_is_attributes(
            mode: u32, ino: u64, nlink: u64, rdev: u64, size: i64, blocks: i64,
            blksize: i64, t: (i64, i64, i64, i64, i64, i64),
        ) {
            let st = pb::LinkStat {
                mode, ino, nlink, rdev, size, blocks, blksize,
                atime: t.0, atime_nsec: t.1, mtime: t.2, mtime_nsec: t.3,
                ctime: t.4, ctime_nsec: t.5,
                ..Default::default()
            };
            let a = link_attr(7, &st);
            proptest::prop_assert_eq!(a.ino.0, 7);
            proptest::prop_assert_eq!(u32::from(a.perm), mode & 0o7777);
        }
    }

    #[test]
    fn a_walk_keeps_its_snapshot_while_it_reads_and_no_longer() {
        let ttl = Duration::from_secs(1);
        let ms = Duration::from_millis;
        // Anyone, for a ttl.
        assert!(serves(ms(900), ms(900), false, ttl));
        assert!(!serves(ms(1000), ms(10), false, ttl));
        // The walker, while each read comes within a ttl of the one before.
        assert!(serves(ms(1500), ms(10), true, ttl));
        assert!(serves(ms(9000), ms(999), true, ttl));
        // A pause of a second (psutil's cpu_percent(interval=1)) ends the walk.
        assert!(!serves(ms(1500), ms(1000), true, ttl));
        // Never beyond WALK_TTL.
        assert!(!serves(WALK_TTL, ms(1), true, ttl));
    }

    #[tokio::test]
    async fn the_walker_reads_live_after_a_pause() {
        let s = setup_with_ttl(Duration::from_secs(1));
        let walker = Who { pid: 77, ..ME };
        s.view.readdir(&walker, crate::inode::ROOT).await.unwrap();
        let d = s
            .view
            .lookup(&walker, crate::inode::ROOT, OsStr::new("10000001"))
            .await
            .unwrap();
        let st = s
            .view
            .lookup(&walker, d.ino.0, OsStr::new("stat"))
            .await
            .unwrap();
        // The snapshot as it would be 3 s after the listing, its walker's last read
        // `idle` ago.
        let age = |idle: Duration| {
            let old = s.view.snapshot.lock().clone().unwrap();
            let now = Instant::now();
            *s.view.snapshot.lock() = Some(Arc::new(Snapshot {
                at: now - Duration::from_secs(3),
                reader: old.reader.clone(),
                walker: old.walker,
                used: Mutex::new(now - idle),
                procs: old.procs.clone(),
            }));
        };
        age(Duration::from_millis(300));
        read(&s.view, &walker, st.ino.0).await.unwrap();
        assert_eq!(s.fake.reads.load(Ordering::SeqCst), 0, "the walk goes on");
        // Another thread reads live.
        let other = Who { pid: 78, ..ME };
        read(&s.view, &other, st.ino.0).await.unwrap();
        assert_eq!(s.fake.reads.load(Ordering::SeqCst), 1);
        // The walker itself, after a second without a read of the snapshot.
        s.fake
            .procs
            .lock()
            .get_mut(&10_000_001)
            .unwrap()
            .2
            .insert("stat".into(), Ok(b"10000001 (x) R".to_vec()));
        age(Duration::from_millis(1500));
        assert_eq!(
            read(&s.view, &walker, st.ino.0).await.unwrap(),
            b"10000001 (x) R"
        );
        assert_eq!(s.fake.reads.load(Ordering::SeqCst), 2, "read live");
        // And a process gone since is gone for it.
        s.fake.procs.lock().remove(&20_000_005);
        let gone = s
            .view
            .lookup(&walker, crate::inode::ROOT, OsStr::new("20000005"))
            .await;
        assert_eq!(gone.unwrap_err(), libc::ENOENT);
    }
}
