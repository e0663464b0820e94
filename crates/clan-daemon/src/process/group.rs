//! Cluster-wide process groups and sessions (Solaris MC 4.2) and sigsendset (4.1).
//!
//! The kernel keeps groups and sessions per pid namespace, so a group spans nodes through
//! *aliases*: a process that clan starts for a requester in cluster group G and session S gets
//! a local group and session of its own on its node (the shepherd's child calls setsid), and
//! that node records "local group L is G, local session L is S". Everything the kernel does
//! inside L stays true (children inherit L, setpgid and setsid leave it), and the cluster id
//! of any local group is its alias, or else its own gpid. A group's *home* is the node its
//! gpid names; it keeps the set of other nodes that hold aliases of it (Solaris MC's group
//! object with its member list), so signalling a group asks its home and the nodes on that
//! list, never the whole cluster. While the home is dead, the next live node after it in id
//! order keeps the list: the member nodes register with it (membership.rs), and they
//! register with the home again when it is back.

use crate::error::{Error, Result};
use crate::node::Node;
use crate::process::view::TickScan;
use clan_core::sigset::{self, Attrs, Expr, Route};
use clan_core::{Gpid, NodeId};
use clan_proto::pb;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use tracing::debug;

/// Which kind of cluster object an id names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Group,
    Session,
}

/// This node's local groups and sessions that stand for foreign (or other local) ones.
#[derive(Default)]
pub struct Aliases {
    pg: HashMap<u32, Gpid>,
    sid: HashMap<u32, Gpid>,
}

impl Aliases {
    fn map(&self, kind: Kind) -> &HashMap<u32, Gpid> {
        match kind {
            Kind::Group => &self.pg,
            Kind::Session => &self.sid,
        }
    }

