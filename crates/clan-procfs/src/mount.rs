//! Mounting and serving the view: checks of the mount point, the watcher that removes the
//! mount when the server dies, readiness, and a clean unmount on SIGTERM, SIGINT, SIGHUP.
//!
//! The watcher is a child forked before any thread exists. It holds the read end of a pipe
//! whose write end only the server has (close-on-exec, so no helper the server starts
//! keeps it). When the server dies, however it dies, the pipe reaches EOF and the watcher
//! detaches the mount it was told about (`umount2(MNT_DETACH)` as root, `fusermount3 -u
//! -z` otherwise), so no dead mount ("transport endpoint is not connected") is left.

use crate::fs::ProcFs;
use crate::mountinfo;
use crate::source::Cland;
use crate::view::{Options, View};
use clan_core::{ExitCode as X, NodeId};
use fuser::{Config, MountOption, Session, SessionACL};
use nix::sys::signal::{SigSet, Signal};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What the server needs to know.
#[derive(Debug)]
pub struct ServeOptions {
    pub mountpoint: PathBuf,
    pub cluster_dir: PathBuf,
    pub node: NodeId,
    /// Told `ready` (or `error CODE MESSAGE`) once, then closed.
    pub ready: Vec<OwnedFd>,
    /// How long one request to cland may take before the reader gets EIO.
    pub timeout: Duration,
    /// FUSE event-loop threads.
    pub threads: usize,
    /// Threads per CPU serving FUSE over io_uring when the kernel offers it
    /// (`/sys/module/fuse/parameters/enable_uring`), each pinned to its CPU with a ring
    /// of its own; 0: `/dev/fuse` only.
    pub uring_threads: usize,
    /// Mount in the mount namespace of this process (a local-cluster node's init) rather
    /// than ours; the server itself stays in the host's namespaces, where FUSE reports its
    /// callers' pids and its /proc shows them.
    pub mount_ns: Option<u32>,
    /// Where the node's clan shells have its real procfs (`self` points there for them).
    pub node_proc: Option<PathBuf>,
    /// The node's view for `clan shell`s: mounted on a base kept under it (see
    /// `ensure_base`), through which a restarted server's view reaches running shells.
    pub for_shells: bool,
}

/// Why the view could not be mounted.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("{0}: no such directory")]
    Missing(PathBuf),
    #[error("{0}: not a directory")]
    NotDir(PathBuf),
    #[error("{0} is already a mount point")]
    Mounted(PathBuf),
    #[error("mount {0}: permission denied ({1})")]
    Permission(PathBuf, String),
    #[error("{0}")]
    NoDaemon(String),
    #[error("{0}")]
    Other(String),
}

impl MountError {
    /// The documented exit code (docs/proc.md).
    pub fn exit_code(&self) -> u8 {
        match self {
            MountError::Missing(_) | MountError::NotDir(_) => X::NOT_FOUND,
            MountError::Mounted(_) => X::FAILURE,
            MountError::Permission(..) => X::PERMISSION,
            MountError::NoDaemon(_) => X::NO_DAEMON,
            MountError::Other(_) => X::FAILURE,
        }
    }
}

/// Checks that `dir` is a directory that nothing is mounted on; returns its canonical
/// path. A dead view there (its server and its watcher both killed) is detached first,
/// as cland replaces its own.
pub fn check_mountpoint(dir: &Path) -> Result<PathBuf, MountError> {
    if let Ok(abs) = std::path::absolute(dir) {
        clear_dead_view(&abs, Path::new("/proc/self/mountinfo"))
            .map_err(|_| MountError::Mounted(dir.to_path_buf()))?;
    }
    let canon = check_dir(dir)?;
    if mountinfo::top_at(&mountinfo::read(), &canon).is_some() {
        return Err(MountError::Mounted(dir.to_path_buf()));
    }
    Ok(canon)
}

/// Checks that `dir` is a directory; returns its canonical path.
fn check_dir(dir: &Path) -> Result<PathBuf, MountError> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(MountError::NotDir(dir.to_path_buf())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(MountError::Missing(dir.to_path_buf()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(MountError::Permission(dir.to_path_buf(), e.to_string()))
        }
        Err(e) => return Err(MountError::Other(format!("{}: {e}", dir.display()))),
    }
    dir.canonicalize()
        .map_err(|e| MountError::Other(format!("{}: {e}", dir.display())))
}

