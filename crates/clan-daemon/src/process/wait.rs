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
use crate::process::group::Kind;
use crate::process::vproc::VProc;
use clan_core::{Gpid, NodeId, WaitStatus};
use clan_proto::pb::{self, shepherd_in::Msg as In};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tracing::{debug, info, warn};

/// Most processes one wait request may name (docs/processes.md): each is waited for by a
/// task of its own, and a 4 MiB local request could name a million.
pub const MAX_WAIT_GPIDS: usize = 65_536;

/// Refuses a wait for more than [`MAX_WAIT_GPIDS`] processes, naming the count and the limit.
pub fn check_wait_len(n: usize) -> Result<()> {
    if n > MAX_WAIT_GPIDS {
        return Err(Error::Invalid(format!(
            "a wait for {n} processes is refused: the limit is {MAX_WAIT_GPIDS} per wait"
        )));
    }
    Ok(())
}

/// A state change of a child other than its exit (waitpid's WUNTRACED and WCONTINUED).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Stopped(i32),
    Continued,
}

/// What a wait returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEvent {
    Exited(WaitStatus),
    Stopped(i32),
    Continued,
}

/// What a wait asks for besides exits.
#[derive(Debug, Clone, Copy, Default)]
pub struct WaitFlags {
    pub untraced: bool,
    pub continued: bool,
}

/// The parent side's record of a child that lives on some node, with Solaris MC's Figure 4
/// state: `exit` set moves it right (a zombie at home), a wait or its parent's exit moves it
/// down (the zombie released, the record gone).
#[derive(Debug, Clone, Copy, Default)]
pub struct RecState {
    pub exit: Option<WaitStatus>,
    /// The last stop or continue not yet reported.
    pub change: Option<Change>,
}

pub struct ChildRec {
    pub uid: u32,
    pub state: watch::Sender<RecState>,
    /// The parent process exited: release the child as soon as it exits.
    pub orphan: bool,
    /// A process of this node is its parent (`Node::adopt`); without one (started from
    /// outside the cluster) its exit status waits `exit_retention_ms` for a `clan wait`.
    pub parented: bool,
    /// Which record this is: a gpid can name another process once its zombie is released,
    /// and a timer or a waiter must not act on a later record of the same gpid.
    pub gen: u64,
    /// Its node lost its processes (declared dead, or back as an incarnation that did not
    /// take them over): its zombie went with them, so collecting the record releases
    /// nothing there (the node's next incarnation numbers its processes afresh, and a
    /// release could reach a new process with the same gpid), and news of that gpid from
    /// the node is about a new process.
    pub gone_with_node: bool,
}

/// Generations of child records (`ChildRec::gen`), unique for the daemon's life.
static NEXT_GEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl ChildRec {
    fn new(uid: u32) -> ChildRec {
        ChildRec {
            uid,
            state: watch::channel(RecState::default()).0,
            orphan: false,
            parented: false,
            gen: NEXT_GEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            gone_with_node: false,
        }
    }
}

/// A parent process of this node that started processes elsewhere.
pub struct ParentRec {
    /// Its cluster session when it started the first one.
    pub sid: u64,
    /// The children: gpid, cluster group, cluster session.
    pub kids: Vec<(Gpid, u64, u64)>,
}

/// Returns once the process with host pid `pid` has exited (at once if it has already).
pub async fn until_exit(pid: u32) {
    match clan_core::sys::pidfd_open(pid as i32) {
        Ok(fd) => {
            // SAFETY: the AsyncFd owns the OwnedFd, which stays open and the same descriptor
            // until the AsyncFd is dropped.
            let afd = unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
            };
            if let Ok(afd) = afd {
                let _ = afd.readable().await;
            }
        }
        Err(e) => debug!(pid, "already gone: {e}"),
    }
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

