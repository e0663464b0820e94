//! Waits across nodes, push model (Solaris MC 4.4).
//!
//! The node holding a detached process pushes its exit status (childstatuschange) to the
//! node its parent asked from, which keeps it in `children` until a `wait` collects it; the
//! wait then releases the zombie at home (releasechild), and only then can the gpid be
//! reused, because the shepherd keeps the kernel's zombie until that release. A node that
//! lost its table in a restart falls back to asking the home node (pull), which the
//! shepherd can always answer.

use crate::error::{Error, Result};
use crate::node::Node;
use crate::process::vproc::VProc;
use clan_core::{Gpid, NodeId, WaitStatus};
use clan_proto::pb::{self, shepherd_in::Msg as In};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tracing::{debug, info};

/// The parent side's record of a child that lives on some node.
pub struct ChildRec {
    pub uid: u32,
    pub status: watch::Sender<Option<WaitStatus>>,
}

fn may_wait(creds: &pb::Creds, uid: u32, gpid: Gpid) -> Result<()> {
    if creds.uid == 0 || creds.uid == uid {
        Ok(())
    } else {
        Err(Error::Permission(format!(
            "{gpid} is not a child of uid {}",
            creds.uid
        )))
    }
}

impl Node {
    /// Parent side: a child was started on our behalf; expect its status.
    pub fn expect_child(&self, gpid: Gpid, uid: u32) {
        self.children
            .lock()
            .entry(gpid)
            .or_insert_with(|| ChildRec {
                uid,
                status: watch::channel(None).0,
            });
    }

    /// Parent side: childstatuschange arrived.
    pub fn child_status(&self, gpid: Gpid, uid: u32, ws: WaitStatus) {
        let mut ch = self.children.lock();
        let rec = ch.entry(gpid).or_insert_with(|| ChildRec {
            uid,
            status: watch::channel(None).0,
        });
        rec.status.send_replace(Some(ws));
    }

    /// Parent side: a node died; its children are, to us, killed by SIGKILL.
    pub fn children_of_dead_node(&self, dead: NodeId) {
        let ch = self.children.lock();
        for (g, rec) in ch.iter() {
            if g.node() == dead && rec.status.borrow().is_none() {
                rec.status.send_replace(Some(WaitStatus {
                    signal: libc::SIGKILL,
                    ..Default::default()
                }));
            }
        }
    }

    /// Home side: a managed process exited.
    pub fn process_exited(self: &Arc<Self>, vp: &Arc<VProc>, ws: WaitStatus) {
        debug!(gpid = %vp.gpid, status = %ws.describe(), "exited");
        if !vp.detached {
            return; // the stub collects it through its session
        }
        if vp.parent_node == self.id {
            self.child_status(vp.gpid, vp.uid, ws);
            return;
        }
        let node = self.clone();
        let (gpid, uid, job, parent) = (vp.gpid, vp.uid, vp.job, vp.parent_node);
        tokio::spawn(async move {
            loop {
                let op = pb::peer_request::Op::Status(pb::ChildStatus {
                    gpid: gpid.raw(),
                    status: Some(ws.into()),
                    job,
                    uid,
                });
                match node.call(parent, node.own_creds(), op).await {
                    Ok(_) => return,
                    Err(Error::NodeDead(_)) => {
                        // The parent's node is gone: nobody will wait; release the zombie.
                        info!(gpid = %gpid, parent = %parent, "parent node dead, releasing");
                        node.release_local(gpid);
                        return;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        });
    }

    /// Home side: let the shepherd reap the zombie.
    pub fn release_local(&self, gpid: Gpid) {
        if let Some(vp) = self.vprocs.read().get(&gpid) {
            vp.send(In::Release(true));
        }
    }

    async fn release(self: &Arc<Self>, gpid: Gpid) {
        if gpid.node() == self.id {
            self.release_local(gpid);
        } else {
            let op = pb::peer_request::Op::Release(pb::ReleaseRequest { gpid: gpid.raw() });
            let _ = self.call(gpid.node(), self.own_creds(), op).await;
        }
    }

    /// Home side: the status of a local managed process, once it has one (the pull path).
    pub async fn wait_home(&self, gpid: Gpid, creds: &pb::Creds) -> Result<WaitStatus> {
        let vp = self
            .vprocs
            .read()
            .get(&gpid)
            .cloned()
            .ok_or(Error::NoSuchProcess(gpid))?;
        may_wait(creds, vp.uid, gpid)?;
        let mut rx = vp.status.subscribe();
        let ws = rx
            .wait_for(|s| s.is_some())
            .await
            .map_err(|_| Error::NoSuchProcess(gpid))?;
        Ok(ws.expect("checked"))
    }

    /// Waits for a process the caller started and collects its status (then reaps it).
    pub async fn wait(self: &Arc<Self>, gpid: Gpid, creds: &pb::Creds) -> Result<WaitStatus> {
        let rec = {
            let ch = self.children.lock();
            ch.get(&gpid).map(|r| (r.uid, r.status.subscribe()))
        };
        let ws = match rec {
            Some((uid, mut rx)) => {
                may_wait(creds, uid, gpid)?;
                let ws = *rx
                    .wait_for(|s| s.is_some())
                    .await
                    .map_err(|_| Error::NoSuchProcess(gpid))?;
                if self.children.lock().remove(&gpid).is_none() {
                    return Err(Error::NoSuchProcess(gpid)); // another waiter collected it
                }
                ws.expect("checked")
            }
            None if gpid.node() == self.id => self.wait_home(gpid, creds).await?,
            None => {
                let op = pb::peer_request::Op::Wait(pb::WaitRequest {
                    gpids: vec![gpid.raw()],
                });
                match self.call(gpid.node(), creds.clone(), op).await? {
                    pb::peer_reply::Reply::Wait(w) => {
                        let r = w
                            .results
                            .into_iter()
                            .next()
                            .ok_or(Error::NoSuchProcess(gpid))?;
                        if let Some(e) = r.error {
                            return Err(e.into());
                        }
                        r.status
                            .map(WaitStatus::from)
                            .ok_or(Error::NoSuchProcess(gpid))?
                    }
                    other => return Err(Error::Internal(format!("unexpected reply {other:?}"))),
                }
            }
        };
        self.release(gpid).await;
        Ok(ws)
    }
}