/// Detaches a dead view (an earlier server's, answering ENOTCONN) on top at `point`, as
/// `mountinfo` lists the mounts of its namespace; a live one is an error.
fn clear_dead_view(point: &Path, mountinfo_path: &Path) -> Result<(), String> {
    let top = mountinfo::top_at(&mountinfo::read_from(mountinfo_path), point);
    if top.as_ref().is_some_and(mountinfo::Mount::is_cluster_proc) {
        match std::fs::metadata(point) {
            Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
                let _ = detach(point);
            }
            _ => return Err(format!("{} already has a live view", point.display())),
        }
    }
    Ok(())
}

/// Makes the base of a node's view for `clan shell`s at `point` (a view server's mount
/// point in the node's mount namespace, as `mountinfo` lists it): `point` bound onto
/// itself and shared, under the view, kept when the view goes. A shell's /proc is a bind
/// of the base (a slave of it) with the view of the moment on top (`clan-shepherd`'s
/// `cluster_proc`): the view's unmount (the watcher's, after a crash) reaches the shell's
/// copy of it, and the next server's view, mounted on the base, reaches the shell's /proc.
/// Called with nothing or the base at `point`.
fn ensure_base(point: &Path, mountinfo_path: &Path) -> Result<(), String> {
    use nix::mount::{mount, MsFlags};
    if mountinfo::top_at(&mountinfo::read_from(mountinfo_path), point).is_none() {
        mount(
            Some(point),
            point,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| format!("bind {} onto itself: {e}", point.display()))?;
    }
    mount(
        None::<&str>,
        point,
        None::<&str>,
        MsFlags::MS_SHARED,
        None::<&str>,
    )
    .map_err(|e| format!("make {} a shared mount: {e}", point.display()))
}

