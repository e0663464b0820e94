//! Virtual process objects (Solaris MC's vproc) for the processes clan started on this node,
//! each linked to its shepherd. The shepherd is the truth: a restarted cland rebuilds this
//! table from the shepherds' sockets (`recover`).

use crate::error::{Error, Result};
use crate::node::{Deferred, Node};
use crate::process::wait::Change;
use clan_core::{Gpid, NamedMutex, NodeId, WaitStatus};
use clan_proto::pb::{self, shepherd_in::Msg as In, shepherd_out::Msg as Out};
use clan_proto::{read_frame, write_frame};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

/// Writes one message to a shepherd (`what` names it in the error).
async fn tell<W: AsyncWrite + Unpin>(w: &mut W, msg: In, what: &str) -> Result<()> {
    write_frame(w, &pb::ShepherdIn { msg: Some(msg) })
        .await
        .map_err(|e| Error::internal(what, e))
}

/// A process started by clan on this node.
pub struct VProc {
    pub gpid: Gpid,
    pub host_pid: u32,
    /// Its shepherd's pid in the node's numbers: the process's kernel parent while the
    /// shepherd lives (the cluster /proc shows `parent` instead).
    pub shepherd_pid: u32,
    pub uid: u32,
    pub job: u64,
    pub parent_node: NodeId,
    /// Gpid of its parent in the cluster (0: none).
    pub parent: u64,
    /// Its stub (attached processes): host pid on `parent_node` and start time.
    pub stub: Option<(u32, u64)>,
    pub detached: bool,
    pub argv0: String,
    tx: mpsc::UnboundedSender<pb::ShepherdIn>,
    /// `Some` once the process has exited.
    pub status: watch::Sender<Option<WaitStatus>>,
    /// `true` once the shepherd is gone and the record removed (the kernel pid reaped).
    pub gone: watch::Sender<bool>,
    /// The node of its parent died: nobody will wait for it, its zombie is released at once.
    pub parent_gone: std::sync::atomic::AtomicBool,
    /// Where output and the exit status of an attached process go.
    subscriber: NamedMutex<Option<mpsc::Sender<pb::SessionOutput>>>,
    /// Counts the sessions that subscribed: a session that ends parks or hangs up the
    /// process only if no newer one took it over (a reattach). Changed with `subscriber`
    /// locked.
    sessions: std::sync::atomic::AtomicU64,
    /// Hung up: no stub can reattach any more.
    hung_up: std::sync::atomic::AtomicBool,
    /// Its status changes on their way to its parent's node, sent in order by one task
    /// (`Node::start_pushes`; detached processes started from another node). Taken when
    /// the link to its shepherd ends, which ends that task once it has sent the rest.
    pub pushes: NamedMutex<Option<mpsc::UnboundedSender<pb::ChildStatus>>>,
    /// Its parent's node released its zombie: it has the exit, nothing more is pushed.
    pub released: std::sync::atomic::AtomicBool,
    /// Its parent in the cluster exited (its node said so): the cluster's init is its
    /// parent now, in the cluster /proc and `clan ps`, as the kernel reparents an orphan.
    pub parent_exited: std::sync::atomic::AtomicBool,
}

impl VProc {
    /// Gpid of its parent in the cluster as it is now: 0 (none, the cluster's init) once
    /// that parent exited or its node was lost.
    pub fn cluster_parent(&self) -> u64 {
        use std::sync::atomic::Ordering::Acquire;
        if self.parent_exited.load(Acquire) || self.parent_gone.load(Acquire) {
            0
        } else {
            self.parent
        }
    }

    pub fn send(&self, msg: In) {
        let _ = self.tx.send(pb::ShepherdIn { msg: Some(msg) });
    }

    /// Sends `msg`, which came on session `session` of its stub, unless a newer session
    /// has the process (false then). Checked with the subscriber lock held, under which a
    /// reattach sends its `Resume`, so what a session relays reaches the shepherd before
    /// the next session's `Resume` or not at all. An old session's connection may still
    /// hold input when the new one takes over (a reattach from the stub's node does not
    /// wait for the old end to be noticed, and the old relay may lag behind it on a busy
    /// node): the stub sends that input again from the shepherd's counts in `Resumed`, so
    /// relayed after the `Resume` it would reach the process twice.
    pub fn send_from(&self, session: u64, msg: In) -> bool {
        let _sub = self.subscriber.lock();
        if self.sessions.load(SeqCst) != session {
            return false;
        }
        self.send(msg);
        true
    }

    /// The session to its stub is gone for good: SIGHUP, as a terminal or ssh connection that
    /// drops sends it, then orphan (pipes closed, reaped by the shepherd when it exits).
    pub fn hang_up(&self) {
        self.hang_up_unless_newer(None);
    }

    /// [`VProc::hang_up`] unless a session newer than `session` has the process (or it
    /// is hung up already); whether it was.
    pub fn hang_up_if(&self, session: u64) -> bool {
        self.hang_up_unless_newer(Some(session))
    }

