//! How a process ended, and the exit codes of clan's own commands.

/// A process's end as waitpid(2) reports it, with its CPU times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WaitStatus {
    /// Exit code when `signal` is 0.
    pub code: i32,
    /// Terminating signal; 0 when the process called exit.
    pub signal: i32,
    pub core_dumped: bool,
    pub utime_us: u64,
    pub stime_us: u64,
}

impl WaitStatus {
    /// The status a shell shows in `$?`: the exit code, or 128 + the signal (of the 7 bits
    /// a wait status has for it: a number no kernel gives, from a peer, can not overflow).
    pub fn shell_code(&self) -> i32 {
        if self.signal != 0 {
            128 + (self.signal & 0x7f)
        } else {
            self.code
        }
    }

    /// "exited 7", "killed by SIGTERM", "killed by SIGSEGV (core dumped)".
    pub fn describe(&self) -> String {
        if self.signal != 0 {
            format!(
                "killed by SIG{}{}",
                crate::signal_name(self.signal),
                if self.core_dumped {
                    " (core dumped)"
                } else {
                    ""
                }
            )
        } else {
            format!("exited {}", self.code)
        }
    }
}

/// Documented exit codes of the `clan` commands (docs/cli.md). `clan run` instead ends the
/// way the remote process ended, and uses 125..127 for its own failures like docker and sh.
pub struct ExitCode;

impl ExitCode {
    pub const OK: u8 = 0;
    /// The operation failed for a reason not listed below.
    pub const FAILURE: u8 = 1;
    /// Bad command line (clap's own code).
    pub const USAGE: u8 = 2;
    /// No such process, job or node.
    pub const NOT_FOUND: u8 = 3;
    /// The caller may not do this.
    pub const PERMISSION: u8 = 4;
    /// A node that had to act is dead or unreachable.
    pub const NODE_DOWN: u8 = 5;
    /// No cland answers on this machine.
    pub const NO_DAEMON: u8 = 6;
    /// `clan run`: clan itself failed before the command ran.
    pub const RUN_FAILED: u8 = 125;
    /// `clan run`: the command was found but could not be executed.
    pub const NOT_EXECUTABLE: u8 = 126;
    /// `clan run`: the command was not found.
    pub const COMMAND_NOT_FOUND: u8 = 127;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_codes() {
        let s = WaitStatus {
            signal: 15,
            ..Default::default()
        };
        assert_eq!(s.shell_code(), 143);
        assert_eq!(s.describe(), "killed by SIGTERM");
        let e = WaitStatus {
            code: 7,
            ..Default::default()
        };
        assert_eq!(e.shell_code(), 7);
        assert_eq!(e.describe(), "exited 7");
    }
}
