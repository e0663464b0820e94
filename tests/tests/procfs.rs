//! The cluster /proc (issue 5): `clan proc mount` on real local clusters of three nodes,
//! read by the test itself, by the Rust `procfs` crate, by unmodified procps and psmisc,
//! and by other users; failures (a process that exits, a power cut, cland restarting,
//! the server killed).

use clan_core::Gpid;
use clan_tests::{
    bin, eventually, host_pids_mentioning, host_processes_mentioning, need_root, proc_state,
    test_user, Cluster,
};
use std::io::ErrorKind;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

macro_rules! root_or_skip {
    ($name:expr) => {
        if !need_root($name) {
            return;
        }
    };
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A cluster /proc mounted with `clan proc mount`; unmounted (and its directory removed)
/// when dropped, also when the test panicked.
struct Mounted {
    dir: PathBuf,
    server: i32,
}

impl Mounted {
    fn new(c: &Cluster) -> Mounted {
        let dir = std::env::temp_dir().join(format!(
            "clan-procfs-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).expect("mount point");
        Mounted::at(c, dir)
    }

    /// `clan proc mount DIR`.
    fn at(c: &Cluster, dir: PathBuf) -> Mounted {
        let out = c.clan_ok(&["proc", "mount", dir.to_str().expect("utf-8")]);
        let server = out
            .rsplit("clan-procfs pid ")
            .next()
            .and_then(|s| s.trim().trim_end_matches(')').parse().ok())
            .unwrap_or_else(|| panic!("no server pid in {out:?}"));
        Mounted { dir, server }
    }

    /// The server's watcher: the other process whose command line names the directory.
    fn watcher(&self) -> i32 {
        let dir = self.dir.to_string_lossy();
        host_pids_mentioning(&dir)
            .into_iter()
            .find(|&p| p != self.server)
            .unwrap_or_else(|| panic!("no watcher: {:?}", host_processes_mentioning(&dir)))
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel))
            .unwrap_or_else(|e| panic!("read {rel} of the view: {e}"))
    }
}

/// Whether something is mounted at `dir` in this mount namespace.
fn mounted(dir: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = dir.to_string_lossy();
    info.lines()
        .any(|l| l.split(' ').nth(4).is_some_and(|p| p == want))
}

fn alive(pid: i32) -> bool {
    clan_daemon::pid_alive(pid)
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new(bin("clan"))
            .args(["proc", "umount"])
            .arg(&self.dir)
            .stdin(Stdio::null())
            .output();
        if mounted(&self.dir) {
            let _ = nix::mount::umount2(&self.dir, nix::mount::MntFlags::MNT_DETACH);
        }
        // The server ends when no mount of the view is left. A mount namespace made while
        // it was mounted (a node of another test's cluster starting) keeps a copy: then
        // stop it, the copy dies with its namespace.
        let deadline = Instant::now() + Duration::from_secs(2);
        while alive(self.server) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if alive(self.server) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.server),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = std::fs::remove_dir(&self.dir);
        if !std::thread::panicking() {
            assert!(!mounted(&self.dir), "{} still mounted", self.dir.display());
        }
    }
}

/// Kills `g` and waits for it (a zombie is still listed), then until its `status` in the
/// view gives ENOENT.
fn kill_until_gone_from(c: &Cluster, m: &Mounted, g: Gpid) {
    c.clan_ok(&["kill", "-s", "KILL", &g.to_string()]);
    c.clan(&["wait", &g.to_string()]);
    eventually(
        "the process to leave the view",
        Duration::from_secs(10),
        || {
            let e = std::fs::read_to_string(m.path(&format!("{g}/status"))).err()?;
            (e.kind() == ErrorKind::NotFound).then_some(())
        },
    );
}

/// The fields of a `stat` line after the command: (pid, comm, fields from state on).
fn parse_stat(s: &str) -> (u64, String, Vec<String>) {
    let open = s.find('(').expect("stat has (comm)");
    let close = s.rfind(')').expect("stat has (comm)");
    let pid = s[..open].trim().parse().expect("stat pid");
    let rest = s[close + 1..]
        .split_whitespace()
        .map(str::to_string)
        .collect();
    (pid, s[open + 1..close].to_string(), rest)
}

fn status_field(s: &str, key: &str) -> Option<String> {
    s.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(|v| v.trim().to_string())
}

/// `sh -c SCRIPT` in a private mount namespace whose /proc is the view.
fn with_view_as_proc(m: &Mounted, script: &str) -> Output {
    Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount --bind {} /proc && {script}",
            m.dir.to_str().expect("utf-8")
        ))
        .stdin(Stdio::null())
        .output()
        .expect("unshare")
}

/// Runs `argv` as `uid` (its primary group, no other groups).
fn as_user(uid: u32, argv: &[&str]) -> Output {
    let gid = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map_or(uid, |u| u.gid.as_raw());
    Command::new("setpriv")
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={gid}"),
            "--clear-groups",
        ])
        .args(argv)
        .current_dir("/tmp")
        .stdin(Stdio::null())
        .output()
        .expect("setpriv")
}

/// Three nodes with a sleep on each, and on node 2 a sleep whose parent is the `clan run`
/// of a shell on node 1: returns (the sleeps, the child on node 2, its parent).
fn populated() -> (Cluster, Vec<Gpid>, u64, u64) {
    let c = Cluster::up(3);
    let sleeps: Vec<Gpid> = (1..=3).map(|n| c.spawn(n, &["sleep", "600"])).collect();
    c.spawn(1, &["sh", "-c", "clan run --node 2 -- sleep 601"]);
    let (child, parent) = eventually(
        "the remote child of node 1",
        Duration::from_secs(20),
        || {
            let ps = c.ps(&[]);
            let child = ps.iter().find(|p| p["cmd"] == "sleep 601")?["gpid"].as_u64()?;
            let parent = ps.iter().find(|p| {
                p["cmd"]
                    .as_str()
                    .is_some_and(|c| c.starts_with("clan run --node 2"))
            })?["gpid"]
                .as_u64()?;
            Some((child, parent))
        },
    );
    (c, sleeps, child, parent)
}

#[test]
fn every_process_is_a_directory_with_gpids_in_status_and_stat() {
    root_or_skip!("every_process_is_a_directory_with_gpids_in_status_and_stat");
    let (c, sleeps, child, parent) = populated();
    let m = Mounted::new(&c);
    let listed: Vec<u64> = std::fs::read_dir(&m.dir)
        .expect("list the view")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    let ps = c.ps(&[]);
    assert!(ps.len() >= 8, "ps: {ps:?}");
    for p in &ps {
        let g = p["gpid"].as_u64().expect("gpid");
        assert!(listed.contains(&g), "{g} not listed in {listed:?}");
        assert!(
            std::fs::metadata(m.path(&g.to_string())).is_ok_and(|md| md.is_dir()),
            "{g} is not a directory"
        );
        let status = m.read(&format!("{g}/status"));
        assert_eq!(
            status_field(&status, "Pid"),
            Some(g.to_string()),
            "{status}"
        );
        // The parent of a process clan started is the process that ran `clan run`.
        let want_ppid = if g == child {
            parent
        } else {
            p["ppid"].as_u64().expect("ppid")
        };
        assert_eq!(
            status_field(&status, "PPid"),
            Some(want_ppid.to_string()),
            "{g}: {status}"
        );
        let (pid, _, rest) = parse_stat(&m.read(&format!("{g}/stat")));
        assert_eq!(pid, g);
        assert_eq!(rest[1], want_ppid.to_string(), "ppid field of {g}/stat");
    }
    // `task/TID/children` names children by gpid too (the stub's parent, a shell on node 1).
    let shell = ps
        .iter()
        .find(|p| p["gpid"].as_u64() == Some(parent))
        .and_then(|p| p["ppid"].as_u64())
        .expect("the stub's parent");
    let kids = m.read(&format!("{shell}/task/{shell}/children"));
    assert_eq!(kids, format!("{parent} "), "children of {shell}");
    // Parent links cross nodes.
    assert_eq!(Gpid::from_raw(child).map(|g| g.node().get()), Some(2));
    assert_eq!(Gpid::from_raw(parent).map(|g| g.node().get()), Some(1));
    for (i, g) in sleeps.iter().enumerate() {
        assert_eq!(g.node().get(), i as u32 + 1);
        let (_, comm, _) = parse_stat(&m.read(&format!("{g}/stat")));
        assert_eq!(comm, "sleep");
    }
}

