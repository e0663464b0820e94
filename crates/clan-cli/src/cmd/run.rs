//! `clan run`: the stub (DESIGN.md 7). It relays stdin, stdout and stderr (a pseudo-terminal
//! with -t), forwards the signals it receives, and ends the way the remote process ended:
//! the same exit code, or killed by the same signal.

use clan_client::{
    pb, pb::session_input::Input, pb::session_output::Output, Client, ClientError, RunSpec,
};
use clan_core::{ExitCode as X, Gpid, WaitStatus};
use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Write;
use std::os::fd::AsFd;
use std::process::ExitCode;
use tokio::io::AsyncReadExt;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum PolicyArg {
    /// Round-robin over the live nodes.
    Rr,
    /// The node with the lowest load.
    LeastLoaded,
    /// Ask the registered load manager.
    Loadmgr,
}

#[derive(clap::Args)]
pub struct Args {
    /// Run on this node.
    #[arg(long, conflicts_with = "policy")]
    node: Option<u32>,
    /// Placement policy when no node is given [default: the load manager if one is
    /// registered, else rr].
    #[arg(long, value_enum)]
    policy: Option<PolicyArg>,
    /// One copy on each of K nodes, as one job (CLAN_RANK, CLAN_SIZE are set).
    #[arg(short = 'N', long = "nodes", value_name = "K", value_parser = clap::value_parser!(u32).range(1..))]
    count: Option<u32>,
    /// Add the process to this existing job [default: $CLAN_JOB, the job of the process
    /// that runs `clan run` when clan started it, so its remote children stay in its job].
    #[arg(long, env = "CLAN_JOB")]
    job: Option<u64>,
    /// Limit the job's task on each node the process starts on to N processes at once
    /// (the cgroup pids controller): forks beyond it fail with EAGAIN, as under ulimit -u.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4_194_304))]
    max_procs: Option<u32>,
    /// Give the process a pseudo-terminal.
    #[arg(short, long)]
    tty: bool,
    /// Start it detached: print its gpid and return; output goes to `clan logs`.
    #[arg(short, long)]
    detach: bool,
    /// With -N, prefix each output line with the copy's rank.
    #[arg(short, long)]
    label: bool,
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<OsString>,
}

/// Signals the stub passes on to the remote process: every one a process can catch but
/// those that concern the stub itself (SIGCHLD; SIGTTIN and SIGTTOU, which its terminal
/// sends it; SIGPIPE, which it handles as a closed output; the faults SIGSEGV, SIGBUS,
/// SIGFPE, SIGILL, SIGTRAP, SIGSYS and SIGABRT), and SIGWINCH with -t (a window size is
/// sent instead); the real-time signals too. SIGTSTP stops the remote process first; the
/// stub stops itself once the remote process reports the stop (`mirror_stop`), so the
/// shell sees its job stopped; the shell's SIGCONT (bg, fg) goes on to the remote process.
fn forwarded(tty: bool) -> Vec<i32> {
    let mut v = vec![
        libc::SIGTSTP,
        libc::SIGCONT,
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGALRM,
        libc::SIGPWR,
        libc::SIGXCPU,
        libc::SIGXFSZ,
        libc::SIGVTALRM,
        libc::SIGPROF,
        libc::SIGURG,
        libc::SIGSTKFLT,
    ];
    if !tty {
        v.push(libc::SIGWINCH);
    }
    v.extend(libc::SIGRTMIN()..=libc::SIGRTMAX());
    v
}

/// Signals of this thread blocked until dropped (then the mask is what it was, and any
/// that came meanwhile are delivered).
struct HeldSignals(libc::sigset_t);

impl HeldSignals {
    fn hold(sigs: &[i32]) -> HeldSignals {
        // SAFETY: sigset_t is plain data, initialised by sigemptyset before use; the calls
        // only read and write the sets passed.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for &s in sigs {
                libc::sigaddset(&mut set, s);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            HeldSignals(old)
        }
    }
}

impl Drop for HeldSignals {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved by `hold`.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut());
        }
    }
}

fn start_error(e: &ClientError) -> ExitCode {
    crate::fail(e);
    ExitCode::from(match e.code() {
        Some(pb::ErrorCode::CommandNotFound) => X::COMMAND_NOT_FOUND,
        Some(pb::ErrorCode::NotExecutable) => X::NOT_EXECUTABLE,
        _ => X::RUN_FAILED,
    })
}

