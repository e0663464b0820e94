//! Signals to processes of this node and of others (Solaris MC 4.1).
//!
//! A local signal opens the target's `/proc/PID` directory once, checks POSIX permission
//! against that very process (as kill(2): the sender must be root, or its real or effective
//! uid match the target's real or saved uid; SIGCONT may also go to any process of the
//! sender's cluster session) and sends with pidfd_send_signal on the same handle: no
//! pid-reuse race.

use crate::error::{Error, Result};
use crate::node::Node;
use crate::process::group::Kind;
use crate::process::view::ProcHandle;
use clan_core::sys::{pidfd_send_queued, pidfd_send_signal};
use clan_core::Gpid;
use clan_proto::pb;
use std::sync::Arc;

impl Node {
    /// Delivers `sig` to a process of this node on behalf of `creds`.
    pub fn signal_local(&self, gpid: Gpid, sig: i32, creds: &pb::Creds) -> Result<()> {
        self.signal_local_queued(gpid, sig, creds, None)
    }

    /// Delivers `sig` to a process of this node on behalf of `creds`; with `queued`, as
    /// sigqueue(3) sends it: the receiver's siginfo has `SI_QUEUE`, the value and the
    /// sender's uid. Its `si_pid` is 0: the kernel gives no pid for a sender outside the
    /// receiver's pid namespace (cland is outside the node's), as for any clan signal.
    pub fn signal_local_queued(
        &self,
        gpid: Gpid,
        sig: i32,
        creds: &pb::Creds,
        queued: Option<&pb::Queued>,
    ) -> Result<()> {
        self.signal_local_with(gpid, sig, creds, queued, &mut None)
    }

    /// [`Node::signal_local_queued`] through `held`, the handle of the process a caller
    /// signalled last (a direct link keeps one): reused while it is that gpid's, so a
    /// program that keeps signalling one process costs no open of its /proc directory each
    /// time. A handle outlives nothing: once its process is gone, the kernel refuses
    /// signals through it (ESRCH), and the gpid's directory is opened again, once, in case
    /// the number now stands for another process.
    pub fn signal_local_with(
        &self,
        gpid: Gpid,
        sig: i32,
        creds: &pb::Creds,
        queued: Option<&pb::Queued>,
        held: &mut Option<ProcHandle>,
    ) -> Result<()> {
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
        if let Some(h) = held.as_ref().filter(|h| h.gpid == gpid) {
            match self.signal_handle(h, sig, creds, queued) {
                Err(Error::NoSuchProcess(_)) => {}
                done => return done,
            }
        }
        *held = None;
        let h = self.view.open_process(gpid)?;
        let done = self.signal_handle(&h, sig, creds, queued);
        *held = Some(h);
        done
    }

    /// Checks and sends `sig` through an open /proc directory.
    fn signal_handle(
        &self,
        h: &ProcHandle,
        sig: i32,
        creds: &pb::Creds,
        queued: Option<&pb::Queued>,
    ) -> Result<()> {
        let gpid = h.gpid;
        // Root may signal anything; others need their real or effective uid (`uid`; a
        // request without `ruid`, from an older node, has the effective one only) to be the
        // target's real or saved uid. SIGCONT may go to any process of the sender's session.
        if creds.uid != 0 {
            let u = h.uids()?;
            let senders = [creds.uid, creds.ruid.unwrap_or(creds.uid)];
            let owner = senders.iter().any(|&s| s == u.real || s == u.saved);
            let session = sig == libc::SIGCONT && self.in_session(gpid, creds.sid);
            if !(owner || session) {
                return Err(Error::Permission(format!(
                    "permission denied to signal {gpid} (uid {})",
                    u.real
                )));
            }
        }
        // Signal 0 asks whether the process is there: the handle's process, which may
        // have gone since the handle was opened.
        let sent = match self.terminal_stop(gpid.local(), sig) {
            Some(s) => s,
            None => return Ok(()), // ignored: nothing to deliver
        };
        let res = match queued {
            // A stop clan applies itself (SIGSTOP for a default SIGTSTP) carries nothing.
            Some(q) if sent == sig && sig != 0 => {
                pidfd_send_queued(&h.dir, sig, 0, creds.uid, q.value)
            }
            _ => pidfd_send_signal(&h.dir, sent),
        };
        res.map_err(|e| match e.raw_os_error() {
            Some(libc::ESRCH) => Error::NoSuchProcess(gpid),
            Some(libc::EPERM) => Error::Permission(format!("permission denied to signal {gpid}")),
            _ => Error::internal(&format!("signal {gpid}"), e),
        })
    }