#[test]
fn files_links_and_directories_of_a_process() {
    root_or_skip!("files_links_and_directories_of_a_process");
    let c = Cluster::up(3);
    let g = c.spawn(3, &["sleep", "600"]);
    let m = Mounted::new(&c);
    let d = g.to_string();
    assert_eq!(
        std::fs::read(m.path(&format!("{d}/cmdline"))).unwrap(),
        b"sleep\x00600\x00"
    );
    assert_eq!(m.read(&format!("{d}/comm")), "sleep\n");
    let environ = std::fs::read(m.path(&format!("{d}/environ"))).unwrap();
    assert!(
        environ
            .split(|&b| b == 0)
            .any(|v| v == format!("CLAN_GPID={g}").as_bytes()),
        "environ of {g} lacks CLAN_GPID"
    );
    let statm: Vec<u64> = m
        .read(&format!("{d}/statm"))
        .split_whitespace()
        .map(|x| x.parse().expect("statm number"))
        .collect();
    assert_eq!(statm.len(), 7);
    assert!(statm[0] > 0 && statm[1] > 0);
    assert_eq!(
        std::fs::read_link(m.path(&format!("{d}/exe"))).unwrap(),
        PathBuf::from("/usr/bin/sleep")
    );
    assert_eq!(
        std::fs::read_link(m.path(&format!("{d}/cwd"))).unwrap(),
        std::env::current_dir().unwrap()
    );
    let mut fds: Vec<String> = std::fs::read_dir(m.path(&format!("{d}/fd")))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    fds.sort();
    assert_eq!(fds, ["0", "1", "2"]);
    assert!(std::fs::symlink_metadata(m.path(&format!("{d}/fd/1")))
        .unwrap()
        .file_type()
        .is_symlink());
    let tasks: Vec<String> = std::fs::read_dir(m.path(&format!("{d}/task")))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(tasks, std::slice::from_ref(&d));
    let (tid, _, _) = parse_stat(&m.read(&format!("{d}/task/{d}/stat")));
    assert_eq!(tid, g.raw());
    // `sched` names the process by its gpid too.
    let sched = m.read(&format!("{d}/sched"));
    assert!(
        sched.starts_with(&format!("sleep ({g}, #threads: 1)\n")),
        "{sched}"
    );
    // And so does a pidfd's fdinfo (a python on node 3 holding one of itself), a locked
    // file's, and the node's list of locks.
    let lock_file = c.dir.join("locked");
    let py = c.spawn(
        3,
        &[
            "python3",
            "-c",
            &format!(
                "import os, time, fcntl; fd = os.pidfd_open(os.getpid()); \
                 f = open('{}', 'w'); fcntl.flock(f, fcntl.LOCK_EX); time.sleep(600)",
                lock_file.display()
            ),
        ],
    );
    let pidfd = eventually("the pidfd", Duration::from_secs(10), || {
        std::fs::read_dir(m.path(&format!("{py}/fd")))
            .ok()?
            .flatten()
            .find(|e| {
                std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().contains("pidfd"))
            })
            .map(|e| e.file_name().to_string_lossy().into_owned())
    });
    let info = m.read(&format!("{py}/fdinfo/{pidfd}"));
    assert!(info.contains(&format!("\nPid:\t{py}\n")), "{info}");
    let locked = eventually("the locked file", Duration::from_secs(10), || {
        std::fs::read_dir(m.path(&format!("{py}/fd")))
            .ok()?
            .flatten()
            .find(|e| std::fs::read_link(e.path()).is_ok_and(|t| t == lock_file))
            .map(|e| e.file_name().to_string_lossy().into_owned())
    });
    let info = eventually("the lock", Duration::from_secs(10), || {
        Some(m.read(&format!("{py}/fdinfo/{locked}"))).filter(|i| i.contains("lock:"))
    });
    assert!(
        info.contains(&format!(" FLOCK  ADVISORY  WRITE {py} ")),
        "{info}"
    );
    // A node's own `locks`, through the API (ProcGlobal of one node).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let locks = rt
        .block_on(c.client(1).proc(clan_client::pb::ProcRequest {
            op: clan_client::pb::ProcOp::ProcGlobal as i32,
            path: "locks".into(),
            nodes: vec![3],
            ..Default::default()
        }))
        .unwrap();
    let locks = String::from_utf8_lossy(&locks.data);
    assert!(
        locks.contains(&format!(" FLOCK  ADVISORY  WRITE {py} ")),
        "{locks}"
    );
    // The same through the mount: node 3's own (numbered by its kernel, which counts the
    // locks of every pid namespace), and the cluster's `locks`, every node's numbered one
    // after the other, which lslocks(8) reads.
    for file in ["nodes/3/locks", "locks"] {
        let locks = m.read(file);
        assert!(
            locks.contains(&format!(" FLOCK  ADVISORY  WRITE {py} ")),
            "{file}: {locks}"
        );
    }
    let locks = m.read("locks");
    let numbers: Vec<u64> = locks
        .lines()
        .filter(|l| !l.contains("->"))
        .map(|l| l.split(':').next().unwrap().parse().unwrap())
        .collect();
    let want: Vec<u64> = (1..=numbers.len() as u64).collect();
    assert_eq!(numbers, want, "{locks}");
    // Inode numbers carry the gpid (gpid << 24), for programs that fstat an fd on /GPID.
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(m.path(&d)).unwrap().ino();
    assert_eq!(ino >> 24, g.raw());
    // Read-only.
    let e = std::fs::OpenOptions::new()
        .write(true)
        .open(m.path(&format!("{d}/comm")))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    // Names that are not processes pass through; pid_max is wide enough for gpids.
    assert_eq!(m.read("sys/kernel/pid_max"), "99999999\n");
    assert_eq!(
        m.read("version"),
        std::fs::read_to_string("/proc/version").unwrap()
    );
    assert!(m.read("filesystems").contains("proc"));
    assert!(std::fs::read_dir(m.path("tty")).is_ok());
    // A host process finds its own /proc/PID through the view (not listed, but there).
    let me = std::process::id();
    assert!(m
        .read(&format!("{me}/status"))
        .contains(&format!("Pid:\t{me}")));
    assert_eq!(
        std::fs::read_link(m.path("self")).unwrap(),
        PathBuf::from(format!("/proc/{me}"))
    );
}

