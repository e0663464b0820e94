//! Peer authentication with the cluster key (DESIGN.md 18).
//!
//! The handshake: the initiator sends `Hello{nonce: Ni, proof: HMAC(key, "i"|Ni|node|cluster)}`;
//! the responder checks it and answers `Hello{nonce: Nr, proof: HMAC(key, "r"|Ni|Nr|node)}`.
//! Both then derive a session key `HMAC(key, "s"|Ni|Nr)` and every later frame carries
//! `HMAC(session, direction|sequence|body)`: a peer without the key is refused at its Hello,
//! and a replayed, reordered or reflected frame fails its MAC. Frames are not encrypted;
//! deployments that need confidentiality run clan over WireGuard or IPsec.

use crate::frame::{read_frame, read_raw, write_frame, FrameError};
use crate::pb::{self, peer_frame::Frame, PeerFrame};
use hmac::{Hmac, Mac};
use prost::Message;
use sha2::Sha256;
use std::io;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

type HmacSha256 = Hmac<Sha256>;
const TAG: usize = 32;

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
    #[error("handshake: {0}")]
    Frame(#[from] FrameError),
}

fn mac(key: &[u8], parts: &[&[u8]]) -> [u8; TAG] {
    let mut m = HmacSha256::new_from_slice(key).expect("hmac takes any key length");
    for p in parts {
        m.update(&(p.len() as u32).to_be_bytes());
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

fn verify(key: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
    let mut m = HmacSha256::new_from_slice(key).expect("hmac takes any key length");
    for p in parts {
        m.update(&(p.len() as u32).to_be_bytes());
        m.update(p);
    }
    m.verify_slice(tag).is_ok()
}

fn nonce() -> Vec<u8> {
    let mut n = vec![0u8; 16];
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
}

/// Reads MAC'd frames from an authenticated peer.
pub struct PeerReader<R> {
    inner: R,
    key: [u8; TAG],
    dir: u8,
    seq: u64,
}

/// Writes MAC'd frames to an authenticated peer.
pub struct PeerWriter<W> {
    inner: W,
    key: [u8; TAG],
    dir: u8,
    seq: u64,
}

impl<R: AsyncRead + Unpin> PeerReader<R> {
    /// The next frame, `None` at a clean end of stream.
    ///
    /// Cancel safety: not cancel safe (a partly read frame is lost); call it from one task.
    pub async fn read(&mut self) -> Result<Option<PeerFrame>, FrameError> {
        let Some(raw) = read_raw(&mut self.inner).await? else {
            return Ok(None);
        };
        if raw.len() < TAG {
            return Err(FrameError::BadMac);
        }
        let (body, tag) = raw.split_at(raw.len() - TAG);
        if !verify(
            &self.key,
            &[&[self.dir], &self.seq.to_be_bytes(), body],
            tag,
        ) {
            return Err(FrameError::BadMac);
        }
        self.seq += 1;
        Ok(Some(PeerFrame::decode(body)?))
    }
}

impl<W: AsyncWrite + Unpin> PeerWriter<W> {
    /// Encodes `frame` into the bytes [`PeerWriter::write_raw`] sends, advancing the sequence.
    pub fn seal(&mut self, frame: &PeerFrame) -> Vec<u8> {
        let body = frame.encode_to_vec();
        let tag = mac(&self.key, &[&[self.dir], &self.seq.to_be_bytes(), &body]);
        self.seq += 1;
        let mut out = Vec::with_capacity(4 + body.len() + TAG);
        out.extend_from_slice(&((body.len() + TAG) as u32).to_be_bytes());
        out.extend_from_slice(&body);
        out.extend_from_slice(&tag);
        out
    }

    pub async fn write(&mut self, frame: &PeerFrame) -> io::Result<()> {
        let bytes = self.seal(frame);
        self.inner.write_all(&bytes).await
    }

    pub async fn write_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.inner.write_all(bytes).await
    }

    pub async fn flush(&mut self) -> io::Result<()> {
        self.inner.flush().await
    }
}

fn check_hello(f: Option<PeerFrame>, cluster: &str) -> Result<pb::Hello, AuthError> {
    let h = match f {
        None => return Err(AuthError::Closed),
        Some(PeerFrame {
            frame: Some(Frame::Hello(h)),
        }) => h,
        Some(_) => return Err(AuthError::NoHello),
    };
    if h.version != crate::VERSION {
        return Err(AuthError::Version(h.version));
    }
    if h.cluster != cluster {
        return Err(AuthError::WrongCluster(h.cluster));
    }
    Ok(h)
}

fn hello(me: &Identity, nonce: Vec<u8>, proof: [u8; TAG]) -> PeerFrame {
    PeerFrame {
        frame: Some(Frame::Hello(pb::Hello {
            version: crate::VERSION,
            node: me.node,
            incarnation: me.incarnation,
            nonce,
            proof: proof.to_vec(),
            kind: me.kind as i32,
            cluster: me.cluster.clone(),
        })),
    }
}

/// An authenticated connection: the peer's Hello and both directions.
pub type Authenticated<R, W> = (pb::Hello, PeerReader<R>, PeerWriter<W>);

/// Runs the initiator's side of the handshake.
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
    let ni = nonce();
    let proof = mac(
        key,
        &[
            b"i",
            &ni,
            &me.node.to_be_bytes(),
            me.cluster.as_bytes(),
            &[me.kind as u8],
        ],
    );
    write_frame(&mut w, &hello(me, ni.clone(), proof))
        .await
        .map_err(FrameError::Io)?;
    let h = check_hello(read_frame(&mut r).await?, &me.cluster)?;
    if !verify(key, &[b"r", &ni, &h.nonce, &h.node.to_be_bytes()], &h.proof) {
        return Err(AuthError::BadProof { node: h.node });
    }
    let session = mac(key, &[b"s", &ni, &h.nonce]);
    Ok((
        h,
        PeerReader {
            inner: r,
            key: session,
            dir: 1,
            seq: 0,
        },
        PeerWriter {
            inner: w,
            key: session,
            dir: 0,
            seq: 0,
        },
    ))
}

