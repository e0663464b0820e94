//! Direct links (docs/links.md): a client's own connection to another node.
//!
//! A signal to a process of another node, or a read of one of its /proc files, otherwise
//! crosses two connections each way: the client's to its cland, and that cland's to the
//! node. A client that asks many such questions of one node (the /proc view server, a
//! program that signals its peers) asks its cland for a link: the cland dials the node as
//! that client (a connection of kind CLIENT whose Hello carries the client's credentials,
//! covered by both proofs of the handshake, so only a node with the cluster key can vouch
//! for them), then hands the connected socket over (SCM_RIGHTS) with the connection's
//! session key and sequence numbers. The client goes on with the connection's MAC'd frames
//! itself; it never holds the cluster key, and the session key authenticates that one
//! connection only. The node serves exactly what its peers would ask of it for this client:
//! signals to its processes and reads of their /proc files, as the credentials of the
//! Hello, whatever a request says.

use crate::error::{Error, Result};
use crate::node::Node;
use crate::peer::{is_down, reply_frame};
use crate::process::view::ProcHandle;
use clan_core::{Gpid, NodeId};
use clan_proto::auth::{PeerReader, PeerWriter, ReaderKeys, WriterKeys};
use clan_proto::pb::{self, peer_frame::Frame, peer_reply::Reply, peer_request::Op};
use clan_proto::FrameError;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::BufReader;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tracing::{debug, warn};

/// Links a node serves at once; more are refused (their clients go through their cland).
pub const MAX_LINKS: usize = 1024;

/// Links a node serves at once to one user (not root) of one other node: one user can not
/// take all of [`MAX_LINKS`].
pub const MAX_LINKS_PER_USER: usize = 64;

/// A link that carries no request for this long is closed (its client opens another
/// when it needs one).
pub const LINK_IDLE: Duration = Duration::from_secs(300);

/// Largest request frame on a link: a signal or a /proc read is some hundred bytes, and a
/// client, unlike a peer, holds a session key of its own.
pub const MAX_LINK_FRAME: usize = 64 << 10;

static LINKS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_LINKS);

/// The first frame of a link, from the node that serves it: `Ok` once it took the link,
/// an error (why not) before it closes it.
fn verdict(res: Result<Reply>) -> pb::PeerFrame {
    reply_frame(0, res)
}

/// One link counted in [`Node::direct_links`] until dropped.
struct Counted {
    node: Arc<Node>,
    key: (NodeId, u32),
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut links = self.node.direct_links.lock();
        if let Some(n) = links.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                links.remove(&self.key);
            }
        }
    }
}

impl Node {
    /// Dials node `to` for a local client with `creds` and returns the connection with
    /// what the client needs to go on with it.
    pub async fn open_link(
        &self,
        to: NodeId,
        creds: &pb::Creds,
    ) -> Result<(pb::LinkReply, std::net::TcpStream)> {
        if to == self.id {
            return Err(Error::Invalid(format!(
                "node {to} is this node: a link goes to another node"
            )));
        }
        let p = self.peer(to)?;
        if is_down(p.state_name(&self.cfg, self.started)) {
            return Err(Error::NodeDown(format!("node {to} is down")));
        }
        let unreachable = |e: &dyn std::fmt::Display| {
            Error::NodeDown(format!("node {to} is unreachable for a link: {e}"))
        };
        let limit = self.cfg.dead_after();
        let mut me = self.identity(pb::ConnKind::Client);
        me.creds = Some(creds.clone());
        let (hello, rd, wr) = self
            .dial_peer(p.addr, &me)
            .await
            .map_err(|e| unreachable(&e))?;
        if hello.node != to.get() {
            return Err(unreachable(&format!(
                "{} answered as node {}",
                p.addr, hello.node
            )));
        }
        // The node's verdict first: a link it refuses (too many) is not handed over, and
        // the client goes through this cland instead.
        let mut rd = rd;
        match tokio::time::timeout(limit, rd.read_max(MAX_LINK_FRAME)).await {
            Ok(Ok(Some(pb::PeerFrame {
                frame:
                    Some(Frame::Reply(pb::PeerReply {
                        id: 0,
                        reply: Some(Reply::Ok(_)),
                    })),
            }))) => {}
            Ok(Ok(Some(pb::PeerFrame {
                frame:
                    Some(Frame::Reply(pb::PeerReply {
                        reply: Some(Reply::Error(e)),
                        ..
                    })),
            }))) => {
                return Err(Error::NodeDown(format!(
                    "node {to} refused a link: {}",
                    e.message
                )))
            }
            Ok(Ok(_)) => return Err(unreachable(&"no answer to a link")),
            Ok(Err(e)) => return Err(unreachable(&e)),
            Err(_) => return Err(unreachable(&"no answer to a link")),
        }
        let reply = pb::LinkReply {
            node: to.get(),
            session_key: wr.session_key().to_vec(),
            write_seq: wr.seq(),
            read_seq: rd.seq(),
            dead_after_ms: self.cfg.dead_after_ms as u32,
        };
        let r = rd.into_inner();
        // The node says nothing before it is asked; bytes read ahead here would be lost.
        if !r.buffer().is_empty() {
            return Err(Error::Internal(format!(
                "node {to} sent frames on a new link before any request"
            )));
        }
        let s = r
            .into_inner()
            .reunite(wr.into_inner())
            .map_err(|e| Error::Internal(format!("link to node {to}: {e}")))?;
        let s = s
            .into_std()
            .map_err(|e| Error::internal(&format!("link to node {to}"), e))?;
        Ok((reply, s))
    }

