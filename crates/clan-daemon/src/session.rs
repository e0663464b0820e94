//! Attached processes: the stub's stdio, signals and exit status (DESIGN.md 7).
//!
//! The stub (`clan run`) talks to its own node over the local socket. For each process of
//! the run, that node either attaches to the local vproc or opens a *session* connection to
//! the process's node, which starts the process and relays between the session and the
//! shepherd. Output flows back with backpressure all the way to the process's pipes. When
//! the stub goes away without releasing, the process is hung up and orphaned: its pipes
//! break and its shepherd reaps it when it exits, as with a local process whose parent died.
//!
//! A session that breaks while the stub lives (a cland restarted on either end) is taken up
//! again: the process is *parked* (its output held in its pipes) for `reattach_ms`, the stub
//! reattaches with the byte counts of what it has, and the shepherd resends from there
//! (`Resumed`, then the output it kept, then on). Parked processes no stub comes back for
//! are hung up.

use crate::error::{Error, Result};
use crate::node::{Deferred, Node};
use crate::peer::{DialError, Peer};
use crate::process::vproc::{PendingSignals, Refused, SpawnLocal, VProc};
use clan_core::{Gpid, NodeId};
use clan_proto::auth::{PeerReader, PeerWriter};
use clan_proto::pb::{self, peer_frame::Frame, session_input::Input, shepherd_in::Msg as In};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::io::BufReader;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};

/// One process of a run, seen from the stub's node.
pub enum Endpoint {
    /// On this node: the vproc and the number of the session the stub has of it.
    Local(Arc<VProc>, u64),
    /// On another node: the session connection's input, and the refill of the spare
    /// session connections to that node, put off until the stub has its answer
    /// ([`Endpoint::answered`]).
    Remote(mpsc::UnboundedSender<pb::SessionInput>, Option<Deferred>),
}

impl Endpoint {
    pub fn input(&self, gpid: Gpid, input: Input) {
        match self {
            Endpoint::Local(vp, session) => {
                if let Some(m) = to_shepherd(input) {
                    vp.send_from(*session, m);
                }
            }
            Endpoint::Remote(tx, _) => {
                let _ = tx.send(pb::SessionInput {
                    gpid: gpid.raw(),
                    input: Some(input),
                });
            }
        }
    }

    /// The stub has the run's answer: what the start put off may go on.
    pub fn answered(&mut self) {
        if let Endpoint::Remote(_, refill) = self {
            drop(refill.take());
        }
    }

    /// The stub is gone without collecting the status: hang the process up.
    pub fn orphan(self, gpid: Gpid) {
        match self {
            Endpoint::Local(vp, _) => vp.hang_up(),
            // Said before the connection closes, which alone would park the process.
            Endpoint::Remote(tx, _) => {
                let _ = tx.send(pb::SessionInput {
                    gpid: gpid.raw(),
                    input: Some(Input::HangUp(true)),
                });
            }
        }
    }
}

/// What an input from the stub tells the shepherd (`None`: nothing, it is for cland).
fn to_shepherd(input: Input) -> Option<In> {
    Some(match input {
        Input::Stdin(d) => In::Stdin(d),
        Input::StdinEof(_) => In::StdinEof(true),
        Input::Signal(s) => In::Signal(s),
        Input::StartSignal(s) => In::StartSignal(s),
        Input::Resize(w) => In::Resize(w),
        Input::Release(_) => In::Release(true),
        Input::Background(b) => In::Background(b),
        Input::Ack(a) => In::Acked(a),
        Input::CloseStdout(_) => In::CloseStdout(true),
        Input::Reattach(_) | Input::HangUp(_) => return None,
    })
}

/// What one process of a run needs to start.
pub struct Start {
    pub target: NodeId,
    pub spec: pb::ProcSpec,
    pub creds: pb::Creds,
    pub job: u64,
    pub rank: u32,
    pub size: u32,
    /// Gpid of the process that ran `clan run` (0: none in the cluster).
    pub parent: u64,
    /// The stub's signals while the process starts.
    pub pending: Arc<PendingSignals>,
}

impl Node {
    /// Starts one attached process on `s.target`; its output goes to `out`.
    pub async fn start_attached(
        self: &Arc<Self>,
        s: Start,
        out: mpsc::Sender<pb::SessionOutput>,
    ) -> Result<(Gpid, Endpoint)> {
        if s.target == self.id {
            let vp = self
                .spawn_local_to(
                    SpawnLocal {
                        spec: s.spec,
                        creds: s.creds,
                        job: s.job,
                        rank: s.rank,
                        size: s.size,
                        parent_node: self.id,
                        parent: s.parent,
                        pending: Some(s.pending.clone()),
                    },
                    Some(out),
                )
                .await?;
            // A new process: its first session, number 0.
            return Ok((vp.gpid, Endpoint::Local(vp, 0)));
        }
        let req = pb::PeerFrame {
            frame: Some(Frame::Request(pb::PeerRequest {
                id: 1,
                creds: Some(s.creds.clone()),
                op: Some(pb::peer_request::Op::Spawn(pb::SpawnRequest {
                    spec: Some(s.spec),
                    creds: Some(s.creds.clone()),
                    job: s.job,
                    rank: s.rank,
                    size: s.size,
                    parent_node: self.id.get(),
                    parent: s.parent,
                })),
            })),
        };
        crate::peer::check_request_size(&req)?;
        let started = self
            .remote_session(s.target, &req, out, "start", Some(&s.pending))
            .await?;
        self.note_member(s.target, &s.creds);
        Ok(started)
    }

