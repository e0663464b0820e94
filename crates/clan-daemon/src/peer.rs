//! Links between nodes (DESIGN.md 11, 18).
//!
//! Each node dials every other node once and keeps that *control* connection for its own
//! requests and heartbeats; replies come back on it. What a node receives on the connections
//! others dialed (heartbeats, requests) tells it they are alive. A peer not heard from for
//! `suspect_after_ms` is suspect, after `dead_after_ms` dead, and at once when it says
//! goodbye. Attached processes get a *session* connection each (session.rs).

use crate::error::{Error, Result};
use crate::node::Node;
use clan_core::{ClusterConfig, NamedAsyncMutex, NamedMutex, NodeId};
use clan_proto::auth::{self, Authenticated, Identity, PeerWriter};
use clan_proto::pb::{self, peer_frame::Frame, peer_reply::Reply, peer_request::Op};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::BufReader;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tracing::{debug, info, warn};

#[derive(Debug, Default)]
pub struct PeerState {
    pub last_heard: Option<Instant>,
    pub info: Option<pb::NodeInfo>,
    /// The incarnation that said goodbye (a clean stop), until it or another is heard
    /// again: its own late frames are no sign of life.
    pub goodbye: Option<u64>,
    pub declared_dead: bool,
    /// The incarnation this node declared dead with quorum: refused until it fences
    /// itself and comes back as another (membership.rs).
    pub fenced: Option<u64>,
    /// Placements sent there that the load its heartbeats report may not show yet
    /// (least-loaded counts them as load).
    pub placed: crate::node::Placed,
    /// Its current incarnation's processes were given up as lost (`Node::node_lost`: it was
    /// declared dead, which fences it). A node that said goodbye is only away: its
    /// processes outlive its cland, and are lost only if it comes back as an incarnation
    /// that did not take them over.
    pub lost: bool,
}

type Pending = HashMap<u64, oneshot::Sender<Result<Reply>>>;

pub struct Peer {
    pub id: NodeId,
    pub addr: SocketAddr,
    pub state: NamedMutex<PeerState>,
    pending: NamedMutex<Pending>,
    /// The writing half of our connection to the peer; frames are written directly by
    /// whoever sends them (no writer task between a request and the socket).
    out: NamedAsyncMutex<Option<PeerWriter<OwnedWriteHalf>>>,
    /// Told when a send gives the connection up ([`Sending`]): the dial loop stops reading
    /// it and dials again.
    broken: tokio::sync::Notify,
    /// Bumped each time the dial loop has a new connection (its writer in `out`).
    links: watch::Sender<u64>,
    write_timeout: Duration,
    next_id: AtomicU64,
    /// Session connections opened ahead of time (session.rs).
    pub spare_sessions: NamedMutex<Vec<crate::session::SessionConn>>,
    /// Bumped each time the peer is declared dead; sessions watch it.
    pub deaths: watch::Sender<u64>,
    /// A cland that took over its node's processes asked the peer which of its processes
    /// have their parent here (`Node::relearn_children`), or is asking.
    pub children_asked: std::sync::atomic::AtomicBool,
}

impl Peer {
    pub fn new(id: NodeId, addr: SocketAddr, write_timeout: Duration) -> Peer {
        Peer {
            id,
            addr,
            state: NamedMutex::new("peer.state", PeerState::default()),
            pending: NamedMutex::new("peer.pending", HashMap::new()),
            out: NamedAsyncMutex::new("peer.out", None),
            broken: tokio::sync::Notify::new(),
            links: watch::channel(0).0,
            write_timeout,
            next_id: AtomicU64::new(1),
            spare_sessions: NamedMutex::new("peer.sessions", Vec::new()),
            children_asked: false.into(),
            deaths: watch::channel(0).0,
        }
    }