/// The record of the process that has `gpid` now: a record gone with its node belongs to
/// a process of the node's previous incarnation (its uncollected status goes, not to this
/// one, which got the same number: expected, or heard of first).
fn current_record(ch: &mut HashMap<Gpid, ChildRec>, gpid: Gpid, uid: u32) -> &mut ChildRec {
    let rec = ch.entry(gpid).or_insert_with(|| ChildRec::new(uid));
    if rec.gone_with_node {
        warn!(%gpid, "a new process has the gpid of one that died with its node");
        *rec = ChildRec::new(uid);
    }
    rec
}

impl Node {
    /// Parent side: a child was started on our behalf; expect its status.
    pub fn expect_child(&self, gpid: Gpid, uid: u32) {
        current_record(&mut self.children.lock(), gpid, uid);
    }

    /// Parent side: childstatuschange arrived (an exit, a stop or a continue).
    pub fn child_status(self: &Arc<Self>, st: &pb::ChildStatus) {
        let Some(gpid) = Gpid::from_raw(st.gpid) else {
            return;
        };
        let mut ch = self.children.lock();
        let rec = current_record(&mut ch, gpid, st.uid);
        if st.stopped != 0 {
            rec.state
                .send_modify(|s| s.change = Some(Change::Stopped(st.stopped)));
        } else if st.continued {
            rec.state
                .send_modify(|s| s.change = Some(Change::Continued));
        } else {
            let ws = WaitStatus::from(st.status.unwrap_or_default());
            rec.state.send_modify(|s| s.exit = Some(ws));
            if rec.orphan {
                // Its parent is gone: nobody waits; the zombie goes at once.
                ch.remove(&gpid);
                let node = self.clone();
                tokio::spawn(async move { node.release(gpid).await });
            } else if !rec.parented {
                // No parent in the cluster (started from outside it): its status waits a
                // while for a `clan wait` by its user, then the zombie goes, as init would
                // take it; the record goes with it, so a reused gpid never finds it.
                let (node, gen) = (self.clone(), rec.gen);
                let after = Duration::from_millis(self.cfg.exit_retention_ms);
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    node.reap_unwaited(gpid, gen).await;
                });
            }
        }
    }

    /// Parent side: a child with no parent in the cluster exited `exit_retention_ms` ago;
    /// if nobody collected its status (and no parent adopted it meanwhile), it is reaped.
    async fn reap_unwaited(self: &Arc<Self>, gpid: Gpid, gen: u64) {
        let release = {
            let mut ch = self.children.lock();
            let unwaited = ch
                .get(&gpid)
                .is_some_and(|r| r.gen == gen && !r.parented && r.state.borrow().exit.is_some());
            if !unwaited {
                return;
            }
            ch.remove(&gpid).is_some_and(|r| !r.gone_with_node)
        };
        info!(%gpid, "reaped: its exit status was not waited for");
        if release {
            self.release(gpid).await;
        }
    }

    /// Parent side: a node lost its processes; its children are, to us, killed by SIGKILL
    /// and gone with it (the records of orphans among them go; those with no parent in the
    /// cluster wait the retention for a `clan wait`, as any other exit).
    pub fn children_of_dead_node(self: &Arc<Self>, dead: NodeId) {
        let mut unparented = Vec::new();
        let mut ch = self.children.lock();
        ch.retain(|g, rec| {
            if g.node() != dead || rec.gone_with_node {
                return true;
            }
            if rec.state.borrow().exit.is_none() {
                rec.state.send_modify(|s| {
                    s.exit = Some(WaitStatus {
                        signal: libc::SIGKILL,
                        ..Default::default()
                    })
                });
                if !rec.orphan && !rec.parented {
                    unparented.push((*g, rec.gen));
                }
            }
            rec.gone_with_node = true;
            !rec.orphan
        });
        drop(ch);
        if unparented.is_empty() {
            return;
        }
        let node = self.clone();
        let after = Duration::from_millis(self.cfg.exit_retention_ms);
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            for (g, gen) in unparented {
                node.reap_unwaited(g, gen).await;
            }
        });
    }

    /// Parent side: the process that started `gpid` (host pid `parent`, a process of this
    /// node) is its parent: when it exits, the child's record goes (releasing the zombie),
    /// and the child's group is checked for having become orphaned. `creds` are the
    /// requester's (the child's group and session).
    pub fn adopt(self: &Arc<Self>, parent: u32, gpid: Gpid, creds: &pb::Creds) {
        let first = {
            let mut p = self.parents.lock();
            let first = !p.contains_key(&parent);
            let rec = p.entry(parent).or_insert_with(|| {
                let ids = self.caller_ids(parent as i32);
                ParentRec {
                    sid: self.cluster_id(Kind::Session, ids.sid),
                    kids: Vec::new(),
                }
            });
            rec.kids.push((gpid, creds.pgid, creds.sid));
            first
        };
        if let Some(r) = self.children.lock().get_mut(&gpid) {
            r.parented = true;
        }
        if !first {
            return;
        }
        let node = self.clone();
        tokio::spawn(async move {
            until_exit(parent).await;
            node.parent_exited(parent).await;
        });
    }

    /// Home side: this node's processes whose parent is on node `of`, for a cland restarted
    /// there, which knew them only in memory (runs on a blocking thread).
    pub fn children_of(&self, of: NodeId) -> pb::ChildrenOf {
        // Detached ones only (an attached one reports to its stub, not to a parent), and
        // not those this node already treats as parentless (released without a status).
        let kids: Vec<(Gpid, u64, u32, Option<WaitStatus>)> = self
            .vprocs
            .read()
            .values()
            .filter(|vp| {
                vp.detached
                    && vp.parent_node == of
                    && vp.parent != 0
                    && !vp.parent_gone.load(std::sync::atomic::Ordering::Acquire)
            })
            .map(|vp| (vp.gpid, vp.parent, vp.uid, vp.exited()))
            .collect();
        let children = kids
            .into_iter()
            .filter_map(|(gpid, parent, uid, exit)| {
                let a = self.view.attrs_raw(gpid.local(), false)?;
                Some(pb::ChildOf {
                    gpid: gpid.raw(),
                    parent,
                    pgid: self.cluster_id(Kind::Group, a.pgrp),
                    sid: self.cluster_id(Kind::Session, a.session),
                    uid,
                    status: exit.map(Into::into),
                })
            })
            .collect();
        pb::ChildrenOf { children }
    }

    /// Parent side, in a cland that took over its node's processes: asks `peer` which of
    /// its processes have their parent here, and knows them again as `clan run -d` made
    /// them known (`expect_child`, `adopt`); the children of a parent that exited while no
    /// cland ran are released as its exit would have released them. Returns false when the
    /// peer did not answer (asked again at its next heartbeat).
    pub async fn relearn_children(self: &Arc<Self>, peer: NodeId) -> bool {
        let limit = self.cfg.dead_after();
        let op = pb::peer_request::Op::ChildrenOf(pb::ChildrenOfRequest {});
        let list = match self.call_within(peer, self.own_creds(), op, limit).await {
            Ok(pb::peer_reply::Reply::Children(c)) => c.children,
            Ok(other) => {
                warn!(node = %peer, "children of this node: unexpected reply {other:?}");
                return true;
            }
            // A peer that does not know the request (an older cland): nothing to ask again.
            Err(Error::Invalid(e)) => {
                warn!(node = %peer, "children of this node: {e}");
                return true;
            }
            Err(e) => {
                debug!(node = %peer, "children of this node: {e}");
                return false;
            }
        };
        // Its own processes, with parents on this node.
        let list: Vec<(Gpid, Gpid, pb::ChildOf)> = list
            .into_iter()
            .filter_map(|c| {
                let gpid = Gpid::from_raw(c.gpid).filter(|g| g.node() == peer)?;
                let parent = Gpid::from_raw(c.parent).filter(|p| p.node() == self.id)?;
                Some((gpid, parent, c))
            })
            .collect();
        if list.is_empty() {
            return true;
        }
        // Which parents live (not zombies), with their host pids: from /proc, off the workers.
        let node = self.clone();
        let parents: Vec<u32> = list.iter().map(|(_, p, _)| p.local()).collect();
        let hosts = tokio::task::spawn_blocking(move || {
            // The node's processes by their number in it (one scan of the host's /proc).
            let hosts: HashMap<u32, u32> = std::fs::read_dir("/proc")
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter_map(|h| Some((node.gpid_of_host(h)?.local(), h)))
                .collect();
            parents
                .into_iter()
                .filter(|&p| node.view.attrs(p, false).is_some_and(|a| a.state != 'Z'))
                .filter_map(|p| Some((p, *hosts.get(&p)?)))
                .collect::<HashMap<u32, u32>>()
        })
        .await
        .unwrap_or_default();
        let mut gone: HashMap<u32, ParentRec> = HashMap::new();
        let mut relearned = 0;
        for (gpid, parent, c) in &list {
            self.expect_child(*gpid, c.uid);
            match hosts.get(&parent.local()) {
                Some(&h) => {
                    let known = self
                        .parents
                        .lock()
                        .get(&h)
                        .is_some_and(|r| r.kids.iter().any(|k| k.0 == *gpid));
                    if !known {
                        let creds = pb::Creds {
                            uid: c.uid,
                            pgid: c.pgid,
                            sid: c.sid,
                            ..Default::default()
                        };
                        self.adopt(h, *gpid, &creds);
                        relearned += 1;
                    }
                }
                None => {
                    // Exited while no cland ran here: its children are handled below as
                    // its exit would have handled them.
                    gone.entry(parent.local())
                        .or_insert_with(|| ParentRec {
                            sid: c.sid,
                            kids: Vec::new(),
                        })
                        .kids
                        .push((*gpid, c.pgid, c.sid));
                }
            }
            // Its end, if it came while no cland ran here (it is not sent again).
            if let Some(status) = c.status {
                self.child_status(&pb::ChildStatus {
                    gpid: gpid.raw(),
                    status: Some(status),
                    uid: c.uid,
                    ..Default::default()
                });
            }
        }
        info!(
            node = %peer,
            children = list.len(),
            relearned,
            "knew again the children of this node's processes"
        );
        for rec in gone.into_values() {
            self.parent_gone(rec).await;
        }
        true
    }

    async fn parent_exited(self: &Arc<Self>, parent: u32) {
        let Some(rec) = self.parents.lock().remove(&parent) else {
            return;
        };
        self.parent_gone(rec).await;
    }

    /// The children of a parent that exited: those that ended are released, the others
    /// will be when they end, and their groups are checked for being orphaned.
    async fn parent_gone(self: &Arc<Self>, rec: ParentRec) {
        let mut release = Vec::new();
        // Groups of its children it was a controlling link of may now be orphaned. Its group
        // when it started them may not be its group now (a setpgid since): every group of
        // its session is checked, from the kernel's truth.
        let mut groups: Vec<Gpid> = rec
            .kids
            .iter()
            .filter(|(_, _, sid)| *sid == rec.sid)
            .filter_map(|(_, pg, _)| Gpid::from_raw(*pg))
            .collect();
        groups.sort();
        groups.dedup();
        {
            let mut ch = self.children.lock();
            for g in rec.kids.iter().map(|k| k.0) {
                let Some(rec) = ch.get_mut(&g) else { continue };
                if rec.state.borrow().exit.is_some() {
                    if !rec.gone_with_node {
                        release.push(g);
                    }
                    ch.remove(&g);
                } else {
                    rec.orphan = true;
                }
            }
        }
        debug!(
            released = release.len(),
            "a parent with remote children exited"
        );
        for g in release {
            self.release(g).await;
        }
        for g in groups {
            self.orphan_check(g).await;
        }
    }

    /// Home side: a managed process exited.
    pub fn process_exited(self: &Arc<Self>, vp: &Arc<VProc>, ws: WaitStatus) {
        debug!(gpid = %vp.gpid, status = %ws.describe(), "exited");
        if !vp.detached {
            return; // the stub collects it through its session
        }
        if vp.parent_gone.load(std::sync::atomic::Ordering::Acquire) {
            let (node, gpid) = (self.clone(), vp.gpid);
            tokio::spawn(async move { node.release_local(gpid).await });
            return;
        }
        self.push_status(
            vp,
            pb::ChildStatus {
                status: Some(ws.into()),
                ..Default::default()
            },
        );
    }

    /// Home side: the node `dead` was declared dead; the detached processes started from
    /// it have no parent any more (POSIX: reaped by init): zombies go now, the others when
    /// they exit, even if that node is back by then (as a new incarnation, without them).
    pub fn parent_node_lost(self: &Arc<Self>, dead: NodeId) {
        let orphans: Vec<Arc<VProc>> = self
            .vprocs
            .read()
            .values()
            .filter(|v| v.detached && v.parent_node == dead)
            .cloned()
            .collect();
        for vp in orphans {
            vp.parent_gone
                .store(true, std::sync::atomic::Ordering::Release);
            if vp.exited().is_some() {
                let (node, gpid) = (self.clone(), vp.gpid);
                tokio::spawn(async move { node.release_local(gpid).await });
            }
        }
    }

    /// Home side: a detached process stopped or continued; its parent may wait for that.
    pub fn process_changed(self: &Arc<Self>, vp: &Arc<VProc>, change: Change) {
        if !vp.detached {
            return; // the stub mirrors it
        }
        let (stopped, continued) = match change {
            Change::Stopped(s) => (s, false),
            Change::Continued => (0, true),
        };
        self.push_status(
            vp,
            pb::ChildStatus {
                stopped,
                continued,
                ..Default::default()
            },
        );
    }

    /// childstatuschange to the parent's node (retried until it answers or is dead).
    fn push_status(self: &Arc<Self>, vp: &Arc<VProc>, mut st: pb::ChildStatus) {
        st.gpid = vp.gpid.raw();
        st.job = vp.job;
        st.uid = vp.uid;
        if vp.parent_node == self.id {
            self.child_status(&st);
            return;
        }
        let (node, vp) = (self.clone(), vp.clone());
        let (gpid, parent) = (vp.gpid, vp.parent_node);
        let exit = st.stopped == 0 && !st.continued;
        tokio::spawn(async move {
            loop {
                if vp.parent_gone.load(std::sync::atomic::Ordering::Acquire) {
                    // Its parent's node lost its processes meanwhile (`parent_node_lost`
                    // released the zombie): nobody is told any more.
                    return;
                }
                let op = pb::peer_request::Op::Status(st);
                match node.call(parent, node.own_creds(), op).await {
                    Ok(_) => return,
                    Err(Error::NodeDead(_)) => {
                        // The parent's node is gone: nobody will wait; release the zombie.
                        if exit {
                            info!(gpid = %gpid, parent = %parent, "parent node dead, releasing");
                            node.release_local(gpid).await;
                        }
                        return;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        });
    }

    /// Home side: let the shepherd reap the zombie, and return once it has (the gpid is
    /// free when a waiter is told, as with waitpid), or after a few seconds at most.
    pub async fn release_local(&self, gpid: Gpid) {
        let Some(vp) = self.vprocs.read().get(&gpid).cloned() else {
            return;
        };
        let mut gone = vp.gone.subscribe();
        vp.send(In::Release(true));
        drop(vp);
        let reaped = gone.wait_for(|g| *g);
        if tokio::time::timeout(Duration::from_secs(5), reaped)
            .await
            .is_err()
        {
            warn!(gpid = %gpid, "shepherd slow to reap after release");
        }
    }

    async fn release(self: &Arc<Self>, gpid: Gpid) {
        if gpid.node() == self.id {
            self.release_local(gpid).await;
        } else {
            let op = pb::peer_request::Op::Release(pb::ReleaseRequest { gpid: gpid.raw() });
            let _ = self.call(gpid.node(), self.own_creds(), op).await;
        }
    }

    /// Home side: the status of a local managed process, once it has one (the pull path).
    /// Only the node the process was started from may collect it this way (its parent is
    /// there): a wait from elsewhere would take the status from under the parent.
    pub async fn wait_home(
        &self,
        gpid: Gpid,
        creds: &pb::Creds,
        asker: NodeId,
    ) -> Result<WaitStatus> {
        let vp = self.vproc(gpid)?;
        if vp.parent_node != asker || !vp.detached {
            return Err(Error::NotFound(format!(
                "process {gpid} is not a child of the caller (its parent is on node {})",
                vp.parent_node
            )));
        }
        may_wait(creds, vp.uid, gpid)?;
        let mut rx = vp.status.subscribe();
        let ws = rx
            .wait_for(|s| s.is_some())
            .await
            .map_err(|_| Error::NoSuchProcess(gpid))?;
        Ok(ws.expect("checked"))
    }

    /// Waits for a process the caller started: its exit (collected: the zombie is
    /// released), or with `flags` also a stop or continue not reported before.
    pub async fn wait(
        self: &Arc<Self>,
        gpid: Gpid,
        creds: &pb::Creds,
        flags: WaitFlags,
    ) -> Result<WaitEvent> {
        let wanted = |s: &RecState| {
            s.exit.is_some()
                || match s.change {
                    Some(Change::Stopped(_)) => flags.untraced,
                    Some(Change::Continued) => flags.continued,
                    None => false,
                }
        };
        let rec = {
            let ch = self.children.lock();
            ch.get(&gpid).map(|r| (r.uid, r.gen, r.state.subscribe()))
        };
        let mut release = true;
        let ws = match rec {
            Some((uid, gen, mut rx)) => {
                may_wait(creds, uid, gpid)?;
                loop {
                    rx.wait_for(wanted)
                        .await
                        .map_err(|_| Error::NoSuchProcess(gpid))?;
                    let mut ch = self.children.lock();
                    // Gone, or a later process's record: another waiter collected it.
                    let Some(rec) = ch.get_mut(&gpid).filter(|r| r.gen == gen) else {
                        return Err(Error::NoSuchProcess(gpid));
                    };
                    let state = *rec.state.borrow();
                    if let Some(ws) = state.exit {
                        release = !rec.gone_with_node;
                        ch.remove(&gpid);
                        break ws;
                    }
                    // A stop or continue is reported once, like waitpid's; another waiter
                    // may have taken it meanwhile.
                    if wanted(&state) {
                        rec.state.send_modify(|s| s.change = None);
                        return Ok(match state.change {
                            Some(Change::Stopped(sig)) => WaitEvent::Stopped(sig),
                            _ => WaitEvent::Continued,
                        });
                    }
                }
            }
            None if gpid.node() == self.id => self.wait_home(gpid, creds, self.id).await?,
            None => {
                let op = pb::peer_request::Op::Wait(pb::WaitRequest {
                    gpids: vec![gpid.raw()],
                    ..Default::default()
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
        if release {
            self.release(gpid).await;
        }
        Ok(WaitEvent::Exited(ws))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_names_at_most_the_limit() {
        assert!(check_wait_len(0).is_ok());
        assert!(check_wait_len(MAX_WAIT_GPIDS).is_ok());
        match check_wait_len(MAX_WAIT_GPIDS + 1) {
            Err(Error::Invalid(m)) => {
                assert!(m.contains("65537"), "{m}");
                assert!(m.contains("65536"), "{m}");
            }
            other => panic!("{other:?}"),
        }
    }
}
