//! Native baselines, measured in the same run as clan: local fork/exec, local kill
//! ping-pong, TCP loopback round trip, `ps -e`, fork/exit/wait, signals to 100 processes.

use crate::stats::Samples;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// fork/exec/wait of `sh -c true`.
pub fn spawn_sh_true(n: usize) -> Samples {
    let mut s = Samples::default();
    spawn_sh_true_into(n, &mut s);
    s
}

/// [`spawn_sh_true`] adding to `s`.
pub fn spawn_sh_true_into(n: usize, s: &mut Samples) {
    for _ in 0..n {
        let t = Instant::now();
        let st = Command::new("sh")
            .args(["-c", "true"])
            .stdin(std::process::Stdio::null())
            .status()
            .expect("sh");
        s.push(t.elapsed());
        assert!(st.success());
    }
}

/// spawn+wait of `true` with std's Command (fork/exec/exit/wait; std spawns with
/// posix_spawn, a vfork-like clone, when it can).
pub fn spawn_true(n: usize) -> Samples {
    let mut s = Samples::default();
    for _ in 0..n {
        let t = Instant::now();
        let st = Command::new("true").status().expect("true");
        s.push(t.elapsed());
        assert!(st.success());
    }
    s
}

/// A bare fork(2) whose child calls _exit(0) at once, then waitpid(2): no exec.
pub fn fork_exit_wait(n: usize) -> Samples {
    let mut s = Samples::default();
    for _ in 0..n {
        let t = Instant::now();
        // SAFETY: the child calls only _exit, which is async-signal-safe, so forking a
        // multi-threaded process is fine.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: as above.
            unsafe { libc::_exit(0) };
        }
        assert!(pid > 0, "fork failed");
        let mut status = 0;
        // SAFETY: status is a live local.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        s.push(t.elapsed());
        assert!(r == pid && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }
    s
}

/// `k` local `sleep 3600` in a process group of their own (the first one's pid); killed
/// and reaped on drop.
pub struct LocalGroup {
    children: Vec<std::process::Child>,
    pub pgid: i32,
}

impl LocalGroup {
    pub fn start(k: usize) -> LocalGroup {
        use std::os::unix::process::CommandExt;
        let mut g = LocalGroup {
            children: Vec::new(),
            pgid: 0,
        };
        for _ in 0..k {
            let child = Command::new("sleep")
                .arg("3600")
                .process_group(g.pgid)
                .spawn()
                .expect("sleep");
            if g.pgid == 0 {
                g.pgid = child.id() as i32;
            }
            g.children.push(child);
        }
        g
    }

    /// One kill(2) of `sig` to each member, timed together.
    pub fn kill_each(&self, n: usize, sig: i32) -> Samples {
        let pids: Vec<i32> = self.children.iter().map(|c| c.id() as i32).collect();
        let mut s = Samples::default();
        for _ in 0..n {
            let t = Instant::now();
            for &p in &pids {
                // SAFETY: kill has no memory-safety preconditions.
                assert_eq!(unsafe { libc::kill(p, sig) }, 0, "kill {p}");
            }
            s.push(t.elapsed());
        }
        s
    }

    /// One killpg(2) of `sig` to the whole group.
    pub fn killpg(&self, n: usize, sig: i32) -> Samples {
        let mut s = Samples::default();
        for _ in 0..n {
            let t = Instant::now();
            // SAFETY: as above.
            let r = unsafe { libc::killpg(self.pgid, sig) };
            s.push(t.elapsed());
            assert_eq!(r, 0, "killpg {}", self.pgid);
        }
        s
    }
}