    /// up, suspect or dead, from the time since the peer was last heard.
    pub fn state_name(&self, cfg: &ClusterConfig, started: Instant) -> &'static str {
        let st = self.state.lock();
        state_of(&st, cfg, started)
    }

    /// [`Peer::state_name`] with the state already locked.
    pub fn state_of_locked(
        &self,
        st: &PeerState,
        cfg: &ClusterConfig,
        started: Instant,
    ) -> &'static str {
        state_of(st, cfg, started)
    }

    pub fn info(&self, cfg: &ClusterConfig, started: Instant) -> pb::NodeInfo {
        let st = self.state.lock();
        let mut i = st.info.clone().unwrap_or_default();
        i.id = self.id.get();
        i.addr = self.addr.to_string();
        i.state = state_of(&st, cfg, started).to_string();
        i
    }

    pub fn fail_pending(&self, e: Error) {
        let drained: Vec<_> = self.pending.lock().drain().collect();
        for (_, tx) in drained {
            let _ = tx.send(Err(e.clone()));
        }
    }

    /// Writes a frame on our connection to the peer; false when there is none or it broke
    /// (a peer that does not read for `dead_after_ms` loses its connection).
    ///
    /// Cancel safe: callers bound their calls with timeouts of their own, which may drop
    /// a send in the middle of its write. The connection is then given up as after a
    /// failed write ([`Sending`]): its writer has taken the frame's sequence number and
    /// may have put part of it on the wire, so no later frame could pass the peer's MAC
    /// check.
    async fn send(&self, f: &pb::PeerFrame) -> bool {
        self.send_if(f, || true).await
    }

    /// [`Peer::send`] of request `id`: when there is no connection at the moment (the dial
    /// loop is dialing again, as after the peer's cland restarted: it answered our
    /// heartbeats on its own connection already), waits up to `wait` for the new one
    /// rather than fail at once. Written only if the request is still pending then: one
    /// the lost connection failed meanwhile (`fail_pending`, run between the old writer's
    /// end and the new one's start, both under the writer's lock) has been answered
    /// already, and must not run on the peer behind its caller's back.
    async fn send_request(&self, f: &pb::PeerFrame, id: u64, wait: Duration) -> bool {
        let mut links = self.links.subscribe();
        if self.out.lock().await.is_none() {
            let _ = tokio::time::timeout(wait, links.changed()).await;
        }
        self.send_if(f, || self.pending.lock().contains_key(&id))
            .await
    }

    /// Writes `f` if `still()` holds once the writer is ours.
    async fn send_if(&self, f: &pb::PeerFrame, still: impl Fn() -> bool) -> bool {
        let mut s = Sending {
            out: self.out.lock().await,
            broken: &self.broken,
            done: false,
        };
        let Some(w) = s.out.as_mut() else {
            return false;
        };
        if !still() {
            // Not a failed write: the connection stays.
            s.done = true;
            return false;
        }
        s.done = matches!(
            tokio::time::timeout(self.write_timeout, w.write(f)).await,
            Ok(Ok(()))
        );
        s.done
    }
}

/// Our writer to a peer, held for one frame. Dropped before the frame was written whole
/// (the write failed or timed out, or the send was cancelled halfway), it takes the writer
/// away, which closes our side of the connection, and wakes the dial loop to dial again.
struct Sending<'a> {
    out: tokio::sync::MutexGuard<'a, Option<PeerWriter<OwnedWriteHalf>>>,
    broken: &'a tokio::sync::Notify,
    done: bool,
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        if !self.done && self.out.take().is_some() {
            self.broken.notify_waiters();
        }
    }
}

/// Unproven inbound connections (not yet past their proof of the cluster key) that one
/// address other than a node's may hold at once: one host without the key does not take
/// all of [`Node::serve_inbound`]'s 256 (nodes' own addresses are not counted: on a local
/// cluster every node dials from the same one).
const UNPROVEN_PER_SOURCE: usize = 8;

/// One unproven connection from an address, counted until dropped.
struct Unproven(std::net::IpAddr);

fn unproven_by_source() -> &'static NamedMutex<HashMap<std::net::IpAddr, usize>> {
    static BY_SOURCE: std::sync::OnceLock<NamedMutex<HashMap<std::net::IpAddr, usize>>> =
        std::sync::OnceLock::new();
    BY_SOURCE.get_or_init(|| NamedMutex::new("peer.unproven", HashMap::new()))
}

impl Unproven {
    /// A place for one more unproven connection from `ip`, if it has fewer than
    /// [`UNPROVEN_PER_SOURCE`].
    fn take(ip: std::net::IpAddr) -> Option<Unproven> {
        let mut by = unproven_by_source().lock();
        let n = by.entry(ip).or_insert(0);
        if *n >= UNPROVEN_PER_SOURCE {
            return None;
        }
        *n += 1;
        Some(Unproven(ip))
    }
}

impl Drop for Unproven {
    fn drop(&mut self) {
        let mut by = unproven_by_source().lock();
        if let Some(n) = by.get_mut(&self.0) {
            *n -= 1;
            if *n == 0 {
                by.remove(&self.0);
            }
        }
    }
}

/// A request that the peer would refuse for its size (dropping the connection, and every
/// request in flight on it with it): refused here, naming its size.
pub(crate) fn check_request_size(f: &pb::PeerFrame) -> Result<()> {
    let n = prost::Message::encoded_len(f);
    if n > auth::MAX_PEER_BODY {
        return Err(Error::Invalid(format!(
            "request too large: {n} bytes, the limit is {} bytes",
            auth::MAX_PEER_BODY
        )));
    }
    Ok(())
}

/// TCP_USER_TIMEOUT of `t` on a control connection: data the peer does not acknowledge
/// within `t` (it vanished: its machine reset, a cut link) breaks the connection then,
/// rather than after TCP's quarter hour of retransmissions. Not for session connections:
/// the kernel also gives up on a connection whose receiver's window stays closed that
/// long, and a stub that is stopped or read slowly closes its session's window for as
/// long as it likes.
pub(crate) fn user_timeout(s: &TcpStream, t: Duration) {
    use nix::sys::socket::{setsockopt, sockopt};
    let ms = u32::try_from(t.as_millis()).unwrap_or(u32::MAX).max(1);
    if let Err(e) = setsockopt(s, sockopt::TcpUserTimeout, &ms) {
        debug!("TCP_USER_TIMEOUT: {e}");
    }
}

