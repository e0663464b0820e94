//! Walk files: one process file (`stat`, `status`, ...) of every process of a snapshot in
//! one read, for the preloaded library of `clan shell` (architecture.md, "Walks").
//!
//! A tool that lists /proc and then reads a few files of every process (ps, top, pgrep)
//! costs the FUSE mount an open, a read or two and a release per file: a few round trips
//! between the tool and the server each, where the kernel's own /proc costs none. After a
//! process of a clan shell lists `/proc`, its preloaded library reads
//! `/proc/.clan-walk/NAME` once and serves that process's opens of `/proc/GPID/NAME`
//! from it for a short while (see `crates/clan-shim/walk.c`), as well as its `stat(2)` of
//! `/proc/GPID` and its opens of names a process directory of that node does not have
//! (ps tries `ctty`). The contents are the same the mount serves for each file: the
//! snapshot the listing took, for the same reader.
//!
//! The format, little-endian: [`MAGIC`]; the number of nodes whose names follow (u32),
//! and for each the node (u32), the length of its names (u32) and the names of a process
//! directory of that node, each ended by a NUL; then one record per process in increasing
//! gpid order: gpid (u64), the owner of `/GPID` (uid u32, gid u32), an errno (u32; 0: the
//! reader may read the file), the length of the contents (u32), the contents.

/// The first bytes of a walk file (its version in the last byte).
pub const MAGIC: &[u8; 8] = b"clanwlk1";

/// The hidden directory of the view's root that holds the walk files (not listed).
pub const DIR: &str = ".clan-walk";

/// The files a walk can carry: the snapshot's, then the ones fetched per walk. `ns` is no
/// file of /proc: the targets of a process's namespace links, a line `NAME TARGET` each,
/// for the `stat(2)`s that follow them (pstree makes eight per process).
pub const FILES: [&str; 7] = [
    "stat", "status", "cmdline", "statm", "environ", "cgroup", "ns",
];

/// Bytes before each record's contents.
const HEADER: usize = 8 + 4 + 4 + 4 + 4;

/// One process's file in a walk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    pub gpid: u64,
    pub uid: u32,
    pub gid: u32,
    /// The contents, or the errno a reader gets for the file (EACCES).
    pub contents: Result<&'a [u8], i32>,
}

/// The names of a process directory on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names<'a> {
    pub node: u32,
    pub names: Vec<&'a str>,
}

/// Encodes `names` and `records` (in the order given: callers sort records by gpid).
pub fn encode<'a>(names: &[Names<'_>], records: impl IntoIterator<Item = Record<'a>>) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&(names.len() as u32).to_le_bytes());
    for n in names {
        let list: Vec<u8> = n
            .names
            .iter()
            .filter(|s| !s.is_empty() && !s.contains('\0'))
            .flat_map(|s| s.bytes().chain([0]))
            .collect();
        out.extend_from_slice(&n.node.to_le_bytes());
        out.extend_from_slice(&(list.len() as u32).to_le_bytes());
        out.extend_from_slice(&list);
    }
    for r in records {
        let (errno, data): (u32, &[u8]) = match r.contents {
            Ok(d) if d.len() <= u32::MAX as usize => (0, d),
            Ok(_) => (libc::EFBIG as u32, &[]),
            Err(e) => (e.max(1) as u32, &[]),
        };
        out.extend_from_slice(&r.gpid.to_le_bytes());
        out.extend_from_slice(&r.uid.to_le_bytes());
        out.extend_from_slice(&r.gid.to_le_bytes());
        out.extend_from_slice(&errno.to_le_bytes());
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(data);
    }
    out
}

fn u32_of(b: &[u8]) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(..4)?.try_into().ok()?))
}

/// A decoded walk file: the nodes' names and the records.
pub type Decoded<'a> = (Vec<Names<'a>>, Vec<Record<'a>>);

/// Decodes a walk file; `None` if it is not one or is cut short (never panics).
pub fn decode(buf: &[u8]) -> Option<Decoded<'_>> {
    let mut rest = buf.strip_prefix(MAGIC.as_slice())?;
    let nodes = u32_of(rest)?;
    rest = &rest[4..];
    let mut names = Vec::new();
    for _ in 0..nodes {
        let (node, len) = (u32_of(rest)?, u32_of(rest.get(4..)?)? as usize);
        let list = rest.get(8..8usize.checked_add(len)?)?;
        if !list.is_empty() && list.last() != Some(&0) {
            return None;
        }
        let list = list.strip_suffix(&[0]).unwrap_or(list);
        names.push(Names {
            node,
            names: if list.is_empty() {
                Vec::new()
            } else {
                list.split(|b| *b == 0)
                    .map(std::str::from_utf8)
                    .collect::<Result<_, _>>()
                    .ok()?
            },
        });
        rest = &rest[8 + len..];
    }
    let mut out = Vec::new();
    while !rest.is_empty() {
        let head = rest.get(..HEADER)?;
        let u32_at = |i: usize| u32::from_le_bytes(head[i..i + 4].try_into().unwrap_or_default());
        let gpid = u64::from_le_bytes(head[..8].try_into().ok()?);
        let (uid, gid, errno, len) = (u32_at(8), u32_at(12), u32_at(16), u32_at(20) as usize);
        let data = rest.get(HEADER..HEADER.checked_add(len)?)?;
        out.push(Record {
            gpid,
            uid,
            gid,
            contents: if errno == 0 {
                Ok(data)
            } else {
                Err(errno as i32)
            },
        });
        rest = &rest[HEADER + len..];
    }
    Some((names, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let recs = vec![
            Record {
                gpid: 1,
                uid: 0,
                gid: 0,
                contents: Ok(b"1 (clan) S 0 1 1 0 -1"),
            },
            Record {
                gpid: 20_000_006,
                uid: 1000,
                gid: 100,
                contents: Err(libc::EACCES),
            },
            Record {
                gpid: 30_000_001,
                uid: 0,
                gid: 0,
                contents: Ok(b""),
            },
        ];
        let names = vec![
            Names {
                node: 1,
                names: vec!["stat", "status", "fd"],
            },
            Names {
                node: 2,
                names: vec![],
            },
        ];
        let bytes = encode(&names, recs.clone());
        assert_eq!(decode(&bytes), Some((names, recs)));
        let empty = encode(&[], []);
        assert_eq!(decode(&empty), Some((vec![], vec![])));
    }

    #[test]
    fn malformed_bytes_are_refused_not_panicked_on() {
        let names = [Names {
            node: 1,
            names: vec!["stat", "ctty"],
        }];
        let bytes = encode(
            &names,
            [Record {
                gpid: 10_000_001,
                uid: 0,
                gid: 0,
                contents: Ok(b"some contents"),
            }],
        );
        let names_end = MAGIC.len() + 4 + 8 + "stat\0ctty\0".len();
        for cut in 0..bytes.len() {
            if cut != names_end {
                assert_eq!(decode(&bytes[..cut]), None, "cut at {cut}");
            }
        }
        assert_eq!(decode(b"clanwlk2\0\0\0\0"), None);
        let mut huge = encode(&[], []);
        huge.extend_from_slice(&[0xff; HEADER]);
        assert_eq!(decode(&huge), None);
        let mut many = MAGIC.to_vec();
        many.extend_from_slice(&[0xff; 12]);
        assert_eq!(decode(&many), None);
    }
}
