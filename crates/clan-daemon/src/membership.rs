//! Membership: who is alive, quorum, and fencing (DESIGN.md 11; docs/architecture.md,
//! "Node failure and partitions").
//!
//! A peer not heard from for `dead_after_ms` is declared dead, and everything it held is
//! treated as killed: its processes leave `clan ps`, waiting parents get SIGKILL, stubs exit
//! 137, group member lists move to the next live node, orphan checks run again.
//!
//! A network partition looks the same from both sides, so one rule decides which side is
//! right: *quorum*. A node has quorum while the nodes it sees alive, itself included, are
//! more than half of the cluster, or exactly half with the lowest node id among them.
//!
//! - A node that declares a peer dead while it has quorum records the peer's incarnation as
//!   *fenced*, refuses every connection and frame from that incarnation, and lists it in
//!   its heartbeats.
//! - A node that loses quorum fences itself at once: it kills every process it manages
//!   (as the others already told their waiters) and takes a new incarnation.
//! - A node that hears its own incarnation listed as fenced (the link came back before its
//!   own timer ran out, or it was frozen) fences itself the same way.
//!
//! - A cland that restarts and takes over the processes of the one before (their shepherds
//!   outlive it) fences itself too if it hears that earlier incarnation listed.
//!
//! Only a new incarnation rejoins, so a cut-off node never acts on state the others have
//! already given up: its old processes, waits and stubs are gone before it is heard again.

use crate::node::Node;
use crate::peer::Peer;
use clan_proto::pb;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// A random incarnation number (63 bits, never 0).
pub fn fresh_incarnation() -> u64 {
    let mut b = [0u8; 8];
    getrandom::getrandom(&mut b).expect("kernel random");
    (u64::from_le_bytes(b) >> 1).max(1)
}

/// Quorum over `alive` (the live node ids, this node included) out of `all` (every node
/// of the cluster file).
pub fn has_quorum(alive: &[u32], all: &[u32]) -> bool {
    let lowest = all.iter().min();
    2 * alive.len() > all.len()
        || (2 * alive.len() == all.len() && lowest.is_some_and(|l| alive.contains(l)))
}

impl Node {
    /// Whether this node has quorum from the peers' states now. Nodes that stopped cleanly
    /// (said goodbye) do not vote: stopping nodes one by one never fences the last ones.
    pub fn in_quorum(&self) -> bool {
        let all: Vec<u32> = self
            .cfg
            .node_ids()
            .filter(|n| {
                self.peers
                    .get(n)
                    .is_none_or(|p| p.state.lock().goodbye.is_none())
            })
            .map(|n| n.get())
            .collect();
        let alive: Vec<u32> = self
            .cfg
            .node_ids()
            .filter(|n| self.node_alive(*n).unwrap_or(false))
            .map(|n| n.get())
            .collect();
        has_quorum(&alive, &all)
    }

    /// The failure detector: runs every quarter heartbeat. A tick that comes much later
    /// than due means this daemon was not running (frozen, starved): that time is not held
    /// against the peers.
    pub async fn run_failure_detector(self: Arc<Self>) {
        let period = Duration::from_millis((self.cfg.heartbeat_ms / 4).max(20));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = Instant::now();
        loop {
            tick.tick().await;
            let gap = last.elapsed();
            last = Instant::now();
            let allowance = (period * 4).max(self.cfg.dead_after() / 4);
            if gap > allowance {
                let lost = gap - period;
                warn!(
                    stalled_ms = lost.as_millis() as u64,
                    "this daemon did not run for a while; not holding it against the peers"
                );
                for p in self.peers.values() {
                    let mut st = p.state.lock();
                    if let Some(t) = st.last_heard.as_mut() {
                        *t = (*t + lost).min(Instant::now());
                    }
                }
            }
            self.detect_failures();
        }
    }

    pub(crate) fn detect_failures(self: &Arc<Self>) {
        let mut newly_dead = Vec::new();
        for p in self.peers.values() {
            let mut st = p.state.lock();
            let dead = crate::peer::is_down(p.state_of_locked(&st, &self.cfg, self.started));
            if dead && !st.declared_dead && (st.last_heard.is_some() || st.goodbye.is_some()) {
                st.declared_dead = true;
                newly_dead.push(p.clone());
            }
        }
        let quorum = self.in_quorum();
        // A fence under way drops this node's view of every peer on purpose, and leaves
        // quorum off until it hears them again (see `fence`): not a loss to fence for.
        let had = if self.fencing.load(Ordering::Acquire) {
            quorum // no change to act on
        } else {
            self.quorum.swap(quorum, Ordering::AcqRel)
        };
        for p in &newly_dead {
            let (inc, goodbye) = {
                let mut st = p.state.lock();
                // Authoritative only with quorum (and not for a goodbye: a clean stop).
                let goodbye = st.goodbye.is_some();
                if quorum && !goodbye {
                    st.fenced = st.info.as_ref().map(|i| i.incarnation);
                }
                st.lost |= !goodbye;
                (st.fenced, goodbye)
            };
            if goodbye {
                // A clean stop of its cland: its processes live on under their shepherds.
                info!(node = %p.id, "node is away (said goodbye)");
                self.node_away(p, false);
                // The member lists it kept move to the next live node, as for a death.
                self.reregister_groups();
                continue;
            }
            warn!(node = %p.id, fenced = inc.is_some(), "node declared dead");
            self.node_lost(p);
        }
        if had && !quorum {
            let alive: Vec<String> = self
                .cfg
                .node_ids()
                .filter(|n| self.node_alive(*n).unwrap_or(false))
                .map(|n| n.to_string())
                .collect();
            self.fence_later(format!(
                "lost quorum (sees only node(s) {} of {})",
                alive.join(", "),
                self.cfg.nodes.len()
            ));
        } else if !had && quorum {
            info!("quorum regained");
        }
    }