    fn hang_up_unless_newer(&self, session: Option<u64>) -> bool {
        {
            let mut sub = self.subscriber.lock();
            if session.is_some_and(|s| self.sessions.load(SeqCst) != s || self.hung_up.load(SeqCst))
            {
                return false;
            }
            *sub = None;
            self.hung_up.store(true, SeqCst);
        }
        if self.exited().is_none() {
            self.send(In::Signal(libc::SIGHUP));
        }
        self.send(In::Orphan(true));
        true
    }

    /// A stub's new session takes the output of the parked process from now on; returns
    /// its number, or why not (hung up, or a session still has it: not parked yet)
    /// and has its shepherd resend from `from` (sent with the lock held, so that it can not
    /// pass the `Hold` of a park).
    pub fn reattach(
        &self,
        out: mpsc::Sender<pb::SessionOutput>,
        from: pb::ResumeFrom,
        take_over: bool,
    ) -> std::result::Result<u64, Refused> {
        let mut sub = self.subscriber.lock();
        if self.hung_up.load(SeqCst) {
            return Err(Refused::HungUp);
        }
        if sub.is_some() && !take_over {
            return Err(Refused::Attached);
        }
        *sub = Some(out);
        self.send(In::Resume(from));
        Ok(self.sessions.fetch_add(1, SeqCst) + 1)
    }

    /// The number of the latest session to subscribe (0: the one it started with).
    pub fn session(&self) -> u64 {
        self.sessions.load(SeqCst)
    }

    /// Session `session` is over: its output goes nowhere. False if a newer one has it.
    pub fn unsubscribe(&self, session: u64) -> bool {
        self.unsubscribe_then(session, || {})
    }

    /// Session `session` broke: its output goes nowhere and the shepherd holds it (told
    /// with the lock held, so that a reattach's `Resume` comes after). False if a newer
    /// session has it.
    pub fn hold(&self, session: u64) -> bool {
        self.unsubscribe_then(session, || self.send(In::Hold(true)))
    }

    fn unsubscribe_then(&self, session: u64, then: impl FnOnce()) -> bool {
        let mut sub = self.subscriber.lock();
        if self.sessions.load(SeqCst) != session {
            return false;
        }
        *sub = None;
        then();
        true
    }

    pub fn exited(&self) -> Option<WaitStatus> {
        *self.status.borrow()
    }

    async fn deliver(&self, out: pb::session_output::Output) {
        let sub = self.subscriber.lock().clone();
        if let Some(s) = sub {
            let _ = s
                .send(pb::SessionOutput {
                    gpid: self.gpid.raw(),
                    output: Some(out),
                })
                .await;
        }
    }
}

/// Why a stub may not reattach to a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Hung up: too late.
    HungUp,
    /// A session still has it (its end not noticed yet, or another stub's).
    Attached,
}

/// A shepherd waiting for its spec: its stdin and its report pipe.
pub type Waiting = (pipe::Sender, pipe::Receiver);

/// Shepherds kept waiting per node.
const POOL: usize = 2;

/// How long a waiting shepherd may take to say it is there (`answered`).
const SHEPHERD_ANSWER: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a restarting cland waits for the shepherds of its processes to answer before
/// it serves (those that answer later are linked then): less than the peers' failure
/// detector, which would have the node fenced.
const RECOVERY_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// How long the node's cluster /proc view may take to answer a `clan shell`'s start (a
/// stat of its root: milliseconds from a server that serves).
const VIEW_ANSWER: std::time::Duration = std::time::Duration::from_secs(5);

/// `w` once its shepherd has said it waits (`SHEPHERD_WAITING` on the report pipe, written
/// as soon as it is settled: at once for a shepherd that waited in the pool), or why not.
async fn answered(mut w: Waiting) -> std::result::Result<Waiting, String> {
    use tokio::io::AsyncReadExt;
    let mut b = [0u8; 1];
    match tokio::time::timeout(SHEPHERD_ANSWER, w.1.read(&mut b)).await {
        Ok(Ok(1)) if b[0] == clan_proto::SHEPHERD_WAITING => Ok(w),
        Ok(Ok(1)) => Err("failed to settle".into()),
        Ok(Ok(_)) => Err("exited".into()),
        Ok(Err(e)) => Err(format!("could not be read: {e}")),
        Err(_) => Err(format!("did not answer in {} s", SHEPHERD_ANSWER.as_secs())),
    }
}

/// Signals for a process that is starting, from its stub (a Ctrl-C while its exec hangs
/// on a mount that does not answer, or is only slow): queued until the start takes them
/// (the shepherd gives them to its child before the exec has taken, as the kernel would
/// to a local process in its exec), and once the process has started, sent to it as any
/// later signal. One per start; its lock is the only order between the two.
pub struct PendingSignals {
    state: NamedMutex<Pending>,
    more: tokio::sync::Notify,
}

enum Pending {
    Starting(Vec<i32>),
    Started(Arc<VProc>, u64),
}

impl PendingSignals {
    pub fn new() -> Arc<PendingSignals> {
        Arc::new(PendingSignals {
            state: NamedMutex::new("vproc.pending_signals", Pending::Starting(Vec::new())),
            more: tokio::sync::Notify::new(),
        })
    }

