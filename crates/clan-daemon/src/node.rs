//! The node: Solaris MC's process manager. It owns this node's tables, each behind its own
//! named lock (DESIGN.md 17); there is no lock around the node as a whole.
//!
//! Lock order, where two are held at once: `vprocs` before `vproc.subscriber`;
//! `peer.state` before `peer.pending`. No lock is held across an `.await`.

use crate::cgroup::NodeCgroup;
use crate::error::{Error, Result};
use crate::peer::Peer;
use crate::placement::Placement;
use crate::process::group::{Aliases, Kind, Members};
use crate::process::view::{ProcView, TickScan};
use crate::process::vproc::VProc;
use crate::process::wait::ChildRec;
use clan_core::{ClusterConfig, Gpid, JobId, NamedMutex, NamedRwLock, NodeId};
use clan_proto::pb;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;

/// Load figures of this node, refreshed by the sampler.
#[derive(Debug, Clone, Default)]
pub struct LocalLoad {
    pub load: f64,
    pub procs: u32,
    pub mem_used_kb: u64,
    pub mem_total_kb: u64,
    /// Placements made here on this node that a sample may not have seen yet.
    pub placed: Placed,
}

/// How long a placement may take to become a running process that a load sample sees
/// (the spawn, on a busy node).
pub const SPAWN_ALLOWANCE: std::time::Duration = std::time::Duration::from_secs(1);

/// Placements made on a node that its load, as last sampled, may not show yet: least-loaded
/// counts each as one runnable process, so that placements made between two samples (or
/// heartbeats) do not all go to the node that looked idlest.
#[derive(Debug, Clone, Default)]
pub struct Placed(std::collections::VecDeque<Instant>);

impl Placed {
    /// At most this many are remembered per node (a burst beyond them counts as this many).
    const MAX: usize = 4096;

    pub fn note(&mut self) {
        if self.0.len() >= Self::MAX {
            self.0.pop_front();
        }
        self.0.push_back(Instant::now());
    }

    /// A load sample came that surely has the placements made `settle` or longer ago.
    pub fn sampled(&mut self, settle: std::time::Duration) {
        while self.0.front().is_some_and(|t| t.elapsed() >= settle) {
            self.0.pop_front();
        }
    }

    pub fn count(&self) -> u32 {
        self.0.len() as u32
    }
}

/// Jobs suspended as a whole with signals, one id per line (state directory).
const STOPPING_FILE: &str = "jobs.stopping";

/// Work put off until this is dropped, then spawned on the runtime (dropped outside one,
/// it is left undone). A start holds the refills of what it took (a waiting shepherd, a
/// spare session connection) until its answer is out: on a machine with few CPUs, the
/// forks and handshakes of a refill made at once took them from the very start they were
/// for.
pub struct Deferred(Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>);

impl Deferred {
    pub fn new(work: impl std::future::Future<Output = ()> + Send + 'static) -> Deferred {
        Deferred(Some(Box::pin(work)))
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        if let (Some(work), Ok(rt)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            rt.spawn(work);
        }
    }
}

