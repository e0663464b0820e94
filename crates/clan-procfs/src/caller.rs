//! Who sends a request: the reader's identity that cland applies the kernel's rules to,
//! and whether the caller is a process of the cluster (for `self` and `thread-self`).
//!
//! Everything is read from a /proc given as a parameter (the server's, in the host's pid
//! namespace, where FUSE reports callers' pids), so tests can use a fake tree.

use clan_core::GPID_SPAN;
use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long the nodes' pid namespaces are trusted before they are read again (a node
/// restarted by `clan node start` has a new init).
const NS_TTL: Duration = Duration::from_secs(2);

/// The reader of a request: what cland needs to apply the kernel's permission rules.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reader {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, sorted.
    pub groups: Vec<u32>,
    /// Effective capabilities (`None`: not known, all of them for root, as before they
    /// were read): the kernel's privilege is the capability, not uid 0.
    pub caps: Option<u64>,
}

impl Reader {
    pub fn root() -> Reader {
        Reader {
            uid: 0,
            gid: 0,
            groups: Vec::new(),
            caps: None,
        }
    }

    pub fn to_creds(&self, pid: u32) -> clan_proto::pb::Creds {
        clan_proto::pb::Creds {
            uid: self.uid,
            gid: self.gid,
            groups: self.groups.clone(),
            pid,
            cap_eff: self.caps,
            ..Default::default()
        }
    }

    /// Whether the reader may pass over a file's mode (CAP_DAC_OVERRIDE, or for reading
    /// CAP_DAC_READ_SEARCH): root with them. Capabilities of other users do not count:
    /// what they read is read with their uid, which leaves none.
    pub fn overrides_modes(&self, writing_or_executing: bool) -> bool {
        use clan_core::sys::cap;
        let caps = self.caps.unwrap_or(u64::MAX);
        self.uid == 0
            && (cap::has(caps, cap::DAC_OVERRIDE)
                || (!writing_or_executing && cap::has(caps, cap::DAC_READ_SEARCH)))
    }
}

/// The numbers of a status field (as u64), skipping what does not parse.
pub fn status_numbers(status: &str, key: &str) -> Vec<u64> {
    clan_core::sys::status_numbers(status, key)
}

/// The reader behind a FUSE request: its uid and gid as FUSE reports them, and the
/// supplementary groups and effective capabilities of the calling thread (`Groups:` and
/// `CapEff:` of its status; none when it can not be read or FUSE gives no pid: a caller
/// is not privileged by what the view does not know of it).
pub fn reader(proc_root: &Path, uid: u32, gid: u32, pid: u32) -> Reader {
    let status = (pid != 0)
        .then(|| std::fs::read_to_string(proc_root.join(pid.to_string()).join("status")).ok())
        .flatten();
    let mut groups: Vec<u32> = status
        .as_deref()
        .map(|s| {
            status_numbers(s, "Groups")
                .into_iter()
                .filter_map(|g| u32::try_from(g).ok())
                .collect()
        })
        .unwrap_or_default();
    groups.sort_unstable();
    groups.dedup();
    let caps = Some(
        status
            .as_deref()
            .and_then(|s| clan_core::sys::status_caps(s, "CapEff"))
            .unwrap_or(0),
    );
    Reader {
        uid,
        gid,
        groups,
        caps,
    }
}

/// Whether thread `tid` is in a system call that opens a file for I/O (`open`, `openat`,
/// `creat` other than with `O_PATH`, `openat2` whatever its flags, which it keeps in the
/// caller's memory): what a lookup it makes is for, from `syscall` of its status
/// directory (its number and arguments while it waits for the answer). `false` when that
/// can not be read (FUSE gives no pid, the caller is gone): the lookup is answered.
pub fn opening(proc_root: &Path, tid: u32) -> bool {
    if tid == 0 {
        return false;
    }
    std::fs::read_to_string(proc_root.join(tid.to_string()).join("syscall"))
        .ok()
        .is_some_and(|s| opens(&s))
}

