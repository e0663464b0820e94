//! Peer authentication with the cluster key (DESIGN.md 18).
//!
//! The handshake has three messages, each a `Hello` frame:
//!
//! 1. initiator -> responder: `Hello{version, node, incarnation, kind, cluster, nonce: Ni}`,
//!    with no proof;
//! 2. responder -> initiator: its own `Hello{..., nonce: Nr, proof: HMAC(key, "r"|T)}`;
//! 3. initiator -> responder: `Hello{version, proof: HMAC(key, "i"|T)}`;
//!
//! where `T` (the transcript) is every field but the proof of the first two Hellos: both
//! nonces and both sides' version, node, incarnation, kind and cluster. Each side's proof
//! covers the other's fresh nonce, so a recorded message proves nothing on a new connection:
//! a replayed initiator Hello draws a new `Nr`, which the replayer cannot prove. The
//! responder's proof comes first, so an initiator never proves the key to a responder that
//! has not; one that finds the responder's proof wrong sends an empty proof instead (the
//! responder then logs the failed authentication, not a hang-up). [`accept`] returns only
//! once the initiator's proof over `Nr` checked: nothing the caller does with the peer's
//! Hello (counting it alive, fencing its incarnation) rests on an unproven claim.
//!
//! Both sides then derive a session key `HMAC(key, "s"|Ni|Nr)` and every later frame carries
//! `HMAC(session, direction|sequence|body)`: a replayed, reordered or reflected frame fails
//! its MAC. Frames read before the proof are limited to [`MAX_HANDSHAKE_FRAME`] bytes, so an
//! unauthenticated connection makes cland allocate little. Frames are not encrypted;
//! deployments that need confidentiality run clan over WireGuard or IPsec.

use crate::frame::{read_raw_max, read_raw_max_sync, write_frame, FrameError};
use crate::pb::{self, peer_frame::Frame, PeerFrame};
use hmac::{Hmac, Mac};
use prost::Message;
use sha2::Sha256;
use std::io;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

type HmacSha256 = Hmac<Sha256>;
const TAG: usize = 32;
const NONCE: usize = 16;

/// Largest body of a frame between nodes: with its MAC, it is [`crate::MAX_FRAME`], the
/// most a peer reads (a longer frame would make it drop the connection).
pub const MAX_PEER_BODY: usize = crate::MAX_FRAME - TAG;

/// Largest frame read from a peer before it proved the cluster key (64 KiB; a Hello is some
/// hundred bytes and the cluster's name).
pub const MAX_HANDSHAKE_FRAME: usize = 64 << 10;

/// Why a peer was refused.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("peer closed the connection during the handshake")]
    Closed,
    #[error("peer sent no hello")]
    NoHello,
    #[error("peer {node} failed authentication (wrong cluster key)")]
    BadProof { node: u32 },
    #[error("peer belongs to cluster {0:?}")]
    WrongCluster(String),
    #[error("peer speaks protocol version {0}, this node {v}", v = crate::VERSION)]
    Version(u32),
    #[error("peer sent a nonce of {0} bytes, not {NONCE}")]
    BadNonce(usize),
    #[error(
        "handshake frame of {0} bytes exceeds the limit of {MAX_HANDSHAKE_FRAME} bytes \
         before authentication"
    )]
    TooLarge(usize),
    #[error("handshake: {0}")]
    Frame(#[from] FrameError),
}

fn keyed(key: &[u8]) -> HmacSha256 {
    HmacSha256::new_from_slice(key).expect("hmac takes any key length")
}

/// `m` (a keyed state, consumed) over `parts`, each preceded by its length.
fn covering(mut m: HmacSha256, parts: &[&[u8]]) -> HmacSha256 {
    for p in parts {
        m.update(&(p.len() as u32).to_be_bytes());
        m.update(p);
    }
    m
}

fn mac(key: &[u8], parts: &[&[u8]]) -> [u8; TAG] {
    covering(keyed(key), parts).finalize().into_bytes().into()
}

fn nonce() -> Vec<u8> {
    let mut n = vec![0u8; NONCE];
    getrandom::getrandom(&mut n).expect("kernel random");
    n
}

/// What this side says about itself in its Hello.
#[derive(Debug, Clone)]
pub struct Identity {
    pub node: u32,
    pub incarnation: u64,
    pub cluster: String,
    pub kind: pb::ConnKind,
    /// A CLIENT connection's credentials: the client's, as the initiating node vouches.
    pub creds: Option<pb::Creds>,
}

/// Reads MAC'd frames from an authenticated peer.
pub struct PeerReader<R> {
    inner: R,
    k: Keyed,
}

/// Writes MAC'd frames to an authenticated peer.
pub struct PeerWriter<W> {
    inner: W,
    k: Keyed,
}

