//! The cluster /proc (issue 5; DESIGN.md 10): a FUSE file system that shows every
//! process of every node as `/GPID`, the cluster's merged node files, each node's own
//! under `nodes/N/`, and the rest of the local /proc passed through, served by one node's
//! cland (`ProcRequest`).
//!
//! - [`view`]: what the mount shows, independent of FUSE, over a [`source::Source`].
//! - [`fs`]: the FUSE layer (fuser), replies from tokio tasks.
//! - [`source`]: cland through a small pool of connections, with timeouts.
//! - [`caller`]: the reader's identity, and whether a caller is a process of the cluster.
//! - [`pass`]: the local /proc accessed with the reader's identity.
//! - [`inode`]: inode numbers that encode the gpid.
//! - [`walk`]: one file of every process in one read, for `clan shell`'s library.
//! - [`mount`]: mounting, the watcher that unmounts after a crash, signals, readiness.
//! - [`mountinfo`]: reading /proc/self/mountinfo.
//!
//! The `clan-procfs` binary is a thin layer over [`mount::serve`]; `clan proc mount`
//! starts it.

pub mod caller;
pub mod fs;
pub mod inode;
pub mod mount;
pub mod mountinfo;
pub mod pass;
pub mod source;
pub mod view;
pub mod walk;
