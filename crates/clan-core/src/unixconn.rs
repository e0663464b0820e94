//! A Unix stream connection watched by the reactor for reading only.
//!
//! A Unix stream socket wakes everyone polling its peer for writing each time it reads
//! (the kernel's `unix_write_space`, unlike TCP, which does so only after a full buffer).
//! tokio registers its sockets for reading and writing, so each request a client sends
//! wakes the client's reactor once for nothing when the daemon reads it, and each reply
//! the daemon's once when the client reads it: a context switch (and on a VM, often an
//! inter-processor interrupt) per message, on the critical path of every local request.
//! [`UnixConn`] registers the socket for reading only; a write that finds the buffer full
//! waits on a duplicate descriptor registered for writing, only as long as it must.

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags, UnixAddr};
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

/// A connected Unix stream socket, registered for reading only.
pub struct UnixConn {
    fd: Arc<AsyncFd<OwnedFd>>,
}

/// The reading half of a [`UnixConn`].
pub struct ReadHalf {
    fd: Arc<AsyncFd<OwnedFd>>,
}

/// The writing half of a [`UnixConn`]; dropping it shuts the connection down for writing.
pub struct WriteHalf {
    fd: Arc<AsyncFd<OwnedFd>>,
    /// A duplicate registered for writing while a write waits for room.
    waiting: Option<AsyncFd<OwnedFd>>,
}

impl UnixConn {
    /// Takes over a connected socket (made non-blocking here). Must be called within a
    /// tokio runtime.
    pub fn from_std(s: std::os::unix::net::UnixStream) -> io::Result<UnixConn> {
        s.set_nonblocking(true)?;
        // SAFETY: the AsyncFd owns the OwnedFd, which stays open and the same descriptor
        // until the AsyncFd is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(OwnedFd::from(s), Interest::READABLE) }?;
        Ok(UnixConn { fd: Arc::new(fd) })
    }