    /// Serves a link a peer (its incarnation `incarnation`) opened for one of its clients,
    /// whose credentials its Hello carried: one request at a time, in order, until the
    /// client hangs up, stays silent for [`LINK_IDLE`], or its node's incarnation is fenced.
    ///
    /// A link taken is served by a thread of its own, with blocking reads and writes: a
    /// request then wakes that thread straight from the socket, and the thread answers it
    /// with the system calls the request needs and nothing else (no runtime between the
    /// socket and the kernel, which on these VMs cost more than the request itself).
    /// Everything a link carries is served without waiting for anything but the kernel.
    pub async fn serve_link(
        self: &Arc<Self>,
        from: NodeId,
        incarnation: u64,
        creds: Option<pb::Creds>,
        rd: PeerReader<BufReader<OwnedReadHalf>>,
        mut wr: PeerWriter<OwnedWriteHalf>,
    ) {
        let refuse = |why: String| verdict(Err(Error::NodeDown(why)));
        let Some(creds) = creds else {
            warn!(node = %from, "refused a link without credentials");
            let _ = wr.write(&refuse("a link needs credentials".into())).await;
            return;
        };
        let Ok(permit) = LINKS.try_acquire() else {
            warn!(node = %from, "refused a link: {MAX_LINKS} links are open already");
            let why = format!("{MAX_LINKS} links are open already");
            let _ = wr.write(&refuse(why)).await;
            return;
        };
        let key = (from, creds.uid);
        let taken = {
            let mut links = self.direct_links.lock();
            let n = links.entry(key).or_insert(0);
            let room = creds.uid == 0 || *n < MAX_LINKS_PER_USER;
            if room {
                *n += 1;
            }
            room
        };
        if !taken {
            warn!(node = %from, uid = creds.uid, "refused a link: {MAX_LINKS_PER_USER} open for this user");
            let why = format!(
                "uid {} has {MAX_LINKS_PER_USER} links open already",
                creds.uid
            );
            let _ = wr.write(&refuse(why)).await;
            return;
        }
        let counted = Counted {
            node: self.clone(),
            key,
        };
        // The client says nothing before the verdict: nothing is buffered that the
        // thread's reader would miss.
        let (r, rk) = rd.into_parts();
        if !r.buffer().is_empty() {
            warn!(node = %from, "dropping a link: frames before its verdict");
            return;
        }
        let (w, wk) = wr.into_parts();
        let stream = match r.into_inner().reunite(w).map(|s| s.into_std()) {
            Ok(Ok(s)) => s,
            _ => return,
        };
        let link = Served {
            node: self.clone(),
            from,
            incarnation,
            creds,
            _permit: permit,
            _counted: counted,
            held: None,
        };
        let spawned = std::thread::Builder::new()
            .name("clan-link".into())
            .spawn(move || link.serve(stream, rk, wk));
        if let Err(e) = spawned {
            // The link is dropped unanswered: its dialing cland sends the client through
            // itself.
            warn!(node = %from, "dropping a link: no thread for it: {e}");
        }
    }
}