    /// A signal for the process: queued while it starts, sent to it once started.
    pub fn signal(&self, sig: i32) {
        match &mut *self.state.lock() {
            Pending::Starting(q) => {
                q.push(sig);
                self.more.notify_one();
            }
            Pending::Started(vp, session) => {
                vp.send_from(*session, In::StartSignal(sig));
            }
        }
    }

    /// The signals queued since the last take (empty once started).
    pub fn take(&self) -> Vec<i32> {
        match &mut *self.state.lock() {
            Pending::Starting(q) => std::mem::take(q),
            Pending::Started(..) => Vec::new(),
        }
    }

    /// What a start's wait for its answer (the shepherd's report, the remote node's reply)
    /// gives next: the answer, or the signals queued meanwhile (when there is a
    /// `pending`), which the caller passes on before it waits again. `done` stays with the
    /// caller, polled again by the next call, never dropped halfway (a frame read is not
    /// cancel safe).
    pub async fn answer_or_signals<F: std::future::Future + Unpin>(
        pending: Option<&PendingSignals>,
        done: &mut F,
    ) -> std::result::Result<F::Output, Vec<i32>> {
        let signals = async {
            match pending {
                Some(p) => p.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            r = done => Ok(r),
            sigs = signals => Err(sigs),
        }
    }

    /// Waits for queued signals and takes them; never returns once the process started.
    /// Cancel safe: what it takes, it returns in the same poll.
    async fn next(&self) -> Vec<i32> {
        loop {
            let q = self.take();
            if !q.is_empty() {
                return q;
            }
            self.more.notified().await;
        }
    }

    /// The process started (its session `session` is the stub's): what is queued, and
    /// every signal after, goes to it.
    pub fn started(&self, vp: &Arc<VProc>, session: u64) {
        let mut st = self.state.lock();
        if let Pending::Starting(q) = &mut *st {
            for sig in std::mem::take(q) {
                vp.send_from(session, In::StartSignal(sig));
            }
        }
        *st = Pending::Started(vp.clone(), session);
    }

    /// The process the signals are for, once started.
    pub fn process(&self) -> Option<(Arc<VProc>, u64)> {
        match &*self.state.lock() {
            Pending::Started(vp, session) => Some((vp.clone(), *session)),
            Pending::Starting(_) => None,
        }
    }
}

/// What to start: the request as the daemon sees it.
pub struct SpawnLocal {
    pub spec: pb::ProcSpec,
    pub creds: pb::Creds,
    pub job: u64,
    pub rank: u32,
    pub size: u32,
    pub parent_node: NodeId,
    /// Gpid of its parent in the cluster (0: none), the ppid the cluster /proc shows.
    pub parent: u64,
    /// Signals from its stub while it starts (attached runs).
    pub pending: Option<Arc<PendingSignals>>,
}

/// What cland knows of a shepherd once linked to it.
struct Linked {
    spec: pb::ShepherdSpec,
    host_pid: u32,
    ns_pid: u32,
    gpid: Gpid,
    shepherd_pid: u32,
    exited: Option<WaitStatus>,
}

impl Node {
    /// The process `gpid` that clan started on this node.
    pub fn vproc(&self, gpid: Gpid) -> Result<Arc<VProc>> {
        self.vprocs
            .read()
            .get(&gpid)
            .cloned()
            .ok_or(Error::NoSuchProcess(gpid))
    }

    /// Starts a detached process on this node under a new shepherd.
    pub async fn spawn_local(self: &Arc<Self>, req: SpawnLocal) -> Result<Arc<VProc>> {
        self.spawn_local_to(req, None).await
    }

    /// Starts a process on this node under a new shepherd; an attached one (its spec not
    /// detached) sends its output and exit status to `out` from its start.
    pub async fn spawn_local_to(
        self: &Arc<Self>,
        req: SpawnLocal,
        out: Option<mpsc::Sender<pb::SessionOutput>>,
    ) -> Result<Arc<VProc>> {
        if !req.spec.detached && out.is_none() {
            return Err(Error::Invalid(
                "attached processes start on a session".into(),
            ));
        }
        let job = req.job;
        *self.spawning.lock().entry(job).or_insert(0) += 1;
        let res = self.spawn_local_inner(req, out).await;
        let mut sp = self.spawning.lock();
        if let Some(n) = sp.get_mut(&job) {
            *n -= 1;
            if *n == 0 {
                sp.remove(&job);
            }
        }
        res
    }