    /// Connects to the socket at `path`. A Unix socket's connect completes at once unless
    /// the listener's backlog is full, and the connection is then returned in the same
    /// poll, so that the caller's first request goes out before anything else its task
    /// joins with runs (tokio's own connect waits for the reactor to report the socket
    /// writable: a turn of the runtime, in which `clan run` used to install its fifty
    /// signal handlers before it sent the spawn). A full backlog (EAGAIN: the listener is
    /// slow to accept) is tried again, a little later each time, for two seconds.
    pub async fn connect(path: impl AsRef<std::path::Path>) -> io::Result<UnixConn> {
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(2);
        let mut pause = std::time::Duration::from_millis(1);
        loop {
            match connect_now(path.as_ref()) {
                Ok(s) => return UnixConn::from_std(s),
                Err(e)
                    if e.raw_os_error() == Some(libc::EAGAIN)
                        && std::time::Instant::now() < give_up =>
                {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(std::time::Duration::from_millis(50));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The halves, usable from different tasks.
    pub fn into_split(self) -> (ReadHalf, WriteHalf) {
        (
            ReadHalf {
                fd: self.fd.clone(),
            },
            WriteHalf {
                fd: self.fd,
                waiting: None,
            },
        )
    }
}

/// A connected Unix stream socket to `path`, or the error of its (non-blocking) connect.
fn connect_now(path: &std::path::Path) -> io::Result<std::os::unix::net::UnixStream> {
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType};
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    connect(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
    Ok(std::os::unix::net::UnixStream::from(fd))
}

fn last_error() -> io::Error {
    io::Error::last_os_error()
}

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            let res = guard.try_io(|fd| {
                // SAFETY: reads into the initialized, unfilled part of `buf`, whose length
                // we pass.
                let n = unsafe {
                    libc::read(fd.as_raw_fd(), unfilled.as_mut_ptr().cast(), unfilled.len())
                };
                if n < 0 {
                    Err(last_error())
                } else {
                    Ok(n as usize)
                }
            });
            match res {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl ReadHalf {
    /// Reads into `buf` with recvmsg(2), taking descriptors passed with the bytes
    /// (SCM_RIGHTS; close-on-exec). Read frames this way only on a connection nothing else
    /// reads, and only until the descriptor came: a plain read drops what is passed.
    pub async fn recv_with_fds(&mut self, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
        loop {
            let mut guard = self.fd.readable().await?;
            let res = guard.try_io(|fd| {
                let mut iov = [IoSliceMut::new(buf)];
                let mut space = nix::cmsg_space!([std::os::fd::RawFd; 4]);
                let msg = recvmsg::<UnixAddr>(
                    fd.as_raw_fd(),
                    &mut iov,
                    Some(&mut space),
                    MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
                )
                .map_err(io::Error::from)?;
                let mut fds = Vec::new();
                for c in msg.cmsgs().map_err(io::Error::from)? {
                    if let ControlMessageOwned::ScmRights(raw) = c {
                        // SAFETY: the kernel just installed these descriptors for us;
                        // each is owned once, here.
                        fds.extend(raw.into_iter().map(|r| unsafe { OwnedFd::from_raw_fd(r) }));
                    }
                }
                Ok((msg.bytes, fds))
            });
            match res {
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }
}

impl WriteHalf {
    /// Writes all of `data`, passing `fd` with its first bytes (SCM_RIGHTS): the reader
    /// takes it with [`ReadHalf::recv_with_fds`].
    pub async fn send_with_fd(&mut self, data: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
        use tokio::io::AsyncWriteExt;
        let raw = [fd.as_raw_fd()];
        let n = std::future::poll_fn(|cx| {
            self.poll_send(cx, |s| {
                let iov = [IoSlice::new(data)];
                let cmsg = [ControlMessage::ScmRights(&raw)];
                sendmsg::<UnixAddr>(
                    s,
                    &iov,
                    &cmsg,
                    MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
                    None,
                )
                .map_err(io::Error::from)
            })
        })
        .await?;
        self.write_all(&data[n..]).await
    }

    /// Sends with `send` (a non-blocking send on the raw descriptor), waiting for room on
    /// a duplicate registered for writing while the buffer is full.
    fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        mut send: impl FnMut(std::os::fd::RawFd) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        loop {
            let e = match send(self.fd.get_ref().as_raw_fd()) {
                Ok(n) => {
                    // Room again: stop watching for it (its wake-ups are the ones avoided).
                    self.waiting = None;
                    return Poll::Ready(Ok(n));
                }
                Err(e) => e,
            };
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => {}
                _ => return Poll::Ready(Err(e)),
            }
            if self.waiting.is_none() {
                // SAFETY: dup of a descriptor we own; the duplicate is owned by the OwnedFd.
                let dup =
                    unsafe { libc::fcntl(self.fd.get_ref().as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
                if dup < 0 {
                    return Poll::Ready(Err(last_error()));
                }
                // SAFETY: `dup` is a new descriptor, ours alone.
                let owned = unsafe { OwnedFd::from_raw_fd(dup) };
                // Registered now: if room came since the send above, the event is reported.
                // SAFETY: as in `from_std`: the AsyncFd owns the duplicate.
                let fd = unsafe { AsyncFd::register_with_interest(owned, Interest::WRITABLE) }?;
                self.waiting = Some(fd);
            }
            let waiting = self.waiting.as_ref().expect("just set");
            let mut guard = ready!(waiting.poll_write_ready(cx))?;
            guard.clear_ready();
        }
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_send(cx, |fd| {
            // SAFETY: sends from `data`, whose length we pass; MSG_NOSIGNAL: a closed peer
            // is an EPIPE error, not a SIGPIPE.
            let n = unsafe {
                libc::send(
                    fd,
                    data.as_ptr().cast(),
                    data.len(),
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                Err(last_error())
            } else {
                Ok(n as usize)
            }
        })
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // SAFETY: shutdown(2) on a descriptor we own.
        if unsafe { libc::shutdown(self.fd.get_ref().as_raw_fd(), libc::SHUT_WR) } < 0 {
            let e = last_error();
            if e.raw_os_error() != Some(libc::ENOTCONN) {
                return Poll::Ready(Err(e));
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for WriteHalf {
    fn drop(&mut self) {
        // As tokio's halves: the peer reads the end of the stream once we stop writing.
        // SAFETY: shutdown(2) on a descriptor we own; errors (not connected) do not matter.
        unsafe { libc::shutdown(self.fd.get_ref().as_raw_fd(), libc::SHUT_WR) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_cross_both_ways_and_a_full_buffer_waits_for_room() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let (mut ar, mut aw) = UnixConn::from_std(a).unwrap().into_split();
        let (mut br, mut bw) = UnixConn::from_std(b).unwrap().into_split();
        aw.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        br.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        bw.write_all(b"pong").await.unwrap();
        ar.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong");
        // Far more than a socket buffer holds: the writer must wait for the reader.
        let big: Vec<u8> = (0..8 << 20).map(|i| (i % 251) as u8).collect();
        let sent = big.clone();
        let writer = tokio::spawn(async move {
            aw.write_all(&sent).await.unwrap();
            drop(aw); // the reader sees the end
        });
        let mut got = Vec::new();
        br.read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        assert_eq!(got.len(), big.len());
        assert!(got == big, "the bytes arrived changed");
    }

    #[tokio::test]
    async fn a_descriptor_crosses_with_its_bytes() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let (_ar, mut aw) = UnixConn::from_std(a).unwrap().into_split();
        let (mut br, _bw) = UnixConn::from_std(b).unwrap().into_split();
        let (p, mut q) = std::os::unix::net::UnixStream::pair().unwrap();
        let data: Vec<u8> = (0..100_000).map(|i| (i % 253) as u8).collect();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            use std::os::fd::AsFd;
            aw.send_with_fd(&sent, p.as_fd()).await.unwrap();
        });
        let (mut got, mut fds) = (Vec::new(), Vec::new());
        while got.len() < data.len() {
            let mut buf = [0u8; 8192];
            let (n, f) = br.recv_with_fds(&mut buf).await.unwrap();
            assert!(n > 0, "end of stream after {} bytes", got.len());
            got.extend_from_slice(&buf[..n]);
            fds.extend(f);
        }
        writer.await.unwrap();
        assert!(got == data, "the bytes arrived changed");
        assert_eq!(fds.len(), 1, "one descriptor passed");
        // It is the socket sent: what is written to it arrives at its peer.
        let mut passed = std::os::unix::net::UnixStream::from(fds.pop().unwrap());
        std::io::Write::write_all(&mut passed, b"hi").unwrap();
        let mut two = [0u8; 2];
        std::io::Read::read_exact(&mut q, &mut two).unwrap();
        assert_eq!(&two, b"hi");
    }

    #[tokio::test]
    async fn a_write_to_a_closed_peer_fails_without_a_signal() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let (_ar, mut aw) = UnixConn::from_std(a).unwrap().into_split();
        drop(b);
        let e = aw.write_all(b"x").await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }
}
