//! `clan-shepherd run`: start one process and look after it until its parent has its status.

use crate::exec::{self, ChildPlan};
use clan_core::logfile::{self, LogWriter};
use clan_core::sys::{self, ChildEvent};
use clan_core::{Gpid, NodeId, WaitStatus};
use clan_proto::frame::{encode, split_frames};
use clan_proto::pb::{self, shepherd_in::Msg as In, shepherd_out::Msg as Out};
use clan_proto::read_frame_sync;
use clan_proto::window::{self, Kept};
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::pty::{openpty, Winsize};
use nix::sched::{setns, CloneFlags};
use nix::sys::signal::{signal, sigprocmask, SigHandler, SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::unistd::{fork, pipe2, setsid, ForkResult};
use prost::Message;
use std::collections::VecDeque;
use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn cstr(b: &[u8]) -> Option<CString> {
    CString::new(b).ok()
}

fn error_reply(code: pb::ErrorCode, message: String) -> pb::ShepherdReady {
    pb::ShepherdReady {
        error: Some(pb::Error::new(code, message)),
        ..Default::default()
    }
}

fn report(out: &mut File, ready: &pb::ShepherdReady) {
    let _ = out.write_all(&encode(ready));
    let _ = out.flush();
}

fn set_nonblocking(fd: &impl AsFd) {
    if let Ok(fl) = fcntl(fd.as_fd().as_raw_fd(), FcntlArg::F_GETFL) {
        let _ = fcntl(
            fd.as_fd().as_raw_fd(),
            FcntlArg::F_SETFL(OFlag::from_bits_truncate(fl) | OFlag::O_NONBLOCK),
        );
    }
}

/// Where the process's stdio goes, seen from the shepherd.
enum Stdio {
    /// Attached without a terminal: pipes.
    Pipes {
        stdin: Option<OwnedFd>,
        stdout: Option<OwnedFd>,
        stderr: Option<OwnedFd>,
    },
    /// Attached with a terminal: the pty's master.
    Pty { master: Option<OwnedFd> },
    /// Detached (its output comes through [`Shepherd::log_pipe`]), or orphaned: no
    /// descriptor of the process's stdio is here.
    Log,
}

/// A detached process's log before its gpid is known: `.new-PID` in the logs directory,
/// removed unless it is installed as the log (`LogWriter::install`).
struct TmpLog {
    dir: PathBuf,
    path: PathBuf,
    file: Option<File>,
}

impl TmpLog {
    /// Makes it the log of `gpid`; `None` (said on stderr, the node's shepherd.log) when it
    /// can not be: the output is then read and dropped, the process not held up.
    fn install(mut self, gpid: Gpid, max_bytes: u64, owner: (u32, u32)) -> Option<LogWriter> {
        let file = self.file.take()?;
        match LogWriter::install(&self.dir, gpid, &self.path, file, max_bytes, Some(owner)) {
            Ok(w) => Some(w),
            Err(e) => {
                eprintln!("clan-shepherd: the log of {gpid}: {e}");
                None
            }
        }
    }
}

impl Drop for TmpLog {
    fn drop(&mut self) {
        if self.file.is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// `clan-shepherd run [--cgroup DIR] [--ns-init PID]`: forks first (the child born in DIR,
/// the shepherds' cgroup) so the caller can reap the parent at once, then waits for its spec
/// on stdin. cland keeps a few shepherds waiting like this, so a spawn skips starting one.
pub fn run(args: &[String]) -> ExitCode {
    // SAFETY: fd 1 is the report pipe cland gave us; we take ownership of it once.
    let mut out = unsafe { File::from_raw_fd(1) };
    match settle(args, &mut out) {
        Ok(at) => serve_spec(out, &at),
        Err(code) => code,
    }
}

/// `clan-shepherd zygote [--cgroup DIR] [--ns-init PID]`: settles where a shepherd lives
/// (as `run`), then forks one waiting shepherd for each pair of pipes cland sends on its
/// stdin, a Unix socket (SCM_RIGHTS: the end the shepherd reads its spec and messages
/// from, the end it reports on). A shepherd made this way costs one fork of a small
/// process instead of an exec, whose start (the dynamic loader, libc probing the CPU's
/// caches through `cpuid`, which traps in a virtual machine) took most of a spawn's CPU.
/// It ends at the end of its stdin: when its cland is gone.
pub fn zygote(args: &[String]) -> ExitCode {
    // SAFETY: fd 1 is whatever cland gave us (/dev/null); we take ownership of it once.
    let mut out = unsafe { File::from_raw_fd(1) };
    let at = match settle(args, &mut out) {
        Ok(at) => at,
        Err(code) => {
            if code != ExitCode::SUCCESS {
                eprintln!("clan-shepherd zygote: could not settle in the node's namespaces");
            }
            return code;
        }
    };
    // fd 1 stays open (/dev/null) but is no longer ours: each shepherd takes its own.
    let _ = out.into_raw_fd();
    if let Some(m) = clan_core::sys::ignored_signals() {
        let _ = INHERITED_IGNORED.set(m);
    }
    // The pool is refilled while spawns go on: the zygote's wakeups must not preempt them.
    // The shepherds it forks (and so the processes) are scheduled as usual again.
    let batch = clan_core::sys::batch_scheduling(true).is_ok();
    // The shepherds are the zygote's own children (one fork each, not a double fork whose
    // middle process forks and exits: on two CPUs that delayed the answer of the spawn the
    // refill follows). The kernel reaps them as they end (SIGCHLD ignored, as in the
    // node's init), so none stays a zombie in the node's process list; once the zygote is
    // gone, the node's init adopts them. Each shepherd sets SIGCHLD back to its default.
    // SAFETY: SIG_IGN runs no handler code.
    if let Err(e) = unsafe { signal(Signal::SIGCHLD, SigHandler::SigIgn) } {
        eprintln!("clan-shepherd zygote: ignore SIGCHLD: {e}");
        return ExitCode::FAILURE;
    }
    loop {
        let fds = match receive_pipes() {
            Ok(Some(fds)) => fds,
            Ok(None) => return ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("clan-shepherd zygote: receive: {e}");
                return ExitCode::FAILURE;
            }
        };
        let [spec_in, report_out] = match <[OwnedFd; 2]>::try_from(fds) {
            Ok(pair) => pair,
            Err(_) => continue, // not a pair: dropped (closed)
        };
        // SAFETY: the zygote is single-threaded; the child becomes a shepherd as `run` does
        // after its forks.
        match unsafe { fork() } {
            Ok(ForkResult::Child) => {
                // SAFETY: SIG_DFL runs no handler code.
                let waits = unsafe { signal(Signal::SIGCHLD, SigHandler::SigDfl) };
                if waits.is_err() || (batch && clan_core::sys::batch_scheduling(false).is_err()) {
                    // SAFETY: _exit in a forked child; cland sees the pipes close.
                    unsafe { libc::_exit(1) }
                }
                let moved = nix::unistd::dup2(spec_in.as_raw_fd(), 0)
                    .and_then(|_| nix::unistd::dup2(report_out.as_raw_fd(), 1));
                drop((spec_in, report_out));
                if moved.is_err() {
                    // SAFETY: _exit in a forked child; cland sees the pipes close.
                    unsafe { libc::_exit(1) }
                }
                // SAFETY: fd 1 is now the report pipe; we take ownership of it once.
                return serve_spec(unsafe { File::from_raw_fd(1) }, &at);
            }
            Ok(ForkResult::Parent { .. }) => drop((spec_in, report_out)),
            Err(e) => {
                // The pipes close with the pair: the spawn that takes them starts another.
                eprintln!("clan-shepherd zygote: fork: {e}");
            }
        }
    }
}

/// One message of the zygote's socket: the descriptors it carries; `None` at its end.
fn receive_pipes() -> nix::Result<Option<Vec<OwnedFd>>> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut byte = [0u8; 1];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 2]);
    loop {
        let mut iov = [std::io::IoSliceMut::new(&mut byte)];
        let msg = match recvmsg::<()>(0, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => other?,
        };
        let mut fds = Vec::new();
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: descriptors received with SCM_RIGHTS are new and ours alone.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        if msg.bytes == 0 && fds.is_empty() {
            return Ok(None);
        }
        return Ok(Some(fds));
    }
}

