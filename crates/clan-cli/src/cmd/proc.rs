//! `clan proc mount DIR` and `clan proc umount DIR`: the cluster /proc (issue 5) at a
//! directory, served by a detached `clan-procfs` found next to `clan`.

use clan_core::{ExitCode as X, NodeId};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// How long `clan proc mount` waits for the server to say it is ready.
const READY_WITHIN: Duration = Duration::from_secs(30);

#[derive(clap::Subcommand)]
pub enum Args {
    /// Mount the cluster /proc at DIR (every process of every node as DIR/GPID).
    Mount {
        /// An empty directory that nothing is mounted on.
        #[arg(value_name = "DIR")]
        mountpoint: PathBuf,
    },
    /// Unmount the cluster /proc at DIR (lazily if it is busy); its server ends.
    Umount {
        /// Where it is mounted.
        #[arg(value_name = "DIR")]
        mountpoint: PathBuf,
    },
    /// Print a file of a process of any node, as the mount shows it (gpids in its pid
    /// fields), read with your rights by the node that holds it: `clan proc cat GPID status`.
    Cat {
        gpid: String,
        /// A path under the process's directory: `status`, `stat`, `task/TID/stat`, ...
        file: String,
    },
}

pub async fn run(a: Args, dir: Option<PathBuf>, from: Option<NodeId>) -> ExitCode {
    match a {
        // (The positionals are not named `dir`: that is the id of the global --dir.)
        Args::Mount { mountpoint } => mount(&mountpoint, dir, from),
        Args::Umount { mountpoint } => umount(&mountpoint),
        Args::Cat { gpid, file } => match clan_client::Client::locate(dir.as_deref(), from) {
            Ok(c) => cat(c, &gpid, file).await,
            Err(e) => crate::client_error(&e),
        },
    }
}

async fn cat(c: clan_client::Client, gpid: &str, path: String) -> ExitCode {
    use std::io::Write;
    let g: clan_core::Gpid = match gpid.parse() {
        Ok(g) => g,
        Err(e) => {
            crate::fail(&e);
            return ExitCode::from(X::NOT_FOUND);
        }
    };
    let req = clan_client::pb::ProcRequest {
        op: clan_client::pb::ProcOp::ProcRead as i32,
        gpid: g.raw(),
        path,
        ..Default::default()
    };
    match c.proc(req).await {
        Ok(r) => {
            let _ = std::io::stdout().write_all(&r.data);
            ExitCode::SUCCESS
        }
        Err(e) => crate::client_error(&e),
    }
}

fn mount(at: &Path, cluster: Option<PathBuf>, from: Option<NodeId>) -> ExitCode {
    let server = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("clan-procfs")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("clan-procfs"));
    let (rd, wr) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => {
            crate::fail(&format!("pipe: {e}"));
            return ExitCode::from(X::FAILURE);
        }
    };
    let mut cmd = Command::new(&server);
    if let Some(d) = &cluster {
        cmd.arg("--cluster-dir").arg(d);
    }
    if let Some(n) = from {
        cmd.arg("--node").arg(n.to_string());
    }
    cmd.args(["--foreground", "--ready-fd", "3", "--"])
        .arg(at)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let fd = wr.as_raw_fd();
    // SAFETY: between fork and exec only async-signal-safe calls (setsid, dup2, fcntl).
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            if fd == 3 {
                // dup2 onto itself keeps close-on-exec: clear it.
                if libc::fcntl(3, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            crate::fail(&format!("start {}: {e}", server.display()));
            return ExitCode::from(X::FAILURE);
        }
    };
    drop(wr);
    let Some(line) = read_line_within(rd, READY_WITHIN) else {
        let _ = child.kill();
        let _ = child.wait();
        crate::fail(&format!(
            "clan-procfs did not mount {} within {}s",
            at.display(),
            READY_WITHIN.as_secs()
        ));
        return ExitCode::from(X::FAILURE);
    };
    let line = line.trim();
    if line == "ready" {
        println!(
            "clan: cluster /proc mounted at {} (clan-procfs pid {})",
            at.display(),
            child.id()
        );
        return ExitCode::SUCCESS;
    }
    if let Some(rest) = line.strip_prefix("error ") {
        let (code, msg) = rest.split_once(' ').unwrap_or((rest, ""));
        crate::fail(&msg);
        let _ = child.wait();
        return ExitCode::from(code.parse::<u8>().unwrap_or(X::FAILURE));
    }
    // It closed the pipe without a word: it ended (or says something unexpected).
    let _ = child.kill();
    let st = child.wait();
    crate::fail(&format!(
        "clan-procfs ended before mounting {}",
        at.display()
    ));
    ExitCode::from(
        st.ok()
            .and_then(|s| s.code())
            .and_then(|c| u8::try_from(c).ok())
            .filter(|&c| c != 0)
            .unwrap_or(X::FAILURE),
    )
}

