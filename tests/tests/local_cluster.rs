//! `clan up` and `clan down` themselves: what they refuse, what they remove and what they
//! leave alone (files and processes that are not the cluster's), relative directories,
//! crashed and interrupted clusters, bad options.

use clan_tests::*;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

macro_rules! root_or_skip {
    ($name:expr) => {
        if !need_root($name) {
            return;
        }
    };
}

/// A fast failure detector, as the other tests use.
const FAST: &[&str] = &["--heartbeat-ms", "200", "--dead-after-ms", "2000"];

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A directory of the test's own, removed with all in it when dropped (declare it before
/// the clusters in it, so that they go first).
struct Tmp(PathBuf);

impl Tmp {
    fn new(what: &str) -> Tmp {
        let seq = SEQ.fetch_add(1, Ordering::SeqCst);
        let d = std::env::temp_dir().join(format!("clan-lc-{}-{seq}-{what}", std::process::id()));
        std::fs::create_dir_all(&d).expect("test directory");
        Tmp(d)
    }
}

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A local cluster the test brought up in `dir` (absolute): dropped, `clan down` there and,
/// whatever that did, its cgroup tree killed and removed, also when the test failed.
struct Guard {
    dir: PathBuf,
    cgroup: Option<PathBuf>,
}

impl Guard {
    fn new(dir: &Path) -> Guard {
        let mut g = Guard {
            dir: dir.to_path_buf(),
            cgroup: None,
        };
        g.learn();
        g
    }

    /// Notes the cluster's cgroup once its cluster file exists.
    fn learn(&mut self) {
        if let (Some(name), Some(m)) = (name_of(&self.dir), cgroup2()) {
            self.cgroup = Some(m.join(format!("clan.{name}")));
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.dir.join("cluster.toml").exists() {
            let _ = clan(None, &["--dir", &self.dir.display().to_string(), "down"]);
        }
        if let Some(cg) = &self.cgroup {
            if cg.exists() {
                let _ = std::fs::write(cg.join("cgroup.kill"), "1");
                let _ = eventually_quiet(Duration::from_secs(5), || remove_tree(cg).ok());
            }
        }
    }
}

fn remove_tree(dir: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)?.flatten() {
        if e.file_type()?.is_dir() {
            remove_tree(&e.path())?;
        }
    }
    std::fs::remove_dir(dir)
}