/// Where a shepherd lives once settled: its cgroup, whether it was born there, and whether
/// it runs inside the node's namespaces.
struct Settled {
    cgroup: String,
    placed: bool,
    in_node_ns: bool,
    /// cland's state directory (`--state`), where a waiting shepherd binds its socket.
    state: Option<PathBuf>,
}

/// The socket a waiting shepherd binds before its spec comes, as `sh/p<pid>.pre` (not a
/// `.sock`: no restarted cland takes it for a process's), renamed to `sh/<gpid>.sock` once
/// the process has its gpid: the start then pays a rename, not a socket's creation.
struct PreBound {
    /// `None` once installed.
    listener: Option<UnixListener>,
    path: PathBuf,
}

/// A listening socket at `path` (a stale file there replaced) that only its owner may use.
fn bind_private(path: &Path) -> std::io::Result<UnixListener> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    Ok(listener)
}

impl PreBound {
    fn bind(state: &Path) -> Option<PreBound> {
        let path = state
            .join("sh")
            .join(format!("p{}.pre", std::process::id()));
        Some(PreBound {
            listener: Some(bind_private(&path).ok()?),
            path,
        })
    }

    /// The listener, now at `to`; `None` (and its file gone) when it can not be moved.
    fn install(mut self, to: &Path) -> Option<UnixListener> {
        std::fs::rename(&self.path, to).ok()?;
        self.listener.take()
    }
}

impl Drop for PreBound {
    /// Not installed: the file goes with the shepherd that made it.
    fn drop(&mut self) {
        if self.listener.is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Puts this process where a shepherd lives: into the node's pid namespace (`--ns-init`),
/// forked so that the caller can reap its child at once (`Err` there, with the exit code)
/// and the shepherd is adopted by the node's init, then into the node's mount and UTS
/// namespaces.
fn settle(args: &[String], out: &mut File) -> Result<Settled, ExitCode> {
    let cgroup = args
        .iter()
        .position(|a| a == "--cgroup")
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_default();
    // With a node namespace (`--ns-init PID`), the shepherd proper lives in the node's pid,
    // mount and UTS namespaces: it is the session leader of the process it starts, which
    // runs in a group of its own in that session, so the group has a parent in its session
    // and the node's kernel does not see it orphaned (job-control stops work natively), and
    // every pid the shepherd handles is in the node's numbers.
    let ns_init = args
        .iter()
        .position(|a| a == "--ns-init")
        .and_then(|i| args.get(i + 1))
        .and_then(|p| p.parse::<u32>().ok());
    let mut later_ns = Vec::new();
    if let Some(init) = ns_init {
        let open = |kind: &str| File::open(format!("/proc/{init}/ns/{kind}")).map(OwnedFd::from);
        match (open("pid"), open("mnt"), open("uts")) {
            (Ok(pid), Ok(mnt), Ok(uts)) => {
                if let Err(e) = setns(&pid, CloneFlags::CLONE_NEWPID) {
                    report(
                        out,
                        &error_reply(pb::ErrorCode::Internal, format!("shepherd: setns: {e}")),
                    );
                    return Err(ExitCode::FAILURE);
                }
                later_ns = vec![
                    (mnt, CloneFlags::CLONE_NEWNS),
                    (uts, CloneFlags::CLONE_NEWUTS),
                ];
            }
            _ => {
                report(
                    out,
                    &error_reply(pb::ErrorCode::NodeDown, "node namespace is gone".into()),
                );
                return Err(ExitCode::FAILURE);
            }
        }
    }
    // The first fork lets the caller reap us at once; the shepherd proper is adopted by init
    // (or the nearest subreaper) and so outlives cland.
    let mut placed = match fork_in(&cgroup) {
        Ok((pid, _)) if pid > 0 => {
            if ns_init.is_some() {
                // Until the child has forked the shepherd proper (below) and exited.
                let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
            }
            return Err(ExitCode::SUCCESS);
        }
        Ok((_, placed)) => placed,
        Err(e) => {
            report(
                out,
                &error_reply(pb::ErrorCode::Internal, format!("shepherd: fork: {e}")),
            );
            return Err(ExitCode::FAILURE);
        }
    };
    if ns_init.is_some() {
        // Once more, inside the namespace: the shepherd proper's parent then dies inside it,
        // so the node's init adopts it and reaps it when it exits, at once (an orphan of a
        // process outside the namespace would go to the host's init, which may take its time
        // and leaves zombies in the node's process list meanwhile).
        match fork_in(&cgroup) {
            // SAFETY: _exit in a forked child skips destructors shared with the parent.
            Ok((pid, _)) if pid > 0 => unsafe { libc::_exit(0) },
            Ok((_, p)) => placed = p,
            // SAFETY: as above; the caller sees no report and starts another shepherd.
            Err(_) => unsafe { libc::_exit(1) },
        }
    }
    for (ns, kind) in &later_ns {
        if let Err(e) = setns(ns, *kind) {
            report(
                out,
                &error_reply(pb::ErrorCode::Internal, format!("shepherd: setns: {e}")),
            );
            return Err(ExitCode::FAILURE);
        }
    }
    Ok(Settled {
        cgroup,
        placed,
        in_node_ns: ns_init.is_some(),
        state: args
            .iter()
            .position(|a| a == "--state")
            .and_then(|i| args.get(i + 1))
            .map(PathBuf::from),
    })
}

/// A settled shepherd's life: says it waits (one byte, `w`, on its report pipe: cland takes
/// no shepherd that has not), reads its spec on stdin, starts the process, serves it.
fn serve_spec(mut out: File, at: &Settled) -> ExitCode {
    // What does not depend on the spec is done before it is waited for.
    let _ = setsid();
    ignore_signals();
    let pre = at.state.as_deref().and_then(PreBound::bind);
    if out.write_all(&[clan_proto::SHEPHERD_WAITING]).is_err() {
        return ExitCode::SUCCESS; // cland gave up on us (or went away) before we settled
    }
    // Our stdin, read without a buffer: after the spec it carries cland's messages.
    let mut from_cland = match std::io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => File::from(fd),
        Err(e) => {
            report(
                &mut out,
                &error_reply(pb::ErrorCode::Internal, format!("shepherd: stdin: {e}")),
            );
            return ExitCode::FAILURE;
        }
    };
    let spec: pb::ShepherdSpec = match read_frame_sync(&mut from_cland) {
        Ok(Some(s)) => s,
        // cland went away (or shut its pool down) before giving us anything to do.
        Ok(None) => return ExitCode::SUCCESS,
        Err(_) => {
            report(
                &mut out,
                &error_reply(pb::ErrorCode::Invalid, "shepherd: no spec on stdin".into()),
            );
            return ExitCode::from(2);
        }
    };
    let placed = at.placed && spec.shepherd_cgroup == at.cgroup;
    // A socket bound for another state directory is not the one cland looks for.
    let pre = pre.filter(|_| at.state.as_deref() == Some(Path::new(&spec.state_dir)));
    match start(&spec, &mut out, &mut from_cland, placed, at.in_node_ns, pre) {
        Ok(mut sh) => {
            // The pipes of the cland that started us are our first link to it (it need not
            // connect to the socket and ask): an attached process's output and status go out
            // on them from the start. They leave fds 0 and 1, which go nowhere from here on.
            let to_cland = out.as_fd().try_clone_to_owned().map(File::from);
            drop(out);
            if let Ok(null) = File::options().read(true).write(true).open("/dev/null") {
                let _ = nix::unistd::dup2(null.as_raw_fd(), 0);
                let _ = nix::unistd::dup2(null.as_raw_fd(), 1);
            }
            if let Ok(to_cland) = to_cland {
                sh.conn = Some(Link {
                    rd: from_cland,
                    wr: to_cland,
                });
                sh.attached = !spec.spec.as_ref().is_some_and(|s| s.detached);
            }
            sh.serve()
        }
        Err(ready) => {
            report(&mut out, &ready);
            ExitCode::FAILURE
        }
    }
}

/// The shepherd's link to cland: the pipes it was started with, or later the socket a
/// restarted cland connected to (read and written through two descriptors of it).
struct Link {
    rd: File,
    wr: File,
}

impl Link {
    fn socket(s: UnixStream) -> std::io::Result<Link> {
        let wr = s.try_clone()?;
        Ok(Link {
            rd: File::from(OwnedFd::from(s)),
            wr: File::from(OwnedFd::from(wr)),
        })
    }
}

struct Shepherd {
    spec: pb::ShepherdSpec,
    /// Running inside the node's namespaces: `pid` is in the node's numbers.
    in_node_ns: bool,
    pid: i32,
    ns_pid: u32,
    gpid: Gpid,
    pidfd: OwnedFd,
    stdio: Stdio,
    /// A detached process's log, and the pipe its stdout and stderr are (until no process
    /// holds it any more).
    log: Option<LogWriter>,
    log_pipe: Option<OwnedFd>,
    listener: UnixListener,
    socket_path: PathBuf,
    conn: Option<Link>,
    conn_buf: Vec<u8>,
    attached: bool,
    orphaned: bool,
    exited: Option<WaitStatus>,
    /// Input received and not given to the process yet (its stdin is full). The stub has
    /// no more than a window of input in flight beyond what it was told was given, so no
    /// more than that waits here, however long the process does not read.
    pending_stdin: VecDeque<u8>,
    stdin_eof: bool,
    /// Bytes of input given to the process in all (written to its stdin, or dropped once it
    /// can take no more), and as much as was last said (`Out::Taken`, which lets the stub
    /// send a window beyond it). Not what came: input the process does not read waits at
    /// the stub, not here. A resumed stub sends again from there (`resume`).
    stdin_given: u64,
    stdin_told: u64,
    /// Bytes of each output the stub has (`In::Acked`): no more than a window beyond it
    /// are read from the process, so what a break loses can always be sent again.
    acked: [u64; 2],
    /// Each output relayed so far, counted and its last window kept, which a stub whose
    /// session broke gets again from where its copy ends (`In::Resume`).
    sent: [Kept; 2],
    start_ticks: u64,
    /// SIGCHLD, for the child's stops and continues (its exit comes through the pidfd).
    sigchld: SignalFd,
    /// The stub is a background job: a read of stdin gets SIGTTIN, as from a terminal.
    background: bool,
    ttin_sent: bool,
    /// The job-control signal a SIGSTOP we sent stands for (see `stop_group`).
    stop_as: Option<i32>,
    /// The signal the process is stopped by, as last reported (`None`: running).
    stopped: Option<i32>,
    /// A job suspension stopped it (`In::JobStop`): that stop and the continue that ends
    /// it are not reported, so a suspended job does not look stopped from outside.
    job_stop: bool,
    /// Signals, window sizes and background changes received from cland, in all: a
    /// resumed stub sends again those of its own beyond it.
    controls_taken: u64,
}

fn is_tty_stop(sig: i32) -> bool {
    matches!(sig, libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU)
}

/// `pid` and its descendants (through /proc/PID/task/PID/children), at most 4096.
fn tree(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        out.push(p);
        if out.len() >= 4096 {
            break;
        }
        if let Ok(c) = std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")) {
            todo.extend(c.split_whitespace().filter_map(|x| x.parse::<i32>().ok()));
        }
    }
    out
}

