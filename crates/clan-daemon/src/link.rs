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
/// when it needs one). Once a request's first byte came, the rest of it has less time:
/// `dead_after` (see `Paced`).
pub const LINK_IDLE: Duration = Duration::from_secs(300);

/// How long a link's thread polls for the next request, rather than sleeping for it, once
/// its client asks one thing right after another (a request within this time of the
/// answer before it). A thread that sleeps leaves its CPU idle, and on a virtual machine
/// whose idle CPUs halt, the next request must wake that CPU with an interrupt from the
/// client's (about 50 us on the VMs clan is measured on); one that polls is not halted. A
/// link used now and then sleeps between requests and costs no CPU.
pub const LINK_SPIN: Duration = Duration::from_micros(300);

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

/// The reading side of a link's socket: between requests a read waits up to [`LINK_IDLE`]
/// for the next one's first byte; from that byte on, the whole request must have come
/// within `whole`, however its bytes trickle in (each read waits only what is left), else
/// the read fails with `TimedOut` and the link is closed.
struct Paced<'a> {
    stream: &'a std::net::TcpStream,
    whole: Duration,
    /// When the request being read must be complete (`None`: none begun).
    due: Option<std::time::Instant>,
    /// The socket's read timeout as last set (set only when it changes).
    timeout: Duration,
}

