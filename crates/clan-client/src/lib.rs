//! The clan client library: everything the `clan` command does, for programs.
//!
//! ```no_run
//! # async fn demo() -> Result<(), clan_client::ClientError> {
//! use clan_client::{Client, RunSpec};
//! let c = Client::locate(None, None)?;                 // CLAN_DIR / CLAN_NODE or /run/clan
//! let started = c.spawn(RunSpec::command(["sleep", "1"]).node(2)).await?;
//! let status = c.wait_one(started.gpids[0]).await?;
//! assert_eq!(status.code, 0);
//! # Ok(()) }
//! ```
//!
//! A [`Client`] talks to one node's cland over its Unix socket; requests on one client are
//! sent one at a time. Operations that block (wait, attached runs) use connections of their
//! own, so a client can be shared by tasks.

use clan_core::unixconn::{ReadHalf as OwnedReadHalf, UnixConn, WriteHalf as OwnedWriteHalf};
use clan_core::{Gpid, NodeId, WaitStatus};
use clan_proto::pb::{local_reply::Reply, local_request::Op};
use clan_proto::{read_frame, write_frame};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::BufReader;

type Reader = BufReader<OwnedReadHalf>;

mod session;
pub use session::{Session, SessionReader, SessionWriter};

mod link;
pub use link::{BlockingLink, Unanswered, LINK_AFTER, RETRY_AFTER};
use tokio::sync::Mutex;

pub use clan_proto::pb;

pub use clan_core::DEFAULT_DIR;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no cland is running at {path} (start a local cluster with `clan up`, or `systemctl start cland`)")]
    NoDaemon { path: PathBuf },
    #[error("{0}")]
    Remote(pb::Error),
    #[error("lost connection to cland: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol error: {0}")]
    Protocol(String),
}

impl ClientError {
    /// The protocol error code, when the daemon answered with one.
    pub fn code(&self) -> Option<pb::ErrorCode> {
        match self {
            ClientError::Remote(e) => Some(e.kind()),
            _ => None,
        }
    }

    /// The documented exit code of the `clan` command for this error.
    pub fn exit_code(&self) -> u8 {
        use clan_core::ExitCode as X;
        use pb::ErrorCode as C;
        match self {
            ClientError::NoDaemon { .. } => X::NO_DAEMON,
            ClientError::Remote(e) => match e.kind() {
                C::NotFound => X::NOT_FOUND,
                C::Permission => X::PERMISSION,
                C::NodeDown => X::NODE_DOWN,
                C::Invalid => X::USAGE,
                _ => X::FAILURE,
            },
            _ => X::FAILURE,
        }
    }
}

pub type Result<T> = std::result::Result<T, ClientError>;

/// What a run started: one process per node it was placed on, all in one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub gpids: Vec<Gpid>,
    pub job: u64,
    pub nodes: Vec<NodeId>,
}

impl Started {
    fn from_pb(s: pb::Started) -> Result<Started> {
        let gpids = s
            .gpids
            .iter()
            .map(|&g| {
                Gpid::from_raw(g).ok_or_else(|| ClientError::Protocol(format!("bad gpid {g}")))
            })
            .collect::<Result<_>>()?;
        Ok(Started {
            gpids,
            job: s.job,
            nodes: s.nodes.iter().filter_map(|&n| NodeId::new(n)).collect(),
        })
    }
}

/// A command to run somewhere in the cluster.
#[derive(Debug, Clone, Default)]
pub struct RunSpec {
    pub argv: Vec<Vec<u8>>,
    /// `None`: this process's environment.
    pub env: Option<Vec<Vec<u8>>>,
    /// `None`: this process's working directory.
    pub cwd: Option<PathBuf>,
    pub node: Option<NodeId>,
    pub policy: pb::Policy,
    pub count: u32,
    pub job: u64,
    pub tty: bool,
    pub winsize: (u16, u16),
    pub detached: bool,
    /// The most processes the job's task may have on each node it runs on (0: as it is).
    pub max_procs: u32,
    /// `clan shell`: /proc is the cluster view and signals to gpids go through clan.
    pub cluster_proc: bool,
    /// The signals the process starts with ignored (bit `n - 1` for signal `n`), as a local
    /// exec keeps those its caller ignored (`nohup`, a script's background job). `None`:
    /// what this process's caller left ignored ([`clan_core::sys::ignored_by_caller`]).
    pub ignored_signals: Option<u64>,
    /// An attached process's stdin is /dev/null instead of a pipe the stub feeds (the stub
    /// sends no input, not even its end).
    pub stdin_null: bool,
}