/// Field `n` (0-based) after the command of /proc/PID/stat: 0 state, 1 ppid, 2 pgrp, 3 sid.
fn stat_field(pid: i32, n: usize) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = s.get(s.rfind(')')? + 2..)?;
    if n == 0 {
        return None;
    }
    after.split_whitespace().nth(n)?.parse().ok()
}

/// fork(2), the child born in cgroup `dir` when one is given (clone3 CLONE_INTO_CGROUP, no
/// migration), else moved there by whoever asked. Returns the child's pid (0 in the child)
/// and whether it is already in `dir`.
fn fork_in(dir: &str) -> nix::Result<(i32, bool)> {
    if !dir.is_empty() {
        if let Ok(d) = File::open(dir) {
            // SAFETY: the shepherd is single-threaded whenever it forks.
            if let Ok(pid) = unsafe { sys::fork_into(&d) } {
                return Ok((pid, true));
            }
        }
    }
    // SAFETY: as above.
    match unsafe { fork() }? {
        ForkResult::Parent { child } => Ok((child.as_raw(), false)),
        ForkResult::Child => Ok((0, false)),
    }
}

/// The signals a shepherd ignores (its process's signals are its process's business).
const IGNORED: [Signal; 7] = [
    Signal::SIGPIPE,
    Signal::SIGHUP,
    Signal::SIGINT,
    Signal::SIGQUIT,
    Signal::SIGTSTP,
    Signal::SIGTTIN,
    Signal::SIGTTOU,
];

/// The signals a zygote found ignored when it started (inherited from cland's own
/// parent), which its shepherds' children inherit too: set once, before any fork.
static INHERITED_IGNORED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// Ignores [`IGNORED`] (a shepherd does it before it waits for its spec, off the path of
/// the spawn).
fn ignore_signals() {
    for sig in IGNORED {
        // SAFETY: ignoring a signal installs no handler code. The child restores defaults.
        let _ = unsafe { signal(sig, SigHandler::SigIgn) };
    }
}

/// The signals a shepherd's child finds ignored, as a mask (`clan_core::sys::
/// ignored_signals`): what its child must set back before its exec (an exec resets
/// handlers, not ignored signals). Every signal when not known (no zygote looked).
fn ignored_in_child() -> u64 {
    match INHERITED_IGNORED.get() {
        Some(inherited) => IGNORED
            .iter()
            .fold(*inherited, |m, s| m | clan_core::sys::signal_bit(*s as i32)),
        None => u64::MAX,
    }
}

/// Every catchable signal blocked; the mask before, to put back.
fn sigprocmask_all() -> Option<SigSet> {
    let mut old = SigSet::empty();
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&SigSet::all()), Some(&mut old))
        .ok()
        .map(|_| old)
}

/// What the child wrote on its error pipe before it went (empty: its exec took, or it
/// died before), and the stops and continues to give it once it runs. Until then, signals
/// cland sends for the process that is starting (its stub's Ctrl-C) go to the child, as
/// they would to a local process whose exec waits: one hung in its exec (a program or
/// working directory on a mount whose server does not answer) dies of a fatal one, and
/// the start ends with that death. A stop, and a continue after it, wait for the exec: a
/// child stopped before it would hold the start, and its stub would never hear of it.
fn exec_outcome(mut err_r: File, from_cland: &mut File, child: &OwnedFd) -> (String, Vec<i32>) {
    let mut msg = Vec::new();
    let mut held = Vec::new();
    let mut cland_open = true;
    loop {
        let (err_ready, cland_ready) = {
            let mut fds = vec![PollFd::new(err_r.as_fd(), PollFlags::POLLIN)];
            if cland_open {
                fds.push(PollFd::new(from_cland.as_fd(), PollFlags::POLLIN));
            }
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => {
                    // Waited for as before: to the end of the error pipe.
                    let _ = err_r.read_to_end(&mut msg);
                    break;
                }
            }
            let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
            (ready(&fds[0]), fds.get(1).is_some_and(ready))
        };
        if cland_ready {
            // Whole frames: cland writes each in one piece; while a process starts it
            // sends nothing but its stub's signals.
            match read_frame_sync::<pb::ShepherdIn, _>(from_cland) {
                Ok(Some(pb::ShepherdIn {
                    msg: Some(In::StartSignal(sig) | In::Signal(sig)),
                })) => {
                    let stop = is_tty_stop(sig) || sig == libc::SIGSTOP;
                    if stop || (sig == libc::SIGCONT && !held.is_empty()) {
                        held.push(sig);
                    } else {
                        let _ = sys::pidfd_send_signal(child, sig);
                    }
                }
                Ok(Some(_)) => {}
                // cland gone: the start goes on, and a restarted cland finds it.
                Ok(None) | Err(_) => cland_open = false,
            }
        }
        if err_ready {
            let mut buf = [0u8; 512];
            match err_r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => msg.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    }
    (String::from_utf8_lossy(&msg).into_owned(), held)
}