/// Whether stdin is /dev/null (character device 1:3).
fn stdin_is_null() -> bool {
    nix::sys::stat::fstat(0).is_ok_and(|st| {
        (st.st_mode & libc::S_IFMT) == libc::S_IFCHR
            && libc::major(st.st_rdev) == 1
            && libc::minor(st.st_rdev) == 3
    })
}

pub(crate) fn winsize() -> (u16, u16) {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes a winsize into the struct we pass.
    let ok = unsafe { libc::ioctl(0, libc::TIOCGWINSZ, &mut ws) } == 0;
    if ok && ws.ws_row > 0 {
        (ws.ws_row, ws.ws_col)
    } else {
        (24, 80)
    }
}

/// Puts the terminal in raw mode and restores it when dropped (and while the stub is
/// stopped, as a local full-screen program does).
struct RawMode {
    old: nix::sys::termios::Termios,
    raw: nix::sys::termios::Termios,
}

impl RawMode {
    fn enable() -> Option<RawMode> {
        let old = nix::sys::termios::tcgetattr(std::io::stdin().as_fd()).ok()?;
        let mut raw = old.clone();
        nix::sys::termios::cfmakeraw(&mut raw);
        let m = RawMode { old, raw };
        m.set(&m.raw).then_some(m)
    }

    fn set(&self, t: &nix::sys::termios::Termios) -> bool {
        nix::sys::termios::tcsetattr(
            std::io::stdin().as_fd(),
            nix::sys::termios::SetArg::TCSADRAIN,
            t,
        )
        .is_ok()
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        self.set(&self.old);
    }
}

/// Whether this process's group is the foreground job of the terminal on stdin.
fn foreground() -> bool {
    nix::unistd::tcgetpgrp(std::io::stdin().as_fd()).is_ok_and(|p| p == nix::unistd::getpgrp())
}

/// The remote process stopped: stop the stub with the same signal, so its shell sees the job
/// stopped (and says why). Returns once something continued the stub.
fn mirror_stop(sig: i32, raw: Option<&RawMode>) {
    if let Some(r) = raw {
        r.set(&r.old);
    }
    let _ = std::io::stdout().flush();
    // SAFETY: the stop signal's default action is put in place only for the raise, then the
    // previous action (tokio's handler, or SIG_IGN for SIGTTIN) is put back; both sigaction
    // structs are live locals.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        let mut old: libc::sigaction = std::mem::zeroed();
        let sig = if sig == libc::SIGSTOP || libc::sigaction(sig, &dfl, &mut old) != 0 {
            libc::SIGSTOP
        } else {
            sig
        };
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
        if sig != libc::SIGSTOP {
            libc::sigaction(sig, &old, std::ptr::null_mut());
        }
    }
    if let Some(r) = raw {
        r.set(&r.raw);
    }
}

/// Reads a terminal on stdin for the remote process while the stub is the foreground job.
/// In the background a read fails with EIO (SIGTTIN is ignored here): the remote side is told,
/// so that its own read of stdin gets SIGTTIN as it would from the terminal, and reading
/// resumes once the stub is in the foreground again (checked when it is continued).
fn read_terminal(first: Gpid, tx: mpsc::UnboundedSender<Cmd>, cont: std::sync::mpsc::Receiver<()>) {
    // SAFETY: ignoring a signal installs no handler code.
    unsafe { libc::signal(libc::SIGTTIN, libc::SIG_IGN) };
    let mut buf = vec![0u8; 32 * 1024];
    let send = |i: Input| tx.send(Cmd::Input(first, i)).is_ok();
    loop {
        match nix::unistd::read(0, &mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if !send(Input::Stdin(buf[..n].to_vec())) {
                    return;
                }
            }
            Err(nix::errno::Errno::EINTR) | Err(nix::errno::Errno::EAGAIN) => {}
            Err(nix::errno::Errno::EIO) if !foreground() => {
                if !send(Input::Background(true)) {
                    return;
                }
                // bash's fg and bg both send SIGCONT; the timeout covers a tcsetpgrp alone.
                // Continued in the background (bg), the next read of the remote process
                // stops it again.
                while !foreground() {
                    match cont.recv_timeout(std::time::Duration::from_millis(500)) {
                        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
                        Ok(()) if !foreground() && !send(Input::Background(true)) => return,
                        _ => {}
                    }
                }
                if !send(Input::Background(false)) {
                    return;
                }
            }
            Err(_) => break,
        }
    }
    let _ = send(Input::StdinEof(true));
}