    /// Where a `clan shell` of this node finds the cluster view, the node's procfs and the
    /// shim; refused when the node's view server is not mounted, or does not answer.
    async fn cluster_proc_spec(&self) -> Result<pb::ClusterProc> {
        let view = self.cfg.proc_view(self.id);
        // As the node's mount namespace sees it.
        let seen = |p: &std::path::Path| {
            if self.view.ns_init == 0 {
                p.to_path_buf()
            } else {
                PathBuf::from(format!("/proc/{}/root{}", self.view.ns_init, p.display()))
            }
        };
        let (at, parent) = (seen(&view), seen(view.parent().unwrap_or(&self.state_dir)));
        let mut mounted = self.view_mounted(&at, &parent).await?;
        if !mounted {
            // At the node's start its view server starts once cland serves its socket (it
            // asks cland there), after the node answers its peers: a shell started then
            // (as right after `clan up`, which waits for the nodes, not their views) waits
            // for that start.
            let mut tried = self.view_tried.subscribe();
            if !*tried.borrow_and_update() {
                let wait = crate::viewserver::READY + VIEW_ANSWER;
                let _ = tokio::time::timeout(wait, tried.wait_for(|t| *t)).await;
                mounted = self.view_mounted(&at, &parent).await?;
            }
        }
        if !mounted {
            return Err(Error::Invalid(format!(
                "node {} serves no cluster /proc view (no FUSE, or its view server is not \
                 running: see `{}`)",
                self.id,
                view.display()
            )));
        }
        let bin = self
            .shepherd_bin
            .parent()
            .map(PathBuf::from)
            .unwrap_or_default();
        Ok(pb::ClusterProc {
            view: view.display().to_string(),
            node_proc: self.state_dir.join("nodeproc").display().to_string(),
            shim: self
                .state_dir
                .join(clan_shim::FILE_NAME)
                .display()
                .to_string(),
            clan_bin: bin.join("clan").display().to_string(),
        })
    }

    /// Whether a file system other than its parent's (`parent`) is mounted at `at`, the
    /// view as the node's mount namespace sees it; an error when it does not answer.
    async fn view_mounted(&self, at: &Path, parent: &Path) -> Result<bool> {
        use std::os::unix::fs::MetadataExt;
        // A stat of the view is a request to its FUSE server, which may not answer for a
        // while (at the node's start it mounts, then asks this cland whether it is there,
        // and serves only after the answer) or ever (stopped). Never on a runtime thread:
        // a worker blocked there stops the runtime's I/O and timers with it (the other
        // worker sleeps until woken for a task, and nothing wakes it), heartbeats included:
        // the peers declare the node dead, and the server's question goes unanswered.
        use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
        let stuck = || {
            Error::Invalid(format!(
                "node {}'s cluster /proc view at {} did not answer within {VIEW_ANSWER:?} \
                 (its view server is stuck)",
                self.id,
                self.cfg.proc_view(self.id).display()
            ))
        };
        // One stuck probe at a time: it stays stuck until the server answers or dies.
        if self.view_probe_stuck.load(SeqCst) {
            return Err(stuck());
        }
        let (at, parent) = (at.to_path_buf(), parent.to_path_buf());
        let (flag, done) = (
            self.view_probe_stuck.clone(),
            Arc::new(AtomicBool::new(false)),
        );
        let over = done.clone();
        let probe = tokio::task::spawn_blocking(move || {
            let m = match (std::fs::metadata(at), std::fs::metadata(parent)) {
                (Ok(v), Ok(parent)) => v.dev() != parent.dev(),
                _ => false,
            };
            // Done, then not stuck: a timeout that missed the first sees the second.
            over.store(true, SeqCst);
            flag.store(false, SeqCst);
            m
        });
        match tokio::time::timeout(VIEW_ANSWER, probe).await {
            Ok(m) => Ok(m.unwrap_or(false)),
            Err(_) => {
                self.view_probe_stuck.store(true, SeqCst);
                if done.load(SeqCst) {
                    self.view_probe_stuck.store(false, SeqCst);
                }
                Err(stuck())
            }
        }
    }