    /// Everything a dead peer held is treated as killed.
    pub fn node_lost(self: &Arc<Self>, p: &Arc<Peer>) {
        self.node_away(p, true);
        self.children_of_dead_node(p.id);
        self.parent_node_lost(p.id);
        let groups = self.members_of_dead_node(p.id);
        self.spawn_orphan_checks(groups);
        self.reregister_groups();
    }

    /// Node `p` can not be reached: what is asked of it fails (`NodeDead` if its processes
    /// are `lost`, else `NodeDown`: they may live on), its sessions end.
    pub fn node_away(&self, p: &Arc<Peer>, lost: bool) {
        p.fail_pending(if lost {
            crate::error::Error::NodeDead(p.id)
        } else {
            crate::error::Error::NodeDown(format!("node {} is down", p.id))
        });
        p.spare_sessions.lock().clear();
        p.deaths.send_modify(|n| *n += 1);
    }

    /// The incarnations this node has fenced, for its heartbeats.
    pub fn fenced_list(&self) -> Vec<pb::Fenced> {
        self.peers
            .values()
            .filter_map(|p| {
                p.state.lock().fenced.map(|incarnation| pb::Fenced {
                    node: p.id.get(),
                    incarnation,
                })
            })
            .collect()
    }

    /// A heartbeat from `from`: does it say this node's incarnation, or the previous
    /// cland's whose processes this one took over, is fenced?
    pub fn check_fenced(self: &Arc<Self>, from: clan_core::NodeId, hb: &pb::Heartbeat) {
        let (me, prev) = (
            self.incarnation(),
            self.prev_incarnation.load(Ordering::Acquire),
        );
        for f in hb.fenced.iter().filter(|f| f.node == self.id.get()) {
            if f.incarnation == me {
                self.fence_later(format!("node {from} declared this node dead"));
            } else if prev != 0 && f.incarnation == prev {
                self.fence_later(format!(
                    "node {from} declared the previous cland of this node dead"
                ));
            }
        }
    }

    /// Fences this node (kills what it manages, takes a new incarnation) on a task of its
    /// own, once at a time.
    pub fn fence_later(self: &Arc<Self>, reason: String) {
        if self.fencing.swap(true, Ordering::AcqRel) {
            return;
        }
        let node = self.clone();
        tokio::spawn(async move {
            node.fence(&reason).await;
            node.fencing.store(false, Ordering::Release);
        });
    }

    /// Fencing: every process this node manages is killed (the rest of the cluster has
    /// told their waiters and stubs they were), every peer's share is dropped as if it had
    /// died, and the node takes a new incarnation, the only one the others accept again.
    async fn fence(self: &Arc<Self>, reason: &str) {
        let old = self.incarnation();
        warn!(
            reason,
            "fencing: killing this node's processes, rejoining as a new incarnation"
        );
        let node = self.clone();
        let killed = tokio::task::spawn_blocking(move || node.kill_managed())
            .await
            .unwrap_or(0);
        for p in self.peers.values() {
            let newly = {
                let mut st = p.state.lock();
                let newly = !st.lost;
                st.declared_dead = true;
                st.lost = true;
                st.last_heard = None;
                newly
            };
            if newly {
                self.node_lost(p);
            }
        }
        // It sees no peer now: without quorum until it hears them as the new incarnation
        // (else the next check would take this for a partition and fence again).
        self.quorum.store(false, Ordering::Release);
        let new = fresh_incarnation();
        self.prev_incarnation.store(0, Ordering::Release);
        self.set_incarnation(new);
        warn!(old, new, killed, "fenced");
    }

    /// Kills every managed process (their job cgroups, or each one without cgroups) and
    /// waits until they are gone. Returns how many job cgroups or processes it killed.
    fn kill_managed(&self) -> usize {
        let mut n = 0;
        if let Some(cg) = &self.cgroup {
            let jobs: Vec<_> = std::fs::read_dir(&cg.root)
                .map(|rd| {
                    rd.flatten()
                        .filter(|e| e.file_name().to_string_lossy().starts_with("job"))
                        .map(|e| e.path())
                        .collect()
                })
                .unwrap_or_default();
            for d in jobs {
                // Removed, not only emptied: a process cloned into a cgroup that saw
                // cgroup.kill from one that did not is killed at birth on this kernel.
                match crate::cgroup::kill_and_remove(&d, Duration::from_secs(10)) {
                    Ok(()) => n += 1,
                    Err(e) => warn!("fence {}: {e}", d.display()),
                }
            }
        } else {
            for vp in self.vprocs.read().values() {
                if vp.exited().is_none() {
                    self.kill_node_pid(vp.gpid.local(), libc::SIGKILL);
                    n += 1;
                }
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::has_quorum;

    #[test]
    fn quorum_is_a_majority_or_the_half_with_the_lowest_node() {
        let all = [1, 2, 3, 4];
        assert!(has_quorum(&[1, 2, 3], &all));
        assert!(has_quorum(&[1, 4], &all));
        assert!(!has_quorum(&[2, 3], &all));
        assert!(!has_quorum(&[4], &all));
        let three = [1, 2, 3];
        assert!(has_quorum(&[2, 3], &three));
        assert!(!has_quorum(&[1], &three));
        assert!(has_quorum(&[1], &[1]));
        assert!(has_quorum(&[1], &[1, 2]));
        assert!(!has_quorum(&[2], &[1, 2]));
    }
}