impl<R: AsyncRead + Unpin> PeerReader<R> {
    /// The next frame, `None` at a clean end of stream.
    ///
    /// Cancel safety: not cancel safe (a partly read frame is lost); call it from one task.
    pub async fn read(&mut self) -> Result<Option<PeerFrame>, FrameError> {
        self.read_max(crate::MAX_FRAME).await
    }

    /// [`PeerReader::read`] of a frame of at most `max` bytes (a longer one is an error,
    /// refused from its length before its body is allocated).
    pub async fn read_max(&mut self, max: usize) -> Result<Option<PeerFrame>, FrameError> {
        match read_raw_max(&mut self.inner, max).await? {
            Some(raw) => self.open(&raw).map(Some),
            None => Ok(None),
        }
    }
}

impl<R: std::io::Read> PeerReader<R> {
    /// Blocking [`PeerReader::read_max`], for a connection served by a thread of its own.
    pub fn read_max_sync(&mut self, max: usize) -> Result<Option<PeerFrame>, FrameError> {
        match read_raw_max_sync(&mut self.inner, max)? {
            Some(raw) => self.open(&raw).map(Some),
            None => Ok(None),
        }
    }
}

/// The keyed state of one direction of an authenticated connection: its session key, its
/// direction and the sequence number of its next frame, each frame's MAC covering all three.
///
/// The HMAC state keyed with the session key is made once (`keyed`) and copied for each
/// frame: a frame's MAC then costs the hash of its own bytes, not the key's two blocks
/// again (about a third of a small frame's MAC).
#[derive(Clone)]
struct Keyed {
    key: [u8; TAG],
    /// Boxed: the state is some 200 bytes, and readers and writers are moved around.
    keyed: Box<HmacSha256>,
    dir: u8,
    seq: u64,
}

impl Keyed {
    fn new(key: [u8; TAG], dir: u8, seq: u64) -> Keyed {
        Keyed {
            key,
            keyed: Box::new(keyed(&key)),
            dir,
            seq,
        }
    }

    fn covering(&self, body: &[u8]) -> HmacSha256 {
        covering(
            (*self.keyed).clone(),
            &[&[self.dir], &self.seq.to_be_bytes(), body],
        )
    }

    /// The MAC of the next frame's `body`.
    fn tag(&self, body: &[u8]) -> [u8; TAG] {
        self.covering(body).finalize().into_bytes().into()
    }

    /// Whether `tag` is the MAC of the next frame's `body`.
    fn checks(&self, body: &[u8], tag: &[u8]) -> bool {
        self.covering(body).verify_slice(tag).is_ok()
    }
}

/// What a [`PeerReader`] leaves of itself without its connection ([`PeerReader::into_parts`]),
/// for a connection that changes hands (from tokio's sockets to a blocking one) between
/// two frames.
pub struct ReaderKeys(Keyed);

/// What a [`PeerWriter`] leaves of itself without its connection ([`PeerWriter::into_parts`]).
pub struct WriterKeys(Keyed);

impl<R> PeerReader<R> {
    /// Checks the MAC of a frame's raw body (its tag last) and decodes it.
    fn open(&mut self, raw: &[u8]) -> Result<PeerFrame, FrameError> {
        if raw.len() < TAG {
            return Err(FrameError::BadMac);
        }
        let (body, tag) = raw.split_at(raw.len() - TAG);
        if !self.k.checks(body, tag) {
            return Err(FrameError::BadMac);
        }
        self.k.seq += 1;
        Ok(PeerFrame::decode(body)?)
    }

    /// The connection and this direction's keyed state, to go on with elsewhere
    /// ([`PeerReader::from_parts`]).
    pub fn into_parts(self) -> (R, ReaderKeys) {
        (self.inner, ReaderKeys(self.k))
    }

    /// Reads on `inner` with the keyed state a reader left ([`PeerReader::into_parts`]).
    pub fn from_parts(inner: R, ReaderKeys(k): ReaderKeys) -> Self {
        PeerReader { inner, k }
    }

    /// The sequence number of the next frame this side reads.
    pub fn seq(&self) -> u64 {
        self.k.seq
    }

    /// The connection itself, once its frames are to be read elsewhere (see [`resume`]).
    pub fn into_inner(self) -> R {
        self.inner
    }

    /// The connection, to look at (not to read from: that would lose frames).
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// The connection, to look at (peek) but not to read from.
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }
}

impl<W> PeerWriter<W> {
    /// The connection and this direction's keyed state ([`PeerWriter::from_parts`]).
    pub fn into_parts(self) -> (W, WriterKeys) {
        (self.inner, WriterKeys(self.k))
    }

