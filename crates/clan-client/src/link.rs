//! Direct links to other nodes (docs/links.md).
//!
//! A client that keeps asking one other node for signals to its processes or reads of
//! their /proc files asks its cland, at the [`LINK_AFTER`]th such request, for a link: a
//! connection to that node which its cland dialed and authenticated as this client, handed
//! over with the connection's session key (never the cluster key). Those requests then
//! cross one connection instead of two. A link that can not be had, or breaks, sends the
//! requests through cland again; a new link is tried after [`RETRY_AFTER`].

use crate::{ClientError, Result};
use clan_core::unixconn::UnixConn;
use clan_core::NodeId;
use clan_proto::auth::{self, PeerReader, PeerWriter};
use clan_proto::pb::{self, local_reply::Reply, local_request::Op, peer_frame::Frame};
use clan_proto::write_frame;
use prost::Message;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::BufReader;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// Requests to one node that go through cland before a link to it is asked for: a
/// command that signals or reads once does not pay for a link it will not use.
pub const LINK_AFTER: u32 = 2;

/// How long a node a link could not be had to (or whose link broke) is asked through
/// cland before a link is tried again.
pub const RETRY_AFTER: Duration = Duration::from_secs(10);

type Io = (
    PeerReader<BufReader<OwnedReadHalf>>,
    PeerWriter<OwnedWriteHalf>,
);

/// One link: requests are sent and answered one at a time.
struct Link {
    io: tokio::sync::Mutex<Io>,
    /// False while a request is between its write and its whole answer: a call dropped
    /// there (its caller timed out) leaves the connection in the middle of a frame, and
    /// the link is not used again.
    clean: AtomicBool,
    next: AtomicU64,
    /// A request the node does not answer within this is lost, and so is the link.
    limit: Duration,
}

enum Slot {
    /// Requests to the node so far, through cland.
    Counting(u32),
    /// A link is being asked for; meanwhile requests go through cland.
    Opening,
    Ready(Arc<Link>),
    /// No link until then.
    Off(Instant),
}

/// How a request on a link went.
pub(crate) enum Sent {
    /// There is no link to the node (yet): ask cland.
    NoLink,
    /// The node answered.
    Answered(pb::peer_reply::Reply),
    /// The link broke after the request was sent: the node may or may not have acted.
    Lost(pb::Error),
}

/// A client's links, by node.
#[derive(Default)]
pub(crate) struct Links {
    slots: parking_lot::Mutex<HashMap<NodeId, Slot>>,
    /// Everything through cland ([`crate::Client::without_links`]).
    pub(crate) off: bool,
}

impl Links {
    /// The link to `node` if there is one; else counts the request, and returns true
    /// when it is time to ask for a link (the caller then calls [`Links::open`]).
    fn link_or_count(&self, node: NodeId, now: bool) -> (Option<Arc<Link>>, bool) {
        let mut slots = self.slots.lock();
        let slot = slots.entry(node).or_insert(Slot::Counting(0));
        match slot {
            Slot::Ready(l) => (Some(l.clone()), false),
            Slot::Opening => (None, false),
            Slot::Off(until) if Instant::now() < *until && !now => (None, false),
            Slot::Off(_) => {
                *slot = Slot::Opening;
                (None, true)
            }
            Slot::Counting(n) if *n + 1 > LINK_AFTER || now => {
                *slot = Slot::Opening;
                (None, true)
            }
            Slot::Counting(n) => {
                *n += 1;
                (None, false)
            }
        }
    }

    fn set(&self, node: NodeId, slot: Slot) {
        self.slots.lock().insert(node, slot);
    }

    /// Gives up `link` to `node`, unless a newer one took its place.
    fn drop_link(&self, node: NodeId, link: &Arc<Link>) {
        let mut slots = self.slots.lock();
        if let Some(Slot::Ready(l)) = slots.get(&node) {
            if Arc::ptr_eq(l, link) {
                slots.insert(node, Slot::Off(Instant::now() + RETRY_AFTER));
            }
        }
    }

