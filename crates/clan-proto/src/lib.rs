//! clan's wire protocol.
//!
//! The messages are generated from `proto/clan.proto` (the IDL between nodes, clients and
//! shepherds). [`frame`] puts them on a byte stream with a length prefix and a size limit;
//! [`auth`] authenticates peers with the cluster key and MACs every frame between nodes.
//! Protocol types stop here: the daemon converts them into its own types at the edge.

pub mod auth;
pub mod convert;
pub mod frame;
pub mod window;

/// Messages generated from `proto/clan.proto`.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/clan.v1.rs"));
}

/// The byte a settled shepherd writes on its report pipe before it reads its spec: it
/// waits (cland takes no shepherd that has not said so).
pub const SHEPHERD_WAITING: u8 = b'w';

/// Protocol version carried in every Hello: a peer of another version is refused at its
/// Hello. 2: the three-message handshake whose proofs cover both nonces and identities.
/// 3: direct links (connections of kind CLIENT, whose Hello carries a client's credentials).
pub const VERSION: u32 = 3;

/// Largest frame accepted from anyone (16 MiB): a bigger length is malformed input.
pub const MAX_FRAME: usize = 16 << 20;

/// Largest request frame a node reads from a local client (4 MiB and 64 KiB). The largest
/// legitimate ones are a stub's resend of the input a restarted cland lacks (one
/// [`window::WINDOW`] of 4 MiB) and a `clan run` whose arguments and environment are as
/// large as an exec takes (`ARG_MAX`, a quarter of the stack limit: 2 MiB with the usual
/// 8 MiB). Much less than [`MAX_FRAME`]: a request goes on to another node with the
/// caller's credentials and a MAC, and a frame of many empty items decodes to many times
/// its size.
pub const MAX_LOCAL_FRAME: usize = window::WINDOW + (64 << 10);

pub use frame::{read_frame, read_frame_sync, write_frame, write_frame_sync, FrameError};

/// Whether `name`, looked up in the directory `dir` of a process's /proc (`fd`, `ns`,
/// `task/TID/fd`, `task/TID/ns`), is what one of its links reads rather than one of its
/// own names: the kernel follows a link to a pipe, socket, anonymous inode or namespace
/// (`pipe:[123]`, `socket:[456]`, `anon_inode:[eventfd]`, `net:[4026531840]`) by looking
/// its target up as a name next to it. These are the targets `PROC_STAT_LINK` follows;
/// a descriptor's link to a file is not among them (a path, followed by the kernel).
pub fn followed_link(dir: &str, name: &str) -> bool {
    // `fd`, `ns`, or the same under `task/TID/` (no allocation: a lookup's path).
    let last = match dir.rsplit_once('/') {
        None => dir,
        Some((pre, last)) => match pre.strip_prefix("task/") {
            Some(tid) if !tid.contains('/') => last,
            _ => return false,
        },
    };
    match last {
        "fd" => ["pipe:[", "socket:[", "anon_inode:"]
            .iter()
            .any(|p| name.starts_with(p)),
        "ns" => name
            .strip_suffix(']')
            .and_then(|n| n.split_once(":["))
            .is_some_and(|(kind, id)| {
                !kind.is_empty()
                    && kind.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                    && !id.is_empty()
                    && id.bytes().all(|b| b.is_ascii_digit())
            }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::followed_link;

    #[test]
    fn followed_links_are_the_targets_of_descriptors_and_namespaces() {
        assert!(followed_link("fd", "pipe:[123]"));
        assert!(followed_link("task/7/fd", "anon_inode:[eventfd]"));
        assert!(followed_link("ns", "net:[4026531840]"));
        assert!(followed_link("task/7/ns", "pid_for_children:[4026531836]"));
        assert!(!followed_link("ns", "net"));
        assert!(!followed_link("ns", "net:[]"));
        assert!(!followed_link("ns", "net:[12a]"));
        assert!(!followed_link("ns", "pipe:[1"));
        assert!(!followed_link("ns", ":[1]"));
        assert!(!followed_link("fd", "net:[4026531840]"));
        assert!(!followed_link("fd", "3"));
        assert!(!followed_link("ns", "pipe:[123]/x"));
        assert!(!followed_link("fdinfo", "pipe:[123]"));
        assert!(!followed_link("", "pipe:[123]"));
        assert!(!followed_link("task/fd", "pipe:[123]"));
        assert!(!followed_link("task/7/8/fd", "pipe:[123]"));
        assert!(!followed_link("x/7/fd", "pipe:[123]"));
    }
}
