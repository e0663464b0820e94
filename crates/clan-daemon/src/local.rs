//! The local API: a Unix socket for the CLI and the client library on this node. The caller
//! is whoever the kernel says it is (SO_PEERCRED), with its supplementary groups read from
//! /proc; those credentials travel with every request to other nodes.

use crate::error::{Error, Result};
use crate::node::Node;
use crate::placement::LoadManager;
use crate::process::group::Kind;
use crate::process::vproc::PendingSignals;
use crate::process::wait::{check_wait_len, WaitEvent, WaitFlags};
use crate::session::{Endpoint, Start, StubRelay};
use clan_core::unixconn::{ReadHalf as OwnedReadHalf, UnixConn, WriteHalf as OwnedWriteHalf};
use clan_core::{Gpid, NodeId};
use clan_proto::pb::{self, local_reply::Reply, local_request::Op};
use clan_proto::{write_frame, FrameError, MAX_LOCAL_FRAME};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// Most processes one kill request may name: each is signalled in turn on the request's
/// worker, and a 4 MiB local request could name a million (docs/signals.md).
pub const MAX_KILL_GPIDS: usize = 65_536;

/// Requests larger than this are read and decoded [`LARGE_AT_ONCE`] at a time: a frame of
/// many empty items decodes to many times its size (a 4 MiB one, to 100 MB or more), and
/// any user may open many connections.
const LARGE_REQUEST: usize = 64 << 10;

/// How many large requests are read and decoded at once.
const LARGE_AT_ONCE: usize = 4;

static LARGE_TURNS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(LARGE_AT_ONCE);

/// How long a client that has its turn may take to send a large request's body (it wrote
/// the whole frame at once: only a client stopped halfway takes longer).
const LARGE_BODY_TIME: Duration = Duration::from_secs(5);

/// A start among several that go on at once in one task (the copies of a `-N` run).
type Starting<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// An attached process started: its gpid and where its session goes.
type AttachedStart<'a> = Starting<'a, Result<(Gpid, Endpoint)>>;

/// The next of `futs` to end, with its index, polled in the caller's task (no task of its
/// own to wake, as for one start alone); `None` once all have ended. Cancel safe: the
/// futures stay in `futs`.
async fn next_done<T>(futs: &mut [Option<Starting<'_, T>>]) -> Option<(usize, T)> {
    std::future::poll_fn(move |cx| {
        let mut waiting = false;
        for (i, slot) in futs.iter_mut().enumerate() {
            if let Some(f) = slot {
                if let std::task::Poll::Ready(r) = f.as_mut().poll(cx) {
                    *slot = None;
                    return std::task::Poll::Ready(Some((i, r)));
                }
                waiting = true;
            }
        }
        if waiting {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(None)
        }
    })
    .await
}

/// The starts of a run by rank: those that started, with their node, and the first
/// failure (a start that did not end counts as one).
fn by_rank<T>(
    results: Vec<Option<Result<T>>>,
    targets: &[NodeId],
) -> (Vec<(NodeId, T)>, Option<Error>) {
    let mut ok = Vec::new();
    let mut first_error = None;
    for (r, &t) in results.into_iter().zip(targets) {
        match r {
            Some(Ok(x)) => ok.push((t, x)),
            Some(Err(e)) => {
                first_error.get_or_insert(e);
            }
            None => {
                first_error.get_or_insert(Error::Internal("a start did not end".into()));
            }
        }
    }
    (ok, first_error)
}

/// The next request of a local client; `None` when it closed the connection. A request
/// longer than [`MAX_LOCAL_FRAME`] is refused from its length, before its body is read.
async fn read_request(
    rd: &mut BufReader<OwnedReadHalf>,
) -> std::result::Result<Option<pb::LocalRequest>, FrameError> {
    use prost::Message;
    let Some(len) = clan_proto::frame::read_len(rd).await? else {
        return Ok(None);
    };
    if len > MAX_LOCAL_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    if len <= LARGE_REQUEST {
        let body = clan_proto::frame::read_body(rd, len).await?;
        return Ok(Some(pb::LocalRequest::decode(body.as_slice())?));
    }
    // Held until the request is decoded.
    let _turn = LARGE_TURNS.acquire().await.expect("never closed");
    let body = tokio::time::timeout(LARGE_BODY_TIME, clan_proto::frame::read_body(rd, len))
        .await
        .map_err(|_| {
            FrameError::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the {len} bytes of a request did not come within {} s",
                    LARGE_BODY_TIME.as_secs()
                ),
            ))
        })??;
    Ok(Some(pb::LocalRequest::decode(body.as_slice())?))
}

/// Resolves when the client's side of the connection has something to say: true at EOF
/// (it closed or died), false when it sent more (which stays buffered for the next read).
async fn client_gone(rd: &mut BufReader<OwnedReadHalf>) -> bool {
    use tokio::io::AsyncBufReadExt;
    match rd.fill_buf().await {
        Ok(b) => b.is_empty(),
        Err(_) => true,
    }
}

