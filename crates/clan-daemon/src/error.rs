//! The daemon's errors; each maps to one protocol error code and one CLI exit code.

use clan_core::{Gpid, NodeId};
use clan_proto::pb;

#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    #[error("no such process {0}")]
    NoSuchProcess(Gpid),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Permission(String),
    #[error("node {0} is dead")]
    NodeDead(NodeId),
    #[error("{0}")]
    NodeDown(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    CommandNotFound(String),
    #[error("{0}")]
    NotExecutable(String),
    #[error("{0}")]
    Internal(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn internal(what: &str, e: impl std::fmt::Display) -> Error {
        Error::Internal(format!("{what}: {e}"))
    }

    pub fn code(&self) -> pb::ErrorCode {
        use pb::ErrorCode as C;
        match self {
            Error::NoSuchProcess(_) | Error::NotFound(_) => C::NotFound,
            Error::Permission(_) => C::Permission,
            Error::NodeDead(_) | Error::NodeDown(_) => C::NodeDown,
            Error::Invalid(_) => C::Invalid,
            Error::CommandNotFound(_) => C::CommandNotFound,
            Error::NotExecutable(_) => C::NotExecutable,
            Error::Internal(_) => C::Internal,
        }
    }
}

impl From<Error> for pb::Error {
    fn from(e: Error) -> pb::Error {
        pb::Error::new(e.code(), e.to_string())
    }
}

impl From<pb::Error> for Error {
    fn from(e: pb::Error) -> Error {
        use pb::ErrorCode as C;
        let m = e.message.clone();
        match e.kind() {
            C::NotFound => Error::NotFound(m),
            C::Permission => Error::Permission(m),
            C::NodeDown => Error::NodeDown(m),
            C::Invalid => Error::Invalid(m),
            C::CommandNotFound => Error::CommandNotFound(m),
            C::NotExecutable => Error::NotExecutable(m),
            C::Internal | C::Busy | C::ErrorUnspecified => Error::Internal(m),
        }
    }
}

/// An answer too large for one frame (a listing of a huge directory, a snapshot of huge
/// files): the error to send instead, so that the asker hears something and the
/// connection stays usable (a frame above the limit would make its reader drop the link).
pub fn too_large(n: usize) -> Option<Error> {
    (n + 4096 > clan_proto::MAX_FRAME).then(|| {
        Error::Invalid(format!(
            "the answer is too large to send ({n} bytes, at most {})",
            clan_proto::MAX_FRAME
        ))
    })
}