/// Whether a line of `/proc/TID/syscall` (`NR ARG1 ... ARG6 SP PC`, the arguments in hex)
/// is a call that opens for I/O ([`opening`]); `running` or `-1 ...` (not in a call) is not.
fn opens(line: &str) -> bool {
    let mut f = line.split_whitespace();
    let Some(nr) = f.next().and_then(|n| n.parse::<i64>().ok()) else {
        return false;
    };
    let args: Vec<u64> = f
        .map(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).unwrap_or(0))
        .collect();
    let for_io = |i: usize| {
        args.get(i)
            .is_some_and(|&flags| flags & libc::O_PATH as u64 == 0)
    };
    #[cfg(target_arch = "x86_64")]
    {
        if nr == libc::SYS_open {
            return for_io(1);
        }
        if nr == libc::SYS_creat {
            return true;
        }
    }
    if nr == libc::SYS_openat {
        return for_io(2);
    }
    nr == libc::SYS_openat2
}

/// Where a caller stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// A process of the cluster: its gpid and its thread's; `node_proc`: the node's real
    /// procfs in its mount namespace (a `clan shell`), with its numbers there.
    Cluster {
        gpid: u64,
        thread: u64,
        node_proc: Option<(PathBuf, u64, u64)>,
    },
    /// A process of this machine outside the cluster, by host pid and thread id.
    Host { pid: u32, tid: u32 },
    /// Not visible from here (FUSE reports pid 0).
    Unknown,
}

impl Caller {
    /// Target of `self`: relative to the view's root for a process of the cluster, the
    /// host's /proc otherwise.
    pub fn self_link(&self) -> Option<String> {
        match self {
            Caller::Cluster {
                node_proc: Some((p, local, _)),
                ..
            } => Some(format!("{}/{local}", p.display())),
            Caller::Cluster { gpid, .. } => Some(gpid.to_string()),
            Caller::Host { pid, .. } => Some(format!("/proc/{pid}")),
            Caller::Unknown => None,
        }
    }

    /// Target of `thread-self`.
    pub fn thread_self_link(&self) -> Option<String> {
        match self {
            Caller::Cluster {
                node_proc: Some((p, local, tid)),
                ..
            } => Some(format!("{}/{local}/task/{tid}", p.display())),
            Caller::Cluster { gpid, thread, .. } => Some(format!("{gpid}/task/{thread}")),
            Caller::Host { pid, tid } => Some(format!("/proc/{pid}/task/{tid}")),
            Caller::Unknown => None,
        }
    }
}

/// The name (`comm`) of a node's init: a pid file without a `.start` line (an older
/// cland's) is believed for a process of that name only.
const INIT_COMM: &str = "clan-shepherd";

/// Each node that has a pid namespace of its own, with that namespace (`pid:[N]`).
type NodeNamespaces = Vec<(u32, PathBuf)>;

/// Decides whether callers are processes of the cluster.
pub struct Locator {
    proc_root: PathBuf,
    cluster_dir: PathBuf,
    node: u32,
    /// (when read, each node's pid namespace link when it has one of its own)
    ns: Mutex<Option<(Instant, NodeNamespaces)>>,
    node_proc: Option<PathBuf>,
}

impl Locator {
    /// `node` is the node the server talks to (the node of this machine).
    pub fn new(proc_root: PathBuf, cluster_dir: PathBuf, node: u32) -> Locator {
        Locator {
            proc_root,
            cluster_dir,
            node,
            ns: Mutex::new(None),
            node_proc: None,
        }
    }

    /// Where clan shells of this server's node have the node's procfs.
    pub fn with_node_proc(mut self, p: Option<PathBuf>) -> Locator {
        self.node_proc = p;
        self
    }

    /// The node's procfs as host process `pid` sees it, when it is mounted in its mount
    /// namespace (a clan shell), with the numbers there of the process and the thread:
    /// `numbers`, their pids in the node's pid namespace (not in one of their own nested
    /// in it: `unshare -p` in a clan shell).
    fn node_proc_of(
        &self,
        pid: u32,
        node: u32,
        numbers: (u64, u64),
    ) -> Option<(PathBuf, u64, u64)> {
        let p = self.node_proc.as_ref().filter(|_| node == self.node)?;
        let inside = self
            .proc_root
            .join(pid.to_string())
            .join("root")
            .join(p.strip_prefix("/").unwrap_or(p));
        if !inside.join("1/stat").exists() {
            return None;
        }
        Some((p.clone(), numbers.0, numbers.1))
    }

