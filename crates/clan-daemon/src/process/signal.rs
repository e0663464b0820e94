//! Signals to processes of this node and of others (Solaris MC 4.1).
//!
//! A local signal opens the target's `/proc/PID` directory once, checks POSIX permission
//! against that very process (the sender's uid must be root or match the target's real or
//! saved uid) and sends with pidfd_send_signal on the same handle: no pid-reuse race.

use crate::error::{Error, Result};
use crate::node::Node;
use clan_core::sys::pidfd_send_signal;
use clan_core::Gpid;
use clan_proto::pb;
use std::sync::Arc;

impl Node {
    /// Delivers `sig` to a process of this node on behalf of `creds`.
    pub fn signal_local(&self, gpid: Gpid, sig: i32, creds: &pb::Creds) -> Result<()> {
        let _g = clan_core::lock::giant();
        if !(0..=libc::SIGRTMAX()).contains(&sig) {
            return Err(Error::Invalid(format!("invalid signal {sig}")));
        }
        if self.view.ns_init != 0 && gpid.local() == 1 {
            return Err(Error::Permission(format!(
                "{gpid} is the init of node {}: it can not be signalled",
                self.id
            )));
        }
        let h = self.view.open_process(gpid)?;
        // Root may signal anything; others need the target's real and saved uids.
        if creds.uid != 0 {
            let u = h.uids()?;
            if creds.uid != u.real && creds.uid != u.saved {
                return Err(Error::Permission(format!(
                    "permission denied to signal {gpid} (uid {})",
                    u.real
                )));
            }
        }
        if sig == 0 {
            return Ok(());
        }
        pidfd_send_signal(&h.dir, sig).map_err(|e| match e.raw_os_error() {
            Some(libc::ESRCH) => Error::NoSuchProcess(gpid),
            Some(libc::EPERM) => Error::Permission(format!("permission denied to signal {gpid}")),
            _ => Error::internal(&format!("signal {gpid}"), e),
        })
    }

    /// Delivers `sig` to a process of any node.
    pub async fn signal(self: &Arc<Self>, gpid: Gpid, sig: i32, creds: &pb::Creds) -> Result<()> {
        if gpid.node() == self.id {
            return self.signal_local(gpid, sig, creds);
        }
        let op = pb::peer_request::Op::Signal(pb::SignalRequest {
            gpid: gpid.raw(),
            signal: sig,
        });
        match self.call(gpid.node(), creds.clone(), op).await? {
            pb::peer_reply::Reply::Ok(_) => Ok(()),
            other => Err(Error::Internal(format!("unexpected reply {other:?}"))),
        }
    }
}
