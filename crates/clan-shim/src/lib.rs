//! The preload library of `clan shell` (`shim.c`, built by build.rs): inside the shell,
//! kill(2), killpg(3), sigqueue(3), tgkill(2), pidfd_open(2), pidfd_send_signal(2), ptrace
//! attach and `syscall()` for those numbers, given a gpid of another node, go through
//! `clan kill`; a gpid of the shell's own node is translated to the local pid; local pids
//! pass through. What can not cross nodes (a pidfd or ptrace of a remote process) fails with
//! EREMOTE.

use std::io;
use std::path::{Path, PathBuf};

/// The shared object, as built for this machine.
pub const LIBRARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libclanshim.so"));

/// The file name it is installed under.
pub const FILE_NAME: &str = "libclanshim.so";

/// Writes the library into `dir` (replacing an older one atomically); returns its path.
pub fn install(dir: &Path) -> io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(FILE_NAME);
    if std::fs::read(&path).is_ok_and(|b| b == LIBRARY) {
        return Ok(path);
    }
    let tmp = dir.join(format!(".{FILE_NAME}.{}", std::process::id()));
    std::fs::write(&tmp, LIBRARY)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    #[test]
    fn it_is_a_shared_object() {
        assert_eq!(&super::LIBRARY[..4], b"\x7fELF");
        assert_eq!(super::LIBRARY[16], 3, "ET_DYN");
    }
}