impl RunSpec {
    pub fn command<I, S>(argv: I) -> RunSpec
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        use std::os::unix::ffi::OsStrExt;
        RunSpec {
            argv: argv
                .into_iter()
                .map(|a| a.as_ref().as_bytes().to_vec())
                .collect(),
            detached: true,
            ..Default::default()
        }
    }

    pub fn node(mut self, n: u32) -> RunSpec {
        self.node = NodeId::new(n);
        self
    }

    pub fn policy(mut self, p: pb::Policy) -> RunSpec {
        self.policy = p;
        self
    }

    pub fn count(mut self, k: u32) -> RunSpec {
        self.count = k;
        self
    }

    pub fn job(mut self, j: u64) -> RunSpec {
        self.job = j;
        self
    }

    pub fn max_procs(mut self, n: u32) -> RunSpec {
        self.max_procs = n;
        self
    }

    pub fn attached(mut self) -> RunSpec {
        self.detached = false;
        self
    }

    fn to_request(&self) -> pb::RunRequest {
        use std::os::unix::ffi::{OsStrExt, OsStringExt};
        let env = self.env.clone().unwrap_or_else(|| {
            std::env::vars_os()
                .map(|(k, v)| {
                    let mut e = k.into_vec();
                    e.push(b'=');
                    e.extend_from_slice(v.as_bytes());
                    e
                })
                .collect()
        });
        let cwd = self
            .cwd
            .clone()
            .or_else(|| std::env::current_dir().ok())
            .unwrap_or_else(|| PathBuf::from("/"));
        pb::RunRequest {
            spec: Some(pb::ProcSpec {
                argv: self.argv.clone(),
                env,
                cwd: cwd.as_os_str().as_bytes().to_vec(),
                tty: self.tty,
                detached: self.detached,
                rows: u32::from(self.winsize.0),
                cols: u32::from(self.winsize.1),
                max_procs: self.max_procs,
                cluster_proc: self.cluster_proc,
                ignored_signals: self
                    .ignored_signals
                    .unwrap_or_else(clan_core::sys::ignored_by_caller),
                stdin_null: self.stdin_null,
            }),
            node: self.node.map(|n| n.get()).unwrap_or(0),
            policy: self.policy as i32,
            count: self.count,
            job: self.job,
        }
    }
}

/// The socket of a node's cland under `dir` (`dir/node<N>/cland.sock`).
pub fn socket_path(dir: &Path, node: NodeId) -> PathBuf {
    dir.join(format!("node{node}")).join("cland.sock")
}

/// What a wait reports (see [`Client::wait_for`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitOutcome {
    Exited(WaitStatus),
    Stopped(i32),
    Continued,
}

/// A connection to one node's cland.
pub struct Client {
    path: PathBuf,
    node: NodeId,
    conn: Mutex<Option<(Reader, OwnedWriteHalf)>>,
    next: AtomicU64,
    links: link::Links,
}

