//! Attached processes seen from their stub: input and signals out, output and exit back,
//! over a session that survives a restart of cland on either end.
//!
//! The reader counts the bytes of each output stream it returned and the writer keeps the
//! last [`STDIN_KEPT`] bytes of input it sent. When the session to a process breaks while
//! its node lives (`Interrupted` from this node's cland, or this node's cland itself gone),
//! the reader asks for a new one from those counts (`ResumeFrom`); the process's shepherd
//! answers `Resumed` with how much input it has and resends its output from the counts, and
//! the writer resends the input it did not get. Output that arrives for a process between
//! the break and its `Resumed` is dropped: the resend covers it.

use crate::{ClientError, Reader, Result, Started};
use clan_core::unixconn::{UnixConn, WriteHalf};
use clan_core::Gpid;
use clan_proto::pb::{
    self, local_reply::Reply, local_request::Op, session_input::Input, session_output::Output,
};
use clan_proto::{read_frame, write_frame};
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::BufReader;
use tokio::sync::Mutex;

/// Input kept per process for a resend after a reattach (what the relay to the process
/// can hold in its buffers, and more).
pub const STDIN_KEPT: usize = 1 << 20;

/// How often a stub whose cland is gone tries its socket again.
const RETRY: Duration = Duration::from_millis(100);

/// Attached processes: send them input and signals, receive their output and exit.
pub struct Session {
    pub started: Started,
    rd: Reader,
    shared: Arc<Mutex<Shared>>,
    path: PathBuf,
    reattach: Duration,
}

/// The sending half of a session.
pub struct SessionWriter {
    shared: Arc<Mutex<Shared>>,
}

/// The receiving half of a session.
pub struct SessionReader {
    rd: Reader,
    shared: Arc<Mutex<Shared>>,
    path: PathBuf,
    reattach: Duration,
}

/// What both halves share: the connection's sending side and each process's counts.
struct Shared {
    /// `None` while this node's cland is being reached again.
    wr: Option<WriteHalf>,
    procs: HashMap<Gpid, Proc>,
}

#[derive(Default)]
struct Proc {
    /// Bytes of stdout and stderr returned to the caller.
    stdout: u64,
    stderr: u64,
    /// Bytes of input sent, the last `STDIN_KEPT` of them, and whether its end was sent.
    stdin_sent: u64,
    stdin_kept: VecDeque<u8>,
    eof_sent: bool,
    /// The session broke: output is dropped and input held until `Resumed`.
    interrupted: bool,
    /// Inputs other than stdin sent while interrupted, to go out after `Resumed`.
    held: Vec<Input>,
    /// Released, or lost with its node: nothing to reattach.
    done: bool,
}

impl Session {
    pub(crate) fn new(
        started: Started,
        rd: Reader,
        wr: WriteHalf,
        path: PathBuf,
        reattach_ms: u64,
    ) -> Session {
        let procs = started
            .gpids
            .iter()
            .map(|g| (*g, Proc::default()))
            .collect();
        Session {
            started,
            rd,
            shared: Arc::new(Mutex::new(Shared {
                wr: Some(wr),
                procs,
            })),
            path,
            reattach: Duration::from_millis(reattach_ms),
        }
    }

    pub fn split(self) -> (Started, SessionReader, SessionWriter) {
        (
            self.started,
            SessionReader {
                rd: self.rd,
                shared: self.shared.clone(),
                path: self.path,
                reattach: self.reattach,
            },
            SessionWriter {
                shared: self.shared,
            },
        )
    }
}

async fn send_input(wr: &mut WriteHalf, gpid: Gpid, input: Input) -> std::io::Result<()> {
    let op = Op::Input(pb::SessionInput {
        gpid: gpid.raw(),
        input: Some(input),
    });
    write_frame(
        wr,
        &pb::LocalRequest {
            id: 0,
            op: Some(op),
        },
    )
    .await
}

impl Shared {
    /// Sends `input` now if the session to `gpid` stands, else holds it; input that a
    /// broken connection loses is held too (stdin is resent from what is kept instead).
    async fn send(&mut self, gpid: Gpid, input: Input) {
        let p = self.procs.entry(gpid).or_default();
        match &input {
            Input::Stdin(d) => {
                p.stdin_sent += d.len() as u64;
                let over = (p.stdin_kept.len() + d.len()).saturating_sub(STDIN_KEPT);
                p.stdin_kept.drain(..over.min(p.stdin_kept.len()));
                let skip = d.len().saturating_sub(STDIN_KEPT);
                p.stdin_kept.extend(&d[skip..]);
            }
            Input::StdinEof(_) => p.eof_sent = true,
            Input::Release(_) => p.done = true,
            _ => {}
        }
        let resent_later = matches!(input, Input::Stdin(_) | Input::StdinEof(_));
        let ready = !p.interrupted && self.wr.is_some();
        if ready {
            if let Some(wr) = &mut self.wr {
                if send_input(wr, gpid, input.clone()).await.is_ok() {
                    return;
                }
            }
            self.wr = None;
        }
        if !resent_later {
            self.procs.entry(gpid).or_default().held.push(input);
        }
    }

