//! The node's processes as the kernel shows them: a /proc of the node's pid namespace
//! (`/proc/INIT/root/proc` on a local cluster, `/proc` on a real node). Nothing here keeps a
//! copy of process state; every answer is read from the kernel when asked.

use crate::error::{Error, Result};
use clan_core::{Gpid, NodeId};
use clan_proto::pb;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstatat, Mode};
use procfs_core::process::Stat;
use procfs_core::FromRead;
use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One node's /proc.
pub struct ProcView {
    pub node: NodeId,
    root: OwnedFd,
    /// The shepherd binary: a process that runs it (and is named for it) is a shepherd.
    shepherd_exe: PathBuf,
    /// Host pid of the namespace init (0: the host's own pid namespace).
    pub ns_init: u32,
    /// The node's pid namespace (`/proc/NS_INIT/ns/pid`'s link), read once: the init lives
    /// as long as the node's namespace does.
    ns_link: Option<PathBuf>,
    ticks_per_sec: u64,
    page_kb: u64,
    users: clan_core::NamedMutex<HashMap<u32, String>>,
    /// Processes' directories kept open, with the start time read through each
    /// ([`ProcView::dir_of`]): a handle and an identity, not a copy of any state.
    dirs: clan_core::NamedMutex<HashMap<u32, (Arc<OwnedFd>, u64)>>,
    /// Record files (`stat`, `status`, `statm`) opened in a kept directory, each with the
    /// reader who opened it ([`ProcView::read_kept_record`]): the last reader's of each.
    files: clan_core::NamedMutex<HashMap<(u32, &'static str), KeptFile>>,
    /// Reads of processes' memory maps in flight ([`MapReads`]).
    pub map_reads: MapReads,
}

/// Most process directories [`ProcView`] keeps open.
const DIRS_KEPT: usize = 256;

/// A record file a reader opened in a kept directory, and that reader.
type KeptFile = (crate::procfs::Reader, Arc<File>);

/// What set expressions test of one process, in the node's own numbers.
pub struct LocalAttrs {
    pub pgrp: u32,
    pub session: u32,
    pub uid: u32,
    pub job: u64,
    pub state: char,
    /// Parent in the node's numbers (0: outside the node's pid namespace).
    pub ppid: u32,
    pub start_ticks: u64,
    /// One of clan's shepherds (a process's session leader and parent on its node).
    pub shepherd: bool,
}

/// What `ps` shows of one process, before the job and managed flags are added.
pub struct RawProc {
    pub info: pb::ProcInfo,
}

impl ProcView {
    pub fn open(
        node: NodeId,
        path: PathBuf,
        ns_init: u32,
        shepherd_exe: PathBuf,
    ) -> std::io::Result<ProcView> {
        let f = File::options()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(&path)?;
        Ok(ProcView {
            node,
            root: OwnedFd::from(f),
            // As the kernel shows it in `exe`: without symbolic links.
            shepherd_exe: std::fs::canonicalize(&shepherd_exe).unwrap_or(shepherd_exe),
            ns_init,
            ns_link: (ns_init != 0)
                .then(|| std::fs::read_link(format!("/proc/{ns_init}/ns/pid")).ok())
                .flatten(),
            // SAFETY: sysconf has no preconditions.
            ticks_per_sec: unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64,
            // SAFETY: as above.
            page_kb: (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64) / 1024,
            users: clan_core::NamedMutex::new("users", HashMap::new()),
            dirs: clan_core::NamedMutex::new("proc.dirs", HashMap::new()),
            files: clan_core::NamedMutex::new("proc.files", HashMap::new()),
            map_reads: MapReads::new("proc.mapreads"),
        })
    }

    /// Whether host process `pid` is in the node's own pid namespace (any process is on a
    /// node without one).
    pub fn in_node_pid_ns(&self, pid: u32) -> bool {
        if self.ns_init == 0 {
            return true;
        }
        let theirs = std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
        theirs.is_some() && theirs.as_ref() == self.ns_link.as_ref()
    }