impl Node {
    /// Serves the local API on `path` until the daemon stops.
    pub async fn serve_local(self: &Arc<Self>, path: &Path) -> anyhow::Result<()> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
        let node = self.clone();
        tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((s, _)) => {
                        let node = node.clone();
                        tokio::spawn(async move { node.serve_client(s).await });
                    }
                    Err(e) => {
                        warn!("local accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        });
        Ok(())
    }

    async fn serve_client(self: Arc<Self>, s: UnixStream) {
        let Ok(cred) = s.peer_cred() else { return };
        let pid = cred.pid().unwrap_or(0);
        // The caller's job is read now, while its process is known to be the one that
        // connected (a pidfd taken from the socket, checked alive after the read): a
        // process of a job that hands its connection on and exits can not start
        // processes outside the job through it.
        // (A kernel without SO_PEERPIDFD: a pidfd of the pid, taken now; any other failure
        // means the caller is gone, and the pid may name another process already.)
        let pinned = match peer_pidfd(&s) {
            Ok(fd) => Some(fd),
            Err(nix::errno::Errno::ENOPROTOOPT) => clan_core::sys::pidfd_open(pid).ok(),
            Err(_) => None,
        };
        // Everything read of the caller's pid is read before the check that it is still
        // the process that connected.
        let job = self.job_of_caller(pid as u32);
        let ids = self.caller_ids(pid);
        // SO_PEERCRED gives the effective uid; kill(2) also accepts the real one.
        let ruid = ids.ruid.unwrap_or(cred.uid());
        let alive = pinned.as_ref().is_some_and(pidfd_alive);
        if !alive && cred.uid() != 0 {
            debug!(pid, "client gone before it was identified: refused");
            return;
        }
        let creds = pb::Creds {
            uid: cred.uid(),
            gid: cred.gid(),
            groups: ids.groups,
            pid: pid as u32,
            node: self.id.get(),
            pgid: self.cluster_id(Kind::Group, ids.pgid),
            sid: self.cluster_id(Kind::Session, ids.sid),
            start: 0,
            job: job.unwrap_or(0),
            ruid: Some(ruid),
            // Not read: none (a caller gone before it was read is not one to trust).
            cap_eff: Some(ids.caps.unwrap_or(0)),
        };
        // Watched for reading only (see clan_core::unixconn).
        let Ok(s) = s.into_std().and_then(UnixConn::from_std) else {
            return;
        };
        let (rd, mut wr) = s.into_split();
        let mut rd = BufReader::new(rd);
        loop {
            let req = match read_request(&mut rd).await {
                Ok(Some(r)) => r,
                Ok(None) => return,
                Err(e) => {
                    let err = match e {
                        FrameError::TooLarge(n) => Error::Invalid(format!(
                            "request too large: {n} bytes, the limit is {MAX_LOCAL_FRAME} bytes"
                        )),
                        e => Error::Invalid(format!("malformed request: {e}")),
                    };
                    let _ = write_frame(
                        &mut wr,
                        &pb::LocalReply {
                            id: 0,
                            reply: Some(Reply::Error(err.into())),
                        },
                    )
                    .await;
                    return;
                }
            };
            let id = req.id;
            match req.op {
                Some(Op::Run(r)) if !r.spec.as_ref().is_some_and(|s| s.detached) => {
                    self.run_attached(id, r, creds, pinned, rd, wr).await;
                    return;
                }
                Some(Op::Reattach(r)) => {
                    self.run_reattached(id, r, creds, pinned, rd, wr).await;
                    return;
                }
                Some(Op::Link(l)) => {
                    // The reply carries the connected socket (SCM_RIGHTS).
                    let res = match NodeId::new(l.node) {
                        Some(n) => self.open_link(n, &creds).await,
                        None => Err(Error::NotFound(format!(
                            "node {} is not in the cluster",
                            l.node
                        ))),
                    };
                    let sent = match res {
                        Ok((link, sock)) => {
                            let bytes = clan_proto::frame::encode(&pb::LocalReply {
                                id,
                                reply: Some(Reply::Link(link)),
                            });
                            wr.send_with_fd(&bytes, std::os::fd::AsFd::as_fd(&sock))
                                .await
                        }
                        Err(e) => {
                            write_frame(
                                &mut wr,
                                &pb::LocalReply {
                                    id,
                                    reply: Some(Reply::Error(e.into())),
                                },
                            )
                            .await
                        }
                    };
                    if sent.is_err() {
                        return;
                    }
                }
                Some(op) => {
                    let is_wait = matches!(op, Op::Wait(_));
                    let handled = self.handle_local(op, &creds);
                    let res = if is_wait {
                        // A wait whose caller went away (killed, timed out) is abandoned
                        // before it collects anything (`wait_all` takes nothing before
                        // every process it names is ready): the statuses stay for the
                        // next wait.
                        tokio::pin!(handled);
                        tokio::select! {
                            r = &mut handled => r,
                            eof = client_gone(&mut rd) => {
                                if eof {
                                    debug!("waiting client went away");
                                    return;
                                }
                                handled.await
                            }
                        }
                    } else {
                        handled.await
                    };
                    let reply = match res {
                        Ok(r) => match crate::error::too_large(r.encoded_len()) {
                            Some(e) => Reply::Error(e.into()),
                            None => r,
                        },
                        Err(e) => Reply::Error(e.into()),
                    };
                    if write_frame(
                        &mut wr,
                        &pb::LocalReply {
                            id,
                            reply: Some(reply),
                        },
                    )
                    .await
                    .is_err()
                    {
                        return;
                    }
                }
                None => {
                    let err = Error::Invalid("empty request".into());
                    let _ = write_frame(
                        &mut wr,
                        &pb::LocalReply {
                            id,
                            reply: Some(Reply::Error(err.into())),
                        },
                    )
                    .await;
                }
            }
        }
    }

    fn check_spec(spec: &Option<pb::ProcSpec>) -> Result<pb::ProcSpec> {
        let spec = spec
            .clone()
            .ok_or_else(|| Error::Invalid("run without a command".into()))?;
        if spec.argv.is_empty() || spec.argv[0].is_empty() {
            return Err(Error::Invalid("run without a command".into()));
        }
        // Nothing a process could be given: the kernel takes C strings.
        if spec.cwd.contains(&0) || spec.argv.iter().any(|a| a.contains(&0)) {
            return Err(Error::Invalid(
                "a NUL byte in the command or the working directory".into(),
            ));
        }
        Ok(spec)
    }

    /// The job a run goes into. A process of a job stays in it: a non-root caller inside a
    /// job's task (by the kernel's account, its cgroup) can only start processes in that
    /// job, whatever its environment says. Otherwise `--job J` names an existing job that
    /// the caller owns (root may use any), and no job makes a new one.
    async fn job_for(self: &Arc<Self>, job: u64, creds: &pb::Creds) -> Result<u64> {
        let own = Some(creds.job).filter(|&j| j != 0);
        if job == 0 {
            return match own {
                Some(j) => Ok(j),
                None => Ok(self.new_job_for(creds.uid)?.raw()),
            };
        }
        if own == Some(job) {
            return Ok(job);
        }
        if let Some(j) = own.filter(|_| creds.uid != 0) {
            return Err(Error::Permission(format!(
                "permission denied: a process of job {j} can only start processes in job {j}, \
                 not in job {job}"
            )));
        }
        let id = clan_core::JobId::from_raw(job)
            .ok_or_else(|| Error::NotFound(format!("no such job {job}")))?;
        match self.owner_of_job(id).await {
            Ok(owner) if creds.uid != 0 && owner != creds.uid => Err(Error::Permission(format!(
                "permission denied: job {job} belongs to uid {owner}"
            ))),
            Ok(_) => Ok(job),
            // Root may add to a job whose origin node is down.
            Err(Error::NodeDown(_) | Error::NodeDead(_)) if creds.uid == 0 => Ok(job),
            Err(e) => Err(e),
        }
    }

    /// The gpid of host process `pid` when it is a process of this node (in the node's pid
    /// namespace on a local cluster; any host process on a real node).
    pub(crate) fn gpid_of_host(&self, pid: u32) -> Option<Gpid> {
        if pid == 0 {
            return None;
        }
        if self.view.ns_init == 0 {
            return Gpid::new(self.id, pid);
        }
        if !self.view.in_node_pid_ns(pid) {
            return None;
        }
        Gpid::new(self.id, clan_core::sys::ns_pid_of_host(pid)?)
    }

    /// The job whose task (on any node of this cluster on this machine) holds host process
    /// `pid`, from its cgroup.
    fn job_of_caller(&self, pid: u32) -> Option<u64> {
        self.cgroup.as_ref()?.task_of(pid, true)
    }

    /// Who owns a job: asked of the node that made it.
    async fn owner_of_job(self: &Arc<Self>, job: clan_core::JobId) -> Result<u32> {
        let origin = job.origin();
        if origin == self.id {
            return self
                .job_owner(job.raw())
                .ok_or_else(|| Error::NotFound(format!("no such job {job}")));
        }
        let op = pb::peer_request::Op::Job(pb::JobRequest {
            action: pb::JobAction::JobOwner as i32,
            job: job.raw(),
            ..Default::default()
        });
        let limit = self.cfg.dead_after();
        match tokio::time::timeout(limit, self.call(origin, self.own_creds(), op)).await {
            Ok(Ok(pb::peer_reply::Reply::Job(j))) => match (j.error, j.tasks.first()) {
                (Some(e), _) => Err(e.into()),
                (None, Some(t)) => Ok(t.uid),
                (None, None) => Err(Error::NotFound(format!("no such job {job}"))),
            },
            Ok(Ok(other)) => Err(Error::Internal(format!("unexpected reply {other:?}"))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::NodeDown(format!(
                "node {origin}, where job {job} was made, did not answer"
            ))),
        }
    }

    async fn run_detached(
        self: &Arc<Self>,
        r: pb::RunRequest,
        creds: &pb::Creds,
    ) -> Result<pb::Started> {
        let spec = Self::check_spec(&r.spec)?;
        let job = self.job_for(r.job, creds).await?;
        let policy = pb::Policy::try_from(r.policy).unwrap_or_default();
        let targets = self
            .place(r.node, policy, r.count, &spec, creds.uid)
            .await?;
        let size = if r.count > 1 { targets.len() as u32 } else { 0 };
        let mut started = pb::Started {
            gpids: vec![],
            job,
            nodes: vec![],
            ..Default::default()
        };
        let parent = self.parent_of_caller(creds);
        let parent_gpid = parent
            .and_then(|p| self.gpid_of_host(p))
            .map_or(0, |g| g.raw());
        // The copies start at once (`-N K`: their nodes work in parallel), in this task.
        let start = |rank: usize, t: NodeId| {
            let (spec, creds) = (&spec, creds);
            async move {
                let res = if t == self.id {
                    self.spawn_local(crate::process::vproc::SpawnLocal {
                        spec: spec.clone(),
                        creds: creds.clone(),
                        job,
                        rank: rank as u32,
                        size,
                        parent_node: self.id,
                        parent: parent_gpid,
                        pending: None,
                    })
                    .await
                    .map(|vp| vp.gpid)
                } else {
                    let op = pb::peer_request::Op::Spawn(pb::SpawnRequest {
                        spec: Some(spec.clone()),
                        creds: Some(creds.clone()),
                        job,
                        rank: rank as u32,
                        size,
                        parent_node: self.id.get(),
                        parent: parent_gpid,
                    });
                    match self.call(t, creds.clone(), op).await {
                        Ok(pb::peer_reply::Reply::Started(s)) => s
                            .gpids
                            .first()
                            .copied()
                            .and_then(Gpid::from_raw)
                            .ok_or_else(|| Error::Internal("no gpid".into())),
                        Ok(other) => Err(Error::Internal(format!("unexpected reply {other:?}"))),
                        Err(e) => Err(e),
                    }
                };
                // Its parent's side at once, before news of it can come.
                if let Ok(g) = res {
                    self.expect_child(g, creds.uid);
                    self.note_member(t, creds);
                    if let Some(p) = parent {
                        self.adopt(p, g, creds);
                    }
                }
                res
            }
        };
        let mut starts: Vec<Option<Starting<Result<Gpid>>>> = targets
            .iter()
            .enumerate()
            .map(|(rank, &t)| Some(Box::pin(start(rank, t)) as Starting<_>))
            .collect();
        let mut results: Vec<Option<Result<Gpid>>> = targets.iter().map(|_| None).collect();
        while let Some((rank, r)) = next_done(&mut starts).await {
            results[rank] = Some(r);
        }
        drop(starts);
        let (ok, first_error) = by_rank(results, &targets);
        for (t, g) in ok {
            started.gpids.push(g.raw());
            started.nodes.push(t.get());
        }
        if let Some(e) = first_error {
            // All or nothing: stop what this run started.
            for &g in &started.gpids {
                if let Some(g) = Gpid::from_raw(g) {
                    let _ = self.signal(g, libc::SIGKILL, creds).await;
                    let _ = self.wait(g, creds, WaitFlags::default()).await;
                }
            }
            return Err(e);
        }
        Ok(started)
    }

    async fn run_attached(
        self: Arc<Self>,
        id: u64,
        r: pb::RunRequest,
        creds: pb::Creds,
        stub: Option<OwnedFd>,
        mut rd: BufReader<OwnedReadHalf>,
        mut wr: OwnedWriteHalf,
    ) {
        let fail = |e: Error| pb::LocalReply {
            id,
            reply: Some(Reply::Error(e.into())),
        };
        let prep = async {
            let spec = Self::check_spec(&r.spec)?;
            let job = self.job_for(r.job, &creds).await?;
            let policy = pb::Policy::try_from(r.policy).unwrap_or_default();
            let targets = self
                .place(r.node, policy, r.count, &spec, creds.uid)
                .await?;
            Ok::<_, Error>((spec, job, targets))
        };
        let (spec, job, targets) = match prep.await {
            Ok(x) => x,
            Err(e) => {
                let _ = write_frame(&mut wr, &fail(e)).await;
                return;
            }
        };
        let size = if r.count > 1 { targets.len() as u32 } else { 0 };
        // The stub stands in for the process where it was started: it is the parent. Who
        // it is (its start time, for a node that parks its process and asks after it) is
        // read here, for attached runs only, and trusted once its pidfd, taken when it
        // connected, says it is still that process.
        let parent_gpid = self.gpid_of_host(creds.pid).map_or(0, |g| g.raw());
        let mut creds = creds;
        creds.start = clan_core::sys::state_and_start(creds.pid)
            .filter(|_| stub.as_ref().is_some_and(pidfd_alive))
            .map_or(0, |(_, t)| t);
        let (out_tx, out_rx) = mpsc::channel(64);
        let mut endpoints: HashMap<Gpid, Endpoint> = HashMap::new();
        let mut started = pb::Started {
            gpids: vec![],
            job,
            nodes: vec![],
            ..Default::default()
        };
        // The copies start at once (`-N K`: their nodes work in parallel), all in this task:
        // one start alone is polled here as before, with no task of its own to wake.
        // The stub's signals while they start (it has no gpid to name yet) go to each
        // copy still starting (its `PendingSignals`) and to each one started.
        let pendings: Vec<Arc<PendingSignals>> =
            targets.iter().map(|_| PendingSignals::new()).collect();
        let mut starts: Vec<_> = targets
            .iter()
            .enumerate()
            .map(|(rank, &t)| {
                let s = Start {
                    target: t,
                    spec: spec.clone(),
                    creds: creds.clone(),
                    job,
                    rank: rank as u32,
                    size,
                    parent: parent_gpid,
                    pending: pendings[rank].clone(),
                };
                Some(Box::pin(self.start_attached(s, out_tx.clone())) as AttachedStart)
            })
            .collect();
        let mut results: Vec<Option<Result<(Gpid, Endpoint)>>> =
            targets.iter().map(|_| None).collect();
        let mut stub_open = true;
        loop {
            tokio::select! {
                biased;
                r = next_done(&mut starts) => match r {
                    None => break,
                    Some((rank, r)) => {
                        match &r {
                            // What came after the start took its last.
                            Ok((g, ep)) => {
                                for sig in pendings[rank].take() {
                                    ep.input(*g, pb::session_input::Input::StartSignal(sig));
                                }
                            }
                            // All or nothing: the copies still starting need not finish
                            // (one whose exec hangs would hold the run).
                            Err(_) => {
                                for (p, r) in pendings.iter().zip(&results) {
                                    if r.is_none() {
                                        p.signal(libc::SIGKILL);
                                    }
                                }
                            }
                        }
                        results[rank] = Some(r);
                        continue;
                    }
                },
                // Cancel safe: nothing is taken from the buffer until a frame is there.
                more = rd.fill_buf(), if stub_open => {
                    if more.map_or(true, |b| b.is_empty()) {
                        stub_open = false; // gone: seen again by serve_stub
                        continue;
                    }
                }
            }
            // The stub writes each frame whole: the rest of it is there or on its way.
            match read_request(&mut rd).await {
                Ok(Some(pb::LocalRequest {
                    op:
                        Some(Op::Input(pb::SessionInput {
                            input: Some(pb::session_input::Input::StartSignal(sig)),
                            ..
                        })),
                    ..
                })) => {
                    for (rank, r) in results.iter().enumerate() {
                        match r {
                            None => pendings[rank].signal(sig),
                            Some(Ok((g, ep))) => {
                                ep.input(*g, pb::session_input::Input::StartSignal(sig))
                            }
                            Some(Err(_)) => {}
                        }
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => stub_open = false,
            }
        }
        drop(starts);
        // All started, or none stays: the first failure (by rank) is the run's.
        let (ok, first_error) = by_rank(results, &targets);
        if let Some(e) = first_error {
            for (_, (g, ep)) in ok {
                ep.input(g, pb::session_input::Input::Signal(libc::SIGKILL));
                ep.orphan(g);
            }
            let _ = write_frame(&mut wr, &fail(e)).await;
            return;
        }
        for (t, (g, ep)) in ok {
            started.gpids.push(g.raw());
            started.nodes.push(t.get());
            endpoints.insert(g, ep);
        }
        started.reattach_ms = self.cfg.reattach_ms;
        self.serve_stub(
            id,
            started,
            vec![],
            endpoints,
            (out_tx, out_rx),
            creds,
            stub,
            rd,
            wr,
        )
        .await;
    }

    /// A stub whose session broke (this node's cland restarted) takes up its processes
    /// again: a new session to each, the shepherds resending from the stub's offsets.
    async fn run_reattached(
        self: Arc<Self>,
        id: u64,
        r: pb::ReattachRequest,
        creds: pb::Creds,
        stub: Option<OwnedFd>,
        rd: BufReader<OwnedReadHalf>,
        wr: OwnedWriteHalf,
    ) {
        let (out_tx, out_rx) = mpsc::channel(64);
        let mut started = pb::Started {
            gpids: vec![],
            job: 0,
            nodes: vec![],
            reattach_ms: self.cfg.reattach_ms,
        };
        // Each on its own: a node that is restarting takes a while to answer.
        let mut tries = tokio::task::JoinSet::new();
        let mut asked = std::collections::HashSet::new();
        for from in r.items.into_iter().filter(|f| asked.insert(f.gpid)) {
            let (node, creds, out) = (self.clone(), creds.clone(), out_tx.clone());
            tries.spawn(async move {
                let gpid = from.gpid;
                (gpid, node.reattach_endpoint(from, &creds, out).await)
            });
        }
        let (mut endpoints, mut lost) = (HashMap::new(), vec![]);
        while let Some(Ok((raw, res))) = tries.join_next().await {
            started.gpids.push(raw);
            match (Gpid::from_raw(raw), res) {
                (Some(g), Ok(ep)) => {
                    started.nodes.push(g.node().get());
                    endpoints.insert(g, ep);
                }
                (g, res) => {
                    let e = res
                        .err()
                        .unwrap_or_else(|| Error::NotFound(format!("no such process {raw}")));
                    started.nodes.push(g.map_or(0, |g| g.node().get()));
                    lost.push(pb::SessionOutput {
                        gpid: raw,
                        output: Some(pb::session_output::Output::Lost(e.into())),
                    });
                }
            }
        }
        debug!(count = endpoints.len(), "reattach served");
        self.serve_stub(
            id,
            started,
            lost,
            endpoints,
            (out_tx, out_rx),
            creds,
            stub,
            rd,
            wr,
        )
        .await;
    }

    /// Replies `started` to the stub, sends it `first`, then relays between it and the
    /// processes' `endpoints` until every one is released, lost or hung up.
    #[allow(clippy::too_many_arguments)]
    async fn serve_stub(
        self: Arc<Self>,
        id: u64,
        started: pb::Started,
        first: Vec<pb::SessionOutput>,
        mut endpoints: HashMap<Gpid, Endpoint>,
        (out_tx, out_rx): (
            mpsc::Sender<pb::SessionOutput>,
            mpsc::Receiver<pb::SessionOutput>,
        ),
        creds: pb::Creds,
        stub: Option<OwnedFd>,
        mut rd: BufReader<OwnedReadHalf>,
        mut wr: OwnedWriteHalf,
    ) {
        let job = started.job;
        if write_frame(
            &mut wr,
            &pb::LocalReply {
                id,
                reply: Some(Reply::Started(started)),
            },
        )
        .await
        .is_err()
        {
            for (g, ep) in endpoints.drain() {
                ep.orphan(g);
            }
            return;
        }
        for ep in endpoints.values_mut() {
            ep.answered();
        }
        let (in_tx, in_rx) = mpsc::channel(64);
        let (to_stub, mut to_stub_rx) = mpsc::channel::<pb::SessionOutput>(64);
        let reader = tokio::spawn(async move {
            while let Ok(Some(req)) = read_request(&mut rd).await {
                if let Some(Op::Input(i)) = req.op {
                    if in_tx.send(i).await.is_err() {
                        break;
                    }
                }
            }
        });
        let writer = tokio::spawn(async move {
            while let Some(o) = to_stub_rx.recv().await {
                if write_frame(
                    &mut wr,
                    &pb::LocalReply {
                        id,
                        reply: Some(Reply::Output(o)),
                    },
                )
                .await
                .is_err()
                {
                    break;
                }
            }
        });
        for o in first {
            let _ = to_stub.send(o).await;
        }
        // The stub, to wake it when its process is continued by someone else (a stopped
        // stub can not read that news): the pidfd taken when it connected, so a reused pid
        // is never signalled (root's clients without one: taken now).
        let stub = stub.or_else(|| clan_core::sys::pidfd_open(creds.pid as i32).ok());
        let stub_pid = creds.pid;
        StubRelay {
            node: self,
            creds,
            endpoints,
            out_tx,
            out_rx,
            from_stub: in_rx,
            to_stub,
            stub,
            stub_pid,
        }
        .run()
        .await;
        let _ = writer.await;
        reader.abort();
        debug!(job, "session over");
    }

    async fn handle_local(self: &Arc<Self>, op: Op, creds: &pb::Creds) -> Result<Reply> {
        let gpid = |raw: u64| {
            Gpid::from_raw(raw).ok_or_else(|| Error::NotFound(format!("no such process {raw}")))
        };
        match op {
            Op::Run(r) => Ok(Reply::Started(self.run_detached(r, creds).await?)),
            Op::Kill(k) => {
                if k.gpids.len() > MAX_KILL_GPIDS {
                    return Err(Error::Invalid(format!(
                        "a kill of {} processes is refused: the limit is {MAX_KILL_GPIDS} \
                         per request",
                        k.gpids.len()
                    )));
                }
                let mut results = Vec::new();
                // A node found down is not asked again for the rest of the list.
                let mut down: HashMap<NodeId, Error> = HashMap::new();
                for (i, &raw) in k.gpids.iter().enumerate() {
                    // Signals to this node's processes complete without a pause: let the
                    // worker run others (heartbeats) now and then in a long list.
                    if i % 64 == 63 {
                        tokio::task::yield_now().await;
                    }
                    let res = match gpid(raw) {
                        Ok(g) => match down.get(&g.node()) {
                            Some(e) => Err(e.clone()),
                            None => {
                                let r = self.signal_queued(g, k.signal, creds, k.queued).await;
                                if let Err(e @ (Error::NodeDown(_) | Error::NodeDead(_))) = &r {
                                    down.insert(g.node(), e.clone());
                                }
                                r
                            }
                        },
                        Err(e) => Err(e),
                    };
                    results.push(pb::KillResult {
                        gpid: raw,
                        error: res.err().map(Into::into),
                    });
                }
                Ok(Reply::Kill(pb::KillReply { results }))
            }
            Op::Wait(w) => {
                // One task per process while waiting: a request may name a bounded number.
                check_wait_len(w.gpids.len())?;
                let flags = WaitFlags {
                    untraced: w.untraced,
                    continued: w.continued,
                };
                let gpids = w.gpids.iter().map(|&raw| gpid(raw)).collect();
                let res = self.wait_all(gpids, creds, flags).await;
                let results = w
                    .gpids
                    .iter()
                    .zip(res)
                    .map(|(&raw, res)| {
                        let mut r = pb::WaitResult {
                            gpid: raw,
                            ..Default::default()
                        };
                        match res {
                            Ok(WaitEvent::Exited(s)) => r.status = Some(s.into()),
                            Ok(WaitEvent::Stopped(sig)) => r.stopped = sig,
                            Ok(WaitEvent::Continued) => r.continued = true,
                            Err(e) => r.error = Some(e.into()),
                        }
                        r
                    })
                    .collect();
                Ok(Reply::Wait(pb::WaitReply { results }))
            }
            Op::Ps(p) => Ok(Reply::Ps(self.ps_cluster(p).await?)),
            Op::Job(j) => Ok(Reply::Job(self.job_cluster(j, creds.clone()).await?)),
            Op::Proc(r) => Ok(Reply::Proc(self.proc_request(r, creds).await?)),
            Op::Nodes(_) => Ok(Reply::Nodes(pb::NodesReply {
                nodes: self.nodes(),
            })),
            Op::Logs(l) => {
                let g = gpid(l.gpid)?;
                if g.node() == self.id {
                    Ok(Reply::Log(
                        self.logs_local(g, l.offset, l.follow, creds).await?,
                    ))
                } else {
                    match self
                        .call(g.node(), creds.clone(), pb::peer_request::Op::Logs(l))
                        .await?
                    {
                        pb::peer_reply::Reply::Log(c) => Ok(Reply::Log(c)),
                        other => Err(Error::Internal(format!("unexpected reply {other:?}"))),
                    }
                }
            }
            Op::Stats(s) => Ok(Reply::Stats(self.stats_cluster(s).await?)),
            Op::Loadmgr(l) => self.loadmgr(l, creds),
            Op::Sigsend(s) => Ok(Reply::Kill(pb::KillReply {
                results: self.sigsend(&s.expr, s.signal, creds).await?,
            })),
            Op::Shutdown(s) => {
                if creds.uid != 0 && creds.uid != nix::unistd::geteuid().as_raw() {
                    return Err(Error::Permission("only root may stop cland".into()));
                }
                self.shutdown.send_replace(Some(s.kill_processes));
                Ok(Reply::Ok(pb::Ok {}))
            }
            Op::Input(_) | Op::Reattach(_) => {
                Err(Error::Invalid("no session on this connection".into()))
            }
            Op::Link(_) => Err(Error::Invalid(
                "a link is handed over on the connection that asks".into(),
            )),
        }
    }

    fn loadmgr(&self, l: pb::LoadMgrRequest, creds: &pb::Creds) -> Result<Reply> {
        use pb::load_mgr_request::Action;
        let mut pl = self.placement.lock();
        match l.action {
            Some(Action::Show(_)) | None => {}
            Some(action) => {
                if creds.uid != 0 {
                    return Err(Error::Permission(
                        "only root may register a load manager".into(),
                    ));
                }
                match action {
                    Action::Register(r) if !r.command.is_empty() => {
                        pl.set_manager(Some(LoadManager::Command(r.command)))?
                    }
                    Action::Register(r) if !r.socket.is_empty() => {
                        pl.set_manager(Some(LoadManager::Socket(r.socket.into())))?
                    }
                    Action::Register(_) => {
                        return Err(Error::Invalid(
                            "a load manager needs a command or a socket".into(),
                        ))
                    }
                    Action::Unregister(_) => pl.set_manager(None)?,
                    Action::Show(_) => {}
                }
            }
        }
        Ok(Reply::Loadmgr(pb::LoadMgrReply {
            description: pl
                .manager
                .as_ref()
                .map(|m| m.describe())
                .unwrap_or_default(),
        }))
    }

    pub(crate) fn target_nodes(&self, asked: &[u32]) -> Result<Vec<NodeId>> {
        if asked.is_empty() {
            return Ok(self.cfg.node_ids().collect());
        }
        asked
            .iter()
            .map(|&n| {
                let id = NodeId::new(n)
                    .ok_or_else(|| Error::NotFound(format!("node {n} is not in the cluster")))?;
                self.cfg
                    .node(id)
                    .map_err(|_| Error::NotFound(format!("node {n} is not in the cluster")))?;
                Ok(id)
            })
            .collect()
    }

    /// Asks every node in `targets` at once: this node answers with `local`, the others get
    /// `op`. Each answer is `Ok` or the reason its node could not answer (dead, or silent
    /// for `dead_after_ms`), so one node never holds up the others. In node order.
    async fn fan_out<T, L, Fut>(
        self: &Arc<Self>,
        targets: Vec<NodeId>,
        op: pb::peer_request::Op,
        local: L,
        pick: fn(pb::peer_reply::Reply) -> Option<T>,
    ) -> Vec<(NodeId, std::result::Result<T, String>)>
    where
        T: Send + 'static,
        L: Fn(Arc<Node>) -> Fut + Send + Sync + Clone + 'static,
        Fut: std::future::Future<Output = T> + Send,
    {
        crate::fanout::on_each(targets, |n| {
            let (node, op, local) = (self.clone(), op.clone(), local.clone());
            async move {
                if n == node.id {
                    return Ok(local(node).await);
                }
                let limit = node.cfg.dead_after();
                match node.call_within(n, node.own_creds(), op, limit).await {
                    Ok(r) => pick(r).ok_or_else(|| "unexpected reply".to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }
        })
        .await
    }

    async fn ps_cluster(self: &Arc<Self>, p: pb::PsRequest) -> Result<pb::PsReply> {
        let targets = self.target_nodes(&p.nodes)?;
        let filter = p.filter.unwrap_or_default();
        let op = pb::peer_request::Op::Ps(pb::PsRequest {
            filter: Some(filter.clone()),
            nodes: vec![],
        });
        let local = move |node: Arc<Node>| {
            let filter = filter.clone();
            async move {
                pb::NodePs {
                    node: node.id.get(),
                    procs: node.ps_local(filter).await,
                    error: String::new(),
                }
            }
        };
        let pick = |r| match r {
            pb::peer_reply::Reply::Ps(ps) => Some(ps),
            _ => None,
        };
        let nodes = self
            .fan_out(targets, op, local, pick)
            .await
            .into_iter()
            .map(|(n, r)| {
                r.unwrap_or_else(|error| pb::NodePs {
                    node: n.get(),
                    procs: vec![],
                    error,
                })
            })
            .collect();
        Ok(pb::PsReply { nodes })
    }

    async fn stats_cluster(self: &Arc<Self>, s: pb::StatsRequest) -> Result<pb::StatsReply> {
        let targets = self.target_nodes(&s.nodes)?;
        let op = pb::peer_request::Op::Stats(pb::StatsRequest { nodes: vec![] });
        let pick = |r| match r {
            pb::peer_reply::Reply::Stats(s) => Some(s),
            _ => None,
        };
        let nodes = self
            .fan_out(
                targets,
                op,
                |node: Arc<Node>| async move { node.lock_stats() },
                pick,
            )
            .await
            .into_iter()
            .map(|(n, r)| {
                r.unwrap_or_else(|error| pb::NodeLockStats {
                    node: n.get(),
                    error,
                    ..Default::default()
                })
            })
            .collect();
        Ok(pb::StatsReply { nodes })
    }

    /// Output of a detached process from its log (`clan_core::logfile`), from position
    /// `offset` (or the oldest output kept, when what was there was dropped). With
    /// `follow`, waits a little for more when there is none yet and the process still runs.
    pub async fn logs_local(
        &self,
        gpid: Gpid,
        offset: u64,
        follow: bool,
        creds: &pb::Creds,
    ) -> Result<pb::LogChunk> {
        const LIMIT: usize = 1 << 20;
        let dir = clan_core::logfile::dir(&self.state_dir);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        loop {
            let (running, detached) = match self.vprocs.read().get(&gpid) {
                Some(vp) => (vp.exited().is_none(), vp.detached),
                None => (false, true),
            };
            // Opened afresh each time: a rotation moves the newest output to a new file.
            let d = dir.clone();
            let read = tokio::task::spawn_blocking(move || {
                let v = clan_core::logfile::LogView::open(&d, gpid)?;
                let (at, data) = v.read(offset, LIMIT)?;
                Ok::<_, std::io::Error>((v.owner, at, data, v.end()?))
            })
            .await
            .map_err(|e| Error::internal("read log", e))?;
            let (owner, at, data, size) = match read {
                Ok(r) => r,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(Error::NotFound(if detached {
                        format!(
                            "no log for process {gpid}: no such process (a log is removed {} \
                             after its process was collected; only processes started with -d \
                             have one)",
                            human_ms(self.log_keep().as_millis() as u64)
                        )
                    } else {
                        format!("no log for process {gpid}: it was not started with -d")
                    }))
                }
                Err(e) => return Err(Error::internal("read log", e)),
            };
            if creds.uid != 0 && creds.uid != owner {
                return Err(Error::Permission(format!(
                    "permission denied to read the log of {gpid}"
                )));
            }
            if !data.is_empty() || !running || !follow || tokio::time::Instant::now() > deadline {
                let end = !running && at + data.len() as u64 >= size;
                return Ok(pb::LogChunk {
                    data,
                    end,
                    at,
                    size,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The least time a detached process's log is kept after the process was collected,
/// whatever `exit_retention_ms` says: a log is there before its process is in the vproc
/// table (from the start of its shepherd to the link), and must not look abandoned then.
pub const LOG_KEEP_MIN: Duration = Duration::from_secs(5);

impl Node {
    /// How long the log of a collected process is kept: `exit_retention_ms`, at least
    /// [`LOG_KEEP_MIN`].
    pub fn log_keep(&self) -> Duration {
        Duration::from_millis(self.cfg.exit_retention_ms).max(LOG_KEEP_MIN)
    }

    /// Removes the logs of processes that are gone, [`Node::log_keep`] after they were
    /// collected (`clan_core::logfile::sweep`), looking every tenth of that (1 s to 1 min).
    pub fn start_log_sweeper(self: &Arc<Self>) {
        let keep = self.log_keep();
        let every = (keep / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
        let node = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                let Some(n) = node.upgrade() else { return };
                let _ = tokio::task::spawn_blocking(move || {
                    let dir = clan_core::logfile::dir(&n.state_dir);
                    let removed = clan_core::logfile::sweep(&dir, keep, |g| n.is_kept(g));
                    if removed > 0 {
                        tracing::debug!(removed, "removed the logs of collected processes");
                    }
                })
                .await;
            }
        });
    }
}

/// A duration given in milliseconds, as people write it: `1h`, `90s`, `250ms`.
fn human_ms(ms: u64) -> String {
    match ms {
        0 => "at once".into(),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}min", ms / 60_000),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms => format!("{ms}ms"),
    }
}

/// A pidfd of the process at the other end of a Unix socket (SO_PEERPIDFD, Linux 6.5;
/// ENOPROTOOPT on older kernels).
fn peer_pidfd(s: &tokio::net::UnixStream) -> nix::Result<OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
    const SO_PEERPIDFD: libc::c_int = 77;
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into the int we pass.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r != 0 || fd < 0 {
        return Err(nix::errno::Errno::last());
    }
    // SAFETY: on success the kernel gave us a new descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether the process of `fd` still runs (a pidfd turns readable when it exits).
fn pidfd_alive(fd: &OwnedFd) -> bool {
    use std::os::fd::AsFd;
    let mut p = [nix::poll::PollFd::new(
        fd.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    nix::poll::poll(&mut p, nix::poll::PollTimeout::ZERO) == Ok(0)
}