/// Ends this process the way the remote one ended.
fn die_like(st: &WaitStatus) -> ! {
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    if st.signal != 0 {
        // SAFETY: we reset the signal to its default action, unblock it and raise it on
        // ourselves; no core file for the stub (the remote process had its own).
        unsafe {
            let zero = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &zero);
            libc::signal(st.signal, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, st.signal);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(st.signal);
        }
        std::process::exit(st.shell_code());
    }
    std::process::exit(st.code)
}

enum Cmd {
    Input(Gpid, Input),
    All(Input),
    /// A process that is lost (its node died): nothing more to send it.
    Forget(Gpid),
}

pub async fn run(c: Client, a: Args) -> ExitCode {
    use std::os::unix::ffi::OsStrExt;
    let tty = a.tty && nix::unistd::isatty(0).unwrap_or(false);
    if a.tty && !tty {
        eprintln!("clan: warning: stdin is not a terminal; running without -t");
    }
    let spec = RunSpec {
        argv: a.command.iter().map(|s| s.as_bytes().to_vec()).collect(),
        node: a
            .node
            .map(|n| clan_core::NodeId::new(n).ok_or(n))
            .transpose()
            .unwrap_or(None),
        policy: match a.policy {
            None => pb::Policy::Default,
            Some(PolicyArg::Rr) => pb::Policy::RoundRobin,
            Some(PolicyArg::LeastLoaded) => pb::Policy::LeastLoaded,
            Some(PolicyArg::Loadmgr) => pb::Policy::LoadManager,
        },
        count: a.count.unwrap_or(1),
        job: a.job.unwrap_or(0),
        tty,
        winsize: winsize(),
        detached: a.detach,
        max_procs: a.max_procs.unwrap_or(0),
        ..Default::default()
    };
    if let Some(n) = a.node {
        if clan_core::NodeId::new(n).is_none() {
            crate::fail(&format!("node {n} is not in the cluster"));
            return ExitCode::from(X::RUN_FAILED);
        }
    }
    run_spec(c, spec, a.label).await
}

