//! Test harness: real local clusters of real processes (STYLE.md 10, 11).
//!
//! [`Cluster::up`] starts `clan up` in a directory and on ports of its own and [`Drop`] runs
//! `clan down` and checks that nothing is left: no daemon, no cgroup, no state directory,
//! also when the test panicked. Tests that need root say so and skip.

use clan_core::{Gpid, NodeId};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Where cargo put the binaries (target/debug or target/release).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf();
    for b in ["clan", "cland", "clan-shepherd"] {
        assert!(
            dir.join(b).exists(),
            "{} missing: run `cargo build --workspace --bins` first",
            dir.join(b).display()
        );
    }
    dir
}

pub fn bin(name: &str) -> PathBuf {
    bin_dir().join(name)
}

/// True when running as root; otherwise prints why the test is skipped.
pub fn need_root(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    eprintln!("skipped {test}: needs root (pid namespaces and cgroups for local clusters)");
    false
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A base port whose next `n` loopback ports are free now, all below the kernel's range of
/// ephemeral ports (`net.ipv4.ip_local_port_range`): a port in that range can be taken
/// between this look and the nodes' binds as the source port of any outgoing connection
/// (the other tests' clusters make many), or even by a node's dial to that very port
/// before its node listens (a TCP connection to itself): the node then can not listen and
/// the cluster never comes up.
pub fn free_ports(n: u32) -> u16 {
    let ephemeral_low = clan_daemon::localcluster::ephemeral_ports().map_or(32768, |r| r.0);
    const LOW: u32 = 10000;
    // Bases from LOW up to where base + n still stays under the ephemeral ports.
    let span = ephemeral_low.saturating_sub(LOW + n + 1).max(1000);
    let seq = SEQ.fetch_add(1, Ordering::SeqCst);
    let mut off = (std::process::id() * 37 + seq * 211) % span;
    loop {
        let base = (LOW + off) as u16;
        if (1..=n).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i as u16)).is_ok()) {
            return base;
        }
        off = (off + 97) % span;
    }
}

/// The failure detector of [`Cluster::up`]: heartbeats every 200 ms, dead after 2 s.
pub const TEST_DETECTOR: [&str; 4] = ["--heartbeat-ms", "200", "--dead-after-ms", "2000"];

/// A running local cluster.
pub struct Cluster {
    pub dir: PathBuf,
    pub nodes: u32,
    pub base_port: u16,
    cgroup: Option<PathBuf>,
    /// Added to the environment of every `clan` command and cland restart of this cluster.
    env: Vec<(String, String)>,
}

/// Gives SIGINT, SIGQUIT and SIGHUP back their default dispositions in this test process,
/// once, before its first cluster; what it starts inherits them. A test binary started with
/// them ignored (under `nohup`, or as a background job of a non-interactive shell, which
/// ignores SIGINT and SIGQUIT for it) would pass that on to every stub, which keeps an
/// ignored signal ignored as a shell's background job does and forwards nothing of it, and
/// the tests that send these signals to a stub would wait for ever.
pub fn default_dispositions() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        use nix::sys::signal::{signal, SigHandler, Signal};
        for sig in [Signal::SIGINT, Signal::SIGQUIT, Signal::SIGHUP] {
            // SAFETY: the default disposition installs no handler.
            if let Err(e) = unsafe { signal(sig, SigHandler::SigDfl) } {
                panic!("default disposition for {sig}: {e}");
            }
        }
    });
}

impl Cluster {
    /// `clan up --nodes n` with a short failure detector for tests: heartbeats every 200 ms,
    /// dead after 2 s of silence (1 s once declared a debug-built node dead while a CI
    /// machine started a dozen nodes at once).
    pub fn up(n: u32) -> Cluster {
        Cluster::up_with(n, &TEST_DETECTOR)
    }

    /// [`Cluster::up`] for tests that kill a cland and start it again: its peers wait 10 s
    /// before they declare it dead (and fence it), so a debug-built cland restarted on a
    /// busy machine comes back in time, as a real one would within its cluster's window.
    pub fn up_restartable(n: u32) -> Cluster {
        Cluster::up_with(n, &["--heartbeat-ms", "200", "--dead-after-ms", "10000"])
    }

