//! User names and ids for the command line (`ps -u NAME`, `sigsend uid=NAME`, the owners in
//! `job ls`).
//!
//! The release build links `clan` statically, and a statically linked glibc can not load NSS
//! modules safely (its dlopen of a module such as libnss_systemd crashes the process). Such a
//! binary asks getent(1) instead, which the system's libc answers with the system's NSS
//! configuration, and only if getent can not be run does it read /etc/passwd itself. A
//! dynamically linked build calls getpwnam_r/getpwuid_r directly.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// Whether this process runs without a program interpreter (statically linked): the kernel
/// then passes AT_BASE 0. (A program started through ld.so explicitly looks static too,
/// and takes the getent path, which is always correct, only slower.)
fn linked_statically() -> bool {
    // SAFETY: getauxval only reads the auxiliary vector; it has no preconditions.
    unsafe { libc::getauxval(libc::AT_BASE) == 0 }
}

/// The uid of user `name`.
pub fn uid_of(name: &str) -> Option<u32> {
    if name.is_empty() {
        return None;
    }
    if !linked_statically() {
        return nix::unistd::User::from_name(name)
            .ok()
            .flatten()
            .map(|u| u.uid.as_raw());
    }
    lookup(name, |e| e.name == name).map(|e| e.uid)
}

/// The name of user `uid` (remembered: `job ls` asks once per task).
pub fn name_of(uid: u32) -> Option<String> {
    static NAMES: Mutex<BTreeMap<u32, Option<String>>> = Mutex::new(BTreeMap::new());
    if let Some(n) = NAMES.lock().ok()?.get(&uid) {
        return n.clone();
    }
    let name = if linked_statically() {
        lookup(&uid.to_string(), |e| e.uid == uid).map(|e| e.name)
    } else {
        nix::unistd::User::from_uid(uid.into())
            .ok()
            .flatten()
            .map(|u| u.name)
    };
    NAMES.lock().ok()?.insert(uid, name.clone());
    name
}

struct Entry {
    name: String,
    uid: u32,
}

/// A passwd line: name:password:uid:...
fn parse(line: &str) -> Option<Entry> {
    let mut f = line.split(':');
    let name = f.next()?.to_string();
    let uid = f.nth(1)?.parse().ok()?;
    Some(Entry { name, uid })
}

/// `getent passwd KEY`, or the first line of /etc/passwd that `hit` accepts when getent can
/// not be run.
fn lookup(key: &str, hit: impl Fn(&Entry) -> bool) -> Option<Entry> {
    match Command::new("getent")
        .args(["passwd", "--", key])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
    {
        // Exit status 2: no such entry.
        Ok(out) => out
            .status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).lines().find_map(parse))
            .flatten()
            .filter(&hit),
        Err(_) => std::fs::read_to_string("/etc/passwd")
            .ok()?
            .lines()
            .filter_map(parse)
            .find(hit),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwd_lines() {
        let e = parse("daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin").unwrap();
        assert_eq!((e.name.as_str(), e.uid), ("daemon", 1));
        assert!(parse("broken").is_none());
        assert!(parse("a:x:notanumber:1").is_none());
    }

    #[test]
    fn root_both_ways() {
        assert_eq!(uid_of("root"), Some(0));
        assert_eq!(name_of(0).as_deref(), Some("root"));
        assert_eq!(uid_of("no-such-user-of-clan"), None);
        assert_eq!(uid_of(""), None);
        assert_eq!(lookup("root", |e| e.name == "root").map(|e| e.uid), Some(0));
        assert!(lookup("no-such-user-of-clan", |_| true).is_none());
    }
}