/// Detaches the mount at `point` (lazily: readers inside it keep what they have open).
pub fn detach(point: &Path) -> std::io::Result<()> {
    if nix::unistd::geteuid().is_root() {
        return nix::mount::umount2(point, nix::mount::MntFlags::MNT_DETACH)
            .map_err(std::io::Error::from);
    }
    let mut last = std::io::Error::other("fusermount3 not found");
    for bin in ["fusermount3", "fusermount"] {
        match std::process::Command::new(bin)
            .args(["-u", "-q", "-z", "--"])
            .arg(point)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
        {
            Ok(s) if s.success() => return Ok(()),
            Ok(s) => last = std::io::Error::other(format!("{bin} -u -z: {s}")),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Unmounts the cluster /proc at `point`: a plain unmount, lazily if it is busy.
pub fn unmount(point: &Path) -> std::io::Result<()> {
    if nix::unistd::geteuid().is_root() {
        return match nix::mount::umount(point) {
            Ok(()) => Ok(()),
            Err(nix::errno::Errno::EBUSY) => detach(point),
            Err(e) => Err(e.into()),
        };
    }
    for bin in ["fusermount3", "fusermount"] {
        if let Ok(s) = std::process::Command::new(bin)
            .args(["-u", "-q", "--"])
            .arg(point)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
        {
            if s.success() {
                return Ok(());
            }
        }
    }
    detach(point)
}

/// Tells the readiness fds how the mount went, then closes them.
pub fn tell(ready: &mut Vec<OwnedFd>, outcome: Result<(), &MountError>) {
    let line = match outcome {
        Ok(()) => "ready\n".to_string(),
        Err(e) => format!(
            "error {} {}\n",
            e.exit_code(),
            e.to_string().replace('\n', " ")
        ),
    };
    for fd in ready.drain(..) {
        let mut f = std::fs::File::from(fd);
        let _ = f.write_all(line.as_bytes());
    }
}

/// Forks the watcher of the mount at `point`; returns the write end of its pipe, which
/// the caller must keep for as long as it serves. Call while the process has one thread.
fn spawn_watcher(point: &Path) -> Result<OwnedFd, MountError> {
    let (rd, wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| MountError::Other(format!("pipe: {e}")))?;
    let before = mountinfo::top_at(&mountinfo::read(), point).map(|m| m.id);
    let args = arg_area();
    // SAFETY: called before any thread is started (checked by the callers' order: the
    // runtime and the FUSE loops come after), so the child may do anything.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            drop(wr);
            watch(rd, point, before, Path::new("/proc/self/mountinfo"), args);
        }
        Ok(nix::unistd::ForkResult::Parent { .. }) => Ok(wr),
        Err(e) => Err(MountError::Other(format!("fork the watcher: {e}"))),
    }
}

/// The watcher's life: wait for EOF, then detach the mount the server made, if it is
/// still there. Never returns.
/// `mountinfo`: where the watcher's mount namespace lists its mounts; `args`: its
/// argument area ([`arg_area`], read before it left the server's namespaces).
fn watch(
    rd: OwnedFd,
    point: &Path,
    before: Option<u64>,
    mountinfo_path: &Path,
    args: Option<(usize, usize)>,
) -> ! {
    use nix::sys::signal::{signal, SigHandler};
    for s in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGPIPE,
    ] {
        // SAFETY: SIG_IGN installs no handler code.
        let _ = unsafe { signal(s, SigHandler::SigIgn) };
    }
    let _ = nix::sys::signal::sigprocmask(
        nix::sys::signal::SigmaskHow::SIG_SETMASK,
        Some(&SigSet::empty()),
        None,
    );
    let _ = std::env::set_current_dir("/");
    // A name and a command line without "clan-procfs": `pkill [-f] clan-procfs`, `killall
    // clan-procfs` end the server and leave its watcher to clean up after it.
    let _ = nix::sys::prctl::set_name(c"clan-view-watch");
    if let Some(area) = args {
        set_cmdline(area, &format!("clan-view-watch {}", point.display()));
    }
    // Keep only stdio and the pipe: a readiness fd kept open here would make whoever
    // waits for its EOF wait for the watcher.
    let keep = rd.as_raw_fd() as u32;
    // SAFETY: close_range only closes descriptors of this single-threaded child; the one
    // owned Rust object here that holds one (`rd`) is kept.
    unsafe {
        if keep > 3 {
            libc::syscall(libc::SYS_close_range, 3u32, keep - 1, 0u32);
        }
        libc::syscall(libc::SYS_close_range, keep + 1, u32::MAX, 0u32);
    }
    let mut pipe = std::fs::File::from(rd);
    let mut ours: Option<u64> = None;
    let mut b = [0u8; 1];
    loop {
        match pipe.read(&mut b) {
            Ok(0) => break,
            Ok(_) if b[0] == b'M' => {
                ours = mountinfo::top_at(&mountinfo::read_from(mountinfo_path), point)
                    .filter(mountinfo::Mount::is_cluster_proc)
                    .map(|m| m.id);
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let top = mountinfo::top_at(&mountinfo::read_from(mountinfo_path), point);
    let dead = match (top, ours) {
        (Some(t), Some(id)) => t.id == id,
        // The server died between mounting and telling: the new view on top is its.
        (Some(t), None) => t.is_cluster_proc() && Some(t.id) != before,
        (None, _) => false,
    };
    if dead {
        let _ = detach(point);
    }
    // SAFETY: _exit ends the process without running the parent's atexit handlers.
    unsafe { libc::_exit(0) }
}

/// Where this process's arguments are in its memory (`arg_start` and `arg_end` of
/// /proc/self/stat). A forked child has them at the same addresses.
fn arg_area() -> Option<(usize, usize)> {
    use procfs_core::FromRead;
    let stat = procfs_core::process::Stat::from_file("/proc/self/stat").ok()?;
    let (start, end) = (stat.arg_start? as usize, stat.arg_end? as usize);
    (start != 0 && end > start).then_some((start, end))
}

/// Writes `title` over this process's arguments (`area`, from [`arg_area`]), as
/// setproctitle(3) does, cut to their length: what /proc/PID/cmdline (ps, pkill -f)
/// shows from then on. For the forked watcher only, which reads its arguments no more.
fn set_cmdline((start, end): (usize, usize), title: &str) {
    // SAFETY: [start, end) is this process's argument area (the kernel said so), mapped
    // and writable on its stack; nothing in this single-threaded child refers to it.
    let area = unsafe { std::slice::from_raw_parts_mut(start as *mut u8, end - start) };
    let n = title.len().min(area.len() - 1);
    area[..n].copy_from_slice(&title.as_bytes()[..n]);
    area[n..].fill(0);
}

fn mount_error(point: &Path, e: std::io::Error) -> MountError {
    let fuse_dev = nix::unistd::access(
        "/dev/fuse",
        nix::unistd::AccessFlags::R_OK | nix::unistd::AccessFlags::W_OK,
    );
    if !nix::unistd::geteuid().is_root() && fuse_dev.is_err() {
        return MountError::Permission(
            point.to_path_buf(),
            "/dev/fuse is not accessible to this user: ask root to mount it".into(),
        );
    }
    if e.kind() == std::io::ErrorKind::PermissionDenied
        || matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES))
        || e.to_string().contains("ermission")
    {
        MountError::Permission(point.to_path_buf(), e.to_string())
    } else {
        MountError::Other(format!("mount {}: {e}", point.display()))
    }
}

/// Mounts the view at `o.mountpoint` and serves it until it is unmounted or a signal
/// asks to stop (then it unmounts). Must be called while the process has one thread.
pub fn serve(mut o: ServeOptions) -> Result<(), MountError> {
    let r = serve_inner(&mut o);
    if let Err(e) = &r {
        tell(&mut o.ready, Err(e));
    }
    r
}

/// The mounts of a node's namespace, read from inside it: our /proc/self is not in the
/// node's procfs, its init (pid 1 there) is in the namespace.
const NODE_MOUNTINFO: &str = "/proc/1/mountinfo";

/// Opens /dev/fuse and forks a child that enters the mount namespace of process `ns_pid`,
/// mounts the connection at `point` there (replacing the dead view of an earlier server;
/// on the base of [`ensure_base`] with `base`), reports, closes its copy of the connection
/// and becomes the mount's watcher (as `spawn_watcher`'s). Returns the watcher's pipe, the
/// connection to serve with `Session::from_fd`, and the watcher's pid (its mountinfo is the
/// namespace's). Call while the process has one thread.
fn mount_in_ns(
    ns_pid: u32,
    point: &Path,
    base: bool,
) -> Result<(OwnedFd, OwnedFd, u32), MountError> {
    use nix::fcntl::OFlag;
    let other = |what: &str, e: &dyn std::fmt::Display| MountError::Other(format!("{what}: {e}"));
    let fuse: OwnedFd = std::fs::File::options()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| mount_error(point, e))?
        .into();
    let ns = std::fs::File::open(format!("/proc/{ns_pid}/ns/mnt"))
        .map_err(|e| other(&format!("the mount namespace of process {ns_pid}"), &e))?;
    let (rd, wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| other("pipe", &e))?;
    let (res_rd, res_wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| other("pipe", &e))?;
    let args = arg_area();
    // SAFETY: called before any thread is started (serve_inner's order), so the child may
    // do anything.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            drop(wr);
            drop(res_rd);
            let mut report = std::fs::File::from(res_wr);
            let mounted = (|| -> Result<Option<u64>, String> {
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNS)
                    .map_err(|e| format!("enter the mount namespace of {ns_pid}: {e}"))?;
                let _ = std::env::set_current_dir("/");
                // A dead server's view answers ENOTCONN: replace it; a live one stays.
                clear_dead_view(point, Path::new(NODE_MOUNTINFO))?;
                if !point.is_dir() {
                    return Err(format!("{} is not a directory there", point.display()));
                }
                if base {
                    ensure_base(point, Path::new(NODE_MOUNTINFO))?;
                }
                let before =
                    mountinfo::top_at(&mountinfo::read_from(Path::new(NODE_MOUNTINFO)), point)
                        .map(|m| m.id);
                let opts = format!(
                    "fd={},rootmode=40000,user_id=0,group_id=0,allow_other",
                    fuse.as_raw_fd()
                );
                use nix::mount::MsFlags as F;
                nix::mount::mount(
                    Some(mountinfo::SOURCE),
                    point,
                    Some(format!("fuse.{}", mountinfo::SOURCE).as_str()),
                    F::MS_RDONLY | F::MS_NOSUID | F::MS_NODEV | F::MS_NOEXEC,
                    Some(opts.as_str()),
                )
                .map_err(|e| format!("mount {}: {e}", point.display()))?;
                Ok(before)
            })();
            // The connection is the server's alone: its death must abort it.
            drop(fuse);
            match mounted {
                Ok(before) => {
                    let _ = report.write_all(b"ok");
                    drop(report);
                    watch(rd, point, before, Path::new(NODE_MOUNTINFO), args);
                }
                Err(e) => {
                    let _ = report.write_all(e.as_bytes());
                    // SAFETY: _exit ends the child without the parent's atexit handlers.
                    unsafe { libc::_exit(1) }
                }
            }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            drop(rd);
            drop(res_wr);
            let mut said = String::new();
            let _ = std::fs::File::from(res_rd).read_to_string(&mut said);
            if said != "ok" {
                let _ = nix::sys::wait::waitpid(child, None);
                return Err(MountError::Other(if said.is_empty() {
                    "the mounting child died".into()
                } else {
                    said
                }));
            }
            Ok((wr, fuse, child.as_raw() as u32))
        }
        Err(e) => Err(other("fork the mounting child", &e)),
    }
}

