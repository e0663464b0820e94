//! The view server's decoders on malformed input (DESIGN.md 18): walk files (written for
//! the shim, read back by anyone who can open them) and mountinfo text give a value or
//! `None`, never a panic.

use clan_procfs::{mountinfo, walk};
use proptest::collection::vec;
use proptest::prelude::*;

const MOUNTINFO: &str =
    "22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n\
41 22 0:37 / /proc/sys/fs/binfmt_misc rw,relatime shared:20 - autofs systemd-1 rw,fd=29\n\
60 1 0:52 / /tmp/x\\040y rw - fuse clanproc rw,user_id=0,group_id=0\n";

proptest! {
    // No regression files written into the source tree.
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::with_cases(2000) })]

    #[test]
    fn walk_files_of_any_content_decode_or_fail(bytes in vec(any::<u8>(), 0..1024)) {
        let _ = walk::decode(&bytes);
        // With the right magic, so that the decoder gets past it.
        let mut b = walk::MAGIC.to_vec();
        b.extend_from_slice(&bytes);
        let _ = walk::decode(&b);
    }

    #[test]
    fn mountinfo_of_any_content_parses(text in any::<String>()) {
        let _ = mountinfo::parse(&text);
    }

    #[test]
    fn damaged_mountinfo_parses(edits in vec((any::<usize>(), any::<u8>()), 0..8), cut in any::<usize>()) {
        let mut b = MOUNTINFO.as_bytes().to_vec();
        for (at, v) in edits {
            let i = at % b.len();
            b[i] = v;
        }
        b.truncate(cut % (b.len() + 1));
        let _ = mountinfo::parse(&String::from_utf8_lossy(&b));
    }
}