    async fn spawn_local_inner(
        self: &Arc<Self>,
        req: SpawnLocal,
        out: Option<mpsc::Sender<pb::SessionOutput>>,
    ) -> Result<Arc<VProc>> {
        if req.spec.argv.is_empty() {
            return Err(Error::Invalid("empty command".into()));
        }
        // A process started into a suspended task would be born frozen (or run while the
        // rest is stopped): its start could not finish before a resume.
        let frozen = self.cgroup.as_ref().is_some_and(|cg| {
            std::fs::read_to_string(cg.job_dir(req.job).join("cgroup.freeze"))
                .is_ok_and(|f| f.trim() == "1")
        });
        if frozen || self.stopping_jobs.lock().contains(&req.job) {
            return Err(Error::Invalid(format!(
                "job {} is suspended on node {}: resume it first (clan job resume {})",
                req.job, self.id, req.job
            )));
        }
        // The task's cgroups are made once the shepherd has its spec (below), while it sets
        // up; here only their names.
        let (cgroup, v1_cgroups) = match &self.cgroup {
            Some(cg) => (
                cg.job_dir(req.job).display().to_string(),
                cg.v1_job_dirs(req.job)
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect(),
            ),
            None if req.spec.max_procs > 0 => {
                return Err(Error::Invalid(format!(
                    "node {} can not limit job {}'s processes: it has no cgroups",
                    self.id, req.job
                )))
            }
            None => (String::new(), Vec::new()),
        };
        let spec = pb::ShepherdSpec {
            spec: Some(req.spec.clone()),
            creds: Some(req.creds.clone()),
            node: self.id.get(),
            job: req.job,
            rank: req.rank,
            size: req.size,
            parent_node: req.parent_node.get(),
            state_dir: self.state_dir.display().to_string(),
            cgroup,
            ns_init_pid: self.view.ns_init,
            cluster_dir: self.cfg.dir.display().to_string(),
            shepherd_cgroup: self
                .cgroup
                .as_ref()
                .map(|c| c.sub("shepherds").display().to_string())
                .unwrap_or_default(),
            hostname: String::new(),
            v1_cgroups,
            parent: req.parent,
            cluster_proc: if req.spec.cluster_proc {
                Some(self.cluster_proc_spec().await?)
            } else {
                None
            },
            log_max_bytes: self.cfg.log_max_bytes,
        };
        // The pool is refilled once this spawn is over (its report read, or failed), not
        // now: on a 2-CPU machine the zygote's forks for the pool preempted the shepherd,
        // then its child before the exec, of the very start they were for.
        let node = self.clone();
        // After the answer: the task spawned as this returns would run first on this
        // worker (tokio's LIFO slot) and delay the answer by its forks' set-up.
        let _refill = Deferred::new(async move {
            tokio::task::yield_now().await;
            node.refill_pool().await;
            if let Some(cg) = &node.cgroup {
                cg.make_spares(false);
            }
        });
        let (mut stdin, mut stdout) = self.take_shepherd().await?;
        if write_frame(&mut stdin, &spec).await.is_err() {
            // A waiting shepherd was killed from outside: start a fresh one.
            (stdin, stdout) = self.take_shepherd().await?;
            write_frame(&mut stdin, &spec)
                .await
                .map_err(|e| Error::internal("send spec to shepherd", e))?;
        }
        // The shepherd forks the process once told that its cgroups exist; if they can not
        // be made, it reads the end of its stdin and exits.
        if let Some(cg) = &self.cgroup {
            let dir = cg
                .job(req.job)
                .map_err(|e| Error::internal("create task cgroup", e))?;
            debug_assert_eq!(dir.display().to_string(), spec.cgroup);
            if req.spec.max_procs > 0 {
                // Only root raises a limit a task has: a process of the job could lift it.
                let now = cg.max_procs(req.job);
                if req.creds.uid != 0 && now.is_some_and(|n| req.spec.max_procs > n) {
                    return Err(Error::Permission(format!(
                        "permission denied: only root raises job {}'s process limit ({} on node {})",
                        req.job,
                        now.unwrap_or(0),
                        self.id
                    )));
                }
                cg.set_max_procs(req.job, req.spec.max_procs).map_err(|e| {
                    Error::Invalid(format!(
                        "node {} can not limit job {}'s processes: {e}",
                        self.id, req.job
                    ))
                })?;
            }
        }
        tell(&mut stdin, In::Start(true), "start the shepherd").await?;
        // The pipes stay the link to the shepherd: no socket to connect and no hello to
        // wait for (its socket is for a restarted cland). Until it reports, the stub's
        // signals go to it as they come (an exec may hang: a Ctrl-C must reach it).
        let mut stdout = BufReader::new(stdout);
        let ready = {
            let report = read_frame::<pb::ShepherdReady, _>(&mut stdout);
            tokio::pin!(report);
            loop {
                match PendingSignals::answer_or_signals(req.pending.as_deref(), &mut report).await {
                    Ok(r) => break r,
                    // A shepherd gone meanwhile is told by its report (its error first).
                    Err(sigs) => {
                        for sig in sigs {
                            let _ =
                                tell(&mut stdin, In::StartSignal(sig), "signal the start").await;
                        }
                    }
                }
            }
        };
        let ready = ready.map_err(|e| Error::internal("read shepherd report", e))?;
        let ready =
            ready.ok_or_else(|| Error::Internal("shepherd exited without a report".into()))?;
        if let Some(e) = ready.error {
            return Err(e.into());
        }
        let gpid = Gpid::from_raw(ready.gpid)
            .ok_or_else(|| Error::Internal(format!("shepherd reported gpid {}", ready.gpid)))?;
        let vp = self.link(
            stdout,
            stdin,
            Linked {
                spec,
                host_pid: ready.host_pid,
                ns_pid: ready.ns_pid,
                gpid,
                shepherd_pid: ready.shepherd_pid,
                exited: None,
            },
            out,
        );
        let homes = self.alias_insert(gpid.local(), ready.shepherd_pid, &req.creds);
        self.tell_homes(homes).await;
        // Not at info: a line per process is a log as busy as the node (CLAN_LOG=debug).
        debug!(gpid = %gpid, job = req.job, cmd = %vp.argv0, "started");
        Ok(vp)
    }

    /// A new shepherd waiting for its spec: forked by the node's zygote, or, when no zygote
    /// can be had, started on its own.
    async fn fresh_shepherd(&self) -> Result<Waiting> {
        match self.zygote_shepherd() {
            Ok(w) => Ok(w),
            Err(e) => {
                debug!("no shepherd from the zygote ({e}): starting one");
                self.exec_shepherd().await
            }
        }
    }

