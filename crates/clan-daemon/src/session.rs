//! Attached processes: the stub's stdio, signals and exit status (DESIGN.md 7).
//!
//! The stub (`clan run`) talks to its own node over the local socket. For each process of
//! the run, that node either attaches to the local vproc or opens a *session* connection to
//! the process's node, which starts the process and relays between the session and the
//! shepherd. Output flows back with backpressure all the way to the process's pipes. When
//! the stub goes away without releasing, the process is orphaned: its pipes break and its
//! shepherd reaps it when it exits, as with a local process whose parent died.

use crate::error::{Error, Result};
use crate::node::Node;
use crate::peer::Peer;
use crate::process::vproc::{SpawnLocal, VProc};
use clan_core::{Gpid, NodeId};
use clan_proto::auth::{self, PeerReader, PeerWriter};
use clan_proto::pb::{self, peer_frame::Frame, session_input::Input, shepherd_in::Msg as In};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::io::BufReader;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tracing::debug;

/// One process of a run, seen from the stub's node.
pub enum Endpoint {
    Local(Arc<VProc>),
    Remote(mpsc::UnboundedSender<pb::SessionInput>),
}

impl Endpoint {
    pub fn input(&self, gpid: Gpid, input: Input) {
        match self {
            Endpoint::Local(vp) => vp.send(to_shepherd(input)),
            Endpoint::Remote(tx) => {
                let _ = tx.send(pb::SessionInput {
                    gpid: gpid.raw(),
                    input: Some(input),
                });
            }
        }
    }

    /// The stub is gone without collecting the status.
    pub fn orphan(self) {
        if let Endpoint::Local(vp) = self {
            vp.hang_up();
        } // a remote endpoint is hung up by closing its session connection (drop)
    }
}

fn to_shepherd(input: Input) -> In {
    match input {
        Input::Stdin(d) => In::Stdin(d),
        Input::StdinEof(_) => In::StdinEof(true),
        Input::Signal(s) => In::Signal(s),
        Input::Resize(w) => In::Resize(w),
        Input::Release(_) => In::Release(true),
        Input::Background(b) => In::Background(b),
    }
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
                    },
                    Some(out),
                )
                .await?;
            return Ok((vp.gpid, Endpoint::Local(vp)));
        }
        let peer = self.peer(s.target)?.clone();
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
        let lost = |e: &dyn std::fmt::Display| Error::NodeDown(format!("node {}: {e}", s.target));
        // Watched from before the request: a reply lost in a cut link never comes, and the
        // peer's death (or goodbye) is what ends the wait, here and in the relay after it.
        let mut deaths = peer.deaths.subscribe();
        let exchange = async {
            // A spare connection saves the connect and handshake; one that went stale (the
            // peer restarted) fails before any reply, and the request goes on a fresh one.
            if let Some((mut rd, mut wr)) = self.take_session(&peer) {
                if let Ok(Some(r)) = ask(&mut rd, &mut wr, &req).await {
                    return Ok((rd, wr, r));
                }
            }
            let (mut rd, mut wr) = self.open_session(&peer).await?;
            let r = ask(&mut rd, &mut wr, &req).await.map_err(|e| lost(&e))?;
            Ok::<_, Error>((rd, wr, r.ok_or_else(|| lost(&"connection closed"))?))
        };
        let (rd, wr, reply) = tokio::select! {
            r = exchange => r?,
            _ = deaths.changed() => {
                return Err(Error::NodeDown(format!(
                    "node {} went down before it answered the start",
                    s.target
                )))
            }
        };
        let (node, spare) = (self.clone(), peer.clone());
        tokio::spawn(async move { node.refill_sessions(&spare).await });
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
        self.note_member(s.target, &s.creds);
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(relay_to_remote(wr, rx));
        tokio::spawn(relay_from_remote(rd, out, gpid, s.target, deaths));
        Ok((gpid, Endpoint::Remote(tx)))
    }
}

/// A session connection: authenticated, its first request not yet sent.
pub type SessionConn = (
    PeerReader<BufReader<OwnedReadHalf>>,
    PeerWriter<OwnedWriteHalf>,
);

/// Spare session connections kept per peer.
const SPARE_SESSIONS: usize = 2;