fn serve_inner(o: &mut ServeOptions) -> Result<(), MountError> {
    let (point, watcher, ns_mount) = match o.mount_ns {
        None if o.for_shells => {
            // A real node's view: in our own namespace, on its base.
            let own = Path::new("/proc/self/mountinfo");
            clear_dead_view(&o.mountpoint, own)
                .map_err(|_| MountError::Mounted(o.mountpoint.clone()))?;
            let point = check_dir(&o.mountpoint)?;
            if mountinfo::top_at(&mountinfo::read(), &point)
                .as_ref()
                .is_some_and(mountinfo::Mount::is_cluster_proc)
            {
                return Err(MountError::Mounted(o.mountpoint.clone()));
            }
            ensure_base(&point, own).map_err(MountError::Other)?;
            let w = spawn_watcher(&point)?;
            (point, w, None)
        }
        None => {
            let point = check_mountpoint(&o.mountpoint)?;
            let w = spawn_watcher(&point)?;
            (point, w, None)
        }
        Some(pid) => {
            let point = o.mountpoint.clone();
            let (w, fuse, watcher) = mount_in_ns(pid, &point, o.for_shells)?;
            (point, w, Some((fuse, watcher)))
        }
    };
    // Where the mount's namespace lists its mounts.
    let mountinfo_path = match &ns_mount {
        Some((_, watcher)) => PathBuf::from(format!("/proc/{watcher}/mountinfo")),
        None => PathBuf::from("/proc/self/mountinfo"),
    };
    // Signals go to one thread that waits for them; every thread started from here on
    // inherits the mask.
    let mut stop = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        stop.add(s);
    }
    stop.thread_block()
        .map_err(|e| MountError::Other(format!("block signals: {e}")))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("clan-procfs")
        .enable_all()
        .build()
        .map_err(|e| MountError::Other(format!("runtime: {e}")))?;
    let socket = clan_client::socket_path(&o.cluster_dir, o.node);
    let cland = Cland::new(socket, o.node, 4, o.timeout);
    rt.block_on(cland.check())
        .map_err(|e| MountError::NoDaemon(e.to_string()))?;
    let root = nix::unistd::geteuid().is_root();
    let mut opts = Options::new(o.cluster_dir.clone(), o.node.get());
    opts.node_proc = o.node_proc.clone();
    let view = View::new(cland, opts);
    let fs = ProcFs::new(view, rt.handle().clone());
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(mountinfo::SOURCE.into()),
        MountOption::Subtype(mountinfo::SOURCE.into()),
        MountOption::RO,
        MountOption::NoSuid,
        MountOption::NoDev,
        MountOption::NoExec,
    ];
    config.acl = if root {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(o.threads.max(1));
    config.uring_threads_per_cpu = o.uring_threads;
    // The watcher of a mount made in another namespace (`--mount-ns`): the session has
    // no mount of its own to unmount there (`Session::from_fd`), so a stop ends the
    // server and its watcher detaches the view in that namespace.
    let ns_watcher = ns_mount.as_ref().map(|(_, pid)| *pid);
    let mut session = match ns_mount {
        None => Session::new(fs, &point, &config).map_err(|e| mount_error(&point, e))?,
        Some((fuse, _)) => {
            let acl = config.acl;
            Session::from_fd(fs, fuse, acl, config)
                .map_err(|e| MountError::Other(format!("serve {}: {e}", point.display())))?
        }
    };
    let mut w = std::fs::File::from(watcher);
    let _ = w.write_all(b"M");
    // The watcher's pipe, closed by a stop of a server whose mount is elsewhere.
    let pipe = std::sync::Arc::new(parking_lot::Mutex::new(Some(w)));
    tracing::info!(mountpoint = %point.display(), node = %o.node, "cluster /proc mounted");
    tell(&mut o.ready, Ok(()));
    let ours = mountinfo::top_at(&mountinfo::read_from(&mountinfo_path), &point).map(|m| m.id);
    std::thread::Builder::new()
        .name("clan-procfs-mnt".into())
        .spawn(move || end_when_unmounted(ours, &mountinfo_path))
        .map_err(|e| MountError::Other(format!("mount watch thread: {e}")))?;
    let mut unmounter = session.unmount_callable();
    let at = point.clone();
    let stop_pipe = pipe.clone();
    std::thread::Builder::new()
        .name("clan-procfs-sig".into())
        .spawn(move || {
            let mut first = true;
            while let Ok(sig) = stop.wait() {
                if !first {
                    // Asked twice: stop at once; the watcher detaches the mount.
                    std::process::exit(128 + sig as i32);
                }
                first = false;
                tracing::info!(signal = ?sig, "unmounting");
                match ns_watcher {
                    Some(watcher) => stop_through_watcher(&stop_pipe, watcher),
                    None => {
                        if unmounter.unmount().is_err() {
                            let _ = detach(&at);
                        }
                    }
                }
            }
        })
        .map_err(|e| MountError::Other(format!("signal thread: {e}")))?;
    let r = session.run();
    drop(pipe.lock().take());
    // A passed-through read may still block (a reader of /proc/kmsg): do not wait for it.
    rt.shutdown_timeout(Duration::from_millis(200));
    r.map_err(|e| MountError::Other(format!("serving {}: {e}", point.display())))
}