/// The reply frame to request `id` that had `res`: an error, or a reply too large to send,
/// as an error reply.
pub(crate) fn reply_frame(id: u64, res: Result<Reply>) -> pb::PeerFrame {
    let reply = match res {
        Ok(r) => match crate::error::too_large(r.encoded_len()) {
            Some(e) => Reply::Error(e.into()),
            None => r,
        },
        Err(e) => Reply::Error(e.into()),
    };
    pb::PeerFrame {
        frame: Some(Frame::Reply(pb::PeerReply {
            id,
            reply: Some(reply),
        })),
    }
}

/// Why a connection to a peer could not be made ([`Node::dial_peer`]).
pub(crate) enum DialError {
    /// No answer within `dead_after`, to the connect or to the handshake.
    NoAnswer,
    Failed(String),
}

impl std::fmt::Display for DialError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DialError::NoAnswer => f.write_str("no answer"),
            DialError::Failed(e) => f.write_str(e),
        }
    }
}

/// Whether a node in `state` (as `clan nodes` shows it) is down: dead, or away (its
/// cland stopped cleanly, its processes live on).
pub fn is_down(state: &str) -> bool {
    matches!(state, "dead" | "away")
}

fn state_of(st: &PeerState, cfg: &ClusterConfig, started: Instant) -> &'static str {
    if st.goodbye.is_some() && !st.lost {
        return "away";
    }
    if st.goodbye.is_some() || st.declared_dead {
        return "dead";
    }
    let since = st.last_heard.unwrap_or(started).elapsed().as_millis() as u64;
    if since > cfg.dead_after_ms {
        "dead"
    } else if since > cfg.suspect_after_ms || st.last_heard.is_none() {
        "suspect"
    } else {
        "up"
    }
}

impl Node {
    pub fn identity(&self, kind: pb::ConnKind) -> Identity {
        Identity {
            node: self.id.get(),
            incarnation: self.incarnation(),
            cluster: self.cfg.name.clone(),
            kind,
            creds: None,
        }
    }

    /// Sends a request to a peer and waits for its reply.
    pub async fn call(&self, to: NodeId, creds: pb::Creds, op: Op) -> Result<Reply> {
        let p = self.peer(to)?;
        if is_down(p.state_name(&self.cfg, self.started)) {
            // Lost: its processes are gone. Away (it said goodbye, or is not yet declared
            // dead): they may live on, and asking again later may work.
            if p.state.lock().lost {
                return Err(Error::NodeDead(to));
            }
            return Err(Error::NodeDown(format!("node {to} is down")));
        }
        let id = p.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = pb::PeerFrame {
            frame: Some(Frame::Request(pb::PeerRequest {
                id,
                creds: Some(creds),
                op: Some(op),
            })),
        };
        check_request_size(&frame)?;
        let (tx, rx) = oneshot::channel();
        p.pending.lock().insert(id, tx);
        let relink = self.cfg.dead_after().min(Duration::from_secs(1));
        if !p.send_request(&frame, id, relink).await {
            p.pending.lock().remove(&id);
            return Err(Error::NodeDown(format!("node {to} is unreachable")));
        }
        match rx.await {
            Ok(Ok(Reply::Error(e))) => Err(e.into()),
            Ok(r) => r,
            Err(_) => Err(Error::NodeDown(format!("lost connection to node {to}"))),
        }
    }

    /// [`Node::call`] that gives up after `limit`: a node that does not answer in time is
    /// down for this request.
    pub async fn call_within(
        &self,
        to: NodeId,
        creds: pb::Creds,
        op: Op,
        limit: Duration,
    ) -> Result<Reply> {
        tokio::time::timeout(limit, self.call(to, creds, op))
            .await
            .unwrap_or_else(|_| Err(Error::NodeDown(format!("node {to} did not answer"))))
    }

