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

/// A mount namespace of the process's own, a slave of the node's (new mounts of the node
/// still arrive, its own never leave): the node's procfs bound at `node_proc` (a real procfs,
/// for `/proc/self` and its magic links), the cluster view at `view` over `/proc`.
fn cluster_proc(view: &CString, node_proc: &CString) -> Result<(), (Errno, &'static str)> {
    use nix::mount::{mount, MsFlags};
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
    mount(
        Some(view.as_c_str()),
        "/proc",
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| {
        (
            e,
            "mount the cluster /proc view (is the node's view server running?)",
        )
    })?;
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
    for sig in 1..32 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            // SAFETY: restoring default dispositions runs no code of ours.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
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