fn start(
    spec: &pb::ShepherdSpec,
    out: &mut File,
    from_cland: &mut File,
    placed: bool,
    in_node_ns: bool,
    pre: Option<PreBound>,
) -> Result<Shepherd, pb::ShepherdReady> {
    let internal = |what: &str, e: &dyn std::fmt::Display| {
        error_reply(pb::ErrorCode::Internal, format!("shepherd: {what}: {e}"))
    };
    // (A session leader ignoring its signals already: `serve_spec` did both before the
    // spec came.)
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) only changes a flag of this process.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if !spec.shepherd_cgroup.is_empty() && !placed {
        std::fs::write(format!("{}/cgroup.procs", spec.shepherd_cgroup), "0")
            .map_err(|e| internal("join cgroup", &e))?;
    }
    let node = NodeId::new(spec.node)
        .ok_or_else(|| error_reply(pb::ErrorCode::Invalid, format!("bad node {}", spec.node)))?;
    let ps = spec.spec.clone().unwrap_or_default();
    let creds = spec.creds.clone().unwrap_or_default();
    if ps.argv.is_empty() {
        return Err(error_reply(pb::ErrorCode::Invalid, "empty command".into()));
    }
    let argv: Vec<CString> = ps.argv.iter().filter_map(|a| cstr(a)).collect();
    if argv.len() != ps.argv.len() {
        return Err(error_reply(
            pb::ErrorCode::Invalid,
            "command has a NUL byte".into(),
        ));
    }
    let path = ps
        .env
        .iter()
        .find_map(|e| e.strip_prefix(b"PATH="))
        .map(|p| p.to_vec());
    let candidates = exec::candidates(&ps.argv[0], path.as_deref());
    let state = PathBuf::from(&spec.state_dir);

    // Stdio for the child, and the shepherd's ends. A detached process's stdout and stderr
    // are one pipe, which the shepherd relays into its log (capped, `logfile`): made now,
    // so that a start that can not have a log fails before the fork.
    let mut detached_log: Option<(TmpLog, OwnedFd)> = None;
    let (child_fds, stdio, keep): ([i32; 3], Stdio, Vec<OwnedFd>) = if ps.detached {
        let logs = logfile::make_dir(&state).map_err(|e| internal("make logs/", &e))?;
        let path = logs.join(format!(".new-{}", std::process::id()));
        // Its owner may read it (`clan logs`); mode 0600: nobody else.
        let file = logfile::create(&path, Some((creds.uid, creds.gid)))
            .map_err(|e| internal("open log", &e))?;
        let tmp = TmpLog {
            dir: logs,
            path,
            file: Some(file),
        };
        let (out_r, out_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| internal("pipe", &e))?;
        detached_log = Some((tmp, out_r));
        let null = File::open("/dev/null").map_err(|e| internal("open /dev/null", &e))?;
        let n = OwnedFd::from(null);
        (
            [n.as_raw_fd(), out_w.as_raw_fd(), out_w.as_raw_fd()],
            Stdio::Log,
            vec![n, out_w],
        )
    } else if ps.tty {
        let ws = Winsize {
            ws_row: ps.rows.max(1) as u16,
            ws_col: ps.cols.max(1) as u16,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = openpty(Some(&ws), None).map_err(|e| internal("openpty", &e))?;
        let s = pty.slave;
        // The shepherd leads the process's session: the pty becomes that session's
        // controlling terminal here, and the process makes its group the foreground one.
        // SAFETY: TIOCSCTTY on a descriptor we own, after setsid made us a session leader.
        if unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCSCTTY, 0) } < 0 {
            return Err(internal(
                "acquire the controlling terminal",
                &std::io::Error::last_os_error(),
            ));
        }
        (
            [s.as_raw_fd(), s.as_raw_fd(), s.as_raw_fd()],
            Stdio::Pty {
                master: Some(pty.master),
            },
            vec![s],
        )
    } else {
        // The stub's stdin is /dev/null: so is the process's, with nothing to relay.
        let (in_r, in_w) = if ps.stdin_null {
            let null = File::open("/dev/null").map_err(|e| internal("open /dev/null", &e))?;
            (OwnedFd::from(null), None)
        } else {
            let (r, w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| internal("pipe", &e))?;
            (r, Some(w))
        };
        let (out_r, out_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| internal("pipe", &e))?;
        let (err_r, err_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| internal("pipe", &e))?;
        (
            [in_r.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()],
            Stdio::Pipes {
                stdin: in_w,
                stdout: Some(out_r),
                stderr: Some(err_r),
            },
            vec![in_r, out_w, err_w],
        )
    };

    let ns = |kind: &str| -> Result<Option<OwnedFd>, pb::ShepherdReady> {
        if spec.ns_init_pid == 0 || in_node_ns {
            return Ok(None);
        }
        File::open(format!("/proc/{}/ns/{kind}", spec.ns_init_pid))
            .map(|f| Some(OwnedFd::from(f)))
            .map_err(|e| {
                error_reply(
                    pb::ErrorCode::NodeDown,
                    format!("node namespace is gone ({kind}: {e})"),
                )
            })
    };
    let (pid_ns, mnt_ns, uts_ns) = (ns("pid")?, ns("mnt")?, ns("uts")?);
    if let Some(p) = &pid_ns {
        setns(p, CloneFlags::CLONE_NEWPID)
            .map_err(|e| internal("enter the node's pid namespace", &e))?;
    }

    // The caller's environment but the variables clan sets for this process (a caller
    // that is itself a rank of a job must not pass its rank on); other CLAN_ variables
    // (CLAN_LINKS, a user's own) pass as any other.
    const OURS: [&[u8]; 8] = [
        b"CLAN_NODE=",
        b"CLAN_SHIM_NODE=",
        b"CLAN_GPID=",
        b"CLAN_JOB=",
        b"CLAN_RANK=",
        b"CLAN_SIZE=",
        b"CLAN_DIR=",
        b"CLAN_BIN=",
    ];
    let mut env: Vec<CString> = ps
        .env
        .iter()
        .filter(|e| !OURS.iter().any(|o| e.starts_with(o)))
        .filter_map(|e| cstr(e))
        .collect();
    let (err_r, err_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| internal("pipe", &e))?;
    // SIGCHLD is read from a signalfd; the child unblocks every signal before its exec.
    let mut chld = SigSet::empty();
    chld.add(Signal::SIGCHLD);
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&chld), None)
        .map_err(|e| internal("block SIGCHLD", &e))?;
    let sigchld = SignalFd::with_flags(&chld, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(|e| internal("signalfd", &e))?;
    let plan_env = |gpid_local: u32| {
        let mut env = env.clone();
        let gpid = Gpid::new(node, gpid_local).map(|g| g.raw()).unwrap_or(0);
        let mut add = |k: &str, v: String| env.extend(cstr(format!("{k}={v}").as_bytes()));
        add("CLAN_NODE", spec.node.to_string());
        add("CLAN_GPID", gpid.to_string());
        add("CLAN_JOB", spec.job.to_string());
        if spec.size > 0 {
            add("CLAN_RANK", spec.rank.to_string());
            add("CLAN_SIZE", spec.size.to_string());
        }
        if !spec.cluster_dir.is_empty() {
            add("CLAN_DIR", spec.cluster_dir.clone());
        }
        if let Some(cp) = &spec.cluster_proc {
            add("CLAN_BIN", cp.clan_bin.clone());
            // The shim first, before any LD_PRELOAD of the caller's.
            let preload = match env
                .iter()
                .position(|e| e.as_bytes().starts_with(b"LD_PRELOAD="))
                .map(|i| env.remove(i))
            {
                Some(old) if old.as_bytes().len() > 11 => {
                    format!(
                        "{} {}",
                        cp.shim,
                        String::from_utf8_lossy(&old.as_bytes()[11..])
                    )
                }
                _ => cp.shim.clone(),
            };
            env.extend(cstr(format!("LD_PRELOAD={preload}").as_bytes()));
        }
        env
    };
    // cland makes the task's cgroups while we set up, and says when they exist.
    match read_frame_sync::<pb::ShepherdIn, _>(from_cland) {
        Ok(Some(pb::ShepherdIn {
            msg: Some(In::Start(_)),
        })) => {}
        _ => {
            return Err(error_reply(
                pb::ErrorCode::Internal,
                "shepherd: not told to start".into(),
            ))
        }
    }
    let ignored = ignored_in_child();
    // The child is born with every signal blocked, until its exec's set-up has put back
    // the dispositions the shepherd ignores: a signal for it meanwhile (its stub's
    // Ctrl-C, `exec_outcome`) waits, blocked, instead of being dropped as ignored.
    let before_fork = sigprocmask_all();
    let forked = fork_in(&spec.cgroup);
    if !matches!(forked, Ok((0, _))) {
        if let Some(old) = &before_fork {
            let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(old), None);
        }
    }
    let child = match forked {
        Err(e) => return Err(internal("fork", &e)),
        Ok((0, placed)) => {
            drop(err_r);
            // getpid() is the pid inside the node's namespace: the gpid's local part.
            let env = plan_env(std::process::id());
            let plan = ChildPlan {
                candidates,
                argv,
                env,
                cwd: cstr(&ps.cwd)
                    .filter(|c| !c.is_empty())
                    .unwrap_or_else(|| CString::new("/").expect("no NUL")),
                uid: creds.uid,
                gid: creds.gid,
                groups: creds.groups.clone(),
                cgroup_procs: (!spec.cgroup.is_empty() && !placed)
                    .then(|| format!("{}/cgroup.procs", spec.cgroup)),
                v1_tasks: spec
                    .v1_cgroups
                    .iter()
                    .map(|d| format!("{d}/tasks"))
                    .collect(),
                cluster_proc: spec.cluster_proc.as_ref().and_then(|cp| {
                    Some((cstr(cp.view.as_bytes())?, cstr(cp.node_proc.as_bytes())?))
                }),
                mnt_ns,
                uts_ns,
                stdio: child_fds,
                tty: ps.tty && !ps.detached,
                ignored,
                ignore: ps.ignored_signals,
            };
            exec::child(plan, err_w.as_raw_fd())
        }
        Ok((child, _)) => child,
    };
    env.clear();
    drop(err_w);
    drop(keep);
    let pidfd = sys::pidfd_open(child).map_err(|e| internal("pidfd_open", &e))?;
    // The process's gpid and the shepherd's socket are made while the child sets itself up
    // and execs, not after: once the exec succeeds the shepherd only says so, and does not
    // take the CPU from the program it just started.
    // Inside the node's pid namespace fork's answer is already in the node's numbers.
    let ns_pid = if in_node_ns {
        child as u32
    } else {
        ns_pid_of(&pidfd).unwrap_or(child as u32)
    };
    let gpid = Gpid::new(node, ns_pid);
    let sockdir = state.join("sh");
    let socket_path = sockdir.join(format!("{}.sock", gpid.map(|g| g.raw()).unwrap_or(0)));
    let listener = match pre.and_then(|p| p.install(&socket_path)) {
        Some(l) => Ok(l),
        None => {
            let _ = std::fs::create_dir_all(&sockdir);
            bind_private(&socket_path)
        }
    };
    let (msg, held) = exec_outcome(File::from(err_r), from_cland, &pidfd);
    if !msg.is_empty() {
        let _ = std::fs::remove_file(&socket_path);
        let _ = sys::wait_pidfd(&pidfd, false, false);
        let (errno, what) = msg.split_once(':').unwrap_or(("0", msg.as_str()));
        let errno: i32 = errno.parse().unwrap_or(0);
        let (code, text) = match errno {
            libc::ENOENT if what == String::from_utf8_lossy(&ps.argv[0]) => (
                pb::ErrorCode::CommandNotFound,
                format!("{what}: command not found"),
            ),
            libc::EACCES | libc::ENOEXEC if what == String::from_utf8_lossy(&ps.argv[0]) => (
                pb::ErrorCode::NotExecutable,
                format!("{what}: permission denied"),
            ),
            _ => (
                pb::ErrorCode::Invalid,
                format!("{what}: {}", nix::errno::Errno::from_raw(errno).desc()),
            ),
        };
        return Err(error_reply(code, text));
    }
    let Some(gpid) = gpid else {
        let _ = std::fs::remove_file(&socket_path);
        return Err(error_reply(
            pb::ErrorCode::Internal,
            format!("pid {ns_pid} outside the gpid range"),
        ));
    };
    let listener = listener.map_err(|e| internal("bind socket", &e))?;
    let (log, log_pipe) = match detached_log {
        Some((tmp, pipe)) => {
            set_nonblocking(&pipe);
            (
                tmp.install(gpid, spec.log_max_bytes, (creds.uid, creds.gid)),
                Some(pipe),
            )
        }
        None => (None, None),
    };
    report(
        out,
        &pb::ShepherdReady {
            // Inside the node's namespaces the shepherd knows only the node's numbers.
            host_pid: if in_node_ns { 0 } else { child as u32 },
            ns_pid,
            gpid: gpid.raw(),
            shepherd_pid: std::process::id(),
            error: None,
        },
    );
    let mut stdio = stdio;
    if let Stdio::Pipes { stdout, stderr, .. } = &mut stdio {
        stdout.iter().chain(stderr.iter()).for_each(set_nonblocking);
    }
    if let Stdio::Pty { master: Some(m) } = &stdio {
        set_nonblocking(m);
    }
    let mut shepherd = Shepherd {
        spec: spec.clone(),
        in_node_ns,
        pid: child,
        ns_pid,
        gpid,
        pidfd,
        stdio,
        log,
        log_pipe,
        listener,
        socket_path,
        conn: None,
        conn_buf: Vec::new(),
        attached: false,
        orphaned: false,
        exited: None,
        pending_stdin: VecDeque::new(),
        stdin_eof: false,
        stdin_given: 0,
        stdin_told: 0,
        acked: [0; 2],
        sent: Default::default(),
        start_ticks: 0,
        sigchld,
        background: false,
        ttin_sent: false,
        stop_as: None,
        stopped: None,
        job_stop: false,
        controls_taken: 0,
    };
    // Stops and continues that came while it started, now that it runs (a stop before
    // its exec would have held the start).
    for sig in held {
        shepherd.deliver(sig);
    }
    Ok(shepherd)
}

