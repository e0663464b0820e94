//! `clan-shepherd node-init`: pid 1 of a local-cluster node.
//!
//! It unshares pid, mount and UTS namespaces, forks the namespace's init, which makes its
//! mounts slaves of the host's (host mounts still arrive, ours never leave), mounts a /proc
//! of its own pid namespace and sets the node's host name. cland reads that /proc through
//! `/proc/INIT/root/proc`; shepherds join the namespaces through `/proc/INIT/ns/*`. Killing
//! the init (SIGKILL) kills every process of the node at once: a power cut.

use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{signal, SigHandler, Signal};
use nix::unistd::{fork, pause, pipe, sethostname, setsid, write, ForkResult};
use std::io::Read;
use std::os::fd::AsFd;
use std::process::ExitCode;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

pub fn run(args: &[String]) -> ExitCode {
    let hostname = arg(args, "--hostname").unwrap_or_else(|| "clan".into());
    if let Some(cg) = arg(args, "--cgroup") {
        if let Err(e) = std::fs::write(format!("{cg}/cgroup.procs"), "0") {
            eprintln!("clan-shepherd node-init: cannot join cgroup {cg}: {e}");
            return ExitCode::FAILURE;
        }
    }
    if let Err(e) =
        unshare(CloneFlags::CLONE_NEWPID | CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWUTS)
    {
        eprintln!("clan-shepherd node-init: unshare: {e}");
        return ExitCode::FAILURE;
    }
    let (rd, wr) = match pipe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("clan-shepherd node-init: pipe: {e}");
            return ExitCode::FAILURE;
        }
    };
    // SAFETY: this process is single-threaded; the child only makes system calls before
    // settling into its pause loop.
    match unsafe { fork() } {
        Err(e) => {
            eprintln!("clan-shepherd node-init: fork: {e}");
            ExitCode::FAILURE
        }
        Ok(ForkResult::Child) => {
            drop(rd);
            let setup = || -> nix::Result<()> {
                setsid()?;
                crate::slave_root()?;
                mount(
                    Some("proc"),
                    "/proc",
                    Some("proc"),
                    MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                    None::<&str>,
                )?;
                sethostname(&hostname)?;
                // SAFETY: setting SIGCHLD to SIG_IGN makes the kernel reap our (adopted)
                // children at once; no handler code runs.
                unsafe { signal(Signal::SIGCHLD, SigHandler::SigIgn) }?;
                Ok(())
            };
            let msg = match setup() {
                Ok(()) => "ok".to_string(),
                Err(e) => format!("setup failed: {e}"),
            };
            let _ = write(wr.as_fd(), msg.as_bytes());
            drop(wr);
            if msg != "ok" {
                std::process::exit(1);
            }
            // Close whatever we inherited so the node holds no host files open.
            for fd in 0..3 {
                let _ = nix::unistd::close(fd);
            }
            loop {
                pause();
            }
        }
        Ok(ForkResult::Parent { child }) => {
            drop(wr);
            let mut msg = String::new();
            let _ = std::fs::File::from(rd).read_to_string(&mut msg);
            if msg != "ok" {
                eprintln!("clan-shepherd node-init: {msg}");
                return ExitCode::FAILURE;
            }
            println!("{child}");
            ExitCode::SUCCESS
        }
    }
}