impl<'a> Paced<'a> {
    /// `stream`'s read timeout must be [`LINK_IDLE`].
    fn new(stream: &'a std::net::TcpStream, whole: Duration) -> Paced<'a> {
        Paced {
            stream,
            whole,
            due: None,
            timeout: LINK_IDLE,
        }
    }

    /// The next request is read from here; `begun` if bytes of it came already.
    fn next_request(&mut self, begun: bool) {
        self.due = begun.then(|| std::time::Instant::now() + self.whole);
    }

    /// Whether a request began (its first byte came).
    fn begun(&self) -> bool {
        self.due.is_some()
    }

    fn set_timeout(&mut self, t: Duration) -> std::io::Result<()> {
        if t != self.timeout {
            self.stream.set_read_timeout(Some(t))?;
            self.timeout = t;
        }
        Ok(())
    }
}

impl std::io::Read for Paced<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self.due {
            None => self.set_timeout(LINK_IDLE)?,
            Some(due) => {
                let left = due.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "request not complete in time",
                    ));
                }
                self.set_timeout(left)?;
            }
        }
        let n = std::io::Read::read(&mut self.stream, buf)?;
        if n > 0 && self.due.is_none() {
            self.due = Some(std::time::Instant::now() + self.whole);
        }
        Ok(n)
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
        // A client that stops reading its answers, or sends a request a byte at a time,
        // does not hold the thread for ever.
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
        let paced = Paced::new(&stream, stuck);
        let mut rd = PeerReader::from_parts(std::io::BufReader::new(paced), rk);
        let mut wr = PeerWriter::from_parts(&stream, wk);
        if wr.write_sync(&verdict(Ok(Reply::Ok(pb::Ok {})))).is_err() {
            return;
        }
        debug!(node = %from, uid, pid, "link opened");
        // When the last answer went, and whether the request before came within
        // [`LINK_SPIN`] of the answer before it (the client asks one thing after another).
        let (mut answered, mut busy) = (std::time::Instant::now(), false);
        let mut spin = clan_core::sys::Spinner::default();
        loop {
            // A request begins: bytes of it read ahead with the last one started its clock.
            let begun = !rd.get_ref().buffer().is_empty();
            if !begun && busy {
                use std::os::fd::AsFd;
                spin.wait(stream.as_fd(), LINK_SPIN);
            }
            rd.get_mut().get_mut().next_request(begun);
            let frame = rd.read_max_sync(MAX_LINK_FRAME);
            spin.arrived();
            let req = match frame {
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
                    if rd.get_ref().get_ref().begun() {
                        debug!(
                            node = %from,
                            "dropping a link: a request not complete within {} ms of its first byte",
                            stuck.as_millis()
                        );
                    } else {
                        debug!(node = %from, "closing a link idle for {} s", LINK_IDLE.as_secs());
                    }
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
            busy = answered.elapsed() < LINK_SPIN;
            let f = reply_frame(req.id, self.request(req));
            if wr.write_sync(&f).is_err() {
                break;
            }
            answered = std::time::Instant::now();
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
                    Ok(P::ProcRead | P::ProcReadlink | P::ProcReaddir | P::ProcStatLink)
                ) {
                    return Err(Error::Invalid(
                        "a link reads the files of one process at a time".into(),
                    ));
                }
                here(p.gpid)?;
                // As the client's own node decides: a root client (the view server) reads
                // on behalf of its callers, anyone else as itself.
                p.reader = Some(crate::procfs::delegated(p.reader.take(), creds));
                Ok(Reply::Proc(node.proc_local(&p)?))
            }
            _ => Err(Error::Invalid(
                "a link carries signals and /proc reads only".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Paced, LINK_IDLE};
    use clan_proto::frame::read_raw_max_sync;
    use clan_proto::FrameError;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (served, _) = l.accept().unwrap();
        served.set_read_timeout(Some(LINK_IDLE)).unwrap();
        (client, served)
    }

    /// A request sent a byte at a time must still arrive whole within the limit from its
    /// first byte: each byte does not start the wait again.
    #[test]
    fn a_trickled_request_times_out_from_its_first_byte() {
        let (mut client, served) = pair();
        let whole = Duration::from_millis(300);
        let trickle = std::thread::spawn(move || {
            // A 1,000-byte frame, a byte each 20 ms (20 s whole), until the link closes.
            let mut frame = 1000u32.to_be_bytes().to_vec();
            frame.resize(1004, 0);
            for b in frame {
                if client.write_all(&[b]).is_err() {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            false
        });
        let mut rd = std::io::BufReader::new(Paced::new(&served, whole));
        rd.get_mut().next_request(false);
        let t = Instant::now();
        let e = read_raw_max_sync(&mut rd, 64 << 10).unwrap_err();
        let took = t.elapsed();
        match e {
            FrameError::Io(e) => assert!(
                matches!(
                    e.kind(),
                    std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                ),
                "{e}"
            ),
            other => panic!("{other}"),
        }
        assert!(rd.get_ref().begun());
        assert!(took >= whole, "gave up after {took:?}");
        assert!(took < Duration::from_secs(5), "took {took:?}");
        drop(rd);
        drop(served);
        assert!(trickle.join().unwrap(), "the whole frame went through");
    }

    /// Between requests only the idle limit counts: a request that comes later than the
    /// per-request limit, whole, is read, and so is one split in a few quick writes.
    #[test]
    fn an_idle_link_waits_longer_than_a_request() {
        let (mut client, served) = pair();
        // The split request's second write comes 20 ms after its first, well within the
        // limit even on a busy machine.
        let whole = Duration::from_secs(1);
        let sender = std::thread::spawn(move || {
            std::thread::sleep(whole * 2);
            client.write_all(&[0, 0, 0, 3, b'a']).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            client.write_all(b"bc").unwrap();
            client.write_all(&[0, 0, 0, 1, b'd']).unwrap();
            client
        });
        let mut rd = std::io::BufReader::new(Paced::new(&served, whole));
        rd.get_mut().next_request(false);
        assert_eq!(read_raw_max_sync(&mut rd, 64).unwrap().unwrap(), b"abc");
        let begun = !rd.buffer().is_empty();
        rd.get_mut().next_request(begun);
        assert_eq!(read_raw_max_sync(&mut rd, 64).unwrap().unwrap(), b"d");
        drop(sender.join().unwrap());
        rd.get_mut().next_request(false);
        assert!(read_raw_max_sync(&mut rd, 64).unwrap().is_none());
    }
}
