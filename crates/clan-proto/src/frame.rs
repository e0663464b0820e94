//! Length-prefixed frames: a 4-byte big-endian length, then the encoded message.
//!
//! Readers reject lengths above [`crate::MAX_FRAME`] (or a smaller limit given to
//! [`read_raw_max`]) before allocating and turn every decode failure into [`FrameError`];
//! nothing here panics on malformed bytes.

use prost::Message;
use std::io::{self, Read, Write};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("frame of {0} bytes exceeds the limit")]
    TooLarge(usize),
    #[error("malformed message: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("frame authentication failed")]
    BadMac,
    #[error("connection closed in the middle of a frame")]
    Truncated,
    /// A frame this side was about to send, refused before any of it was written: its
    /// reader would refuse it and drop the connection.
    #[error("frame too large to send: {0} bytes, the limit is {max} bytes", max = crate::MAX_FRAME)]
    TooLargeToSend(usize),
}

impl From<FrameError> for io::Error {
    fn from(e: FrameError) -> io::Error {
        match e {
            FrameError::Io(e) => e,
            e @ FrameError::TooLargeToSend(_) => {
                io::Error::new(io::ErrorKind::InvalidInput, e.to_string())
            }
            other => io::Error::new(io::ErrorKind::InvalidData, other.to_string()),
        }
    }
}

/// Encodes `msg` with its length prefix.
pub fn encode<M: Message>(msg: &M) -> Vec<u8> {
    let len = msg.encoded_len();
    let mut buf = Vec::with_capacity(4 + len);
    buf.extend_from_slice(&(len as u32).to_be_bytes());
    msg.encode(&mut buf).expect("vec has room");
    buf
}

fn check_len(len: usize) -> Result<(), FrameError> {
    check_len_max(len, crate::MAX_FRAME)
}

fn check_len_max(len: usize, max: usize) -> Result<(), FrameError> {
    if len > max {
        Err(FrameError::TooLarge(len))
    } else {
        Ok(())
    }
}

/// Reads the raw body of one frame; `None` on a clean end of stream.
pub async fn read_raw<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Vec<u8>>, FrameError> {
    read_raw_max(r, crate::MAX_FRAME).await
}

/// [`read_raw`] with a limit of `max` bytes (at most [`crate::MAX_FRAME`]): a longer frame is
/// [`FrameError::TooLarge`], refused from its length prefix before anything is allocated
/// for its body or the body is read.
pub async fn read_raw_max<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
) -> Result<Option<Vec<u8>>, FrameError> {
    let Some(len) = read_len(r).await? else {
        return Ok(None);
    };
    check_len_max(len, max.min(crate::MAX_FRAME))?;
    read_body(r, len).await.map(Some)
}

/// The length prefix of the next frame, unchecked; `None` on a clean end of stream. With
/// [`read_body`], for a reader that decides between the two (the limit, a turn to read).
pub async fn read_len<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<usize>, FrameError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        let n = r.read(&mut len[got..]).await?;
        if n == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(FrameError::Truncated)
            };
        }
        got += n;
    }
    Ok(Some(u32::from_be_bytes(len) as usize))
}

/// The body of a frame whose length prefix [`read_len`] read (the caller checked `len`:
/// this allocates it).
pub async fn read_body<R: AsyncRead + Unpin>(r: &mut R, len: usize) -> Result<Vec<u8>, FrameError> {
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await.map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            FrameError::Truncated
        } else {
            FrameError::Io(e)
        }
    })?;
    Ok(body)
}

/// Reads one message; `None` on a clean end of stream.
pub async fn read_frame<M: Message + Default, R: AsyncRead + Unpin>(
    r: &mut R,
) -> Result<Option<M>, FrameError> {
    match read_raw(r).await? {
        None => Ok(None),
        Some(body) => Ok(Some(M::decode(body.as_slice())?)),
    }
}

/// Writes one message.
pub async fn write_frame<M: Message, W: AsyncWrite + Unpin>(w: &mut W, msg: &M) -> io::Result<()> {
    w.write_all(&encode(msg)).await
}