    /// A new session to `gpid` took: resend the input its process did not get and what was
    /// held, from now on output counts again.
    async fn resumed(&mut self, gpid: Gpid, r: &pb::Resumed) {
        let Some(p) = self.procs.get_mut(&gpid) else {
            return;
        };
        p.interrupted = false;
        p.stdout = r.stdout;
        p.stderr = r.stderr;
        let mut again = Vec::new();
        let oldest = p.stdin_sent - p.stdin_kept.len() as u64;
        if r.stdin_taken < p.stdin_sent {
            // Input older than what is kept can not be sent again: it is lost.
            let from = r.stdin_taken.max(oldest) - oldest;
            let data: Vec<u8> = p.stdin_kept.range(from as usize..).copied().collect();
            again.push(Input::Stdin(data));
        }
        if p.eof_sent && !r.stdin_eof {
            again.push(Input::StdinEof(true));
        }
        again.append(&mut p.held);
        let Some(wr) = &mut self.wr else { return };
        for i in again {
            if send_input(wr, gpid, i).await.is_err() {
                self.wr = None;
                return;
            }
        }
    }
}

impl SessionWriter {
    pub async fn send(&mut self, gpid: Gpid, input: Input) -> Result<()> {
        self.shared.lock().await.send(gpid, input).await;
        Ok(())
    }
}

impl SessionReader {
    /// The next output, exit or loss of a process; `None` when cland closed the session
    /// and it could not be taken up again. A `Resumed` says the session to a process broke
    /// and was taken up again: output goes on from its offsets (bytes between what this
    /// reader returned and those are lost: more was in flight than the shepherd keeps).
    pub async fn next(&mut self) -> Result<Option<pb::SessionOutput>> {
        loop {
            let o = match read_frame::<pb::LocalReply, _>(&mut self.rd).await {
                Ok(Some(pb::LocalReply {
                    reply: Some(Reply::Output(o)),
                    ..
                })) => o,
                Ok(Some(pb::LocalReply {
                    reply: Some(Reply::Error(e)),
                    ..
                })) => return Err(ClientError::Remote(e)),
                Ok(Some(_)) => continue,
                // This node's cland is gone (or closed the session).
                Ok(None) => {
                    if self.reconnect().await? {
                        continue;
                    }
                    return Ok(None);
                }
                Err(e) => {
                    if self.reconnect().await? {
                        continue;
                    }
                    return Err(ClientError::Protocol(e.to_string()));
                }
            };
            let Some(gpid) = Gpid::from_raw(o.gpid) else {
                continue;
            };
            let mut sh = self.shared.lock().await;
            let p = sh.procs.entry(gpid).or_default();
            match &o.output {
                Some(Output::Interrupted(_)) => {
                    p.interrupted = true;
                    let from = pb::ResumeFrom {
                        gpid: gpid.raw(),
                        stdout: p.stdout,
                        stderr: p.stderr,
                    };
                    // A break of this connection too is the reconnect's business.
                    if let Some(wr) = &mut sh.wr {
                        if send_input(wr, gpid, Input::Reattach(from)).await.is_err() {
                            sh.wr = None;
                        }
                    }
                    continue;
                }
                Some(Output::Resumed(r)) => {
                    let r = *r;
                    sh.resumed(gpid, &r).await;
                }
                Some(Output::Lost(_)) => p.done = true,
                // What the process's side sent before it took the new session: resent.
                _ if p.interrupted => continue,
                Some(Output::Stdout(d)) => p.stdout += d.len() as u64,
                Some(Output::Stderr(d)) => p.stderr += d.len() as u64,
                _ => {}
            }
            return Ok(Some(o));
        }
    }

    /// This node's cland is gone: reach it again (a restarted one) within the cluster's
    /// reattach time and ask it for new sessions to the processes still running. False
    /// when there is nothing to take up, or reattaching is off.
    async fn reconnect(&mut self) -> Result<bool> {
        let items: Vec<pb::ResumeFrom> = {
            let mut sh = self.shared.lock().await;
            sh.wr = None;
            sh.procs
                .iter_mut()
                .filter(|(_, p)| !p.done)
                .map(|(g, p)| {
                    p.interrupted = true;
                    pb::ResumeFrom {
                        gpid: g.raw(),
                        stdout: p.stdout,
                        stderr: p.stderr,
                    }
                })
                .collect()
        };
        if items.is_empty() || self.reattach.is_zero() {
            return Ok(false);
        }
        let until = tokio::time::Instant::now() + self.reattach;
        loop {
            if let Ok(c) = UnixConn::connect(&self.path).await {
                let (r, mut w) = c.into_split();
                let mut rd = BufReader::new(r);
                let req = pb::LocalRequest {
                    id: 1,
                    op: Some(Op::Reattach(pb::ReattachRequest {
                        items: items.clone(),
                    })),
                };
                if write_frame(&mut w, &req).await.is_ok() {
                    match read_frame::<pb::LocalReply, _>(&mut rd).await {
                        Ok(Some(pb::LocalReply {
                            reply: Some(Reply::Started(_)),
                            ..
                        })) => {
                            self.rd = rd;
                            self.shared.lock().await.wr = Some(w);
                            return Ok(true);
                        }
                        Ok(Some(pb::LocalReply {
                            reply: Some(Reply::Error(e)),
                            ..
                        })) => return Err(ClientError::Remote(e)),
                        _ => {} // gone again: try again
                    }
                }
            }
            if tokio::time::Instant::now() >= until {
                return Ok(false);
            }
            tokio::time::sleep(RETRY).await;
        }
    }
}