    /// Writes on `inner` with the keyed state a writer left ([`PeerWriter::into_parts`]).
    pub fn from_parts(inner: W, WriterKeys(k): WriterKeys) -> Self {
        PeerWriter { inner, k }
    }

    /// Encodes `frame` into the bytes of one frame, its MAC last, advancing the sequence.
    /// A frame whose body is over [`MAX_PEER_BODY`] is refused
    /// ([`FrameError::TooLargeToSend`], with the length its prefix would say) and the
    /// sequence stays: the connection goes on as if it had not been asked.
    pub fn seal(&mut self, frame: &PeerFrame) -> Result<Vec<u8>, FrameError> {
        let len = frame.encoded_len();
        if len > MAX_PEER_BODY {
            return Err(FrameError::TooLargeToSend(len + TAG));
        }
        let body = frame.encode_to_vec();
        let tag = self.k.tag(&body);
        self.k.seq += 1;
        let mut out = Vec::with_capacity(4 + body.len() + TAG);
        out.extend_from_slice(&((body.len() + TAG) as u32).to_be_bytes());
        out.extend_from_slice(&body);
        out.extend_from_slice(&tag);
        Ok(out)
    }

    /// The sequence number of the next frame this side writes.
    pub fn seq(&self) -> u64 {
        self.k.seq
    }

    /// The connection's session key (derived from the cluster key and both nonces; it
    /// authenticates this connection's frames and nothing else).
    pub fn session_key(&self) -> [u8; TAG] {
        self.k.key
    }

    /// The connection itself, once its frames are to be written elsewhere (see [`resume`]).
    pub fn into_inner(self) -> W {
        self.inner
    }
}

/// Both directions of a connection that another process authenticated as its initiator
/// (a direct link handed over by cland): its session key and the sequence numbers of the
/// next frames each way. `None` for a key of the wrong length.
pub fn resume<R, W>(
    r: R,
    w: W,
    session_key: &[u8],
    write_seq: u64,
    read_seq: u64,
) -> Option<(PeerReader<R>, PeerWriter<W>)> {
    let key: [u8; TAG] = session_key.try_into().ok()?;
    let k = |dir, seq| Keyed::new(key, dir, seq);
    Some((
        PeerReader::from_parts(r, ReaderKeys(k(1, read_seq))),
        PeerWriter::from_parts(w, WriterKeys(k(0, write_seq))),
    ))
}

impl<W: std::io::Write> PeerWriter<W> {
    /// Blocking [`PeerWriter::write`].
    pub fn write_sync(&mut self, frame: &PeerFrame) -> io::Result<()> {
        let bytes = self.seal(frame)?;
        self.inner.write_all(&bytes)
    }
}

impl<W: AsyncWrite + Unpin> PeerWriter<W> {
    /// Writes one frame. A frame too large to send fails at once (`InvalidInput`), with
    /// nothing written ([`PeerWriter::seal`]).
    ///
    /// Cancel safety: not cancel safe. The sequence advances before the bytes go out, and
    /// a write dropped halfway may leave part of a frame on the connection: a writer whose
    /// write did not finish must not write again.
    pub async fn write(&mut self, frame: &PeerFrame) -> io::Result<()> {
        let bytes = self.seal(frame)?;
        self.inner.write_all(&bytes).await
    }

    pub async fn write_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.inner.write_all(bytes).await
    }

    pub async fn flush(&mut self) -> io::Result<()> {
        self.inner.flush().await
    }
}

/// The HMAC of `label` and the transcript: every field but the proof of the initiator's
/// Hello `i` and the responder's `r`.
fn transcript(key: &[u8], label: &[u8], i: &pb::Hello, r: &pb::Hello) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(key).expect("hmac takes any key length");
    let mut put = |p: &[u8]| {
        m.update(&(p.len() as u32).to_be_bytes());
        m.update(p);
    };
    put(label);
    for h in [i, r] {
        put(&h.version.to_be_bytes());
        put(&h.node.to_be_bytes());
        put(&h.incarnation.to_be_bytes());
        put(&h.kind.to_be_bytes());
        put(h.cluster.as_bytes());
        put(&h.nonce);
        // Present (a 1 and the encoding, even of empty credentials) or absent (nothing).
        put(&h
            .creds
            .as_ref()
            .map(|c| [&[1u8][..], &c.encode_to_vec()].concat())
            .unwrap_or_default());
    }
    m
}

fn prove(key: &[u8], label: &[u8], i: &pb::Hello, r: &pb::Hello) -> Vec<u8> {
    transcript(key, label, i, r)
        .finalize()
        .into_bytes()
        .to_vec()
}