    /// A new session to attached process `from.gpid`, whose stub's session broke: on this
    /// node the vproc itself, elsewhere a session connection opened with a reattach (tried
    /// again while its node is away or restarting, for `reattach_ms`).
    pub async fn reattach_endpoint(
        self: &Arc<Self>,
        from: pb::ResumeFrom,
        creds: &pb::Creds,
        out: mpsc::Sender<pb::SessionOutput>,
    ) -> Result<Endpoint> {
        let gpid = Gpid::from_raw(from.gpid)
            .ok_or_else(|| Error::NotFound(format!("no such process {}", from.gpid)))?;
        let req = pb::PeerFrame {
            frame: Some(Frame::Request(pb::PeerRequest {
                id: 1,
                creds: Some(creds.clone()),
                op: Some(pb::peer_request::Op::Reattach(pb::ReattachRequest {
                    items: vec![from],
                })),
            })),
        };
        let (node, window) = (gpid.node(), self.cfg.reattach());
        let until = tokio::time::Instant::now() + window;
        loop {
            let taken = if node == self.id {
                self.reattach_local(&from, creds, out.clone(), self.id)
                    .map(|(vp, session)| Endpoint::Local(vp, session))
            } else {
                self.remote_session(node, &req, out.clone(), "reattach", None)
                    .await
                    .map(|(_, ep)| ep)
            };
            match taken {
                Ok(ep) => return Ok(ep),
                // Not answering yet (its cland restarts): again, unless it is lost for good.
                Err(Error::NodeDown(m)) => {
                    if self.peer_lost(node) {
                        return Err(Error::NodeDown(format!(
                            "node {node} died; process {gpid} is lost"
                        )));
                    }
                    if tokio::time::Instant::now() >= until {
                        return Err(Error::NodeDown(format!(
                            "node {node} did not come back within {} ms ({m}); process {gpid} is lost",
                            window.as_millis()
                        )));
                    }
                    debug!(%gpid, "reattach: {m}; trying again");
                    tokio::time::sleep(REATTACH_RETRY).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether node `id` is dead (its processes lost), not only away or restarting.
    pub fn peer_lost(&self, id: NodeId) -> bool {
        self.peer(id)
            .is_ok_and(|p| p.state_name(&self.cfg, self.started) == "dead")
    }

    /// Sends `req` (a spawn or a reattach) on a session connection to `target` and, once it
    /// answers with the process's gpid, relays between that connection and `out`.
    async fn remote_session(
        self: &Arc<Self>,
        target: NodeId,
        req: &pb::PeerFrame,
        out: mpsc::Sender<pb::SessionOutput>,
        what: &str,
        pending: Option<&PendingSignals>,
    ) -> Result<(Gpid, Endpoint)> {
        let peer = self.peer(target)?.clone();
        let lost = |e: &dyn std::fmt::Display| Error::NodeDown(format!("node {target}: {e}"));
        // Watched from before the request: a reply lost in a cut link never comes, and the
        // peer's death (or goodbye) is what ends the wait, here and in the relay after it.
        let mut deaths = peer.deaths.subscribe();
        let exchange = async {
            // A spare connection saves the connect and handshake. One that went stale (the
            // peer's cland restarted or closed it) is seen before anything is sent on it,
            // and dropped. Once the request is written it is never sent again: a reply
            // that does not come may be a process that started all the same (its cland
            // restarted between the start and the reply), and a second one would run twice.
            let spare = self.take_fresh_session(&peer);
            let from_spare = spare.is_some();
            // The last spare taken (or none left): the pool is made again. Otherwise the
            // connections sessions give back keep it: a refill racing a session's return
            // would dial a connection only to close it.
            let last = peer.spare_sessions.lock().is_empty();
            let (mut rd, mut wr) = match spare {
                Some(c) => c,
                None => self.open_session(&peer).await?,
            };
            let mut r = ask(&mut rd, &mut wr, req, pending).await;
            if from_spare && matches!(r, Err(Asked::Unsent(_))) {
                // Not written whole (a spare that broke between its look and the write):
                // the peer can not have taken it, so it goes on a fresh connection.
                (rd, wr) = self.open_session(&peer).await?;
                r = ask(&mut rd, &mut wr, req, pending).await;
            }
            let r = r.map_err(|e| match e {
                Asked::Unsent(e) => lost(&e),
                Asked::Unanswered(e) => Error::NodeDown(format!(
                    "node {target}: the session broke after the {what} was sent ({e}); \
                     not sent again (it may have been done there)"
                )),
            })?;
            Ok::<_, Error>((rd, wr, r, last))
        };
        let (rd, wr, reply, last) = tokio::select! {
            r = exchange => r?,
            _ = deaths.changed() => {
                return Err(Error::NodeDown(format!(
                    "node {target} went down before it answered the {what}"
                )))
            }
        };
        let refill = last.then(|| {
            let (node, spare) = (self.clone(), peer.clone());
            Deferred::new(async move { node.refill_sessions(&spare).await })
        });
        let gpid = match reply {
            pb::peer_reply::Reply::Started(st) => st
                .gpids
                .first()
                .copied()
                .and_then(Gpid::from_raw)
                .ok_or_else(|| Error::Internal("no gpid in reply".into()))?,
            pb::peer_reply::Reply::Error(e) => return Err(e.into()),
            other => return Err(Error::Internal(format!("unexpected reply {other:?}"))),
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let (back, reader) = oneshot::channel();
        tokio::spawn(relay_to_remote(
            self.clone(),
            peer.clone(),
            wr,
            rx,
            reader,
            deaths.clone(),
        ));
        tokio::spawn(relay_from_remote(
            self.clone(),
            rd,
            out,
            gpid,
            target,
            deaths,
            back,
        ));
        Ok((gpid, Endpoint::Remote(tx, refill)))
    }

    /// Subscribes `out` to the local attached process `from.gpid` for a stub that
    /// reattaches, and has its shepherd resend from the stub's offsets; returns the vproc
    /// and the session's number. Asked from the stub's node (`by`), it takes the process
    /// over from a session whose end was not noticed (a connection left half open);
    /// asked from elsewhere, only a parked process.
    pub fn reattach_local(
        &self,
        from: &pb::ResumeFrom,
        creds: &pb::Creds,
        out: mpsc::Sender<pb::SessionOutput>,
        by: NodeId,
    ) -> Result<(Arc<VProc>, u64)> {
        let gpid = Gpid::from_raw(from.gpid)
            .ok_or_else(|| Error::NotFound(format!("no such process {}", from.gpid)))?;
        let vp = self.vproc(gpid)?;
        if vp.detached {
            return Err(Error::Invalid(format!(
                "process {gpid} is detached: there is no session to reattach (see `clan logs`)"
            )));
        }
        if creds.uid != 0 && creds.uid != vp.uid {
            return Err(Error::Permission(format!(
                "process {gpid} belongs to another user"
            )));
        }
        let session = vp
            .reattach(out, *from, by == vp.parent_node)
            .map_err(|r| match r {
                Refused::HungUp => Error::NotFound(format!(
                    "process {gpid} was hung up: its stub came too late"
                )),
                // Retried by the stub's node: the old session's end may not be noticed yet.
                Refused::Attached => {
                    Error::NodeDown(format!("process {gpid} is still attached to a session"))
                }
            })?;
        info!(%gpid, session, "stub reattached");
        Ok((vp, session))
    }

    /// A session of attached process `vp` broke but its stub may come back: hold its
    /// output and wait `reattach_ms` for a reattach, then hang it up. Nothing if a newer
    /// session than `session` has it already.
    /// The stub's node is the process's `parent_node`; if that node is declared dead
    /// meanwhile, the process is hung up then.
    pub fn park(self: &Arc<Self>, vp: &Arc<VProc>, session: u64) {
        if !vp.hold(session) {
            return;
        }
        let (node, vp, window) = (self.clone(), vp.clone(), self.cfg.reattach());
        info!(gpid = %vp.gpid, "session broke: parked for {} ms, until its stub reattaches", window.as_millis());
        tokio::spawn(async move {
            let stub_node = vp.parent_node;
            let mut deaths = node.peer(stub_node).ok().map(|p| p.deaths.subscribe());
            let mut gone = vp.gone.subscribe();
            let stub_lost = async {
                match &mut deaths {
                    Some(d) => {
                        while !node.peer_lost(stub_node) {
                            if d.changed().await.is_err() {
                                std::future::pending::<()>().await;
                            }
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            // A stub that is stopped (^Z) can not come back before it is continued: the
            // process waits for it as long as it lives stopped, asked once per window.
            let waited = async {
                tokio::time::sleep(window).await;
                let mut told = false;
                while vp.session() == session && node.stub_stopped_far(&vp).await {
                    if !std::mem::replace(&mut told, true) {
                        info!(gpid = %vp.gpid, "its stub is stopped: parked until it comes back");
                    }
                    tokio::time::sleep(window).await;
                }
            };
            let why = tokio::select! {
                _ = waited => format!("no stub reattached within {} ms", window.as_millis()),
                _ = gone.wait_for(|g| *g) => return,
                _ = stub_lost => format!("node {stub_node} of its stub died"),
            };
            if vp.hang_up_if(session) {
                warn!(gpid = %vp.gpid, "{why}: hung up");
            }
        });
    }
}

/// TCP keepalive on a session connection, which may carry nothing for hours: a connection
/// whose other end vanished without a word (its machine reset) is noticed about three
/// seconds after twice `dead_after` of silence, and its process parked or its stub told.
pub fn keep_alive(s: &TcpStream, dead_after: std::time::Duration) {
    use nix::sys::socket::{setsockopt, sockopt};
    let idle = (dead_after.as_secs() * 2).clamp(1, 3600) as u32;
    let _ = setsockopt(s, sockopt::KeepAlive, &true);
    let _ = setsockopt(s, sockopt::TcpKeepIdle, &idle);
    let _ = setsockopt(s, sockopt::TcpKeepInterval, &1);
    let _ = setsockopt(s, sockopt::TcpKeepCount, &3);
}

/// How often a reattach tries a node that does not answer yet.
const REATTACH_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// A session connection: authenticated, its first request not yet sent.
pub type SessionConn = (
    PeerReader<BufReader<OwnedReadHalf>>,
    PeerWriter<OwnedWriteHalf>,
);

/// Spare session connections made ready per peer when a start took the last one, once its
/// stub has the answer.
const SPARE_SESSIONS: usize = 2;

/// The most spare session connections kept per peer, counting those that sessions gave
/// back: sequential starts then find one given back and dial none.
const KEPT_SESSIONS: usize = 4;

/// Why a session's first request got no reply.
enum Asked {
    /// Its frame was not written whole: the peer can not have taken it.
    Unsent(String),
    /// It was written, and then the connection broke or said something else: the peer
    /// may have done it.
    Unanswered(String),
}

/// Sends the session's first request (a spawn or a reattach) and reads its reply; the
/// stub's signals meanwhile (`pending`) follow the spawn on the connection, for the
/// process that is starting.
async fn ask(
    rd: &mut PeerReader<BufReader<OwnedReadHalf>>,
    wr: &mut PeerWriter<OwnedWriteHalf>,
    req: &pb::PeerFrame,
    pending: Option<&PendingSignals>,
) -> std::result::Result<pb::peer_reply::Reply, Asked> {
    wr.write(req)
        .await
        .map_err(|e| Asked::Unsent(e.to_string()))?;
    let reply = rd.read();
    tokio::pin!(reply);
    let read = loop {
        match PendingSignals::answer_or_signals(pending, &mut reply).await {
            Ok(r) => break r,
            Err(sigs) => {
                for sig in sigs {
                    let f = pb::PeerFrame {
                        frame: Some(Frame::Input(pb::SessionInput {
                            gpid: 0,
                            input: Some(Input::StartSignal(sig)),
                        })),
                    };
                    // A broken connection is told by the reply.
                    let _ = wr.write(&f).await;
                }
            }
        }
    };
    match read {
        Ok(Some(pb::PeerFrame {
            frame: Some(Frame::Reply(pb::PeerReply { reply: Some(r), .. })),
        })) => Ok(r),
        Ok(Some(_)) => Err(Asked::Unanswered("unexpected frame".into())),
        Ok(None) => Err(Asked::Unanswered("connection closed".into())),
        Err(e) => Err(Asked::Unanswered(e.to_string())),
    }
}

/// Whether a spare session connection is no longer fit for a first request: anything to
/// read on it (the peer says nothing before it is asked), an end of stream (its cland
/// restarted or closed it) or an error. One non-blocking peek, which consumes nothing.
fn stale(rd: &PeerReader<BufReader<OwnedReadHalf>>) -> bool {
    let sock: &TcpStream = rd.get_ref().get_ref().as_ref();
    !rd.get_ref().buffer().is_empty() || readable_now(sock)
}

/// Whether `sock` has data, an end of stream or an error waiting, asked of the kernel
/// without blocking and without consuming anything (not from the runtime's readiness,
/// which may not have seen the latest event yet).
fn readable_now(sock: &impl std::os::fd::AsRawFd) -> bool {
    use nix::sys::socket::{recv, MsgFlags};
    let mut byte = [0u8; 1];
    let peeked = recv(
        sock.as_raw_fd(),
        &mut byte,
        MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
    );
    // Anything but "nothing yet": data, 0 (an end of stream) or an error (a reset).
    !matches!(peeked, Err(nix::errno::Errno::EAGAIN))
}

impl Node {
    /// Opens and authenticates a new session connection to `peer`.
    async fn open_session(&self, peer: &Peer) -> Result<SessionConn> {
        let (_, rd, wr) = self
            .dial_peer(peer.addr, &self.identity(pb::ConnKind::Session))
            .await
            .map_err(|e| match e {
                DialError::NoAnswer => Error::NodeDown(format!("node {} does not answer", peer.id)),
                DialError::Failed(e) => Error::NodeDown(format!("node {}: {e}", peer.id)),
            })?;
        Ok((rd, wr))
    }

    /// A spare session connection to `peer` that is still open; stale ones (its cland
    /// restarted since they were made) are dropped on the way.
    fn take_fresh_session(&self, peer: &Peer) -> Option<SessionConn> {
        loop {
            let (rd, wr) = peer.spare_sessions.lock().pop()?;
            if !stale(&rd) {
                return Some((rd, wr));
            }
            debug!(node = %peer.id, "dropped a stale spare session connection");
        }
    }

    /// Keeps a session connection whose session ended cleanly as a spare, if `peer` is up
    /// and has room for it (`KEPT_SESSIONS`; else it is closed).
    fn keep_session(&self, peer: &Peer, conn: SessionConn) {
        if peer.state_name(&self.cfg, self.started) != "up" {
            return;
        }
        let mut spares = peer.spare_sessions.lock();
        if spares.len() < KEPT_SESSIONS {
            spares.push(conn);
        }
    }

    /// Keeps `SPARE_SESSIONS` connections ready to `peer` while it is alive.
    async fn refill_sessions(&self, peer: &Peer) {
        while peer.spare_sessions.lock().len() < SPARE_SESSIONS
            && peer.state_name(&self.cfg, self.started) == "up"
        {
            match self.open_session(peer).await {
                Ok(c) => {
                    let mut spares = peer.spare_sessions.lock();
                    if spares.len() < SPARE_SESSIONS {
                        spares.push(c);
                    }
                }
                Err(_) => return,
            }
        }
    }
}

/// The stub's inputs to the process's node. After the release (the last thing a session
/// says) it waits for the reading half, given back once the process's node said the
/// session is over, and keeps the connection for the next session to that node.
async fn relay_to_remote(
    node: Arc<Node>,
    peer: Arc<Peer>,
    mut wr: PeerWriter<OwnedWriteHalf>,
    mut rx: mpsc::UnboundedReceiver<pb::SessionInput>,
    reader: oneshot::Receiver<PeerReader<BufReader<OwnedReadHalf>>>,
    mut deaths: tokio::sync::watch::Receiver<u64>,
) {
    while let Some(i) = rx.recv().await {
        let release = matches!(i.input, Some(Input::Release(_)));
        let f = pb::PeerFrame {
            frame: Some(Frame::Input(i)),
        };
        // A write the process's node does not take (it vanished) ends when that node is
        // declared dead; the connection is given up then, a frame cut halfway with it.
        let sent = tokio::select! {
            r = wr.write(&f) => r.is_ok(),
            _ = deaths.changed() => false,
        };
        if !sent {
            break;
        }
        if release {
            let rd = tokio::select! {
                r = reader => r.ok(),
                _ = deaths.changed() => None,
            };
            if let Some(rd) = rd {
                node.keep_session(&peer, (rd, wr));
            }
            return;
        }
    }
    // Dropping the writer closes our half: the remote side sees the session end.
}

async fn relay_from_remote(
    this: Arc<Node>,
    mut rd: PeerReader<BufReader<OwnedReadHalf>>,
    out: mpsc::Sender<pb::SessionOutput>,
    gpid: Gpid,
    node: NodeId,
    mut deaths: tokio::sync::watch::Receiver<u64>,
    back: oneshot::Sender<PeerReader<BufReader<OwnedReadHalf>>>,
) {
    let mut done = false;
    loop {
        // Cancelling rd.read() here is safe only because a death ends the loop: the
        // connection is never read again after a cancelled read.
        let f = tokio::select! {
            f = rd.read() => f,
            _ = deaths.changed() => break,
        };
        match f {
            Ok(Some(pb::PeerFrame {
                frame: Some(Frame::Output(o)),
            })) => {
                done |= matches!(o.output, Some(pb::session_output::Output::Exited(_)));
                if out.send(o).await.is_err() {
                    return;
                }
            }
            // The process's node has the release: nothing more comes on this session, and
            // the connection, read to here, may carry the next one.
            Ok(Some(pb::PeerFrame {
                frame: Some(Frame::SessionDone(_)),
            })) => {
                let _ = back.send(rd);
                return;
            }
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    if done {
        return;
    }
    // Lost with its node; otherwise (its cland restarts, or said goodbye) the process lives
    // on and the stub may reattach.
    let output = if this.peer_lost(node) {
        pb::session_output::Output::Lost(pb::Error::new(
            pb::ErrorCode::NodeDown,
            format!("lost the session with node {node}; process {gpid} is lost"),
        ))
    } else {
        debug!(%gpid, %node, "session interrupted");
        pb::session_output::Output::Interrupted(true)
    };
    let _ = out
        .send(pb::SessionOutput {
            gpid: gpid.raw(),
            output: Some(output),
        })
        .await;
}

/// The process's side of a session connection: one session after another, each a process
/// started (or a running one taken over for a stub that reattaches) and relayed until it
/// is released. A released session leaves the connection idle for the stub's node's next
/// one (`session_done`); any other end closes it.
pub async fn serve_remote(
    node: Arc<Node>,
    from: NodeId,
    mut rd: PeerReader<BufReader<OwnedReadHalf>>,
    mut wr: PeerWriter<OwnedWriteHalf>,
) {
    while let Some((r, w)) = serve_session(&node, from, rd, wr).await {
        (rd, wr) = (r, w);
    }
}

/// One session of a session connection; the connection back when it may carry another.
async fn serve_session(
    node: &Arc<Node>,
    from: NodeId,
    mut rd: PeerReader<BufReader<OwnedReadHalf>>,
    mut wr: PeerWriter<OwnedWriteHalf>,
) -> Option<SessionConn> {
    let req = match rd.read().await {
        Ok(Some(pb::PeerFrame {
            frame: Some(Frame::Request(r)),
        })) => r,
        _ => return None,
    };
    let id = req.id;
    let reply = |r: pb::peer_reply::Reply| pb::PeerFrame {
        frame: Some(Frame::Reply(pb::PeerReply { id, reply: Some(r) })),
    };
    // Output and the exit status queue here from the process's start (or the reattach);
    // they go out after the reply.
    let (tx, mut rx) = mpsc::channel(64);
    // Input has a task of its own, from before the start: the stub's signals may follow
    // the spawn (a Ctrl-C while the exec hangs), and go to the process starting; the rest
    // comes once it has started. PeerReader::read is not cancel safe, so it must never
    // be a branch of a select! that another branch can win halfway through a frame.
    // It returns how the stub's side ended the session. Aborting it is not enough to stop
    // it relaying: a task that finds its frames already received runs on until it yields,
    // which on a busy node can be after a newer session's `Resume`; so each message goes
    // only while this session is the latest (`VProc::send_from`).
    let pending = PendingSignals::new();
    let route = pending.clone();
    let mut input = tokio::spawn(async move {
        while let Ok(Some(f)) = rd.read().await {
            if let Some(Frame::Input(pb::SessionInput { input: Some(i), .. })) = f.frame {
                let Some((input_vp, session)) = route.process() else {
                    // Still starting: only a signal means something yet.
                    if let Input::StartSignal(sig) | Input::Signal(sig) = i {
                        route.signal(sig);
                    }
                    continue;
                };
                match i {
                    Input::Release(_) => {
                        input_vp.send(In::Release(true));
                        return Ended::Released(rd);
                    }
                    Input::HangUp(_) => return Ended::HungUp,
                    i => {
                        if let Some(m) = to_shepherd(i) {
                            if !input_vp.send_from(session, m) {
                                // A newer session took the process over: this one is over.
                                break;
                            }
                        }
                    }
                }
            }
        }
        Ended::Broken
    });
    let spawned = matches!(req.op, Some(pb::peer_request::Op::Spawn(_)));
    let taken = match req.op {
        Some(pb::peer_request::Op::Spawn(s)) => node
            .spawn_local_to(
                SpawnLocal {
                    spec: s.spec.unwrap_or_default(),
                    creds: s.creds.or(req.creds).unwrap_or_default(),
                    job: s.job,
                    rank: s.rank,
                    size: s.size,
                    parent_node: from,
                    parent: s.parent,
                    pending: Some(pending.clone()),
                },
                Some(tx),
            )
            .await
            .map(|vp| (vp, 0)),
        Some(pb::peer_request::Op::Reattach(r)) => match r.items.first() {
            Some(item) => node.reattach_local(item, &req.creds.unwrap_or_default(), tx, from),
            None => Err(Error::Invalid("a reattach names no process".into())),
        },
        _ => Err(Error::Invalid(
            "a session starts with a spawn or a reattach".into(),
        )),
    };
    let (vp, session) = match taken {
        Ok(x) => x,
        Err(e) => {
            input.abort();
            let _ = wr
                .write(&reply(pb::peer_reply::Reply::Error(e.into())))
                .await;
            return None;
        }
    };
    pending.started(&vp, session);
    let started = pb::Started {
        gpids: vec![vp.gpid.raw()],
        job: vp.job,
        nodes: vec![node.id.get()],
        reattach_ms: node.cfg.reattach_ms,
    };
    // What a new process says (or its end) within moments of its start goes out with the
    // answer, in one write: a short command's start and exit then cross the nodes and
    // wake the stub once, not twice while it runs.
    let mut first = Vec::new();
    if spawned {
        if let Ok(Some(o)) = tokio::time::timeout(SAID_WITH_START, rx.recv()).await {
            first.push(o);
            while first.len() < SAID_WITH_START_MAX {
                match rx.try_recv() {
                    Ok(o) => first.push(o),
                    Err(_) => break,
                }
            }
        }
    }
    let sent = std::iter::once(reply(pb::peer_reply::Reply::Started(started)))
        .chain(first.into_iter().map(|o| pb::PeerFrame {
            frame: Some(Frame::Output(o)),
        }))
        .try_fold(Vec::new(), |mut bytes, f| {
            bytes.extend(wr.seal(&f)?);
            Ok::<_, clan_proto::frame::FrameError>(bytes)
        });
    let written = match sent {
        Ok(bytes) => wr.write_raw(&bytes).await.is_ok(),
        Err(_) => false,
    };
    if !written {
        // The stub's node went away before it knew: it may reattach.
        input.abort();
        node.park(&vp, session);
        return None;
    }
    // The stub's node declared dead (a partition leaves the connection open but silent).
    let mut deaths = match node.peer(from) {
        Ok(p) => p.deaths.subscribe(),
        Err(_) => return None,
    };
    if node.peer_lost(from) {
        input.abort();
        vp.hang_up_if(session);
        return None;
    }
    let ended = loop {
        tokio::select! {
            // All branches are cancel safe: a JoinHandle, mpsc::Receiver::recv and
            // watch::Receiver::changed.
            e = &mut input => break e.unwrap_or(Ended::Broken),
            _ = deaths.changed() => {
                input.abort();
                break Ended::Broken;
            }
            o = rx.recv() => match o {
                Some(o) => {
                    // A write the stub's node does not take (it vanished) ends when that
                    // node is declared dead; the connection is given up then.
                    let f = pb::PeerFrame { frame: Some(Frame::Output(o)) };
                    let sent = tokio::select! {
                        r = wr.write(&f) => r.is_ok(),
                        _ = deaths.changed() => false,
                    };
                    if !sent {
                        input.abort();
                        break Ended::Broken;
                    }
                }
                None => {
                    // A newer session took the process over: this one is over.
                    if vp.session() != session {
                        input.abort();
                        return None;
                    }
                    // The process's link is gone; wait for the stub's side to finish.
                    break (&mut input).await.unwrap_or(Ended::Broken);
                }
            },
        }
    };
    match ended {
        Ended::Released(rd) => {
            vp.unsubscribe(session);
            // Said after everything of the session (the exit status came before the
            // release): the stub's node reads up to it and may keep the connection.
            let done = pb::PeerFrame {
                frame: Some(Frame::SessionDone(true)),
            };
            let said = tokio::select! {
                r = wr.write(&done) => r.is_ok(),
                _ = deaths.changed() => false,
            };
            return said.then_some((rd, wr));
        }
        Ended::HungUp => {
            vp.hang_up_if(session);
        }
        // The stub's node is lost: nobody will come back for the process.
        Ended::Broken if node.peer_lost(from) => {
            debug!(gpid = %vp.gpid, "the stub's node is lost: hanging up");
            vp.hang_up_if(session);
        }
        Ended::Broken => node.park(&vp, session),
    }
    None
}

/// How long a new process's first output (or its end) may hold back the answer to its
/// spawn, to go with it: a short command (`true`, `hostname`) has ended by then.
const SAID_WITH_START: std::time::Duration = std::time::Duration::from_millis(2);

/// The most outputs that go with the answer to a spawn (what is queued by then).
const SAID_WITH_START_MAX: usize = 16;

/// How the stub's side ended a session, as the process's node saw it.
enum Ended {
    /// The stub has the exit status: the process is reaped. The connection's reading half,
    /// for the next session.
    Released(PeerReader<BufReader<OwnedReadHalf>>),
    /// The stub is gone for good.
    HungUp,
    /// The connection broke (a cland on the stub's side restarted, or its node died).
    Broken,
}

/// Whether a local process is stopped (state T in /proc/PID/stat).
fn stub_stopped(pid: u32) -> bool {
    clan_core::sys::state_and_start(pid).is_some_and(|(state, _)| state == 'T')
}

impl Node {
    /// The state of stub `pid` (started at `start`) on this node: `None` when it is gone.
    pub fn stub_here(&self, pid: u32, start: u64) -> pb::StubState {
        match clan_core::sys::state_and_start(pid) {
            Some((state, t)) if t == start && !matches!(state, 'Z' | 'X') => pb::StubState {
                alive: true,
                stopped: matches!(state, 'T' | 't'),
            },
            _ => pb::StubState::default(),
        }
    }

    /// Whether the stub of parked process `vp` lives, stopped (it can not reattach until
    /// something continues it). False when it is gone, running, unknown, or its node does
    /// not answer.
    async fn stub_stopped_far(&self, vp: &VProc) -> bool {
        let Some((pid, start)) = vp.stub else {
            return false;
        };
        if vp.parent_node == self.id {
            return self.stub_here(pid, start).stopped;
        }
        let op = pb::peer_request::Op::Stub(pb::StubProbe { pid, start });
        let limit = self.cfg.dead_after();
        matches!(
            self.call_within(vp.parent_node, self.own_creds(), op, limit)
                .await,
            Ok(pb::peer_reply::Reply::Stub(pb::StubState {
                alive: true,
                stopped: true
            }))
        )
    }
}

/// The stub's side of a run with every process attached: relay until all are released.
/// A process whose session to its node broke (`Interrupted`) gets a new one when the stub
/// asks with a reattach; one that is lost is dropped.
pub struct StubRelay {
    pub node: Arc<Node>,
    pub creds: pb::Creds,
    pub endpoints: HashMap<Gpid, Endpoint>,
    /// Where the endpoints' output goes (kept for the endpoints of reattaches).
    pub out_tx: mpsc::Sender<pb::SessionOutput>,
    pub out_rx: mpsc::Receiver<pb::SessionOutput>,
    pub from_stub: mpsc::Receiver<pb::SessionInput>,
    pub to_stub: mpsc::Sender<pb::SessionOutput>,
    /// The stub, to wake it when its process is continued by someone else.
    pub stub: Option<std::os::fd::OwnedFd>,
    pub stub_pid: u32,
}

impl StubRelay {
    pub async fn run(self) {
        let StubRelay {
            node,
            creds,
            mut endpoints,
            out_tx,
            mut out_rx,
            mut from_stub,
            to_stub,
            stub,
            stub_pid,
        } = self;
        let (done_tx, mut done_rx) = mpsc::channel::<(Gpid, Result<Endpoint>)>(8);
        let mut stub_gone = false;
        // Processes whose session broke (`Interrupted`): their old endpoint is dropped (its
        // connection closed), a new one comes with the stub's reattach.
        let mut broken = std::collections::HashSet::new();
        while !endpoints.is_empty() || !broken.is_empty() {
            tokio::select! {
                i = from_stub.recv(), if !stub_gone => match i {
                    Some(i) => {
                        // A signal the stub sent before it knew its processes started
                        // (after the last start ended, before it read `Started`): to all.
                        if let (0, Some(Input::StartSignal(sig))) = (i.gpid, &i.input) {
                            for (g, ep) in &endpoints {
                                ep.input(*g, Input::StartSignal(*sig));
                            }
                            continue;
                        }
                        let Some(g) = Gpid::from_raw(i.gpid) else { continue };
                        let Some(input) = i.input else { continue };
                        match input {
                            Input::Reattach(from) if broken.contains(&g) => {
                                let (node, creds, out, done) =
                                    (node.clone(), creds.clone(), out_tx.clone(), done_tx.clone());
                                tokio::spawn(async move {
                                    let from = pb::ResumeFrom { gpid: g.raw(), ..from };
                                    let r = node.reattach_endpoint(from, &creds, out).await;
                                    // The stub went meanwhile: the new session ends too.
                                    if let Err(mpsc::error::SendError((g, Ok(ep)))) =
                                        done.send((g, r)).await
                                    {
                                        ep.orphan(g);
                                    }
                                });
                            }
                            Input::Release(r) => {
                                if let Some(ep) = endpoints.remove(&g) {
                                    ep.input(g, Input::Release(r));
                                }
                            }
                            input => {
                                if let Some(ep) = endpoints.get(&g) {
                                    ep.input(g, input);
                                }
                            }
                        }
                    }
                    None => stub_gone = true,
                },
                Some((g, r)) = done_rx.recv() => {
                    broken.remove(&g);
                    let o = match r {
                        Ok(mut ep) => {
                            ep.answered();
                            endpoints.insert(g, ep);
                            continue;
                        }
                        Err(e) => {
                            endpoints.remove(&g);
                            pb::session_output::Output::Lost(pb::Error::from(e))
                        }
                    };
                    if to_stub.send(pb::SessionOutput { gpid: g.raw(), output: Some(o) }).await.is_err() {
                        stub_gone = true;
                    }
                }
                o = out_rx.recv() => match o {
                    Some(o) => {
                        let g = Gpid::from_raw(o.gpid);
                        let lost = matches!(o.output, Some(pb::session_output::Output::Lost(_)));
                        if let (Some(g), Some(pb::session_output::Output::Interrupted(_))) = (g, &o.output) {
                            if endpoints.remove(&g).is_some() {
                                broken.insert(g);
                            }
                        }
                        if matches!(o.output, Some(pb::session_output::Output::Continued(_))) {
                            // Continued from elsewhere (`clan kill -s CONT`): a stub stopped by
                            // its shell must run again, and the shell sees the job continue.
                            if let Some(fd) = &stub {
                                if stub_stopped(stub_pid) {
                                    let _ = clan_core::sys::pidfd_send_signal(fd, libc::SIGCONT);
                                }
                            }
                        }
                        if to_stub.send(o).await.is_err() {
                            stub_gone = true;
                        }
                        if lost {
                            if let Some(g) = g { endpoints.remove(&g); }
                        }
                    }
                    None => break,
                },
            }
            if stub_gone {
                break;
            }
        }
        // Reattaches that finished after the stub went: their sessions end too.
        done_rx.close();
        while let Ok((g, r)) = done_rx.try_recv() {
            if let Ok(ep) = r {
                endpoints.insert(g, ep);
            }
        }
        for (g, ep) in endpoints.drain() {
            ep.orphan(g);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::readable_now;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    /// A spare whose peer says nothing is fit; one its peer closed (a restarted cland) or
    /// wrote to is stale, seen without blocking and without consuming what came.
    #[test]
    fn a_spare_is_stale_once_its_peer_closed_or_spoke() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut theirs, _) = l.accept().unwrap();
        assert!(!readable_now(&ours), "an open, silent connection is fit");
        assert!(!readable_now(&ours), "and the look changed nothing");
        theirs.write_all(b"x").unwrap();
        theirs.shutdown(std::net::Shutdown::Both).unwrap();
        drop(theirs);
        until_readable(&ours);
        assert!(readable_now(&ours), "data before any request: stale");
        let mut b = [0u8; 1];
        let mut r = &ours;
        std::io::Read::read_exact(&mut r, &mut b).unwrap();
        assert_eq!(&b, b"x", "the peek consumed nothing");
        until_readable(&ours);
        assert!(readable_now(&ours), "end of stream: stale");

        // A peer that vanished with a reset.
        let ours = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (theirs, _) = l.accept().unwrap();
        let now = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        nix::sys::socket::setsockopt(&theirs, nix::sys::socket::sockopt::Linger, &now).unwrap();
        drop(theirs);
        until_readable(&ours);
        assert!(readable_now(&ours), "reset: stale");
    }

    /// Waits (10 s at most) until `s` polls readable, consuming nothing, not even an error.
    fn until_readable(s: &TcpStream) {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::os::fd::AsFd;
        let mut fds = [PollFd::new(s.as_fd(), PollFlags::POLLIN)];
        assert_eq!(poll(&mut fds, PollTimeout::from(10_000u16)).unwrap(), 1);
    }
}