/// The first line written to `fd` (what came before EOF if no newline did); `None` at the
/// deadline.
fn read_line_within(fd: std::os::fd::OwnedFd, limit: Duration) -> Option<String> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let deadline = Instant::now() + limit;
    let mut f = std::fs::File::from(fd);
    let mut out = Vec::new();
    let mut buf = [0u8; 256];
    while !out.contains(&b'\n') {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        let ms =
            PollTimeout::try_from(left.as_millis().min(60_000) as i32).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(std::os::fd::AsFd::as_fd(&f), PollFlags::POLLIN)];
        match poll(&mut fds, ms) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break,
        }
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let s = String::from_utf8_lossy(&out);
    Some(s.lines().next().unwrap_or("").to_string())
}

/// The top mount at `at`'s canonical path in /proc/self/mountinfo: (source, fstype,
/// the `user_id` of a FUSE mount).
fn mount_at(at: &Path) -> Option<(String, String, Option<u32>)> {
    // Bytes: another mount's point need not be UTF-8 (ours, compared below, is).
    let bytes = std::fs::read("/proc/self/mountinfo").ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let want = at.to_str()?;
    text.lines().rev().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let point = left.split(' ').nth(4)?.replace("\\040", " ");
        if point != want {
            return None;
        }
        let mut r = right.split(' ');
        let fstype = r.next()?.to_string();
        let source = r.next().unwrap_or("").to_string();
        let user = r.next().and_then(|opts| {
            opts.split(',')
                .find_map(|o| o.strip_prefix("user_id=")?.parse().ok())
        });
        Some((source, fstype, user))
    })
}

fn umount(at: &Path) -> ExitCode {
    let canon = match at.canonicalize() {
        Ok(p) => p,
        Err(e) => {
            crate::fail(&format!("{}: {e}", at.display()));
            return ExitCode::from(X::NOT_FOUND);
        }
    };
    let me = nix::unistd::geteuid();
    match mount_at(&canon) {
        Some((source, fstype, user)) if source == "clanproc" && fstype.starts_with("fuse") => {
            if !me.is_root() && user != Some(me.as_raw()) {
                crate::fail(&format!(
                    "unmount {}: permission denied (mounted by uid {})",
                    at.display(),
                    user.map_or("?".into(), |u| u.to_string())
                ));
                return ExitCode::from(X::PERMISSION);
            }
        }
        _ => {
            crate::fail(&format!("{} is not a cluster /proc mount", at.display()));
            return ExitCode::from(X::NOT_FOUND);
        }
    }
    let r = if me.is_root() {
        match nix::mount::umount(&canon) {
            Err(nix::errno::Errno::EBUSY) => {
                nix::mount::umount2(&canon, nix::mount::MntFlags::MNT_DETACH)
                    .map_err(|e| e.to_string())
            }
            r => r.map_err(|e| e.to_string()),
        }
    } else {
        match Command::new("fusermount3")
            .args(["-u", "-z", "--"])
            .arg(&canon)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
        {
            Ok(o) if o.status.success() => Ok(()),
            Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
            Err(e) => Err(format!("fusermount3: {e}")),
        }
    };
    match r {
        Ok(()) => {
            println!("clan: unmounted {}", at.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            crate::fail(&format!("unmount {}: {e}", at.display()));
            ExitCode::from(
                if e.contains("EPERM") || e.contains("ermission") || e.contains("not permitted") {
                    X::PERMISSION
                } else {
                    X::FAILURE
                },
            )
        }
    }
}