/// Runs `spec` as `clan run` does: detached, or attached with this process as its stub;
/// `label` prefixes each output line with the copy's rank.
pub async fn run_spec(c: Client, mut spec: RunSpec, label: bool) -> ExitCode {
    let tty = spec.tty;
    // What the stub's caller ignored, the process starts with ignored, as a local exec
    // would (`nohup clan run`, `clan run ... &` in a script); the stub does not forward
    // those either, but SIGCONT, which continues a stopped stub whatever its disposition
    // (and `fg` must continue the process with it).
    let ignored = *spec
        .ignored_signals
        .get_or_insert_with(clan_core::sys::ignored_by_caller);
    let forwarded: Vec<i32> = forwarded(tty)
        .into_iter()
        .filter(|&s| s == libc::SIGCONT || ignored & clan_core::sys::signal_bit(s) == 0)
        .collect();
    // A stdin that is /dev/null is the process's too: it needs no pipe and no end sent
    // after the start (one request less through both nodes while the process runs).
    spec.stdin_null |= !tty && stdin_is_null();
    let spec_stdin_null = spec.stdin_null;
    if spec.detached {
        return match c.spawn(spec).await {
            Ok(s) => {
                for g in &s.gpids {
                    println!("{g}");
                }
                let nodes: Vec<String> = s.nodes.iter().map(|n| n.to_string()).collect();
                eprintln!("job {} on node(s) {}", s.job, nodes.join(","));
                ExitCode::SUCCESS
            }
            Err(e) => start_error(&e),
        };
    }
    // The stub's own setup (its fifty signal handlers) overlaps the wait for the process
    // to start: the spawn goes out first (its connection is made in the same poll). A
    // signal that comes before the handlers are in place waits, blocked, until they are.
    // While the process starts, its signals go to cland with the start (a Ctrl-C must
    // reach a process whose exec hangs); once it has started, on its session.
    let held = HeldSignals::hold(&forwarded);
    let (sig_tx, mut signals) = mpsc::unbounded_channel::<i32>();
    let setup = async {
        for (sig, mut s) in forwarded
            .iter()
            .copied()
            .filter_map(|sig| signal(SignalKind::from_raw(sig)).ok().map(|s| (sig, s)))
        {
            let sig_tx = sig_tx.clone();
            tokio::spawn(async move {
                while s.recv().await.is_some() {
                    if sig_tx.send(sig).is_err() {
                        return;
                    }
                }
            });
        }
        drop(held);
    };
    let (session, ()) = tokio::join!(c.run_signalled(spec, &mut signals), setup);
    let session = match session {
        Ok(s) => s,
        Err(e) => return start_error(&e),
    };
    let (started, mut rd, mut wr) = session.split();
    let gpids: Vec<Gpid> = started.gpids;
    let rank: HashMap<Gpid, usize> = gpids.iter().enumerate().map(|(i, g)| (*g, i)).collect();
    let raw = if tty { RawMode::enable() } else { None };

    let (tx, mut rx) = mpsc::unbounded_channel::<Cmd>();
    // Piped stdin has a bounded queue of its own: while the session is slow (or broken and
    // being taken up again) the stub stops reading, and the pipe feeding it fills, instead
    // of the stub's memory. Signals and releases never wait behind it.
    let (piped_tx, mut piped) = mpsc::channel::<Input>(16);
    let writer_gpids = gpids.clone();
    let writer = tokio::spawn(async move {
        let mut live = writer_gpids;
        let first = live.first().copied();
        let mut piped_open = true;
        'cmds: loop {
            let cmd = tokio::select! {
                biased;
                c = rx.recv() => match c {
                    Some(c) => c,
                    None => break,
                },
                i = piped.recv(), if piped_open => match (i, first) {
                    (Some(i), Some(g)) => Cmd::Input(g, i),
                    _ => {
                        piped_open = false;
                        continue;
                    }
                },
            };
            let sends: Vec<(Gpid, Input)> = match cmd {
                Cmd::Input(g, Input::Release(r)) => {
                    live.retain(|x| *x != g);
                    vec![(g, Input::Release(r))]
                }
                Cmd::Input(g, i) => vec![(g, i)],
                Cmd::All(i) => live.iter().map(|g| (*g, i.clone())).collect(),
                Cmd::Forget(g) => {
                    live.retain(|x| *x != g);
                    vec![]
                }
            };
            for (g, i) in sends {
                if wr.send(g, i).await.is_err() {
                    break 'cmds;
                }
            }
            if live.is_empty() {
                break; // every process released
            }
        }
        // What was sent goes out before the stub exits (its releases, above all).
        wr.close(std::time::Duration::from_secs(1)).await;
    });
    // stdin goes to the first process (rank 0), like srun; /dev/null needs no reader, and
    // the processes have /dev/null of their own (`stdin_null`).
    let (cont_tx, cont_rx) = std::sync::mpsc::channel::<()>();
    let stdin_tty = nix::unistd::isatty(0).unwrap_or(false);
    if spec_stdin_null {
        drop(piped_tx);
    } else if let (Some(&first), true) = (gpids.first(), stdin_tty) {
        drop(piped_tx);
        let tx = tx.clone();
        std::thread::spawn(move || read_terminal(first, tx, cont_rx));
    } else if !gpids.is_empty() {
        let tx = piped_tx;
        tokio::spawn(async move {
            let mut stdin = tokio::io::stdin();
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                match stdin.read(&mut buf).await {
                    Ok(0) | Err(_) => {
                        let _ = tx.send(Input::StdinEof(true)).await;
                        return;
                    }
                    Ok(n) => {
                        if tx.send(Input::Stdin(buf[..n].to_vec())).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
    } else {
        drop(piped_tx);
    }
    {
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(sig) = signals.recv().await {
                if sig == libc::SIGCONT {
                    let _ = cont_tx.send(());
                }
                if tx.send(Cmd::All(Input::Signal(sig))).is_err() {
                    return;
                }
            }
        });
    }
    if tty {
        if let Ok(mut s) = signal(SignalKind::window_change()) {
            let tx = tx.clone();
            tokio::spawn(async move {
                while s.recv().await.is_some() {
                    let (rows, cols) = winsize();
                    let ws = pb::WinSize {
                        rows: rows.into(),
                        cols: cols.into(),
                    };
                    if tx.send(Cmd::All(Input::Resize(ws))).is_err() {
                        return;
                    }
                }
            });
        }
    }

    let mut ends: HashMap<Gpid, WaitStatus> = HashMap::new();
    let mut line_start: HashMap<(Gpid, bool), bool> = HashMap::new();
    let mut stdout_open = true;
    let mut stopped: std::collections::HashSet<Gpid> = std::collections::HashSet::new();
    while ends.len() < gpids.len() {
        let o = match rd.next().await {
            Ok(Some(o)) => o,
            Ok(None) | Err(_) => {
                crate::fail(&"lost connection to cland");
                drop(raw);
                die_like(&WaitStatus {
                    signal: libc::SIGKILL,
                    ..Default::default()
                });
            }
        };
        let Some(g) = Gpid::from_raw(o.gpid) else {
            continue;
        };
        // The session broke (a cland restarted) and was taken up again, perhaps short of
        // what was in flight.
        if let Some(Output::Resumed(r)) = &o.output {
            for (n, what) in [(r.stdin_lost, "input to"), (r.output_lost, "output of")] {
                if n > 0 {
                    crate::fail(&format!(
                        "warning: {n} bytes of {what} process {g} were lost in a restart of cland"
                    ));
                }
            }
        }
        match o.output {
            Some(Output::Stdout(d)) if stdout_open => {
                let label = label.then(|| rank.get(&g).copied()).flatten();
                let at_start = line_start.entry((g, true)).or_insert(true);
                if write_out(&mut std::io::stdout(), &d, label, at_start).is_err() {
                    // Like a local process writing to a closed pipe: its stdout closes
                    // too, and whoever writes to it gets EPIPE (SIGPIPE).
                    stdout_open = false;
                    let _ = tx.send(Cmd::All(Input::CloseStdout(true)));
                }
            }
            Some(Output::Stdout(_)) => {}
            Some(Output::Stderr(d)) => {
                let _ = write_out(
                    &mut std::io::stderr(),
                    &d,
                    label.then(|| rank.get(&g).copied()).flatten(),
                    line_start.entry((g, false)).or_insert(true),
                );
            }
            Some(Output::Exited(st)) => {
                ends.insert(g, st.into());
                let _ = tx.send(Cmd::Input(g, Input::Release(true)));
            }
            Some(Output::Stopped(sig)) => {
                stopped.insert(g);
                // A job is stopped when all of it is (one process but for -N).
                if stopped.len() + ends.len() >= gpids.len() {
                    mirror_stop(sig, raw.as_ref());
                }
            }
            Some(Output::Continued(_)) => {
                stopped.remove(&g);
            }
            Some(Output::Lost(e)) => {
                crate::fail(&e);
                let _ = tx.send(Cmd::Forget(g));
                ends.insert(
                    g,
                    WaitStatus {
                        signal: libc::SIGKILL,
                        ..Default::default()
                    },
                );
            }
            Some(Output::Resumed(_) | Output::Interrupted(_) | Output::Taken(_)) | None => {}
        }
    }
    // Let the releases go out before we exit.
    drop(tx);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), writer).await;
    drop(raw);
    if gpids.len() == 1 {
        die_like(&ends[&gpids[0]]);
    }
    // Every copy killed by the same signal (Ctrl-C of a -N run): die of it too, so that a
    // shell loop around the run stops as it would for a local command.
    let first = ends[&gpids[0]];
    if first.signal != 0 && ends.values().all(|s| s.signal == first.signal) {
        die_like(&first);
    }
    let worst = ends.values().map(|s| s.shell_code()).max().unwrap_or(0);
    let _ = std::io::stdout().flush();
    std::process::exit(worst)
}

fn write_out(
    w: &mut impl Write,
    data: &[u8],
    rank: Option<usize>,
    at_start: &mut bool,
) -> std::io::Result<()> {
    let Some(rank) = rank else {
        w.write_all(data)?;
        return w.flush();
    };
    let mut out = Vec::with_capacity(data.len() + 16);
    for &b in data {
        if *at_start {
            out.extend_from_slice(format!("{rank}: ").as_bytes());
            *at_start = false;
        }
        out.push(b);
        if b == b'\n' {
            *at_start = true;
        }
    }
    w.write_all(&out)?;
    w.flush()
}