/// Sends the spawn request and reads its reply; `Ok(None)` if the connection closed first.
async fn ask(
    rd: &mut PeerReader<BufReader<OwnedReadHalf>>,
    wr: &mut PeerWriter<OwnedWriteHalf>,
    req: &pb::PeerFrame,
) -> std::result::Result<Option<pb::peer_reply::Reply>, String> {
    wr.write(req).await.map_err(|e| e.to_string())?;
    match rd.read().await.map_err(|e| e.to_string())? {
        Some(pb::PeerFrame {
            frame: Some(Frame::Reply(pb::PeerReply { reply: Some(r), .. })),
        }) => Ok(Some(r)),
        Some(_) => Err("unexpected frame".into()),
        None => Ok(None),
    }
}

impl Node {
    /// Opens and authenticates a new session connection to `peer`.
    async fn open_session(&self, peer: &Peer) -> Result<SessionConn> {
        let stream = tokio::time::timeout(self.cfg.dead_after(), TcpStream::connect(peer.addr))
            .await
            .map_err(|_| Error::NodeDown(format!("node {} does not answer", peer.id)))?
            .map_err(|e| Error::NodeDown(format!("node {}: {e}", peer.id)))?;
        let _ = stream.set_nodelay(true);
        let (r, w) = stream.into_split();
        // Bounded like the connect: a peer cut off mid-handshake never answers.
        let (_, rd, wr) = tokio::time::timeout(
            self.cfg.dead_after(),
            auth::connect(
                BufReader::new(r),
                w,
                &self.cfg.key,
                &self.identity(pb::ConnKind::Session),
            ),
        )
        .await
        .map_err(|_| Error::NodeDown(format!("node {} does not answer", peer.id)))?
        .map_err(|e| Error::NodeDown(format!("node {}: {e}", peer.id)))?;
        Ok((rd, wr))
    }

