//! What the new process does between fork and exec: enter the node's namespaces and cgroup,
//! take its stdio, become the caller (groups, gid, uid, never more), and exec the command
//! along PATH as a shell would. Failures travel back through a close-on-exec pipe as
//! `errno:message`, so the caller gets 127 for "not found" and 126 for "not executable".

use nix::errno::Errno;
use nix::sched::{setns, CloneFlags};
use nix::sys::signal::{sigprocmask, SigSet, SigmaskHow};
use nix::unistd::{
    dup2, execve, getpgrp, setgid, setgroups, setpgid, setuid, tcsetpgrp, Gid, Pid, Uid,
};
use std::ffi::CString;
use std::os::fd::{OwnedFd, RawFd};

/// Everything the child needs, prepared before fork.
pub struct ChildPlan {
    pub candidates: Vec<CString>,
    pub argv: Vec<CString>,
    pub env: Vec<CString>,
    pub cwd: CString,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub cgroup_procs: Option<String>,
    /// `tasks` files of v1 hierarchies to join as well: the child has one thread, so it
    /// moves itself there without the kernel's global threadgroup lock (`cgroup.procs`
    /// takes it, and its taking waits for an RCU grace period, 5 to 16 ms here).
    pub v1_tasks: Vec<String>,
    /// `clan shell`: the cluster view over /proc (view, where the node's procfs goes).
    pub cluster_proc: Option<(CString, CString)>,
    pub mnt_ns: Option<OwnedFd>,
    pub uts_ns: Option<OwnedFd>,
    pub stdio: [RawFd; 3],
    pub tty: bool,
    /// The signals ignored in the child (a mask, bit `n - 1` for signal `n`; all of them
    /// when not known): set back to their default before the exec, unless in `ignore`
    /// (handlers do not survive an exec; ignored signals do).
    pub ignored: u64,
    /// The signals the process starts with ignored: what its caller had ignored, as a
    /// local exec keeps them (`nohup`, a script's background job).
    pub ignore: u64,
}

/// Executable candidates for `argv0` along `path`, as execvp(3) tries them.
pub fn candidates(argv0: &[u8], path: Option<&[u8]>) -> Vec<CString> {
    if argv0.contains(&b'/') || argv0.is_empty() {
        return CString::new(argv0).into_iter().collect();
    }
    let path = path.unwrap_or(b"/usr/local/bin:/usr/bin:/bin");
    path.split(|&b| b == b':')
        .map(|dir| {
            let dir = if dir.is_empty() { b".".as_slice() } else { dir };
            let mut p = dir.to_vec();
            p.push(b'/');
            p.extend_from_slice(argv0);
            p
        })
        .filter_map(|p| CString::new(p).ok())
        .collect()
}

fn fail(err_fd: RawFd, errno: Errno, what: &str) -> ! {
    let msg = format!("{}:{}", errno as i32, what);
    // SAFETY: err_fd is the write end of our error pipe; msg is a live buffer.
    unsafe {
        libc::write(err_fd, msg.as_ptr().cast(), msg.len());
        libc::_exit(127)
    }
}

/// What is on top at a node's view directory (or /proc), as this namespace sees it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Top {
    /// A view that answers (a FUSE mount).
    Live,
    /// A dead server's view, not yet removed by its watcher (ENOTCONN).
    Dead,
    /// Something else: the base of the view, or the bare directory.
    Other,
}

fn top_of(st: nix::Result<nix::sys::statfs::Statfs>) -> Result<Top, Errno> {
    match st {
        Ok(st) if st.filesystem_type() == nix::sys::statfs::FUSE_SUPER_MAGIC => Ok(Top::Live),
        Ok(_) => Ok(Top::Other),
        Err(Errno::ENOTCONN) => Ok(Top::Dead),
        Err(e) => Err(e),
    }
}

fn top_at(path: &std::ffi::CStr) -> Result<Top, Errno> {
    top_of(nix::sys::statfs::statfs(path))
}

/// `open_tree(OPEN_TREE_CLONE)`: a detached copy of the mount on top at `path` under
/// `dirfd` (the mount of `dirfd` itself with an empty path), as a bind would make it.
fn clone_mount(dirfd: RawFd, path: &std::ffi::CStr) -> Result<OwnedFd, Errno> {
    use std::os::fd::FromRawFd;
    const OPEN_TREE_CLONE: libc::c_long = 1;
    let mut flags = OPEN_TREE_CLONE | libc::c_long::from(libc::O_CLOEXEC);
    if path.is_empty() {
        flags |= libc::c_long::from(libc::AT_EMPTY_PATH);
    }
    // SAFETY: open_tree reads a NUL-terminated path and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, dirfd, path.as_ptr(), flags) };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: the fd was just made for us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `move_mount`: attaches the detached mount `tree` (from `clone_mount`) on top at `to`.
fn attach(tree: OwnedFd, to: &std::ffi::CStr) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_long = 4;
    // SAFETY: move_mount reads two NUL-terminated paths; `tree` stays open across the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if r < 0 {
        return Err(Errno::last());
    }
    Ok(())
}