impl Client {
    /// Finds the cland to talk to: `node` (else `CLAN_NODE`, else the lowest node with a
    /// socket) under `dir` (else `CLAN_DIR`, else /run/clan). So a process started by clan
    /// talks to its own node.
    pub fn locate(dir: Option<&Path>, node: Option<NodeId>) -> Result<Client> {
        let dir = dir
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os("CLAN_DIR").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DIR));
        let node = node.or_else(|| std::env::var("CLAN_NODE").ok().and_then(|v| v.parse().ok()));
        let node = match node {
            Some(n) => n,
            None => {
                let mut found: Vec<NodeId> = std::fs::read_dir(&dir)
                    .map(|rd| {
                        rd.flatten()
                            .filter_map(|e| {
                                e.file_name()
                                    .to_str()?
                                    .strip_prefix("node")?
                                    .parse::<NodeId>()
                                    .ok()
                            })
                            .filter(|n| socket_path(&dir, *n).exists())
                            .collect()
                    })
                    .unwrap_or_default();
                found.sort();
                match found.first() {
                    Some(n) => *n,
                    None => {
                        return Err(ClientError::NoDaemon {
                            path: socket_path(&dir, NodeId::new(1).expect("1 is a node")),
                        })
                    }
                }
            }
        };
        Ok(Client::at(socket_path(&dir, node), node))
    }

    /// A client for the socket at `path` (node `node`). With `CLAN_LINKS=0` in the
    /// environment, it opens no direct links ([`Client::without_links`]).
    pub fn at(path: PathBuf, node: NodeId) -> Client {
        let client = Client {
            path,
            node,
            conn: Mutex::new(None),
            next: AtomicU64::new(1),
            links: link::Links::default(),
        };
        match std::env::var("CLAN_LINKS") {
            Ok(v) if v == "0" => client.without_links(),
            _ => client,
        }
    }

    /// This client with every request through its cland: no direct links to other nodes
    /// (docs/links.md), as a one-shot command would.
    pub fn without_links(mut self) -> Client {
        self.links.off = true;
        self
    }

    /// The node this client talks to.
    pub fn node(&self) -> NodeId {
        self.node
    }

    async fn open(&self) -> Result<(Reader, OwnedWriteHalf)> {
        match UnixConn::connect(&self.path).await {
            Ok(s) => {
                let (r, w) = s.into_split();
                Ok((BufReader::new(r), w))
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) =>
            {
                Err(ClientError::NoDaemon {
                    path: self.path.clone(),
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn request_on(
        rd: &mut Reader,
        wr: &mut OwnedWriteHalf,
        id: u64,
        op: Op,
    ) -> Result<Reply> {
        write_frame(wr, &pb::LocalRequest { id, op: Some(op) }).await?;
        reply_of(read_frame(rd).await)
    }

    /// Sends one request on the shared connection.
    pub async fn request(&self, op: Op) -> Result<Reply> {
        let mut guard = self.conn.lock().await;
        if guard.is_none() {
            *guard = Some(self.open().await?);
        }
        let (rd, wr) = guard.as_mut().expect("just opened");
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let r = Self::request_on(rd, wr, id, op).await;
        if matches!(r, Err(ClientError::Io(_)) | Err(ClientError::Protocol(_))) {
            *guard = None;
        }
        r
    }

    /// Sends one request on a connection of its own (for requests that block).
    pub async fn request_alone(&self, op: Op) -> Result<Reply> {
        let (mut rd, mut wr) = self.open().await?;
        Self::request_on(&mut rd, &mut wr, 1, op).await
    }

    /// Starts a detached process (or `count` of them): returns at once.
    pub async fn spawn(&self, spec: RunSpec) -> Result<Started> {
        let mut spec = spec;
        spec.detached = true;
        match self.request(Op::Run(spec.to_request())).await? {
            Reply::Started(s) => Started::from_pb(s),
            other => Err(unexpected(other)),
        }
    }

    /// Starts attached processes: their output, signals and exit come through the session.
    pub async fn run(&self, spec: RunSpec) -> Result<Session> {
        self.run_signalled(spec, &mut tokio::sync::mpsc::unbounded_channel().1)
            .await
    }

    /// [`Client::run`], with the caller's signals for the processes while they start
    /// (`signals`, before their gpids are known): cland gives them to the processes
    /// starting, so that a Ctrl-C reaches one whose exec hangs (on a mount that does not
    /// answer), as the kernel would give it to a local one. Those that come once the
    /// session is returned are the caller's to send on it.
    pub async fn run_signalled(
        &self,
        spec: RunSpec,
        signals: &mut tokio::sync::mpsc::UnboundedReceiver<i32>,
    ) -> Result<Session> {
        let mut spec = spec;
        spec.detached = false;
        let (mut rd, mut wr) = self.open().await?;
        let run = pb::LocalRequest {
            id: 1,
            op: Some(Op::Run(spec.to_request())),
        };
        write_frame(&mut wr, &run).await?;
        let read = {
            // Polled to its end, never dropped halfway (a frame read is not cancel safe).
            let read = read_frame::<pb::LocalReply, _>(&mut rd);
            tokio::pin!(read);
            let mut open = true;
            loop {
                tokio::select! {
                    biased;
                    r = &mut read => break r,
                    sig = signals.recv(), if open => match sig {
                        Some(sig) => {
                            let op = Op::Input(pb::SessionInput {
                                gpid: 0,
                                input: Some(pb::session_input::Input::StartSignal(sig)),
                            });
                            // A broken connection is told by the reply.
                            let _ = write_frame(&mut wr, &pb::LocalRequest { id: 0, op: Some(op) })
                                .await;
                        }
                        None => open = false,
                    },
                }
            }
        };
        match reply_of(read)? {
            Reply::Started(s) => {
                let reattach_ms = s.reattach_ms;
                let started = Started::from_pb(s)?;
                Ok(Session::new(
                    started,
                    rd,
                    wr,
                    self.path.clone(),
                    reattach_ms,
                ))
            }
            other => Err(unexpected(other)),
        }
    }

    /// Runs one process attached, discards its output, and returns how it ended once it
    /// has been reaped (as `std::process::Command::status`).
    pub async fn run_status(&self, spec: RunSpec) -> Result<WaitStatus> {
        let (started, mut rd, mut wr) = self.run(spec).await?.split();
        let gpid = *started
            .gpids
            .first()
            .ok_or_else(|| ClientError::Protocol("no process started".into()))?;
        loop {
            match rd.next().await? {
                Some(pb::SessionOutput {
                    output: Some(pb::session_output::Output::Exited(st)),
                    ..
                }) => {
                    wr.send(gpid, pb::session_input::Input::Release(true))
                        .await?;
                    wr.close(std::time::Duration::from_secs(1)).await;
                    return Ok(st.into());
                }
                Some(pb::SessionOutput {
                    output: Some(pb::session_output::Output::Lost(e)),
                    ..
                }) => return Err(ClientError::Remote(e)),
                Some(_) => {}
                None => return Err(ClientError::Protocol("session closed".into())),
            }
        }
    }

    /// Signals processes on any node; one result per gpid.
    pub async fn kill(
        &self,
        gpids: &[Gpid],
        signal: i32,
    ) -> Result<Vec<(Gpid, std::result::Result<(), pb::Error>)>> {
        self.kill_with(gpids, signal, None).await
    }

    /// Queues `signal` with `value` to processes on any node, as sigqueue(3): each
    /// receiver's siginfo has `SI_QUEUE`, the value and the caller's uid; its `si_pid` is
    /// 0, as the kernel gives a signal from outside the receiver's pid namespace. One
    /// result per gpid.
    pub async fn sigqueue(
        &self,
        gpids: &[Gpid],
        signal: i32,
        value: i64,
    ) -> Result<Vec<(Gpid, std::result::Result<(), pb::Error>)>> {
        self.kill_with(gpids, signal, Some(pb::Queued { value }))
            .await
    }

    async fn kill_with(
        &self,
        gpids: &[Gpid],
        signal: i32,
        queued: Option<pb::Queued>,
    ) -> Result<Vec<(Gpid, std::result::Result<(), pb::Error>)>> {
        // One process of another node: on the link to it, once there is one.
        if let [g] = gpids {
            if g.node() != self.node {
                let op = pb::peer_request::Op::Signal(pb::SignalRequest {
                    gpid: g.raw(),
                    signal,
                    queued,
                });
                let res = match self.links.send(&self.path, g.node(), op, false).await? {
                    link::Sent::NoLink => None,
                    link::Sent::Answered(pb::peer_reply::Reply::Ok(_)) => Some(Ok(())),
                    link::Sent::Answered(pb::peer_reply::Reply::Error(e)) => Some(Err(e)),
                    link::Sent::Answered(other) => {
                        return Err(ClientError::Protocol(format!("unexpected reply {other:?}")))
                    }
                    // Perhaps delivered: not sent again (as cland does when its own
                    // connection to the node breaks).
                    link::Sent::Lost(e) => Some(Err(e)),
                };
                if let Some(r) = res {
                    return Ok(vec![(*g, r)]);
                }
            }
        }
        let op = Op::Kill(pb::KillRequest {
            gpids: gpids.iter().map(|g| g.raw()).collect(),
            signal,
            queued,
        });
        match self.request(op).await? {
            Reply::Kill(k) => Ok(k
                .results
                .into_iter()
                .zip(gpids)
                .map(|(r, &g)| (g, r.error.map_or(Ok(()), Err)))
                .collect()),
            other => Err(unexpected(other)),
        }
    }

    /// sigsendset: signals every process in the set `expr` describes (see
    /// `clan_core::sigset`); one result per process matched (delivered, or why not) and one
    /// per node that could not answer (gpid `None`).
    pub async fn sigsend(
        &self,
        expr: &str,
        signal: i32,
    ) -> Result<Vec<(Option<Gpid>, std::result::Result<(), pb::Error>)>> {
        let op = Op::Sigsend(pb::SigsendRequest {
            expr: expr.to_string(),
            signal,
            fan_out: false,
        });
        match self.request(op).await? {
            Reply::Kill(k) => Ok(k
                .results
                .into_iter()
                .map(|r| (Gpid::from_raw(r.gpid), r.error.map_or(Ok(()), Err)))
                .collect()),
            other => Err(unexpected(other)),
        }
    }

    /// Signals one process.
    pub async fn kill_one(&self, gpid: Gpid, signal: i32) -> Result<()> {
        let r = self.kill(&[gpid], signal).await?;
        r.into_iter()
            .next()
            .map(|(_, r)| r.map_err(ClientError::Remote))
            .unwrap_or(Ok(()))
    }

    /// Waits for processes the caller started; one status per gpid.
    pub async fn wait(
        &self,
        gpids: &[Gpid],
    ) -> Result<Vec<(Gpid, std::result::Result<WaitStatus, pb::Error>)>> {
        Ok(self
            .wait_for(gpids, false, false)
            .await?
            .into_iter()
            .map(|(g, r)| {
                let r = r.and_then(|o| match o {
                    WaitOutcome::Exited(s) => Ok(s),
                    _ => Err(pb::Error::new(pb::ErrorCode::Internal, "no exit status")),
                });
                (g, r)
            })
            .collect())
    }

    /// Waits for the next state change of each process the caller started, as waitpid(2)
    /// with WUNTRACED (`untraced`) and WCONTINUED (`continued`): an exit (the process is then
    /// reaped), or a stop or continue not reported before.
    pub async fn wait_for(
        &self,
        gpids: &[Gpid],
        untraced: bool,
        continued: bool,
    ) -> Result<Vec<(Gpid, std::result::Result<WaitOutcome, pb::Error>)>> {
        let op = Op::Wait(pb::WaitRequest {
            gpids: gpids.iter().map(|g| g.raw()).collect(),
            untraced,
            continued,
        });
        match self.request_alone(op).await? {
            Reply::Wait(w) => Ok(w
                .results
                .into_iter()
                .zip(gpids)
                .map(|(r, &g)| match (r.status, r.error) {
                    (_, Some(e)) => (g, Err(e)),
                    (Some(s), None) => (g, Ok(WaitOutcome::Exited(s.into()))),
                    (None, None) if r.stopped != 0 => (g, Ok(WaitOutcome::Stopped(r.stopped))),
                    (None, None) if r.continued => (g, Ok(WaitOutcome::Continued)),
                    (None, None) => (g, Err(pb::Error::new(pb::ErrorCode::Internal, "no status"))),
                })
                .collect()),
            other => Err(unexpected(other)),
        }
    }

    /// Waits for one process.
    pub async fn wait_one(&self, gpid: Gpid) -> Result<WaitStatus> {
        let r = self.wait(&[gpid]).await?;
        r.into_iter()
            .next()
            .map(|(_, r)| r.map_err(ClientError::Remote))
            .unwrap_or_else(|| Err(ClientError::Protocol("no result".into())))
    }

    /// Processes of the cluster (or of `nodes`), per node, queried in parallel.
    pub async fn ps(&self, filter: pb::PsFilter, nodes: &[NodeId]) -> Result<Vec<pb::NodePs>> {
        let op = Op::Ps(pb::PsRequest {
            filter: Some(filter),
            nodes: nodes.iter().map(|n| n.get()).collect(),
        });
        match self.request(op).await? {
            Reply::Ps(p) => Ok(p.nodes),
            other => Err(unexpected(other)),
        }
    }

    /// A job operation (list, suspend, resume, kill) on the tasks of a job on `nodes`
    /// (empty: every node), answered per node. A kill sends `signal` (give SIGKILL
    /// explicitly: 0 is kill(1)'s signal 0, which checks that the job exists and may be
    /// signalled, and sends nothing).
    pub async fn job(
        &self,
        action: pb::JobAction,
        job: u64,
        nodes: &[NodeId],
        signal: i32,
        method: &str,
    ) -> Result<Vec<pb::NodeJobs>> {
        let op = Op::Job(pb::JobRequest {
            action: action as i32,
            job,
            nodes: nodes.iter().map(|n| n.get()).collect(),
            signal,
            method: method.to_string(),
            ..Default::default()
        });
        match self.request(op).await? {
            Reply::Job(j) => Ok(j.nodes),
            other => Err(unexpected(other)),
        }
    }

    /// Suspends job `suspend` and then resumes job `resume` on each node (all nodes when
    /// `nodes` is empty), in one request per node: a gang scheduler's row switch. Each
    /// node reports both tasks (the suspended one first) once both are verified.
    pub async fn job_switch(
        &self,
        suspend: u64,
        resume: u64,
        nodes: &[NodeId],
        method: &str,
    ) -> Result<Vec<pb::NodeJobs>> {
        self.job_request(pb::JobRequest {
            action: pb::JobAction::JobSwitch as i32,
            job: suspend,
            resume,
            nodes: nodes.iter().map(|n| n.get()).collect(),
            method: method.to_string(),
            ..Default::default()
        })
        .await
    }

    /// Any job request (adopt, subtree operations): answered per node.
    pub async fn job_request(&self, req: pb::JobRequest) -> Result<Vec<pb::NodeJobs>> {
        match self.request(Op::Job(req)).await? {
            Reply::Job(j) => Ok(j.nodes),
            other => Err(unexpected(other)),
        }
    }

    /// Makes the local process `pid` (in the caller's numbers) and its descendants a new
    /// job's task on the node this client talks to; returns the task.
    pub async fn job_adopt(&self, pid: u32) -> Result<pb::TaskInfo> {
        let nodes = self
            .job_request(pb::JobRequest {
                action: pb::JobAction::JobAdopt as i32,
                pid,
                ..Default::default()
            })
            .await?;
        let n = nodes.into_iter().next().ok_or_else(|| {
            ClientError::Remote(pb::Error::new(pb::ErrorCode::Internal, "no answer"))
        })?;
        if let Some(e) = n.error {
            return Err(ClientError::Remote(e));
        }
        n.tasks
            .into_iter()
            .next()
            .ok_or_else(|| ClientError::Remote(pb::Error::new(pb::ErrorCode::Internal, "no task")))
    }

    /// A request on the cluster /proc (listings, a process's files, links and directories
    /// with pids as gpids, cluster files): see `ProcOp` in proto/clan.proto.
    pub async fn proc(&self, req: pb::ProcRequest) -> Result<pb::ProcReply> {
        use pb::ProcOp as P;
        // A file of a process of another node: on the link to it, once there is one (a
        // read the link lost is asked again through cland: reads change nothing).
        let one_process = matches!(
            P::try_from(req.op),
            Ok(P::ProcRead | P::ProcReadlink | P::ProcReaddir | P::ProcStatLink)
        );
        if let Some(g) = Gpid::from_raw(req.gpid).filter(|g| one_process && g.node() != self.node) {
            let op = pb::peer_request::Op::Proc(req.clone());
            match self.links.send(&self.path, g.node(), op, false).await? {
                link::Sent::Answered(pb::peer_reply::Reply::Proc(p)) => return Ok(p),
                link::Sent::Answered(pb::peer_reply::Reply::Error(e)) => {
                    return Err(ClientError::Remote(e))
                }
                link::Sent::Answered(other) => {
                    return Err(ClientError::Protocol(format!("unexpected reply {other:?}")))
                }
                link::Sent::NoLink | link::Sent::Lost(_) => {}
            }
        }
        match self.request(Op::Proc(req)).await? {
            Reply::Proc(p) => Ok(p),
            other => Err(unexpected(other)),
        }
    }

    /// A request on the direct link to `node` (docs/links.md), opened now if there is
    /// none: what [`Client::kill`] and [`Client::proc`] use by themselves after a few
    /// requests to one node. The node serves signals to its processes and reads of their
    /// /proc files on it, as this client's credentials; anything else is refused.
    pub async fn link_request(
        &self,
        node: NodeId,
        op: pb::peer_request::Op,
    ) -> Result<pb::peer_reply::Reply> {
        match self.links.send(&self.path, node, op, true).await? {
            link::Sent::Answered(pb::peer_reply::Reply::Error(e)) => Err(ClientError::Remote(e)),
            link::Sent::Answered(r) => Ok(r),
            link::Sent::Lost(e) => Err(ClientError::Remote(e)),
            link::Sent::NoLink => Err(ClientError::Protocol(format!(
                "no link to node {node} now (one is being opened, or one broke: another is tried within {} s)",
                link::RETRY_AFTER.as_secs()
            ))),
        }
    }

    /// The nodes of the cluster with their state and load.
    pub async fn nodes(&self) -> Result<Vec<pb::NodeInfo>> {
        match self.request(Op::Nodes(pb::NodesRequest {})).await? {
            Reply::Nodes(n) => Ok(n.nodes),
            other => Err(unexpected(other)),
        }
    }

    /// Output of a detached process from `offset`.
    pub async fn logs(&self, gpid: Gpid, offset: u64, follow: bool) -> Result<pb::LogChunk> {
        match self
            .request(Op::Logs(pb::LogsRequest {
                gpid: gpid.raw(),
                follow,
                offset,
            }))
            .await?
        {
            Reply::Log(c) => Ok(c),
            other => Err(unexpected(other)),
        }
    }

    /// Lock statistics of every node (or of `nodes`).
    pub async fn lock_stats(&self, nodes: &[NodeId]) -> Result<Vec<pb::NodeLockStats>> {
        match self
            .request(Op::Stats(pb::StatsRequest {
                nodes: nodes.iter().map(|n| n.get()).collect(),
            }))
            .await?
        {
            Reply::Stats(s) => Ok(s.nodes),
            other => Err(unexpected(other)),
        }
    }

    /// Registers, removes or shows this node's load manager.
    pub async fn loadmgr(&self, action: pb::load_mgr_request::Action) -> Result<String> {
        match self
            .request(Op::Loadmgr(pb::LoadMgrRequest {
                action: Some(action),
            }))
            .await?
        {
            Reply::Loadmgr(l) => Ok(l.description),
            other => Err(unexpected(other)),
        }
    }

    /// Stops this node's cland (and, with `kill`, every process of the node).
    pub async fn shutdown(&self, kill: bool) -> Result<()> {
        self.request(Op::Shutdown(pb::ShutdownRequest {
            kill_processes: kill,
        }))
        .await
        .map(|_| ())
    }
}

/// A reply read from cland, or why there is none.
fn reply_of(
    read: std::result::Result<Option<pb::LocalReply>, clan_proto::FrameError>,
) -> Result<Reply> {
    let reply = read
        .map_err(|e| ClientError::Protocol(e.to_string()))?
        .ok_or_else(|| {
            ClientError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "cland closed the connection",
            ))
        })?;
    match reply.reply {
        Some(Reply::Error(e)) => Err(ClientError::Remote(e)),
        Some(r) => Ok(r),
        None => Err(ClientError::Protocol("empty reply".into())),
    }
}

fn unexpected(r: Reply) -> ClientError {
    ClientError::Protocol(format!("unexpected reply {r:?}"))
}