    fn take_session(&self, peer: &Peer) -> Option<SessionConn> {
        peer.spare_sessions.lock().pop()
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

async fn relay_to_remote(
    mut wr: PeerWriter<OwnedWriteHalf>,
    mut rx: mpsc::UnboundedReceiver<pb::SessionInput>,
) {
    while let Some(i) = rx.recv().await {
        if wr
            .write(&pb::PeerFrame {
                frame: Some(Frame::Input(i)),
            })
            .await
            .is_err()
        {
            break;
        }
    }
    // Dropping the writer closes our half: the remote side sees the session end.
}

async fn relay_from_remote(
    mut rd: PeerReader<BufReader<OwnedReadHalf>>,
    out: mpsc::Sender<pb::SessionOutput>,
    gpid: Gpid,
    node: NodeId,
    mut deaths: tokio::sync::watch::Receiver<u64>,
) {
    let mut done = false;
    loop {
        // Cancelling rd.read() here is safe only because a death ends the loop: the
        // connection is never read again after a cancelled read.
        tokio::select! {
            f = rd.read() => match f {
                Ok(Some(pb::PeerFrame { frame: Some(Frame::Output(o)) })) => {
                    done |= matches!(o.output, Some(pb::session_output::Output::Exited(_)));
                    if out.send(o).await.is_err() {
                        return;
                    }
                }
                Ok(Some(_)) => {}
                _ => break,
            },
            _ = deaths.changed() => break,
        }
    }
    if !done {
        let e = pb::Error::new(
            pb::ErrorCode::NodeDown,
            format!("lost the session with node {node}; process {gpid} is lost"),
        );
        let _ = out
            .send(pb::SessionOutput {
                gpid: gpid.raw(),
                output: Some(pb::session_output::Output::Lost(e)),
            })
            .await;
    }
}

/// The process's side of a session connection: start it and relay until released.
pub async fn serve_remote(
    node: Arc<Node>,
    from: NodeId,
    mut rd: PeerReader<BufReader<OwnedReadHalf>>,
    mut wr: PeerWriter<OwnedWriteHalf>,
) {
    let req = match rd.read().await {
        Ok(Some(pb::PeerFrame {
            frame: Some(Frame::Request(r)),
        })) => r,
        _ => return,
    };
    let id = req.id;
    let reply = |r: pb::peer_reply::Reply| pb::PeerFrame {
        frame: Some(Frame::Reply(pb::PeerReply { id, reply: Some(r) })),
    };
    let Some(pb::peer_request::Op::Spawn(s)) = req.op else {
        let _ = wr
            .write(&reply(pb::peer_reply::Reply::Error(
                Error::Invalid("a session starts with a spawn".into()).into(),
            )))
            .await;
        return;
    };
    // Output and the exit status queue here from the process's start; they go out after
    // the reply.
    let (tx, mut rx) = mpsc::channel(64);
    let spawned = node
        .spawn_local_to(
            SpawnLocal {
                spec: s.spec.unwrap_or_default(),
                creds: s.creds.or(req.creds).unwrap_or_default(),
                job: s.job,
                rank: s.rank,
                size: s.size,
                parent_node: from,
                parent: s.parent,
            },
            Some(tx),
        )
        .await;
    let vp = match spawned {
        Ok(vp) => vp,
        Err(e) => {
            let _ = wr
                .write(&reply(pb::peer_reply::Reply::Error(e.into())))
                .await;
            return;
        }
    };
    let started = pb::Started {
        gpids: vec![vp.gpid.raw()],
        job: s.job,
        nodes: vec![node.id.get()],
    };
    if wr
        .write(&reply(pb::peer_reply::Reply::Started(started)))
        .await
        .is_err()
    {
        vp.hang_up();
        return;
    }
    // Input has a task of its own: PeerReader::read is not cancel safe, so it must never be
    // a branch of a select! that another branch can win halfway through a frame.
    let released = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (input_vp, input_released) = (vp.clone(), released.clone());
    let mut input = tokio::spawn(async move {
        while let Ok(Some(f)) = rd.read().await {
            if let Some(Frame::Input(pb::SessionInput { input: Some(i), .. })) = f.frame {
                if matches!(i, Input::Release(_)) {
                    input_released.store(true, std::sync::atomic::Ordering::SeqCst);
                }
                input_vp.send(to_shepherd(i));
            }
        }
    });
    // The stub's node declared dead (a partition leaves the connection open but silent).
    let mut deaths = match node.peer(from) {
        Ok(p) => p.deaths.subscribe(),
        Err(_) => return,
    };
    let mut dead = !node.node_alive(from).unwrap_or(false);
    while !dead {
        tokio::select! {
            // All branches are cancel safe: a JoinHandle, mpsc::Receiver::recv and
            // watch::Receiver::changed.
            _ = &mut input => break,
            _ = deaths.changed() => dead = true,
            o = rx.recv() => match o {
                Some(o) => {
                    if wr.write(&pb::PeerFrame { frame: Some(Frame::Output(o)) }).await.is_err() {
                        input.abort();
                        break;
                    }
                }
                None => {
                    // The process's link is gone; wait for the stub's side to finish.
                    let _ = (&mut input).await;
                    break;
                }
            },
        }
    }
    if dead {
        input.abort();
    }
    if released.load(std::sync::atomic::Ordering::SeqCst) {
        vp.detach_subscriber();
    } else {
        debug!(gpid = %vp.gpid, "session ended without release: hanging up");
        vp.hang_up();
    }
}

/// Whether a local process is stopped (state T in /proc/PID/stat).
fn stub_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('T'))
        })
        .unwrap_or(false)
}

/// The stub's side of a run with every process attached: relay until all are released.
pub async fn relay_stub(
    endpoints: HashMap<Gpid, Endpoint>,
    mut out_rx: mpsc::Receiver<pb::SessionOutput>,
    mut from_stub: mpsc::Receiver<pb::SessionInput>,
    to_stub: mpsc::Sender<pb::SessionOutput>,
    stub: Option<std::os::fd::OwnedFd>,
    stub_pid: u32,
) {
    let mut endpoints = endpoints;
    let mut stub_gone = false;
    while !endpoints.is_empty() {
        tokio::select! {
            i = from_stub.recv(), if !stub_gone => match i {
                Some(i) => {
                    let Some(g) = Gpid::from_raw(i.gpid) else { continue };
                    let Some(input) = i.input else { continue };
                    let release = matches!(input, Input::Release(_));
                    if let Some(ep) = endpoints.get(&g) {
                        ep.input(g, input);
                    }
                    if release {
                        endpoints.remove(&g);
                    }
                }
                None => stub_gone = true,
            },
            o = out_rx.recv() => match o {
                Some(o) => {
                    let g = Gpid::from_raw(o.gpid);
                    let lost = matches!(o.output, Some(pb::session_output::Output::Lost(_)));
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
    for (_, ep) in endpoints.drain() {
        ep.orphan();
    }
}