/// Stops a server whose mount is in another namespace (`--mount-ns`): closes the
/// watcher's pipe, so that the watcher detaches the view there (its EOF, as when the
/// server dies), waits for it to have done so, and ends the server. On another thread,
/// so that a second signal still ends the server at once.
fn stop_through_watcher(pipe: &parking_lot::Mutex<Option<std::fs::File>>, watcher: u32) {
    drop(pipe.lock().take());
    let waiting = std::thread::Builder::new()
        .name("clan-procfs-stop".into())
        .spawn(move || {
            let pid = nix::unistd::Pid::from_raw(watcher as i32);
            while let Err(nix::errno::Errno::EINTR) = nix::sys::wait::waitpid(pid, None) {}
            tracing::info!("the view is detached: ending");
            std::process::exit(0);
        });
    if waiting.is_err() {
        std::process::exit(0);
    }
}

/// Ends the server once its mount (`id`) is gone from its mount namespace, however it
/// went (`clan proc umount`, umount, a signal): copies of the mount in namespaces made
/// while it was there would otherwise keep it serving. Waits on mountinfo's change
/// notification (POLLPRI), no polling.
fn end_when_unmounted(id: Option<u64>, mountinfo_path: &Path) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let Some(id) = id else { return };
    let Ok(f) = std::fs::File::open(mountinfo_path) else {
        return;
    };
    let gone = || {
        !mountinfo::read_from(mountinfo_path)
            .iter()
            .any(|m| m.id == id)
    };
    loop {
        let mut fds = [PollFd::new(
            std::os::fd::AsFd::as_fd(&f),
            PollFlags::POLLPRI,
        )];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return,
        }
        // Reading the file again re-arms the notification.
        let mut sink = Vec::new();
        let _ = (&f).read_to_end(&mut sink);
        let _ = std::io::Seek::seek(&mut (&f), std::io::SeekFrom::Start(0));
        if gone() {
            tracing::info!("unmounted: ending");
            std::process::exit(0);
        }
    }
}

/// An fd number given on the command line, as an owned fd; `None` when it is not open.
pub fn fd_from_number(n: i32) -> Option<OwnedFd> {
    if n < 0 || nix::fcntl::fcntl(n, nix::fcntl::FcntlArg::F_GETFD).is_err() {
        return None;
    }
    // Close-on-exec: no helper the server starts should keep the caller waiting.
    let _ = nix::fcntl::fcntl(
        n,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    );
    // SAFETY: the fd is open (F_GETFD succeeded) and was handed to this process for this
    // purpose only; nothing else owns it.
    Some(unsafe { OwnedFd::from_raw_fd(n) })
}