/// The pid of a process in its innermost pid namespace: the last NSpid field of its pidfd's
/// fdinfo (a few lines, much cheaper for the kernel to render than /proc/PID/status).
fn ns_pid_of(pidfd: &OwnedFd) -> Option<u32> {
    let status =
        std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd())).ok()?;
    clan_core::sys::status_numbers(&status, "NSpid")
        .last()
        .copied()
}

fn start_ticks_of(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    after.split_whitespace().nth(19)?.parse().ok()
}

const OUT: usize = 0;
const ERR: usize = 1;

/// The largest piece of kept output sent in one message.
const RESEND_CHUNK: usize = 64 * 1024;

/// The most an emptied input buffer keeps allocated: the buffer of a backlog (up to a
/// window, while the process did not read) is given back once it drained.
const STDIN_IDLE_CAPACITY: usize = 256 * 1024;

fn output_msg(which: usize, data: Vec<u8>) -> Out {
    if which == OUT {
        Out::Stdout(data)
    } else {
        Out::Stderr(data)
    }
}

impl Shepherd {
    fn info(&self) -> pb::ShepherdInfo {
        pb::ShepherdInfo {
            spec: Some(self.spec.clone()),
            host_pid: if self.in_node_ns { 0 } else { self.pid as u32 },
            ns_pid: self.ns_pid,
            gpid: self.gpid.raw(),
            exited: self.exited.map(Into::into),
            start_ticks: if self.start_ticks != 0 {
                self.start_ticks
            } else {
                start_ticks_of(self.pid).unwrap_or(0)
            },
            shepherd_pid: std::process::id(),
        }
    }