    pub fn up_with(n: u32, extra: &[&str]) -> Cluster {
        Cluster::up_with_env(n, extra, &[])
    }

    /// [`Cluster::up_with`] with `env` added to the environment of this cluster's `clan`
    /// commands (`clan up` among them: its clands and what they start, their /proc views'
    /// servers, inherit it) and of the clands [`Cluster::restart_cland`] starts.
    pub fn up_with_env(n: u32, extra: &[&str], env: &[(&str, &str)]) -> Cluster {
        default_dispositions();
        let seq = SEQ.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("clan-test-{}-{seq}", std::process::id()));
        let mut c = Cluster {
            dir: dir.clone(),
            nodes: n,
            base_port: 0,
            cgroup: None,
            env: env
                .iter()
                .map(|&(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        // A port found free can be taken before `clan up` binds it: then take others.
        let mut out;
        let mut tries = 0;
        loop {
            c.base_port = free_ports(n);
            let (nodes, port) = (n.to_string(), c.base_port.to_string());
            let args = ["up", "--nodes", &nodes, "--base-port", &port]
                .iter()
                .chain(extra)
                .copied()
                .collect::<Vec<_>>();
            out = c.clan(&args);
            tries += 1;
            if out.status.success()
                || tries == 5
                || !String::from_utf8_lossy(&out.stderr).contains("is in use")
            {
                break;
            }
        }
        assert!(
            out.status.success(),
            "clan up failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let name = std::fs::read_to_string(dir.join("cluster.toml"))
            .ok()
            .and_then(|t| {
                t.lines().find_map(|l| {
                    l.strip_prefix("name = \"")
                        .map(|v| v.trim_end_matches('"').to_string())
                })
            });
        c.cgroup = name
            .zip(cgroup2())
            .map(|(name, m)| m.join(format!("clan.{name}")));
        c
    }

    /// A `clan` command with this cluster's directory.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new(bin("clan"));
        c.env("CLAN_DIR", &self.dir)
            .env_remove("CLAN_NODE")
            .env("PATH", path_with_bins())
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }

    /// Runs `clan ARGS` to completion with stdin closed.
    /// Fails the test if clan takes more than two minutes, so a hang can not eat CI's time.
    pub fn clan(&self, args: &[&str]) -> Output {
        let child = self
            .cmd()
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run clan");
        output_within_two_minutes(child, args)
    }

    /// Runs `clan ARGS`, asserts success and returns stdout.
    pub fn clan_ok(&self, args: &[&str]) -> String {
        let out = self.clan(args);
        assert!(
            out.status.success(),
            "clan {args:?} failed ({:?}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Starts a detached command on `node` and returns its gpid.
    pub fn spawn(&self, node: u32, argv: &[&str]) -> Gpid {
        let mut args = vec!["run", "-d", "--node"];
        let n = node.to_string();
        args.push(&n);
        args.push("--");
        args.extend_from_slice(argv);
        self.clan_ok(&args).trim().parse().expect("gpid")
    }

    /// A client for `node`'s cland.
    pub fn client(&self, node: u32) -> clan_client::Client {
        let n = NodeId::new(node).expect("node");
        clan_client::Client::at(clan_client::socket_path(&self.dir, n), n)
    }

    pub fn node_dir(&self, node: u32) -> PathBuf {
        self.dir.join(format!("node{node}"))
    }

    /// What node `node`'s cland has logged so far.
    pub fn log(&self, node: u32) -> String {
        std::fs::read_to_string(self.node_dir(node).join("cland.log")).unwrap_or_default()
    }

    pub fn cland_pid(&self, node: u32) -> i32 {
        std::fs::read_to_string(self.node_dir(node).join("cland.pid"))
            .expect("pid file")
            .trim()
            .parse()
            .expect("pid")
    }

    /// `clan ps -o json` as parsed values.
    pub fn ps(&self, extra: &[&str]) -> Vec<serde_json::Value> {
        let mut args = vec!["ps", "-o", "json"];
        args.extend_from_slice(extra);
        let out = self.clan(&args);
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .unwrap_or_else(|e| panic!("ps output: {e}: {}", String::from_utf8_lossy(&out.stdout)))
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The process `gpid` as `clan ps` shows it, if listed.
    pub fn ps_one(&self, gpid: Gpid) -> Option<serde_json::Value> {
        self.ps(&["--node", &gpid.node().to_string()])
            .into_iter()
            .find(|p| p["gpid"].as_u64() == Some(gpid.raw()))
    }

    /// A power cut on `node` (`clan node crash`): its daemon, shepherds and processes
    /// killed at once.
    pub fn power_cut(&self, node: u32) {
        self.clan_ok(&["node", "crash", &node.to_string()]);
    }

    /// `clan node start`: the node comes back and every running node sees it up.
    pub fn node_start(&self, node: u32) {
        self.clan_ok(&["node", "start", &node.to_string()]);
    }

    /// Kills node `n`'s cland with SIGKILL (its processes live on under their shepherds)
    /// and waits until it is gone.
    pub fn kill_cland(&self, n: u32) {
        let pid = self.cland_pid(n);
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("kill cland");
        eventually("cland gone", Duration::from_secs(5), || {
            matches!(proc_state(pid as u32), None | Some('Z')).then_some(())
        });
    }

    /// Starts node `n`'s cland by hand (after it was killed, its processes still running
    /// under their shepherds), logging to its log as `clan up` does.
    pub fn restart_cland(&self, n: u32) -> std::process::Child {
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(self.node_dir(n).join("cland.log"))
            .expect("cland.log");
        Command::new(bin("cland"))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .args([
                "--config",
                self.dir.join("cluster.toml").to_str().expect("utf-8 path"),
                "--node",
                &n.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start cland")
    }

    /// The cluster's cgroup directory, when there is one.
    pub fn cgroup(&self) -> Option<&Path> {
        self.cgroup.as_deref()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // What the daemons said last, for whoever reads the failure.
            for n in 1..=self.nodes {
                let log = self.log(n);
                let tail: Vec<&str> = log.lines().rev().take(12).collect();
                eprintln!("--- node {n} cland.log (last lines)");
                for l in tail.into_iter().rev() {
                    eprintln!("{l}");
                }
            }
        }
        let out = self.clan(&["down"]);
        let down_ok = out.status.success();
        // Whatever happened, leave nothing behind.
        if let Some(cg) = &self.cgroup {
            if cg.exists() {
                let _ = std::fs::write(cg.join("cgroup.kill"), "1");
                let deadline = Instant::now() + Duration::from_secs(5);
                while cg.exists() && Instant::now() < deadline {
                    let _ = remove_cgroup(cg);
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        if !down_ok && !std::thread::panicking() {
            panic!("clan down failed: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
}

/// The output of `clan ARGS` (`child`), failing the test if it takes more than two minutes
/// (killed then), so a hang can not eat CI's time.
pub fn output_within_two_minutes(child: std::process::Child, args: &[&str]) -> Output {
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(out) => out.expect("wait for clan"),
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("clan {args:?} hung for two minutes");
        }
    }
}

fn remove_cgroup(dir: &Path) -> std::io::Result<()> {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type()?.is_dir() {
                remove_cgroup(&e.path())?;
            }
        }
    }
    std::fs::remove_dir(dir)
}

/// The cgroup v2 mount point (found as cland finds it).
pub fn cgroup2() -> Option<PathBuf> {
    clan_daemon::cgroup::cgroup2_mount()
}

/// PATH with the built binaries first, so `clan` inside cluster processes is ours.
pub fn path_with_bins() -> String {
    format!(
        "{}:{}",
        bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Polls `f` until it returns `Some`, for conditions that have no event to wait on from
/// outside (a node's state as another node sees it). Panics after `limit`, or after 30 s
/// if that is longer: a limit only says when waiting has become a failure, and a debug
/// build on a busy two-core CI machine takes its time (how fast things are is for
/// `bench/`, not for tests).
pub fn eventually<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit.max(Duration::from_secs(30));
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Host processes whose command line mentions `needle` (to prove nothing is left).
pub fn host_processes_mentioning(needle: &str) -> Vec<String> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().parse::<u32>().is_err() {
            continue;
        }
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            if c.contains(needle) {
                v.push(format!("{}: {c}", e.file_name().to_string_lossy()));
            }
        }
    }
    v
}

/// The pids of the host processes whose command line mentions `needle`.
pub fn host_pids_mentioning(needle: &str) -> Vec<i32> {
    host_processes_mentioning(needle)
        .iter()
        .filter_map(|l| l.split_once(':')?.0.parse().ok())
        .collect()
}

/// Exit code or terminating signal of an Output.
pub fn ended(o: &Output) -> (Option<i32>, Option<i32>) {
    use std::os::unix::process::ExitStatusExt;
    (o.status.code(), o.status.signal())
}

/// A local user for permission tests, created if missing.
pub fn test_user(name: &str) -> u32 {
    // One useradd at a time: tests of one binary run in parallel, and useradd's locks on
    // the user and group files refuse a second one.
    static USERADD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = USERADD.lock().unwrap_or_else(|e| e.into_inner());
    if nix::unistd::User::from_name(name).ok().flatten().is_none() {
        let st = Command::new("useradd")
            .args(["--no-create-home", "--shell", "/bin/sh", name])
            .status()
            .expect("useradd");
        assert!(
            st.success() || nix::unistd::User::from_name(name).ok().flatten().is_some(),
            "useradd {name}"
        );
    }
    nix::unistd::User::from_name(name)
        .unwrap()
        .unwrap()
        .uid
        .as_raw()
}

/// An interactive bash in a terminal of its own (a tmux server private to the test, removed
/// with everything it runs when dropped), driven with keys and read from the screen.
pub struct Terminal {
    socket: String,
}

impl Terminal {
    /// `bash --norc -i` with `env` set, prompt "$ ".
    pub fn bash(env: &[(&str, &str)]) -> Terminal {
        let socket = format!("clan-test-{}-{}", std::process::id(), next_id());
        let mut cmd = vec!["env".to_string()];
        cmd.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        cmd.extend(["PS1=$ ".into(), "bash".into(), "--norc".into(), "-i".into()]);
        let st = Command::new("tmux")
            .args(["-L", &socket, "new-session", "-d", "-x", "120", "-y", "40"])
            .args(&cmd)
            .status()
            .expect("tmux (scripts/install-deps.sh installs it)");
        assert!(st.success(), "tmux new-session");
        let t = Terminal { socket };
        t.wait_for("the prompt", |s| s.lines().any(|l| l.trim_end() == "$"));
        t
    }

    /// Types `keys` (tmux key names such as C-z, Enter, or literal text).
    pub fn keys(&self, keys: &[&str]) {
        let st = Command::new("tmux")
            .args(["-L", &self.socket, "send-keys", "-t", "0"])
            .args(keys)
            .status()
            .expect("tmux send-keys");
        assert!(st.success());
    }

    /// A line of input followed by Enter.
    pub fn line(&self, text: &str) {
        self.keys(&["-l", text]);
        self.keys(&["Enter"]);
    }

    /// The pid of the shell (the pane's first process).
    pub fn pane_pid(&self) -> i32 {
        let o = Command::new("tmux")
            .args([
                "-L",
                &self.socket,
                "display-message",
                "-p",
                "-t",
                "0",
                "#{pane_pid}",
            ])
            .output()
            .expect("tmux display-message");
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse()
            .expect("pane pid")
    }

    pub fn screen(&self) -> String {
        let o = Command::new("tmux")
            .args([
                "-L",
                &self.socket,
                "capture-pane",
                "-p",
                "-t",
                "0",
                "-S",
                "-200",
            ])
            .output()
            .expect("tmux capture-pane");
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Waits until the screen satisfies `f` (at most 20 s), returning it.
    pub fn wait_for(&self, what: &str, f: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let s = self.screen();
            if f(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; screen:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Clears the screen and its history, so that later waits see only new output.
    pub fn clear(&self) {
        self.line("clear");
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "clear-history", "-t", "0"])
            .status();
        self.wait_for("a cleared screen", |s| s.trim() == "$");
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .status();
    }
}

fn next_id() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Network namespaces for partition tests: node N runs in `<prefix>N` with address
/// `10.201.<k>.N/24` on a veth pair whose other end, `vN`, is a port of a bridge in the
/// switch namespace `<prefix>sw`. Nothing touches the host's own network. [`Drop`] deletes
/// the namespaces (and with them the links); stop the cluster first.
pub struct Net {
    pub prefix: String,
    pub ip_base: String,
    nodes: u32,
}

fn ip(args: &[&str]) {
    let o = Command::new("ip").args(args).output().expect("ip(8)");
    assert!(
        o.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&o.stderr)
    );
}

impl Net {
    pub fn new(nodes: u32) -> Net {
        let seq = SEQ.fetch_add(1, Ordering::SeqCst);
        let prefix = format!("clt{}x{seq}n", std::process::id() % 100_000);
        let k = (std::process::id() + seq) % 250;
        let net = Net {
            prefix: prefix.clone(),
            ip_base: format!("10.201.{k}.0"),
            nodes,
        };
        let sw = format!("{prefix}sw");
        ip(&["netns", "add", &sw]);
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &sw, "link", "set", "br0", "up"]);
        for n in 1..=nodes {
            let ns = format!("{prefix}{n}");
            let v = format!("v{n}");
            ip(&["netns", "add", &ns]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            ip(&[
                "-n", &ns, "link", "add", "eth0", "type", "veth", "peer", "name", &v, "netns", &sw,
            ]);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("10.201.{k}.{n}/24"),
                "dev",
                "eth0",
            ]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
            ip(&["-n", &sw, "link", "set", &v, "master", "br0"]);
            ip(&["-n", &sw, "link", "set", &v, "up"]);
        }
        net
    }

    /// `clan up --nodes n` with each node in its namespace, and `extra` options.
    pub fn cluster(&self, n: u32, extra: &[&str]) -> Cluster {
        let mut args = vec!["--netns", &self.prefix, "--ip-base", &self.ip_base];
        args.extend_from_slice(extra);
        Cluster::up_with(n, &args)
    }

    /// Cuts node `n` off: its switch port goes down (the veth loses carrier).
    pub fn cut(&self, n: u32) {
        ip(&[
            "-n",
            &format!("{}sw", self.prefix),
            "link",
            "set",
            &format!("v{n}"),
            "down",
        ]);
    }

    /// Joins node `n` again.
    pub fn mend(&self, n: u32) {
        ip(&[
            "-n",
            &format!("{}sw", self.prefix),
            "link",
            "set",
            &format!("v{n}"),
            "up",
        ]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in (1..=self.nodes)
            .map(|n| format!("{}{n}", self.prefix))
            .chain([format!("{}sw", self.prefix)])
        {
            let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        }
    }
}

/// A child process killed (SIGKILL, then reaped) when dropped, so that a test that fails
/// leaves no process behind (a stopped stub among them: SIGKILL ends stopped processes).
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Program `name` of this build run as `uid` (with gid `uid`, no supplementary groups,
/// from /tmp, no stdin), as `setpriv` runs it.
pub fn as_uid(uid: u32, name: &str) -> Command {
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .arg(bin(name))
        .current_dir("/tmp")
        .stdin(Stdio::null());
    c
}

/// The state letter of host process `pid` (R, S, T, Z, ...), `None` once it is gone.
pub fn proc_state(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(')')?.1.trim_start().chars().next()
}

/// The job id a `clan run -d` printed on stderr ("job J on node(s) ...").
pub fn job_of(o: &Output) -> String {
    let e = String::from_utf8_lossy(&o.stderr);
    e.split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("no job in {e:?}"))
        .to_string()
}