pub struct Node {
    pub id: NodeId,
    pub cfg: ClusterConfig,
    /// Random, taken at start and again each time the node fences itself (membership.rs).
    incarnation: std::sync::atomic::AtomicU64,
    /// The incarnation of the cland that ran before this one on this node (0: none, or
    /// its processes were fenced since): if the others declared it dead, the processes it
    /// left behind must go (membership.rs).
    pub prev_incarnation: std::sync::atomic::AtomicU64,
    /// Whether this node sees a majority of the cluster (membership.rs).
    pub quorum: std::sync::atomic::AtomicBool,
    /// Set while the node is fencing itself.
    pub fencing: std::sync::atomic::AtomicBool,
    pub started: Instant,
    pub state_dir: PathBuf,
    pub view: ProcView,
    pub cgroup: Option<NodeCgroup>,
    pub shepherd_bin: PathBuf,
    /// Fixed by the cluster file; each peer locks its own state.
    pub peers: HashMap<NodeId, Arc<Peer>>,
    pub vprocs: NamedRwLock<HashMap<Gpid, Arc<VProc>>>,
    pub children: NamedMutex<HashMap<Gpid, ChildRec>>,
    /// Stops and continues of children told before their record (the spawn's reply still
    /// on its way), kept a while for it; locked after `children`.
    pub early_changes: NamedMutex<HashMap<Gpid, (crate::process::wait::Change, Instant)>>,
    /// Jobs this node suspended as a whole with signals: a new process is not started into
    /// one before it is resumed (the freezer's suspension is seen in the task's cgroup).
    pub stopping_jobs: NamedMutex<std::collections::HashSet<u64>>,
    /// Parent processes of this node (host pid) and the children they started elsewhere.
    pub parents: NamedMutex<HashMap<u32, crate::process::wait::ParentRec>>,
    /// At a group's home: its local controlling links (parents in the node's numbers and
    /// their start times), watched so that their exit triggers an orphan check.
    pub link_holders: NamedMutex<HashMap<Gpid, Vec<(u32, u64)>>>,
    /// Direct links this node serves, by the node that opened them and the client's uid
    /// (docs/links.md).
    pub direct_links: NamedMutex<HashMap<(NodeId, u32), usize>>,
    /// Groups whose orphan check could not count the links of a node that may hold some
    /// (away or not answering): checked again once every node answers or is lost.
    pub orphan_deferred: NamedMutex<std::collections::HashSet<Gpid>>,
    /// When the deferred checks last ran again.
    pub orphan_rechecked: NamedMutex<Option<Instant>>,
    pub placement: NamedMutex<Placement>,
    pub load: NamedMutex<LocalLoad>,
    /// The last job number given out, and the end of the block reserved on disk.
    job_seq: NamedMutex<(u64, u64)>,
    /// Owners (uids) of the jobs this node created, kept on disk (`jobs.owners`).
    job_owners: NamedMutex<JobOwners>,
    /// Jobs with a process being started here right now (their cgroup must stay).
    pub spawning: NamedMutex<HashMap<u64, u32>>,
    /// Local groups and sessions standing for cluster ones (process::group).
    pub aliases: NamedRwLock<Aliases>,
    /// At a home node: nodes holding members of its groups and sessions.
    pub members: NamedMutex<Members>,
    /// The process forests of the node's tasks (genealogy.rs).
    pub genealogy: NamedMutex<crate::genealogy::Genealogy>,
    /// The highest process count seen in each task (job.rs).
    pub task_peaks: NamedMutex<HashMap<u64, u32>>,
    /// Open control files of this node's tasks, by job (`job.rs`, `Node::task`).
    pub task_files: NamedMutex<HashMap<u64, Arc<crate::job::TaskFiles>>>,
    /// Per job, the lock its task's operations take one at a time (`job::one_at_a_time`),
    /// there while an operation holds or waits for it.
    pub task_ops: NamedMutex<HashMap<u64, Arc<NamedMutex<()>>>>,
    /// Shepherds started ahead of time, waiting for a spec.
    pub pool: NamedMutex<Vec<crate::process::vproc::Waiting>>,
    /// The socket to this node's shepherd zygote, which forks waiting shepherds (None
    /// until the first is needed, and again after it died).
    pub zygote: NamedMutex<Option<std::os::unix::net::UnixStream>>,
    pub shutdown: watch::Sender<Option<bool>>,
    /// Whether the node's first start of its view server (once it serves its socket) is
    /// over, however it went: a `clan shell` that finds no view before waits for it.
    /// A stat of the node's view is stuck in its FUSE server (`view_mounted`): until it
    /// returns, shells are refused at once rather than each leaving a thread stuck too.
    pub view_probe_stuck: Arc<std::sync::atomic::AtomicBool>,
    pub view_tried: watch::Sender<bool>,
}

