//! The shepherd: one small, single-threaded supervisor per process that clan starts
//! (DESIGN.md 3, STYLE.md 17, containerd's shim). It forks the process into the node's
//! namespaces and cgroup with the caller's credentials, owns its stdio and its exit status,
//! keeps it a zombie until its parent has the status (so the gpid is not reused), and
//! outlives cland: a restarted cland finds it again by its socket in `state/sh/GPID.sock`.
//!
//! `zygote` forks waiting shepherds for cland without an exec each. The same binary also
//! provides `node-init`, pid 1 of a local-cluster node's pid, mount and
//! UTS namespaces.

mod exec;
mod init;
mod shepherd;

use std::process::ExitCode;

/// Makes every mount of this (new) mount namespace a slave of where it was copied from:
/// mounts made there still arrive, this namespace's own never leave.
fn slave_root() -> nix::Result<()> {
    use nix::mount::{mount, MsFlags};
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
}

/// Entry point of the `clan-shepherd` binary.
pub fn main_with_args(args: Vec<String>) -> ExitCode {
    match args.first().map(String::as_str) {
        Some("run") => shepherd::run(&args[1..]),
        Some("zygote") => shepherd::zygote(&args[1..]),
        Some("node-init") => init::run(&args[1..]),
        _ => {
            eprintln!("usage: clan-shepherd run < spec | clan-shepherd zygote < socket | clan-shepherd node-init --hostname NAME [--cgroup DIR]");
            ExitCode::from(2)
        }
    }
}
