//! Access to the local /proc as the reader: the names the view passes through (`sys/`,
//! `tty/`, a host process's own `/proc/PID`) are opened, listed and read with the
//! reader's identity, so the kernel applies its own rules (modes, ptrace checks, what
//! `kallsyms` shows) exactly as if the reader had asked it.
//!
//! A server running as root does each such operation with the reader's effective uid,
//! gid and groups on the calling thread (`clan_core::sys::ActingAs`, raw syscalls that
//! change that thread only, put back after). Taking a non-zero effective uid clears the
//! thread's effective capabilities, so no privilege of the server leaks to the reader; a
//! root reader keeps uid 0 with no more of the server's capabilities than it has itself.
//! A server that is not root uses its own identity: then only its owner can use the mount.

use crate::caller::Reader;
use std::io;

/// Runs `f` with the identity of `reader` (its ids and capabilities) when the server is
/// root; otherwise with the server's. `f` runs on the calling thread and must not yield.
pub fn as_reader<T, F>(reader: &Reader, switch: bool, f: F) -> io::Result<T>
where
    F: FnOnce() -> io::Result<T>,
{
    if !switch {
        return f();
    }
    let _acting =
        clan_core::sys::ActingAs::reader(reader.uid, reader.gid, &reader.groups, reader.caps)?;
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> (u32, u32) {
        let s = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let first = |k: &str| {
            crate::caller::status_numbers(&s, k)
                .get(1)
                .copied()
                .unwrap_or(u64::MAX) as u32
        };
        (first("Uid"), first("Gid"))
    }

    #[test]
    fn reader_thread_has_the_readers_ids_and_the_server_keeps_its_own() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let r = Reader {
            uid: 65534,
            gid: 65534,
            groups: vec![65534],
            caps: None,
        };
        let seen = as_reader(&r, true, || Ok(ids())).unwrap();
        assert_eq!(seen, (65534, 65534));
        assert_eq!(ids(), (0, 0));
        // The reader's rights, not root's: this process's environ is root's and guarded.
        let mine = format!("/proc/{}/environ", std::process::id());
        let p = mine.clone();
        let e = as_reader(&r, true, move || std::fs::read(p)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EACCES));
        assert!(std::fs::read(&mine).is_ok());
    }

    #[test]
    fn root_reader_or_no_switch_runs_in_place() {
        let me = std::thread::current().id();
        let same = as_reader(&Reader::root(), true, move || {
            Ok(std::thread::current().id() == me)
        })
        .unwrap();
        assert!(same);
    }
}