fn proven(key: &[u8], label: &[u8], i: &pb::Hello, r: &pb::Hello, proof: &[u8]) -> bool {
    transcript(key, label, i, r).verify_slice(proof).is_ok()
}

/// The next handshake frame, a Hello of this protocol version, read with the pre-auth limit.
async fn read_hello<R: AsyncRead + Unpin>(r: &mut R) -> Result<pb::Hello, AuthError> {
    let raw = match read_raw_max(r, MAX_HANDSHAKE_FRAME).await {
        Ok(Some(raw)) => raw,
        Ok(None) => return Err(AuthError::Closed),
        Err(FrameError::TooLarge(n)) => return Err(AuthError::TooLarge(n)),
        Err(e) => return Err(e.into()),
    };
    let h = match PeerFrame::decode(raw.as_slice()).map_err(FrameError::from)? {
        PeerFrame {
            frame: Some(Frame::Hello(h)),
        } => h,
        _ => return Err(AuthError::NoHello),
    };
    if h.version != crate::VERSION {
        return Err(AuthError::Version(h.version));
    }
    Ok(h)
}

/// The peer's Hello: of our cluster, with a nonce of the right size.
async fn read_peer_hello<R: AsyncRead + Unpin>(
    r: &mut R,
    cluster: &str,
) -> Result<pb::Hello, AuthError> {
    let h = read_hello(r).await?;
    if h.cluster != cluster {
        return Err(AuthError::WrongCluster(h.cluster));
    }
    if h.nonce.len() != NONCE {
        return Err(AuthError::BadNonce(h.nonce.len()));
    }
    Ok(h)
}

fn hello(me: &Identity, nonce: Vec<u8>) -> pb::Hello {
    pb::Hello {
        version: crate::VERSION,
        node: me.node,
        incarnation: me.incarnation,
        nonce,
        proof: Vec::new(),
        kind: me.kind as i32,
        cluster: me.cluster.clone(),
        creds: me.creds.clone(),
    }
}

/// The third message: the initiator's proof alone.
fn proof_frame(proof: Vec<u8>) -> PeerFrame {
    PeerFrame {
        frame: Some(Frame::Hello(pb::Hello {
            version: crate::VERSION,
            proof,
            ..Default::default()
        })),
    }
}

async fn send<W: AsyncWrite + Unpin>(w: &mut W, f: PeerFrame) -> Result<(), AuthError> {
    write_frame(w, &f).await.map_err(FrameError::Io)?;
    Ok(())
}

fn as_frame(h: &pb::Hello) -> PeerFrame {
    PeerFrame {
        frame: Some(Frame::Hello(h.clone())),
    }
}

/// An authenticated connection: the peer's Hello and both directions.
pub type Authenticated<R, W> = (pb::Hello, PeerReader<R>, PeerWriter<W>);

/// Both directions of a connection whose handshake took nonces `ni` and `nr`: the session
/// key is `HMAC(key, "s"|Ni|Nr)`; the initiator writes direction 0, the responder 1.
fn session<R, W>(
    r: R,
    w: W,
    key: &[u8],
    ni: &[u8],
    nr: &[u8],
    initiator: bool,
) -> (PeerReader<R>, PeerWriter<W>) {
    let key = mac(key, &[b"s", ni, nr]);
    let (mine, theirs) = if initiator { (0, 1) } else { (1, 0) };
    let k = |dir| Keyed::new(key, dir, 0);
    (
        PeerReader::from_parts(r, ReaderKeys(k(theirs))),
        PeerWriter::from_parts(w, WriterKeys(k(mine))),
    )
}

/// Runs the initiator's side of the handshake; returns the responder's Hello once the
/// responder proved the key over this side's fresh nonce.
pub async fn connect<R, W>(
    mut r: R,
    mut w: W,
    key: &[u8],
    me: &Identity,
) -> Result<Authenticated<R, W>, AuthError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let hi = hello(me, nonce());
    send(&mut w, as_frame(&hi)).await?;
    let hr = read_peer_hello(&mut r, &me.cluster).await?;
    if !proven(key, b"r", &hi, &hr, &hr.proof) {
        // No proof of ours to a responder that gave none; the empty one tells it why we
        // hang up (it logs a failed authentication). Best effort: we are refusing anyway.
        let _ = send(&mut w, proof_frame(Vec::new())).await;
        return Err(AuthError::BadProof { node: hr.node });
    }
    send(&mut w, proof_frame(prove(key, b"i", &hi, &hr))).await?;
    let (rd, wr) = session(r, w, key, &hi.nonce, &hr.nonce, true);
    Ok((hr, rd, wr))
}