    fn open_at(&self, rel: &str) -> nix::Result<File> {
        let fd = openat(
            Some(self.root.as_raw_fd()),
            rel,
            OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        // SAFETY: openat just returned this descriptor and nothing else owns it.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// The signal masks (caught, ignored) of a process of the view, from its status.
    pub fn sig_masks(&self, pid: u32) -> Option<(u64, u64)> {
        let b = self.read_at(&format!("{pid}/status"), 8192)?;
        let text = String::from_utf8_lossy(&b);
        let mask = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        };
        Some((mask("SigCgt:")?, mask("SigIgn:")?))
    }

    /// Process `pid`'s `stat` line, in one read into `buf`.
    fn read_stat<'b>(&self, pid: u32, buf: &'b mut [u8]) -> Option<clan_core::sys::StatLine<'b>> {
        let n = self.open_at(&format!("{pid}/stat")).ok()?.read(buf).ok()?;
        clan_core::sys::StatLine::parse(&buf[..n])
    }

    fn read_at(&self, rel: &str, limit: usize) -> Option<Vec<u8>> {
        let mut f = self.open_at(rel).ok()?;
        // A page: one read for a stat or status (std then reads once more for the end).
        let mut buf = Vec::with_capacity(4096);
        f.by_ref().take(limit as u64).read_to_end(&mut buf).ok()?;
        Some(buf)
    }

    /// A file of the view, whole (up to `limit` bytes), with the kernel's error.
    pub fn read_file(&self, rel: &str, limit: u64) -> std::io::Result<Vec<u8>> {
        let mut f = self.open_at(rel).map_err(std::io::Error::from)?;
        let mut buf = Vec::with_capacity(4096);
        f.by_ref().take(limit).read_to_end(&mut buf)?;
        Ok(buf)
    }

    /// [`ProcView::read_file`] of a file the kernel makes in one go (`stat`, `status`,
    /// `statm`: one record of a seq_file): a read that does not fill the buffer has it all,
    /// so the read that would find the end is not made.
    pub fn read_record(&self, rel: &str, limit: u64) -> std::io::Result<Vec<u8>> {
        read_record_in(&self.root, rel, limit)
    }