impl Drop for LocalGroup {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Blocks SIGUSR1 and SIGUSR2 in the calling thread (and the threads it creates later), so
/// they can be taken with sigwaitinfo. Call first thing in main.
pub fn block_usr_signals() {
    let mut set = nix::sys::signal::SigSet::empty();
    set.add(nix::sys::signal::Signal::SIGUSR1);
    set.add(nix::sys::signal::Signal::SIGUSR2);
    let _ = set.thread_block();
}

/// Waits for SIGUSR1 (blocked); returns the sender's pid, or None after `timeout`.
pub fn wait_usr1(timeout: Duration) -> Option<i32> {
    wait_signals(&[libc::SIGUSR1], timeout).map(|(_, pid)| pid)
}

/// Waits for one of `sigs` (blocked); returns it and the sender's pid, or None after
/// `timeout`.
pub fn wait_signals(sigs: &[i32], timeout: Duration) -> Option<(i32, i32)> {
    let mut set: libc::sigset_t = unsafe_zeroed();
    // SAFETY: set is a valid sigset_t we own.
    unsafe {
        libc::sigemptyset(&mut set);
        for &s in sigs {
            libc::sigaddset(&mut set, s);
        }
    }
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    let mut info: libc::siginfo_t = unsafe_zeroed();
    // SAFETY: all pointers are to live locals of the right types.
    let r = unsafe { libc::sigtimedwait(&set, &mut info, &ts) };
    // SAFETY: sigtimedwait filled info for a real signal (r > 0).
    (r > 0).then(|| (r, unsafe { info.si_pid() }))
}

fn unsafe_zeroed<T>() -> T {
    // SAFETY: only used for plain C structs (sigset_t, siginfo_t) for which all-zero is valid.
    unsafe { std::mem::zeroed() }
}

/// The child of [`kill_pingpong`]: answers each SIGUSR1 with one to its sender.
pub fn native_pong() {
    println!("ready");
    let _ = std::io::stdout().flush();
    while let Some(from) = wait_usr1(Duration::from_secs(10)) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(from, libc::SIGUSR1) };
    }
}

/// Two local processes bouncing SIGUSR1 with kill(2): one-way latency (half a round trip),
/// Solaris MC Table 4's "Signals".
pub fn kill_pingpong(n: usize) -> Samples {
    let exe = std::env::current_exe().expect("self");
    let mut child = Command::new(exe)
        .arg("native-pong")
        .stdout(Stdio::piped())
        .spawn()
        .expect("pong");
    let mut l = String::new();
    BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut l)
        .expect("ready");
    let pid = child.id() as i32;
    let mut s = Samples::default();
    for i in 0..n + 20 {
        let t = Instant::now();
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGUSR1) };
        wait_usr1(Duration::from_secs(5)).expect("pong answered");
        if i >= 20 {
            s.push(t.elapsed() / 2);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    s
}

/// Round trip of 64 bytes over a loopback TCP connection with TCP_NODELAY.
pub fn tcp_rtt(n: usize) -> Samples {
    let mut p = TcpPair::new();
    let mut s = Samples::default();
    p.sample(n, &mut s);
    s
}

/// A TCP loopback connection to an echo thread, kept for round trips measured in blocks
/// between those of the figure compared with it, so that both see the same moments of a
/// shared machine.
pub struct TcpPair {
    conn: Option<TcpStream>,
    server: Option<std::thread::JoinHandle<()>>,
    /// The echo's thread id, or its process id when it is a process of its own.
    echo: Echo,
}

/// Where a [`TcpPair`]'s echo runs.
#[derive(Clone, Copy)]
pub enum Echo {
    Thread(i32),
    Process(i32),
}

/// The name of the thread-to-thread round trip in reports.
pub const TCP_RTT: &str = "TCP loopback round trip (64 B)";

/// The name of the round trip whose echo is another process (the signal and /proc figures
/// show it next to [`TCP_RTT`]: clan's hops go from process to process).
pub const TCP_PROCS: &str = "TCP loopback round trip, echo in another process (64 B)";

/// Sends back every 64 bytes read on `c` until it closes.
fn echo(mut c: TcpStream) {
    c.set_nodelay(true).expect("nodelay");
    let mut buf = [0u8; 64];
    while c.read_exact(&mut buf).is_ok() {
        if c.write_all(&buf).is_err() {
            break;
        }
    }
}

