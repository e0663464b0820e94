//! Attached processes seen from their stub: input and signals out, output and exit back,
//! over a session that survives a restart of cland on either end.
//!
//! The reader counts the bytes of each output stream it returned. One task writes to
//! cland: it takes the caller's inputs from a bounded queue, keeps the last window
//! ([`window::WINDOW`]) of input it wrote per process, and is told by the reader when the session to a
//! process broke and when it was taken up again. When the session to a process breaks
//! while its node lives (`Interrupted` from this node's cland, or this node's cland itself
//! gone), the reader asks for a new one from its counts (`ResumeFrom`); the process's
//! shepherd answers `Resumed` with how much input its process was given and resends its
//! output from the counts, and the writer resends the input from there. Output that
//! arrives for a process between the break and its `Resumed` is dropped: the resend
//! covers it.
//!
//! Nothing here waits on a write while it holds what the other half needs: the reader
//! never writes (it hands control messages to the writer), so a writer blocked by a full
//! socket can not stop the output that would unblock it. While any process's session is
//! broken the writer takes no more of the caller's input: the queue fills and the caller
//! waits (backpressure). Both directions have a window, so that a break never loses more
//! than is kept: the writer has at most a window of input in flight beyond what the
//! shepherd said its process was given (`Taken`; input a process does not read waits
//! here, not in its shepherd), and the reader tells the shepherd how much output it has
//! (`Ack`) every [`window::ACK_EVERY`] bytes, beyond which the shepherd reads no more than
//! a window.

use crate::{ClientError, Reader, Result, Started};
use clan_core::unixconn::{UnixConn, WriteHalf};
use clan_core::Gpid;
use clan_proto::pb::{
    self, local_reply::Reply, local_request::Op, session_input::Input, session_output::Output,
};
use clan_proto::window::{self, Kept};
use clan_proto::{read_frame, write_frame};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::BufReader;
use tokio::sync::mpsc;

/// How often a stub whose cland is gone tries its socket again.
const RETRY: Duration = Duration::from_millis(100);

/// The caller's inputs waiting for the writer.
const QUEUE: usize = 64;

/// The largest piece of kept input sent again in one message after a break: a window in
/// one frame would be copied whole at each hop to the shepherd, which would hold several
/// copies of it at once.
const RESEND_CHUNK: usize = 64 * 1024;

/// Attached processes: send them input and signals, receive their output and exit.
pub struct Session {
    pub started: Started,
    reader: SessionReader,
    writer: SessionWriter,
}

/// The sending half of a session.
pub struct SessionWriter {
    tx: mpsc::Sender<(Gpid, Input)>,
    /// Told once every input queued before the queue closed has been handled.
    flushed: Option<tokio::sync::oneshot::Receiver<()>>,
    /// Released by the caller: nothing to reattach (shared with the reader).
    released: std::sync::Arc<std::sync::Mutex<HashSet<Gpid>>>,
}

/// The receiving half of a session.
pub struct SessionReader {
    rd: Reader,
    ctl: mpsc::UnboundedSender<Ctl>,
    notes: mpsc::UnboundedReceiver<pb::SessionOutput>,
    /// Per process: bytes of stdout and stderr returned to the caller.
    counts: HashMap<Gpid, (u64, u64)>,
    /// Sessions broken and not yet `Resumed`.
    interrupted: HashSet<Gpid>,
    /// Exited or lost: nothing to reattach.
    done: HashSet<Gpid>,
    released: std::sync::Arc<std::sync::Mutex<HashSet<Gpid>>>,
    /// Output counts last acknowledged to each process's shepherd.
    acked: HashMap<Gpid, (u64, u64)>,
    /// Processes whose last news returned was a stop (told to the shepherd at a resume,
    /// which repeats a stop or continue this reader missed).
    stopped: HashSet<Gpid>,
    path: PathBuf,
    reattach: Duration,
}

/// What the reader tells the writer.
enum Ctl {
    /// The session to this process broke; ask for a new one from these counts.
    Interrupted(pb::ResumeFrom),
    /// A new session to it took.
    Resumed(Gpid, pb::Resumed),
    /// This process is lost: drop its input.
    Lost(Gpid),
    /// The connection to cland broke (`None`) or a new one stands, whose sessions to
    /// these processes are being taken up.
    Conn(Option<WriteHalf>, Vec<Gpid>),
    /// The shepherd of this process gave it this much input.
    Taken(Gpid, u64),
    /// Tell the shepherd how much output there is (not held by a broken session: it is
    /// dropped with the connection, and the resume carries the counts anyway).
    Ack(pb::ResumeFrom),
    /// The session can not be taken up again: stop.
    Closed,
}