    /// Whether the process `gpid` of this node is in cluster session `sid` (0: none).
    fn in_session(&self, gpid: Gpid, sid: u64) -> bool {
        sid != 0
            && self
                .view
                .attrs(gpid.local(), false)
                .is_some_and(|a| self.cluster_id(Kind::Session, a.session) == sid)
    }

    /// SIGTSTP, SIGTTIN and SIGTTOU to a process whose group its kernel thinks orphaned
    /// (every group clan starts is, to its node's kernel: the process's parent, a shepherd,
    /// is in another session) would be discarded by the kernel unless caught. In the cluster
    /// the group may well be controlled, so clan applies the default action itself, as the
    /// shepherd does for stops through the stub: a caught signal is sent as is, an ignored one
    /// is dropped (`None`), and a default one becomes SIGSTOP.
    fn terminal_stop(&self, pid: u32, sig: i32) -> Option<i32> {
        if ![libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU].contains(&sig) {
            return Some(sig);
        }
        let Some(me) = self.view.attrs(pid, false) else {
            return Some(sig);
        };
        // Orphaned in this kernel: no member has a parent in another group of its session
        // (the kernel's rule, so a shepherd parent counts).
        let controlled = self.view.pids().into_iter().any(|p| {
            let Some(a) = self.view.attrs(p, false) else {
                return false;
            };
            a.pgrp == me.pgrp
                && a.ppid != 0
                && self
                    .view
                    .attrs_raw(a.ppid, false)
                    .is_some_and(|pa| pa.session == a.session && pa.pgrp != a.pgrp)
        });
        if controlled {
            return Some(sig); // the kernel applies the stop itself
        }
        let bit = 1u64 << (sig - 1);
        match self.view.sig_masks(pid) {
            Some((caught, _)) if caught & bit != 0 => Some(sig),
            Some((_, ignored)) if ignored & bit != 0 => None,
            _ => Some(libc::SIGSTOP),
        }
    }

    /// Signals a process by its number in the node's pid namespace, without permission
    /// checks (the daemon's own clean-up), through a handle on its /proc directory.
    pub fn kill_node_pid(&self, pid: u32, sig: i32) {
        if let Some(g) = Gpid::new(self.id, pid) {
            if let Ok(h) = self.view.open_process(g) {
                let _ = pidfd_send_signal(&h.dir, sig);
            }
        }
    }

    /// Delivers `sig` to a process of any node.
    pub async fn signal(self: &Arc<Self>, gpid: Gpid, sig: i32, creds: &pb::Creds) -> Result<()> {
        self.signal_queued(gpid, sig, creds, None).await
    }

    /// Delivers `sig` to a process of any node, queued with a value when `queued` says so.
    pub async fn signal_queued(
        self: &Arc<Self>,
        gpid: Gpid,
        sig: i32,
        creds: &pb::Creds,
        queued: Option<pb::Queued>,
    ) -> Result<()> {
        if gpid.node() == self.id {
            return self.signal_local_queued(gpid, sig, creds, queued.as_ref());
        }
        let op = pb::peer_request::Op::Signal(pb::SignalRequest {
            gpid: gpid.raw(),
            signal: sig,
            queued,
        });
        match self.call(gpid.node(), creds.clone(), op).await? {
            pb::peer_reply::Reply::Ok(_) => Ok(()),
            other => Err(Error::Internal(format!("unexpected reply {other:?}"))),
        }
    }
}
