//! Node ids, global process ids (gpids) and job ids (DESIGN.md 6).

use std::fmt;
use std::str::FromStr;

/// Width of a node's gpid range: gpid = node * GPID_SPAN + local number.
pub const GPID_SPAN: u64 = 10_000_000;
/// Pid 1 of the cluster /proc: the cluster's init, parent of every node's init (no node's
/// own numbers reach it: gpids start at one node's span).
pub const CLUSTER_INIT: u64 = 1;
/// Highest node id whose gpids still fit a positive `pid_t`.
pub const MAX_NODE: u32 = 213;
/// Width of a node's job id range: job = node * JOB_SPAN + sequence number.
pub const JOB_SPAN: u64 = 1_000_000;

/// Why a string is not an id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("invalid node id {0:?} (nodes are numbered 1..={MAX_NODE})")]
    Node(String),
    #[error("invalid gpid {0:?} (expected a number like 30004711 or NODE:PID like 3:4711)")]
    Gpid(String),
    #[error("invalid job id {0:?}")]
    Job(String),
}

/// A node of the cluster, 1..=213.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(u32);

impl NodeId {
    /// A node id, or `None` when outside 1..=213.
    pub fn new(n: u32) -> Option<NodeId> {
        (1..=MAX_NODE).contains(&n).then_some(NodeId(n))
    }

    pub fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for NodeId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.trim()
            .parse::<u32>()
            .ok()
            .and_then(NodeId::new)
            .ok_or_else(|| IdError::Node(s.to_string()))
    }
}

/// A cluster-wide process id: `node * 10^7 + local`, stable for the life of the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Gpid(u64);

impl Gpid {
    /// The gpid of local number `local` on `node`, if `local` fits the node's range.
    pub fn new(node: NodeId, local: u32) -> Option<Gpid> {
        (u64::from(local) < GPID_SPAN && local > 0)
            .then(|| Gpid(u64::from(node.0) * GPID_SPAN + u64::from(local)))
    }

    /// Interprets a raw number; `None` when it names no valid node or local number.
    pub fn from_raw(raw: u64) -> Option<Gpid> {
        let node = u32::try_from(raw / GPID_SPAN).ok().and_then(NodeId::new)?;
        Gpid::new(node, (raw % GPID_SPAN) as u32)
    }

    pub fn raw(self) -> u64 {
        self.0
    }

    /// The home node: the node the gpid was born on.
    pub fn node(self) -> NodeId {
        NodeId((self.0 / GPID_SPAN) as u32)
    }

    /// The local process number on the home node.
    pub fn local(self) -> u32 {
        (self.0 % GPID_SPAN) as u32
    }
}

impl fmt::Display for Gpid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for Gpid {
    type Err = IdError;
    /// Accepts `30004711` and `3:4711`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || IdError::Gpid(s.to_string());
        let t = s.trim();
        if let Some((node, pid)) = t.split_once(':') {
            let node: NodeId = node.parse().map_err(|_| bad())?;
            let pid: u32 = pid.parse().map_err(|_| bad())?;
            Gpid::new(node, pid).ok_or_else(bad)
        } else {
            t.parse::<u64>()
                .ok()
                .and_then(Gpid::from_raw)
                .ok_or_else(bad)
        }
    }
}

/// A cluster-wide job id: `origin node * 10^6 + sequence`, allocated without a central server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobId(u64);

impl JobId {
    pub fn new(node: NodeId, seq: u64) -> Option<JobId> {
        (seq > 0 && seq < JOB_SPAN).then(|| JobId(u64::from(node.0) * JOB_SPAN + seq))
    }

    pub fn from_raw(raw: u64) -> Option<JobId> {
        let node = u32::try_from(raw / JOB_SPAN).ok().and_then(NodeId::new)?;
        JobId::new(node, raw % JOB_SPAN)
    }

    pub fn raw(self) -> u64 {
        self.0
    }

    pub fn origin(self) -> NodeId {
        NodeId((self.0 / JOB_SPAN) as u32)
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for JobId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.trim()
            .parse::<u64>()
            .ok()
            .and_then(JobId::from_raw)
            .ok_or_else(|| IdError::Job(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpid_layout_matches_solaris_mc() {
        let g = Gpid::new(NodeId::new(3).unwrap(), 4711).unwrap();
        assert_eq!(g.raw(), 30_004_711);
        assert_eq!(g.node().get(), 3);
        assert_eq!(g.local(), 4711);
        assert_eq!("3:4711".parse::<Gpid>().unwrap(), g);
        assert_eq!("30004711".parse::<Gpid>().unwrap(), g);
    }

    #[test]
    fn every_gpid_fits_a_positive_pid_t() {
        let g = Gpid::new(NodeId::new(MAX_NODE).unwrap(), 4_194_304).unwrap();
        assert!(i32::try_from(g.raw()).is_ok());
        assert!(NodeId::new(MAX_NODE + 1).is_none());
    }

    #[test]
    fn malformed_ids_are_rejected() {
        for bad in [
            "",
            "x",
            "0",
            "4711",
            "0:5",
            "3:",
            ":5",
            "214:1",
            "3:0",
            "3:99999999",
            "-1",
        ] {
            assert!(bad.parse::<Gpid>().is_err(), "{bad:?} accepted");
        }
        assert!("0".parse::<NodeId>().is_err());
        assert!("1000000".parse::<JobId>().is_err());
        assert_eq!("1000007".parse::<JobId>().unwrap().origin().get(), 1);
    }
}