    /// The pid namespaces of the nodes that run in one of their own (a local cluster's
    /// nodes: `<cluster dir>/node<N>/init.pid` holds each namespace init's host pid).
    fn node_namespaces(&self) -> NodeNamespaces {
        let mut cached = self.ns.lock();
        if let Some((at, v)) = cached.as_ref() {
            if at.elapsed() < NS_TTL {
                return v.clone();
            }
        }
        let own = std::fs::read_link(self.proc_root.join("self/ns/pid")).ok();
        let mut v = Vec::new();
        for e in std::fs::read_dir(&self.cluster_dir)
            .into_iter()
            .flatten()
            .flatten()
        {
            let Some(n) = e
                .file_name()
                .to_str()
                .and_then(|s| s.strip_prefix("node"))
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            // The node's init as its pid file records it, and only if the process with
            // that pid is the one recorded (its `.start` line): a pid reused since the node
            // stopped is some other process, whose namespace is not the node's.
            let Some(init) =
                clan_core::pidfile::read_in(&self.proc_root, &e.path().join("init.pid"), INIT_COMM)
                    .and_then(|r| u32::try_from(r.pid).ok())
            else {
                continue;
            };
            if let Ok(ns) = std::fs::read_link(self.proc_root.join(format!("{init}/ns/pid"))) {
                if Some(&ns) != own.as_ref() {
                    v.push((n, ns));
                }
            }
        }
        *cached = Some((Instant::now(), v.clone()));
        v
    }