/// Blocking [`read_frame`], for the shepherd.
pub fn read_frame_sync<M: Message + Default, R: Read>(r: &mut R) -> Result<Option<M>, FrameError> {
    match read_raw_max_sync(r, crate::MAX_FRAME)? {
        None => Ok(None),
        Some(body) => Ok(Some(M::decode(body.as_slice())?)),
    }
}

/// Blocking [`read_raw_max`].
pub fn read_raw_max_sync<R: Read>(r: &mut R, max: usize) -> Result<Option<Vec<u8>>, FrameError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) => {
                return if got == 0 {
                    Ok(None)
                } else {
                    Err(FrameError::Truncated)
                }
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let len = u32::from_be_bytes(len) as usize;
    check_len_max(len, max.min(crate::MAX_FRAME))?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            FrameError::Truncated
        } else {
            FrameError::Io(e)
        }
    })?;
    Ok(Some(body))
}

/// Blocking [`write_frame`].
pub fn write_frame_sync<M: Message, W: Write>(w: &mut W, msg: &M) -> io::Result<()> {
    w.write_all(&encode(msg))
}

/// Splits complete frames off the front of a buffer that a non-blocking reader fills.
/// Returns the bodies of all complete frames and leaves a partial one in `buf`.
pub fn split_frames(buf: &mut Vec<u8>) -> Result<Vec<Vec<u8>>, FrameError> {
    let mut out = Vec::new();
    let mut at = 0;
    while buf.len() - at >= 4 {
        let len = u32::from_be_bytes(buf[at..at + 4].try_into().expect("4 bytes")) as usize;
        check_len(len)?;
        if buf.len() - at - 4 < len {
            break;
        }
        out.push(buf[at + 4..at + 4 + len].to_vec());
        at += 4 + len;
    }
    buf.drain(..at);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb;

    #[tokio::test]
    async fn round_trip_and_limits() {
        let msg = pb::LocalRequest {
            id: 7,
            op: Some(pb::local_request::Op::Kill(pb::KillRequest {
                gpids: vec![30004711],
                signal: 15,
                queued: None,
            })),
        };
        let bytes = encode(&msg);
        let mut r = bytes.as_slice();
        let got: pb::LocalRequest = read_frame(&mut r).await.unwrap().unwrap();
        assert_eq!(got, msg);
        assert!(read_frame::<pb::LocalRequest, _>(&mut r)
            .await
            .unwrap()
            .is_none());

        let huge = (u32::MAX).to_be_bytes();
        let e = read_frame::<pb::LocalRequest, _>(&mut huge.as_slice())
            .await
            .unwrap_err();
        assert!(matches!(e, FrameError::TooLarge(_)));

        let mut cut = bytes.clone();
        cut.truncate(bytes.len() - 1);
        let e = read_frame::<pb::LocalRequest, _>(&mut cut.as_slice())
            .await
            .unwrap_err();
        assert!(matches!(e, FrameError::Truncated));
    }

    #[test]
    fn garbage_never_panics() {
        // A deterministic sweep of pseudo-random bodies through every decoder.
        let mut x: u64 = 0x9e3779b97f4a7c15;
        for len in 0..400usize {
            let body: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let mut framed = (len as u32).to_be_bytes().to_vec();
            framed.extend_from_slice(&body);
            let _ = read_frame_sync::<pb::LocalRequest, _>(&mut framed.as_slice());
            let _ = read_frame_sync::<pb::PeerFrame, _>(&mut framed.as_slice());
            let _ = read_frame_sync::<pb::ShepherdIn, _>(&mut framed.as_slice());
            let _ = read_frame_sync::<pb::ShepherdOut, _>(&mut framed.as_slice());
            let mut b = framed.clone();
            let _ = split_frames(&mut b);
        }
    }

    #[test]
    fn split_keeps_partial_frames() {
        let a = encode(&pb::ShepherdIn {
            msg: Some(pb::shepherd_in::Msg::Signal(2)),
        });
        let mut buf = a.clone();
        buf.extend_from_slice(&a[..3]);
        let frames = split_frames(&mut buf).unwrap();
        assert_eq!(frames.len(), 1);
        assert_eq!(buf, a[..3].to_vec());
    }
}