    /// Sends `op` to `node` on its link, opening the link through cland at `path` when it
    /// is time to (with `now`, at once). An error only when `now` and no link could be had.
    pub(crate) async fn send(
        &self,
        path: &Path,
        node: NodeId,
        op: pb::peer_request::Op,
        now: bool,
    ) -> Result<Sent> {
        if self.off && !now {
            return Ok(Sent::NoLink);
        }
        let link = match self.link_or_count(node, now) {
            (Some(l), _) => l,
            (None, false) => return Ok(Sent::NoLink),
            (None, true) => {
                // Until the link is there, the slot says Opening; an open whose caller
                // gave up (its future dropped) must not leave it so for ever.
                let mut opening = Opening {
                    links: self,
                    node,
                    done: false,
                };
                // Boxed: inline, the open (once per link, with its 4 KiB receive buffer)
                // made the future of every `Client::proc` 5.8 KiB, not 1.8.
                let res = Box::pin(open(path, node)).await;
                opening.done = true;
                match res {
                    Ok(l) => {
                        let l = Arc::new(l);
                        self.set(node, Slot::Ready(l.clone()));
                        l
                    }
                    Err(e) => {
                        self.set(node, Slot::Off(Instant::now() + RETRY_AFTER));
                        return if now { Err(e) } else { Ok(Sent::NoLink) };
                    }
                }
            }
        };
        Ok(match link.call(op).await {
            Ok(r) => Sent::Answered(r),
            Err(sent) => {
                self.drop_link(node, &link);
                if sent {
                    Sent::Lost(pb::Error::new(
                        pb::ErrorCode::NodeDown,
                        format!("lost connection to node {node}"),
                    ))
                } else {
                    Sent::NoLink
                }
            }
        })
    }
}

/// Sets a node's slot back to Off if the open it stands for never finished.
struct Opening<'a> {
    links: &'a Links,
    node: NodeId,
    done: bool,
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.links
                .set(self.node, Slot::Off(Instant::now() + RETRY_AFTER));
        }
    }
}