/// Runs the responder's side of the handshake.
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
    let h = check_hello(read_frame(&mut r).await?, &me.cluster)?;
    let kind = u8::try_from(h.kind).unwrap_or(u8::MAX);
    if !verify(
        key,
        &[
            b"i",
            &h.nonce,
            &h.node.to_be_bytes(),
            h.cluster.as_bytes(),
            &[kind],
        ],
        &h.proof,
    ) {
        return Err(AuthError::BadProof { node: h.node });
    }
    let nr = nonce();
    let proof = mac(key, &[b"r", &h.nonce, &nr, &me.node.to_be_bytes()]);
    let mut me = me.clone();
    me.kind = pb::ConnKind::try_from(h.kind).unwrap_or(pb::ConnKind::Control);
    write_frame(&mut w, &hello(&me, nr.clone(), proof))
        .await
        .map_err(FrameError::Io)?;
    let session = mac(key, &[b"s", &h.nonce, &nr]);
    Ok((
        h,
        PeerReader {
            inner: r,
            key: session,
            dir: 0,
            seq: 0,
        },
        PeerWriter {
            inner: w,
            key: session,
            dir: 1,
            seq: 0,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(node: u32) -> Identity {
        Identity {
            node,
            incarnation: 1,
            cluster: "c".into(),
            kind: pb::ConnKind::Control,
        }
    }

    #[tokio::test]
    async fn peers_with_the_key_talk() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let (ar, aw) = tokio::io::split(a);
        let (br, bw) = tokio::io::split(b);
        let key = b"0123456789abcdef".to_vec();
        let k2 = key.clone();
        let acc = tokio::spawn(async move {
            accept(br, bw, &k2, &id(2))
                .await
                .map(|(h, r, w)| (h.node, r, w))
        });
        let (h, _r, mut w) = connect(ar, aw, &key, &id(1)).await.unwrap();
        assert_eq!(h.node, 2);
        let (peer, mut r2, _w2) = acc.await.unwrap().unwrap();
        assert_eq!(peer, 1);
        let f = PeerFrame {
            frame: Some(Frame::Goodbye(true)),
        };
        w.write(&f).await.unwrap();
        w.write(&f).await.unwrap();
        assert_eq!(r2.read().await.unwrap().unwrap(), f);
        assert_eq!(r2.read().await.unwrap().unwrap(), f);
    }

    #[tokio::test]
    async fn wrong_key_is_refused() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let (ar, aw) = tokio::io::split(a);
        let (br, bw) = tokio::io::split(b);
        let acc = tokio::spawn(async move {
            accept(br, bw, b"the-right-key-000", &id(2))
                .await
                .map(|_| ())
        });
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            connect(ar, aw, b"a-wrong-key-00000", &id(1)),
        )
        .await;
        let e = acc.await.unwrap().unwrap_err();
        assert!(matches!(e, AuthError::BadProof { node: 1 }), "{e}");
    }

    #[tokio::test]
    async fn tampered_and_replayed_frames_fail() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let (ar, aw) = tokio::io::split(a);
        let (br, bw) = tokio::io::split(b);
        let key = b"0123456789abcdef".to_vec();
        let k2 = key.clone();
        let acc =
            tokio::spawn(async move { accept(br, bw, &k2, &id(2)).await.map(|(_, r, _w)| r) });
        let (_, _r, mut w) = connect(ar, aw, &key, &id(1)).await.unwrap();
        let mut r2 = acc.await.unwrap().unwrap();
        let f = PeerFrame {
            frame: Some(Frame::Goodbye(true)),
        };
        let sealed = w.seal(&f);
        w.write_raw(&sealed).await.unwrap();
        w.write_raw(&sealed).await.unwrap(); // replay: wrong sequence number
        assert!(r2.read().await.unwrap().is_some());
        assert!(matches!(r2.read().await.unwrap_err(), FrameError::BadMac));
    }
}
