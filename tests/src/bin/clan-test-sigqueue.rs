//! A sigqueue(3) sender and receiver for the end-to-end tests (tests/tests/shell.rs).
//!
//! `clan-test-sigqueue wait SIG OUT`: blocks SIG, creates `OUT.ready`, takes one SIG with
//! sigwaitinfo(2) and writes `signo code pid uid value` to OUT.
//! `clan-test-sigqueue send PID SIG VALUE`: sigqueue(PID, SIG, VALUE) through libc (so a
//! preloaded shim sees it); exits 0 on success, else prints the errno.

use std::process::ExitCode;

fn main() -> ExitCode {
    let a: Vec<String> = std::env::args().collect();
    let num = |i: usize| -> i64 { a.get(i).and_then(|s| s.parse().ok()).unwrap_or(0) };
    match a.get(1).map(String::as_str) {
        Some("wait") if a.len() == 4 => {
            let sig = num(2) as i32;
            // SAFETY: plain libc calls on values of this frame; one thread.
            let (got, info) = unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, sig);
                libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                if std::fs::write(format!("{}.ready", a[3]), b"").is_err() {
                    return ExitCode::FAILURE;
                }
                let mut info: libc::siginfo_t = std::mem::zeroed();
                (libc::sigwaitinfo(&set, &mut info), info)
            };
            // SAFETY: the fields of a queued signal's siginfo.
            let line = unsafe {
                format!(
                    "{got} {} {} {} {}\n",
                    info.si_code,
                    info.si_pid(),
                    info.si_uid(),
                    info.si_value().sival_ptr as i64
                )
            };
            match std::fs::write(&a[3], line) {
                Ok(()) => ExitCode::SUCCESS,
                Err(_) => ExitCode::FAILURE,
            }
        }
        Some("send") if a.len() == 5 => {
            let value = libc::sigval {
                sival_ptr: num(4) as usize as *mut libc::c_void,
            };
            // SAFETY: sigqueue with a pid, signal and value.
            if unsafe { libc::sigqueue(num(2) as libc::pid_t, num(3) as i32, value) } == 0 {
                ExitCode::SUCCESS
            } else {
                eprintln!("sigqueue: {}", std::io::Error::last_os_error());
                ExitCode::FAILURE
            }
        }
        _ => {
            eprintln!("usage: clan-test-sigqueue wait SIG OUT | send PID SIG VALUE");
            ExitCode::from(2)
        }
    }
}