impl TcpPair {
    /// The echo in a process of its own (`clan-bench tcp-echo`), as clan's daemons and
    /// processes are: each round trip switches address spaces, as clan's hops do.
    /// Connected and warmed up (100 round trips).
    pub fn with_process() -> TcpPair {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let exe = std::env::current_exe().expect("self");
        let mut child = std::process::Command::new(exe)
            .args(["tcp-echo", "--port", &port.to_string()])
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("tcp-echo");
        let (c, _) = l.accept().expect("accept");
        let pid = i32::try_from(child.id()).expect("a pid");
        // The child ends when the connection closes (dropped with the pair).
        TcpPair::warmed(
            c,
            std::thread::spawn(move || {
                let _ = child.wait();
            }),
            Echo::Process(pid),
        )
    }

    /// Connected and warmed up (100 round trips).
    pub fn new() -> TcpPair {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let (tx, rx) = std::sync::mpsc::channel();
        let server = std::thread::spawn(move || {
            let _ = tx.send(nix::unistd::gettid().as_raw());
            echo(l.accept().expect("accept").0)
        });
        let tid = rx.recv().expect("the echo thread's id");
        TcpPair::warmed(
            TcpStream::connect(addr).expect("connect"),
            server,
            Echo::Thread(tid),
        )
    }

    /// The echo's thread or process.
    pub fn echo(&self) -> Echo {
        self.echo
    }

    /// `c`, its echo served until it closes by `server`, after 100 round trips.
    fn warmed(c: TcpStream, server: std::thread::JoinHandle<()>, echo: Echo) -> TcpPair {
        c.set_nodelay(true).expect("nodelay");
        let mut p = TcpPair {
            conn: Some(c),
            server: Some(server),
            echo,
        };
        p.sample(100, &mut Samples::default());
        p
    }

    /// `n` round trips of 64 bytes, added to `s`.
    pub fn sample(&mut self, n: usize, s: &mut Samples) {
        let c = self.conn.as_mut().expect("connected");
        let mut buf = [7u8; 64];
        for _ in 0..n {
            let t = Instant::now();
            c.write_all(&buf).expect("write");
            c.read_exact(&mut buf).expect("read");
            s.push(t.elapsed());
        }
    }
}

impl Drop for TcpPair {
    fn drop(&mut self) {
        drop(self.conn.take());
        if let Some(s) = self.server.take() {
            let _ = s.join();
        }
    }
}

/// The `tcp-echo` role: connects to 127.0.0.1:`port` and sends back every 64 bytes it
/// reads, until the connection closes.
pub fn tcp_echo(port: u16) {
    if let Ok(c) = TcpStream::connect(("127.0.0.1", port)) {
        echo(c);
    }
}

/// `ps -e` with its output discarded.
pub fn ps_e(n: usize) -> Samples {
    let mut s = Samples::default();
    for _ in 0..n {
        let t = Instant::now();
        let st = Command::new("ps")
            .arg("-e")
            .stdout(Stdio::null())
            .status()
            .expect("ps");
        s.push(t.elapsed());
        assert!(st.success());
    }
    s
}

/// Whether a local Slurm runs jobs (`srun -N1 true`), or why not.
pub fn slurm_ready() -> Result<(), String> {
    let ok = Command::new("srun")
        .args(["-N1", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match ok {
        Ok(st) if st.success() => Ok(()),
        Ok(_) => Err("srun failed: start Slurm with bench/slurm/start.sh".into()),
        Err(_) => Err("srun not installed (scripts/install-deps.sh --bench)".into()),
    }
}

/// One `srun -N1 true`, timed.
pub fn srun_once() -> Result<Duration, String> {
    let t = Instant::now();
    let st = Command::new("srun")
        .args(["-N1", "true"])
        .stdin(std::process::Stdio::null())
        .status()
        .map_err(|e| e.to_string())?;
    let d = t.elapsed();
    if st.success() {
        Ok(d)
    } else {
        Err("srun failed".into())
    }
}