impl Node {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: NodeId,
        cfg: ClusterConfig,
        state_dir: PathBuf,
        view: ProcView,
        cgroup: Option<NodeCgroup>,
        shepherd_bin: PathBuf,
        placement: Placement,
    ) -> Node {
        let write_timeout = cfg.dead_after();
        let peers = cfg
            .nodes
            .iter()
            .filter(|n| n.id != id.get())
            .filter_map(|n| {
                Some((
                    NodeId::new(n.id)?,
                    Arc::new(Peer::new(NodeId::new(n.id)?, n.addr, write_timeout)),
                ))
            })
            .collect();
        let job_seq = std::fs::read_to_string(state_dir.join("job.seq"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        let job_owners = JobOwners::load(&state_dir);
        let stopping: std::collections::HashSet<u64> =
            std::fs::read_to_string(state_dir.join(STOPPING_FILE))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect();
        Node {
            id,
            cfg,
            prev_incarnation: std::fs::read_to_string(state_dir.join("incarnation"))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0)
                .into(),
            incarnation: crate::membership::fresh_incarnation().into(),
            quorum: true.into(),
            fencing: false.into(),
            started: Instant::now(),
            state_dir,
            view,
            cgroup,
            shepherd_bin,
            peers,
            vprocs: NamedRwLock::new("vprocs", HashMap::new()),
            children: NamedMutex::new("children", HashMap::new()),
            early_changes: NamedMutex::new("children.early", HashMap::new()),
            stopping_jobs: NamedMutex::new("jobs.stopping", stopping),
            parents: NamedMutex::new("parents", HashMap::new()),
            link_holders: NamedMutex::new("group.links", HashMap::new()),
            direct_links: NamedMutex::new("direct.links", HashMap::new()),
            orphan_deferred: NamedMutex::new("group.orphan_deferred", Default::default()),
            orphan_rechecked: NamedMutex::new("group.orphan_rechecked", None),
            placement: NamedMutex::new("placement", placement),
            load: NamedMutex::new("load", LocalLoad::default()),
            // A restart continues after the whole block the last incarnation reserved.
            job_seq: NamedMutex::new("jobs", (job_seq, job_seq)),
            job_owners: NamedMutex::new("jobs.owners", job_owners),
            spawning: NamedMutex::new("spawning", HashMap::new()),
            pool: NamedMutex::new("shepherd.pool", Vec::new()),
            zygote: NamedMutex::new("shepherd.zygote", None),
            task_peaks: NamedMutex::new("task.peaks", HashMap::new()),
            task_files: NamedMutex::new("task.files", HashMap::new()),
            task_ops: NamedMutex::new("task.ops", HashMap::new()),
            genealogy: NamedMutex::new("genealogy", Default::default()),
            aliases: NamedRwLock::new("group.aliases", Aliases::default()),
            members: NamedMutex::new("group.members", Members::default()),
            shutdown: watch::channel(None).0,
            view_tried: watch::channel(false).0,
            view_probe_stuck: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        }
    }

    /// The incarnation this node runs as now.
    pub fn incarnation(&self) -> u64 {
        self.incarnation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Takes a new incarnation (at start, and after fencing) and records it in the state
    /// directory for the next cland.
    pub fn set_incarnation(&self, inc: u64) {
        self.incarnation
            .store(inc, std::sync::atomic::Ordering::Release);
        let tmp = self.state_dir.join("incarnation.tmp");
        if let Err(e) = std::fs::write(&tmp, inc.to_string())
            .and_then(|_| std::fs::rename(&tmp, self.state_dir.join("incarnation")))
        {
            tracing::warn!("record incarnation: {e}");
        }
    }

    /// A new cluster-wide job id: this node's prefix and a sequence number. Numbers are
    /// reserved on disk a block of `JOB_BLOCK` at a time (one write per block, not per job),
    /// so a restarted cland never hands out a number again.
    /// A new job owned by `uid`, created here.
    pub fn new_job_for(&self, uid: u32) -> Result<JobId> {
        let job = self.new_job()?;
        self.job_owners.lock().record(job.raw(), uid);
        Ok(job)
    }

    /// The owner of a job this node created (`None`: no such job).
    pub fn job_owner(&self, job: u64) -> Option<u32> {
        self.job_owners.lock().owners.get(&job).copied()
    }

    fn new_job(&self) -> Result<JobId> {
        const JOB_BLOCK: u64 = 1000;
        let mut seq = self.job_seq.lock();
        let (last, reserved) = &mut *seq;
        let mut next = *last + 1;
        if next >= clan_core::id::JOB_SPAN {
            next = 1; // wrapped: old jobs are long gone
            *reserved = 0;
        }
        if next > *reserved {
            let end = (next + JOB_BLOCK - 1).min(clan_core::id::JOB_SPAN - 1);
            let tmp = self.state_dir.join("job.seq.tmp");
            std::fs::write(&tmp, end.to_string())
                .and_then(|_| std::fs::rename(&tmp, self.state_dir.join("job.seq")))
                .map_err(|e| Error::internal("persist job sequence", e))?;
            *reserved = end;
        }
        *last = next;
        JobId::new(self.id, next).ok_or_else(|| Error::Internal("job sequence overflow".into()))
    }

    /// Credentials for requests the daemon makes on its own behalf.
    pub fn own_creds(&self) -> pb::Creds {
        pb::Creds {
            uid: 0,
            gid: 0,
            groups: vec![],
            pid: std::process::id(),
            node: self.id.get(),
            ..Default::default()
        }
    }

    pub fn peer(&self, id: NodeId) -> Result<&Arc<Peer>> {
        self.peers
            .get(&id)
            .ok_or_else(|| Error::NotFound(format!("node {id} is not in the cluster")))
    }

    /// Whether `id` names this node or a live peer.
    pub fn node_alive(&self, id: NodeId) -> Result<bool> {
        if id == self.id {
            return Ok(true);
        }
        Ok(!crate::peer::is_down(
            self.peer(id)?.state_name(&self.cfg, self.started),
        ))
    }

    /// This node's entry for `clan nodes` and heartbeats.
    pub fn self_info(&self) -> pb::NodeInfo {
        let l = self.load.lock().clone();
        let addr = self
            .cfg
            .node(self.id)
            .map(|n| n.addr.to_string())
            .unwrap_or_default();
        pb::NodeInfo {
            id: self.id.get(),
            state: if self.quorum.load(std::sync::atomic::Ordering::Relaxed) {
                "up".into()
            } else {
                "no-quorum".into()
            },
            addr,
            load: l.load,
            procs: l.procs,
            mem_used_kb: l.mem_used_kb,
            mem_total_kb: l.mem_total_kb,
            incarnation: self.incarnation(),
            previous: self
                .prev_incarnation
                .load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Every node of the cluster, this one included, in id order.
    pub fn nodes(&self) -> Vec<pb::NodeInfo> {
        let mut v = vec![self.self_info()];
        for p in self.peers.values() {
            v.push(p.info(&self.cfg, self.started));
        }
        v.sort_by_key(|n| n.id);
        v
    }

    /// This node's processes matching `filter`, with clan's own knowledge added.
    pub async fn ps_local(self: &Arc<Self>, filter: pb::PsFilter) -> Vec<pb::ProcInfo> {
        let node = self.clone();
        crate::fanout::blocking(move || {
            let _g = clan_core::lock::giant();
            let mut procs = node.view.list(&filter);
            let vprocs = node.vprocs.read();
            for p in &mut procs {
                p.pgid = node.cluster_id(Kind::Group, p.pgid as u32);
                p.sid = node.cluster_id(Kind::Session, p.sid as u32);
                if let Some(vp) = Gpid::from_raw(p.gpid).and_then(|g| vprocs.get(&g)) {
                    p.managed = true;
                    if p.job == 0 {
                        p.job = vp.job;
                    }
                    // Its kernel parent is its shepherd: the process that ran `clan run`
                    // is its parent in the cluster (as the cluster /proc shows it).
                    if p.ppid == 0 {
                        p.ppid = vp.cluster_parent();
                    }
                }
                // No parent in the cluster (a node's init, a process started from
                // outside): the cluster's init, as the cluster /proc shows it.
                if p.ppid == 0 {
                    p.ppid = clan_core::CLUSTER_INIT;
                }
            }
            procs
        })
        .await
        .unwrap_or_default()
    }

    /// Removes the cgroups of jobs that have nothing left on this node.
    pub fn prune_jobs(&self) {
        let Some(cg) = &self.cgroup else { return };
        // `spawning` stays locked through the removal: a spawn registers its job there
        // before it creates the job's cgroup, so no cgroup is removed under a new process.
        let spawning = self.spawning.lock();
        let mut busy: std::collections::HashSet<u64> = spawning.keys().copied().collect();
        busy.extend(self.vprocs.read().values().map(|v| v.job));
        let removed = cg.prune_jobs(&busy);
        drop(spawning);
        // The descriptors of removed tasks would only keep their cgroups' memory.
        let mut files = self.task_files.lock();
        for j in &removed {
            files.remove(j);
        }
        drop(files);
        // A task gone is suspended no longer.
        for j in removed {
            self.mark_stopping(j, false);
        }
    }

    /// Records that job `job` is (or no longer is) suspended as a whole with signals on
    /// this node, in memory and in `jobs.stopping` of the state directory, so that a
    /// restarted cland still refuses runs into it.
    pub fn mark_stopping(&self, job: u64, on: bool) {
        let mut set = self.stopping_jobs.lock();
        let changed = if on {
            set.insert(job)
        } else {
            set.remove(&job)
        };
        if changed {
            let text: String = set.iter().map(|j| format!("{j}\n")).collect();
            let tmp = self.state_dir.join(format!("{STOPPING_FILE}.tmp"));
            if std::fs::write(&tmp, text)
                .and_then(|_| std::fs::rename(&tmp, self.state_dir.join(STOPPING_FILE)))
                .is_err()
            {
                tracing::warn!(
                    job,
                    "could not record the job's suspension in the state directory"
                );
            }
        }
    }

    /// Refreshes this node's load figures from its /proc (runs on a blocking thread): a
    /// node of a local cluster, which shares the machine, from its own processes (`scan`:
    /// runnable ones but clan's shepherds, all, their resident memory), any other from
    /// the kernel's `loadavg`.
    pub fn sample_load(&self, alpha: f64, scan: &TickScan) {
        let (running, total, rss) = if self.view.ns_init != 0 {
            let procs = scan.get();
            (
                procs
                    .iter()
                    .filter(|p| p.state == 'R' && !p.shepherd)
                    .count() as u32,
                procs.len() as u32,
                procs.iter().map(|p| p.rss_kb).sum(),
            )
        } else {
            let la = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
            let run = la
                .split_whitespace()
                .nth(3)
                .and_then(|f| f.split('/').next()?.parse().ok())
                .unwrap_or(0);
            (run, self.view.pids().len() as u32, 0)
        };
        let (total_kb, avail_kb) = meminfo();
        let mut l = self.load.lock();
        // Runnable processes other than the sampler itself, smoothed like loadavg.
        let now = f64::from(running.saturating_sub(u32::from(self.view.ns_init == 0)));
        l.load = l.load * (1.0 - alpha) + now * alpha;
        // Placements the sample surely saw no longer count apart (a later one may not be
        // running yet).
        l.placed.sampled(SPAWN_ALLOWANCE);
        l.procs = total;
        l.mem_total_kb = total_kb;
        l.mem_used_kb = if self.view.ns_init != 0 {
            rss
        } else {
            total_kb.saturating_sub(avail_kb)
        };
    }
}

fn meminfo() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let get = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (get("MemTotal:"), get("MemAvailable:"))
}

/// The owners of the jobs a node created: who may add processes to them (`clan run --job`).
/// An append-only file of `JOB UID` lines, rewritten with the newest half when it grows big.
pub struct JobOwners {
    owners: HashMap<u64, u32>,
    path: PathBuf,
    lines: usize,
    /// The file, open for appending (each new job adds a line: one write, no open).
    file: Option<std::fs::File>,
}

impl JobOwners {
    /// Rewrite the file once it holds this many lines.
    const COMPACT_AT: usize = 200_000;

    fn load(state_dir: &std::path::Path) -> JobOwners {
        let path = state_dir.join("jobs.owners");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let mut owners = HashMap::new();
        let mut lines = 0;
        for l in text.lines() {
            let mut w = l.split_whitespace();
            if let (Some(Ok(j)), Some(Ok(u))) = (w.next().map(str::parse), w.next().map(str::parse))
            {
                owners.insert(j, u);
                lines += 1;
            }
        }
        JobOwners {
            owners,
            path,
            lines,
            file: None,
        }
    }

    fn record(&mut self, job: u64, uid: u32) {
        use std::io::Write;
        self.owners.insert(job, uid);
        self.lines += 1;
        if self.lines >= Self::COMPACT_AT {
            let mut jobs: Vec<(u64, u32)> = self.owners.iter().map(|(j, u)| (*j, *u)).collect();
            jobs.sort_unstable();
            let keep = jobs.split_off(jobs.len() / 2);
            self.owners = keep.iter().copied().collect();
            self.lines = keep.len();
            let text: String = keep.iter().map(|(j, u)| format!("{j} {u}\n")).collect();
            let tmp = self.path.with_extension("tmp");
            self.file = None; // the rewritten file is another one
            if std::fs::write(&tmp, text)
                .and_then(|_| std::fs::rename(&tmp, &self.path))
                .is_err()
            {
                tracing::warn!(path = %self.path.display(), "could not rewrite the job owners");
            }
            return;
        }
        if self.file.is_none() {
            self.file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)
                .map_err(|e| {
                    tracing::warn!(path = %self.path.display(), error = %e, "could not open the job owners");
                })
                .ok();
        }
        let Some(f) = self.file.as_mut() else { return };
        // One write of the whole line (O_APPEND): never half a line, even next to a crash.
        let res = f.write_all(format!("{job} {uid}\n").as_bytes());
        if let Err(e) = res {
            self.file = None;
            tracing::warn!(path = %self.path.display(), error = %e, "could not record a job owner");
        }
    }
}

/// A node 1 of a two-node cluster whose node 2 never answers, with no peer links.
#[cfg(test)]
pub(crate) fn lone_node(dir: &std::path::Path) -> Arc<Node> {
    std::fs::write(dir.join("key"), "0123456789abcdef0123").unwrap();
    std::fs::write(
        dir.join("cluster.toml"),
        "name = \"t\"\nkey_file = \"key\"\n\
         [[node]]\nid = 1\naddr = \"127.0.0.1:1\"\n\
         [[node]]\nid = 2\naddr = \"127.0.0.1:2\"\n",
    )
    .unwrap();
    let cfg = clan_core::config::ClusterConfig::load(&dir.join("cluster.toml")).unwrap();
    let id = NodeId::new(1).unwrap();
    let view =
        crate::process::view::ProcView::open(id, "/proc".into(), 0, dir.join("clan-shepherd"))
            .unwrap();
    let placement = crate::placement::Placement::load(dir.join("loadmgr.json"));
    Arc::new(Node::new(
        id,
        cfg,
        dir.to_path_buf(),
        view,
        None,
        dir.join("clan-shepherd"),
        placement,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_count_until_a_sample_surely_has_them() {
        let mut p = Placed::default();
        p.note();
        p.note();
        // A sample soon after: they may not be running yet.
        p.sampled(std::time::Duration::from_secs(60));
        assert_eq!(p.count(), 2);
        // One taken long enough after them has them.
        p.sampled(std::time::Duration::ZERO);
        assert_eq!(p.count(), 0);
    }
}
