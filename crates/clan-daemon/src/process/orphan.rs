//! Orphaned process groups across nodes (POSIX, DESIGN.md 8, Solaris MC 4.2).
//!
//! A group is orphaned when none of its members has a parent in another group of the same
//! session (such a parent is a *controlling link*: a shell that can continue the job). When a
//! group becomes orphaned while a member is stopped, every member gets SIGHUP then SIGCONT,
//! or it would stay stopped for ever. Each kernel applies this rule to the processes it sees;
//! clan applies it to groups that span nodes.
//!
//! Solaris MC keeps a count of controlling links per group. clan counts them when a link can
//! have gone, from the kernel's truth on each node rather than from a copy kept up to date
//! with every fork: [`Node::orphan_check`] asks every live node for its part (members, links,
//! whether one is stopped). The events that can drop a link are watched:
//! - the exit of a parent that started processes on other nodes (a pidfd, `wait::adopt`);
//! - at a group's home, the exit of a local link holder of a group with members elsewhere
//!   (checked on each load sample: the holders are few and a parent in the node's pid
//!   namespace has no pidfd cland can open);
//! - the death of a node (its members and links vanish).
//!
//! A node that does not answer but is not lost (away after a goodbye, or not yet declared
//! dead) may hold links whose processes live on: the check is deferred until every node
//! answers or is lost ([`Node::recheck_deferred_orphans`]).
//!
//! A process clan started for a requester counts as a link when the requester's parent (the
//! shell that ran `clan run -d`) is in another group of the same session, for as long as that
//! parent lives.

use crate::node::Node;
use crate::process::group::Kind;
use clan_core::{Gpid, NodeId};
use clan_proto::pb;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use tracing::{debug, info};

impl Node {
    /// This node's part of group `g`'s state (runs on a blocking thread).
    pub fn orphan_part(&self, g: Gpid) -> pb::OrphanInfo {
        let mut info = pb::OrphanInfo::default();
        let raw = g.raw();
        for pid in self.view.pids() {
            if pid == 1 && self.view.ns_init != 0 {
                continue;
            }
            let Some(a) = self.view.attrs(pid, false) else {
                continue;
            };
            if a.state == 'Z' || self.cluster_id(Kind::Group, a.pgrp) != raw {
                continue;
            }
            info.members += 1;
            info.stopped |= a.state == 'T';
            if self.is_link(raw, a.ppid, self.cluster_id(Kind::Session, a.session)) {
                info.links += 1;
            }
        }
        // Remote children of live parents here, members of the group that have not ended:
        // copied under the lock, the parents read from /proc after it.
        let kids: Vec<(u32, Vec<(Gpid, u64)>)> = self
            .parents
            .lock()
            .iter()
            .map(|(&parent, rec)| {
                let kids = rec
                    .kids
                    .iter()
                    .filter(|(_, pg, _)| *pg == raw)
                    .map(|&(g, _, sid)| (g, sid))
                    .collect::<Vec<_>>();
                (parent, kids)
            })
            .filter(|(_, kids)| !kids.is_empty())
            .collect();
        let kids: Vec<(u32, Vec<u64>)> = {
            let ch = self.children.lock();
            let running = |g: &Gpid| {
                ch.get(g)
                    .is_some_and(|r| !r.collected && r.state.borrow().exit.is_none())
            };
            kids.into_iter()
                .map(|(p, ks)| {
                    let sids = ks
                        .into_iter()
                        .filter(|(g, _)| running(g))
                        .map(|(_, sid)| sid)
                        .collect();
                    (p, sids)
                })
                .collect()
        };
        for (parent, sids) in kids {
            if sids.is_empty() || !crate::pid_alive(parent as i32) {
                continue;
            }
            let ids = self.caller_ids(parent as i32);
            let (ppg, psid) = (
                self.cluster_id(Kind::Group, ids.pgid),
                self.cluster_id(Kind::Session, ids.sid),
            );
            if ppg != raw {
                info.links += sids.iter().filter(|&&sid| sid == psid).count() as u32;
            }
        }
        info
    }