/// Like `eventually`, without panicking (for cleanup).
fn eventually_quiet<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if std::time::Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `clan ARGS` run to completion in `cwd`, without CLAN_DIR (failing the test after two
/// minutes).
fn clan(cwd: Option<&Path>, args: &[&str]) -> Output {
    let mut c = Command::new(bin("clan"));
    c.args(args)
        .env_remove("CLAN_DIR")
        .env_remove("CLAN_NODE")
        .env("PATH", path_with_bins())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(d) = cwd {
        c.current_dir(d);
    }
    output_within_two_minutes(c.spawn().expect("run clan"), args)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `clan --dir DIR up --nodes N --base-port P EXTRA` from `cwd`, on other ports while the
/// ones found free are taken meanwhile.
fn up(cwd: Option<&Path>, dir: &str, n: u32, extra: &[&str]) -> Output {
    for _ in 0..5 {
        let port = free_ports(n).to_string();
        let ns = n.to_string();
        let mut args = vec!["--dir", dir, "up", "--nodes", &ns, "--base-port", &port];
        args.extend_from_slice(extra);
        let out = clan(cwd, &args);
        if out.status.success() || !text(&out.stderr).contains("is in use") {
            return out;
        }
    }
    panic!("no free ports for clan up");
}

fn up_ok(cwd: Option<&Path>, dir: &Path, n: u32) -> Output {
    let out = up(cwd, &dir.display().to_string(), n, FAST);
    assert!(
        out.status.success(),
        "clan up {} failed: {}",
        dir.display(),
        text(&out.stderr)
    );
    out
}

/// The cluster's name in `dir/cluster.toml`.
fn name_of(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join("cluster.toml"))
        .ok()?
        .lines()
        .find_map(|l| {
            l.strip_prefix("name = \"")
                .map(|v| v.trim_end_matches('"').to_string())
        })
}

/// The pid in `dir/nodeN/FILE`.
fn pid_in(dir: &Path, node: u32, file: &str) -> Option<i32> {
    std::fs::read_to_string(dir.join(format!("node{node}/{file}")))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// A host process known by pid and start time (not confused with a later one).
#[derive(Debug, Clone, Copy)]
struct Proc(i32, u64);

impl Proc {
    fn of(pid: i32) -> Proc {
        let (_, start) = clan_core::sys::state_and_start(pid as u32)
            .unwrap_or_else(|| panic!("process {pid} is gone"));
        Proc(pid, start)
    }

    fn lives(self) -> bool {
        clan_core::sys::lives(self.0 as u32, self.1)
    }

    fn wait_gone(self, what: &str) {
        eventually(what, Duration::from_secs(20), || {
            (!self.lives()).then_some(())
        });
    }
}

/// The daemons and namespace inits of the cluster in `dir`, and its view servers.
fn processes(dir: &Path, nodes: u32) -> Vec<Proc> {
    let mut v = Vec::new();
    for n in 1..=nodes {
        for f in ["cland.pid", "init.pid", "procfs.pid"] {
            if let Some(p) = pid_in(dir, n, f) {
                if clan_core::sys::state_and_start(p as u32).is_some() {
                    v.push(Proc::of(p));
                }
            }
        }
    }
    v
}

/// A crash of every node without cgroup.kill: its clands and namespace inits, found from
/// their pid files, killed with SIGKILL (their view servers, host processes in the node's
/// cgroup, live on). Returns once they are gone.
fn kill_clands_and_inits(dir: &Path, nodes: u32) {
    let mut killed = Vec::new();
    for n in 1..=nodes {
        for f in ["cland.pid", "init.pid"] {
            let pid = pid_in(dir, n, f).unwrap_or_else(|| panic!("node{n}/{f}"));
            let p = Proc::of(pid);
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            )
            .expect("SIGKILL");
            killed.push(p);
        }
    }
    for p in killed {
        p.wait_gone("a killed cland or init gone");
    }
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn up_refuses_a_foreign_directory_and_down_keeps_what_it_did_not_make() {
    root_or_skip!("up_refuses_a_foreign_directory_and_down_keeps_what_it_did_not_make");
    let t = Tmp::new("foreign");
    // Someone's directory, as /srv would be.
    let srv = t.0.join("srv");
    std::fs::create_dir_all(srv.join("sub")).unwrap();
    std::fs::write(srv.join("precious"), "data\n").unwrap();
    std::fs::write(srv.join("sub/file"), "more\n").unwrap();
    let out = up(None, &srv.display().to_string(), 1, FAST);
    let _gs = Guard::new(&srv);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("clan: ") && err.contains(&srv.display().to_string()),
        "{err}"
    );
    assert_eq!(
        entries(&srv),
        ["precious", "sub"],
        "clan up created something"
    );
    // `down` there finds no cluster and removes nothing.
    let out = clan(None, &["--dir", &srv.display().to_string(), "down"]);
    assert!(!out.status.success());
    assert_eq!(entries(&srv), ["precious", "sub"]);
    assert_eq!(
        std::fs::read_to_string(srv.join("precious")).unwrap(),
        "data\n"
    );
    assert!(srv.join("sub/file").exists());

    // A new directory (and its parent) made by up; a file put there after up survives down.
    let dir = t.0.join("new/cluster");
    up_ok(None, &dir, 2);
    let _g = Guard::new(&dir);
    std::fs::write(dir.join("marker"), "mine\n").unwrap();
    let out = clan(None, &["--dir", &dir.display().to_string(), "down"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("stopped 2 node(s)"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(
        entries(&dir),
        ["marker"],
        "down left its files or took mine"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("marker")).unwrap(),
        "mine\n"
    );
    // Now it holds only someone else's file: no cluster goes there.
    let out = up(None, &dir.display().to_string(), 1, FAST);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_eq!(entries(&dir), ["marker"]);
    // Emptied, it is used again, and down removes it as it is empty then.
    std::fs::remove_file(dir.join("marker")).unwrap();
    up_ok(None, &dir, 1);
    let out = clan(None, &["--dir", &dir.display().to_string(), "down"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!dir.exists(), "an empty cluster directory stays");
    assert!(t.0.join("new").exists());
}

#[test]
fn a_pid_file_naming_an_unrelated_process_is_not_trusted() {
    root_or_skip!("a_pid_file_naming_an_unrelated_process_is_not_trusted");
    let t = Tmp::new("stale");
    let dir = t.0.join("c");
    up_ok(None, &dir, 2);
    let _g = Guard::new(&dir);
    let sleeper = KillOnDrop(
        Command::new("sleep")
            .arg("1000")
            .stdin(Stdio::null())
            .spawn()
            .expect("sleep"),
    );
    let sp = sleeper.0.id() as i32;
    let stranger = Proc::of(sp);
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap()
        .trim()
        .to_string();
    // As after a reboot: the pid files name a process that is not the cluster's. Node 1's
    // record says the process with that pid started at another time, or in another boot;
    // node 2's files are as an older cland wrote them, a pid alone.
    let point_at_stranger = || {
        for n in 1..=2 {
            for f in ["cland", "init"] {
                std::fs::write(dir.join(format!("node{n}/{f}.pid")), format!("{sp}\n")).unwrap();
            }
        }
        std::fs::write(
            dir.join("node1/cland.start"),
            format!("{sp} {} {boot}\n", stranger.1 + 1),
        )
        .unwrap();
        std::fs::write(
            dir.join("node1/init.start"),
            format!("{sp} {} 00000000-0000-0000-0000-000000000000\n", stranger.1),
        )
        .unwrap();
        for f in ["cland", "init"] {
            let _ = std::fs::remove_file(dir.join(format!("node2/{f}.start")));
        }
    };
    kill_clands_and_inits(&dir, 2);
    point_at_stranger();
    // `up` does not take the stranger for a running cluster, nor kills it.
    up_ok(None, &dir, 2);
    assert!(stranger.lives(), "clan up killed an unrelated process");
    let new = pid_in(&dir, 1, "cland.pid").unwrap();
    assert_ne!(new, sp);
    // `down` neither.
    kill_clands_and_inits(&dir, 2);
    point_at_stranger();
    let out = clan(None, &["--dir", &dir.display().to_string(), "down"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("stopped 0 node(s)"),
        "{}",
        text(&out.stdout)
    );
    assert!(stranger.lives(), "clan down killed an unrelated process");
    assert!(!dir.exists());
}

#[test]
fn relative_dirs_from_different_cwds_are_different_clusters() {
    root_or_skip!("relative_dirs_from_different_cwds_are_different_clusters");
    let t = Tmp::new("rel");
    let (a, b) = (t.0.join("a"), t.0.join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let out_a = up(Some(&a), "rel", 1, FAST);
    assert!(out_a.status.success(), "{}", text(&out_a.stderr));
    let _ga = Guard::new(&a.join("rel"));
    let out_b = up(Some(&b), "rel", 1, FAST);
    assert!(out_b.status.success(), "{}", text(&out_b.stderr));
    let _gb = Guard::new(&b.join("rel"));
    // It says where, in full.
    let full_a = a.canonicalize().unwrap().join("rel");
    assert!(
        text(&out_a.stdout).contains(&format!("up in {} ", full_a.display())),
        "{}",
        text(&out_a.stdout)
    );
    let (na, nb) = (
        name_of(&a.join("rel")).unwrap(),
        name_of(&b.join("rel")).unwrap(),
    );
    assert_ne!(na, nb, "two clusters with one cgroup name");
    let cland_a = Proc::of(pid_in(&a.join("rel"), 1, "cland.pid").unwrap());
    let cland_b = Proc::of(pid_in(&b.join("rel"), 1, "cland.pid").unwrap());
    let cg = |p: Proc| std::fs::read_to_string(format!("/proc/{}/cgroup", p.0)).unwrap();
    assert!(
        cg(cland_a).contains(&format!("/clan.{na}/node1/")),
        "{}",
        cg(cland_a)
    );
    assert!(
        cg(cland_b).contains(&format!("/clan.{nb}/node1/")),
        "{}",
        cg(cland_b)
    );
    // Down of one, as it was brought up, leaves the other running.
    let out = clan(Some(&a), &["--dir", "rel", "down"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!cland_a.lives());
    assert!(!a.join("rel").exists());
    assert!(cland_b.lives(), "down of one cluster stopped the other");
    let out = clan(Some(&b), &["--dir", "rel", "nodes"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(" up "), "{}", text(&out.stdout));
    if let Some(m) = cgroup2() {
        assert!(m.join(format!("clan.{nb}/node1")).exists());
        assert!(!m.join(format!("clan.{na}")).exists());
    }
}

#[test]
fn up_over_a_crashed_cluster_starts_afresh() {
    root_or_skip!("up_over_a_crashed_cluster_starts_afresh");
    let t = Tmp::new("crashed");
    let dir = t.0.join("c");
    up_ok(None, &dir, 2);
    let _g = Guard::new(&dir);
    let d = dir.display().to_string();
    let out = clan(
        None,
        &[
            "--dir", &d, "run", "-d", "--node", "2", "--", "sleep", "1000",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The view servers (where FUSE is) run beside the nodes, in their cgroups but not in
    // their pid namespaces: killing a node's init leaves them. Wait until both are there.
    if Path::new("/dev/fuse").exists() {
        eventually("the view servers", Duration::from_secs(20), || {
            (1..=2)
                .all(|n| pid_in(&dir, n, "procfs.pid").is_some())
                .then_some(())
        });
    }
    let old = processes(&dir, 2);
    assert!(old.len() >= 4, "{old:?}");
    std::fs::write(dir.join("node2/loadmgr.json"), "{\"stale\": true}\n").unwrap();
    std::fs::write(dir.join("node1/stale-state"), "old\n").unwrap();
    kill_clands_and_inits(&dir, 2);
    let out = up_ok(None, &dir, 2);
    assert!(text(&out.stdout).contains("2 nodes up"));
    for p in &old {
        assert!(!p.lives(), "{p:?} of the crashed cluster lives on");
    }
    assert!(!dir.join("node1/stale-state").exists());
    assert!(!dir.join("node2/loadmgr.json").exists());
    // The new nodes work, in fresh cgroup subtrees.
    let out = clan(
        None,
        &["--dir", &d, "run", "--node", "2", "--", "echo", "fresh"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "fresh\n");
    let out = clan(None, &["--dir", &d, "down"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!dir.exists());
}

#[test]
fn bad_options_exit_2_and_create_nothing() {
    root_or_skip!("bad_options_exit_2_and_create_nothing");
    let t = Tmp::new("bad");
    let empty = t.0.join("empty");
    std::fs::create_dir(&empty).unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["-n", "0"], "--nodes 0"),
        (&["-n", "300"], "--nodes 300"),
        (&["--heartbeat-ms", "0"], "--heartbeat-ms"),
        (
            &["--heartbeat-ms", "200", "--dead-after-ms", "100"],
            "--dead-after-ms 100",
        ),
        (&["-n", "4", "--base-port", "65533"], "--base-port 65533"),
        (&["--workers", "0"], "--workers 0"),
    ];
    for (i, (args, flag)) in cases.iter().enumerate() {
        for dir in [t.0.join(format!("new{i}")), empty.clone()] {
            let d = dir.display().to_string();
            let mut all = vec!["--dir", &d, "up"];
            all.extend_from_slice(args);
            let out = clan(None, &all);
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "clan {all:?}: {err}");
            assert_eq!(err.lines().count(), 1, "clan {all:?}: {err}");
            assert!(
                err.starts_with("clan: ") && err.contains(flag),
                "clan {all:?}: {err:?} lacks {flag:?}"
            );
            assert!(!err.contains("cluster.toml"), "{err}");
        }
        assert!(!t.0.join(format!("new{i}")).exists(), "{args:?} made DIR");
        assert!(entries(&empty).is_empty(), "{args:?} wrote in DIR");
    }
}

#[test]
fn an_interrupted_up_stops_what_it_started() {
    root_or_skip!("an_interrupted_up_stops_what_it_started");
    let t = Tmp::new("int");
    for (sig, code) in [
        (nix::sys::signal::Signal::SIGINT, 130),
        (nix::sys::signal::Signal::SIGTERM, 143),
    ] {
        // A try whose clan up was done before node 2 held still had nothing to interrupt.
        let mut tries = 0;
        let (dir, g) = loop {
            tries += 1;
            let dir = t.0.join(format!("c{code}-{tries}"));
            let d = dir.display().to_string();
            let mut g = Guard::new(&dir);
            let port = free_ports(2).to_string();
            let mut args = vec!["--dir", &d, "up", "-n", "2", "--base-port", &port];
            args.extend_from_slice(FAST);
            let mut up = KillOnDrop(
                Command::new(bin("clan"))
                    .args(&args)
                    .env_remove("CLAN_DIR")
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("clan up"),
            );
            // Node 2's cland holds still as soon as it is there, so the cluster is not ready
            // while clan up waits for it.
            let clands: Vec<Proc> = (1..=2)
                .map(|n| {
                    eventually("the node's cland", Duration::from_secs(20), || {
                        let p = pid_in(&dir, n, "cland.pid")?;
                        let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).ok()?;
                        (comm.trim() == "cland").then(|| Proc::of(p))
                    })
                })
                .collect();
            g.learn();
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(clands[1].0),
                nix::sys::signal::Signal::SIGSTOP,
            )
            .unwrap();
            if tries < 5 && up.0.try_wait().expect("wait for clan up").is_some() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(clands[1].0),
                    nix::sys::signal::Signal::SIGCONT,
                );
                let _ = Command::new(bin("clan"))
                    .args(["--dir", &d, "down"])
                    .env_remove("CLAN_DIR")
                    .stdin(Stdio::null())
                    .output();
                continue;
            }
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(up.0.id() as i32), sig).unwrap();
            let status = eventually("clan up to end", Duration::from_secs(90), || {
                up.0.try_wait().expect("wait for clan up")
            });
            let mut err = String::new();
            up.0.stderr
                .take()
                .expect("stderr")
                .read_to_string(&mut err)
                .unwrap();
            assert_eq!(status.code(), Some(code), "{sig}: {err}");
            assert!(err.contains("interrupted"), "{err}");
            for p in &clands {
                assert!(!p.lives(), "{p:?} lives on after {sig}");
            }
            break (dir, g);
        };
        assert!(!dir.exists(), "{} left behind", dir.display());
        if let Some(cg) = &g.cgroup {
            assert!(!cg.exists(), "{} left behind", cg.display());
        }
    }
}

/// Each node daemon runs the worker threads `clan up --workers` gives it, else its share of
/// the machine's CPUs (one at least, two at most), written in its entry of the cluster file.
/// Each cland says at start how many its runtime has.
#[test]
fn nodes_run_the_workers_they_are_given() {
    root_or_skip!("nodes_run_the_workers_they_are_given");
    let said = |c: &Cluster, n: u32| -> Option<usize> {
        let log = std::fs::read_to_string(c.node_dir(n).join("cland.log")).ok()?;
        log.lines().rev().find_map(|l| {
            let (_, rest) = l.split_once("runtime of ")?;
            rest.split_whitespace().next()?.parse().ok()
        })
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let c = Cluster::up_with(3, &["--heartbeat-ms", "200", "--dead-after-ms", "2000"]);
    for n in 1..=3 {
        assert_eq!(said(&c, n), Some((cpus / 3).clamp(1, 2)), "node {n}");
    }
    drop(c);
    let c = Cluster::up_with(
        2,
        &[
            "--heartbeat-ms",
            "200",
            "--dead-after-ms",
            "2000",
            "--workers",
            "3",
        ],
    );
    for n in 1..=2 {
        assert_eq!(said(&c, n), Some(3), "node {n}");
    }
    assert!(std::fs::read_to_string(c.dir.join("cluster.toml"))
        .unwrap()
        .contains("workers = 3"));
}

/// `clan down` takes the cluster /proc mounts of its cluster away (their servers asked to
/// stop, each unmounting its view) and leaves another cluster's mount alone.
#[test]
fn down_takes_the_clusters_proc_mounts_away() {
    root_or_skip!("down_takes_the_clusters_proc_mounts_away");
    let t = Tmp::new("views");
    let (a, b) = (t.0.join("a"), t.0.join("b"));
    up_ok(None, &a, 2);
    let _ga = Guard::new(&a);
    up_ok(None, &b, 1);
    let _gb = Guard::new(&b);
    let (pa, pb) = (t.0.join("view-a"), t.0.join("view-b"));
    // Whatever happens, nothing stays mounted under the test's directory.
    struct Unmount(Vec<PathBuf>);
    impl Drop for Unmount {
        fn drop(&mut self) {
            for p in &self.0 {
                let _ = nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH);
            }
        }
    }
    let _unmount = Unmount(vec![pa.clone(), pb.clone()]);
    // a's view served by its node 2 (`--from`: the server gets `--node 2`).
    for (dir, point, from) in [(&a, &pa, "2"), (&b, &pb, "1")] {
        std::fs::create_dir_all(point).unwrap();
        let out = clan(
            None,
            &[
                "--dir",
                &dir.display().to_string(),
                "--from",
                from,
                "proc",
                "mount",
                &point.display().to_string(),
            ],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let mounted = |p: &Path| {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let want = p.display().to_string();
        info.lines()
            .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
    };
    assert!(mounted(&pa) && mounted(&pb));
    let out = clan(None, &["--dir", &a.display().to_string(), "down"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!mounted(&pa), "a's view is still mounted after a's down");
    assert!(
        host_processes_mentioning(&format!("-- {}", pa.display())).is_empty(),
        "a's view server still runs"
    );
    // b's view still serves b.
    assert!(mounted(&pb));
    assert!(std::fs::read_to_string(pb.join("loadavg")).is_ok_and(|l| !l.is_empty()));
    let out = clan(None, &["--dir", &b.display().to_string(), "down"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!mounted(&pb));
}