    fn send(&mut self, msg: Out) {
        if let Some(c) = &mut self.conn {
            let bytes = encode(&pb::ShepherdOut { msg: Some(msg) });
            if c.wr.write_all(&bytes).is_err() {
                self.conn = None;
            }
        }
    }

    fn output_fd(&self, which: usize) -> Option<&OwnedFd> {
        match &self.stdio {
            Stdio::Pipes { stdout, stderr, .. } => {
                if which == OUT {
                    stdout.as_ref()
                } else {
                    stderr.as_ref()
                }
            }
            Stdio::Pty { master } => {
                if which == OUT {
                    master.as_ref()
                } else {
                    None
                }
            }
            Stdio::Log => None,
        }
    }

    fn close_output(&mut self, which: usize) {
        match &mut self.stdio {
            Stdio::Pipes { stdout, stderr, .. } => {
                if which == OUT {
                    *stdout = None
                } else {
                    *stderr = None
                }
            }
            Stdio::Pty { master } => {
                if which == OUT {
                    *master = None
                }
            }
            Stdio::Log => {}
        }
    }

    fn stdin_fd(&self) -> Option<&OwnedFd> {
        match &self.stdio {
            Stdio::Pipes { stdin, .. } => stdin.as_ref(),
            Stdio::Pty { master } => master.as_ref(),
            Stdio::Log => None,
        }
    }