    /// Whether local process `ppid` (node numbers) is a controlling link for a member of
    /// group `g` in session `sid`: alive, in another group, in the same session.
    fn is_link(&self, g: u64, ppid: u32, sid: u64) -> bool {
        if ppid <= 1 {
            return false; // outside the node's namespace, or its init
        }
        self.view.attrs(ppid, false).is_some_and(|q| {
            q.state != 'Z'
                && self.cluster_id(Kind::Group, q.pgrp) != g
                && self.cluster_id(Kind::Session, q.session) == sid
        })
    }

    /// Counts group `g`'s controlling links over the live nodes; if there are none and a
    /// member is stopped, sends every member SIGHUP then SIGCONT. Returns whether it did.
    pub async fn orphan_check(self: &Arc<Self>, g: Gpid) -> bool {
        let live: Vec<_> = self
            .cfg
            .node_ids()
            .filter(|&n| self.node_alive(n).unwrap_or(false))
            .collect();
        let parts = crate::fanout::on_each(live, |n| {
            let node = self.clone();
            async move {
                if n == node.id {
                    let node2 = node.clone();
                    return crate::fanout::blocking(move || node2.orphan_part(g))
                        .await
                        .ok();
                }
                let op = pb::peer_request::Op::Orphan(pb::OrphanProbe { pgid: g.raw() });
                let limit = node.cfg.dead_after();
                match node.call_within(n, node.own_creds(), op, limit).await {
                    Ok(pb::peer_reply::Reply::Orphan(o)) => Some(o),
                    _ => None, // a node that does not answer holds no links we can count
                }
            }
        })
        .await;
        let answered: HashSet<NodeId> = parts
            .iter()
            .filter_map(|(n, p)| p.as_ref().map(|_| *n))
            .collect();
        let parts: Vec<pb::OrphanInfo> = parts.into_iter().filter_map(|(_, p)| p).collect();
        let members: u32 = parts.iter().map(|p| p.members).sum();
        let links: u32 = parts.iter().map(|p| p.links).sum();
        let stopped = parts.iter().any(|p| p.stopped);
        debug!(%g, members, links, stopped, "orphan check");
        if members == 0 || !stopped {
            return false;
        }
        if links > 0 {
            info!(%g, links, "process group with a stopped member still controlled");
            return false;
        }
        // A node that did not answer but is not lost (it said goodbye, or is not yet
        // declared dead) may hold links whose processes live on: not orphaned yet.
        let unknown = self.uncounted_nodes(|n| answered.contains(&n));
        if !unknown.is_empty() {
            let list: Vec<String> = unknown.iter().map(|n| n.to_string()).collect();
            info!(
                %g,
                nodes = list.join(","),
                "process group with a stopped member: links on nodes that did not answer \
                 can not be counted; checked again once they answer or are lost"
            );
            self.orphan_deferred.lock().insert(g);
            return false;
        }
        info!(%g, "process group orphaned with a stopped member: SIGHUP and SIGCONT to it");
        let expr = format!("pgid={}", g.raw());
        let creds = self.own_creds();
        for sig in [libc::SIGHUP, libc::SIGCONT] {
            if let Err(e) = self.sigsend(&expr, sig, &creds).await {
                debug!(%g, "orphan signal: {e}");
            }
        }
        true
    }

    /// Nodes other than this one for which `counted` is false and that may hold links:
    /// their processes may live on (away after a goodbye, or not yet declared dead). A lost
    /// node holds none, nor one never heard from since this cland started (nothing of it
    /// can be in a group of ours that we do not know of).
    fn uncounted_nodes(&self, counted: impl Fn(NodeId) -> bool) -> Vec<NodeId> {
        self.cfg
            .node_ids()
            .filter(|&n| n != self.id && !counted(n))
            .filter(|n| {
                self.peers.get(n).is_some_and(|p| {
                    let st = p.state.lock();
                    !st.lost && (st.last_heard.is_some() || st.goodbye.is_some())
                })
            })
            .collect()
    }

