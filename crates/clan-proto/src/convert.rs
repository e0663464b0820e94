//! Conversions between protocol messages and clan-core types.

use crate::pb;
use clan_core::WaitStatus;

impl From<pb::ExitStatus> for WaitStatus {
    fn from(s: pb::ExitStatus) -> WaitStatus {
        WaitStatus {
            code: s.code,
            signal: s.signal,
            core_dumped: s.core_dumped,
            utime_us: s.utime_us,
            stime_us: s.stime_us,
        }
    }
}

impl From<WaitStatus> for pb::ExitStatus {
    fn from(s: WaitStatus) -> pb::ExitStatus {
        pb::ExitStatus {
            code: s.code,
            signal: s.signal,
            core_dumped: s.core_dumped,
            utime_us: s.utime_us,
            stime_us: s.stime_us,
        }
    }
}

impl pb::Error {
    pub fn new(code: pb::ErrorCode, message: impl Into<String>) -> pb::Error {
        pb::Error {
            code: code as i32,
            message: message.into(),
        }
    }

    pub fn kind(&self) -> pb::ErrorCode {
        pb::ErrorCode::try_from(self.code).unwrap_or(pb::ErrorCode::Internal)
    }
}

impl std::fmt::Display for pb::Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for pb::Error {}