    /// Reads what one output has now and relays it; false once it reached its end.
    fn pump(&mut self, which: usize) -> bool {
        let mut buf = [0u8; 65536];
        let Some(fd) = self.output_fd(which) else {
            return false;
        };
        // SAFETY: reading into a live stack buffer from a descriptor we own.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            let data = buf[..n as usize].to_vec();
            self.sent[which].push(&data);
            self.send(output_msg(which, data));
            true
        } else if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock
        {
            true
        } else {
            // 0 is end of file; EIO is a pty whose other side is closed.
            self.close_output(which);
            false
        }
    }

    /// The stub has each output up to `to`.
    fn ack(&mut self, to: &pb::ResumeFrom) {
        self.acked[OUT] = self.acked[OUT].max(to.stdout);
        self.acked[ERR] = self.acked[ERR].max(to.stderr);
    }

    /// A stub's new session: say where each stream goes on from (its offset, or the oldest
    /// byte still kept), resend the kept output from there, tell a stop or continue the
    /// stub missed, and relay again.
    ///
    /// Input goes on from what the process was given: what waits here is dropped, and the
    /// stub sends it again (it keeps a window beyond what it was told, and was told no
    /// more than was given). Counted as had, it would let the stub send a window more
    /// after each break while the process does not read. Its end, if it came, comes again
    /// after it. (Input of an older session never follows a resume: cland relays a
    /// session's input only while it is the latest, `VProc::send_from`.)
    fn resume(&mut self, from: &pb::ResumeFrom) {
        self.attached = true;
        self.ack(from);
        if !self.pending_stdin.is_empty() {
            self.pending_stdin = VecDeque::new();
            self.stdin_eof = false;
        }
        self.send(Out::Resumed(pb::Resumed {
            stdin_taken: self.stdin_given,
            stdin_eof: self.stdin_eof,
            stdout: self.sent[OUT].clamp(from.stdout),
            stderr: self.sent[ERR].clamp(from.stderr),
            controls_taken: self.controls_taken,
            ..Default::default()
        }));
        if self.exited.is_none() {
            match (self.stopped, from.stopped) {
                (Some(sig), false) => self.send(Out::Stopped(sig)),
                (None, true) => self.send(Out::Continued(true)),
                _ => {}
            }
        }
        for (which, at) in [(OUT, from.stdout), (ERR, from.stderr)] {
            let again = self.sent[which].since(at);
            for piece in again.chunks(RESEND_CHUNK) {
                self.send(output_msg(which, piece.to_vec()));
            }
        }
        if let Some(st) = self.exited {
            self.drain_outputs();
            self.send(Out::Exited(st.into()));
        }
    }

    fn drain_outputs(&mut self) {
        for which in [OUT, ERR] {
            for _ in 0..64 {
                let before = self.output_fd(which).is_some();
                if !before {
                    break;
                }
                // Stop when the descriptor has nothing more right now.
                let fd = self.output_fd(which).map(|f| f.as_raw_fd()).unwrap_or(-1);
                let mut p = [PollFd::new(
                    // SAFETY: fd is open for the duration of this poll (we own it).
                    unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
                    PollFlags::POLLIN,
                )];
                if poll(&mut p, PollTimeout::ZERO).unwrap_or(0) == 0 {
                    break;
                }
                if !self.pump(which) {
                    break;
                }
            }
        }
    }

    /// Gives the process what input waits, as much as its stdin takes now, and every
    /// [`window::ACK_EVERY`] bytes given tells the stub, which may then send more.
    fn flush_stdin(&mut self) {
        self.write_stdin();
        self.tell_given();
    }

    fn tell_given(&mut self) {
        if self.stdin_given - self.stdin_told >= window::ACK_EVERY {
            self.stdin_told = self.stdin_given;
            self.send(Out::Taken(self.stdin_given));
        }
    }

    fn write_stdin(&mut self) {
        let Some(fd) = self.stdin_fd() else {
            self.drop_pending_stdin();
            return;
        };
        let raw = fd.as_raw_fd();
        while !self.pending_stdin.is_empty() {
            let (first, _) = self.pending_stdin.as_slices();
            // SAFETY: writing from a live buffer to a descriptor we own.
            let n = unsafe { libc::write(raw, first.as_ptr().cast(), first.len()) };
            if n > 0 {
                self.pending_stdin.drain(..n as usize);
                self.stdin_given += n as u64;
            } else {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                if e.kind() != std::io::ErrorKind::WouldBlock {
                    // The reader is gone: what it did not take is lost, as with a local pipe.
                    self.drop_pending_stdin();
                    if let Stdio::Pipes { stdin, .. } = &mut self.stdio {
                        *stdin = None;
                    }
                }
                break;
            }
        }
        if self.pending_stdin.is_empty() {
            if self.pending_stdin.capacity() > STDIN_IDLE_CAPACITY {
                // A backlog's buffer is given back once it drained.
                self.pending_stdin = VecDeque::new();
            }
            if self.stdin_eof {
                match &mut self.stdio {
                    Stdio::Pipes { stdin, .. } => *stdin = None,
                    Stdio::Pty { master: Some(m) } => {
                        // EOF on a terminal is the VEOF character at the start of a line.
                        let _ = nix::unistd::write(m.as_fd(), &[4u8]);
                    }
                    _ => {}
                }
            }
        }
    }

    /// Input that nothing will read any more (its reader is gone) counts as given.
    fn drop_pending_stdin(&mut self) {
        self.stdin_given += self.pending_stdin.len() as u64;
        self.pending_stdin = VecDeque::new();
    }

    fn reap_and_exit(&mut self) -> ! {
        let _ = sys::wait_pidfd(&self.pidfd, false, false);
        let _ = std::fs::remove_file(&self.socket_path);
        if self.log.is_some() || self.log_pipe.is_some() {
            self.linger();
        }
        std::process::exit(0)
    }

    /// Relays what the detached process's output pipe has now into its log: the bytes
    /// read (0: none now), `None` at its end (no process holds it any more).
    fn relay_log(&mut self) -> Option<usize> {
        let fd = self.log_pipe.as_ref()?;
        let mut buf = [0u8; 65536];
        // SAFETY: reading into a live stack buffer from a descriptor we own.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            if let Some(l) = &mut self.log {
                l.write(&buf[..n as usize]);
            }
            return Some(n as usize);
        }
        if n < 0
            && matches!(
                std::io::Error::last_os_error().kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
            )
        {
            return Some(0);
        }
        self.log_pipe = None;
        None
    }

    /// What the output pipe holds now, into the log (the process ended: all it wrote is
    /// there, at most a pipe's capacity; its descendants may still be writing, so the
    /// drain is bounded).
    fn drain_log(&mut self) {
        for _ in 0..64 {
            if !matches!(self.relay_log(), Some(n) if n > 0) {
                break;
            }
        }
    }

    /// A detached process was collected: its log's retention starts now (cland removes it
    /// `exit_retention_ms` after its last change, `logfile::sweep`). Descendants that
    /// outlive the process may still hold its output pipe: cland is let go (it forgets the
    /// process) and their output goes on into the log until the last of them closes it.
    fn linger(&mut self) -> Option<()> {
        self.drain_log();
        if let Some(l) = &self.log {
            l.touch();
        }
        self.conn = None;
        loop {
            let pipe = self.log_pipe.as_ref()?;
            let mut p = [
                PollFd::new(pipe.as_fd(), PollFlags::POLLIN),
                PollFd::new(self.sigchld.as_fd(), PollFlags::POLLIN),
            ];
            if poll(&mut p, PollTimeout::NONE).is_err() {
                continue;
            }
            let ready = |p: &PollFd<'_>| p.revents().is_some_and(|r| !r.is_empty());
            let (output, child) = (ready(&p[0]), ready(&p[1]));
            if child {
                while let Ok(Some(_)) = self.sigchld.read_signal() {}
                self.reap_adopted();
            }
            if output {
                self.relay_log()?;
            }
        }
    }

    /// A signal from the stub, as a terminal or kill(1) would send it.
    fn deliver(&mut self, sig: i32) {
        if self.exited.is_some() {
            return;
        }
        // What a terminal sends goes to the process's group (its job), as the terminal
        // would send it (a hang-up too: the stub's, or the stub gone); the rest to the
        // process, as kill(1) would.
        let to_group = matches!(
            sig,
            libc::SIGINT | libc::SIGQUIT | libc::SIGTSTP | libc::SIGCONT | libc::SIGHUP
        );
        if is_tty_stop(sig) {
            self.stop_group(self.pid, sig);
        // SAFETY: kill(2) of the group our own child leads; the child is not reaped before
        // Release, so the number can not name another group.
        } else if !to_group || unsafe { libc::kill(-self.pid, sig) } != 0 {
            let _ = sys::pidfd_send_signal(&self.pidfd, sig);
        }
    }

    fn handle(&mut self, msg: In) {
        match msg {
            In::Hello(_) => {
                let info = self.info();
                self.send(Out::Info(info));
            }
            In::Stdin(data) => {
                if self.stdin_eof {
                    // Past its end (a stub sends none): nothing will read it.
                    self.stdin_given += data.len() as u64;
                    self.tell_given();
                } else {
                    self.pending_stdin.extend(&data);
                    if let Some(fd) = self.stdin_fd() {
                        set_nonblocking(fd);
                    }
                    self.flush_stdin();
                }
            }
            In::StdinEof(_) => {
                self.stdin_eof = true;
                self.flush_stdin();
            }
            In::Signal(sig) => {
                self.controls_taken += 1;
                self.deliver(sig);
            }
            // Not one of the session's controls: the stub did not number it.
            In::StartSignal(sig) => self.deliver(sig),
            In::JobStop(_) => {
                if self.exited.is_none() {
                    self.job_stop = true;
                    let _ = sys::pidfd_send_signal(&self.pidfd, libc::SIGSTOP);
                }
            }
            In::CloseStdout(_) => {
                self.controls_taken += 1;
                // The stub's reader is gone: whoever writes to the process's stdout gets
                // EPIPE (SIGPIPE), as with a local pipe whose reader closed. A terminal's
                // master is not closed (that would hang it up): its process gets SIGPIPE.
                match self.stdio {
                    Stdio::Pipes { .. } => self.close_output(OUT),
                    _ if self.exited.is_none() => {
                        let _ = sys::pidfd_send_signal(&self.pidfd, libc::SIGPIPE);
                    }
                    _ => {}
                }
            }
            In::Resume(from) => self.resume(&from),
            In::Acked(a) => self.ack(&a),
            // Output waits in the pipes (the process blocks when they fill) until a resume.
            In::Hold(_) => self.attached = false,
            // Only meaningful before the fork (see `start`).
            In::Start(_) => {}
            In::Background(b) => {
                self.controls_taken += 1;
                self.background = b;
                self.ttin_sent = false;
            }
            In::Resize(ws) => {
                self.controls_taken += 1;
                if let Stdio::Pty { master: Some(m) } = &self.stdio {
                    let w = libc::winsize {
                        ws_row: ws.rows as u16,
                        ws_col: ws.cols as u16,
                        ws_xpixel: 0,
                        ws_ypixel: 0,
                    };
                    // SAFETY: TIOCSWINSZ reads a winsize struct we pass by pointer.
                    unsafe { libc::ioctl(m.as_raw_fd(), libc::TIOCSWINSZ, &w) };
                }
            }
            In::Release(_) => {
                if self.exited.is_some() {
                    self.reap_and_exit();
                }
            }
            In::Orphan(_) => {
                self.orphaned = true;
                self.attached = false;
                if self.exited.is_some() {
                    self.reap_and_exit();
                }
                // Like a local child whose parent and readers are gone: its pipes break.
                if !matches!(self.stdio, Stdio::Log) {
                    self.stdio = Stdio::Log;
                }
            }
        }
    }

    fn serve(&mut self) -> ! {
        loop {
            let relay = self.attached && self.conn.is_some();
            let mut fds: Vec<(u8, std::os::fd::BorrowedFd<'_>, PollFlags)> = Vec::with_capacity(6);
            fds.push((0, self.listener.as_fd(), PollFlags::POLLIN));
            if let Some(c) = &self.conn {
                fds.push((1, c.rd.as_fd(), PollFlags::POLLIN));
            }
            if self.exited.is_none() {
                fds.push((2, self.pidfd.as_fd(), PollFlags::POLLIN));
            }
            if relay {
                // Not beyond what can be sent again: the process waits on a full pipe.
                let room = |w: usize| {
                    self.sent[w].total().saturating_sub(self.acked[w]) < window::WINDOW as u64
                };
                if let Some(f) = self.output_fd(OUT).filter(|_| room(OUT)) {
                    fds.push((3, f.as_fd(), PollFlags::POLLIN));
                }
                if let Some(f) = self.output_fd(ERR).filter(|_| room(ERR)) {
                    fds.push((4, f.as_fd(), PollFlags::POLLIN));
                }
            }
            if !self.pending_stdin.is_empty() {
                if let Some(f) = self.stdin_fd() {
                    fds.push((5, f.as_fd(), PollFlags::POLLOUT));
                }
            }
            // Also after the process ended: adopted orphans still end and are reaped.
            fds.push((6, self.sigchld.as_fd(), PollFlags::POLLIN));
            // A detached process's output, into its log whether cland is there or not.
            if let Some(p) = &self.log_pipe {
                fds.push((7, p.as_fd(), PollFlags::POLLIN));
            }
            // No event tells us that a process blocks reading a pipe: while the stub is in
            // the background, look every 50 ms (nothing is polled otherwise).
            let watch_reads = self.watching_reads();
            let timeout = if watch_reads {
                PollTimeout::from(50u16)
            } else {
                PollTimeout::NONE
            };
            let mut pfds: Vec<PollFd<'_>> = fds
                .iter()
                .map(|(_, fd, fl)| PollFd::new(*fd, *fl))
                .collect();
            match poll(&mut pfds, timeout) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => continue,
            }
            let ready: Vec<u8> = fds
                .iter()
                .zip(pfds.iter())
                .filter(|(_, p)| p.revents().is_some_and(|r| !r.is_empty()))
                .map(|((tag, _, _), _)| *tag)
                .collect();
            drop(pfds);
            drop(fds);
            for tag in ready {
                match tag {
                    0 => {
                        if let Ok(c) = self.listener.accept().and_then(|(c, _)| Link::socket(c)) {
                            // A new connection (a restarted cland) replaces the old one.
                            self.conn = Some(c);
                            self.conn_buf.clear();
                            self.attached = false;
                        }
                    }
                    1 => self.read_conn(),
                    2 => self.child_changed(),
                    3 => {
                        self.pump(OUT);
                    }
                    4 => {
                        self.pump(ERR);
                    }
                    5 => self.flush_stdin(),
                    6 => self.child_signalled(),
                    7 => {
                        self.relay_log();
                    }
                    _ => {}
                }
            }
            if watch_reads {
                self.check_background_read();
            }
        }
    }

    fn read_conn(&mut self) {
        let Some(c) = &mut self.conn else { return };
        let mut buf = [0u8; 65536];
        match c.rd.read(&mut buf) {
            Ok(0) | Err(_) => {
                self.conn = None;
                self.attached = false;
                self.conn_buf.clear();
            }
            Ok(n) => {
                self.conn_buf.extend_from_slice(&buf[..n]);
                match split_frames(&mut self.conn_buf) {
                    Ok(frames) => {
                        for f in frames {
                            match pb::ShepherdIn::decode(f.as_slice()) {
                                Ok(pb::ShepherdIn { msg: Some(m) }) => self.handle(m),
                                _ => {
                                    self.conn = None;
                                    return;
                                }
                            }
                        }
                    }
                    Err(_) => self.conn = None,
                }
            }
        }
    }

    /// SIGCHLD: report the child's stops and continues (a stub mirrors them for its shell;
    /// a detached process's parent can wait for them).
    fn child_signalled(&mut self) {
        while let Ok(Some(_)) = self.sigchld.read_signal() {}
        self.reap_adopted();
        if self.exited.is_some() {
            return;
        }
        while let Ok(Some(ev)) = sys::wait_pidfd_stop(&self.pidfd) {
            match ev {
                ChildEvent::Stopped(_) if self.job_stop => {}
                ChildEvent::Continued if self.job_stop => self.job_stop = false,
                ChildEvent::Stopped(sig) => {
                    let sig = match self.stop_as.take() {
                        Some(s) if sig == libc::SIGSTOP => s,
                        _ => sig,
                    };
                    self.stopped = Some(sig);
                    self.send(Out::Stopped(sig))
                }
                ChildEvent::Continued => {
                    // ttin_sent stays: the stub re-arms with Background(true) if it is
                    // continued while still in the background.
                    self.stop_as = None;
                    self.stopped = None;
                    self.send(Out::Continued(true));
                }
                ChildEvent::Exited(_) => {}
            }
        }
    }

    /// As a child subreaper the shepherd adopts the process's orphaned descendants: they
    /// are reaped here when they end (the process itself is reaped only on release).
    fn reap_adopted(&mut self) {
        let me = std::process::id();
        let kids =
            std::fs::read_to_string(format!("/proc/self/task/{me}/children")).unwrap_or_default();
        for k in kids
            .split_whitespace()
            .filter_map(|k| k.parse::<i32>().ok())
        {
            if k != self.pid {
                let _ = nix::sys::wait::waitpid(
                    nix::unistd::Pid::from_raw(k),
                    Some(nix::sys::wait::WaitPidFlag::WNOHANG),
                );
            }
        }
    }

    /// Whether a read of the process's stdin should stop it (the stub is in the background
    /// and there is nothing to read).
    fn watching_reads(&self) -> bool {
        self.background
            && !self.ttin_sent
            && self.exited.is_none()
            && !self.stdin_eof
            && self.pending_stdin.is_empty()
            && matches!(self.stdio, Stdio::Pipes { stdin: Some(_), .. })
    }

    /// As a terminal does for a background job: a process of the tree blocked in read(2) on
    /// the stdin pipe gets SIGTTIN, sent to its process group.
    fn check_background_read(&mut self) {
        let Some(fd) = self.stdin_fd() else { return };
        let Ok(st) = nix::sys::stat::fstat(fd.as_raw_fd()) else {
            return;
        };
        let pipe = format!("pipe:[{}]", st.st_ino);
        for pid in tree(self.pid) {
            let reads_stdin = std::fs::read_link(format!("/proc/{pid}/fd/0"))
                .is_ok_and(|l| l.as_os_str() == pipe.as_str())
                && std::fs::read_to_string(format!("/proc/{pid}/syscall"))
                    .is_ok_and(|s| s.starts_with("0 0x0 "));
            if !reads_stdin {
                continue;
            }
            if let Some(pg) = stat_field(pid, 2).filter(|&p| p > 0) {
                self.stop_group(pg, libc::SIGTTIN);
                self.ttin_sent = true;
                return;
            }
        }
    }

    /// Job-control stop `sig` (SIGTSTP, SIGTTIN, SIGTTOU) for process group `pgrp` of the
    /// process's tree. The kernel discards these signals' default stop for a group it thinks
    /// orphaned, and the process's group is orphaned to the kernel (its parent, this
    /// shepherd, is in another session) though not in the cluster (its stub's shell controls
    /// it). So clan applies the default action itself: a member that catches `sig` gets it,
    /// one that ignores it is left alone, the others get SIGSTOP; the stop is then reported as
    /// caused by `sig`, as a local shell would see it.
    fn stop_group(&mut self, pgrp: i32, sig: i32) {
        let bit = 1u64 << (sig - 1);
        for pid in tree(self.pid) {
            let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
                continue;
            };
            if stat_field(pid, 2) != Some(pgrp) {
                continue;
            }
            let mask = |k: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(k))
                    .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                    .unwrap_or(0)
            };
            let send = if mask("SigCgt:") & bit != 0 {
                sig
            } else if mask("SigIgn:") & bit != 0 {
                continue;
            } else {
                libc::SIGSTOP
            };
            // SAFETY: kill(2) of a process of the tree, found a moment ago.
            unsafe { libc::kill(pid, send) };
        }
        self.stop_as = Some(sig);
    }

    fn child_changed(&mut self) {
        match sys::wait_pidfd(&self.pidfd, true, true) {
            Ok(Some(ChildEvent::Exited(st))) => {
                self.exited = Some(st);
                if self.orphaned {
                    self.reap_and_exit();
                }
                // An attached process's status goes after its output, to whoever attached;
                // a detached one's at once (its output is in its log), and so does a held
                // one's (cland records it; its stub gets it again, after the output, when
                // it resumes).
                if self.attached {
                    self.drain_outputs();
                }
                // A detached one's output is in its log before its end is told, so a
                // `clan logs` after `clan wait` has all of it.
                self.drain_log();
                self.send(Out::Exited(st.into()));
            }
            Ok(_) => {}
            Err(_) => {
                // The child is gone without a status we can read (should not happen).
                self.exited = Some(WaitStatus {
                    signal: libc::SIGKILL,
                    ..Default::default()
                });
            }
        }
    }
}