    pub fn len(&self) -> usize {
        self.pg.len() + self.sid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every alias: (kind, local id, cluster id).
    fn entries(&self) -> HashSet<(Kind, u32, Gpid)> {
        let of = |kind, m: &HashMap<u32, Gpid>| -> Vec<(Kind, u32, Gpid)> {
            m.iter().map(|(l, g)| (kind, *l, *g)).collect()
        };
        of(Kind::Group, &self.pg)
            .into_iter()
            .chain(of(Kind::Session, &self.sid))
            .collect()
    }

    /// Drops the aliases of `before` (those there when the scan began) whose local group
    /// or session is not among `pgs` and `sids` (the scan's); an alias made since the scan
    /// began stays, its process may have come too late to be seen. Returns the cluster
    /// ids this node holds no alias of any more.
    fn prune(
        &mut self,
        pgs: &HashSet<u32>,
        sids: &HashSet<u32>,
        before: &HashSet<(Kind, u32, Gpid)>,
    ) -> Vec<(Kind, Gpid)> {
        let mut gone = Vec::new();
        for (kind, live) in [(Kind::Group, pgs), (Kind::Session, sids)] {
            let map = match kind {
                Kind::Group => &mut self.pg,
                Kind::Session => &mut self.sid,
            };
            let was: HashSet<Gpid> = map.values().copied().collect();
            map.retain(|l, g| live.contains(l) || !before.contains(&(kind, *l, *g)));
            let now: HashSet<Gpid> = map.values().copied().collect();
            gone.extend(was.difference(&now).map(|g| (kind, *g)));
        }
        gone
    }
}

/// At a home node: the other nodes holding members of each of its groups and sessions.
#[derive(Default)]
pub struct Members {
    map: HashMap<(Kind, Gpid), BTreeSet<NodeId>>,
}

impl Members {
    /// The groups (not sessions) with members on other nodes.
    pub fn groups(&self) -> Vec<Gpid> {
        self.map
            .keys()
            .filter(|(k, _)| *k == Kind::Group)
            .map(|(_, g)| *g)
            .collect()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// The caller's supplementary groups, its real uid and effective capabilities (`None` if
/// its status could not be read) and its process group and session in the node's pid
/// namespace (0 when the caller is outside it), from one read of /proc/PID/status.
pub struct CallerIds {
    pub groups: Vec<u32>,
    pub ruid: Option<u32>,
    pub caps: Option<u64>,
    pub pgid: u32,
    pub sid: u32,
}

impl Node {
    /// Reads what the credentials of a local caller need (see [`CallerIds`]).
    pub fn caller_ids(&self, host_pid: i32) -> CallerIds {
        let status =
            clan_core::sys::read_small(format!("/proc/{host_pid}/status")).unwrap_or_default();
        let field = |k: &str| -> Vec<u32> { clan_core::sys::status_numbers(&status, k) };
        let groups = field("Groups");
        // The node's own pid namespace is the host's (level 0) on a real node, the first one
        // below it on a local cluster, where the caller must be in that very namespace.
        let level = usize::from(self.view.ns_init != 0);
        let in_node = level == 0 || self.view.in_node_pid_ns(host_pid as u32);
        let at = |v: Vec<u32>| {
            if in_node {
                v.get(level).copied().unwrap_or(0)
            } else {
                0
            }
        };
        CallerIds {
            groups,
            ruid: field("Uid").first().copied(),
            caps: clan_core::sys::status_caps(&status, "CapEff"),
            pgid: at(field("NSpgid")),
            sid: at(field("NSsid")),
        }
    }

    /// The parent (host pid) of a local caller that is a process of this node: the process
    /// that ran `clan run -d`, whose exit releases the records of what it started. `None`
    /// for callers outside the node's processes (a host shell of a local cluster), whose
    /// children stay until waited for.
    pub fn parent_of_caller(&self, creds: &pb::Creds) -> Option<u32> {
        if creds.pgid == 0 || creds.pid == 0 {
            return None;
        }
        let ppid = |pid: u32| -> Option<u32> {
            let s = clan_core::sys::read_small(format!("/proc/{pid}/stat")).ok()?;
            s.get(s.rfind(')')? + 2..)?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        };
        let p = ppid(creds.pid)?;
        // Not the node's init (the caller was orphaned) nor a process outside the node.
        (p > 1 && p != self.view.ns_init && self.caller_ids(p as i32).pgid != 0).then_some(p)
    }

    /// The cluster id of local group or session `local` (0 stays 0).
    pub fn cluster_id(&self, kind: Kind, local: u32) -> u64 {
        if local == 0 {
            return 0;
        }
        if let Some(g) = self.aliases.read().map(kind).get(&local) {
            return g.raw();
        }
        // A session led by a shepherd whose alias is not recorded yet (the process runs
        // before cland hears of it): it stands for the shepherd's process, as the alias will.
        if kind == Kind::Session {
            if let Some(child) = self.view.shepherd_child(local) {
                return Gpid::new(self.id, child).map_or(0, |g| g.raw());
            }
        }
        Gpid::new(self.id, local).map_or(0, |g| g.raw())
    }

    /// A process started here for `creds` (found at spawn, or again from its shepherd after
    /// a restart): its own local group and session (both numbered by its pid, the shepherd's
    /// child calls setsid) stand for the requester's. Returns the homes to tell, those the
    /// requester's node does not tell itself.
    pub fn alias_insert(
        &self,
        ns_pid: u32,
        local_sid: u32,
        creds: &pb::Creds,
    ) -> Vec<(Kind, Gpid)> {
        let mut homes = Vec::new();
        let mut a = self.aliases.write();
        // The process's local session is its shepherd's: without a requester's session, it
        // stands for the process itself, whose gpid names the session in the cluster.
        if Gpid::from_raw(creds.sid).is_none() && local_sid != ns_pid {
            if let Some(own) = Gpid::new(self.id, ns_pid) {
                a.sid.insert(local_sid, own);
            }
        }
        for (kind, raw) in [(Kind::Group, creds.pgid), (Kind::Session, creds.sid)] {
            let Some(g) = Gpid::from_raw(raw) else {
                continue;
            };
            match kind {
                Kind::Group => a.pg.insert(ns_pid, g),
                Kind::Session => a.sid.insert(local_sid, g),
            };
            let reg = self.registry_of(g);
            if reg.is_some_and(|r| r != self.id && r.get() != creds.node) {
                homes.push((kind, g));
            }
        }
        homes
    }

    /// Where the member list of `g` lives: its home node, or while the home is dead the next
    /// live node after it in id order, which takes the list over (the members tell it).
    pub fn registry_of(&self, g: Gpid) -> Option<NodeId> {
        let ids: Vec<NodeId> = self.cfg.node_ids().collect();
        let start = ids.iter().position(|n| *n == g.node())?;
        (0..ids.len())
            .map(|k| ids[(start + k) % ids.len()])
            .find(|n| self.node_alive(*n).unwrap_or(false))
    }

    /// After a membership change: tells the registry of every foreign group and session
    /// this node holds members of that it does (joins are idempotent).
    pub fn reregister_groups(self: &Arc<Self>) {
        let held: BTreeSet<(u8, Gpid)> = {
            let a = self.aliases.read();
            a.pg.values()
                .map(|g| (0, *g))
                .chain(a.sid.values().map(|g| (1, *g)))
                .collect()
        };
        for (k, g) in held {
            let kind = if k == 0 { Kind::Group } else { Kind::Session };
            if self.registry_of(g).is_some_and(|r| r != self.id) {
                let node = self.clone();
                tokio::spawn(async move { node.send_join(kind, g, false).await });
            }
        }
    }

    /// A peer is up again (or restarted): member lists this node kept for its groups while
    /// it was dead go back to it, and it learns again which groups we hold members of.
    pub fn peer_rejoined(self: &Arc<Self>, peer: NodeId) {
        self.members.lock().map.retain(|(_, g), _| g.node() != peer);
        self.reregister_groups();
    }

    /// Tells the homes of `homes` that this node holds members.
    pub async fn tell_homes(self: &Arc<Self>, homes: Vec<(Kind, Gpid)>) {
        for (kind, g) in homes {
            self.send_join(kind, g, false).await;
        }
    }

    /// Requester side: a process was started on `target` for `creds`; if this node is the
    /// home of the requester's group or session, note that `target` holds a member.
    pub fn note_member(self: &Arc<Self>, target: NodeId, creds: &pb::Creds) {
        if target == self.id {
            return;
        }
        {
            let mut m = self.members.lock();
            for (kind, raw) in [(Kind::Group, creds.pgid), (Kind::Session, creds.sid)] {
                if let Some(g) =
                    Gpid::from_raw(raw).filter(|g| self.registry_of(*g) == Some(self.id))
                {
                    m.map.entry((kind, g)).or_default().insert(target);
                }
            }
        }
        self.watch_links_later(creds.pgid);
    }

    /// [`Node::watch_links`] on a blocking thread, for a group with members elsewhere.
    fn watch_links_later(self: &Arc<Self>, pgid: u64) {
        if let Some(g) = Gpid::from_raw(pgid).filter(|g| g.node() == self.id) {
            let node = self.clone();
            tokio::task::spawn_blocking(move || node.watch_links(g));
        }
    }

    async fn send_join(self: &Arc<Self>, kind: Kind, g: Gpid, leave: bool) {
        let (pgid, sid) = match kind {
            Kind::Group => (g.raw(), 0),
            Kind::Session => (0, g.raw()),
        };
        let op = pb::peer_request::Op::Join(pb::GroupJoin {
            pgid,
            sid,
            node: self.id.get(),
            leave,
        });
        // A node just heard again may not have our connection yet: retry while it is
        // unreachable but not dead, and while it is still the list's keeper.
        for _ in 0..50 {
            let Some(reg) = self.registry_of(g).filter(|r| *r != self.id) else {
                return;
            };
            match self.call(reg, self.own_creds(), op.clone()).await {
                Ok(_) => return,
                Err(Error::NodeDown(e)) => {
                    debug!(%g, registry = %reg, "group join/leave, retrying: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => {
                    debug!(%g, registry = %reg, "group join/leave: {e}");
                    return;
                }
            }
        }
    }

    /// Home side of [`pb::GroupJoin`].
    pub fn member_join(self: &Arc<Self>, j: &pb::GroupJoin) -> Result<()> {
        self.member_join_inner(j)?;
        if !j.leave {
            self.watch_links_later(j.pgid);
        }
        Ok(())
    }

    fn member_join_inner(&self, j: &pb::GroupJoin) -> Result<()> {
        let node = NodeId::new(j.node)
            .ok_or_else(|| Error::Invalid(format!("invalid node {}", j.node)))?;
        let mut m = self.members.lock();
        for (kind, raw) in [(Kind::Group, j.pgid), (Kind::Session, j.sid)] {
            let Some(g) = Gpid::from_raw(raw) else {
                continue;
            };
            if j.leave {
                if let Some(s) = m.map.get_mut(&(kind, g)) {
                    s.remove(&node);
                    if s.is_empty() {
                        m.map.remove(&(kind, g));
                    }
                }
            } else {
                m.map.entry((kind, g)).or_default().insert(node);
            }
        }
        Ok(())
    }

    /// A node died: it holds no members any more. Returns the groups it had members of.
    pub fn members_of_dead_node(&self, dead: NodeId) -> Vec<Gpid> {
        let mut m = self.members.lock();
        let mut groups = Vec::new();
        m.map.retain(|(kind, g), s| {
            if s.remove(&dead) && *kind == Kind::Group {
                groups.push(*g);
            }
            !s.is_empty()
        });
        groups
    }

    /// Drops aliases whose local group or session has no process left, and tells their
    /// homes when this node holds no member of a foreign group or session any more.
    /// `live` holds the local (pgid, sid) of every process of the node, from a scan that
    /// began when the aliases were `before`: only those can be dropped.
    pub fn prune_aliases(
        self: &Arc<Self>,
        live: &[(u32, u32)],
        before: &HashSet<(Kind, u32, Gpid)>,
    ) {
        let pgs: HashSet<u32> = live.iter().map(|p| p.0).collect();
        let sids: HashSet<u32> = live.iter().map(|p| p.1).collect();
        let gone = self.aliases.write().prune(&pgs, &sids, before);
        for (kind, g) in gone {
            if g.node() != self.id {
                let node = self.clone();
                tokio::spawn(async move { node.send_join(kind, g, true).await });
            }
        }
    }

    /// The aliases there now, for [`Node::prune_group_aliases`]: taken before the scan it
    /// judges them by, since an alias made during the scan (its process started after its
    /// pid was listed) is not that scan's to judge.
    pub fn aliases_before_scan(&self) -> HashSet<(Kind, u32, Gpid)> {
        self.aliases.read().entries()
    }

    /// [`Node::prune_aliases`] of the aliases `before` over the heartbeat's scan of the
    /// node (made only when there are aliases).
    pub fn prune_group_aliases(
        self: &Arc<Self>,
        before: &HashSet<(Kind, u32, Gpid)>,
        scan: &TickScan,
    ) {
        if before.is_empty() {
            return;
        }
        let live: Vec<(u32, u32)> = scan
            .get()
            .iter()
            .filter(|p| !p.shepherd)
            .map(|p| (p.pgrp, p.session))
            .collect();
        self.prune_aliases(&live, before);
    }

    /// Sizes of the group tables, for `clan stats`.
    pub fn group_table_sizes(&self) -> (usize, usize) {
        (self.aliases.read().len(), self.members.lock().len())
    }

    /// `clan sigsend` (and `clan kill -g/--session`) from a local caller: parse, route to the
    /// nodes that can hold a match, collect what each delivered or refused.
    pub async fn sigsend(
        self: &Arc<Self>,
        expr: &str,
        sig: i32,
        creds: &pb::Creds,
    ) -> Result<Vec<pb::KillResult>> {
        let e = sigset::parse(expr)
            .map_err(|e| Error::Invalid(format!("set expression {expr:?}: {e}")))?;
        if !(0..=libc::SIGRTMAX()).contains(&sig) {
            return Err(Error::Invalid(format!("invalid signal {sig}")));
        }
        let canon = e.to_string();
        match e.route() {
            Route::Node(n) => Ok(self.sigsend_on(vec![n], &canon, sig, creds).await),
            Route::Group(g) | Route::Session(g) if self.registry_of(g).is_some() => {
                match self.registry_of(g) {
                    Some(r) if r != self.id => {
                        Ok(self.sigsend_remote(r, &canon, sig, true, creds).await)
                    }
                    _ => self.sigsend_fan_out(&e, &canon, sig, creds).await,
                }
            }
            _ => {
                let all: Vec<NodeId> = self.cfg.node_ids().collect();
                Ok(self.sigsend_on(all, &canon, sig, creds).await)
            }
        }
    }

    /// At the home of the group or session `e` routes to: here and the member nodes.
    pub async fn sigsend_fan_out(
        self: &Arc<Self>,
        e: &Expr,
        canon: &str,
        sig: i32,
        creds: &pb::Creds,
    ) -> Result<Vec<pb::KillResult>> {
        let key = match e.route() {
            Route::Group(g) => (Kind::Group, g),
            Route::Session(g) => (Kind::Session, g),
            _ => {
                return Err(Error::Invalid(
                    "fan-out of an expression without a group".into(),
                ))
            }
        };
        let mut nodes = vec![self.id];
        if let Some(s) = self.members.lock().map.get(&key) {
            nodes.extend(s.iter().copied());
        }
        Ok(self.sigsend_on(nodes, canon, sig, creds).await)
    }

    /// Evaluates on each of `nodes` at once (this one locally); a node that can not answer
    /// is one result with its error.
    async fn sigsend_on(
        self: &Arc<Self>,
        nodes: Vec<NodeId>,
        canon: &str,
        sig: i32,
        creds: &pb::Creds,
    ) -> Vec<pb::KillResult> {
        let answers = crate::fanout::on_each(nodes, |n| {
            let (node, canon, creds) = (self.clone(), canon.to_string(), creds.clone());
            async move {
                if n == node.id {
                    node.sigsend_local(&canon, sig, &creds).await
                } else {
                    node.sigsend_remote(n, &canon, sig, false, &creds).await
                }
            }
        })
        .await;
        let mut out: Vec<pb::KillResult> = answers.into_iter().flat_map(|(_, r)| r).collect();
        out.sort_by_key(|r| r.gpid);
        out
    }

    async fn sigsend_remote(
        self: &Arc<Self>,
        n: NodeId,
        canon: &str,
        sig: i32,
        fan_out: bool,
        creds: &pb::Creds,
    ) -> Vec<pb::KillResult> {
        let op = pb::peer_request::Op::Sigsend(pb::SigsendRequest {
            expr: canon.to_string(),
            signal: sig,
            fan_out,
        });
        let limit = self.cfg.dead_after();
        let err = match tokio::time::timeout(limit, self.call(n, creds.clone(), op)).await {
            Ok(Ok(pb::peer_reply::Reply::Kill(k))) => return k.results,
            Ok(Ok(other)) => Error::Internal(format!("unexpected reply {other:?}")),
            Ok(Err(e)) => e,
            Err(_) => Error::NodeDead(n),
        };
        vec![pb::KillResult {
            gpid: 0,
            error: Some(err.into()),
        }]
    }

    /// Evaluates the expression over this node's processes and signals the matches, each
    /// with the POSIX check against the caller's credentials.
    pub async fn sigsend_local(
        self: &Arc<Self>,
        canon: &str,
        sig: i32,
        creds: &pb::Creds,
    ) -> Vec<pb::KillResult> {
        let e = match sigset::parse(canon) {
            Ok(e) => e,
            Err(err) => {
                return vec![pb::KillResult {
                    gpid: 0,
                    error: Some(Error::Invalid(format!("set expression: {err}")).into()),
                }]
            }
        };
        let (node, creds) = (self.clone(), creds.clone());
        tokio::task::spawn_blocking(move || {
            let need_job = e.uses_job();
            let mut out = Vec::new();
            for pid in node.view.pids() {
                // Neither the node's init nor, on a real node, cland itself.
                if pid == 1 || (node.view.ns_init == 0 && pid == std::process::id()) {
                    continue;
                }
                let Some(a) = node.view.attrs(pid, need_job) else {
                    continue;
                };
                let Some(gpid) = Gpid::new(node.id, pid) else {
                    continue;
                };
                let attrs = Attrs {
                    gpid: gpid.raw(),
                    pgid: node.cluster_id(Kind::Group, a.pgrp),
                    sid: node.cluster_id(Kind::Session, a.session),
                    uid: a.uid,
                    job: a.job,
                    node: node.id.get(),
                };
                if !e.matches(&attrs) {
                    continue;
                }
                let error = match node.signal_local(gpid, sig, &creds) {
                    Ok(()) => None,
                    Err(Error::NoSuchProcess(_)) => continue, // it exited meanwhile
                    Err(e) => Some(e.into()),
                };
                out.push(pb::KillResult {
                    gpid: gpid.raw(),
                    error,
                });
            }
            out
        })
        .await
        .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(raw: u64) -> Gpid {
        Gpid::from_raw(raw).expect("gpid")
    }

    #[test]
    fn a_prune_keeps_the_aliases_made_after_its_scan_began() {
        let mut a = Aliases::default();
        a.pg.insert(10, g(20_000_007));
        a.sid.insert(9, g(20_000_001));
        let before = a.entries();
        // During the scan (which saw neither group 10 nor 11 live): a new process's alias,
        // and local group 10 taken again for another cluster group.
        a.pg.insert(11, g(20_000_007));
        a.pg.insert(10, g(30_000_005));
        let gone = a.prune(&HashSet::new(), &[9].into(), &before);
        assert_eq!(
            a.pg.get(&11),
            Some(&g(20_000_007)),
            "made after the scan began"
        );
        assert_eq!(
            a.pg.get(&10),
            Some(&g(30_000_005)),
            "changed after the scan began"
        );
        assert_eq!(a.sid.get(&9), Some(&g(20_000_001)), "live");
        assert!(gone.is_empty(), "{gone:?}");
        // The next scan sees neither: both go, and the homes are told.
        let before = a.entries();
        let mut gone = a.prune(&HashSet::new(), &HashSet::new(), &before);
        gone.sort_by_key(|(k, g)| (*k == Kind::Session, *g));
        assert!(a.is_empty());
        assert_eq!(
            gone,
            vec![
                (Kind::Group, g(20_000_007)),
                (Kind::Group, g(30_000_005)),
                (Kind::Session, g(20_000_001))
            ]
        );
    }
}
