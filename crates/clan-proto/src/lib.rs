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