/// The id of the mount of `path` under `dirfd` (of `dirfd` itself with an empty path).
fn mount_id(dirfd: RawFd, path: &std::ffi::CStr) -> Result<u64, Errno> {
    let flags = libc::AT_SYMLINK_NOFOLLOW
        | if path.is_empty() {
            libc::AT_EMPTY_PATH
        } else {
            0
        };
    // SAFETY: all-zero bytes are a valid statx (plain integers).
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: statx fills the struct of ours from a NUL-terminated path.
    let r = unsafe { libc::statx(dirfd, path.as_ptr(), flags, libc::STATX_MNT_ID, &mut st) };
    if r < 0 {
        return Err(Errno::last());
    }
    Ok(st.stx_mnt_id)
}

/// A mount namespace of the process's own, a slave of the node's (new mounts of the node
/// still arrive, its own never leave): the node's procfs bound at `node_proc` (a real procfs,
/// for `/proc/self` and its magic links), and over `/proc` a bind of the base of the node's
/// view (`view` bound onto itself and shared, under the view: `clan-procfs --for-shells`)
/// with the view on top. That /proc is a slave of the base: when the view's server dies,
/// the unmount of its view (by the watcher, in the node's namespace) reaches this /proc
/// too (it removes what is mounted at the same place: the view here), and the view a
/// restarted server mounts on the base arrives on it. So the shell keeps a working /proc.
///
/// The path `view` leads to the view on top, never to the base under it: the view is
/// cloned aside and unmounted at `view` (in this namespace only), and the base cloned over
/// /proc with the view on top. A view that dies or arrives meanwhile (a server restarting
/// right then) is dealt with at the end.
fn cluster_proc(view: &CString, node_proc: &CString) -> Result<(), (Errno, &'static str)> {
    use nix::mount::{mount, umount2, MntFlags, MsFlags};
    use std::os::fd::AsRawFd;
    const NO_VIEW: &str = "mount the cluster /proc view (is the node's view server running?)";
    nix::sched::unshare(CloneFlags::CLONE_NEWNS).map_err(|e| (e, "unshare a mount namespace"))?;
    crate::slave_root().map_err(|e| (e, "make / a slave mount"))?;
    mount(
        Some("/proc"),
        node_proc.as_c_str(),
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| (e, "bind the node's /proc"))?;
    let no_view = |e| (e, NO_VIEW);
    // The view of the moment, aside, and what is under it (a server restarting right now
    // may have put a new view there: then that one is the view, at most twice).
    let mut shown = None;
    let mut tries = 0;
    let under = loop {
        tries += 1;
        let top = top_at(view).map_err(no_view)?;
        if top == Top::Live {
            shown = Some(clone_mount(libc::AT_FDCWD, view).map_err(no_view)?);
        }
        if top != Top::Other {
            umount2(view.as_c_str(), MntFlags::MNT_DETACH)
                .map_err(|e| (e, "unmount this namespace's copy of the view"))?;
        }
        let fd = nix::fcntl::open(
            view.as_c_str(),
            nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(no_view)?;
        // SAFETY: the fd was just opened for us and nothing else owns it.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        if tries < 3 && top_of(nix::sys::statfs::fstatfs(&fd)).map_err(no_view)? != Top::Other {
            continue;
        }
        break fd;
    };
    let base = mount_id(under.as_raw_fd(), c"").map_err(no_view)?
        != mount_id(under.as_raw_fd(), c"..").map_err(no_view)?;
    if !base {
        // A server from before bases mounted its view on the bare directory: the view
        // alone, which a restarted server's does not replace.
        let Some(v) = shown else {
            return Err((Errno::ENOTCONN, NO_VIEW));
        };
        return attach(v, c"/proc").map_err(|e| (e, "mount the cluster /proc view"));
    }
    attach(
        clone_mount(under.as_raw_fd(), c"").map_err(no_view)?,
        c"/proc",
    )
    .map_err(|e| (e, "bind the base of the cluster /proc view over /proc"))?;
    if let Some(v) = shown {
        // Unless a newer view has arrived on the base meanwhile.
        if top_at(c"/proc") == Ok(Top::Other) {
            attach(v, c"/proc").map_err(|e| (e, "mount the cluster /proc view"))?;
        }
    }
    // A view that died before it reached /proc (its unmount could not reach it), or one
    // that reached the base before /proc was bound to it.
    if top_at(c"/proc") == Ok(Top::Dead) {
        let _ = umount2("/proc", MntFlags::MNT_DETACH);
    }
    if top_at(c"/proc") == Ok(Top::Other) && top_at(view) == Ok(Top::Live) {
        mount(
            Some(view.as_c_str()),
            "/proc",
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(no_view)?;
    }
    Ok(())
}

/// Runs in the forked child; never returns.
pub fn child(plan: ChildPlan, err_fd: RawFd) -> ! {
    if let Some(ns) = &plan.mnt_ns {
        if let Err(e) = setns(ns, CloneFlags::CLONE_NEWNS) {
            fail(err_fd, e, "enter the node's mount namespace");
        }
    }
    if let Some(ns) = &plan.uts_ns {
        if let Err(e) = setns(ns, CloneFlags::CLONE_NEWUTS) {
            fail(err_fd, e, "enter the node's uts namespace");
        }
    }
    if let Some(procs) = &plan.cgroup_procs {
        if let Err(e) = std::fs::write(procs, "0") {
            fail(
                err_fd,
                Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
                "join the task's cgroup",
            );
        }
    }
    if let Some((view, node_proc)) = &plan.cluster_proc {
        if let Err((e, what)) = cluster_proc(view, node_proc) {
            fail(err_fd, e, what);
        }
    }
    for tasks in &plan.v1_tasks {
        if let Err(e) = std::fs::write(tasks, "0") {
            fail(
                err_fd,
                Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
                "join the task's v1 cgroups",
            );
        }
    }
    // A process group of its own in the shepherd's session: the shepherd, its parent in
    // another group of the same session, keeps the group from being orphaned.
    if let Err(e) = setpgid(Pid::from_raw(0), Pid::from_raw(0)) {
        fail(err_fd, e, "setpgid");
    }
    for (target, &fd) in plan.stdio.iter().enumerate() {
        if fd != target as RawFd {
            if let Err(e) = dup2(fd, target as RawFd) {
                fail(err_fd, e, "set up stdio");
            }
        }
    }
    if plan.tty {
        // The pty is the session's controlling terminal (the shepherd took it): our group
        // becomes its foreground group. SIGTTOU is still ignored here (restored below).
        if let Err(e) = tcsetpgrp(std::io::stdin(), getpgrp()) {
            fail(err_fd, e, "take the terminal's foreground");
        }
    }
    // Everything above 2 goes away at exec, the error pipe last.
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets flags on our own descriptors.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    for sig in (1..=64).filter(|&s| s != libc::SIGKILL && s != libc::SIGSTOP) {
        let bit = clan_core::sys::signal_bit(sig);
        let ignore = plan.ignore & bit != 0;
        if ignore || plan.ignored & bit != 0 {
            let _ = clan_core::sys::set_ignored(sig, ignore);
        }
    }
    let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
    if Uid::current().is_root() {
        let groups: Vec<Gid> = plan.groups.iter().map(|&g| Gid::from_raw(g)).collect();
        if let Err(e) = setgroups(&groups) {
            fail(err_fd, e, "setgroups");
        }
        if let Err(e) = setgid(Gid::from_raw(plan.gid)) {
            fail(err_fd, e, "setgid");
        }
        if let Err(e) = setuid(Uid::from_raw(plan.uid)) {
            fail(err_fd, e, "setuid");
        }
    }
    // Entered as the caller, not as root: a directory the caller may not enter is refused.
    // SAFETY: chdir takes a NUL-terminated path we own.
    if unsafe { libc::chdir(plan.cwd.as_ptr()) } < 0 {
        fail(
            err_fd,
            Errno::last(),
            &format!(
                "cannot enter working directory {}",
                plan.cwd.to_string_lossy()
            ),
        );
    }
    let mut last = Errno::ENOENT;
    let mut seen_eacces = false;
    for cand in &plan.candidates {
        let e = execve(cand, &plan.argv, &plan.env).unwrap_err();
        match e {
            Errno::EACCES => seen_eacces = true,
            Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP | Errno::ENAMETOOLONG => {}
            other => {
                last = other;
                break;
            }
        }
    }
    let errno = if last == Errno::ENOENT && seen_eacces {
        Errno::EACCES
    } else {
        last
    };
    let name = plan
        .argv
        .first()
        .map(|a| a.to_string_lossy().into_owned())
        .unwrap_or_default();
    fail(err_fd, errno, &name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_search_like_execvp() {
        let c = candidates(b"ls", Some(b"/a:/b::/c"));
        let c: Vec<_> = c.iter().map(|c| c.to_str().unwrap()).collect();
        assert_eq!(c, ["/a/ls", "/b/ls", "./ls", "/c/ls"]);
        assert_eq!(candidates(b"./x", Some(b"/a")).len(), 1);
    }
}