    /// Whether the thread `tid` (host pid namespace) is a process of the cluster, and
    /// which. On a real cluster (no node has a pid namespace of its own) every process of
    /// this machine is one, of this machine's node, with its host pid; on a local
    /// cluster, a process in a node's pid namespace is, with its pid there (the last
    /// `NSpid`). This is the one place that decides it.
    pub fn caller(&self, tid: u32) -> Caller {
        if tid == 0 {
            return Caller::Unknown;
        }
        let dir = self.proc_root.join(tid.to_string());
        let Ok(status) = std::fs::read_to_string(dir.join("status")) else {
            return Caller::Unknown;
        };
        let pid = status_numbers(&status, "Tgid")
            .first()
            .and_then(|&p| u32::try_from(p).ok())
            .unwrap_or(tid);
        let namespaces = self.node_namespaces();
        if namespaces.is_empty() {
            let node = u64::from(self.node) * GPID_SPAN;
            return Caller::Cluster {
                gpid: node + u64::from(pid),
                thread: node + u64::from(tid),
                node_proc: self.node_proc_of(pid, self.node, (pid.into(), tid.into())),
            };
        }
        let Ok(ns) = std::fs::read_link(dir.join("ns/pid")) else {
            return Caller::Unknown;
        };
        let Some(&(node, _)) = namespaces.iter().find(|(_, n)| *n == ns) else {
            return Caller::Host { pid, tid };
        };
        let last = |s: &str| status_numbers(s, "NSpid").last().copied();
        let thread = last(&status);
        let process = if pid == tid {
            thread
        } else {
            std::fs::read_to_string(self.proc_root.join(format!("{pid}/status")))
                .ok()
                .and_then(|s| last(&s))
        };
        match (process, thread) {
            (Some(p), Some(t)) if p < GPID_SPAN && t < GPID_SPAN => {
                let base = u64::from(node) * GPID_SPAN;
                Caller::Cluster {
                    gpid: base + p,
                    thread: base + t,
                    node_proc: self.node_proc_of(pid, node, (p, t)),
                }
            }
            _ => Caller::Host { pid, tid },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    struct Fake {
        dir: tempfile::TempDir,
    }

    impl Fake {
        fn new() -> Fake {
            let f = Fake {
                dir: tempfile::tempdir().unwrap(),
            };
            std::fs::create_dir_all(f.proc().join("self/ns")).unwrap();
            symlink("pid:[1]", f.proc().join("self/ns/pid")).unwrap();
            std::fs::create_dir_all(f.cluster()).unwrap();
            f
        }
        fn proc(&self) -> PathBuf {
            self.dir.path().join("proc")
        }
        fn cluster(&self) -> PathBuf {
            self.dir.path().join("cluster")
        }
        fn process(&self, pid: u32, tgid: u32, ns: &str, nspid: &str) {
            let d = self.proc().join(pid.to_string());
            std::fs::create_dir_all(d.join("ns")).unwrap();
            std::fs::write(
                d.join("status"),
                format!("Name:\tx\nTgid:\t{tgid}\nPid:\t{pid}\nNSpid:\t{nspid}\nGroups:\t27 4 \nCapEff:\t0000000000080000\n"),
            )
            .unwrap();
            symlink(ns, d.join("ns/pid")).unwrap();
            // Started at tick `pid * 10`, named `x`.
            let zeros = vec!["0"; 18].join(" ");
            std::fs::write(
                d.join("stat"),
                format!("{pid} (x) S {zeros} {}\n", pid * 10),
            )
            .unwrap();
            std::fs::write(d.join("comm"), "x\n").unwrap();
        }
        /// Node `n` with its init, a process of namespace `ns`, recorded in its pid file
        /// with the start time `start`.
        fn node_started(&self, n: u32, init: u32, ns: &str, start: u32) {
            self.process(init, init, ns, &format!("{init}\t1"));
            let d = self.cluster().join(format!("node{n}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("init.pid"), format!("{init}\n")).unwrap();
            std::fs::write(d.join("init.start"), format!("{init} {start} -\n")).unwrap();
        }
        fn node(&self, n: u32, init: u32, ns: &str) {
            self.node_started(n, init, ns, init * 10);
        }
    }

    #[test]
    fn real_cluster_every_process_is_of_this_node() {
        let f = Fake::new();
        f.process(4711, 4711, "pid:[1]", "4711");
        f.process(4712, 4711, "pid:[1]", "4712");
        let l = Locator::new(f.proc(), f.cluster(), 3);
        assert_eq!(
            l.caller(4712),
            Caller::Cluster {
                gpid: 30_004_711,
                thread: 30_004_712,
                node_proc: None,
            }
        );
        assert_eq!(l.caller(0), Caller::Unknown);
        assert_eq!(l.caller(9), Caller::Unknown);
    }

    #[test]
    fn local_cluster_by_pid_namespace() {
        let f = Fake::new();
        f.node(1, 100, "pid:[11]");
        f.node(2, 200, "pid:[22]");
        f.process(300, 300, "pid:[22]", "300\t5");
        f.process(301, 300, "pid:[22]", "301\t6");
        f.process(400, 400, "pid:[1]", "400");
        let l = Locator::new(f.proc(), f.cluster(), 1);
        assert_eq!(
            l.caller(301),
            Caller::Cluster {
                gpid: 20_000_005,
                thread: 20_000_006,
                node_proc: None,
            }
        );
        assert_eq!(l.caller(400), Caller::Host { pid: 400, tid: 400 });
        assert_eq!(
            Caller::Host { pid: 400, tid: 401 }
                .thread_self_link()
                .as_deref(),
            Some("/proc/400/task/401")
        );
        assert_eq!(
            Caller::Cluster {
                gpid: 20_000_005,
                thread: 20_000_006,
                node_proc: None,
            }
            .thread_self_link()
            .as_deref(),
            Some("20000005/task/20000006")
        );
    }

    /// Regression: `init.pid` was believed without its `.start` line: after a node
    /// stopped, another process with its init's pid passed for the node's init, and its
    /// pid namespace for the node's.
    #[test]
    fn a_node_init_is_believed_by_its_start_line() {
        let f = Fake::new();
        f.node(1, 100, "pid:[11]");
        // Node 2's pid file names pid 200, which another process (started later, in some
        // other namespace) has now.
        f.node_started(2, 200, "pid:[22]", 1234);
        f.process(301, 301, "pid:[22]", "301\t6");
        let l = Locator::new(f.proc(), f.cluster(), 1);
        assert_eq!(l.caller(301), Caller::Host { pid: 301, tid: 301 });
        // The one recorded: its processes are the node's.
        f.node(3, 500, "pid:[33]");
        f.process(501, 501, "pid:[33]", "501\t7");
        let l = Locator::new(f.proc(), f.cluster(), 1);
        assert_eq!(
            l.caller(501),
            Caller::Cluster {
                gpid: 30_000_007,
                thread: 30_000_007,
                node_proc: None,
            }
        );
        // A pid file without a start line (an older cland's): believed for a process
        // named as a node's init only.
        let d = f.cluster().join("node3");
        std::fs::remove_file(d.join("init.start")).unwrap();
        let l = Locator::new(f.proc(), f.cluster(), 1);
        assert_eq!(l.caller(501), Caller::Host { pid: 501, tid: 501 });
        std::fs::write(f.proc().join("500/comm"), "clan-shepherd\n").unwrap();
        let l = Locator::new(f.proc(), f.cluster(), 1);
        assert!(matches!(l.caller(501), Caller::Cluster { .. }));
    }

    #[test]
    fn groups_of_the_caller() {
        let f = Fake::new();
        f.process(55, 55, "pid:[1]", "55");
        let r = reader(&f.proc(), 1000, 1000, 55);
        assert_eq!(r.groups, vec![4, 27]);
        assert_eq!(r.caps, Some(0x80000));
        assert!(reader(&f.proc(), 1, 1, 0).groups.is_empty());
        assert!(reader(&f.proc(), 1, 1, 99).groups.is_empty());
        // A caller gone, or FUSE gave no pid: no capabilities.
        assert_eq!(reader(&f.proc(), 0, 0, 99).caps, Some(0));
        assert_eq!(reader(&f.proc(), 0, 0, 0).caps, Some(0));
        let mut root = reader(&f.proc(), 0, 0, 55);
        assert!(!root.overrides_modes(false));
        root.caps = Some(1 << clan_core::sys::cap::DAC_READ_SEARCH);
        assert!(root.overrides_modes(false) && !root.overrides_modes(true));
        assert!(Reader::root().overrides_modes(true));
    }

    #[test]
    fn an_open_is_told_from_a_stat() {
        let line = |nr: i64, args: &[u64]| {
            let mut l = nr.to_string();
            for a in args {
                l.push_str(&format!(" 0x{a:x}"));
            }
            l + " 0x7ffd0 0x7f001\n"
        };
        let at = (-100i64) as u64;
        assert!(opens(&line(libc::SYS_openat, &[at, 0x1000, 0, 0, 0, 0])));
        assert!(opens(&line(
            libc::SYS_openat,
            &[
                at,
                0x1000,
                libc::O_WRONLY as u64 | libc::O_NONBLOCK as u64,
                0,
                0,
                0
            ]
        )));
        assert!(!opens(&line(
            libc::SYS_openat,
            &[at, 0x1000, libc::O_PATH as u64, 0, 0, 0]
        )));
        assert!(opens(&line(
            libc::SYS_openat2,
            &[at, 0x1000, 0x2000, 24, 0, 0]
        )));
        #[cfg(target_arch = "x86_64")]
        assert!(opens(&line(libc::SYS_open, &[0x1000, 0, 0, 0, 0, 0])));
        assert!(!opens(&line(
            libc::SYS_statx,
            &[at, 0x1000, 0, 0x7ff, 0x2000, 0]
        )));
        assert!(!opens(&line(
            libc::SYS_newfstatat,
            &[at, 0x1000, 0x2000, 0, 0, 0]
        )));
        assert!(!opens(&line(
            libc::SYS_readlinkat,
            &[at, 0x1000, 0x2000, 4096, 0, 0]
        )));
        for junk in [
            "",
            "running\n",
            "-1 0x7ffd0 0x7f001\n",
            "257",
            "257 zz",
            "x 1 2",
        ] {
            assert!(!opens(junk), "{junk:?}");
        }
        // This thread is in no open while it reads its own line.
        let me = nix::unistd::gettid().as_raw() as u32;
        assert!(!opening(Path::new("/proc"), me));
        assert!(!opening(Path::new("/proc"), 0));
    }

    #[test]
    fn malformed_status_is_no_panic() {
        assert_eq!(status_numbers("NSpid:\tx y 7\n", "NSpid"), vec![7]);
        assert!(status_numbers("garbage", "NSpid").is_empty());
    }
}