/// A link taken, counted until its thread ends.
struct Served {
    node: Arc<Node>,
    from: NodeId,
    incarnation: u64,
    creds: pb::Creds,
    _permit: tokio::sync::SemaphorePermit<'static>,
    _counted: Counted,
    /// The process this link signalled last, kept open while it lives.
    held: Option<ProcHandle>,
}

impl Served {
    /// The link's thread: the verdict, then one request after the other.
    fn serve(mut self, stream: std::net::TcpStream, rk: ReaderKeys, wk: WriterKeys) {
        let from = self.from;
        let (uid, pid) = (self.creds.uid, self.creds.pid);
        // A client that stops reading its answers does not hold the thread for ever.
        let stuck = self.node.cfg.dead_after().max(Duration::from_millis(100));
        let set_up = stream.set_nonblocking(false).and_then(|()| {
            stream.set_read_timeout(Some(LINK_IDLE))?;
            stream.set_write_timeout(Some(stuck))
        });
        if let Err(e) = set_up {
            warn!(node = %from, "dropping a link: {e}");
            return;
        }
        // One descriptor for both directions (`&TcpStream` reads and writes).
        let mut rd = PeerReader::from_parts(std::io::BufReader::new(&stream), rk);
        let mut wr = PeerWriter::from_parts(&stream, wk);
        if wr.write_sync(&verdict(Ok(Reply::Ok(pb::Ok {})))).is_err() {
            return;
        }
        debug!(node = %from, uid, pid, "link opened");
        loop {
            let req = match rd.read_max_sync(MAX_LINK_FRAME) {
                Ok(Some(pb::PeerFrame {
                    frame: Some(Frame::Request(req)),
                })) => req,
                Ok(None) => break,
                Ok(Some(_)) => {
                    warn!(node = %from, "dropping a link: a frame other than a request");
                    break;
                }
                Err(FrameError::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    debug!(node = %from, "closing a link idle for {} s", LINK_IDLE.as_secs());
                    break;
                }
                Err(e) => {
                    debug!(node = %from, "dropping a link: {e}");
                    break;
                }
            };
            // The node that vouched for the client was declared dead since: its clients'
            // links end with it.
            if self.node.is_fenced(from, self.incarnation) {
                break;
            }
            let f = reply_frame(req.id, self.request(req));
            if wr.write_sync(&f).is_err() {
                break;
            }
        }
        debug!(node = %from, uid, pid, "link closed");
    }

    /// One request of the link, served as its peer would have asked for the client.
    fn request(&mut self, req: pb::PeerRequest) -> Result<Reply> {
        let Served {
            node, creds, held, ..
        } = self;
        let here = |raw: u64| match Gpid::from_raw(raw) {
            Some(g) if g.node() == node.id => Ok(g),
            _ => Err(Error::Invalid(format!(
                "{raw} is not a process of node {}",
                node.id
            ))),
        };
        match req.op {
            Some(Op::Signal(s)) => {
                let g = here(s.gpid)?;
                let q = s.queued.as_ref();
                node.signal_local_with(g, s.signal, creds, q, held)?;
                Ok(Reply::Ok(pb::Ok {}))
            }
            Some(Op::Proc(mut p)) => {
                use pb::ProcOp as P;
                if !matches!(
                    P::try_from(p.op),
                    Ok(P::ProcRead | P::ProcReadlink | P::ProcReaddir)
                ) {
                    return Err(Error::Invalid(
                        "a link reads the files of one process at a time".into(),
                    ));
                }
                here(p.gpid)?;
                // As the client's own node decides: a root client (the view server) reads
                // on behalf of its callers, anyone else as itself.
                let reader = match p.reader.take() {
                    Some(r) if creds.uid == 0 => r,
                    _ => creds.clone(),
                };
                p.reader = Some(reader);
                Ok(Reply::Proc(node.proc_local(&p)?))
            }
            _ => Err(Error::Invalid(
                "a link carries signals and /proc reads only".into(),
            )),
        }
    }
}