    /// Starts the links: the listener, one dialer per peer, heartbeats and the failure detector.
    pub async fn start_peers(self: &Arc<Self>) -> anyhow::Result<()> {
        let me = self.cfg.node(self.id)?.addr;
        if let Some((lo, hi)) = crate::localcluster::ephemeral_ports()
            .filter(|&(lo, hi)| (lo..=hi).contains(&u32::from(me.port())))
            .filter(|_| !crate::localcluster::reserved_port(u32::from(me.port())))
        {
            warn!(
                "port {} is in the kernel's ephemeral range {lo}-{hi} \
                 (net.ipv4.ip_local_port_range): an outgoing connection can take it while \
                 cland is not listening; choose a port outside it, or reserve it \
                 (net.ipv4.ip_local_reserved_ports)",
                me.port()
            );
        }
        let listener = TcpListener::bind(me)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {me}: {e}"))?;
        let node = self.clone();
        tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((s, from)) => {
                        let node = node.clone();
                        tokio::spawn(async move { node.serve_inbound(s, from).await });
                    }
                    Err(e) => {
                        warn!("accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        });
        for p in self.peers.values() {
            let (node, p) = (self.clone(), p.clone());
            tokio::spawn(async move { node.dial_loop(p).await });
        }
        let node = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(node.cfg.heartbeat_ms));
            loop {
                tick.tick().await;
                let frame = node.heartbeat();
                // One task per peer, so a peer that does not read delays nobody else.
                for p in node.peers.values() {
                    let (p, f) = (p.clone(), frame.clone());
                    tokio::spawn(async move { p.send(&f).await });
                }
            }
        });
        tokio::spawn(self.clone().run_failure_detector());
        Ok(())
    }

    fn heartbeat(&self) -> pb::PeerFrame {
        pb::PeerFrame {
            frame: Some(Frame::Heartbeat(pb::Heartbeat {
                info: Some(self.self_info()),
                fenced: self.fenced_list(),
            })),
        }
    }

    /// Whether `peer` runs as an incarnation this node fenced.
    pub(crate) fn is_fenced(&self, peer: NodeId, incarnation: u64) -> bool {
        self.peers
            .get(&peer)
            .is_some_and(|p| p.state.lock().fenced == Some(incarnation))
    }

    /// A frame from `from`, on a connection it opened as `incarnation`. False when that
    /// incarnation is fenced: the frame is ignored and the connection dropped.
    fn heard(self: &Arc<Self>, from: NodeId, incarnation: u64, info: Option<pb::NodeInfo>) -> bool {
        let Some(p) = self.peers.get(&from) else {
            return false;
        };
        let mut rejoined = false;
        let mut lost_old = false;
        let with_info = info.is_some();
        {
            let mut st = p.state.lock();
            if st.fenced == Some(incarnation)
                || info
                    .as_ref()
                    .is_some_and(|i| st.fenced == Some(i.incarnation))
            {
                return false;
            }
            if st.goodbye == Some(incarnation) {
                // A late frame of the cland that said goodbye (it is stopping): not a sign
                // of life.
                return true;
            }
            if info.is_none()
                && st
                    .info
                    .as_ref()
                    .is_some_and(|i| i.incarnation != incarnation)
            {
                // A new incarnation counts as heard from its first heartbeat, which says
                // whose processes it took over: what the old one held is settled (lost or
                // kept) before anything is asked of the new one.
                return true;
            }
            let was_dead = st.declared_dead || st.goodbye.is_some();
            if let Some(i) = info {
                if let Some(old) = st.info.as_ref().filter(|o| o.incarnation != i.incarnation) {
                    info!(node = %from, "node restarted");
                    rejoined = true;
                    // Restarted without taking over the old incarnation's processes (a
                    // crash, not a cland restart), before we declared it dead or after a
                    // goodbye: what it held is lost all the same.
                    lost_old = !st.lost && i.previous != old.incarnation;
                }
                // A fenced incarnation stays listed (a restarted cland that took over
                // its processes must learn of it); a new one is accepted.
                st.info = Some(i);
                // Heard and accepted (not fenced), with what it holds: whatever was given
                // up belonged to what it was, and its next loss is news again.
                st.lost = false;
                // Its load has the placements sent long enough before; a heartbeat
                // sooner after one may carry a sample taken before its process ran.
                st.placed.sampled(self.placement_settle());
            }
            st.last_heard = Some(Instant::now());
            st.goodbye = None;
            st.declared_dead = false;
            if was_dead {
                info!(node = %from, "node is up again");
                rejoined = true;
            }
        }
        if lost_old {
            warn!(node = %from, "node came back as a new incarnation before it was declared dead");
            self.node_lost(p);
        }
        if rejoined {
            // Its member lists went with its old incarnation: tell it again.
            self.peer_rejoined(from);
        }
        if with_info
            && self.prev_incarnation.load(Ordering::Acquire) != 0
            && !p.children_asked.swap(true, Ordering::AcqRel)
        {
            // This cland took over its node's processes: the parents among them of
            // processes on that peer are known again from the peer.
            let (node, p) = (self.clone(), p.clone());
            tokio::spawn(async move {
                if !node.relearn_children(p.id).await {
                    p.children_asked.store(false, Ordering::Release);
                }
            });
        }
        true
    }

    async fn dial_loop(self: Arc<Self>, p: Arc<Peer>) {
        let mut backoff = Duration::from_millis(50);
        loop {
            match self.dial(&p).await {
                // A connection that lasted: dial again soon. One the peer ended at once
                // (it took the handshake, then closed) backs off as a failed dial does.
                Ok(lasted) if lasted > self.cfg.dead_after() => backoff = Duration::from_millis(50),
                Ok(lasted) => {
                    debug!(node = %p.id, "link closed by the peer after {} ms", lasted.as_millis())
                }
                Err(e) => debug!(node = %p.id, "link: {e}"),
            }
            *p.out.lock().await = None;
            p.fail_pending(Error::NodeDown(format!("lost connection to node {}", p.id)));
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(self.cfg.heartbeat_ms.max(100)));
        }
    }

    /// A connection to the peer at `addr`, authenticated as `me`: the connect and the
    /// handshake each bounded by `dead_after` (a peer cut off mid-handshake never answers,
    /// and the dialer must try again once the link is back). Connections that may be
    /// silent for long (sessions, links; not the control one, which heartbeats keep busy)
    /// get TCP keepalive.
    pub(crate) async fn dial_peer(
        &self,
        addr: SocketAddr,
        me: &Identity,
    ) -> std::result::Result<Authenticated<BufReader<OwnedReadHalf>, OwnedWriteHalf>, DialError>
    {
        let limit = self.cfg.dead_after();
        let s = match tokio::time::timeout(limit, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(DialError::Failed(e.to_string())),
            Err(_) => return Err(DialError::NoAnswer),
        };
        let _ = s.set_nodelay(true);
        if me.kind == pb::ConnKind::Control {
            user_timeout(&s, limit);
        } else {
            crate::session::keep_alive(&s, limit);
        }
        let (r, w) = s.into_split();
        match tokio::time::timeout(
            limit,
            auth::connect(BufReader::new(r), w, &self.cfg.key, me),
        )
        .await
        {
            Ok(Ok(x)) => Ok(x),
            Ok(Err(e)) => Err(DialError::Failed(e.to_string())),
            Err(_) => Err(DialError::NoAnswer),
        }
    }

    /// One control connection to `p`, used until it ends; how long it lasted when the
    /// peer closed it.
    async fn dial(&self, p: &Arc<Peer>) -> anyhow::Result<Duration> {
        let (hello, mut rd, wr) = self
            .dial_peer(p.addr, &self.identity(pb::ConnKind::Control))
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        if hello.node != p.id.get() {
            anyhow::bail!("{} answered as node {}", p.addr, hello.node);
        }
        // Waiting from before the writer is there: a send that gives this connection up
        // (`Sending`) ends the reading below, even on a connection gone silent.
        let broken = p.broken.notified();
        tokio::pin!(broken);
        *p.out.lock().await = Some(wr);
        p.links.send_modify(|n| *n += 1);
        let linked = Instant::now();
        debug!(node = %p.id, "linked");
        // Tell the peer who we are at once, not one heartbeat period later.
        p.send(&self.heartbeat()).await;
        loop {
            // A read cut short here is never resumed: the connection is given up.
            let f = tokio::select! {
                f = rd.read() => f,
                _ = &mut broken => anyhow::bail!("a frame could not be sent to it"),
            };
            match f {
                Ok(Some(pb::PeerFrame {
                    frame: Some(Frame::Reply(r)),
                })) => {
                    let tx = p.pending.lock().remove(&r.id);
                    if let (Some(tx), Some(reply)) = (tx, r.reply) {
                        let _ = tx.send(Ok(reply));
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => return Ok(linked.elapsed()),
                Err(e) => return Err(e.into()),
            }
        }
    }

    async fn serve_inbound(self: Arc<Self>, s: TcpStream, from: SocketAddr) {
        /// Inbound connections that may wait for their proof of the cluster key at once.
        const UNPROVEN_MAX: usize = 256;
        static UNPROVEN: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(UNPROVEN_MAX);
        let _ = s.set_nodelay(true);
        // Session connections may be silent for hours (control ones have heartbeats).
        crate::session::keep_alive(&s, self.cfg.dead_after());
        let (r, w) = s.into_split();
        let r = tokio::io::BufReader::new(r);
        // At most UNPROVEN connections wait for their proof of the key at once: a flood
        // of connections that never authenticate costs bounded memory and tasks (the
        // others are refused at once; real peers dial again).
        let Ok(_permit) = UNPROVEN.try_acquire() else {
            warn!(peer = %from, "refused: {UNPROVEN_MAX} connections are authenticating already");
            return;
        };
        // Nor may one host that is not a node of the cluster hold more than a few of them.
        let node_addr = self.peers.values().any(|p| p.addr.ip() == from.ip())
            || self
                .cfg
                .node(self.id)
                .is_ok_and(|n| n.addr.ip() == from.ip());
        let _source = match node_addr {
            true => None,
            false => match Unproven::take(from.ip()) {
                Some(u) => Some(u),
                None => {
                    warn!(
                        peer = %from,
                        "refused: {UNPROVEN_PER_SOURCE} connections from its address are \
                         authenticating already"
                    );
                    return;
                }
            },
        };
        // A connection that never says who it is does not hold a task for ever.
        let hello = tokio::time::timeout(
            self.cfg.dead_after(),
            auth::accept(r, w, &self.cfg.key, &self.identity(pb::ConnKind::Control)),
        )
        .await;
        drop(_permit);
        drop(_source);
        let (hello, mut rd, wr) = match hello {
            Ok(Ok(x)) => x,
            Ok(Err(e)) => {
                warn!(peer = %from, "refused: {e}");
                return;
            }
            Err(_) => {
                warn!(peer = %from, "refused: no hello within {} ms", self.cfg.dead_after_ms);
                return;
            }
        };
        // `accept` returned only after the peer proved the cluster key over this side's fresh
        // nonce and over its Hello (node, incarnation, kind): everything below, the fencing
        // check and `heard` (which counts the peer alive), rests on a proven Hello, never on
        // a replayed one.
        let Some(peer) = NodeId::new(hello.node).filter(|n| self.peers.contains_key(n)) else {
            warn!(peer = %from, node = hello.node, "refused: not a node of this cluster");
            return;
        };
        if self.is_fenced(peer, hello.incarnation) {
            warn!(
                node = %peer,
                incarnation = hello.incarnation,
                "refused: this incarnation was declared dead; it must fence itself to rejoin"
            );
            return;
        }
        match pb::ConnKind::try_from(hello.kind) {
            Ok(pb::ConnKind::Control) => {
                user_timeout(rd.get_ref().get_ref().as_ref(), self.cfg.dead_after());
            }
            Ok(pb::ConnKind::Session) => {
                crate::session::serve_remote(self, peer, rd, wr).await;
                return;
            }
            Ok(pb::ConnKind::Client) => {
                self.serve_link(peer, hello.incarnation, hello.creds, rd, wr)
                    .await;
                return;
            }
            Err(_) => {
                warn!(node = %peer, kind = hello.kind, "refused: unknown kind of connection");
                return;
            }
        }
        if !self.heard(peer, hello.incarnation, None) {
            return;
        }
        let wr = Arc::new(NamedAsyncMutex::new("peer.reply", wr));
        loop {
            match rd.read().await {
                Ok(Some(pb::PeerFrame { frame: Some(f) })) => match f {
                    Frame::Heartbeat(hb) => {
                        self.check_fenced(peer, &hb);
                        if !self.heard(peer, hello.incarnation, hb.info) {
                            return;
                        }
                    }
                    Frame::Request(req) => {
                        if !self.heard(peer, hello.incarnation, None) {
                            return;
                        }
                        // Quick requests are served here, with no task between the socket
                        // and the kernel (a remote signal's critical path); the others get
                        // a task so they do not hold up the connection.
                        let quick =
                            matches!(req.op, Some(Op::Signal(_) | Op::Status(_) | Op::Join(_)));
                        let (node, wr) = (self.clone(), wr.clone());
                        let serve = async move {
                            let id = req.id;
                            let f = reply_frame(id, node.handle_peer(peer, req).await);
                            let _ = wr.lock().await.write(&f).await;
                        };
                        if quick {
                            serve.await;
                        } else {
                            tokio::spawn(serve);
                        }
                    }
                    Frame::Goodbye(_) => {
                        info!(node = %peer, "node said goodbye");
                        if let Some(p) = self.peers.get(&peer) {
                            p.state.lock().goodbye = Some(hello.incarnation);
                        }
                        self.detect_failures();
                    }
                    _ => {}
                },
                Ok(_) => break,
                Err(e) => {
                    warn!(node = %peer, "dropping link: {e}");
                    break;
                }
            }
        }
    }

    /// Tells every peer this node is going away (they declare it dead at once).
    pub async fn say_goodbye(&self) {
        let f = pb::PeerFrame {
            frame: Some(Frame::Goodbye(true)),
        };
        for p in self.peers.values() {
            let _ = tokio::time::timeout(Duration::from_millis(200), p.send(&f)).await;
        }
    }

    /// Serves one request from a peer.
    pub(crate) async fn handle_peer(
        self: &Arc<Self>,
        from: NodeId,
        req: pb::PeerRequest,
    ) -> Result<Reply> {
        let creds = req.creds.unwrap_or_default();
        let op = req
            .op
            .ok_or_else(|| Error::Invalid("empty request".into()))?;
        let gpid = |raw: u64| {
            clan_core::Gpid::from_raw(raw)
                .ok_or_else(|| Error::Invalid(format!("invalid gpid {raw}")))
        };
        match op {
            Op::Spawn(s) => {
                let spec = s.spec.unwrap_or_default();
                if !spec.detached {
                    return Err(Error::Invalid(
                        "attached processes start on a session connection".into(),
                    ));
                }
                let vp = self
                    .spawn_local(crate::process::vproc::SpawnLocal {
                        spec,
                        creds: s.creds.unwrap_or(creds),
                        job: s.job,
                        rank: s.rank,
                        size: s.size,
                        parent_node: NodeId::new(s.parent_node).unwrap_or(from),
                        parent: s.parent,
                        pending: None,
                    })
                    .await?;
                Ok(Reply::Started(pb::Started {
                    gpids: vec![vp.gpid.raw()],
                    job: s.job,
                    nodes: vec![self.id.get()],
                    ..Default::default()
                }))
            }
            Op::Signal(s) => {
                self.signal_local_queued(gpid(s.gpid)?, s.signal, &creds, s.queued.as_ref())?;
                Ok(Reply::Ok(pb::Ok {}))
            }
            Op::Sigsend(s) => {
                let results = if s.fan_out {
                    let e = clan_core::sigset::parse(&s.expr)
                        .map_err(|e| Error::Invalid(format!("set expression: {e}")))?;
                    self.sigsend_fan_out(&e, &s.expr, s.signal, &creds).await?
                } else {
                    self.sigsend_local(&s.expr, s.signal, &creds).await
                };
                Ok(Reply::Kill(pb::KillReply { results }))
            }
            Op::Job(j) => {
                let tasks = self.job_here(j, creds).await?;
                Ok(Reply::Job(pb::NodeJobs {
                    node: self.id.get(),
                    tasks,
                    error: None,
                }))
            }
            Op::Proc(r) => Ok(Reply::Proc(self.proc_here(r).await?)),
            Op::Join(j) => {
                self.member_join(&j)?;
                Ok(Reply::Ok(pb::Ok {}))
            }
            Op::Orphan(o) => {
                let g = gpid(o.pgid)?;
                let node = self.clone();
                let part = tokio::task::spawn_blocking(move || node.orphan_part(g))
                    .await
                    .map_err(|e| Error::Internal(format!("orphan probe: {e}")))?;
                Ok(Reply::Orphan(part))
            }
            Op::Ps(p) => {
                let procs = self.ps_local(p.filter.unwrap_or_default()).await;
                Ok(Reply::Ps(pb::NodePs {
                    node: self.id.get(),
                    procs,
                    error: String::new(),
                }))
            }
            Op::Wait(w) => {
                let g = gpid(
                    *w.gpids
                        .first()
                        .ok_or_else(|| Error::Invalid("wait for nothing".into()))?,
                )?;
                let ws = self.wait_home(g, &creds, from).await?;
                Ok(Reply::Wait(pb::WaitReply {
                    results: vec![pb::WaitResult {
                        gpid: g.raw(),
                        status: Some(ws.into()),
                        ..Default::default()
                    }],
                }))
            }
            Op::Release(r) => {
                // Only the node that holds the parent's record may let the zombie go.
                let g = gpid(r.gpid)?;
                let parent = self.vprocs.read().get(&g).map(|v| v.parent_node);
                if parent == Some(from) {
                    self.release_local(g).await;
                } else {
                    debug!(gpid = %g, from = %from, "release from a node that is not its parent's: ignored");
                }
                Ok(Reply::Ok(pb::Ok {}))
            }
            Op::Status(st) => {
                gpid(st.gpid)?;
                self.child_status(&st);
                Ok(Reply::Ok(pb::Ok {}))
            }
            Op::Logs(l) => Ok(Reply::Log(
                self.logs_local(gpid(l.gpid)?, l.offset, l.follow, &creds)
                    .await?,
            )),
            Op::Stats(_) => Ok(Reply::Stats(self.lock_stats())),
            Op::ChildrenOf(_) => {
                let node = self.clone();
                let children = tokio::task::spawn_blocking(move || node.children_of(from))
                    .await
                    .map_err(|e| Error::Internal(format!("children of node {from}: {e}")))?;
                Ok(Reply::Children(children))
            }
            Op::Stub(p) => Ok(Reply::Stub(self.stub_here(p.pid, p.start))),
            Op::ParentExited(p) => {
                self.parent_exited_here(from, &p.gpids);
                Ok(Reply::Ok(pb::Ok {}))
            }
            Op::Reattach(_) => Err(Error::Invalid(
                "reattach is not supported on a control connection".into(),
            )),
        }
    }

    /// This node's lock counters.
    pub fn lock_stats(&self) -> pb::NodeLockStats {
        pb::NodeLockStats {
            node: self.id.get(),
            locks: clan_core::lock::snapshot()
                .into_iter()
                .filter(|s| !s.name.starts_with("test."))
                .map(|s| pb::LockStat {
                    name: s.name.to_string(),
                    acquisitions: s.acquisitions,
                    contended: s.contended,
                    wait_ns: s.wait_ns,
                    max_wait_ns: s.max_wait_ns,
                })
                .collect(),
            error: String::new(),
            tables: self.table_sizes(),
        }
    }

    /// Entries of each of the daemon's tables of processes, groups and waits.
    pub fn table_sizes(&self) -> Vec<pb::TableSize> {
        let (aliases, members) = self.group_table_sizes();
        [
            ("vprocs", self.vprocs.read().len()),
            ("children", self.children.lock().len()),
            ("parents", self.parents.lock().len()),
            ("group.aliases", aliases),
            ("group.members", members),
            (
                "group.links",
                self.link_holders.lock().values().map(Vec::len).sum(),
            ),
            ("spawning", self.spawning.lock().len()),
            (
                "direct.links",
                self.direct_links.lock().values().sum::<usize>(),
            ),
            (
                "sessions.spare",
                self.peers
                    .values()
                    .map(|p| p.spare_sessions.lock().len())
                    .sum(),
            ),
        ]
        .into_iter()
        .map(|(name, n)| pb::TableSize {
            name: name.into(),
            entries: n as u64,
        })
        .collect()
    }

    /// Notes a placement on `to` until its load surely has it: a peer's heartbeat
    /// [`Node::placement_settle`] later, or this node's sample when `to` is this node.
    pub fn note_placement(&self, to: NodeId) {
        if to == self.id {
            self.load.lock().placed.note();
        } else if let Some(p) = self.peers.get(&to) {
            p.state.lock().placed.note();
        }
    }

    /// How long after a placement a peer's heartbeat surely reports a load sample that has
    /// the process: a sampler's period (every `max(heartbeat_ms, 250 ms)`, as lib.rs runs
    /// it) and [`crate::node::SPAWN_ALLOWANCE`] for the spawn.
    pub fn placement_settle(&self) -> Duration {
        Duration::from_millis(self.cfg.heartbeat_ms.max(250)) + crate::node::SPAWN_ALLOWANCE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clan_proto::auth::PeerReader;
    use clan_proto::FrameError;
    use tokio::net::TcpSocket;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn me(node: u32) -> Identity {
        Identity {
            node,
            incarnation: node as u64,
            cluster: "t".into(),
            kind: pb::ConnKind::Control,
            creds: None,
        }
    }

    /// An authenticated connection over loopback with small socket buffers: our writer and
    /// the far end's reader, which reads only when asked.
    async fn linked() -> (
        PeerWriter<OwnedWriteHalf>,
        OwnedReadHalf,
        PeerReader<BufReader<OwnedReadHalf>>,
        SocketAddr,
    ) {
        let ls = TcpSocket::new_v4().unwrap();
        ls.set_recv_buffer_size(16 << 10).unwrap();
        ls.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let l = ls.listen(4).unwrap();
        let addr = l.local_addr().unwrap();
        let cs = TcpSocket::new_v4().unwrap();
        cs.set_send_buffer_size(16 << 10).unwrap();
        let dial = async {
            let (r, w) = cs.connect(addr).await.unwrap().into_split();
            let (_, rd, wr) = auth::connect(BufReader::new(r), w, KEY, &me(1))
                .await
                .unwrap();
            (rd.into_inner().into_inner(), wr)
        };
        let take = async {
            let (r, w) = l.accept().await.unwrap().0.into_split();
            let (_, rd, _) = auth::accept(BufReader::new(r), w, KEY, &me(2))
                .await
                .unwrap();
            rd
        };
        let ((ours, wr), far) = tokio::join!(dial, take);
        (wr, ours, far, addr)
    }

    fn output(n: usize) -> pb::PeerFrame {
        pb::PeerFrame {
            frame: Some(Frame::Output(pb::SessionOutput {
                gpid: 1,
                output: Some(pb::session_output::Output::Stdout(vec![7; n])),
            })),
        }
    }

    /// Guards the review finding "a cancelled `Peer::send` breaks the shared control
    /// connection": a send dropped in the middle of its write (its caller's timeout) leaves
    /// no writer behind whose next frame would fail the peer's MAC check or be read as the
    /// rest of the cut one; the dial loop is woken to dial again, and the peer sees the
    /// connection end within the cut frame.
    #[tokio::test]
    async fn a_send_cut_off_halfway_gives_the_connection_up() {
        let (wr, _ours, mut far, addr) = linked().await;
        let p = Peer::new(NodeId::new(2).unwrap(), addr, Duration::from_secs(600));
        let broken = p.broken.notified();
        tokio::pin!(broken);
        *p.out.lock().await = Some(wr);
        assert!(p.send(&output(10)).await, "a small frame is sent");
        assert_eq!(far.read().await.unwrap().unwrap(), output(10));
        // Far more than both sockets' buffers hold, with nobody reading: the write can not
        // finish, and the caller's timeout cuts it off.
        let cut = tokio::time::timeout(Duration::from_millis(200), p.send(&output(4 << 20))).await;
        assert!(cut.is_err(), "a 4 MiB frame went into the buffers whole");
        assert!(
            p.out.lock().await.is_none(),
            "the writer of a cut frame was kept"
        );
        tokio::time::timeout(Duration::from_secs(10), &mut broken)
            .await
            .expect("the dial loop was not woken");
        assert!(!p.send(&output(10)).await, "sent on a given-up connection");
        // The peer reads what came of the cut frame, then the end of the connection: an
        // error, never a frame.
        let e = far.read().await.unwrap_err();
        assert!(matches!(e, FrameError::Truncated), "{e}");
    }

    #[tokio::test]
    async fn control_connections_give_up_on_unacknowledged_data_after_dead_after() {
        let (wr, ours, _far, _) = linked().await;
        let s = ours.reunite(wr.into_inner()).unwrap();
        user_timeout(&s, Duration::from_millis(2500));
        use nix::sys::socket::{getsockopt, sockopt};
        assert_eq!(getsockopt(&s, sockopt::TcpUserTimeout).unwrap(), 2500);
    }

    #[test]
    fn one_source_holds_at_most_its_share_of_unproven_connections() {
        let ip: std::net::IpAddr = "192.0.2.7".parse().unwrap();
        let held: Vec<_> = (0..UNPROVEN_PER_SOURCE)
            .map(|_| Unproven::take(ip).expect("room"))
            .collect();
        assert!(Unproven::take(ip).is_none(), "one more than the cap");
        assert!(Unproven::take("192.0.2.8".parse().unwrap()).is_some());
        drop(held);
        assert!(
            unproven_by_source().lock().get(&ip).is_none(),
            "not forgotten"
        );
        assert!(Unproven::take(ip).is_some());
    }
}
