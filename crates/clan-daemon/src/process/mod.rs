//! Processes of this node: the kernel's view (`view`), managed processes and their
//! shepherds (`vproc`), signals (`signal`) and the parent side of waits (`wait`).

pub mod group;
pub mod orphan;
pub mod signal;
pub mod view;
pub mod vproc;
pub mod wait;
