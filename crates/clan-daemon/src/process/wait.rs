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
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
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

impl WaitFlags {
    /// Whether a record in state `s` has something to report to such a wait.
    fn wanted(&self, s: &RecState) -> bool {
        s.exit.is_some()
            || match s.change {
                Some(Change::Stopped(_)) => self.untraced,
                Some(Change::Continued) => self.continued,
                None => false,
            }
    }
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
    /// A wait (or its parent's exit) collected its exit and the release of its zombie is
    /// not acknowledged yet: it is reported to nobody any more (the zombie, still there,
    /// would otherwise be found again by the pull path), and news of it is not news.
    pub collected: bool,
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
            collected: false,
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

/// Takes the exit of `gpid`'s record: marks it collected and returns its generation, whose
/// zombie is to be released ([`Node::spawn_release`]); a record whose node lost its
/// processes has nothing to release and goes now (`None`).
fn collect(ch: &mut HashMap<Gpid, ChildRec>, gpid: Gpid) -> Option<u64> {
    let rec = ch.get_mut(&gpid)?;
    if rec.gone_with_node {
        ch.remove(&gpid);
        return None;
    }
    rec.collected = true;
    Some(rec.gen)
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
    /// Parent side: a child was started on our behalf; expect its status. A stop or
    /// continue told before (the child's node was quicker than the spawn's reply) is its
    /// record's now.
    pub fn expect_child(&self, gpid: Gpid, uid: u32) {
        let mut ch = self.children.lock();
        let rec = current_record(&mut ch, gpid, uid);
        let early = self.early_changes.lock().remove(&gpid);
        if let Some((change, at)) = early {
            // One older would be of an earlier process with the gpid, never expected here.
            if at.elapsed() < EARLY_KEPT && !rec.collected && rec.state.borrow().exit.is_none() {
                rec.state.send_modify(|s| s.change = Some(change));
            }
        }
    }

    /// Keeps a stop or continue of `gpid`, which has no record yet, for its record: for
    /// [`EARLY_KEPT`], at most [`EARLY_MAX`] of them (news of a process never expected
    /// here must not pile up).
    fn keep_early(&self, gpid: Gpid, change: Change) {
        let now = Instant::now();
        let mut early = self.early_changes.lock();
        if early.len() >= EARLY_MAX {
            early.retain(|_, (_, at)| now.duration_since(*at) < EARLY_KEPT);
        }
        if early.len() < EARLY_MAX || early.contains_key(&gpid) {
            early.insert(gpid, (change, now));
        } else {
            warn!(%gpid, "too many early stops and continues: this one is dropped");
        }
    }

    /// Parent side: childstatuschange arrived (an exit, a stop or a continue).
    pub fn child_status(self: &Arc<Self>, st: &pb::ChildStatus) {
        let Some(gpid) = Gpid::from_raw(st.gpid) else {
            return;
        };
        let mut ch = self.children.lock();
        if st.stopped != 0 || st.continued {
            // Only a child known and not ended takes a stop or a continue: one told late
            // (after its exit, or twice) must not make a record that nothing removes.
            let change = if st.stopped != 0 {
                Change::Stopped(st.stopped)
            } else {
                Change::Continued
            };
            match ch.get_mut(&gpid) {
                Some(rec)
                    if !rec.gone_with_node
                        && !rec.collected
                        && rec.state.borrow().exit.is_none() =>
                {
                    rec.state.send_modify(|s| s.change = Some(change));
                }
                Some(rec) if !rec.gone_with_node => {
                    debug!(%gpid, "a stop or continue of an ended child: ignored");
                }
                // Before its record (the spawn's reply still on its way), or of a new
                // process with the gpid of one that died with its node.
                _ => self.keep_early(gpid, change),
            }
            return;
        }
        // Its exit says more than any stop or continue told before its record.
        self.early_changes.lock().remove(&gpid);
        let rec = current_record(&mut ch, gpid, st.uid);
        if rec.collected || rec.state.borrow().exit.is_some() {
            // Told again (a push repeated, or relearned): known already.
            return;
        }
        let ws = WaitStatus::from(st.status.unwrap_or_default());
        rec.state.send_modify(|s| s.exit = Some(ws));
        let gen = rec.gen;
        if rec.orphan {
            // Its parent is gone: nobody waits; the zombie goes at once.
            rec.collected = true;
            drop(ch);
            self.spawn_release(gpid, gen);
            return;
        }
        if !rec.parented {
            // No parent in the cluster (started from outside it): its status waits a
            // while for a `clan wait` by its user, then the zombie goes, as init would
            // take it; the record goes with it, so a reused gpid never finds it.
            let node = self.clone();
            let after = Duration::from_millis(self.cfg.exit_retention_ms);
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                node.reap_unwaited(gpid, gen).await;
            });
            return;
        }
        drop(ch);
        self.kid_exited(gpid);
    }

    /// Parent side: a child whose parent is a process of this node exited. It no longer
    /// counts as a link of its group through that parent: if it was one (the parent in
    /// another group of the same session), the group may be orphaned now.
    fn kid_exited(self: &Arc<Self>, gpid: Gpid) {
        let kid: Option<(u32, u64, u64)> = self.parents.lock().iter().find_map(|(&p, r)| {
            r.kids
                .iter()
                .find(|k| k.0 == gpid)
                .map(|&(_, pg, sid)| (p, pg, sid))
        });
        let Some((parent, pg, sid)) = kid else {
            return;
        };
        let Some(g) = Gpid::from_raw(pg) else {
            return;
        };
        let node = self.clone();
        tokio::spawn(async move {
            // The parent's group and session now, from /proc, off the workers.
            let n = node.clone();
            let was_link = tokio::task::spawn_blocking(move || {
                let ids = n.caller_ids(parent as i32);
                crate::pid_alive(parent as i32)
                    && n.cluster_id(Kind::Group, ids.pgid) != pg
                    && n.cluster_id(Kind::Session, ids.sid) == sid
            })
            .await
            .unwrap_or(false);
            if was_link {
                node.orphan_check(g).await;
            }
        });
    }

    /// Parent side: the record of `gpid` is collected (or gone): its parent's list of
    /// children forgets it, so that the list holds only children not collected.
    fn forget_kid(&self, gpid: Gpid) {
        for rec in self.parents.lock().values_mut() {
            rec.kids.retain(|k| k.0 != gpid);
        }
    }

    /// Parent side: releases the zombie of `gpid`, whose record (generation `gen`) is
    /// marked collected, on a task of its own (a wait abandoned meanwhile does not stop it),
    /// then forgets the record. A remote release is sent again until its node answers or
    /// loses its processes; until then the record stays, so that the status is not
    /// reported again.
    fn spawn_release(self: &Arc<Self>, gpid: Gpid, gen: u64) -> tokio::task::JoinHandle<()> {
        self.forget_kid(gpid);
        let node = self.clone();
        tokio::spawn(async move {
            node.release(gpid, gen).await;
            let mut ch = node.children.lock();
            if ch.get(&gpid).is_some_and(|r| r.gen == gen && r.collected) {
                ch.remove(&gpid);
            }
        })
    }

    /// Parent side: a child with no parent in the cluster exited `exit_retention_ms` ago;
    /// if nobody collected its status (and no parent adopted it meanwhile), it is reaped.
    async fn reap_unwaited(self: &Arc<Self>, gpid: Gpid, gen: u64) {
        let release = {
            let mut ch = self.children.lock();
            let unwaited = ch.get(&gpid).is_some_and(|r| {
                r.gen == gen && !r.parented && !r.collected && r.state.borrow().exit.is_some()
            });
            if !unwaited {
                return;
            }
            collect(&mut ch, gpid)
        };
        info!(%gpid, "reaped: its exit status was not waited for");
        if let Some(gen) = release {
            let _ = self.spawn_release(gpid, gen).await;
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
                // Collected already (a wait releases it).
                let Some(rec) = ch.get_mut(&g).filter(|r| !r.collected) else {
                    continue;
                };
                if rec.state.borrow().exit.is_none() {
                    rec.orphan = true;
                } else if let Some(gen) = collect(&mut ch, g) {
                    release.push((g, gen));
                }
            }
        }
        debug!(
            released = release.len(),
            "a parent with remote children exited"
        );
        self.tell_parent_exited(&rec.kids);
        let releases: Vec<_> = release
            .into_iter()
            .map(|(g, gen)| self.spawn_release(g, gen))
            .collect();
        for r in releases {
            let _ = r.await;
        }
        for g in groups {
            self.orphan_check(g).await;
        }
    }

    /// Parent side: tells the nodes of `kids` that their parent exited, so that they show
    /// the cluster's init as their parent. Once, not waited for: a node that does not get
    /// it shows the old parent until the child ends (nothing else depends on it).
    fn tell_parent_exited(self: &Arc<Self>, kids: &[(Gpid, u64, u64)]) {
        let mut by_node: HashMap<NodeId, Vec<u64>> = HashMap::new();
        for (g, _, _) in kids {
            by_node.entry(g.node()).or_default().push(g.raw());
        }
        for (to, gpids) in by_node {
            if to == self.id {
                self.parent_exited_here(to, &gpids);
                continue;
            }
            let node = self.clone();
            tokio::spawn(async move {
                let op = pb::peer_request::Op::ParentExited(pb::ParentExited { gpids });
                if let Err(e) = node.call(to, node.own_creds(), op).await {
                    debug!(node = %to, "parent's exit not told: {e}");
                }
            });
        }
    }

    /// Home side: node `from` says the parent of these local processes exited; only the
    /// node their parent is on may say it.
    pub fn parent_exited_here(&self, from: NodeId, gpids: &[u64]) {
        let vprocs = self.vprocs.read();
        for v in gpids
            .iter()
            .filter_map(|&g| vprocs.get(&Gpid::from_raw(g)?))
        {
            if v.parent_node == from {
                v.parent_exited
                    .store(true, std::sync::atomic::Ordering::Release);
            }
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

    /// childstatuschange to the parent's node: queued to the vproc's pusher
    /// ([`Node::start_pushes`]), which sends them one after the other, in the order they
    /// happened.
    fn push_status(self: &Arc<Self>, vp: &Arc<VProc>, mut st: pb::ChildStatus) {
        st.gpid = vp.gpid.raw();
        st.job = vp.job;
        st.uid = vp.uid;
        if vp.parent_node == self.id {
            self.child_status(&st);
            return;
        }
        let queued = vp
            .pushes
            .lock()
            .as_ref()
            .is_some_and(|q| q.send(st).is_ok());
        if !queued {
            debug!(gpid = %vp.gpid, "a status after its shepherd's end: not pushed");
        }
    }

    /// Home side: the pusher of a detached process started from another node, which sends
    /// its status changes to its parent's node in order, each retried until that node
    /// answers or is dead: a continue can not overtake the exit that followed it, and
    /// nothing is sent once the parent released the zombie (a repeat after that would make
    /// a record nobody collects). Ends when the vproc's link to its shepherd ends.
    pub fn start_pushes(self: &Arc<Self>, vp: &Arc<VProc>) {
        if !vp.detached || vp.parent_node == self.id {
            return;
        }
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        *vp.pushes.lock() = Some(tx);
        let (node, vp) = (self.clone(), vp.clone());
        tokio::spawn(async move {
            while let Some(st) = rx.recv().await {
                node.push_one(&vp, st).await;
            }
        });
    }

    async fn push_one(self: &Arc<Self>, vp: &VProc, st: pb::ChildStatus) {
        use std::sync::atomic::Ordering::Acquire;
        let (gpid, parent) = (vp.gpid, vp.parent_node);
        let exit = st.stopped == 0 && !st.continued;
        loop {
            if vp.parent_gone.load(Acquire) || vp.released.load(Acquire) {
                // Its parent's node lost its processes meanwhile (`parent_node_lost`
                // released the zombie), or the parent collected it: nobody is told any more.
                return;
            }
            let op = pb::peer_request::Op::Status(st);
            match self.call(parent, self.own_creds(), op).await {
                Ok(_) => return,
                Err(Error::NodeDead(_)) => {
                    // The parent's node is gone: nobody will wait; release the zombie.
                    if exit {
                        info!(gpid = %gpid, parent = %parent, "parent node dead, releasing");
                        self.release_local(gpid).await;
                    }
                    return;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// Home side: let the shepherd reap the zombie, and return once it has (the gpid is
    /// free when a waiter is told, as with waitpid), or after a few seconds at most.
    pub async fn release_local(&self, gpid: Gpid) {
        let Some(vp) = self.vprocs.read().get(&gpid).cloned() else {
            return;
        };
        let mut gone = vp.gone.subscribe();
        vp.released
            .store(true, std::sync::atomic::Ordering::Release);
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

    /// Parent side: lets the zombie of collected record `gpid` (generation `gen`) go. A
    /// remote release is sent again until its node answers it, or loses its processes (the
    /// zombie went with them, and a release could reach a new process with the gpid).
    async fn release(self: &Arc<Self>, gpid: Gpid, gen: u64) {
        if gpid.node() == self.id {
            self.release_local(gpid).await;
            return;
        }
        let op = pb::peer_request::Op::Release(pb::ReleaseRequest { gpid: gpid.raw() });
        loop {
            let ours = self
                .children
                .lock()
                .get(&gpid)
                .is_some_and(|r| r.gen == gen && r.collected && !r.gone_with_node);
            if !ours {
                return;
            }
            match self.call(gpid.node(), self.own_creds(), op.clone()).await {
                Ok(_) | Err(Error::NodeDead(_)) => return,
                Err(Error::NodeDown(e)) => {
                    debug!(%gpid, "release, sent again: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => {
                    warn!(%gpid, "release refused: {e}");
                    return;
                }
            }
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
        self.wait_all(vec![Ok(gpid)], creds, flags)
            .await
            .pop()
            .unwrap_or(Err(Error::NoSuchProcess(gpid)))
    }

    /// Waits for processes the caller started; one result per gpid, in their order. Two
    /// phases: first until every one has something to report, taking nothing, so that a
    /// wait abandoned meanwhile (its caller went away, and the future is dropped) leaves
    /// every status for the next wait; then everything is taken at once, with no await in
    /// between: exits collected (their zombies released by tasks of their own, which an
    /// abandoned wait does not stop), stops and continues reported. A gpid named twice is
    /// waited for once (the later ones are refused).
    pub async fn wait_all(
        self: &Arc<Self>,
        gpids: Vec<Result<Gpid>>,
        creds: &pb::Creds,
        flags: WaitFlags,
    ) -> Vec<Result<WaitEvent>> {
        let mut out: Vec<Option<Result<WaitEvent>>> = Vec::with_capacity(gpids.len());
        let mut ready: Vec<Option<Ready>> = vec![None; gpids.len()];
        let mut waited: Vec<(usize, Gpid)> = Vec::new();
        let mut named = HashSet::new();
        for (i, g) in gpids.into_iter().enumerate() {
            out.push(match g {
                Err(e) => Some(Err(e)),
                Ok(g) if !named.insert(g) => Some(Err(Error::Invalid(format!(
                    "{g} is named more than once in this wait"
                )))),
                Ok(g) => {
                    waited.push((i, g));
                    None
                }
            });
        }
        let mut pending = waited.clone();
        let collected = loop {
            // Phase 1: until each has something to report (cancellable: nothing taken).
            let mut set = tokio::task::JoinSet::new();
            for &(i, g) in &pending {
                let (node, creds) = (self.clone(), creds.clone());
                set.spawn(async move { (i, node.wait_ready(g, &creds, flags).await) });
            }
            for (i, r) in set.join_all().await {
                match r {
                    Ok(r) => ready[i] = Some(r),
                    Err(e) => out[i] = Some(Err(e)),
                }
            }
            // Phase 2: all at once, under one lock. A stop or continue another waiter took
            // meanwhile is waited for again, and nothing is taken before all are there.
            let mut ch = self.children.lock();
            pending = waited
                .iter()
                .filter(|&&(i, g)| {
                    out[i].is_none() && !ready[i].is_some_and(|r| r.holds(&ch, g, flags))
                })
                .copied()
                .collect();
            if !pending.is_empty() {
                continue;
            }
            let mut collected = Vec::new();
            for &(i, g) in &waited {
                let Some(r) = ready[i].filter(|_| out[i].is_none()) else {
                    continue;
                };
                let res = take(&mut ch, g, r, creds.uid, flags);
                if let Ok(WaitEvent::Exited(_)) = res {
                    collected.push((g, collect(&mut ch, g)));
                }
                out[i] = Some(res);
            }
            break collected;
        };
        // The zombies go, from tasks of their own; the wait returns once they have (as
        // waitpid), or once a node that does not answer has had time to be declared dead.
        let deadline = tokio::time::Instant::now() + self.cfg.dead_after() + RELEASE_WAIT;
        let mut releases = Vec::new();
        for (g, gen) in collected {
            match gen {
                Some(gen) => releases.push(self.spawn_release(g, gen)),
                None => self.forget_kid(g),
            }
        }
        for r in releases {
            let _ = tokio::time::timeout_at(deadline, r).await;
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::Internal("not waited for".into()))))
            .collect()
    }

    /// Phase 1 of a wait for `gpid`: returns once it has something to report, taking
    /// nothing.
    async fn wait_ready(
        self: &Arc<Self>,
        gpid: Gpid,
        creds: &pb::Creds,
        flags: WaitFlags,
    ) -> Result<Ready> {
        let rec = {
            let ch = self.children.lock();
            ch.get(&gpid)
                .map(|r| (r.uid, r.gen, r.collected, r.state.subscribe()))
        };
        match rec {
            // Collected, its release not yet acknowledged.
            Some((_, _, true, _)) => Err(Error::NoSuchProcess(gpid)),
            Some((uid, gen, false, mut rx)) => {
                may_wait(creds, uid, gpid)?;
                rx.wait_for(|s| flags.wanted(s))
                    .await
                    .map_err(|_| Error::NoSuchProcess(gpid))?;
                Ok(Ready::Record(gen))
            }
            None if gpid.node() == self.id => {
                Ok(Ready::Pulled(self.wait_home(gpid, creds, self.id).await?))
            }
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
                            .map(|s| Ready::Pulled(WaitStatus::from(s)))
                            .ok_or(Error::NoSuchProcess(gpid))
                    }
                    other => Err(Error::Internal(format!("unexpected reply {other:?}"))),
                }
            }
        }
    }
}

/// How long a stop or continue told before its child's record is kept for it.
const EARLY_KEPT: Duration = Duration::from_secs(10);

/// Most stops and continues kept for records not made yet.
const EARLY_MAX: usize = 4096;

/// How long a wait waits for the releases it sent, beyond `dead_after`: a home node's
/// shepherd may take that long to reap (`release_local`).
const RELEASE_WAIT: Duration = Duration::from_secs(5);

/// What phase 1 of a wait found for one gpid.
#[derive(Debug, Clone, Copy)]
enum Ready {
    /// Its record (this generation) has what the wait asks for.
    Record(u64),
    /// No record here (a restarted cland lost it): its home node has this exit status.
    Pulled(WaitStatus),
}

impl Ready {
    /// Whether phase 2 can report `gpid` now (an error counts: it is final).
    fn holds(&self, ch: &HashMap<Gpid, ChildRec>, gpid: Gpid, flags: WaitFlags) -> bool {
        match self {
            Ready::Record(gen) => ch
                .get(&gpid)
                .filter(|r| r.gen == *gen && !r.collected)
                .is_none_or(|r| flags.wanted(&r.state.borrow())),
            Ready::Pulled(_) => true,
        }
    }
}

/// Phase 2 of a wait for `gpid`, with [`Ready::holds`] true: what it reports. An exit is
/// left for [`collect`].
fn take(
    ch: &mut HashMap<Gpid, ChildRec>,
    gpid: Gpid,
    r: Ready,
    uid: u32,
    flags: WaitFlags,
) -> Result<WaitEvent> {
    let rec = match r {
        // Gone, or a later process's record: another waiter collected it.
        Ready::Record(gen) => ch
            .get_mut(&gpid)
            .filter(|r| r.gen == gen && !r.collected)
            .ok_or(Error::NoSuchProcess(gpid))?,
        // Recorded here until the release is acknowledged, so that it is not pulled again.
        Ready::Pulled(ws) => {
            let rec = current_record(ch, gpid, uid);
            if rec.collected {
                return Err(Error::NoSuchProcess(gpid));
            }
            rec.state.send_modify(|s| {
                s.exit.get_or_insert(ws);
            });
            rec
        }
    };
    let state = *rec.state.borrow();
    if let Some(ws) = state.exit {
        return Ok(WaitEvent::Exited(ws));
    }
    // A stop or continue is reported once, like waitpid's.
    debug_assert!(flags.wanted(&state));
    rec.state.send_modify(|s| s.change = None);
    Ok(match state.change {
        Some(Change::Stopped(sig)) => WaitEvent::Stopped(sig),
        _ => WaitEvent::Continued,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::lone_node;

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

    fn exit_of(node: &Arc<Node>, gpid: Gpid, code: i32) {
        node.child_status(&pb::ChildStatus {
            gpid: gpid.raw(),
            status: Some(
                WaitStatus {
                    code,
                    ..Default::default()
                }
                .into(),
            ),
            ..Default::default()
        });
    }

    fn change_of(node: &Arc<Node>, gpid: Gpid, stopped: i32, continued: bool) {
        node.child_status(&pb::ChildStatus {
            gpid: gpid.raw(),
            stopped,
            continued,
            ..Default::default()
        });
    }

    fn exit_code(e: Result<WaitEvent>) -> i32 {
        match e {
            Ok(WaitEvent::Exited(ws)) => ws.code,
            other => panic!("{other:?}"),
        }
    }

    /// Lets every other task of the (current-thread) runtime run until none is ready.
    async fn settle() {
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_wait_abandoned_before_all_are_ready_takes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let node = lone_node(dir.path());
        let creds = pb::Creds::default();
        let (a, b) = (
            Gpid::from_raw(10_000_100).unwrap(),
            Gpid::from_raw(10_000_101).unwrap(),
        );
        node.expect_child(a, 0);
        node.expect_child(b, 0);
        exit_of(&node, a, 5);
        // `clan wait A B`: A has exited, B has not; its caller goes away.
        let (n, c) = (node.clone(), creds.clone());
        let w = tokio::spawn(async move {
            n.wait_all(vec![Ok(a), Ok(b)], &c, WaitFlags::default())
                .await
        });
        settle().await;
        assert!(!w.is_finished());
        w.abort();
        assert!(w.await.is_err());
        // Nothing was taken: A's status is there for the next wait.
        let rec = node
            .children
            .lock()
            .get(&a)
            .map(|r| (r.collected, *r.state.borrow()));
        assert!(
            matches!(rec, Some((false, RecState { exit: Some(_), .. }))),
            "{rec:?}"
        );
        assert_eq!(
            exit_code(node.wait(a, &creds, WaitFlags::default()).await),
            5
        );
        // Both at once once both are there, in the order named.
        exit_of(&node, b, 6);
        let (n, c) = (node.clone(), creds.clone());
        let w = tokio::spawn(async move {
            n.wait_all(vec![Ok(b), Ok(b), Ok(a)], &c, WaitFlags::default())
                .await
        });
        let mut r = w.await.unwrap().into_iter();
        assert_eq!(exit_code(r.next().unwrap()), 6);
        assert!(matches!(r.next(), Some(Err(Error::Invalid(_)))));
        assert!(matches!(r.next(), Some(Err(Error::NoSuchProcess(_)))));
        assert!(node.children.lock().is_empty());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_stop_told_before_the_spawn_reply_is_kept_for_the_record() {
        let dir = tempfile::tempdir().unwrap();
        let node = lone_node(dir.path());
        let creds = pb::Creds::default();
        let untraced = WaitFlags {
            untraced: true,
            continued: true,
        };
        // The child's node tells of its stop before the parent's node has its record.
        let g = Gpid::from_raw(10_000_200).unwrap();
        change_of(&node, g, libc::SIGTTIN, false);
        assert!(node.children.lock().get(&g).is_none());
        node.expect_child(g, 0);
        let r = node.wait(g, &creds, untraced).await;
        assert!(
            matches!(r, Ok(WaitEvent::Stopped(s)) if s == libc::SIGTTIN),
            "{r:?}"
        );
        // Kept once: a later record of the gpid does not get it again.
        assert!(node.early_changes.lock().is_empty());
        // An exit told early wins over a stop told before it.
        let h = Gpid::from_raw(10_000_201).unwrap();
        change_of(&node, h, libc::SIGTSTP, false);
        exit_of(&node, h, 4);
        node.expect_child(h, 0);
        assert_eq!(exit_code(node.wait(h, &creds, untraced).await), 4);
        assert!(node.early_changes.lock().is_empty());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_collected_child_is_not_reported_again_before_its_release_is_answered() {
        let dir = tempfile::tempdir().unwrap();
        let node = lone_node(dir.path());
        let creds = pb::Creds::default();
        // On node 2, which does not answer: the release is sent again and again.
        let g = Gpid::from_raw(20_000_100).unwrap();
        node.expect_child(g, 0);
        exit_of(&node, g, 3);
        let (n, c) = (node.clone(), creds.clone());
        let first = tokio::spawn(async move { n.wait(g, &c, WaitFlags::default()).await });
        while !node.children.lock().get(&g).is_some_and(|r| r.collected) {
            tokio::task::yield_now().await;
        }
        // A second wait does not ask node 2 for it (the pull path): it is collected.
        let second = node.wait(g, &creds, WaitFlags::default()).await;
        assert!(matches!(second, Err(Error::NoSuchProcess(_))), "{second:?}");
        // Nor does a repeated push of its exit make it waitable again.
        exit_of(&node, g, 3);
        let second = node.wait(g, &creds, WaitFlags::default()).await;
        assert!(matches!(second, Err(Error::NoSuchProcess(_))), "{second:?}");
        // The first wait's caller goes away: the release goes on; node 2 is declared dead,
        // and the record goes with it.
        first.abort();
        let _ = first.await;
        node.children_of_dead_node(NodeId::new(2).unwrap());
        while !node.children.lock().is_empty() {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_stop_or_continue_makes_no_record() {
        let dir = tempfile::tempdir().unwrap();
        let node = lone_node(dir.path());
        let creds = pb::Creds::default();
        let g = Gpid::from_raw(10_000_200).unwrap();
        // Of no child expected.
        change_of(&node, g, libc::SIGSTOP, false);
        change_of(&node, g, 0, true);
        assert!(node.children.lock().is_empty());
        // Of a child: reported once, with the flags that ask for it.
        node.expect_child(g, 0);
        change_of(&node, g, libc::SIGSTOP, false);
        let flags = WaitFlags {
            untraced: true,
            continued: true,
        };
        let r = node.wait(g, &creds, flags).await;
        assert!(matches!(r, Ok(WaitEvent::Stopped(libc::SIGSTOP))), "{r:?}");
        // A continue that arrives after the exit (out of order) is not news.
        exit_of(&node, g, 0);
        change_of(&node, g, 0, true);
        assert_eq!(exit_code(node.wait(g, &creds, flags).await), 0);
        change_of(&node, g, 0, true);
        assert!(node.children.lock().is_empty());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_child_that_ended_is_no_link_and_a_collected_one_is_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let node = lone_node(dir.path());
        let creds = pb::Creds::default();
        // This test process is the parent, in another group of its session than the child's
        // group J: the child, alive, is a controlling link of J.
        let me = std::process::id();
        let ids = node.caller_ids(me as i32);
        let sid = node.cluster_id(Kind::Session, ids.sid);
        let j = Gpid::from_raw(20_000_007).unwrap();
        let kid = Gpid::from_raw(20_000_100).unwrap();
        node.expect_child(kid, 0);
        node.adopt(
            me,
            kid,
            &pb::Creds {
                pgid: j.raw(),
                sid,
                ..Default::default()
            },
        );
        let links = |node: &Arc<Node>| {
            let n = node.clone();
            n.orphan_part(j).links
        };
        assert_eq!(links(&node), 1);
        // It ends: no link any more.
        exit_of(&node, kid, 0);
        assert_eq!(links(&node), 0);
        // Collected: its parent's list forgets it.
        let (n, c) = (node.clone(), creds.clone());
        let w = tokio::spawn(async move { n.wait(kid, &c, WaitFlags::default()).await });
        while !node.children.lock().get(&kid).is_some_and(|r| r.collected) {
            tokio::task::yield_now().await;
        }
        assert!(node.parents.lock()[&me].kids.is_empty());
        w.abort();
    }
}