impl Session {
    pub(crate) fn new(
        started: Started,
        rd: Reader,
        wr: WriteHalf,
        path: PathBuf,
        reattach_ms: u64,
    ) -> Session {
        let (tx, inputs) = mpsc::channel(QUEUE);
        let (ctl, ctl_rx) = mpsc::unbounded_channel();
        let (flushed_tx, flushed) = tokio::sync::oneshot::channel();
        let released = std::sync::Arc::new(std::sync::Mutex::new(HashSet::new()));
        let (notes_tx, notes) = mpsc::unbounded_channel();
        let counts = started.gpids.iter().map(|g| (*g, (0, 0))).collect();
        tokio::spawn(
            Writer {
                wr: Some(wr),
                procs: HashMap::new(),
                interrupted: HashSet::new(),
                lost: HashSet::new(),
                held: HashMap::new(),
                waiting: None,
                notes: notes_tx,
            }
            .run(inputs, ctl_rx, flushed_tx),
        );
        Session {
            started,
            reader: SessionReader {
                rd,
                ctl,
                notes,
                counts,
                interrupted: HashSet::new(),
                done: HashSet::new(),
                released: released.clone(),
                acked: HashMap::new(),
                stopped: HashSet::new(),
                path,
                reattach: Duration::from_millis(reattach_ms),
            },
            writer: SessionWriter {
                tx,
                flushed: Some(flushed),
                released,
            },
        }
    }

