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

/// Undoes mountinfo's octal escapes (`\040` for a space). The rest is kept byte for byte:
/// a mount point need not be UTF-8.
fn unescape(b: &[u8]) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
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

/// One line of mountinfo, if it parses.
fn parse_line(l: &[u8]) -> Option<Mount> {
    let f: Vec<&[u8]> = l.split(|&c| c == b' ').collect();
    // id parent major:minor root point options [optional fields...] - type source ...
    let dash = 6 + f.get(6..)?.iter().position(|x| *x == b"-")?;
    let id = std::str::from_utf8(f.first()?).ok()?.parse().ok()?;
    let point = unescape(f.get(4)?);
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    Some(Mount {
        id,
        point,
        fstype: text(f.get(dash + 1)?),
        source: f.get(dash + 2).map_or_else(String::new, |s| text(s)),
    })
}

/// Parses mountinfo; lines that do not parse are skipped, not the whole text.
pub fn parse_bytes(text: &[u8]) -> Vec<Mount> {
    text.split(|&c| c == b'\n').filter_map(parse_line).collect()
}

/// Parses mountinfo text; lines that do not parse are skipped.
pub fn parse(text: &str) -> Vec<Mount> {
    parse_bytes(text.as_bytes())
}

/// The mounts of the calling process's mount namespace.
pub fn read() -> Vec<Mount> {
    read_from(Path::new("/proc/self/mountinfo"))
}

/// The mounts of another mount namespace, from a process's mountinfo in it. Read as
/// bytes: a mount point anywhere may be any bytes (a Latin-1 name), and a text read of
/// the file would fail on it whole.
pub fn read_from(mountinfo: &Path) -> Vec<Mount> {
    parse_bytes(&std::fs::read(mountinfo).unwrap_or_default())
}

/// The mount on top at `point` (the last one mounted there), if any.
pub fn top_at(mounts: &[Mount], point: &Path) -> Option<Mount> {
    mounts.iter().rev().find(|m| m.point == point).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

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
        assert_eq!(unescape(b"a\\040b"), PathBuf::from("a b"));
        assert_eq!(unescape(b"a\\04"), PathBuf::from("a\\04"));
        assert_eq!(unescape(b"\\"), PathBuf::from("\\"));
        assert_eq!(unescape(b"a\\999"), PathBuf::from("a\\999"));
    }

    #[test]
    fn a_mount_point_that_is_not_utf8_spoils_nothing() {
        use std::os::unix::ffi::OsStrExt;
        // A Latin-1 name ("caf\xe9 d\xfc", with a space) mounted somewhere on the machine.
        let mut text = b"22 1 0:21 / /proc rw shared:12 - proc proc rw\n".to_vec();
        text.extend_from_slice(b"90 22 0:40 / /mnt/caf\xe9\\040d\xfc rw - tmpfs t\xe9 rw\n");
        text.extend_from_slice(b"not a mount\n\xff\xfe - x\n");
        text.extend_from_slice(
            b"141 22 0:56 / /tmp/x rw master:3 - fuse.clanproc clanproc rw,user_id=0\n",
        );
        assert!(std::str::from_utf8(&text).is_err());
        let m = parse_bytes(&text);
        assert_eq!(m.iter().map(|m| m.id).collect::<Vec<_>>(), [22, 90, 141]);
        let odd = Path::new(OsStr::from_bytes(b"/mnt/caf\xe9 d\xfc"));
        assert_eq!(top_at(&m, odd).map(|m| m.id), Some(90));
        assert_eq!(m[1].fstype, "tmpfs");
        let v = top_at(&m, Path::new("/tmp/x")).expect("the view");
        assert!(v.is_cluster_proc());
        // Read from a file, as the server reads its namespace's.
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("mountinfo");
        std::fs::write(&f, &text).unwrap();
        assert_eq!(read_from(&f), m);
    }
}