impl Link {
    /// Sends `op` and waits for its answer. Err(true) when the request was sent and the link
    /// broke or the node did not answer in time, Err(false) when it was not sent.
    async fn call(
        &self,
        op: pb::peer_request::Op,
    ) -> std::result::Result<pb::peer_reply::Reply, bool> {
        let mut io = self.io.lock().await;
        if !self.clean.swap(false, Ordering::AcqRel) {
            return Err(false);
        }
        let (rd, wr) = &mut *io;
        // A link whose node closed it meanwhile (its cland restarted, or it was idle too
        // long) is seen here, before a signal is sent into it: the signal then goes
        // through cland, not lost. A read is sent without that look (one system call
        // less): one the closed link loses is asked again through cland by its caller
        // ([`crate::Client::proc`]), as reads change nothing.
        if matches!(op, pb::peer_request::Op::Signal(_)) && closed(rd) {
            return Err(false);
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let f = pb::PeerFrame {
            frame: Some(Frame::Request(pb::PeerRequest {
                id,
                creds: None, // the node serves the link as the credentials it was opened with
                op: Some(op),
            })),
        };
        match tokio::time::timeout(self.limit, wr.write(&f)).await {
            Ok(Ok(())) => {}
            _ => return Err(false),
        }
        let answer = tokio::time::timeout(self.limit, async {
            loop {
                match rd.read().await {
                    Ok(Some(pb::PeerFrame {
                        frame: Some(Frame::Reply(r)),
                    })) if r.id == id => return r.reply.ok_or(()),
                    Ok(Some(_)) => continue,
                    _ => return Err(()),
                }
            }
        })
        .await;
        match answer {
            Ok(Ok(r)) => {
                self.clean.store(true, Ordering::Release);
                Ok(r)
            }
            _ => Err(true),
        }
    }
}

/// Whether the node closed the link (end of stream or an error waiting to be read), seen
/// without reading: nothing is due between requests.
fn closed(rd: &mut PeerReader<BufReader<OwnedReadHalf>>) -> bool {
    let half = rd.get_mut().get_mut();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut byte = [0u8; 1];
    let mut buf = tokio::io::ReadBuf::new(&mut byte);
    matches!(
        half.poll_peek(&mut cx, &mut buf),
        std::task::Poll::Ready(Ok(0) | Err(_))
    )
}

/// Asks cland at `path` for a link to `node`, on a connection of its own (the socket
/// comes with the reply): the socket, as cland passed it, and what cland said of it.
async fn ask(path: &Path, node: NodeId) -> Result<(std::net::TcpStream, pb::LinkReply)> {
    let (mut rd, mut wr) = UnixConn::connect(path).await?.into_split();
    let req = pb::LocalRequest {
        id: 1,
        op: Some(Op::Link(pb::LinkRequest { node: node.get() })),
    };
    write_frame(&mut wr, &req).await?;
    let (mut buf, mut fds) = (Vec::new(), Vec::new());
    let len = loop {
        if let Some(head) = buf.get(..4) {
            let len = u32::from_be_bytes(head.try_into().expect("4 bytes")) as usize;
            if len > clan_proto::MAX_FRAME {
                return Err(ClientError::Protocol(format!("link reply of {len} bytes")));
            }
            if buf.len() >= 4 + len {
                break len;
            }
        }
        let mut chunk = [0u8; 4096];
        let (n, f) = rd.recv_with_fds(&mut chunk).await?;
        fds.extend(f);
        if n == 0 {
            return Err(ClientError::Protocol("cland closed the connection".into()));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let reply = pb::LocalReply::decode(&buf[4..4 + len])
        .map_err(|e| ClientError::Protocol(format!("link reply: {e}")))?;
    let link = match reply.reply {
        Some(Reply::Link(l)) => l,
        Some(Reply::Error(e)) => return Err(ClientError::Remote(e)),
        other => return Err(ClientError::Protocol(format!("unexpected reply {other:?}"))),
    };
    let fd = fds
        .pop()
        .ok_or_else(|| ClientError::Protocol("no socket came with the link".into()))?;
    Ok((std::net::TcpStream::from(fd), link))
}

/// The keyed halves of a link's connection, as cland handed it over.
fn keyed<R, W>(r: R, w: W, link: &pb::LinkReply) -> Result<(PeerReader<R>, PeerWriter<W>)> {
    auth::resume(r, w, &link.session_key, link.write_seq, link.read_seq)
        .ok_or_else(|| ClientError::Protocol("a link's session key of the wrong size".into()))
}

/// Asks cland at `path` for a link to `node`.
async fn open(path: &Path, node: NodeId) -> Result<Link> {
    let (s, link) = ask(path, node).await?;
    s.set_nonblocking(true)?;
    let (r, w) = tokio::net::TcpStream::from_std(s)?.into_split();
    let (rd, wr) = keyed(BufReader::new(r), w, &link)?;
    Ok(Link {
        io: tokio::sync::Mutex::new((rd, wr)),
        clean: AtomicBool::new(true),
        next: AtomicU64::new(1),
        limit: Duration::from_millis(u64::from(link.dead_after_ms.max(100))),
    })
}

/// A link called with blocking I/O from a thread of the caller's own (a FUSE loop
/// thread, which can wait for a quick answer): the node's answer wakes that thread
/// straight from its socket, with no runtime's thread in between. Requests are answered
/// one at a time, each within the limit it was opened with.
pub struct BlockingLink {
    rd: PeerReader<std::io::BufReader<std::net::TcpStream>>,
    wr: PeerWriter<std::net::TcpStream>,
    next: u64,
    /// How long a call may wait, and the socket's receive timeout now (shortened within a
    /// call that waits through frames not its answer).
    limit: Duration,
    timeout: Duration,
    /// Polls for answers before sleeping for them.
    spin: clan_core::sys::Spinner,
}

/// Why a [`BlockingLink::call`] has no answer. The link is not to be used again either way.
#[derive(Debug, PartialEq, Eq)]
pub enum Unanswered {
    /// Not within the limit: the node is slow, or cut off.
    Late,
    /// The connection failed or was closed (a node closes a link idle too long).
    Broken,
}

/// How long a [`BlockingLink::call`] polls for its answer before it sleeps for it.
const SPIN: Duration = Duration::from_micros(300);

impl BlockingLink {
    /// Asks cland at `path` for a link to `node` whose calls wait at most `limit` (for
    /// the request to be taken, and again for its answer).
    pub async fn open(path: &Path, node: NodeId, limit: Duration) -> Result<BlockingLink> {
        let (s, link) = ask(path, node).await?;
        s.set_nonblocking(false)?;
        s.set_read_timeout(Some(limit))?;
        s.set_write_timeout(Some(limit))?;
        s.set_nodelay(true)?;
        let (rd, wr) = keyed(std::io::BufReader::new(s.try_clone()?), s, &link)?;
        Ok(BlockingLink {
            rd,
            wr,
            next: 1,
            limit,
            timeout: limit,
            spin: clan_core::sys::Spinner::default(),
        })
    }

    /// Sets the socket's receive timeout to `t` unless it is that already.
    fn receive_within(&mut self, t: Duration) -> std::io::Result<()> {
        if t != self.timeout {
            self.rd.get_ref().get_ref().set_read_timeout(Some(t))?;
            self.timeout = t;
        }
        Ok(())
    }

    /// Sends `op` and waits for its answer, within the link's limit in all (the node
    /// serves it as the credentials the link was opened with, and a `ProcRequest` as its
    /// reader's).
    pub fn call(
        &mut self,
        op: pb::peer_request::Op,
    ) -> std::result::Result<pb::peer_reply::Reply, Unanswered> {
        use std::io::ErrorKind as K;
        let id = self.next;
        self.next += 1;
        let f = pb::PeerFrame {
            frame: Some(Frame::Request(pb::PeerRequest {
                id,
                creds: None,
                op: Some(op),
            })),
        };
        let late = |e: &std::io::Error| matches!(e.kind(), K::WouldBlock | K::TimedOut);
        let deadline = Instant::now() + self.limit;
        if self.receive_within(self.limit).is_err() {
            return Err(Unanswered::Broken);
        }
        match self.wr.write_sync(&f) {
            Ok(()) => {}
            Err(e) if late(&e) => return Err(Unanswered::Late),
            Err(_) => return Err(Unanswered::Broken),
        }
        loop {
            // What is left of the limit (the socket's timeout counts each receive anew);
            // the receive timeout is set again only when a call waits long.
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Unanswered::Late);
            }
            if left + Duration::from_millis(1) < self.timeout && self.receive_within(left).is_err()
            {
                return Err(Unanswered::Broken);
            }
            if self.rd.get_ref().buffer().is_empty() {
                use std::os::fd::AsFd;
                self.spin
                    .wait(self.rd.get_ref().get_ref().as_fd(), SPIN.min(left));
            }
            let frame = self.rd.read_max_sync(clan_proto::MAX_FRAME);
            self.spin.arrived();
            match frame {
                Ok(Some(pb::PeerFrame {
                    frame: Some(Frame::Reply(r)),
                })) if r.id == id => return r.reply.ok_or(Unanswered::Broken),
                Ok(Some(_)) => continue,
                Err(clan_proto::FrameError::Io(e)) if late(&e) => return Err(Unanswered::Late),
                _ => return Err(Unanswered::Broken),
            }
        }
    }
}
