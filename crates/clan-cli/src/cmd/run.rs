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
    #[arg(short = 'N', long = "nodes", value_name = "K")]
    count: Option<u32>,
    /// Add the process to this existing job.
    #[arg(long)]
    job: Option<u64>,
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

/// Signals the stub passes on to the remote process.
const FORWARD: &[i32] = &[
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
];

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

fn winsize() -> (u16, u16) {
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

/// Puts the terminal in raw mode and restores it when dropped.
struct RawMode(nix::sys::termios::Termios);

impl RawMode {
    fn enable() -> Option<RawMode> {
        let stdin = std::io::stdin();
        let old = nix::sys::termios::tcgetattr(stdin.as_fd()).ok()?;
        let mut raw = old.clone();
        nix::sys::termios::cfmakeraw(&mut raw);
        nix::sys::termios::tcsetattr(stdin.as_fd(), nix::sys::termios::SetArg::TCSADRAIN, &raw)
            .ok()?;
        Some(RawMode(old))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = nix::sys::termios::tcsetattr(
            std::io::stdin().as_fd(),
            nix::sys::termios::SetArg::TCSADRAIN,
            &self.0,
        );
    }
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
        std::process::exit(128 + st.signal);
    }
    std::process::exit(st.code)
}

enum Cmd {
    Input(Gpid, Input),
    All(Input),
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
        ..Default::default()
    };
    if let Some(n) = a.node {
        if clan_core::NodeId::new(n).is_none() {
            crate::fail(&format!("node {n} is not in the cluster"));
            return ExitCode::from(X::RUN_FAILED);
        }
    }
    if a.detach {
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
    // The stub's own setup (its signal handlers) overlaps the wait for the process to start.
    let setup = async {
        FORWARD
            .iter()
            .filter_map(|&sig| signal(SignalKind::from_raw(sig)).ok().map(|s| (sig, s)))
            .collect::<Vec<_>>()
    };
    let (session, handlers) = tokio::join!(c.run(spec), setup);
    let session = match session {
        Ok(s) => s,
        Err(e) => return start_error(&e),
    };
    let (started, mut rd, mut wr) = session.split();
    let gpids: Vec<Gpid> = started.gpids;
    let rank: HashMap<Gpid, usize> = gpids.iter().enumerate().map(|(i, g)| (*g, i)).collect();
    let raw = if tty { RawMode::enable() } else { None };

    let (tx, mut rx) = mpsc::unbounded_channel::<Cmd>();
    let writer_gpids = gpids.clone();
    let writer = tokio::spawn(async move {
        let mut live = writer_gpids;
        while let Some(cmd) = rx.recv().await {
            let sends: Vec<(Gpid, Input)> = match cmd {
                Cmd::Input(g, Input::Release(r)) => {
                    live.retain(|x| *x != g);
                    vec![(g, Input::Release(r))]
                }
                Cmd::Input(g, i) => vec![(g, i)],
                Cmd::All(i) => live.iter().map(|g| (*g, i.clone())).collect(),
            };
            for (g, i) in sends {
                if wr.send(g, i).await.is_err() {
                    return;
                }
            }
            if live.is_empty() {
                return; // every process released
            }
        }
    });
    // stdin goes to the first process (rank 0), like srun; /dev/null needs no reader.
    if let (Some(&first), true) = (gpids.first(), stdin_is_null()) {
        let _ = tx.send(Cmd::Input(first, Input::StdinEof(true)));
    } else if let Some(&first) = gpids.first() {
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut stdin = tokio::io::stdin();
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                match stdin.read(&mut buf).await {
                    Ok(0) | Err(_) => {
                        let _ = tx.send(Cmd::Input(first, Input::StdinEof(true)));
                        return;
                    }
                    Ok(n) => {
                        if tx
                            .send(Cmd::Input(first, Input::Stdin(buf[..n].to_vec())))
                            .is_err()
                        {
                            return;
                        }
                    }
                }
            }
        });
    }
    for (sig, mut s) in handlers {
        let tx = tx.clone();
        tokio::spawn(async move {
            while s.recv().await.is_some() {
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
        match o.output {
            Some(Output::Stdout(d)) if stdout_open => {
                let label = a.label.then(|| rank.get(&g).copied()).flatten();
                let at_start = line_start.entry((g, true)).or_insert(true);
                if write_out(&mut std::io::stdout(), &d, label, at_start).is_err() {
                    // Like a local process writing to a closed pipe.
                    stdout_open = false;
                    let _ = tx.send(Cmd::Input(g, Input::Signal(libc::SIGPIPE)));
                }
            }
            Some(Output::Stdout(_)) => {}
            Some(Output::Stderr(d)) => {
                let _ = write_out(
                    &mut std::io::stderr(),
                    &d,
                    a.label.then(|| rank.get(&g).copied()).flatten(),
                    line_start.entry((g, false)).or_insert(true),
                );
            }
            Some(Output::Exited(st)) => {
                ends.insert(g, st.into());
                let _ = tx.send(Cmd::Input(g, Input::Release(true)));
            }
            Some(Output::Lost(e)) => {
                crate::fail(&e);
                ends.insert(
                    g,
                    WaitStatus {
                        signal: libc::SIGKILL,
                        ..Default::default()
                    },
                );
            }
            None => {}
        }
    }
    // Let the releases go out before we exit.
    drop(tx);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), writer).await;
    drop(raw);
    if gpids.len() == 1 {
        die_like(&ends[&gpids[0]]);
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
