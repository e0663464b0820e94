//! A local cluster for a benchmark, from a given build's binaries; `clan down` on drop,
//! and on SIGINT, SIGTERM or SIGHUP ([`stop_on_signals`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// The clusters up now (directory and binaries), for [`stop_on_signals`].
static UP: Mutex<Vec<(PathBuf, PathBuf)>> = Mutex::new(Vec::new());

/// Takes SIGINT, SIGTERM and SIGHUP on a thread of their own (they are blocked in every
/// thread, so call this before any other thread exists): the clusters up are taken down,
/// their cluster /proc mounts unmounted first, and the process exits as killed by the
/// signal would (128 + its number), leaving no daemon, cgroup or mount behind.
pub fn stop_on_signals() {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(s);
    }
    if set.thread_block().is_err() {
        return;
    }
    std::thread::spawn(move || {
        let Ok(sig) = set.wait() else { return };
        eprintln!("clan-bench: {sig}: taking the benchmark clusters down");
        let up = UP.lock().map(|u| u.clone()).unwrap_or_default();
        for (dir, bin) in up {
            let clan = bin.join("clan");
            if let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") {
                for m in mounts.lines().filter_map(|l| l.split_whitespace().nth(1)) {
                    if Path::new(m).starts_with(&dir) {
                        let _ = Command::new(&clan).args(["proc", "umount", m]).status();
                    }
                }
            }
            let _ = Command::new(&clan)
                .env("CLAN_DIR", &dir)
                .arg("down")
                .stdout(Stdio::null())
                .status();
            // The benchmark's own files too, as the cluster's drop does.
            let _ = std::fs::remove_dir_all(&dir);
        }
        std::process::exit(128 + sig as i32);
    });
}

pub struct Cluster {
    pub dir: PathBuf,
    pub bin: PathBuf,
    pub nodes: u32,
}

impl Cluster {
    pub fn up(bin: &Path, name: &str, nodes: u32, base_port: u16) -> anyhow::Result<Cluster> {
        Cluster::up_with(bin, name, nodes, base_port, &[])
    }

    /// [`Cluster::up`] with more `clan up` options.
    pub fn up_with(
        bin: &Path,
        name: &str,
        nodes: u32,
        base_port: u16,
        extra: &[&str],
    ) -> anyhow::Result<Cluster> {
        let dir = std::env::temp_dir().join(format!("clan-bench-{name}-{}", std::process::id()));
        let c = Cluster {
            dir,
            bin: bin.to_path_buf(),
            nodes,
        };
        let out = c
            .cmd()
            .args([
                "up",
                "--nodes",
                &nodes.to_string(),
                "--base-port",
                &base_port.to_string(),
            ])
            .args(extra)
            .output()?;
        if !out.status.success() {
            anyhow::bail!("clan up: {}", String::from_utf8_lossy(&out.stderr));
        }
        if let Ok(mut up) = UP.lock() {
            up.push((c.dir.clone(), c.bin.clone()));
        }
        Ok(c)
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new(self.bin.join("clan"));
        c.env("CLAN_DIR", &self.dir)
            .env_remove("CLAN_NODE")
            .stdin(Stdio::null());
        c
    }

    /// The host pid of a process of a local cluster's node (from its node-local number).
    pub fn host_pid(&self, gpid: clan_core::Gpid) -> Option<u32> {
        let init: u32 =
            std::fs::read_to_string(self.dir.join(format!("node{}/init.pid", gpid.node())))
                .ok()?
                .trim()
                .parse()
                .ok()?;
        let ns = std::fs::read_link(format!("/proc/{init}/ns/pid")).ok()?;
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            if std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()? != ns {
                return None;
            }
            (clan_core::sys::ns_pid_of_host(pid)? == gpid.local()).then_some(pid)
        })
    }

    /// The host pid of node `node`'s cland.
    pub fn cland_pid(&self, node: u32) -> Option<i32> {
        std::fs::read_to_string(self.dir.join(format!("node{node}/cland.pid")))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    pub fn client(&self, node: u32) -> clan_client::Client {
        let n = clan_core::NodeId::new(node).expect("node");
        clan_client::Client::at(clan_client::socket_path(&self.dir, n), n)
    }

    /// SIGKILL to a process (or, with `group`, every member of its group, on every node),
    /// then `clan wait` for it: what a measurement leaves behind is gone before the next.
    pub fn kill_and_wait(&self, gpid: clan_core::Gpid, group: bool) {
        let g = gpid.to_string();
        let mut kill = self.cmd();
        kill.args(["kill", "-s", "KILL"]);
        if group {
            kill.arg("-g");
        }
        let _ = kill.arg(&g).stderr(Stdio::null()).status();
        let _ = self
            .cmd()
            .args(["wait", &g])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }

    /// On every node, a shell that starts `per_node` `sleep SECS` and waits for them: the
    /// shells' gpids (each leads the group of its sleeps), once every sleep runs (panics
    /// after 3 minutes without).
    pub fn sleepers(&self, per_node: usize, secs: u32) -> Vec<clan_core::Gpid> {
        let script =
            format!("i=0; while [ $i -lt {per_node} ]; do sleep {secs} & i=$((i+1)); done; wait");
        let shells = (1..=self.nodes)
            .map(|node| self.spawn(node, &["sh", "-c", &script]).expect("sleepers"))
            .collect();
        let want = self.nodes as usize * per_node;
        let cmdline = format!("sleep\0{secs}\0");
        let count = || {
            std::fs::read_dir("/proc")
                .map(|d| {
                    d.flatten()
                        .filter(|e| {
                            std::fs::read(e.path().join("cmdline"))
                                .is_ok_and(|b| b == cmdline.as_bytes())
                        })
                        .count()
                })
                .unwrap_or(0)
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
        while count() < want {
            assert!(
                std::time::Instant::now() < deadline,
                "sleepers did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        shells
    }

    /// `clan run -d --node N -- ARGV`: the gpid.
    pub fn spawn(&self, node: u32, argv: &[&str]) -> anyhow::Result<clan_core::Gpid> {
        let out = self
            .cmd()
            .args(["run", "-d", "--node", &node.to_string(), "--"])
            .args(argv)
            .stderr(Stdio::null())
            .output()?;
        if !out.status.success() {
            anyhow::bail!("clan run -d failed");
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.cmd().arg("down").stdout(Stdio::null()).status();
        // `clan down` removes only what the cluster made; the benchmark's own files (its
        // ping-pong outputs, the /proc mount point) are in the directory too.
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Ok(mut up) = UP.lock() {
            up.retain(|(d, _)| d != &self.dir);
        }
    }
}

/// CPU time of every thread of a process so far (schedstat: nanoseconds on a CPU).
pub fn cpu_time(pid: i32) -> std::time::Duration {
    let ns: u64 = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    std::fs::read_to_string(e.path().join("schedstat"))
                        .ok()?
                        .split_whitespace()
                        .next()?
                        .parse::<u64>()
                        .ok()
                })
                .sum()
        })
        .unwrap_or(0);
    std::time::Duration::from_nanos(ns)
}
