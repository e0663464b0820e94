//! Shared types of clan: identifiers, signals, exit statuses, named locks and the cluster
//! configuration. Everything here is plain data; no I/O beyond reading a config file.

pub mod config;
pub mod exit;
pub mod id;
pub mod lock;
pub mod logfile;
pub mod pidfile;
pub mod signal;
pub mod sigset;
pub mod sys;
pub mod unixconn;

pub use config::{ClusterConfig, ConfigError, NodeEntry};
pub use exit::{ExitCode, WaitStatus};
pub use id::{Gpid, IdError, JobId, NodeId, CLUSTER_INIT, GPID_SPAN, MAX_NODE};
pub use lock::{NamedAsyncMutex, NamedMutex, NamedRwLock};
pub use signal::{parse_signal, signal_name};

/// Where clan keeps its sockets when nothing else is said.
pub const DEFAULT_DIR: &str = "/run/clan";
