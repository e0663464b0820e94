//! Pid files of a node's own processes (`cland.pid`, `init.pid`), and how much to trust them.
//!
//! `NAME.pid` holds the pid alone, as scripts (`kill $(cat cland.pid)`) and tools read it.
//! Beside it `NAME.start` holds `PID START BOOT`: the same pid, the process's start time
//! (field 22 of /proc/PID/stat, clock ticks after boot) and the kernel's boot id. Once the
//! process is gone, after a reboot or an OOM kill with the state directory on persistent
//! storage, its number may name some unrelated process; only a live process whose pid,
//! start time and boot all match the record is taken for the one recorded, signalled, or
//! adopted. A pid file without a matching `.start` (written by an older cland, or caught
//! half-written) is unverified: believed only when the process's name (`comm`) is the
//! expected one.
//!
//! cland writes and reads them (`cland.pid`, `init.pid`, `procfs.pid`); the view server
//! reads the nodes' `init.pid` ([`read_in`], with the /proc it is given).

use crate::sys;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `cland.pid` → `cland.start`.
pub fn start_file(pidfile: &Path) -> PathBuf {
    pidfile.with_extension("start")
}

fn boot_id() -> Option<String> {
    boot_id_in(Path::new("/proc"))
}

/// The kernel's boot id as the /proc at `proc_root` gives it.
fn boot_id_in(proc_root: &Path) -> Option<String> {
    sys::read_small(proc_root.join("sys/kernel/random/boot_id"))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Records `pid`: first its `.start` line, then the pid file, so that a reader never pairs
/// the new pid with an older start line it would believe.
pub fn write(pidfile: &Path, pid: u32) -> io::Result<()> {
    let start = start_file(pidfile);
    match sys::state_and_start(pid) {
        Some((_, ticks)) => std::fs::write(
            &start,
            format!(
                "{pid} {ticks} {}\n",
                boot_id().unwrap_or_else(|| "-".into())
            ),
        )?,
        // Gone already: nothing to verify it by; a later reader finds it dead anyway.
        None => match std::fs::remove_file(&start) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        },
    }
    std::fs::write(pidfile, format!("{pid}\n"))
}

/// Removes the pid file and its `.start` line.
pub fn remove(pidfile: &Path) {
    let _ = std::fs::remove_file(pidfile);
    let _ = std::fs::remove_file(start_file(pidfile));
}

/// A live process that a pid file names and that is the one recorded there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    pub pid: i32,
    /// Its start time (clock ticks after boot): with the pid, its identity for this boot.
    pub start: u64,
    /// Whether the `.start` line vouched for it (else only its name did).
    pub verified: bool,
}

/// What a `.start` line says.
fn parse_start(text: &str) -> Option<(i32, u64, Option<&str>)> {
    let mut f = text.split_whitespace();
    let pid = f.next()?.parse().ok()?;
    let start = f.next()?.parse().ok()?;
    let boot = f.next().filter(|b| *b != "-");
    Some((pid, start, boot))
}

/// The process `pidfile` names if it is alive and is the one recorded: same pid, start time
/// and boot as its `.start` line says, or, without a `.start` line for that pid, named
/// `comm` (at most 15 bytes, as the kernel keeps it). `None` for a dead process, a zombie,
/// or a process that only happens to have the number now.
pub fn read(pidfile: &Path, comm: &str) -> Option<Recorded> {
    read_in(Path::new("/proc"), pidfile, comm)
}

/// [`read`], with the processes (their `stat` and `comm`) and the boot id of the /proc at
/// `proc_root`.
pub fn read_in(proc_root: &Path, pidfile: &Path, comm: &str) -> Option<Recorded> {
    let pid: i32 = std::fs::read_to_string(pidfile).ok()?.trim().parse().ok()?;
    if pid <= 0 {
        return None;
    }
    let (state, start) = sys::state_and_start_in(proc_root, pid as u32)?;
    if matches!(state, 'Z' | 'X') {
        return None;
    }
    let line = std::fs::read_to_string(start_file(pidfile)).ok();
    match line.as_deref().and_then(parse_start) {
        Some((p, t, boot)) if p == pid => {
            let same_boot = match (boot, boot_id_in(proc_root)) {
                (Some(b), Some(now)) => b == now,
                _ => true,
            };
            (t == start && same_boot).then_some(Recorded {
                pid,
                start,
                verified: true,
            })
        }
        _ => {
            let name = sys::read_small(proc_root.join(format!("{pid}/comm"))).ok()?;
            (name.trim_end_matches('\n') == comm).then_some(Recorded {
                pid,
                start,
                verified: false,
            })
        }
    }
}