#[test]
fn self_is_the_gpid_for_a_process_of_the_cluster() {
    root_or_skip!("self_is_the_gpid_for_a_process_of_the_cluster");
    let c = Cluster::up(3);
    let m = Mounted::new(&c);
    let init: u32 = std::fs::read_to_string(c.node_dir(2).join("init.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // A shell in node 2's pid namespace (and the host's mount namespace, which has the
    // view): `self` is its gpid, its status shows the gpid.
    let o = Command::new("nsenter")
        .args(["--target", &init.to_string(), "--pid", "--", "sh", "-c"])
        .arg(format!(
            "echo $$; readlink {0}/self; readlink {0}/thread-self; grep ^Pid: {0}/self/status",
            m.dir.display()
        ))
        .output()
        .expect("nsenter");
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines.len(),
        4,
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let local: u64 = lines[0].parse().unwrap();
    let gpid: u64 = lines[1].parse().unwrap();
    assert_eq!(gpid / 10_000_000, 2, "{out}");
    assert!(
        gpid > 20_000_000 + local,
        "readlink runs after the shell: {out}"
    );
    let (pid, tid) = lines[2].split_once("/task/").expect("GPID/task/TID");
    assert_eq!(pid, tid, "{out}");
    assert_eq!(pid.parse::<u64>().unwrap() / 10_000_000, 2, "{out}");
    assert!(lines[3].starts_with("Pid:\t2000"), "{out}");
}

#[test]
fn cluster_files_merge_the_nodes() {
    root_or_skip!("cluster_files_merge_the_nodes");
    let c = Cluster::up(3);
    let m = Mounted::new(&c);
    let mut nodes: Vec<String> = std::fs::read_dir(m.path("nodes"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    nodes.sort();
    assert_eq!(nodes, ["1", "2", "3"]);
    let kb = |text: &str, key: &str| -> u64 {
        status_field(text, key)
            .and_then(|v| v.trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{key} in {text}"))
    };
    let mem = m.read("meminfo");
    let total: u64 = (1..=3)
        .map(|n| kb(&m.read(&format!("nodes/{n}/meminfo")), "MemTotal"))
        .sum();
    assert_eq!(kb(&mem, "MemTotal"), total);
    let processors = |t: &str| t.lines().filter(|l| l.starts_with("processor")).count();
    let cpus: usize = (1..=3)
        .map(|n| processors(&m.read(&format!("nodes/{n}/cpuinfo"))))
        .sum();
    assert!(cpus >= 3);
    assert_eq!(processors(&m.read("cpuinfo")), cpus);
    let stat = m.read("stat");
    let cpu_lines = |t: &str| {
        t.lines()
            .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
            .count()
    };
    let per_node: usize = (1..=3)
        .map(|n| cpu_lines(&m.read(&format!("nodes/{n}/stat"))))
        .sum();
    assert_eq!(cpu_lines(&stat), per_node);
    assert!(stat.lines().any(|l| l.starts_with("cpu  ")));
    let btime = |t: &str| -> u64 {
        status_field(&t.replace(' ', ":"), "btime")
            .unwrap()
            .parse()
            .unwrap()
    };
    let min_btime = (1..=3)
        .map(|n| btime(&m.read(&format!("nodes/{n}/stat"))))
        .min()
        .unwrap();
    assert_eq!(btime(&stat), min_btime);
    let up = |t: &str| -> f64 { t.split_whitespace().next().unwrap().parse().unwrap() };
    let node_up: Vec<f64> = (1..=3)
        .map(|n| up(&m.read(&format!("nodes/{n}/uptime"))))
        .collect();
    let cluster_up = up(&m.read("uptime"));
    assert!(
        node_up.iter().all(|&u| cluster_up + 1.0 >= u),
        "{cluster_up} {node_up:?}"
    );
    for f in ["loadavg", "nodes/1/loadavg", "nodes/3/loadavg"] {
        let la = m.read(f);
        let w: Vec<&str> = la.split_whitespace().collect();
        assert_eq!(w.len(), 5, "{f}: {la}");
        for x in &w[..3] {
            x.parse::<f64>().unwrap_or_else(|_| panic!("{f}: {la}"));
        }
        let (run, all) = w[3].split_once('/').expect("running/total");
        assert!(
            run.parse::<u64>().is_ok() && all.parse::<u64>().is_ok(),
            "{la}"
        );
    }
}

#[test]
fn the_procfs_crate_reads_every_process() {
    root_or_skip!("the_procfs_crate_reads_every_process");
    let (c, sleeps, child, _) = populated();
    let m = Mounted::new(&c);
    let mut seen = Vec::new();
    for p in procfs::process::all_processes_with_root(&m.dir).expect("list") {
        let p = p.expect("open a process");
        let stat = p
            .stat()
            .unwrap_or_else(|e| panic!("stat of {}: {e}", p.pid));
        assert_eq!(stat.pid, p.pid);
        let status = p
            .status()
            .unwrap_or_else(|e| panic!("status of {}: {e}", p.pid));
        assert_eq!(status.pid, p.pid);
        p.cmdline()
            .unwrap_or_else(|e| panic!("cmdline of {}: {e}", p.pid));
        p.statm()
            .unwrap_or_else(|e| panic!("statm of {}: {e}", p.pid));
        p.uid()
            .unwrap_or_else(|e| panic!("owner of {}: {e}", p.pid));
        seen.push(p.pid as u64);
    }
    for g in sleeps.iter().map(|g| g.raw()).chain([child]) {
        assert!(seen.contains(&g), "{g} not read: {seen:?}");
    }
    let one = procfs::process::Process::new_with_root(m.path(&child.to_string())).unwrap();
    assert_eq!(one.stat().unwrap().comm, "sleep");
}

#[test]
fn procps_and_psmisc_list_every_node_with_gpids() {
    root_or_skip!("procps_and_psmisc_list_every_node_with_gpids");
    let (c, sleeps, child, parent) = populated();
    let m = Mounted::new(&c);
    let o = with_view_as_proc(
        &m,
        "ps -eo pid,ppid,user,stat,args && echo @@ && pgrep -f 'sleep 60[01]' && echo @@ && pstree -p 0",
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let parts: Vec<&str> = out.split("@@\n").collect();
    assert_eq!(parts.len(), 3, "{out}");
    let (ps, pgrep, pstree) = (parts[0], parts[1], parts[2]);
    let rows: Vec<Vec<&str>> = ps
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    for g in &sleeps {
        let row = rows
            .iter()
            .find(|r| r[0] == g.to_string())
            .unwrap_or_else(|| panic!("{g} not in ps:\n{ps}"));
        assert_eq!(row[2], "root");
        assert_eq!(&row[4..], ["sleep", "600"], "{ps}");
        assert!(pgrep.lines().any(|l| l == g.to_string()), "pgrep:\n{pgrep}");
        assert!(pstree.contains(&format!("sleep({g})")), "pstree:\n{pstree}");
    }
    let row = rows
        .iter()
        .find(|r| r[0] == child.to_string())
        .unwrap_or_else(|| panic!("{child} not in ps:\n{ps}"));
    assert_eq!(
        row[1],
        parent.to_string(),
        "ps shows the cross-node parent:\n{ps}"
    );
    assert!(pgrep.lines().any(|l| l == child.to_string()), "{pgrep}");
    // pstree draws the child under the `clan run` of node 1 that started it.
    assert!(
        pstree.contains(&format!("clan({parent})---sleep({child})")),
        "pstree:\n{pstree}"
    );
    // Nothing but gpids, the cluster's init and the header: no host process is listed.
    for r in &rows {
        let pid: u64 = r[0].parse().unwrap();
        assert!(
            pid >= 10_000_000 || pid == 1,
            "host pid {pid} listed:\n{ps}"
        );
    }
    let init = rows.iter().find(|r| r[0] == "1").expect("pid 1 listed");
    assert_eq!((init[1], init[2], init[4]), ("0", "root", "clan"), "{ps}");
}

/// A process whose parent (on another node) exits gets the cluster's init for parent, as
/// the kernel gives an orphan init: in `stat`, `status` and `clan ps`, not the gpid of a
/// parent that is gone.
#[test]
fn an_orphan_of_another_nodes_parent_gets_the_clusters_init() {
    root_or_skip!("an_orphan_of_another_nodes_parent_gets_the_clusters_init");
    let c = Cluster::up(3);
    let m = Mounted::new(&c);
    // A shell on node 2 starts a process on node 3, says its gpid and waits for its input.
    let mut stub = c
        .cmd()
        .args(["run", "--node", "2", "--", "sh", "-c"])
        .arg("clan run -d --node 3 -- sleep 600 && echo $$ && read x; exit 0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(stub.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    let child: Gpid = line.trim().parse().expect("the child's gpid");
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    let sh_local: u32 = line.trim().parse().expect("the shell's pid");
    let sh = Gpid::new(clan_core::NodeId::new(2).unwrap(), sh_local).unwrap();
    let ppid = |file: &str| -> String {
        let text = m.read(&format!("{child}/{file}"));
        if file == "stat" {
            parse_stat(&text).2[1].clone()
        } else {
            status_field(&text, "PPid").unwrap_or_default()
        }
    };
    assert_eq!(ppid("stat"), sh.to_string());
    assert_eq!(ppid("status"), sh.to_string());
    // The shell ends.
    drop(stub.stdin.take());
    let st = eventually("the shell's end", Duration::from_secs(30), || {
        stub.try_wait().unwrap()
    });
    assert!(st.success(), "{st:?}");
    eventually(
        "the orphan's parent the cluster's init",
        Duration::from_secs(10),
        || (ppid("stat") == "1").then_some(()),
    );
    assert_eq!(ppid("status"), "1");
    let ps = c.clan_ok(&["ps", "--node", "3", "-o", "json"]);
    let rows: Vec<serde_json::Value> = serde_json::from_str(&ps).expect("clan ps -o json");
    let row = rows
        .iter()
        .find(|r| r["gpid"] == child.raw())
        .unwrap_or_else(|| panic!("{child} not in clan ps: {ps}"));
    assert_eq!(row["ppid"], 1, "{row}");
    c.clan_ok(&["kill", "-s", "KILL", &child.to_string()]);
}

/// A process of another node with a command line and an environment of 800 kB each (the
/// two together near the kernel's limit for an exec): both read whole through the mount,
/// byte for byte.
#[test]
fn huge_cmdlines_and_environs_read_whole() {
    root_or_skip!("huge_cmdlines_and_environs_read_whole");
    let c = Cluster::up(2);
    // A shell that stays (its command is not its last): its arguments stay its own.
    let script = "sleep 600; :";
    let args: Vec<String> = (0..8)
        .map(|i| format!("{i}{}", "a".repeat(100_000)))
        .collect();
    let vars: Vec<(String, String)> = (0..8)
        .map(|i| (format!("CLAN_HUGE_{i}"), "b".repeat(100_000)))
        .collect();
    let mut cmd = c.cmd();
    cmd.args(["run", "-d", "--node", "2", "--", "sh", "-c", script])
        .args(&args)
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null());
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let g: Gpid = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let m = Mounted::new(&c);

    let mut want = Vec::new();
    for a in ["sh", "-c", script]
        .iter()
        .copied()
        .chain(args.iter().map(String::as_str))
    {
        want.extend_from_slice(a.as_bytes());
        want.push(0);
    }
    // Once the exec is done (`clan run -d` returns when the process is started).
    let cmdline = eventually("the exec", Duration::from_secs(10), || {
        std::fs::read(m.path(&format!("{g}/cmdline")))
            .ok()
            .filter(|c| c.starts_with(b"sh\0"))
    });
    assert_eq!(cmdline.len(), want.len());
    assert!(cmdline == want, "the command line differs");

    let environ = std::fs::read(m.path(&format!("{g}/environ"))).unwrap();
    assert!(environ.len() > 800_000, "{} bytes", environ.len());
    let entries: Vec<&[u8]> = environ.split(|&b| b == 0).collect();
    for (k, v) in &vars {
        let e = format!("{k}={v}");
        assert!(
            entries.contains(&e.as_bytes()),
            "{k} missing or cut from the environment"
        );
    }
}

/// `task/` right after a listing of the root (as pstree lists it for every process): one
/// thread for a single-threaded process (answered from the listing's snapshot), every
/// thread of a threaded one.
#[test]
fn task_listings_after_a_listing_of_the_root() {
    root_or_skip!("task_listings_after_a_listing_of_the_root");
    let c = Cluster::up(3);
    let lone = c.spawn(2, &["sleep", "600"]);
    let threaded = c.spawn(
        3,
        &[
            "python3",
            "-c",
            "import threading, time\n\
             for _ in range(3): threading.Thread(target=time.sleep, args=(600,)).start()\n\
             time.sleep(600)",
        ],
    );
    let m = Mounted::new(&c);
    eventually("four threads", Duration::from_secs(10), || {
        status_field(&m.read(&format!("{threaded}/status")), "Threads").filter(|t| t == "4")
    });
    let tasks = |g: Gpid| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(m.path(&format!("{g}/task")))
            .unwrap()
            .flatten()
            .map(|e| {
                assert!(e.file_type().unwrap().is_dir(), "{e:?}");
                e.file_name().to_string_lossy().into_owned()
            })
            .collect();
        v.sort();
        v
    };
    for _ in 0..2 {
        let listed: Vec<String> = std::fs::read_dir(&m.dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(listed.contains(&lone.to_string()) && listed.contains(&threaded.to_string()));
        assert_eq!(tasks(lone), [lone.to_string()]);
        let t = tasks(threaded);
        assert_eq!(t.len(), 4, "{t:?}");
        assert!(t.contains(&threaded.to_string()), "{t:?}");
        for tid in &t {
            let (id, _, _) = parse_stat(&m.read(&format!("{threaded}/task/{tid}/stat")));
            assert_eq!(id.to_string(), *tid);
        }
    }
}

/// A user lists the processes root lists: clan's shepherds are hidden from both (a user may
/// not read a shepherd's `exe` link, by which the node knows one).
#[test]
fn a_user_lists_what_root_lists_and_no_shepherd() {
    root_or_skip!("a_user_lists_what_root_lists_and_no_shepherd");
    let c = Cluster::up(2);
    let a = test_user("clanpfsa");
    c.spawn(1, &["sleep", "600"]);
    c.spawn(2, &["sleep", "601"]);
    let m = Mounted::new(&c);
    std::fs::set_permissions(&m.dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).ok();
    let numbers = |names: &str| -> std::collections::BTreeSet<u64> {
        names
            .split_whitespace()
            .filter_map(|n| n.parse().ok())
            .collect()
    };
    let o = as_user(a, &["ls", m.dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let theirs = numbers(&String::from_utf8_lossy(&o.stdout));
    let ours: Vec<String> = std::fs::read_dir(&m.dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let ours = numbers(&ours.join(" "));
    assert_eq!(theirs, ours);
    // (A node's init runs the shepherd binary too, and is listed: pid 1 of its node.)
    for g in ours.iter().filter(|g| *g % 10_000_000 != 1) {
        let comm = std::fs::read_to_string(m.path(&format!("{g}/comm"))).unwrap_or_default();
        assert_ne!(comm.trim(), "clan-shepherd", "shepherd {g} listed");
    }
}

#[test]
fn environ_of_another_user_is_refused() {
    root_or_skip!("environ_of_another_user_is_refused");
    let c = Cluster::up(3);
    let (a, b) = (test_user("clanpfsa"), test_user("clanpfsb"));
    let m = Mounted::new(&c);
    std::fs::set_permissions(&m.dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).ok();
    let clan = bin("clan");
    let dir = c.dir.to_str().unwrap().to_string();
    let o = as_user(
        a,
        &[
            "env",
            &format!("CLAN_DIR={dir}"),
            clan.to_str().unwrap(),
            "run",
            "-d",
            "--node",
            "2",
            "--",
            "sleep",
            "600",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let g: Gpid = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    let root_g = c.spawn(3, &["sleep", "600"]);
    let env = |uid: u32, g: Gpid| {
        as_user(
            uid,
            &["cat", m.path(&format!("{g}/environ")).to_str().unwrap()],
        )
    };
    // Its owner reads it; another user and root's process are refused, as the kernel would.
    let own = env(a, g);
    assert!(
        own.status.success(),
        "{}",
        String::from_utf8_lossy(&own.stderr)
    );
    assert!(String::from_utf8_lossy(&own.stdout).contains(&format!("CLAN_GPID={g}")));
    for (uid, g) in [(b, g), (a, root_g)] {
        let o = env(uid, g);
        assert!(!o.status.success());
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("Permission denied"),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // What the kernel shows by who reads is what the reader would see natively: root's
    // process's code and stack addresses and wait channel are hidden from a user.
    let stat = as_user(
        a,
        &["cat", m.path(&format!("{root_g}/stat")).to_str().unwrap()],
    );
    let stat = String::from_utf8_lossy(&stat.stdout).to_string();
    let after_comm: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    // Fields 26 to 28 (startcode, endcode, startstack): the 24th to 26th after the comm.
    assert_eq!(&after_comm[23..26], &["1", "1", "0"], "{stat}");
    let wchan = as_user(
        a,
        &["cat", m.path(&format!("{root_g}/wchan")).to_str().unwrap()],
    );
    assert_eq!(String::from_utf8_lossy(&wchan.stdout), "0");
    let root_stat = std::fs::read_to_string(m.path(&format!("{root_g}/stat"))).unwrap();
    let root_fields: Vec<&str> = root_stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    assert_ne!(root_fields[23], "1", "root sees the addresses: {root_stat}");
    // Files everyone may read stay readable; the owner shows in the directory.
    let st = as_user(
        b,
        &["cat", m.path(&format!("{g}/status")).to_str().unwrap()],
    );
    assert!(String::from_utf8_lossy(&st.stdout).contains(&format!("Pid:\t{g}")));
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(m.path(&g.to_string())).unwrap().uid(), a);
    // fd/ of another user's process is not listed for them.
    let o = as_user(b, &["ls", m.path(&format!("{g}/fd")).to_str().unwrap()]);
    assert!(!o.status.success());
}

#[test]
fn an_exited_process_is_enoent() {
    root_or_skip!("an_exited_process_is_enoent");
    let c = Cluster::up(3);
    let g = c.spawn(2, &["sleep", "600"]);
    let m = Mounted::new(&c);
    assert!(m.read(&format!("{g}/status")).contains("sleep"));
    // An absent name (ps asks for ctty) is kept absent by the kernel, like present ones.
    for _ in 0..2 {
        let e = std::fs::metadata(m.path(&format!("{g}/ctty"))).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);
    }
    kill_until_gone_from(&c, &m, g);
    // The kernel may keep the entry for its time to live (1 s).
    eventually("the directory to go", Duration::from_secs(5), || {
        let e = std::fs::metadata(m.path(&g.to_string())).err()?;
        (e.kind() == ErrorKind::NotFound).then_some(())
    });
    // The names of the directory, kept long by the kernel, went with it.
    let e = std::fs::metadata(m.path(&format!("{g}/status"))).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    let listed = std::fs::read_dir(&m.dir)
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy() == g.to_string());
    assert!(!listed);
}

/// Each open of a file has the contents of its own moment (and of the moment of each read
/// from its start), also while other opens of the same file are held (FUSE passthrough,
/// which would serve reads from a memfd in the kernel, was tried and refused such opens:
/// the kernel wants one backing file for all the opens of an inode); seeks and positioned
/// reads work, and an ioctl gets ENOTTY, as from the kernel's /proc.
#[test]
fn opens_of_one_file_at_once_each_read_their_own() {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::unix::fs::FileExt;
    root_or_skip!("opens_of_one_file_at_once_each_read_their_own");
    let c = Cluster::up(2);
    let g = c.spawn(2, &["sleep", "600"]);
    let m = Mounted::new(&c);
    let file = m.path(&format!("{g}/status"));
    let pid_line = format!("\nPid:\t{g}\n");
    let whole = |f: &mut std::fs::File| {
        let mut s = String::new();
        f.read_to_string(&mut s).expect("read");
        s
    };
    // Three opens held at once.
    let mut files: Vec<std::fs::File> = (0..3)
        .map(|_| std::fs::File::open(&file).expect("open"))
        .collect();
    for f in &mut files {
        let s = whole(f);
        assert!(
            s.starts_with("Name:\tsleep\n") && s.contains(&pid_line),
            "{s}"
        );
        // At its end: nothing more. Back to the start: the file again.
        assert_eq!(whole(f), "");
        f.seek(SeekFrom::Start(0)).expect("seek");
        assert!(whole(f).contains(&pid_line));
        let mut head = [0u8; 5];
        assert_eq!(f.read_at(&mut head, 0).expect("pread"), 5);
        assert_eq!(&head, b"Name:");
        // SAFETY: isatty only looks at the descriptor.
        let tty = unsafe { libc::isatty(std::os::fd::AsRawFd::as_raw_fd(f)) };
        let e = std::io::Error::last_os_error();
        assert_eq!((tty, e.raw_os_error()), (0, Some(libc::ENOTTY)));
    }
    // Read again from its start, an open file is made anew, as the kernel's are (top and
    // free keep /proc/stat, meminfo and uptime open): the stop shows through an open of
    // before it, and the cluster's uptime advances.
    let f = &mut files[0];
    c.clan_ok(&["kill", "-s", "STOP", &g.to_string()]);
    eventually(
        "the stop through the open file",
        Duration::from_secs(5),
        || {
            f.seek(SeekFrom::Start(0)).ok()?;
            whole(f).contains("State:\tT (stopped)").then_some(())
        },
    );
    c.clan_ok(&["kill", "-s", "CONT", &g.to_string()]);
    let mut up = std::fs::File::open(m.path("uptime")).expect("open uptime");
    let first = whole(&mut up);
    eventually("uptime to advance", Duration::from_secs(5), || {
        up.seek(SeekFrom::Start(0)).ok()?;
        (whole(&mut up) != first).then_some(())
    });
    let mut held = files.remove(0);
    drop(files);
    // Opens one after the other, each closed before the next (its release may come to
    // the server after the next open).
    for _ in 0..200 {
        let s = whole(&mut std::fs::File::open(&file).expect("open"));
        assert!(s.contains(&pid_line), "{s}");
    }
    // Once the process is gone, a read from the start of a file opened before: ESRCH, as
    // the kernel's.
    c.clan_ok(&["kill", "-s", "KILL", &g.to_string()]);
    c.clan(&["wait", &g.to_string()]);
    eventually("ESRCH from the held file", Duration::from_secs(5), || {
        held.seek(SeekFrom::Start(0)).ok()?;
        let e = held.read(&mut [0u8; 64]).err()?;
        (e.raw_os_error() == Some(libc::ESRCH)).then_some(())
    });
    drop(m);
}

#[test]
fn a_power_cut_node_does_not_hang_a_listing() {
    root_or_skip!("a_power_cut_node_does_not_hang_a_listing");
    let c = Cluster::up(3);
    let sleeps: Vec<Gpid> = (1..=3).map(|n| c.spawn(n, &["sleep", "600"])).collect();
    let m = Mounted::new(&c);
    c.power_cut(3);
    let list = || -> Vec<String> {
        std::fs::read_dir(&m.dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    };
    for _ in 0..3 {
        let t = Instant::now();
        let names = list();
        assert!(
            t.elapsed() < Duration::from_secs(4),
            "listing took {:?}",
            t.elapsed()
        );
        for g in &sleeps[..2] {
            assert!(names.contains(&g.to_string()), "{g} missing");
        }
        assert!(!names.contains(&sleeps[2].to_string()));
        // A read of a process of the dead node ends too, with ENOENT.
        let t = Instant::now();
        let e = std::fs::read(m.path(&format!("{}/status", sleeps[2]))).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert!(t.elapsed() < Duration::from_secs(4));
    }
    // The cluster files leave the dead node out.
    assert!(m.read("loadavg").split_whitespace().count() == 5);
}

/// Readers of a node that stopped answering (cut off, not yet declared dead) wait for it
/// without holding up the readers of the other nodes: the view's requests go in one lane
/// per node.
#[test]
fn readers_of_a_silent_node_do_not_hold_up_the_others() {
    root_or_skip!("readers_of_a_silent_node_do_not_hold_up_the_others");
    readers_of_a_silent_node(false);
}

/// The same over io_uring, every reader on one CPU: the readers of the silent node hold
/// their requests' entries (answered later, on other threads), and the queue of that CPU
/// still takes node 2's read at once.
#[test]
fn over_io_uring_readers_of_a_silent_node_do_not_hold_up_their_cpu() {
    root_or_skip!("over_io_uring_readers_of_a_silent_node_do_not_hold_up_their_cpu");
    if !uring_or_skip("over_io_uring_readers_of_a_silent_node_do_not_hold_up_their_cpu") {
        return;
    }
    readers_of_a_silent_node(true);
}

/// Readers of eight processes of a stopped node wait in their opens; a process of node 2
/// reads meanwhile. With `ring`, the view is served over io_uring and every reader (six)
/// runs on CPU 0 (one queue): node 2's read must come back before any of theirs ends.
fn readers_of_a_silent_node(ring: bool) {
    // Node 3 is not declared dead while the test runs.
    let c = Cluster::up_with(3, &["--heartbeat-ms", "200", "--dead-after-ms", "120000"]);
    let (seen, two) = (c.spawn(2, &["sleep", "600"]), c.spawn(2, &["sleep", "600"]));
    // More processes of node 3 than a lane lets through at once, each read by its own
    // reader (the kernel would make readers of one name wait for one lookup).
    // Over io_uring, fewer than the entries of CPU 0's queue (two rings of four): a
    // queue serves as many requests at once as it has entries (proc.md).
    let readers = if ring { 6 } else { 8 };
    let threes: Vec<Gpid> = (0..readers)
        .map(|_| c.spawn(3, &["sleep", "600"]))
        .collect();
    let m = if ring {
        let _on = UringOn::new();
        Mounted::new(&c)
    } else {
        Mounted::new(&c)
    };
    let on_cpu0 = move || {
        if ring {
            let mut set = nix::sched::CpuSet::new();
            set.set(0).unwrap();
            nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).unwrap();
        }
    };
    assert!(m.read(&format!("{seen}/status")).contains("Name:\tsleep"));
    if ring {
        assert!(
            !switches_of_threads(m.server, "fuser-ring-").is_empty(),
            "the view is not served over io_uring"
        );
    }

    /// Stops a cland until dropped, also when the test fails.
    struct Stopped(nix::unistd::Pid);
    impl Drop for Stopped {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
        }
    }
    let pid = nix::unistd::Pid::from_raw(c.cland_pid(3));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let stopped = Stopped(pid);

    // Readers that got their file, and readers that ended either way.
    let done = std::sync::Arc::new(AtomicU32::new(0));
    let ended = std::sync::Arc::new(AtomicU32::new(0));
    let (tx, rx) = std::sync::mpsc::channel();
    let readers: Vec<_> = threes
        .iter()
        .map(|g| {
            let path = m.path(&format!("{g}/status"));
            let (done, ended, tx) = (done.clone(), ended.clone(), tx.clone());
            std::thread::spawn(move || {
                on_cpu0();
                tx.send(nix::unistd::gettid().as_raw()).unwrap();
                let r = std::fs::read_to_string(path);
                // Those that got their file (an EIO is the view giving up on node 3 after
                // its timeout, which a busy machine may reach before node 2's read).
                if r.is_ok() {
                    done.fetch_add(1, Ordering::SeqCst);
                }
                ended.fetch_add(1, Ordering::SeqCst);
                r
            })
        })
        .collect();
    let tids: Vec<i32> = rx.iter().take(readers.len()).collect();
    // Every reader is inside its open(2) of the view (waiting for node 3).
    eventually(
        "the readers to wait in open",
        Duration::from_secs(10),
        || {
            tids.iter()
                .all(|t| {
                    std::fs::read_to_string(format!("/proc/self/task/{t}/syscall"))
                        .is_ok_and(|s| s.starts_with(&format!("{} ", libc::SYS_openat)))
                })
                .then_some(())
        },
    );
    // A process of node 2 that was never looked up reads while all of them still wait
    // (its lookup in the root does not wait for theirs).
    let two_path = m.path(&format!("{two}/status"));
    let read_two = std::thread::spawn(move || {
        on_cpu0();
        std::fs::read_to_string(two_path)
    });
    let text = read_two.join().unwrap().expect("node 2's status");
    assert!(text.contains("Name:\tsleep"), "{text}");
    let ended_before = ended.load(Ordering::SeqCst);
    assert_eq!(
        done.load(Ordering::SeqCst),
        0,
        "a reader of node 3 finished before node 2's read did"
    );
    if ring {
        // Their requests held every entry the queue had: node 2's would have waited for
        // the view to give up on node 3 (5 s, EIO).
        assert_eq!(
            ended_before, 0,
            "a reader of node 3 ended before node 2's read came back"
        );
    }
    // Node 3 answers again: its readers get its file, or EIO if the view gave up first.
    drop(stopped);
    for r in readers {
        match r.join().unwrap() {
            Ok(text) => assert!(text.contains("Name:\tsleep"), "{text}"),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}"),
        }
    }
    eventually("node 3's file again", Duration::from_secs(10), || {
        std::fs::read_to_string(m.path(&format!("{}/status", threes[0]))).ok()
    });
}

/// Kills node `n`'s cland (its processes live on under their shepherds) and waits until
/// it is gone.
fn kill_cland(c: &Cluster, n: u32) {
    let pid = c.cland_pid(n);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    eventually(
        &format!("cland {n} to be gone"),
        Duration::from_secs(10),
        || (!alive(pid)).then_some(()),
    );
}

#[test]
fn cland_restarting_gives_eio_then_the_view_reconnects() {
    root_or_skip!("cland_restarting_gives_eio_then_the_view_reconnects");
    let c = Cluster::up(3);
    let g = c.spawn(2, &["sleep", "600"]);
    let m = Mounted::new(&c);
    let status = format!("{g}/status");
    assert!(m.read(&status).contains("sleep"));
    // The view talks to node 1 (the lowest): kill its cland.
    kill_cland(&c, 1);
    // What the view asks its own cland (a listing of the root) fails with EIO. A file
    // of a process of another node may still come on a direct link to that node, which
    // cland opened before it died (docs/links.md), or fail with EIO.
    let e = std::fs::read_dir(&m.dir)
        .and_then(|d| d.collect::<Result<Vec<_>, _>>())
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    match std::fs::read_to_string(m.path(&status)) {
        Ok(text) => assert!(text.contains("sleep"), "{text}"),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}"),
    }
    let mut cland = c.restart_cland(1);
    eventually("the view to reconnect", Duration::from_secs(20), || {
        std::fs::read_to_string(m.path(&status)).ok()
    });
    drop(m);
    drop(c); // clan down stops the daemon we started
    let _ = cland.wait();
}

/// The view reads files of another node's processes on links to that node (docs/links.md),
/// waited for on its own FUSE threads. A link whose node's cland died is given up at the
/// next read, which goes through the view's cland instead; once the node's cland is back,
/// files of its processes (which outlived it) read again.
#[test]
fn reads_go_on_after_the_linked_nodes_cland_restarts() {
    root_or_skip!("reads_go_on_after_the_linked_nodes_cland_restarts");
    let c = Cluster::up_restartable(3);
    let g = c.spawn(2, &["sleep", "600"]);
    let m = Mounted::new(&c);
    let status = format!("{g}/status");
    for _ in 0..20 {
        assert!(m.read(&status).contains("Name:\tsleep"));
    }
    kill_cland(&c, 2);
    // Its links are closed: a read fails at once with an error, and hangs nobody.
    let t = Instant::now();
    let e = std::fs::read_to_string(m.path(&status)).unwrap_err();
    assert!(
        matches!(e.raw_os_error(), Some(libc::EIO | libc::ENOENT)),
        "{e}"
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let mut cland = c.restart_cland(2);
    eventually("node 2's file again", Duration::from_secs(20), || {
        std::fs::read_to_string(m.path(&status))
            .ok()
            .filter(|t| t.contains("Name:\tsleep"))
    });
    for _ in 0..20 {
        assert!(m.read(&status).contains("Name:\tsleep"));
    }
    drop(m);
    drop(c);
    let _ = cland.wait();
}

#[test]
fn a_killed_server_leaves_no_mount_behind() {
    root_or_skip!("a_killed_server_leaves_no_mount_behind");
    let c = Cluster::up(3);
    let m = Mounted::new(&c);
    assert!(mounted(&m.dir));
    // Its watcher is named so that `pkill [-f] clan-procfs` and `killall clan-procfs`
    // spare it: they end the server, and the watcher cleans up after it.
    let dir = m.dir.to_string_lossy().into_owned();
    let watcher = m.watcher();
    let comm = std::fs::read_to_string(format!("/proc/{watcher}/comm")).unwrap();
    let cmdline = std::fs::read(format!("/proc/{watcher}/cmdline")).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline);
    assert_eq!(comm.trim(), "clan-view-watch");
    // (This test's directory is named clan-procfs-*: a user's would not match.)
    assert_eq!(
        cmdline.trim_end_matches('\0'),
        format!("clan-view-watch {dir}")
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(m.server),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    eventually(
        "the watcher to remove the mount",
        Duration::from_secs(10),
        || (!mounted(&m.dir)).then_some(()),
    );
    eventually("the watcher to end", Duration::from_secs(10), || {
        host_processes_mentioning(&dir).is_empty().then_some(())
    });
    // The directory is a plain directory again.
    assert_eq!(std::fs::read_dir(&m.dir).unwrap().count(), 0);
}

/// A view whose server and watcher were both killed is a dead mount (ENOTCONN): the next
/// `clan proc mount` there replaces it, and `clan proc umount` removes it.
#[test]
fn a_dead_view_is_replaced_by_the_next_mount() {
    root_or_skip!("a_dead_view_is_replaced_by_the_next_mount");
    let c = Cluster::up(2);
    let kill_all = |m: &Mounted| {
        let kill = |p: i32| {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p),
                nix::sys::signal::Signal::SIGKILL,
            );
        };
        // The watcher first, and dead before the server, so that nobody detaches the view.
        let watcher = m.watcher();
        kill(watcher);
        eventually("the watcher's death", Duration::from_secs(10), || {
            matches!(proc_state(watcher as u32), None | Some('Z')).then_some(())
        });
        kill(m.server);
        eventually("a dead mount", Duration::from_secs(10), || {
            (std::fs::metadata(&m.dir).err()?.raw_os_error() == Some(libc::ENOTCONN)).then_some(())
        });
    };
    let m = Mounted::new(&c);
    kill_all(&m);
    assert!(mounted(&m.dir));
    // Mounted again on top of the dead one: it is replaced, and the view answers.
    let again = Mounted::at(&c, m.dir.clone());
    assert!(again.read("loadavg").split(' ').count() >= 5);
    kill_all(&again);
    // `clan proc umount` removes a dead one.
    c.clan_ok(&["proc", "umount", m.dir.to_str().unwrap()]);
    assert!(!mounted(&m.dir));
}

#[test]
fn mount_errors_and_clean_unmount() {
    root_or_skip!("mount_errors_and_clean_unmount");
    let c = Cluster::up(3);
    let m = Mounted::new(&c);
    let code = |args: &[&str]| c.clan(args).status.code();
    let d = m.dir.to_str().unwrap();
    assert_eq!(
        code(&["proc", "mount", d]),
        Some(1),
        "already a mount point"
    );
    assert_eq!(code(&["proc", "mount", "/nonexistent/clan"]), Some(3));
    assert_eq!(code(&["proc", "mount", "/etc/passwd"]), Some(3));
    assert_eq!(code(&["proc", "umount", "/tmp"]), Some(3));
    // SIGTERM unmounts cleanly and ends the server.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(m.server),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    eventually(
        "the server to unmount and end",
        Duration::from_secs(10),
        || (!mounted(&m.dir) && !alive(m.server)).then_some(()),
    );
    // And `clan proc umount` does the same.
    let m2 = Mounted::new(&c);
    let out = c.clan_ok(&["proc", "umount", m2.dir.to_str().unwrap()]);
    assert!(out.contains("unmounted"));
    assert!(!mounted(&m2.dir));
    eventually("the second server to end", Duration::from_secs(10), || {
        (!alive(m2.server)).then_some(())
    });
}

/// Processes of `uid` whose command line mentions `needle` are killed when this goes.
struct KillUsersOnDrop(u32, String);

impl Drop for KillUsersOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("pkill")
            .args(["-KILL", "-u", &self.0.to_string(), "-f", &self.1])
            .status();
    }
}

/// A user mounts the view (through fusermount3, as libfuse does for users) and reads it
/// with their own rights: the status of another user's process, not its environ; then
/// unmounts it. This machine's /dev/fuse is root's only (0600), so the test gives the user
/// a node of their own, 0666 as Debian's udev makes it, in a private mount namespace that
/// the mount lives in too.
#[test]
fn a_user_mounts_the_view_and_reads_with_their_own_rights() {
    root_or_skip!("a_user_mounts_the_view_and_reads_with_their_own_rights");
    let c = Cluster::up(2);
    let g = c.spawn(2, &["sleep", "600"]);
    let u = test_user("clanpfsm");
    let mnt = c.dir.join("user-view");
    std::fs::create_dir_all(&mnt).unwrap();
    nix::unistd::chown(&mnt, Some(nix::unistd::Uid::from_raw(u)), None).unwrap();
    let _cleanup = KillUsersOnDrop(u, mnt.to_string_lossy().into_owned());
    let clan = bin("clan");
    let script = format!(
        "set -e; d=$(mktemp -d); mount -t tmpfs none $d; mknod -m 0666 $d/fuse c 10 229; \
         mount --bind $d/fuse /dev/fuse; \
         as='setpriv --reuid={u} --regid={u} --clear-groups env CLAN_DIR={dir}'; \
         $as {clan} proc mount {mnt}; \
         $as head -1 {mnt}/{g}/status; \
         if $as cat {mnt}/{g}/environ >/dev/null 2>&1; then echo environ read; \
         else echo environ refused; fi; \
         $as {clan} proc umount {mnt}",
        dir = c.dir.display(),
        clan = clan.display(),
        mnt = mnt.display(),
    );
    let o = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .stdin(Stdio::null())
        .output()
        .expect("unshare");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{out}{err}");
    assert!(out.contains("cluster /proc mounted"), "{out}{err}");
    assert!(out.contains("Name:\tsleep"), "{out}{err}");
    assert!(out.contains("environ refused"), "{out}{err}");
    assert!(out.contains("unmounted"), "{out}{err}");
    // The user's server ended with its mount.
    eventually("the user's server to end", Duration::from_secs(10), || {
        host_processes_mentioning(&format!("clan-procfs {}", mnt.display()))
            .is_empty()
            .then_some(())
    });
}

/// A mount point that is not UTF-8 (a Latin-1 name) appearing in the server's mount
/// namespace while it serves does not end it: the view stays mounted and readable. In a
/// private mount namespace, so that other tests do not see the odd mount (removed first
/// at the end: `clan proc umount` reads mountinfo as text).
#[test]
fn a_mount_point_that_is_not_utf8_leaves_the_view_serving() {
    root_or_skip!("a_mount_point_that_is_not_utf8_leaves_the_view_serving");
    let c = Cluster::up(2);
    let script = format!(
        "set -e; d={dir}; clan={clan}; export CLAN_DIR=$d; \
         mkdir -p $d/v1 $d/v2; odd=\"$(printf '%s/caf\\351 x' $d)\"; mkdir -p \"$odd\"; \
         trap 'umount \"$odd\" || echo umount odd failed >&2; \
               $clan proc umount $d/v1 >/dev/null 2>&1 || echo umount v1 failed >&2; \
               $clan proc umount $d/v2 >/dev/null 2>&1 || echo umount v2 failed >&2' EXIT; \
         $clan proc mount $d/v1; \
         mount -t tmpfs none \"$odd\"; \
         $clan proc mount $d/v2; \
         head -1 $d/v1/loadavg >/dev/null && echo read-ok; \
         echo views=$(grep -acE ' - fuse(\\.clanproc)? clanproc ' /proc/self/mountinfo)",
        dir = c.dir.display(),
        clan = bin("clan").display(),
    );
    let o = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .stdin(Stdio::null())
        .output()
        .expect("unshare");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{out}{err}");
    assert!(out.contains("read-ok"), "{out}{err}");
    assert!(out.contains("views=2"), "{out}{err}");
    assert!(!err.contains("failed"), "{out}{err}");
    let v1 = format!("clan-procfs {}", c.dir.join("v1").display());
    eventually("the servers to end", Duration::from_secs(10), || {
        host_processes_mentioning(&v1).is_empty().then_some(())
    });
}

/// The ids of the cluster /proc views mounted at node `n`'s view directory, in its mount
/// namespace.
fn node_views(c: &Cluster, n: u32) -> Vec<u64> {
    let init = std::fs::read_to_string(c.node_dir(n).join("init.pid")).expect("init.pid");
    let info = std::fs::read(format!("/proc/{}/mountinfo", init.trim())).unwrap_or_default();
    let view = c.node_dir(n).join("proc");
    String::from_utf8_lossy(&info)
        .lines()
        .filter(|l| l.split(' ').nth(4) == view.to_str())
        .filter(|l| l.contains(" - fuse.clanproc "))
        .filter_map(|l| l.split(' ').next()?.parse().ok())
        .collect()
}

/// The pid of node `n`'s view server (cland's, `--mount-ns`), from its pid file.
fn node_view_server(c: &Cluster, n: u32) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(c.node_dir(n).join("procfs.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    (comm.trim() == "clan-procfs" && alive(pid)).then_some(pid)
}

/// SIGTERM stops a node's view server, whose view is mounted inside the node's mount
/// namespace (`--mount-ns`, a session with no mount of its own): the server ends, its
/// watcher detaches the view there, and cland starts another, whose view works (mount
/// ids are reused, so the new view is told from a dead one by reading it).
#[test]
fn sigterm_stops_a_view_server_mounted_in_a_node_namespace() {
    root_or_skip!("sigterm_stops_a_view_server_mounted_in_a_node_namespace");
    let c = Cluster::up(2);
    let old = eventually("node 1's view server", Duration::from_secs(20), || {
        node_view_server(&c, 1).filter(|_| node_views(&c, 1).len() == 1)
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    eventually("the server to end", Duration::from_secs(10), || {
        (!alive(old)).then_some(())
    });
    eventually(
        "a new view server on node 1",
        Duration::from_secs(20),
        || {
            let pid = node_view_server(&c, 1).filter(|&p| p != old)?;
            (node_views(&c, 1).len() == 1).then_some(pid)
        },
    );
    let init = std::fs::read_to_string(c.node_dir(1).join("init.pid")).expect("init.pid");
    let loadavg = format!(
        "/proc/{}/root{}/loadavg",
        init.trim(),
        c.node_dir(1).join("proc").display()
    );
    let text = std::fs::read_to_string(&loadavg).expect("the new view");
    assert_eq!(text.split_whitespace().count(), 5, "{text}");
}

/// The host pid of the one process whose command line is `cmd` (a node's process, seen
/// from the host's pid namespace, which holds the local cluster's).
fn host_pid_of(cmd: &str) -> u32 {
    let found = eventually(cmd, Duration::from_secs(10), || {
        let v: Vec<u32> = host_processes_mentioning(cmd)
            .iter()
            .filter(|l| l.split_once(": ").is_some_and(|(_, c)| c.trim_end() == cmd))
            .filter_map(|l| l.split_once(':')?.0.parse().ok())
            .collect();
        (v.len() == 1).then(|| v[0])
    });
    found
}

/// The host pid of node `n`'s init (pid 1 of its pid namespace).
fn node_init(c: &Cluster, n: u32) -> u32 {
    std::fs::read_to_string(c.node_dir(n).join("init.pid"))
        .expect("init.pid")
        .trim()
        .parse()
        .expect("init pid")
}

/// Starts `argv` as user `uid` with `clan run -d` on node `n`; its gpid.
fn spawn_as(c: &Cluster, uid: u32, n: u32, argv: &[&str]) -> Gpid {
    let clan = bin("clan");
    let dir = format!("CLAN_DIR={}", c.dir.display());
    let node = n.to_string();
    let mut args = vec![
        "env",
        &dir,
        clan.to_str().expect("utf-8"),
        "run",
        "-d",
        "--node",
        &node,
        "--",
    ];
    args.extend_from_slice(argv);
    let o = as_user(uid, &args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .expect("gpid")
}

/// Regression: a handle on a process that has exited never shows the process that took
/// its pid. An open file read again from its start gives ESRCH (the kernel's answer), and
/// a directory handle opens nothing of the new process; a path looked up afresh finds the
/// new one.
#[test]
fn handles_of_an_exited_process_never_show_the_one_that_reuses_its_pid() {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::fd::AsRawFd;
    root_or_skip!("handles_of_an_exited_process_never_show_the_one_that_reuses_its_pid");
    let c = Cluster::up(2);
    let g = c.spawn(2, &["sleep", "600"]);
    let m = Mounted::new(&c);
    let mut held = std::fs::File::open(m.path(&format!("{g}/status"))).expect("open status");
    let mut s = String::new();
    held.read_to_string(&mut s).expect("read status");
    assert!(s.contains(&format!("\nPid:\t{g}\n")), "{s}");
    let dir = std::fs::File::open(m.path(&g.to_string())).expect("open the directory");
    c.clan_ok(&["kill", "-s", "KILL", &g.to_string()]);
    c.clan(&["wait", &g.to_string()]);
    // A process of node 2 that takes the pid again: its parent sets the namespace's last
    // pid just below it and forks until its child has it.
    let script = "import os, signal, sys\n\
        want = int(sys.argv[1])\n\
        for _ in range(1000):\n\
        \x20   with open('/proc/sys/kernel/ns_last_pid', 'w') as f: f.write(str(want - 1))\n\
        \x20   pid = os.fork()\n\
        \x20   if pid == 0: os.execvp('sleep', ['sleep', '601'])\n\
        \x20   if pid == want: break\n\
        \x20   os.kill(pid, signal.SIGKILL); os.waitpid(pid, 0)\n\
        os.waitpid(pid, 0)\n";
    c.spawn(2, &["python3", "-c", script, &g.local().to_string()]);
    eventually("the pid taken again", Duration::from_secs(20), || {
        let cmd = std::fs::read(m.path(&format!("{g}/cmdline"))).ok()?;
        (cmd == b"sleep\x00601\x00").then_some(())
    });
    // The open file of the exited process: ESRCH, not the new process's status.
    held.seek(SeekFrom::Start(0)).expect("seek");
    let mut buf = [0u8; 4096];
    match held.read(&mut buf) {
        Ok(n) => panic!(
            "the old file read the new process: {}",
            String::from_utf8_lossy(&buf[..n])
        ),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ESRCH), "{e}"),
    }
    // The old directory handle: no file of the new process through it (the kernel says
    // ENOENT; FUSE answers EIO itself on an inode it has replaced by the new process's).
    let opened = nix::fcntl::openat(
        Some(dir.as_raw_fd()),
        "status",
        nix::fcntl::OFlag::O_RDONLY,
        nix::sys::stat::Mode::empty(),
    );
    match opened {
        Ok(fd) => {
            // SAFETY: openat just returned this descriptor and nothing else owns it.
            let mut f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
            let mut s = String::new();
            let _ = f.read_to_string(&mut s);
            panic!("the old directory opened the new process's status: {s}");
        }
        Err(e) => assert!(
            matches!(e, nix::errno::Errno::ENOENT | nix::errno::Errno::EIO),
            "{e}"
        ),
    }
    // A path looked up afresh is the new process.
    let s = m.read(&format!("{g}/status"));
    assert!(s.contains(&format!("\nPid:\t{g}\n")), "{s}");
    let cmd = std::fs::read(m.path(&format!("{g}/cmdline"))).expect("cmdline");
    assert_eq!(cmd, b"sleep\x00601\x00");
}

/// Regression: a node whose /proc hides other users' processes (hidepid=2) hides them
/// through the view too, at once: a lookup or listing by another user right after root's
/// (which the kernel and the server cached for a second) does not find root's process.
#[test]
fn hidepid_of_a_node_hides_other_users_processes_at_once() {
    root_or_skip!("hidepid_of_a_node_hides_other_users_processes_at_once");
    let c = Cluster::up(2);
    let b = test_user("clanpfsb");
    let init = node_init(&c, 2).to_string();
    let o = Command::new("nsenter")
        .args([
            "-t",
            &init,
            "-m",
            "--",
            "mount",
            "-o",
            "remount,hidepid=2",
            "/proc",
        ])
        .output()
        .expect("nsenter");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let roots = c.spawn(2, &["sleep", "600"]);
    let theirs = spawn_as(&c, b, 2, &["sleep", "601"]);
    // The node's kernel hides root's process from the user, not the user's own.
    let o = Command::new("nsenter")
        .args(["-t", &init, "-m", "--", "setpriv"])
        .arg(format!("--reuid={b}"))
        .arg(format!("--regid={b}"))
        .args(["--clear-groups", "ls", "/proc"])
        .output()
        .expect("nsenter");
    let native = String::from_utf8_lossy(&o.stdout).to_string();
    let native: Vec<&str> = native.split_whitespace().collect();
    assert!(
        !native.contains(&roots.local().to_string().as_str()),
        "{native:?}"
    );
    assert!(
        native.contains(&theirs.local().to_string().as_str()),
        "{native:?}"
    );
    let m = Mounted::new(&c);
    std::fs::set_permissions(&m.dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).ok();
    let listed = |who: &str| -> Vec<u64> {
        std::fs::read_dir(&m.dir)
            .unwrap_or_else(|e| panic!("list the view as {who}: {e}"))
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect()
    };
    for _ in 0..3 {
        // Root lists, looks up and reads: the entry is in the kernel's cache, the
        // snapshot in the server's.
        assert!(listed("root").contains(&roots.raw()));
        assert!(std::fs::metadata(m.path(&roots.to_string())).is_ok());
        assert!(m.read(&format!("{roots}/status")).contains("sleep"));
        // At once, the user (this thread, with the user's ids).
        let gid = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(b))
            .ok()
            .flatten()
            .map_or(b, |u| u.gid.as_raw());
        let acting = clan_core::sys::ActingAs::user(b, gid, &[]).expect("act as the user");
        let seen = std::fs::metadata(m.path(&roots.to_string()));
        let read = std::fs::read(m.path(&format!("{roots}/status")));
        let names = listed("the user");
        let own = std::fs::metadata(m.path(&theirs.to_string()));
        drop(acting);
        assert_eq!(
            seen.map(|_| ()).map_err(|e| e.kind()),
            Err(ErrorKind::NotFound),
            "the user found root's process"
        );
        assert!(read.is_err(), "the user read root's process's status");
        assert!(
            !names.contains(&roots.raw()),
            "listed for the user: {names:?}"
        );
        assert!(names.contains(&theirs.raw()), "{names:?}");
        assert!(own.is_ok(), "the user's own process: {own:?}");
    }
}

/// Regression: root without CAP_SYS_PTRACE (or other capabilities) is not privileged by
/// its uid: through the view it may read what the kernel lets it read natively, no more
/// (a process's `cwd`, `io`, `environ`, `fd/` of another user's process and of root's).
#[test]
fn root_without_capabilities_reads_what_the_kernel_lets_it() {
    root_or_skip!("root_without_capabilities_reads_what_the_kernel_lets_it");
    let c = Cluster::up(2);
    let a = test_user("clanpfsa");
    let theirs = spawn_as(&c, a, 2, &["sleep", "611"]);
    let roots = c.spawn(2, &["sleep", "612"]);
    let m = Mounted::new(&c);
    let probe = |drop: &str, dir: &str| -> String {
        let script = format!(
            "for f in environ io stat; do cat {dir}/$f >/dev/null 2>&1 && echo $f:read || echo $f:refused; done; \
             readlink {dir}/cwd >/dev/null 2>&1 && echo cwd:read || echo cwd:refused; \
             ls {dir}/fd >/dev/null 2>&1 && echo fd:read || echo fd:refused"
        );
        let o = Command::new("setpriv")
            .arg(format!("--inh-caps={drop}"))
            .arg(format!("--bounding-set={drop}"))
            .args(["sh", "-c", &script])
            .stdin(Stdio::null())
            .output()
            .expect("setpriv");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let mut refused = 0;
    for (g, cmd) in [(theirs, "sleep 611"), (roots, "sleep 612")] {
        let host = host_pid_of(cmd);
        for drop in ["-sys_ptrace", "-sys_ptrace,-sys_admin,-perfmon", "-all"] {
            let native = probe(drop, &format!("/proc/{host}"));
            let view = probe(drop, &m.path(&g.to_string()).to_string_lossy());
            assert_eq!(
                view, native,
                "{cmd} without {drop}: the view, then the kernel"
            );
            refused += native.matches("refused").count();
        }
        // With every capability, root reads them all.
        let full = probe("+all", &m.path(&g.to_string()).to_string_lossy());
        assert!(!full.contains("refused"), "{cmd}: {full}");
    }
    assert!(
        refused > 0,
        "the kernel refused nothing: the test proves nothing"
    );
}

/// Regression: the inode tables of a process's paths are bounded: the numbers of the
/// paths of threads that exited are given back once the kernel has forgotten them (FUSE
/// forget), while the paths of a live thread keep their numbers. Watched as `top -H` does
/// it, over a process that starts and ends threads without pause.
#[test]
fn paths_of_exited_threads_are_forgotten_and_live_ones_keep_their_numbers() {
    use std::os::unix::fs::MetadataExt;
    root_or_skip!("paths_of_exited_threads_are_forgotten_and_live_ones_keep_their_numbers");
    let c = Cluster::up(2);
    let g = c.spawn(
        2,
        &[
            "python3",
            "-c",
            // Four threads alive at any time, each for a moment: a listing always finds
            // some (one started and joined at once is seldom caught on a busy machine).
            "import threading, time\nts = []\nwhile True:\n    t = threading.Thread(target=time.sleep, args=(0.02,))\n    t.start()\n    ts.append(t)\n    if len(ts) >= 4:\n        ts.pop(0).join()\n",
        ],
    );
    let m = Mounted::new(&c);
    /// The index of a path inside its process (the low 20 bits of its number).
    fn index(p: &Path) -> Option<u64> {
        std::fs::metadata(p)
            .ok()
            .map(|md| md.ino() & ((1 << 20) - 1))
    }
    let main = m.path(&format!("{g}/task/{g}/stat"));
    let main_ino = std::fs::metadata(&main).expect("the main thread").ino();
    // One round of top -H: list the threads, look at each one's stat. Returns the
    // threads other than the main one, with the indices of their paths.
    let round = || -> Vec<(String, u64)> {
        let mut v = Vec::new();
        for e in std::fs::read_dir(m.path(&format!("{g}/task")))
            .into_iter()
            .flatten()
            .flatten()
        {
            let tid = e.file_name().to_string_lossy().into_owned();
            if tid != g.to_string() {
                let i = index(&m.path(&format!("{g}/task/{tid}/stat")));
                v.extend(i.map(|i| (tid, i)));
            }
        }
        v
    };
    // Threads enough that their paths (two each: its directory and its stat) would
    // outnumber the slack below had no number been given back.
    let mut threads = std::collections::HashSet::new();
    let t0 = std::time::Instant::now();
    while threads.len() < 300 {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "only {} threads seen in two minutes",
            threads.len()
        );
        threads.extend(round().into_iter().map(|(tid, _)| tid));
    }
    // New threads' paths get numbers given back, not ever higher ones. The kernel lets go
    // of what it no longer uses (it would under memory pressure) and tells the server
    // (FUSE forget) a moment later: each try drops the caches again, so the paths of the
    // tries before are forgotten too, however busy the machine.
    eventually("numbers given back", Duration::from_secs(30), || {
        std::fs::write("/proc/sys/vm/drop_caches", "2").expect("drop caches");
        round()
            .into_iter()
            .map(|(_, i)| i)
            .max()
            .filter(|&i| i < 4096 + 256)
    });
    assert_eq!(
        std::fs::metadata(&main).expect("the main thread").ino(),
        main_ino,
        "a live thread's number changed"
    );
}

/// A python on a node holding a pipe (both its ends), a socket and an eventfd, its output
/// the pipe to its `clan run -d` log; `tag` makes its command line its own.
fn holder_of_pipes(tag: u32) -> Vec<String> {
    vec![
        "/usr/bin/python3".into(),
        "-c".into(),
        format!(
            "import os, socket, time; r, w = os.pipe(); s = socket.socket(); \
             e = os.eventfd(0); time.sleep({tag})"
        ),
    ]
}

/// The host pid of the one process whose command line ends with `script` (python's
/// own path may differ from `python3`).
fn host_pid_running(script: &str) -> u32 {
    eventually(script, Duration::from_secs(10), || {
        let v: Vec<u32> = host_processes_mentioning(script)
            .iter()
            .filter(|l| l.trim_end().ends_with(&format!(" -c {script}")))
            .filter_map(|l| l.split_once(':')?.0.parse().ok())
            .collect();
        (v.len() == 1).then(|| v[0])
    })
}

/// `stat` of each path, as `uid` (root: 0) gets it: `mode ino uid gid size nlink`, or
/// `errno N`; one line per path.
fn stat_lines(uid: u32, paths: &[PathBuf]) -> Vec<String> {
    let mut argv = vec![
        "/usr/bin/python3".to_string(),
        "-c".into(),
        "import os, sys\n\
         for p in sys.argv[1:]:\n\
         \x20   try:\n\
         \x20       s = os.stat(p)\n\
         \x20       print(oct(s.st_mode), s.st_ino, s.st_uid, s.st_gid, s.st_size, s.st_nlink)\n\
         \x20   except OSError as e:\n\
         \x20       print('errno', e.errno)"
            .into(),
    ];
    argv.extend(paths.iter().map(|p| p.to_string_lossy().into_owned()));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let o = as_user(uid, &argv);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Regression: a descriptor's link to a pipe, socket or anonymous inode (`fd/1 ->
/// pipe:[123]`) could not be followed through the view: the kernel looks its target up
/// in `fd/`, which had no such name (ENOENT). `stat` through it now gives what the
/// kernel's magic link gives on the process's node (a FIFO or socket, the inode number of
/// the link's text, mode, owner, size, links), ENOENT for a target no descriptor has, the
/// native error for a reader who may not follow the process's links; an open is refused
/// with ENXIO (the pipe is on the process's node).
#[test]
fn stat_follows_a_descriptors_link_to_its_pipe_or_socket() {
    root_or_skip!("stat_follows_a_descriptors_link_to_its_pipe_or_socket");
    use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
    let c = Cluster::up(2);
    let m = Mounted::new(&c);
    std::fs::set_permissions(&m.dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).ok();
    let argv = holder_of_pipes(8301);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let g = c.spawn(2, &argv);
    let host = host_pid_running(argv[2]);
    // Its descriptors, through the view, once the eventfd is made (the last).
    let fd_dir = m.path(&format!("{g}/fd"));
    let links: Vec<(String, String)> = eventually("the eventfd", Duration::from_secs(20), || {
        let mut v: Vec<(String, String)> = std::fs::read_dir(&fd_dir)
            .ok()?
            .flatten()
            .filter_map(|e| {
                let t = std::fs::read_link(e.path()).ok()?;
                Some((
                    e.file_name().to_string_lossy().into_owned(),
                    t.to_string_lossy().into_owned(),
                ))
            })
            .collect();
        v.sort_by_key(|(n, _)| n.parse::<u32>().unwrap_or(u32::MAX));
        v.iter().any(|(_, t)| t.contains("eventfd")).then_some(v)
    });
    let with = |prefix: &str| -> Vec<&(String, String)> {
        links
            .iter()
            .filter(|(_, t)| t.starts_with(prefix))
            .collect()
    };
    // Its output (1 and 2, the log's pipe) and both ends of its own pipe.
    assert!(with("pipe:[").len() >= 3, "{links:?}");
    assert_eq!(with("socket:[").len(), 1, "{links:?}");
    let number = |t: &str| -> u64 {
        t.split_once('[')
            .and_then(|(_, n)| n.strip_suffix(']'))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no number in {t}"))
    };
    for (fd, target) in &links {
        let view = fd_dir.join(fd);
        let native = PathBuf::from(format!("/proc/{host}/fd/{fd}"));
        assert_eq!(
            std::fs::read_link(&native).unwrap().to_string_lossy(),
            *target
        );
        let a =
            std::fs::metadata(&view).unwrap_or_else(|e| panic!("stat -L {fd} -> {target}: {e}"));
        let n = std::fs::metadata(&native).unwrap();
        assert_eq!(
            (
                a.ino(),
                a.mode() & 0o7777,
                a.uid(),
                a.gid(),
                a.size(),
                a.nlink()
            ),
            (
                n.ino(),
                n.mode() & 0o7777,
                n.uid(),
                n.gid(),
                n.size(),
                n.nlink()
            ),
            "{fd} -> {target}"
        );
        if target.starts_with("pipe:[") {
            assert!(a.file_type().is_fifo(), "{fd} -> {target}");
            assert_eq!(a.ino(), number(target));
        } else if target.starts_with("socket:[") {
            assert!(a.file_type().is_socket(), "{fd} -> {target}");
            assert_eq!(a.ino(), number(target));
        } else if target.starts_with("anon_inode:") {
            // No type in the kernel; a FUSE file has one: a regular file.
            assert!(a.file_type().is_file(), "{fd} -> {target}");
        } else {
            assert_eq!(a.mode(), n.mode(), "{fd} -> {target}");
        }
        // Not opened: the kernel itself refuses a socket and an anonymous inode (ENXIO);
        // the pipe is on another node. (Non-blocking: a pipe of the mount that the kernel
        // would open on this machine could not hang the test.)
        if !target.starts_with('/') {
            let e = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&view)
                .expect_err(target);
            assert_eq!(e.raw_os_error(), Some(libc::ENXIO), "open {fd} -> {target}");
            if !target.starts_with("pipe:[") {
                let e = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(&native)
                    .expect_err(target);
                assert_eq!(e.raw_os_error(), Some(libc::ENXIO), "native open {target}");
            }
        }
    }
    // `test -p`, `stat -L` and `ls -lL` as tools run them.
    let (fd, pipe) = with("pipe:[")[0];
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "test -p {0}/{fd} && stat -L -c '%F %i' {0}/{fd} && ls -lL {0}",
            fd_dir.display()
        ))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        out.starts_with(&format!("fifo {}\n", number(pipe))),
        "{out}"
    );
    assert!(out.lines().any(|l| l.starts_with("prw-------")), "{out}");
    assert!(out.lines().any(|l| l.starts_with("srwxrwxrwx")), "{out}");
    // A target no descriptor has (pipes are never numbered 0): ENOENT.
    for name in ["pipe:[0]", "socket:[0]", "anon_inode:[nothing]"] {
        let e = std::fs::metadata(fd_dir.join(name)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{name}");
    }
    // A thread's descriptors are the process's.
    let (fd, _) = with("socket:[")[0];
    let t = std::fs::metadata(m.path(&format!("{g}/task/{g}/fd/{fd}"))).unwrap();
    assert!(t.file_type().is_socket());

    // A user: its own process's links are followed as natively; root's process's are
    // refused with the native error.
    let a = test_user("clanpfsa");
    let argv = holder_of_pipes(8302);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let own = spawn_as(&c, a, 2, &argv);
    let own_host = host_pid_running(argv[2]);
    let own_fd = m.path(&format!("{own}/fd"));
    let fds: Vec<String> = eventually("the user's eventfd", Duration::from_secs(20), || {
        let v: Vec<String> = std::fs::read_dir(&own_fd)
            .ok()?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.iter()
            .any(|n| {
                std::fs::read_link(own_fd.join(n))
                    .is_ok_and(|t| t.to_string_lossy().contains("eventfd"))
            })
            .then_some(v)
    });
    for (dir, native, fds) in [
        (own_fd.clone(), own_host, fds.clone()),
        (
            fd_dir.clone(),
            host,
            links.iter().map(|(n, _)| n.clone()).collect(),
        ),
    ] {
        let mut paths = Vec::new();
        for fd in &fds {
            paths.push(dir.join(fd));
            paths.push(PathBuf::from(format!("/proc/{native}/fd/{fd}")));
        }
        let lines = stat_lines(a, &paths);
        assert_eq!(lines.len(), paths.len(), "{lines:?}");
        for (i, pair) in lines.chunks(2).enumerate() {
            let (view, native) = (&pair[0], &pair[1]);
            if native.starts_with("0o") {
                // Types as FUSE has them (an anonymous inode: a regular file).
                let fields = |l: &str| l.split(' ').skip(1).map(str::to_string).collect::<Vec<_>>();
                assert_eq!(fields(view), fields(native), "{}", paths[2 * i].display());
            } else {
                assert_eq!(view, native, "{}", paths[2 * i].display());
            }
        }
        if dir == own_fd {
            assert!(lines.iter().all(|l| l.starts_with("0o")), "{lines:?}");
        } else {
            assert!(lines.iter().all(|l| l == "errno 13"), "{lines:?}");
        }
    }
    c.clan_ok(&["kill", "-s", "KILL", &own.to_string()]);
    c.clan_ok(&["kill", "-s", "KILL", &g.to_string()]);
}

/// The kernel's switch for FUSE over io_uring (Linux 6.14 and later).
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Whether this kernel has FUSE over io_uring; says that test `name` is skipped if not.
fn uring_or_skip(name: &str) -> bool {
    let there = Path::new(ENABLE_URING).exists();
    if !there {
        eprintln!(
            "skipped {name}: this kernel has no FUSE over io_uring ({ENABLE_URING} is missing)"
        );
    }
    there
}

/// The kernel's FUSE over io_uring switched on while this lives, then given back as it
/// was (also when the test panicked).
struct UringOn(String);

impl UringOn {
    fn new() -> UringOn {
        let was = std::fs::read_to_string(ENABLE_URING).expect("the switch");
        std::fs::write(ENABLE_URING, "Y").expect("switch FUSE over io_uring on");
        UringOn(was.trim().to_string())
    }
}

impl Drop for UringOn {
    fn drop(&mut self) {
        let _ = std::fs::write(ENABLE_URING, &self.0);
    }
}

/// Voluntary context switches of each of `pid`'s threads whose name starts with
/// `prefix`, by name (`fuser-ring-Q` for queue Q).
fn switches_of_threads(pid: i32, prefix: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).expect("the server's threads") {
        let t = t.expect("a thread").path();
        let name = std::fs::read_to_string(t.join("comm")).unwrap_or_default();
        let name = name.trim();
        if !name.starts_with(prefix) {
            continue;
        }
        let status = std::fs::read_to_string(t.join("status")).unwrap_or_default();
        let n = status_field(&status, "voluntary_ctxt_switches")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        out.push((name.to_string(), n));
    }
    out.sort();
    out
}