    /// Starts `clan-shepherd SUBCOMMAND` with this node's namespace and cgroup arguments and
    /// the given stdin and stdout; it forks and exits at once (reaped here in the
    /// background). Returns its piped ends, if asked for.
    fn start_shepherd_process(
        &self,
        sub: &str,
        stdin: Stdio,
        stdout: Stdio,
    ) -> Result<(
        Option<tokio::process::ChildStdin>,
        Option<tokio::process::ChildStdout>,
    )> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.state_dir.join("shepherd.log"))
            .map_err(|e| Error::internal("open shepherd.log", e))?;
        let mut cmd = tokio::process::Command::new(&self.shepherd_bin);
        // The processes clan starts get the open-file limit cland started with.
        clan_core::sys::first_open_files_for(cmd.as_std_mut());
        cmd.arg(sub);
        if self.view.ns_init != 0 {
            cmd.arg("--ns-init").arg(self.view.ns_init.to_string());
        }
        if let Some(cg) = &self.cgroup {
            cmd.arg("--cgroup").arg(cg.sub("shepherds"));
        }
        // Where a waiting shepherd makes its socket ahead of its spec (`sh/p<pid>.pre`).
        cmd.arg("--state").arg(&self.state_dir);
        let mut child = cmd
            .stdin(stdin)
            .stdout(stdout)
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| {
                Error::internal(
                    &format!(
                        "start clan-shepherd {sub} ({})",
                        self.shepherd_bin.display()
                    ),
                    e,
                )
            })?;
        let ends = (child.stdin.take(), child.stdout.take());
        tokio::spawn(async move {
            let _ = child.wait().await;
        });
        Ok(ends)
    }

    /// Starts a shepherd that waits for its spec (`clan-shepherd run` forks at once, the
    /// child born in the shepherds' cgroup; the parent is reaped here).
    async fn exec_shepherd(&self) -> Result<Waiting> {
        let (stdin, stdout) = self.start_shepherd_process("run", Stdio::piped(), Stdio::piped())?;
        (|| {
            let stdin = stdin.expect("piped").into_owned_fd()?;
            let stdout = stdout.expect("piped").into_owned_fd()?;
            Ok::<_, std::io::Error>((
                pipe::Sender::from_owned_fd(stdin)?,
                pipe::Receiver::from_owned_fd(stdout)?,
            ))
        })()
        .map_err(|e| Error::internal("shepherd pipes", e))
    }

    /// A shepherd forked by the node's zygote (started here the first time, and again
    /// after it died): two pipes made here, their shepherd ends sent to the zygote.
    fn zygote_shepherd(&self) -> Result<Waiting> {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
        let internal = |what: &str, e: std::io::Error| Error::internal(what, e);
        let (spec_rd, spec_wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| internal("pipe", e.into()))?;
        let (report_rd, report_wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| internal("pipe", e.into()))?;
        let fds = [spec_rd.as_raw_fd(), report_wr.as_raw_fd()];
        let mut zygote = self.zygote.lock();
        for fresh in [false, true] {
            if fresh || zygote.is_none() {
                *zygote = Some(self.start_zygote()?);
            }
            let sock = zygote.as_ref().expect("just set");
            let sent = sendmsg::<()>(
                sock.as_raw_fd(),
                &[std::io::IoSlice::new(b"s")],
                &[ControlMessage::ScmRights(&fds)],
                MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
                None,
            );
            match sent {
                Ok(_) => {
                    drop(zygote);
                    drop((spec_rd, report_wr));
                    let sender = pipe::Sender::from_owned_fd(spec_wr)
                        .map_err(|e| internal("shepherd pipe", e))?;
                    let receiver = pipe::Receiver::from_owned_fd(report_rd)
                        .map_err(|e| internal("shepherd pipe", e))?;
                    return Ok((sender, receiver));
                }
                // Dead (or stuck with a full socket): a new one, once.
                Err(e) if !fresh => debug!("shepherd zygote: {e}; starting another"),
                Err(e) => return Err(internal("send to the shepherd zygote", e.into())),
            }
        }
        unreachable!("the loop returns on its second turn")
    }

    /// Starts `clan-shepherd zygote` on one end of a new socket pair; returns the other.
    fn start_zygote(&self) -> Result<std::os::unix::net::UnixStream> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()
            .map_err(|e| Error::internal("zygote socket", e))?;
        self.start_shepherd_process("zygote", Stdio::from(OwnedFd::from(theirs)), Stdio::null())?;
        Ok(ours)
    }

    /// A waiting shepherd that has said it is there: from the pool (refilled after the
    /// spawn, see `spawn`), or a fresh one. One that does not answer within
    /// `SHEPHERD_ANSWER` (its zygote was stopped or is stuck) is given up with the rest of
    /// the pool and the zygote, and a shepherd is started on its own instead; nothing has
    /// been sent to it, so nothing can start twice if it wakes up later.
    async fn take_shepherd(self: &Arc<Self>) -> Result<Waiting> {
        let pooled = self.pool.lock().pop();
        let first = match pooled {
            Some(w) => Ok(w),
            None => self.fresh_shepherd().await,
        };
        match first {
            Ok(w) => match answered(w).await {
                Ok(w) => return Ok(w),
                Err(why) => {
                    warn!("a waiting shepherd {why}: replacing the zygote and the pool");
                    self.pool.lock().clear();
                    *self.zygote.lock() = None;
                }
            },
            Err(e) => warn!("no waiting shepherd: {e}"),
        }
        let w = self.exec_shepherd().await?;
        answered(w)
            .await
            .map_err(|why| Error::Internal(format!("a new shepherd {why}")))
    }

    /// Keeps `POOL` shepherds waiting, so that a spawn does not start one.
    pub async fn refill_pool(&self) {
        while self.pool.lock().len() < POOL {
            match self.fresh_shepherd().await {
                Ok(w) => {
                    let mut pool = self.pool.lock();
                    if pool.len() < POOL {
                        pool.push(w);
                    }
                }
                Err(e) => {
                    warn!("cannot start a shepherd for the pool: {e}");
                    return;
                }
            }
        }
    }

    /// Connects to a shepherd, learns what it runs, and enters it in the vproc table.
    pub async fn link_shepherd(self: &Arc<Self>, sock: &Path) -> Result<Arc<VProc>> {
        let stream = UnixStream::connect(sock)
            .await
            .map_err(|e| Error::internal(&format!("connect {}", sock.display()), e))?;
        let (mut rd, mut wr) = stream.into_split();
        tell(&mut wr, In::Hello(true), "shepherd hello").await?;
        // A detached process may have exited (and said so) before our hello: Info carries
        // the status too, so anything before it is skipped.
        let info = loop {
            match read_frame::<pb::ShepherdOut, _>(&mut rd).await {
                Ok(Some(pb::ShepherdOut {
                    msg: Some(Out::Info(i)),
                })) => break i,
                Ok(Some(_)) => continue,
                other => {
                    return Err(Error::Internal(format!(
                        "shepherd {} answered {other:?}",
                        sock.display()
                    )))
                }
            }
        };
        let gpid = Gpid::from_raw(info.gpid)
            .ok_or_else(|| Error::Internal("shepherd has a bad gpid".into()))?;
        let linked = Linked {
            spec: info.spec.unwrap_or_default(),
            host_pid: info.host_pid,
            ns_pid: info.ns_pid,
            gpid,
            shepherd_pid: info.shepherd_pid,
            exited: info.exited.map(WaitStatus::from),
        };
        Ok(self.link(rd, wr, linked, None))
    }

    /// Enters a linked shepherd in the vproc table and relays between it and the node:
    /// messages to it from the vproc's queue, its reports to the subscriber (`out`).
    fn link<R, W>(
        self: &Arc<Self>,
        mut rd: R,
        mut wr: W,
        l: Linked,
        out: Option<mpsc::Sender<pb::SessionOutput>>,
    ) -> Arc<VProc>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let spec = l.spec;
        let ps = spec.spec.clone().unwrap_or_default();
        let gpid = l.gpid;
        let (tx, mut rx) = mpsc::unbounded_channel::<pb::ShepherdIn>();
        let (status, _) = watch::channel(l.exited);
        let vp = Arc::new(VProc {
            gpid,
            host_pid: l.host_pid,
            shepherd_pid: l.shepherd_pid,
            uid: spec.creds.as_ref().map(|c| c.uid).unwrap_or(0),
            job: spec.job,
            parent_node: NodeId::new(spec.parent_node).unwrap_or(self.id),
            parent: spec.parent,
            stub: spec
                .creds
                .as_ref()
                .filter(|c| c.start != 0 && !ps.detached)
                .map(|c| (c.pid, c.start)),
            detached: ps.detached,
            argv0: ps
                .argv
                .first()
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .unwrap_or_default(),
            tx,
            status,
            gone: watch::channel(false).0,
            parent_gone: false.into(),
            parent_exited: false.into(),
            subscriber: NamedMutex::new("vproc.subscriber", out),
            sessions: 0.into(),
            hung_up: false.into(),
            pushes: NamedMutex::new("vproc.pushes", None),
            released: false.into(),
        });
        self.start_pushes(&vp);
        self.vprocs.write().insert(gpid, vp.clone());
        if let Some(c) = &spec.creds {
            self.alias_insert(l.ns_pid, l.shepherd_pid, c);
        }
        if let Some(ws) = vp.exited() {
            // It exited before we asked (or while no cland ran): its parent may not know.
            self.process_exited(&vp, ws);
        }
        tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                if write_frame(&mut wr, &m).await.is_err() {
                    break;
                }
            }
            let _ = wr.shutdown().await;
        });
        let node = self.clone();
        let link = vp.clone();
        tokio::spawn(async move {
            loop {
                match read_frame::<pb::ShepherdOut, _>(&mut rd).await {
                    Ok(Some(pb::ShepherdOut { msg: Some(m) })) => match m {
                        Out::Stdout(d) => link.deliver(pb::session_output::Output::Stdout(d)).await,
                        Out::Stderr(d) => link.deliver(pb::session_output::Output::Stderr(d)).await,
                        Out::Exited(st) => {
                            let ws = WaitStatus::from(st);
                            // Told again to a resumed session: known already.
                            let first = link.status.send_replace(Some(ws)).is_none();
                            link.deliver(pb::session_output::Output::Exited(st)).await;
                            if first {
                                node.process_exited(&link, ws);
                            }
                        }
                        Out::Taken(n) => link.deliver(pb::session_output::Output::Taken(n)).await,
                        Out::Resumed(r) => {
                            link.deliver(pb::session_output::Output::Resumed(r)).await
                        }
                        Out::Stopped(sig) => {
                            node.process_changed(&link, Change::Stopped(sig));
                            link.deliver(pb::session_output::Output::Stopped(sig)).await
                        }
                        Out::Continued(_) => {
                            node.process_changed(&link, Change::Continued);
                            link.deliver(pb::session_output::Output::Continued(true))
                                .await
                        }
                        Out::Info(_) => {}
                    },
                    Ok(_) => break,
                    Err(e) => {
                        debug!(gpid = %link.gpid, "shepherd link: {e}");
                        break;
                    }
                }
            }
            // The shepherd is gone: it reaped the process after a release, or it was killed.
            if link.exited().is_none() {
                warn!(gpid = %link.gpid, "shepherd vanished before its process exited");
                let ws = WaitStatus {
                    signal: libc::SIGKILL,
                    ..Default::default()
                };
                link.status.send_replace(Some(ws));
                // Lost, not an exit: a stub waiting for a resume takes it too.
                let e = pb::Error::new(
                    pb::ErrorCode::Internal,
                    format!(
                        "the shepherd of process {} vanished; the process is lost",
                        link.gpid
                    ),
                );
                link.deliver(pb::session_output::Output::Lost(e)).await;
                node.process_exited(&link, ws);
            }
            // Its last statuses are queued: the pusher ends once they are sent.
            link.pushes.lock().take();
            {
                // Only this link's entry: a new process may have the gpid by now.
                let mut vprocs = node.vprocs.write();
                if vprocs
                    .get(&link.gpid)
                    .is_some_and(|v| Arc::ptr_eq(v, &link))
                {
                    vprocs.remove(&link.gpid);
                }
            }
            link.gone.send_replace(true);
        });
        vp
    }

    /// Rebuilds the vproc table from the shepherds that outlived a previous cland, then
    /// starts removing the logs of processes that are gone (which needs the table whole).
    /// Links the shepherds a previous cland left; how many were found alive (linked, or
    /// to be linked when they answer).
    pub async fn recover(self: &Arc<Self>) -> usize {
        let found = self.recover_shepherds().await;
        self.start_log_sweeper();
        found
    }

    /// Whether `g` is a process of this node: linked, or with a shepherd still to link
    /// (its socket there; its logs must stay).
    pub fn is_kept(&self, g: Gpid) -> bool {
        self.vprocs.read().contains_key(&g)
            || self
                .state_dir
                .join("sh")
                .join(format!("{}.sock", g.raw()))
                .exists()
    }

    async fn recover_shepherds(self: &Arc<Self>) -> usize {
        let dir = self.state_dir.join("sh");
        let Ok(rd) = std::fs::read_dir(&dir) else {
            return 0;
        };
        let incarnation = self.incarnation();
        // Each on a task of its own, all at once: a shepherd that does not answer
        // (stopped, stuck) delays the start by RECOVERY_WAIT at most, well within the
        // peers' failure detector, and is linked whenever it answers.
        let links: Vec<_> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "sock"))
            .map(|p| {
                let node = self.clone();
                tokio::spawn(async move { node.recover_shepherd(p, incarnation).await })
            })
            .collect();
        let deadline = tokio::time::Instant::now() + RECOVERY_WAIT;
        let (mut n, mut late) = (0, 0);
        for link in links {
            match tokio::time::timeout_at(deadline, link).await {
                Ok(Ok(true)) => n += 1,
                Ok(_) => {}
                Err(_) => late += 1,
            }
        }
        if n > 0 {
            info!(count = n, "recovered processes from their shepherds");
        }
        if late > 0 {
            warn!(
                count = late,
                "shepherds did not answer within {RECOVERY_WAIT:?}: each is linked when it does"
            );
        }
        n + late
    }

    /// Links the shepherd listening at `p` (a socket a previous cland's shepherd made);
    /// true once linked. A socket nobody listens at any more is removed.
    async fn recover_shepherd(self: Arc<Self>, p: PathBuf, incarnation: u64) -> bool {
        match self.link_shepherd(&p).await {
            Ok(vp) if self.incarnation() != incarnation => {
                // Linked late, after the node was fenced (its processes killed, a new
                // incarnation): this one goes too, as the fence would have taken it.
                warn!(gpid = %vp.gpid, "a shepherd answered after the node was fenced");
                if vp.exited().is_none() {
                    self.kill_node_pid(vp.gpid.local(), libc::SIGKILL);
                }
                true
            }
            Ok(vp) => {
                if !vp.detached {
                    // Its session died with the old cland: its stub may come back.
                    self.park(&vp, vp.session());
                }
                true
            }
            Err(err) => {
                warn!(socket = %p.display(), "stale shepherd socket: {err}");
                let _ = std::fs::remove_file(&p);
                false
            }
        }
    }
}