    /// The kernel's mode, owner and group of an entry of the view (links not followed).
    pub fn stat_entry(&self, rel: &str) -> std::io::Result<(u32, u32, u32)> {
        let st = fstatat(
            Some(self.root.as_raw_fd()),
            rel,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(std::io::Error::from)?;
        Ok((st.st_mode, st.st_uid, st.st_gid))
    }

    /// What stat() following link `rel` (a descriptor's) gives, if the link leads to
    /// what `want` names (`pipe:[N]`, ...); `None` if it leads elsewhere now. The link is
    /// followed once, into a descriptor of our own (`O_PATH`: no file system is asked
    /// anything), which is checked and then looked at: a process that points the
    /// descriptor elsewhere meanwhile (`dup2` of a file of a hung mount) can not make
    /// the look wait on a file system.
    pub fn stat_link_to(
        &self,
        rel: &str,
        want: &[u8],
    ) -> std::io::Result<Option<nix::sys::stat::FileStat>> {
        use std::os::unix::ffi::OsStrExt;
        let fd = openat(
            Some(self.root.as_raw_fd()),
            rel,
            OFlag::O_PATH | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        // SAFETY: openat just returned this descriptor and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let at = nix::fcntl::readlink(format!("/proc/self/fd/{}", fd.as_raw_fd()).as_str())?;
        if at.as_bytes() != want {
            return Ok(None);
        }
        Ok(Some(nix::sys::stat::fstat(fd.as_raw_fd())?))
    }

    /// The target of a link of the view.
    pub fn readlink_entry(&self, rel: &str) -> std::io::Result<Vec<u8>> {
        use std::os::unix::ffi::OsStrExt;
        nix::fcntl::readlinkat(Some(self.root.as_raw_fd()), rel)
            .map(|t| t.as_bytes().to_vec())
            .map_err(std::io::Error::from)
    }

    /// The names in a directory of the view.
    pub fn list_entry(&self, rel: &str) -> std::io::Result<Vec<String>> {
        // Opened from the view's descriptor, not by its path: the path goes through the
        // node init's `root` link, which only root may follow (a reader acting as itself
        // may not).
        let mut dir = nix::dir::Dir::openat(
            Some(self.root.as_raw_fd()),
            if rel.is_empty() { "." } else { rel },
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let mut names = Vec::new();
        for e in dir.iter() {
            let name = e?.file_name().to_string_lossy().into_owned();
            if name != "." && name != ".." {
                names.push(name);
            }
        }
        Ok(names)
    }

    /// Local numbers of every process in the view.
    pub fn pids(&self) -> Vec<u32> {
        self.list_entry("")
            .unwrap_or_default()
            .iter()
            .filter_map(|n| n.parse::<u32>().ok())
            .collect()
    }

    pub fn user_name(&self, uid: u32) -> String {
        if let Some(name) = self.users.lock().get(&uid) {
            return name.clone();
        }
        // Looked up with the lock free: an NSS lookup can block (LDAP, sssd).
        let name = nix::unistd::User::from_uid(uid.into())
            .ok()
            .flatten()
            .map(|u| u.name)
            .unwrap_or_else(|| uid.to_string());
        self.users.lock().entry(uid).or_insert(name).clone()
    }

    /// Reads one process; `None` when it has gone meanwhile.
    pub fn read(&self, pid: u32) -> Option<RawProc> {
        let stat_bytes = self.read_at(&format!("{pid}/stat"), 4096)?;
        let stat = Stat::from_read(stat_bytes.as_slice()).ok()?;
        if is_shepherd(pid, stat.comm.as_bytes()) && self.runs_shepherd(pid) {
            return None;
        }
        let st = fstatat(
            Some(self.root.as_raw_fd()),
            pid.to_string().as_str(),
            nix::fcntl::AtFlags::empty(),
        )
        .ok()?;
        // A process whose memory map is busy shows as `[comm]`, as a kernel thread does.
        let cmdline = match self.map_reads.begin(pid) {
            Some(_reading) => self
                .read_at(&format!("{pid}/cmdline"), 4096)
                .unwrap_or_default(),
            None => Vec::new(),
        };
        let cmd = if cmdline.is_empty() {
            format!("[{}]", stat.comm)
        } else {
            let mut s: Vec<u8> = cmdline
                .iter()
                .map(|&b| if b == 0 { b' ' } else { b })
                .collect();
            while s.last() == Some(&b' ') {
                s.pop();
            }
            String::from_utf8_lossy(&s).into_owned()
        };
        let job = self
            .read_at(&format!("{pid}/cgroup"), 4096)
            .and_then(|c| job_of_cgroup(&String::from_utf8_lossy(&c)))
            .unwrap_or(0);
        let gpid = Gpid::new(self.node, pid)?;
        // A process clan started has its shepherd for parent: shown as none, as before.
        let ppid = u32::try_from(stat.ppid)
            .ok()
            .filter(|&p| !self.is_shepherd_pid(p))
            .and_then(|p| Gpid::new(self.node, p))
            .map(|g| g.raw())
            .unwrap_or(0);
        Some(RawProc {
            info: pb::ProcInfo {
                gpid: gpid.raw(),
                node: self.node.get(),
                uid: st.st_uid,
                user: self.user_name(st.st_uid),
                state: stat.state.to_string(),
                cpu_ms: (stat.utime + stat.stime) * 1000 / self.ticks_per_sec,
                rss_kb: stat.rss * self.page_kb,
                cmd,
                ppid,
                job,
                start_ticks: stat.starttime,
                managed: false,
                // Local numbers here; the node maps them to cluster ids (aliases).
                pgid: u64::try_from(stat.pgrp).unwrap_or(0),
                sid: u64::try_from(stat.session).unwrap_or(0),
            },
        })
    }

    /// The directory of process `pid` as kept (see [`ProcView::open_dir`]), and its start
    /// time: a file opened in it is that process's or fails (`ENOENT`/`ESRCH` once it has
    /// gone, even if another process has the pid now).
    pub fn dir_of(&self, pid: u32) -> Option<(Arc<OwnedFd>, u64)> {
        self.dirs.lock().get(&pid).cloned()
    }

    /// Opens the directory of process `pid`, reads its start time through it, and keeps
    /// both for [`ProcView::dir_of`] (at most `DIRS_KEPT`, 256; all are let go when full).
    /// Returns the start time; `None` once the process is gone.
    pub fn open_dir(&self, pid: u32) -> Option<u64> {
        let fd = openat(
            Some(self.root.as_raw_fd()),
            pid.to_string().as_str(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        // SAFETY: openat just returned this descriptor and nothing else owns it.
        let dir = unsafe { OwnedFd::from_raw_fd(fd) };
        let stat = read_record_in(&dir, "stat", 4096).ok()?;
        let start = Stat::from_read(stat.as_slice()).ok()?.starttime;
        let mut dirs = self.dirs.lock();
        if dirs.len() >= DIRS_KEPT {
            dirs.clear();
            self.files.lock().clear();
        } else {
            // Files of the directory this one replaces are another process's.
            self.forget_files(pid);
        }
        dirs.insert(pid, (Arc::new(dir), start));
        Some(start)
    }

    /// Lets the kept directory of `pid` go (its process has gone, or is not the one meant).
    pub fn forget_dir(&self, pid: u32) {
        let mut dirs = self.dirs.lock();
        dirs.remove(&pid);
        self.forget_files(pid);
    }

    fn forget_files(&self, pid: u32) {
        let mut files = self.files.lock();
        for f in crate::procfs::RECORDS {
            files.remove(&(pid, f));
        }
    }

    /// Who opened the kept record `file` of `pid`, if it is kept.
    #[cfg(test)]
    pub fn kept_file_reader(&self, pid: u32, file: &'static str) -> Option<crate::procfs::Reader> {
        self.files.lock().get(&(pid, file)).map(|(r, _)| r.clone())
    }

    /// Record `file` (`stat`, `status` or `statm`) of process `pid`, whose directory `dir`
    /// is kept ([`ProcView::dir_of`]), as `reader` reads it (the caller acts as them). The
    /// first read opens the file in `dir`, as a fresh read would, and keeps it for that
    /// reader; a read again by the same reader reads the kept file from its start, with
    /// no open: the kernel makes a record afresh for each read from offset 0, with the
    /// reader's rights at that moment (a `stat`'s addresses), and refuses it (`ESRCH`)
    /// once the process has gone. So a reader reads what it would with its own file held
    /// open, as a local tool may. Another reader opens its own (the kernel checks it may
    /// look in the directory: `hidepid`). A record longer than a page is read afresh.
    pub fn read_kept_record(
        &self,
        pid: u32,
        dir: &OwnedFd,
        file: &'static str,
        reader: &crate::procfs::Reader,
        limit: u64,
    ) -> std::io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let kept = self
            .files
            .lock()
            .get(&(pid, file))
            .filter(|(r, _)| r == reader)
            .map(|(_, f)| f.clone());
        if let Some(f) = kept {
            let buf = first_page(|b| f.read_at(b, 0))?;
            if buf.len() < PAGE {
                return Ok(buf);
            }
        }
        let (f, data) = read_record_file(dir, file, limit)?;
        if data.len() < PAGE {
            let mut files = self.files.lock();
            // As many as directories: no more descriptors than those.
            if files.len() < DIRS_KEPT || files.contains_key(&(pid, file)) {
                files.insert((pid, file), (reader.clone(), Arc::new(f)));
            }
        }
        Ok(data)
    }

    /// The start time of `pid` (clock ticks after boot, `stat` field 22); `None` once it
    /// is gone.
    pub fn start_ticks(&self, pid: u32) -> Option<u64> {
        let b = self.read_at(&format!("{pid}/stat"), 4096)?;
        Some(Stat::from_read(b.as_slice()).ok()?.starttime)
    }

    /// When `pid` is one of clan's shepherds, the process it started (its first child).
    pub fn shepherd_child(&self, pid: u32) -> Option<u32> {
        if !self.is_shepherd_pid(pid) {
            return None;
        }
        let b = self.read_at(&format!("{pid}/task/{pid}/children"), 4096)?;
        String::from_utf8_lossy(&b)
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    /// Whether `pid` is one of clan's shepherds (not part of what users see).
    pub fn is_shepherd_pid(&self, pid: u32) -> bool {
        let mut buf = [0u8; clan_core::sys::STAT_LINE_MAX];
        pid > 1
            && self
                .read_stat(pid, &mut buf)
                .is_some_and(|st| is_shepherd(pid, st.comm))
            && self.runs_shepherd(pid)
    }

    /// Whether process `pid` runs the shepherd binary (its `exe` link, cheaper to read than
    /// its `status`; a binary replaced since, by an upgrade, reads " (deleted)"): a user's
    /// process named `clan-shepherd` is not taken for a shepherd (and hidden), whatever it
    /// calls itself or whether it is dumpable.
    ///
    /// A reader that may not follow the link (the cluster /proc reads as its reader, and
    /// a shepherd is root's) is answered from what anyone can see: a process named
    /// `clan-shepherd` that root owns is one (only root can make a root process so named).
    fn runs_shepherd(&self, pid: u32) -> bool {
        use std::os::unix::ffi::OsStrExt;
        match nix::fcntl::readlinkat(Some(self.root.as_raw_fd()), format!("{pid}/exe").as_str()) {
            Ok(t) => {
                let t = t.as_bytes();
                t.strip_suffix(b" (deleted)").unwrap_or(t)
                    == self.shepherd_exe.as_os_str().as_bytes()
            }
            Err(nix::errno::Errno::EACCES | nix::errno::Errno::EPERM) => self
                .stat_entry(&pid.to_string())
                .is_ok_and(|(_, uid, _)| uid == 0),
            Err(_) => false,
        }
    }

    /// Group, session, owner and (when `job`) job of one process; `None` once it is gone,
    /// and for clan's own shepherds, which are not part of the node's processes to users.
    pub fn attrs(&self, pid: u32, job: bool) -> Option<LocalAttrs> {
        let a = self.attrs_raw(pid, job)?;
        (!a.shepherd).then_some(a)
    }

    /// [`ProcView::attrs`], shepherds included (the kernel's own view, for its rules).
    pub fn attrs_raw(&self, pid: u32, job: bool) -> Option<LocalAttrs> {
        let mut buf = [0u8; clan_core::sys::STAT_LINE_MAX];
        let stat = self.read_stat(pid, &mut buf)?;
        let st = fstatat(
            Some(self.root.as_raw_fd()),
            pid.to_string().as_str(),
            nix::fcntl::AtFlags::empty(),
        )
        .ok()?;
        let job = if job {
            self.read_at(&format!("{pid}/cgroup"), 4096)
                .and_then(|c| job_of_cgroup(&String::from_utf8_lossy(&c)))
                .unwrap_or(0)
        } else {
            0
        };
        Some(LocalAttrs {
            pgrp: stat.number(5).unwrap_or(0),
            session: stat.number(6).unwrap_or(0),
            uid: st.st_uid,
            job,
            state: stat.state()?,
            ppid: stat.number(4).unwrap_or(0),
            start_ticks: stat.number(22)?,
            shepherd: is_shepherd(pid, stat.comm) && self.runs_shepherd(pid),
        })
    }

    /// Every process matching `filter`.
    pub fn list(&self, filter: &pb::PsFilter) -> Vec<pb::ProcInfo> {
        let pids: Vec<u32> = if filter.gpids.is_empty() {
            self.pids()
        } else {
            filter
                .gpids
                .iter()
                .filter_map(|&g| Gpid::from_raw(g))
                .filter(|g| g.node() == self.node)
                .map(|g| g.local())
                .collect()
        };
        pids.into_iter()
            .filter_map(|p| self.read(p))
            .map(|r| r.info)
            .filter(|i| filter.job == 0 || i.job == filter.job)
            .filter(|i| !filter.has_uid || i.uid == filter.uid)
            .collect()
    }

    /// Opens `/proc/PID` of a process as a handle for pidfd_send_signal: the handle names
    /// exactly this process, so a pid reused after the check can not be hit.
    pub fn open_process(&self, gpid: Gpid) -> Result<ProcHandle> {
        let fd = openat(
            Some(self.root.as_raw_fd()),
            gpid.local().to_string().as_str(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|_| Error::NoSuchProcess(gpid))?;
        // SAFETY: openat just returned this descriptor and nothing else owns it.
        let dir = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(ProcHandle { gpid, dir })
    }

    /// One pass over the node's processes for a heartbeat's samplers (the load, the
    /// group aliases): each process's `stat`, in one read, of which the few fields they use
    /// are taken.
    fn scan(&self) -> Vec<Scanned> {
        let mut buf = [0u8; clan_core::sys::STAT_LINE_MAX];
        self.pids()
            .into_iter()
            .filter_map(|pid| {
                let line = self.read_stat(pid, &mut buf)?;
                Some(Scanned {
                    state: line.state()?,
                    shepherd: is_shepherd(pid, line.comm) && self.runs_shepherd(pid),
                    rss_kb: line.number::<u64>(24).unwrap_or(0) * self.page_kb,
                    pgrp: line.number(5).unwrap_or(0),
                    session: line.number(6).unwrap_or(0),
                })
            })
            .collect()
    }
}

/// What a heartbeat's scan ([`TickScan`]) keeps of a process.
#[derive(Debug, Clone, Copy)]
pub struct Scanned {
    pub state: char,
    /// One of clan's shepherds (see [`ProcView::attrs`]).
    pub shepherd: bool,
    pub rss_kb: u64,
    pub pgrp: u32,
    pub session: u32,
}

/// A heartbeat's scan of the node's processes, made when first asked for and shared by
/// the samplers that need it (none does on a node whose load comes from its own
/// `/proc/loadavg` and that has no group aliases).
pub struct TickScan<'a> {
    view: &'a ProcView,
    done: std::cell::OnceCell<Vec<Scanned>>,
}

impl<'a> TickScan<'a> {
    pub fn new(view: &'a ProcView) -> TickScan<'a> {
        TickScan {
            view,
            done: std::cell::OnceCell::new(),
        }
    }

    pub fn get(&self) -> &[Scanned] {
        self.done.get_or_init(|| self.view.scan())
    }
}

/// An open `/proc/PID` directory.
pub struct ProcHandle {
    pub gpid: Gpid,
    pub dir: OwnedFd,
}

/// Real, effective and saved uid of a process, from its status file.
#[derive(Debug, Clone, Copy)]
pub struct Uids {
    pub real: u32,
    pub effective: u32,
    pub saved: u32,
}

impl ProcHandle {
    pub fn uids(&self) -> Result<Uids> {
        let fd = openat(
            Some(self.dir.as_raw_fd()),
            "status",
            OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|_| Error::NoSuchProcess(self.gpid))?;
        // SAFETY: fresh descriptor from openat, owned by this File only.
        let mut f = unsafe { File::from_raw_fd(fd) };
        // One read: the kernel renders the whole file for each read call it serves.
        let mut buf = vec![0u8; 8192];
        let n = f
            .read(&mut buf)
            .map_err(|_| Error::NoSuchProcess(self.gpid))?;
        let s = String::from_utf8_lossy(&buf[..n]);
        let line = s
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .ok_or(Error::NoSuchProcess(self.gpid))?;
        let v: Vec<u32> = line
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        if v.len() < 3 {
            return Err(Error::NoSuchProcess(self.gpid));
        }
        Ok(Uids {
            real: v[0],
            effective: v[1],
            saved: v[2],
        })
    }
}

/// The job of a process from its cgroup v2 path (`0::/.../job1000003`).
/// clan's shepherds run as `clan-shepherd run` inside the node (pid 1 is the node's init,
/// which users do see).
/// Reads of a file that waits on its process's memory map (`cmdline`, `environ`, `maps`,
/// ...: the kernel takes the map's lock, which a process stuck in a page fault, say on a
/// hung NFS or FUSE file, can hold for as long as that lasts), in flight per process.
/// Such a read can not be timed out or cancelled: the thread making it waits. So once a
/// read of a process has been in flight for [`MAP_BUSY_AFTER`], no other is begun (the
/// caller shows what needs no such read, or says the map is busy) until it is over: a
/// stuck process holds one thread of the daemon, not one per request about it.
pub struct MapReads(clan_core::NamedMutex<HashMap<u32, Vec<(u64, Instant)>>>);

/// How long a read of a process's memory map may have been in flight before others about
/// that process are not begun ([`MapReads`]).
pub const MAP_BUSY_AFTER: Duration = Duration::from_millis(100);

/// A read begun by [`MapReads::begin`]; over when dropped.
pub struct MapRead<'a>(&'a MapReads, u32, u64);

impl MapReads {
    pub fn new(name: &'static str) -> MapReads {
        MapReads(clan_core::NamedMutex::new(name, HashMap::new()))
    }

    /// Begins a read of `pid`'s memory map; `None` while one begun over
    /// [`MAP_BUSY_AFTER`] ago is still in flight.
    pub fn begin(&self, pid: u32) -> Option<MapRead<'_>> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let mut m = self.0.lock();
        let reads = m.entry(pid).or_default();
        if reads.iter().any(|(_, at)| at.elapsed() > MAP_BUSY_AFTER) {
            return None;
        }
        let token = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        reads.push((token, Instant::now()));
        Some(MapRead(self, pid, token))
    }
}

impl Drop for MapRead<'_> {
    fn drop(&mut self) {
        let mut m = self.0 .0.lock();
        if let Some(reads) = m.get_mut(&self.1) {
            reads.retain(|(t, _)| *t != self.2);
            if reads.is_empty() {
                m.remove(&self.1);
            }
        }
    }
}

/// [`ProcView::read_record`] of `rel` under directory `dir`.
pub fn read_record_in(dir: &OwnedFd, rel: &str, limit: u64) -> std::io::Result<Vec<u8>> {
    read_record_file(dir, rel, limit).map(|(_, data)| data)
}

/// [`read_record_in`], and the file it opened.
fn read_record_file(dir: &OwnedFd, rel: &str, limit: u64) -> std::io::Result<(File, Vec<u8>)> {
    let fd = openat(
        Some(dir.as_raw_fd()),
        rel,
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    // SAFETY: openat just returned this descriptor and nothing else owns it.
    let mut f = unsafe { File::from_raw_fd(fd) };
    let mut buf = first_page(|b| f.read(b))?;
    if buf.len() == PAGE {
        f.by_ref()
            .take(limit.saturating_sub(PAGE as u64))
            .read_to_end(&mut buf)?;
    }
    Ok((f, buf))
}

/// What one read (`read`, or `pread` at 0) gives of a record: at most a page, all of it
/// when shorter (the kernel makes a record in one go).
const PAGE: usize = 4096;

/// One read of at most [`PAGE`] bytes, again if a signal interrupted it.
fn first_page(
    mut read: impl FnMut(&mut [u8]) -> std::io::Result<usize>,
) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; PAGE];
    let n = loop {
        match read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => break r?,
        }
    };
    buf.truncate(n);
    Ok(buf)
}

fn is_shepherd(pid: u32, comm: &[u8]) -> bool {
    pid != 1 && comm == b"clan-shepherd"
}

pub fn job_of_cgroup(text: &str) -> Option<u64> {
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    path.split('/')
        .find_map(|c| c.strip_prefix("job")?.parse().ok())
}

use std::os::unix::fs::OpenOptionsExt;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_of_a_busy_memory_map_is_not_begun_again() {
        let reads = MapReads::new("test.mapreads");
        // Reads in flight together, none for long: all begin.
        let a = reads.begin(7).expect("first");
        let b = reads.begin(7).expect("second, at once");
        drop(b);
        // One in flight for longer than MAP_BUSY_AFTER (made so: no sleep).
        reads.0.lock().get_mut(&7).unwrap()[0].1 =
            Instant::now() - MAP_BUSY_AFTER - Duration::from_millis(1);
        assert!(reads.begin(7).is_none());
        assert!(reads.begin(8).is_some(), "another process is not busy");
        // Over: the next read begins.
        drop(a);
        assert!(reads.0.lock().get(&7).is_none());
        assert!(reads.begin(7).is_some());
        // Overlapping reads: the age is that of each read, not of the first of a chain.
        let c = reads.begin(9).unwrap();
        let _d = reads.begin(9).unwrap();
        reads.0.lock().get_mut(&9).unwrap()[0].1 =
            Instant::now() - MAP_BUSY_AFTER - Duration::from_millis(1);
        drop(c);
        assert!(reads.begin(9).is_some(), "the read in flight is young");
    }

    #[test]
    fn job_from_cgroup_path() {
        assert_eq!(
            job_of_cgroup("0::/clan.t/node1/job1000003\n"),
            Some(1000003)
        );
        assert_eq!(job_of_cgroup("0::/clan.t/node1/shepherds\n"), None);
        assert_eq!(job_of_cgroup("garbage"), None);
    }

    #[test]
    fn reads_this_process_from_the_host_view() {
        let v = ProcView::open(NodeId::new(1).unwrap(), "/proc".into(), 0, PathBuf::new()).unwrap();
        let me = std::process::id();
        let p = v.read(me).unwrap();
        assert_eq!(p.info.gpid, 10_000_000 + u64::from(me));
        assert!(v.pids().contains(&me));
        let h = v
            .open_process(Gpid::new(NodeId::new(1).unwrap(), me).unwrap())
            .unwrap();
        assert_eq!(h.uids().unwrap().real, nix::unistd::getuid().as_raw());
    }
}