    pub fn split(self) -> (Started, SessionReader, SessionWriter) {
        (self.started, self.reader, self.writer)
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

/// Signals, window sizes and background changes kept per process to send again after a
/// break (the shepherd counts those it got: `Resumed.controls_taken`).
const CONTROLS_KEPT: usize = 64;

/// The input the writer sent to one process.
#[derive(Default)]
struct Sent {
    /// Input written, counted and its last window kept, and whether its end was.
    stdin: Kept,
    eof: bool,
    /// Input the shepherd said it gave the process.
    taken: u64,
    /// Controls written in all, and the last `CONTROLS_KEPT` of them.
    controls: u64,
    recent: std::collections::VecDeque<Input>,
}

/// What the shepherd counts as a control (`Resumed.controls_taken`).
fn is_control(i: &Input) -> bool {
    matches!(
        i,
        Input::Signal(_) | Input::Resize(_) | Input::Background(_) | Input::CloseStdout(_)
    )
}

/// The task that writes to cland.
struct Writer {
    /// `None` while this node's cland is being reached again.
    wr: Option<WriteHalf>,
    procs: HashMap<Gpid, Sent>,
    interrupted: HashSet<Gpid>,
    lost: HashSet<Gpid>,
    /// Inputs other than stdin and controls that a broken connection lost, to go again
    /// after `Resumed`.
    held: HashMap<Gpid, Vec<Input>>,
    /// Input that waits for the window (its process has a window of input in flight).
    waiting: Option<(Gpid, Input)>,
    /// Losses of input at a resume, for the reader to return.
    notes: mpsc::UnboundedSender<pb::SessionOutput>,
}

impl Writer {
    async fn run(
        mut self,
        mut inputs: mpsc::Receiver<(Gpid, Input)>,
        mut ctl: mpsc::UnboundedReceiver<Ctl>,
        flushed: tokio::sync::oneshot::Sender<()>,
    ) {
        let mut flushed = Some(flushed);
        let mut queue_open = true;
        loop {
            if self.waiting.is_some() && self.ready() {
                if let Some((g, i)) = self.waiting.take() {
                    self.input(g, i).await;
                }
            }
            // The caller's input waits while a session is broken (or the connection is),
            // or for the window.
            let flowing = queue_open && self.ready() && self.waiting.is_none();
            if !queue_open && self.waiting.is_none() {
                if let Some(f) = flushed.take() {
                    let _ = f.send(());
                }
            }
            tokio::select! {
                biased;
                c = ctl.recv() => match c {
                    Some(Ctl::Closed) | None => return, // nothing more can go out
                    Some(c) => self.control(c).await,
                },
                i = inputs.recv(), if flowing => match i {
                    Some((g, input)) => self.input(g, input).await,
                    // The caller is done: what it queued went out; the connection stays
                    // open while the reader lives (cland would take its end for a hang-up).
                    None => queue_open = false,
                },
            }
        }
    }

    fn ready(&self) -> bool {
        self.interrupted.is_empty() && self.wr.is_some()
    }

    async fn write(&mut self, gpid: Gpid, input: Input) {
        let again = !is_control(&input)
            && !matches!(
                input,
                Input::Stdin(_) | Input::StdinEof(_) | Input::Reattach(_) | Input::Ack(_)
            );
        let keep = again.then(|| input.clone());
        let written = match &mut self.wr {
            Some(wr) => send_input(wr, gpid, input).await.is_ok(),
            None => false,
        };
        if !written {
            // The reader sees the connection end and reconnects; stdin goes again from
            // what is kept, the rest from here.
            self.wr = None;
            if let Some(i) = keep {
                self.held.entry(gpid).or_default().push(i);
            }
        }
    }

    async fn input(&mut self, gpid: Gpid, input: Input) {
        if self.lost.contains(&gpid) {
            return;
        }
        let p = self.procs.entry(gpid).or_default();
        if let Input::Stdin(d) = &input {
            let in_flight = p.stdin.total().saturating_sub(p.taken);
            if in_flight > 0 && in_flight + d.len() as u64 > window::WINDOW as u64 {
                self.waiting = Some((gpid, input));
                return;
            }
        }
        if let Input::Release(_) = &input {
            // Nothing of it to hold or resend any more.
            self.held.remove(&gpid);
        }
        match &input {
            Input::Stdin(d) => p.stdin.push(d),
            Input::StdinEof(_) => p.eof = true,
            i if is_control(i) => {
                p.controls += 1;
                if p.recent.len() == CONTROLS_KEPT {
                    p.recent.pop_front();
                }
                p.recent.push_back(i.clone());
            }
            _ => {}
        }
        self.write(gpid, input).await;
    }

    async fn control(&mut self, c: Ctl) {
        match c {
            Ctl::Interrupted(from) => {
                let Some(g) = Gpid::from_raw(from.gpid) else {
                    return;
                };
                self.interrupted.insert(g);
                self.write(g, Input::Reattach(from)).await;
            }
            Ctl::Lost(g) => {
                self.interrupted.remove(&g);
                self.lost.insert(g);
                self.held.remove(&g);
                if self.waiting.as_ref().is_some_and(|(w, _)| *w == g) {
                    self.waiting = None;
                }
            }
            Ctl::Taken(g, n) => {
                let p = self.procs.entry(g).or_default();
                p.taken = p.taken.max(n);
            }
            Ctl::Ack(a) => {
                if let Some(g) = Gpid::from_raw(a.gpid) {
                    if !self.interrupted.contains(&g) {
                        self.write(g, Input::Ack(a)).await;
                    }
                }
            }
            Ctl::Closed => {}
            Ctl::Conn(wr, gpids) => {
                self.wr = wr;
                self.interrupted.extend(gpids);
            }
            Ctl::Resumed(g, r) => {
                if !self.interrupted.remove(&g) {
                    return;
                }
                let p = self.procs.entry(g).or_default();
                p.taken = p.taken.max(r.stdin_taken);
                let mut again = Vec::new();
                if r.stdin_taken < p.stdin.total() {
                    // Input older than what is kept can not be sent again.
                    let lost = p.stdin.clamp(r.stdin_taken) - r.stdin_taken;
                    if lost > 0 {
                        let _ = self.notes.send(pb::SessionOutput {
                            gpid: g.raw(),
                            output: Some(Output::Resumed(pb::Resumed {
                                stdin_lost: lost,
                                ..Default::default()
                            })),
                        });
                    }
                    let kept = p.stdin.since(r.stdin_taken);
                    again.extend(kept.chunks(RESEND_CHUNK).map(|c| Input::Stdin(c.to_vec())));
                }
                if p.eof && !r.stdin_eof {
                    again.push(Input::StdinEof(true));
                }
                // The controls the shepherd lacks (a signal sent just as the session broke).
                let first = p.controls - p.recent.len() as u64;
                let skip = r.controls_taken.saturating_sub(first) as usize;
                again.extend(p.recent.iter().skip(skip).cloned());
                again.extend(self.held.remove(&g).unwrap_or_default());
                for i in again {
                    self.write(g, i).await;
                }
            }
        }
    }
}

impl SessionWriter {
    /// Queues `input` for `gpid`; waits while the queue is full (a slow or broken session).
    pub async fn send(&mut self, gpid: Gpid, input: Input) -> Result<()> {
        if let Input::Release(_) = &input {
            if let Ok(mut r) = self.released.lock() {
                r.insert(gpid);
            }
        }
        self.tx.send((gpid, input)).await.map_err(|_| {
            ClientError::Io(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the session is over",
            ))
        })
    }
}

impl SessionWriter {
    /// Waits until every input sent has gone out to cland (or can not: the session is
    /// over, or broken for good), at most `limit`. Call before exiting after a release.
    pub async fn close(mut self, limit: Duration) {
        let flushed = self.flushed.take();
        drop(self);
        if let Some(f) = flushed {
            let _ = tokio::time::timeout(limit, f).await;
        }
    }
}

impl SessionReader {
    /// The next output, exit or loss of a process; `None` when cland closed the session
    /// and it could not be taken up again. A `Resumed` says the session to a process broke
    /// and was taken up again: output goes on from its offsets (bytes between what this
    /// reader returned and those are lost: more was in flight than the shepherd keeps),
    /// Its `output_lost` counts the bytes of output that could not be given again. A
    /// `Resumed` whose `stdin_lost` is not 0 is this library's own note (its offsets are 0):
    /// that much input could not be sent again.
    pub async fn next(&mut self) -> Result<Option<pb::SessionOutput>> {
        loop {
            if let Ok(note) = self.notes.try_recv() {
                return Ok(Some(note));
            }
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
                    let _ = self.ctl.send(Ctl::Closed);
                    return Ok(None);
                }
                Err(e) => {
                    if self.reconnect().await? {
                        continue;
                    }
                    let _ = self.ctl.send(Ctl::Closed);
                    return Err(ClientError::Protocol(e.to_string()));
                }
            };
            let Some(gpid) = Gpid::from_raw(o.gpid) else {
                continue;
            };
            let counts = self.counts.entry(gpid).or_default();
            let mut o = o;
            match &mut o.output {
                Some(Output::Interrupted(_)) => {
                    self.interrupted.insert(gpid);
                    let _ = self.ctl.send(Ctl::Interrupted(pb::ResumeFrom {
                        gpid: gpid.raw(),
                        stdout: counts.0,
                        stderr: counts.1,
                        stopped: self.stopped.contains(&gpid),
                    }));
                    continue;
                }
                Some(Output::Resumed(r)) => {
                    self.interrupted.remove(&gpid);
                    r.output_lost =
                        r.stdout.saturating_sub(counts.0) + r.stderr.saturating_sub(counts.1);
                    *counts = (r.stdout, r.stderr);
                    let _ = self.ctl.send(Ctl::Resumed(gpid, *r));
                }
                Some(Output::Taken(n)) => {
                    let _ = self.ctl.send(Ctl::Taken(gpid, *n));
                    continue;
                }
                Some(Output::Lost(_)) => {
                    self.interrupted.remove(&gpid);
                    self.done.insert(gpid);
                    let _ = self.ctl.send(Ctl::Lost(gpid));
                }
                // What the process's side sent before it took the new session: resent.
                _ if self.interrupted.contains(&gpid) => continue,
                Some(Output::Stdout(d)) => counts.0 += d.len() as u64,
                Some(Output::Stderr(d)) => counts.1 += d.len() as u64,
                Some(Output::Exited(_)) => {
                    self.done.insert(gpid);
                }
                Some(Output::Stopped(_)) => {
                    self.stopped.insert(gpid);
                }
                Some(Output::Continued(_)) => {
                    self.stopped.remove(&gpid);
                }
                _ => {}
            }
            // Every `ACK_EVERY` bytes returned, the shepherd may read on.
            let now = *counts;
            let acked = self.acked.entry(gpid).or_default();
            if now.0 + now.1 - acked.0 - acked.1 >= window::ACK_EVERY {
                *acked = now;
                let _ = self.ctl.send(Ctl::Ack(pb::ResumeFrom {
                    gpid: gpid.raw(),
                    stdout: now.0,
                    stderr: now.1,
                    ..Default::default()
                }));
            }
            return Ok(Some(o));
        }
    }

    /// This node's cland is gone: reach it again (a restarted one) within the cluster's
    /// reattach time and ask it for new sessions to the processes still running. False
    /// when there is nothing to take up, or reattaching is off.
    async fn reconnect(&mut self) -> Result<bool> {
        let _ = self.ctl.send(Ctl::Conn(None, vec![]));
        let released = self.released.lock().map(|r| r.clone()).unwrap_or_default();
        let items: Vec<pb::ResumeFrom> = self
            .counts
            .iter()
            .filter(|(g, _)| !self.done.contains(g) && !released.contains(g))
            .map(|(g, c)| pb::ResumeFrom {
                gpid: g.raw(),
                stdout: c.0,
                stderr: c.1,
                stopped: self.stopped.contains(g),
            })
            .collect();
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
                            let gpids: Vec<Gpid> = items
                                .iter()
                                .filter_map(|i| Gpid::from_raw(i.gpid))
                                .collect();
                            self.interrupted.extend(gpids.iter().copied());
                            self.rd = rd;
                            let _ = self.ctl.send(Ctl::Conn(Some(w), gpids));
                            return Ok(true);
                        }
                        Ok(Some(pb::LocalReply {
                            reply: Some(Reply::Error(e)),
                            ..
                        })) => {
                            let _ = self.ctl.send(Ctl::Closed);
                            return Err(ClientError::Remote(e));
                        }
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
