//! Reading /proc/self/mountinfo: is a path a mount point, and is it a cluster /proc.

use std::path::{Path, PathBuf};

/// The source name the view is mounted with.
pub const SOURCE: &str = "clanproc";

/// One line of mountinfo, the fields the view needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub id: u64,
    pub point: PathBuf,
    pub fstype: String,
    pub source: String,
}

impl Mount {
    /// Whether this is a cluster /proc (a FUSE mount named `clanproc`).
    pub fn is_cluster_proc(&self) -> bool {
        (self.fstype == "fuse" || self.fstype.starts_with("fuse.")) && self.source == SOURCE
    }
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let oct = &b[i + 1..i + 4];
            if oct.iter().all(|c| (b'0'..=b'7').contains(c)) {
                let v = oct.iter().fold(0u32, |a, c| a * 8 + u32::from(c - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// Parses mountinfo text; lines that do not parse are skipped.
pub fn parse(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            let id = f.first()?.parse().ok()?;
            let point = unescape(f.get(4)?);
            let mut r = right.split(' ');
            let fstype = r.next()?.to_string();
            let source = r.next().unwrap_or("").to_string();
            Some(Mount {
                id,
                point,
                fstype,
                source,
            })
        })
        .collect()
}

/// The mounts of the calling process's mount namespace.
pub fn read() -> Vec<Mount> {
    read_from(Path::new("/proc/self/mountinfo"))
}

/// The mounts of another mount namespace, from a process's mountinfo in it.
pub fn read_from(mountinfo: &Path) -> Vec<Mount> {
    parse(&std::fs::read_to_string(mountinfo).unwrap_or_default())
}

/// The mount on top at `point` (the last one mounted there), if any.
pub fn top_at(mounts: &[Mount], point: &Path) -> Option<Mount> {
    mounts.iter().rev().find(|m| m.point == point).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
140 22 0:55 / /tmp/my\\040view ro,nosuid,nodev,relatime - fuse clanproc ro,user_id=0,group_id=0,allow_other
141 22 0:56 / /tmp/x rw - fuse.clanproc clanproc rw
garbage line
";

    #[test]
    fn finds_cluster_proc_mounts() {
        let m = parse(SAMPLE);
        assert_eq!(m.len(), 3);
        let v = top_at(&m, Path::new("/tmp/my view")).expect("mounted");
        assert_eq!(v.id, 140);
        assert!(v.is_cluster_proc());
        assert!(top_at(&m, Path::new("/tmp/x")).unwrap().is_cluster_proc());
        assert!(!top_at(&m, Path::new("/proc")).unwrap().is_cluster_proc());
        assert!(top_at(&m, Path::new("/tmp")).is_none());
    }

    #[test]
    fn escapes() {
        assert_eq!(unescape("a\\040b"), PathBuf::from("a b"));
        assert_eq!(unescape("a\\04"), PathBuf::from("a\\04"));
        assert_eq!(unescape("\\"), PathBuf::from("\\"));
        assert_eq!(unescape("a\\999"), PathBuf::from("a\\999"));
    }
}