    /// On each load sample: the deferred orphan checks run again once every other node
    /// is up or holds no links (lost, or never heard from), at most every `dead_after_ms`
    /// (a node heard but not reached would otherwise have them run on every sample). A
    /// node away for good (it said goodbye and never comes back) keeps them deferred: its
    /// processes may hold links to the end.
    pub fn recheck_deferred_orphans(self: &Arc<Self>) {
        if self.orphan_deferred.lock().is_empty() {
            return;
        }
        if !self
            .uncounted_nodes(|n| self.node_alive(n).unwrap_or(false))
            .is_empty()
        {
            return;
        }
        {
            let mut last = self.orphan_rechecked.lock();
            if last.is_some_and(|t| t.elapsed() < self.cfg.dead_after()) {
                return;
            }
            *last = Some(std::time::Instant::now());
        }
        let groups: Vec<Gpid> = self.orphan_deferred.lock().drain().collect();
        self.spawn_orphan_checks(groups);
    }

    /// The local controlling links of each of `groups`: (parent, its start time) pairs,
    /// from one scan of the node.
    fn scan_link_holders(&self, groups: &HashSet<u64>) -> HashMap<u64, Vec<(u32, u64)>> {
        let mut out: HashMap<u64, Vec<(u32, u64)>> = HashMap::new();
        if groups.is_empty() {
            return out;
        }
        for pid in self.view.pids() {
            let Some(a) = self.view.attrs(pid, false) else {
                continue;
            };
            let g = self.cluster_id(Kind::Group, a.pgrp);
            if a.state == 'Z' || !groups.contains(&g) {
                continue;
            }
            if self.is_link(g, a.ppid, self.cluster_id(Kind::Session, a.session)) {
                if let Some(q) = self.view.attrs(a.ppid, false) {
                    out.entry(g).or_default().push((a.ppid, q.start_ticks));
                }
            }
        }
        for v in out.values_mut() {
            v.sort_unstable();
            v.dedup();
        }
        out
    }

    /// At the home of group `g`, which has members on other nodes: note its local link
    /// holders now (see [`Node::check_link_holders`]).
    pub fn watch_links(&self, g: Gpid) {
        if g.node() != self.id {
            return;
        }
        let set: HashSet<u64> = [g.raw()].into();
        let holders = self
            .scan_link_holders(&set)
            .remove(&g.raw())
            .unwrap_or_default();
        self.link_holders.lock().insert(g, holders);
    }

    /// On each load sample, for the groups homed here with members on other nodes: a local
    /// link holder seen last time that has exited triggers an orphan check; the holders are
    /// then noted afresh (links come and go with forks and setpgid).
    pub fn check_link_holders(self: &Arc<Self>) {
        let groups: HashSet<u64> = self
            .members
            .lock()
            .groups()
            .into_iter()
            .map(|g| g.raw())
            .collect();
        let mut now = self.scan_link_holders(&groups);
        let mut check = Vec::new();
        {
            let mut lh = self.link_holders.lock();
            for (g, old) in lh.iter() {
                let fresh = now.get(&g.raw());
                let gone = old.iter().any(|h| {
                    !fresh.is_some_and(|f| f.contains(h))
                        && self
                            .view
                            .attrs(h.0, false)
                            .is_none_or(|a| a.start_ticks != h.1 || a.state == 'Z')
                });
                if gone {
                    check.push(*g);
                }
            }
            lh.clear();
            for g in groups {
                if let Some(gp) = Gpid::from_raw(g) {
                    lh.insert(gp, now.remove(&g).unwrap_or_default());
                }
            }
        }
        for g in check {
            let node = self.clone();
            tokio::spawn(async move {
                node.orphan_check(g).await;
            });
        }
    }

    /// Checks each of `groups` on a task of its own (after a node died, the groups this
    /// node is home of with members there; or the deferred checks).
    pub fn spawn_orphan_checks(self: &Arc<Self>, groups: Vec<Gpid>) {
        for g in groups {
            let node = self.clone();
            tokio::spawn(async move {
                node.orphan_check(g).await;
            });
        }
    }
}
