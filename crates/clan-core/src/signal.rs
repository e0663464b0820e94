//! Signal names and numbers, as kill(1) spells them.

const NAMES: &[(&str, i32)] = &[
    ("HUP", libc::SIGHUP),
    ("INT", libc::SIGINT),
    ("QUIT", libc::SIGQUIT),
    ("ILL", libc::SIGILL),
    ("TRAP", libc::SIGTRAP),
    ("ABRT", libc::SIGABRT),
    ("BUS", libc::SIGBUS),
    ("FPE", libc::SIGFPE),
    ("KILL", libc::SIGKILL),
    ("USR1", libc::SIGUSR1),
    ("SEGV", libc::SIGSEGV),
    ("USR2", libc::SIGUSR2),
    ("PIPE", libc::SIGPIPE),
    ("ALRM", libc::SIGALRM),
    ("TERM", libc::SIGTERM),
    ("STKFLT", libc::SIGSTKFLT),
    ("CHLD", libc::SIGCHLD),
    ("CONT", libc::SIGCONT),
    ("STOP", libc::SIGSTOP),
    ("TSTP", libc::SIGTSTP),
    ("TTIN", libc::SIGTTIN),
    ("TTOU", libc::SIGTTOU),
    ("URG", libc::SIGURG),
    ("XCPU", libc::SIGXCPU),
    ("XFSZ", libc::SIGXFSZ),
    ("VTALRM", libc::SIGVTALRM),
    ("PROF", libc::SIGPROF),
    ("WINCH", libc::SIGWINCH),
    ("IO", libc::SIGIO),
    ("PWR", libc::SIGPWR),
    ("SYS", libc::SIGSYS),
];

/// Parses `TERM`, `SIGTERM`, `sigterm`, `15`, `RTMIN+2`. Signal 0 (existence check) is allowed.
pub fn parse_signal(s: &str) -> Option<i32> {
    let t = s.trim();
    if let Ok(n) = t.parse::<i32>() {
        return (0..=libc::SIGRTMAX()).contains(&n).then_some(n);
    }
    let up = t.to_ascii_uppercase();
    let name = up.strip_prefix("SIG").unwrap_or(&up);
    if let Some((_, n)) = NAMES.iter().find(|(k, _)| *k == name) {
        return Some(*n);
    }
    if let Some(rest) = name.strip_prefix("RTMIN") {
        let off = if rest.is_empty() {
            0
        } else {
            rest.strip_prefix('+')?.parse::<i32>().ok()?
        };
        let n = libc::SIGRTMIN() + off;
        return (n <= libc::SIGRTMAX()).then_some(n);
    }
    None
}

/// `TERM` for 15; a number for signals without a classic name.
pub fn signal_name(sig: i32) -> String {
    NAMES
        .iter()
        .find(|(_, n)| *n == sig)
        .map(|(k, _)| (*k).to_string())
        .unwrap_or_else(|| sig.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers() {
        assert_eq!(parse_signal("TERM"), Some(15));
        assert_eq!(parse_signal("sigkill"), Some(9));
        assert_eq!(parse_signal("10"), Some(10));
        assert_eq!(parse_signal("0"), Some(0));
        assert_eq!(parse_signal("RTMIN+1"), Some(libc::SIGRTMIN() + 1));
        assert_eq!(parse_signal("NOPE"), None);
        assert_eq!(parse_signal("99"), None);
        assert_eq!(parse_signal("-1"), None);
        assert_eq!(signal_name(15), "TERM");
    }
}