impl Recorded {
    /// Whether it still runs (not a zombie, not replaced by a later process with its pid).
    pub fn alive(&self) -> bool {
        sys::lives(self.pid as u32, self.start)
    }

    /// A pidfd naming exactly this process, `None` once it is gone. Opened, then checked
    /// to still be it: the process that had the pid at the opening is the recorded one when
    /// the recorded one still has it afterwards (a pid never returns to a process).
    pub fn pidfd(&self) -> Option<OwnedFd> {
        let fd = sys::pidfd_open(self.pid).ok()?;
        self.alive().then_some(fd)
    }

    /// Sends `sig` to it, through a pidfd: never to a later process with its pid. Returns
    /// whether it was sent (false: the process is gone).
    pub fn signal(&self, sig: i32) -> bool {
        self.pidfd()
            .is_some_and(|fd| sys::pidfd_send_signal(&fd, sig).is_ok())
    }

    /// Waits until it has ended, at most `limit`; returns whether it has.
    pub fn wait_gone(&self, limit: Duration) -> bool {
        let Some(fd) = self.pidfd() else {
            return true;
        };
        let deadline = Instant::now() + limit;
        loop {
            // A pidfd polls readable once its process has exited.
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = u16::try_from(left.as_millis().min(1000)).unwrap_or(1000);
            let mut fds = [nix::poll::PollFd::new(
                fd.as_fd(),
                nix::poll::PollFlags::POLLIN,
            )];
            match nix::poll::poll(&mut fds, ms) {
                Ok(n) if n > 0 => return true,
                Err(nix::errno::Errno::EINTR) | Ok(_) => {}
                Err(_) => return !self.alive(),
            }
            if !self.alive() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("clan-pidfile-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_recorded_process_is_found_and_a_stranger_with_its_pid_is_not() {
        let d = tmp("recorded");
        let f = d.join("x.pid");
        let me = std::process::id();
        write(&f, me).unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), format!("{me}\n"));
        let r = read(&f, "whatever").expect("ourselves");
        assert!(r.verified && r.alive() && r.pid == me as i32);
        // The same pid with another start time: a process that reuses the number.
        let (_, start) = sys::state_and_start(me).unwrap();
        let boot = boot_id().unwrap_or_else(|| "-".into());
        std::fs::write(start_file(&f), format!("{me} {} {boot}\n", start + 1)).unwrap();
        assert_eq!(read(&f, "whatever"), None);
        // Or another boot.
        std::fs::write(start_file(&f), format!("{me} {start} not-this-boot\n")).unwrap();
        if boot_id().is_some() {
            assert_eq!(read(&f, "whatever"), None);
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_old_pid_file_is_believed_only_for_the_expected_name() {
        let d = tmp("legacy");
        let f = d.join("x.pid");
        let me = std::process::id();
        std::fs::write(&f, format!("{me}\n")).unwrap();
        let comm = sys::read_small("/proc/self/comm").unwrap();
        let r = read(&f, comm.trim_end_matches('\n')).expect("by name");
        assert!(!r.verified);
        assert_eq!(read(&f, "cland-not-me"), None);
        // A start line for another pid is no voucher either.
        std::fs::write(start_file(&f), "1 1 -\n").unwrap();
        assert_eq!(read(&f, "cland-not-me"), None);
        assert!(read(&f, comm.trim_end_matches('\n')).is_some());
        remove(&f);
        assert!(!f.exists() && !start_file(&f).exists());
        assert_eq!(read(&f, "x"), None);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_dead_process_is_not_found_and_waiting_for_it_ends() {
        let d = tmp("dead");
        let f = d.join("x.pid");
        let mut child = std::process::Command::new("sleep")
            .arg("100")
            .spawn()
            .unwrap();
        write(&f, child.id()).unwrap();
        let r = read(&f, "sleep").expect("the child");
        assert!(r.verified);
        assert!(!r.wait_gone(Duration::from_millis(50)));
        assert!(r.signal(libc::SIGKILL));
        let _ = child.wait();
        assert!(r.wait_gone(Duration::from_secs(5)));
        assert!(!r.alive());
        assert!(!r.signal(libc::SIGKILL));
        assert_eq!(read(&f, "sleep"), None);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