/// Per queue (thread name), the switches of its threads added up.
fn per_queue(threads: &[(String, u64)]) -> std::collections::BTreeMap<String, u64> {
    let mut m = std::collections::BTreeMap::new();
    for (name, n) in threads {
        *m.entry(name.clone()).or_insert(0) += n;
    }
    m
}

/// With the kernel's FUSE over io_uring on, the view is served over it: a ring thread per
/// CPU and queue (two each), each CPU's readers served by its own queue's threads, reads
/// the same as on /dev/fuse; the switch back off does not stop a mount that took it, and
/// the server ends at its unmount.
#[test]
fn the_view_serves_over_io_uring_when_the_kernel_offers_it() {
    root_or_skip!("the_view_serves_over_io_uring_when_the_kernel_offers_it");
    if !uring_or_skip("the_view_serves_over_io_uring_when_the_kernel_offers_it") {
        return;
    }
    let c = Cluster::up(3);
    let g = c.spawn(2, &["sleep", "600"]);
    let m = {
        let _on = UringOn::new();
        Mounted::new(&c)
    };
    let possible = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    let cpus: usize = possible
        .trim()
        .rsplit('-')
        .next()
        .and_then(|n| n.parse::<usize>().ok())
        .map_or(1, |n| n + 1);
    let file = m.path(&format!("{g}/status"));
    let status = std::fs::read_to_string(&file).expect("status through the ring");
    assert_eq!(
        status_field(&status, "Pid"),
        Some(g.to_string()),
        "{status}"
    );
    // Two ring threads per possible CPU, once a read came back (the kernel holds every
    // request until each queue has an entry, and the threads start after INIT's reply).
    let before = switches_of_threads(m.server, "fuser-ring-");
    assert_eq!(before.len(), 2 * cpus, "ring threads: {before:?}");
    let online = std::thread::available_parallelism().map_or(1, |n| n.get());
    for cpu in 0..cpus.min(online) {
        // Readers on this CPU: served by this CPU's queue, whose threads wake for them.
        let start = per_queue(&switches_of_threads(m.server, "fuser-ring-"));
        let out = Command::new("taskset")
            .args(["-c", &cpu.to_string(), "sh", "-c"])
            .arg(format!(
                "for i in $(seq 50); do cat {} > /dev/null || exit 1; done",
                file.display()
            ))
            .output()
            .expect("taskset");
        assert!(out.status.success(), "reads on CPU {cpu}: {out:?}");
        let end = per_queue(&switches_of_threads(m.server, "fuser-ring-"));
        let queue = format!("fuser-ring-{cpu}");
        let woke = end[&queue] - start[&queue];
        assert!(
            woke >= 50,
            "queue {cpu}'s threads woke {woke} times for 50 reads on CPU {cpu}: {start:?} -> {end:?}"
        );
    }
    // What it serves is what /dev/fuse serves: listings, links, another node's files.
    let listed: Vec<String> = std::fs::read_dir(&m.dir)
        .expect("a listing over the ring")
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(String::from))
        .collect();
    assert!(listed.contains(&g.to_string()), "{listed:?}");
    let stat = m.read(&format!("{g}/stat"));
    assert_eq!(parse_stat(&stat).0, g.raw(), "{stat}");
    assert!(m.read("loadavg").split(' ').count() >= 5);
    // An exited process is ENOENT over the ring too.
    kill_until_gone_from(&c, &m, g);
    // The unmount ends the server, rings and all.
    let server = m.server;
    c.clan_ok(&["proc", "umount", m.dir.to_str().unwrap()]);
    eventually("the server to end", Duration::from_secs(10), || {
        (!alive(server)).then_some(())
    });
}

