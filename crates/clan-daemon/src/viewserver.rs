//! The node's cluster /proc view for `clan shell`: a `clan-procfs` server mounted at
//! `<state>/proc` inside the node's mount namespace (the host's on a real node), on a
//! shared bind of that directory onto itself (`--for-shells`), through which the view of a
//! server started after one died reaches the shells already running. It is a
//! process of its own, a session leader in the node's `procfs/` cgroup, so that a cland
//! restart leaves the shells reading it undisturbed (it reconnects) and the node's end takes
//! it with the rest; cland finds it again through `procfs.pid`.

use crate::cgroup::NodeCgroup;
use anyhow::{bail, Context};
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// How long the server may take to mount.
pub const READY: Duration = Duration::from_secs(10);

/// The view server's pid when it runs (the one recorded in `pidfile`, not a process that
/// got its number since: see [`crate::pidfile`]).
pub fn running(pidfile: &Path) -> Option<i32> {
    crate::pidfile::read(pidfile, "clan-procfs").map(|p| p.pid)
}

/// Finds or starts the node's view server. Failing is not fatal to cland (a machine
/// without FUSE has no `clan shell`): the caller logs it.
pub fn ensure(
    state: &Path,
    view: &Path,
    cluster_dir: &Path,
    node: clan_core::NodeId,
    ns_init: u32,
    cg: Option<&NodeCgroup>,
    bin: &Path,
) -> anyhow::Result<()> {
    let pidfile = state.join("procfs.pid");
    if let Some(pid) = running(&pidfile) {
        info!(pid, "reusing the node's cluster /proc view server");
        return Ok(());
    }
    let (rd, wr) = nix::unistd::pipe().context("pipe")?;
    // The read end stays with cland only.
    nix::fcntl::fcntl(
        rd.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .context("pipe flags")?;
    let mut cmd = std::process::Command::new(bin.join("clan-procfs"));
    cmd.arg("--cluster-dir")
        .arg(cluster_dir)
        .arg("--node")
        .arg(node.to_string())
        .arg("--foreground")
        .arg("--node-proc")
        .arg(state.join("nodeproc"))
        .arg("--for-shells")
        .arg("--ready-fd")
        .arg(wr.as_raw_fd().to_string());
    if ns_init != 0 {
        cmd.arg("--mount-ns").arg(ns_init.to_string());
    }
    cmd.arg(view)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(
            std::fs::File::options()
                .create(true)
                .append(true)
                .open(state.join("procfs.log"))
                .map(std::process::Stdio::from)
                .unwrap_or_else(|_| std::process::Stdio::null()),
        );
    let procs = match cg {
        Some(cg) => {
            let dir = cg.sub("procfs");
            std::fs::create_dir_all(&dir).context("the view server's cgroup")?;
            Some(
                std::ffi::CString::new(dir.join("cgroup.procs").as_os_str().as_encoded_bytes())
                    .context("cgroup path")?,
            )
        }
        None => None,
    };
    let wr_fd = wr.as_raw_fd();
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe calls
    // (setsid, open, write, close, fcntl) on data prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            if let Some(p) = &procs {
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd >= 0 {
                    libc::write(fd, b"0".as_ptr().cast(), 1);
                    libc::close(fd);
                }
            }
            // The ready pipe's write end is inherited (cleared close-on-exec).
            libc::fcntl(wr_fd, libc::F_SETFD, 0);
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("start clan-procfs")?;
    let mut rd = std::fs::File::from(rd);
    drop::<OwnedFd>(wr);
    // Reap it whenever it ends while this cland runs.
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = child.wait();
    });
    let deadline = Instant::now() + READY;
    let mut said = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("clan-procfs (pid {pid}) did not mount within {READY:?}");
        }
        let mut fds = [PollFd::new(rd.as_fd(), PollFlags::POLLIN)];
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(e).context("wait for the view server"),
        }
        match rd.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                said.extend_from_slice(&buf[..n]);
                // One line says it all (the pipe may stay open in its children).
                if said.contains(&b'\n') {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("read the view server's report"),
        }
    }
    let said = String::from_utf8_lossy(&said);
    if said.trim() != "ready" {
        bail!(
            "clan-procfs did not mount {}: {}",
            view.display(),
            if said.trim().is_empty() {
                "it exited (see procfs.log)"
            } else {
                said.trim()
            }
        );
    }
    crate::pidfile::write(&pidfile, pid).context("procfs.pid")?;
    info!(pid, "cluster /proc view mounted at {}", view.display());
    Ok(())
}

/// Stops the view server (the node is going down); its watcher unmounts the view.
pub fn stop(state: &Path) {
    let pidfile = state.join("procfs.pid");
    if let Some(p) = crate::pidfile::read(&pidfile, "clan-procfs") {
        if !p.signal(libc::SIGTERM) {
            warn!(pid = p.pid, "stop the view server: it is gone");
        }
    }
    crate::pidfile::remove(&pidfile);
}