/// Runs the responder's side of the handshake; returns the initiator's Hello only once the
/// initiator proved the key over this side's fresh nonce (a replayed Hello never gets
/// that far).
pub async fn accept<R, W>(
    mut r: R,
    mut w: W,
    key: &[u8],
    me: &Identity,
) -> Result<Authenticated<R, W>, AuthError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let hi = read_peer_hello(&mut r, &me.cluster).await?;
    // The connection's kind is the initiator's: answer with it.
    let mut me = me.clone();
    me.kind = pb::ConnKind::try_from(hi.kind).unwrap_or(pb::ConnKind::Control);
    me.creds = None;
    let mut hr = hello(&me, nonce());
    hr.proof = prove(key, b"r", &hi, &hr);
    send(&mut w, as_frame(&hr)).await?;
    let p = read_hello(&mut r).await?;
    if !proven(key, b"i", &hi, &hr, &p.proof) {
        return Err(AuthError::BadProof { node: hi.node });
    }
    let (rd, wr) = session(r, w, key, &hi.nonce, &hr.nonce, false);
    Ok((hi, rd, wr))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll};
    use std::time::Duration;
    use tokio::io::{duplex, split, AsyncWriteExt};

    const KEY: &[u8] = b"0123456789abcdef";

    /// Records the largest allocation each thread made, for the test that an oversized frame
    /// is refused without being allocated.
    struct Counting;

    thread_local! {
        static LARGEST: Cell<usize> = const { Cell::new(0) };
    }

    fn note(size: usize) {
        let _ = LARGEST.try_with(|c| c.set(c.get().max(size)));
    }

    // SAFETY: every method forwards to `System` with the caller's arguments unchanged, so
    // `System`'s guarantees hold; `note` touches only a const-initialized thread local,
    // which never allocates.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            note(layout.size());
            // SAFETY: the caller's contract for `alloc` is `System.alloc`'s.
            unsafe { System.alloc(layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            note(layout.size());
            // SAFETY: as for `alloc`.
            unsafe { System.alloc_zeroed(layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            note(new_size);
            // SAFETY: `ptr` was allocated by `System` (every allocation here is), with `layout`.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: as for `realloc`.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    #[global_allocator]
    static ALLOC: Counting = Counting;

    /// A writer that keeps a copy of all that went through it: a sniffer on the wire.
    struct Tap<W> {
        inner: W,
        seen: Arc<Mutex<Vec<u8>>>,
    }

    impl<W: AsyncWrite + Unpin> AsyncWrite for Tap<W> {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let this = &mut *self;
            let p = Pin::new(&mut this.inner).poll_write(cx, buf);
            if let Poll::Ready(Ok(n)) = p {
                this.seen.lock().unwrap().extend_from_slice(&buf[..n]);
            }
            p
        }
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_flush(cx)
        }
        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    fn id(node: u32) -> Identity {
        Identity {
            node,
            incarnation: 10 + node as u64,
            cluster: "c".into(),
            kind: pb::ConnKind::Control,
            creds: None,
        }
    }

    /// The error of a handshake that must fail.
    fn refused<T>(r: Result<T, AuthError>) -> AuthError {
        match r {
            Ok(_) => panic!("the handshake succeeded"),
            Err(e) => e,
        }
    }

    fn goodbye() -> PeerFrame {
        PeerFrame {
            frame: Some(Frame::Goodbye(true)),
        }
    }

    /// Runs both sides with their keys; returns what each returned (the peer's node and
    /// incarnation, or the error).
    async fn both(
        ki: &'static [u8],
        kr: &'static [u8],
    ) -> (Result<u32, AuthError>, Result<u32, AuthError>) {
        let (a, b) = duplex(1 << 16);
        let (ar, aw) = split(a);
        let (br, bw) = split(b);
        let acc = tokio::spawn(async move { accept(br, bw, kr, &id(2)).await.map(|x| x.0.node) });
        let con = tokio::time::timeout(Duration::from_secs(5), connect(ar, aw, ki, &id(1)))
            .await
            .expect("connect hangs")
            .map(|x| x.0.node);
        let acc = tokio::time::timeout(Duration::from_secs(5), acc)
            .await
            .expect("accept hangs")
            .unwrap();
        (con, acc)
    }

    #[tokio::test]
    async fn peers_with_the_key_talk() {
        let (a, b) = duplex(1 << 16);
        let (ar, aw) = split(a);
        let (br, bw) = split(b);
        let acc = tokio::spawn(async move { accept(br, bw, KEY, &id(2)).await });
        let (h, mut r1, mut w1) = connect(ar, aw, KEY, &id(1)).await.unwrap();
        assert_eq!((h.node, h.incarnation), (2, 12));
        let (h, mut r2, mut w2) = acc.await.unwrap().unwrap();
        assert_eq!(
            (h.node, h.incarnation, h.kind),
            (1, 11, pb::ConnKind::Control as i32)
        );
        let f = goodbye();
        w1.write(&f).await.unwrap();
        w1.write(&f).await.unwrap();
        assert_eq!(r2.read().await.unwrap().unwrap(), f);
        assert_eq!(r2.read().await.unwrap().unwrap(), f);
        w2.write(&f).await.unwrap();
        assert_eq!(r1.read().await.unwrap().unwrap(), f);
        // A frame reflected back to its sender fails: the directions have their own MACs.
        let sealed = w1.seal(&f).unwrap();
        let mut reflected = sealed.as_slice();
        let mut back = PeerReader {
            inner: &mut reflected,
            k: Keyed {
                seq: 0,
                ..r1.k.clone()
            },
        };
        assert!(matches!(back.read().await.unwrap_err(), FrameError::BadMac));
    }

    #[tokio::test]
    async fn a_session_connection_says_so() {
        let (a, b) = duplex(1 << 16);
        let (ar, aw) = split(a);
        let (br, bw) = split(b);
        let acc = tokio::spawn(async move { accept(br, bw, KEY, &id(2)).await });
        let mut me = id(1);
        me.kind = pb::ConnKind::Session;
        let (h, _, _) = connect(ar, aw, KEY, &me).await.unwrap();
        assert_eq!(h.kind, pb::ConnKind::Session as i32);
        let (h, _, _) = acc.await.unwrap().unwrap();
        assert_eq!(h.kind, pb::ConnKind::Session as i32);
    }

    #[tokio::test]
    async fn a_wrong_key_is_refused_both_ways() {
        for (ki, kr) in [
            (b"a-wrong-key-00000" as &[u8], b"the-right-key-000" as &[u8]),
            (b"the-right-key-000", b"a-wrong-key-00000"),
        ] {
            let (con, acc) = both(ki, kr).await;
            // The initiator refuses the responder's proof (and gives none of its own)...
            let e = con.unwrap_err();
            assert!(matches!(e, AuthError::BadProof { node: 2 }), "{e}");
            // ... and the responder refuses the initiator, saying why.
            let e = acc.unwrap_err();
            assert!(matches!(e, AuthError::BadProof { node: 1 }), "{e}");
            assert!(e.to_string().contains("failed authentication"), "{e}");
        }
        let (con, acc) = both(KEY, KEY).await;
        assert_eq!((con.unwrap(), acc.unwrap()), (2, 1));
    }

    /// Guards the review finding "a replayed Hello is accepted without the cluster key": a
    /// sniffed handshake, replayed to a new connection, is refused.
    #[tokio::test]
    async fn a_replayed_handshake_is_refused() {
        // A real handshake, sniffed both ways.
        let (a, b) = duplex(1 << 16);
        let (ar, aw) = split(a);
        let (br, bw) = split(b);
        let (by_i, by_r) = (Arc::default(), Arc::default());
        let tap_r = Tap {
            inner: bw,
            seen: Arc::clone(&by_r),
        };
        let acc = tokio::spawn(async move { accept(br, tap_r, KEY, &id(2)).await.map(|_| ()) });
        let tap_i = Tap {
            inner: aw,
            seen: Arc::clone(&by_i),
        };
        connect(ar, tap_i, KEY, &id(1)).await.unwrap();
        acc.await.unwrap().unwrap();
        let by_i = by_i.lock().unwrap().clone();
        let by_r = by_r.lock().unwrap().clone();

        // All the initiator sent (its Hello and its proof) to a new responder: the proof is
        // over the old responder's nonce, not the new one's.
        let (a, b) = duplex(1 << 16);
        let (_ar, mut aw) = split(a);
        let (br, bw) = split(b);
        aw.write_all(&by_i).await.unwrap();
        let e = refused(accept(br, bw, KEY, &id(2)).await);
        assert!(matches!(e, AuthError::BadProof { node: 1 }), "{e}");

        // Its Hello alone: the responder waits for the proof and accepts nothing without it.
        let hello_len = 4 + u32::from_be_bytes(by_i[..4].try_into().unwrap()) as usize;
        let (a, b) = duplex(1 << 16);
        let (_ar, mut aw) = split(a);
        let (br, bw) = split(b);
        aw.write_all(&by_i[..hello_len]).await.unwrap();
        let acc = tokio::spawn(async move { accept(br, bw, KEY, &id(2)).await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!acc.is_finished(), "accepted a Hello without its proof");
        aw.shutdown().await.unwrap();
        let e = acc.await.unwrap().unwrap_err();
        assert!(matches!(e, AuthError::Closed), "{e}");

        // The responder's answer to a new initiator: its proof is over the old nonce.
        let (a, b) = duplex(1 << 16);
        let (ar, aw) = split(a);
        let (_br, mut bw) = split(b);
        bw.write_all(&by_r).await.unwrap();
        let e = refused(connect(ar, aw, KEY, &id(1)).await);
        assert!(matches!(e, AuthError::BadProof { node: 2 }), "{e}");
    }

    /// Alters the initiator's Hello on its way with `alter`, then relays.
    async fn rewriting_relay(
        from_i: tokio::io::DuplexStream,
        to_r: tokio::io::DuplexStream,
        alter: fn(&mut pb::Hello),
    ) {
        let (mut ir, mut iw) = split(from_i);
        let (mut rr, mut rw) = split(to_r);
        let mut f: PeerFrame = crate::frame::read_frame(&mut ir).await.unwrap().unwrap();
        if let Some(Frame::Hello(h)) = f.frame.as_mut() {
            alter(h);
        }
        write_frame(&mut rw, &f).await.unwrap();
        let _ = tokio::join!(
            tokio::io::copy(&mut ir, &mut rw),
            tokio::io::copy(&mut rr, &mut iw)
        );
    }

    fn client_id() -> Identity {
        let mut me = id(1);
        me.kind = pb::ConnKind::Client;
        me.creds = Some(pb::Creds {
            uid: 1000,
            gid: 1000,
            groups: vec![1000, 27],
            ..Default::default()
        });
        me
    }

    #[tokio::test]
    async fn an_altered_identity_is_refused() {
        type Alter = fn(&mut pb::Hello);
        let alterations: [(Identity, Alter); 4] = [
            (id(1), |h| h.incarnation += 1),
            // A client link's credentials are part of what the proofs cover...
            (client_id(), |h| {
                if let Some(c) = h.creds.as_mut() {
                    c.uid = 0;
                }
            }),
            // ... and so is their absence, even of credentials that encode to nothing.
            (client_id(), |h| h.creds = None),
            (
                {
                    let mut me = client_id();
                    me.creds = Some(pb::Creds::default());
                    me
                },
                |h| h.creds = None,
            ),
        ];
        for (me, alter) in alterations {
            let (a, a2) = duplex(1 << 16);
            let (b2, b) = duplex(1 << 16);
            tokio::spawn(rewriting_relay(a2, b2, alter));
            let (ar, aw) = split(a);
            let (br, bw) = split(b);
            let acc = tokio::spawn(async move { accept(br, bw, KEY, &id(2)).await.map(|_| ()) });
            let e = refused(connect(ar, aw, KEY, &me).await);
            assert!(matches!(e, AuthError::BadProof { node: 2 }), "{e}");
            let e = acc.await.unwrap().unwrap_err();
            assert!(matches!(e, AuthError::BadProof { node: 1 }), "{e}");
        }
    }

    /// A direct link: the node that dialed hands the connection, its session key and
    /// sequence numbers over; the new holder's frames pass, the responder knows whose
    /// credentials they carry, and the session key is not the cluster key.
    #[tokio::test]
    async fn a_client_link_goes_on_in_other_hands() {
        let (a, b) = duplex(1 << 16);
        let (ar, aw) = split(a);
        let (br, bw) = split(b);
        let acc = tokio::spawn(async move { accept(br, bw, KEY, &id(2)).await });
        let (_, r1, mut w1) = connect(ar, aw, KEY, &client_id()).await.unwrap();
        let (h, mut r2, mut w2) = acc.await.unwrap().unwrap();
        assert_eq!(h.kind, pb::ConnKind::Client as i32);
        assert_eq!(h.creds.as_ref().map(|c| c.uid), Some(1000));
        let f = goodbye();
        w1.write(&f).await.unwrap(); // the dialing node's own frame first
        assert_eq!(r2.read().await.unwrap().unwrap(), f);
        let key = w1.session_key();
        assert_ne!(&key[..], KEY);
        let (ws, rs) = (w1.seq(), r1.seq());
        let (mut r3, mut w3) =
            resume(r1.into_inner(), w1.into_inner(), &key, ws, rs).expect("a 32-byte key");
        w3.write(&f).await.unwrap();
        assert_eq!(r2.read().await.unwrap().unwrap(), f);
        w2.write(&f).await.unwrap();
        assert_eq!(r3.read().await.unwrap().unwrap(), f);
        assert!(resume((), (), &key[..16], 0, 0).is_none());
    }

    /// Guards the review finding "before authenticating, each connection may make cland
    /// allocate up to 16 MiB": a handshake frame over the limit is refused from its length,
    /// with the connection still open, before its body is allocated or awaited.
    #[tokio::test]
    async fn an_oversized_handshake_frame_is_refused_unallocated() {
        let big = (crate::MAX_FRAME as u32).to_be_bytes();
        for initiator in [false, true] {
            let (a, b) = duplex(1 << 16);
            let (_pr, mut pw) = split(a);
            let (r, w) = split(b);
            pw.write_all(&big).await.unwrap();
            LARGEST.with(|c| c.set(0));
            let res = if initiator {
                tokio::time::timeout(Duration::from_secs(5), connect(r, w, KEY, &id(1))).await
            } else {
                tokio::time::timeout(Duration::from_secs(5), accept(r, w, KEY, &id(2))).await
            };
            let e = refused(res.expect("waited for the body"));
            let largest = LARGEST.with(Cell::get);
            assert!(
                matches!(e, AuthError::TooLarge(n) if n == crate::MAX_FRAME),
                "{e}"
            );
            assert!(e.to_string().contains("before authentication"), "{e}");
            assert!(largest < MAX_HANDSHAKE_FRAME, "allocated {largest} bytes");
        }
        // A frame at the limit is read (and, not being a Hello, refused as such).
        let (a, b) = duplex(MAX_HANDSHAKE_FRAME + 4);
        let (_pr, mut pw) = split(a);
        let (r, w) = split(b);
        let mut at_limit = (MAX_HANDSHAKE_FRAME as u32).to_be_bytes().to_vec();
        at_limit.resize(4 + MAX_HANDSHAKE_FRAME, 0);
        pw.write_all(&at_limit).await.unwrap();
        let e = refused(accept(r, w, KEY, &id(2)).await);
        assert!(!matches!(e, AuthError::TooLarge(_)), "{e}");
    }

    #[tokio::test]
    async fn tampered_and_replayed_frames_fail() {
        let (a, b) = duplex(1 << 16);
        let (ar, aw) = split(a);
        let (br, bw) = split(b);
        let acc =
            tokio::spawn(async move { accept(br, bw, KEY, &id(2)).await.map(|(_, r, _w)| r) });
        let (_, _r, mut w) = connect(ar, aw, KEY, &id(1)).await.unwrap();
        let mut r2 = acc.await.unwrap().unwrap();
        let f = goodbye();
        let sealed = w.seal(&f).unwrap();
        w.write_raw(&sealed).await.unwrap();
        w.write_raw(&sealed).await.unwrap(); // replay: wrong sequence number
        assert!(r2.read().await.unwrap().is_some());
        assert!(matches!(r2.read().await.unwrap_err(), FrameError::BadMac));
    }

    /// Guards the review finding "a local request just under the limit, sent on to a peer
    /// with credentials and a MAC, went over it, and the peer dropped the whole control
    /// connection": a frame over the limit is refused before it is sealed, with nothing
    /// written and the sequence unchanged, so the connection goes on; one at the limit
    /// passes.
    #[tokio::test]
    async fn a_frame_over_the_limit_is_refused_before_sealing() {
        let (a, b) = duplex(crate::MAX_FRAME + 64);
        let (ar, aw) = split(a);
        let (br, bw) = split(b);
        let acc = tokio::spawn(async move { accept(br, bw, KEY, &id(2)).await });
        let (_, _r1, mut w1) = connect(ar, aw, KEY, &id(1)).await.unwrap();
        let (_, mut r2, _w2) = acc.await.unwrap().unwrap();
        let output = |n: usize| PeerFrame {
            frame: Some(Frame::Output(pb::SessionOutput {
                gpid: 1,
                output: Some(pb::session_output::Output::Stdout(vec![7; n])),
            })),
        };
        let mut n = MAX_PEER_BODY - 16;
        while output(n).encoded_len() < MAX_PEER_BODY {
            n += 1;
        }
        assert_eq!(output(n).encoded_len(), MAX_PEER_BODY);
        let seq = w1.seq();
        let e = w1.seal(&output(n + 1)).unwrap_err();
        assert!(
            matches!(e, FrameError::TooLargeToSend(len) if len == crate::MAX_FRAME + 1),
            "{e}"
        );
        let said = e.to_string();
        assert!(
            said.contains(&(crate::MAX_FRAME + 1).to_string())
                && said.contains(&crate::MAX_FRAME.to_string()),
            "{said}"
        );
        let e = w1.write(&output(n + 1)).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        assert_eq!(w1.seq(), seq, "a refused frame took a sequence number");
        // Nothing of it went out: the next frames pass their MACs, the one at the limit
        // too.
        w1.write(&goodbye()).await.unwrap();
        w1.write(&output(n)).await.unwrap();
        assert_eq!(r2.read().await.unwrap().unwrap(), goodbye());
        assert_eq!(r2.read().await.unwrap().unwrap(), output(n));
    }
}