/// Over io_uring a reader of a stopped server waits until the server answers or ends
/// (the kernel has handed its request to the server's ring): a SIGKILL does not end it (it
/// goes from S to D, where on /dev/fuse the kernel would drop a request not read yet), but
/// killing the server ends it at once with an error, and the watcher removes the mount.
/// That is what docs/proc.md says, and the way out it gives.
#[test]
fn killing_a_stopped_io_uring_server_frees_its_readers() {
    root_or_skip!("killing_a_stopped_io_uring_server_frees_its_readers");
    if !uring_or_skip("killing_a_stopped_io_uring_server_frees_its_readers") {
        return;
    }
    let c = Cluster::up(2);
    let m = {
        let _on = UringOn::new();
        Mounted::new(&c)
    };
    // A read first: the rings are up once one came back.
    assert!(m.read("loadavg").split(' ').count() >= 5);
    assert!(
        !switches_of_threads(m.server, "fuser-ring-").is_empty(),
        "the view is not served over io_uring"
    );
    let server = nix::unistd::Pid::from_raw(m.server);
    nix::sys::signal::kill(server, nix::sys::signal::Signal::SIGSTOP).unwrap();
    eventually(
        "every thread of the server stopped",
        Duration::from_secs(10),
        || {
            let tasks = std::fs::read_dir(format!("/proc/{}/task", m.server)).ok()?;
            tasks
                .flatten()
                .filter_map(|t| t.file_name().to_str()?.parse::<u32>().ok())
                .all(|tid| proc_state(tid) == Some('T'))
                .then_some(())
        },
    );
    // Two readers: one killed while it waits, one left alone.
    let mut readers: Vec<std::process::Child> = ["uptime", "loadavg"]
        .iter()
        .map(|f| {
            Command::new("cat")
                .arg(m.path(f))
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for r in &mut readers {
        let pid = r.id();
        // Waiting in FUSE: its kernel stack (root may read it) goes through fuse's functions.
        eventually(
            "a reader waiting for the server",
            Duration::from_secs(30),
            || {
                if let Some(st) = r.try_wait().unwrap() {
                    panic!("a reader of a stopped server ended: {st:?}");
                }
                std::fs::read_to_string(format!("/proc/{pid}/stack"))
                    .is_ok_and(|s| s.contains("fuse_"))
                    .then_some(())
            },
        );
    }
    let killed = readers[0].id();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(killed as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // The fatal signal leaves it waiting, now in D (on /dev/fuse it would be gone).
    eventually("the killed reader in D", Duration::from_secs(10), || {
        if let Some(st) = readers[0].try_wait().unwrap() {
            panic!("a SIGKILL ended a reader of a stopped io_uring server: {st:?}");
        }
        (proc_state(killed) == Some('D')).then_some(())
    });
    nix::sys::signal::kill(server, nix::sys::signal::Signal::SIGKILL).unwrap();
    let ends: Vec<_> = readers
        .iter_mut()
        .map(|r| {
            eventually("a reader's end", Duration::from_secs(10), || {
                r.try_wait().unwrap()
            })
        })
        .collect();
    assert_eq!(ends[0].signal(), Some(libc::SIGKILL), "{:?}", ends[0]);
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(readers[1].stderr.as_mut().unwrap(), &mut err);
    assert_eq!(ends[1].code(), Some(1), "{:?}: {err}", ends[1]);
    assert!(err.contains("loadavg"), "{err}");
    eventually(
        "the watcher to remove the mount",
        Duration::from_secs(10),
        || (!mounted(&m.dir)).then_some(()),
    );
}
