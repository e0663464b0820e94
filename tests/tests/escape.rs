//! Jobs against processes that try to get away (issue 4, tests): escapes from a job's task,
//! shells inside a suspended job, suspension of a job that forks all the time and of a job
//! that burns CPU. Real processes on local clusters, checked against the kernel (/proc and
//! the task cgroups), not only against what clan says.

use clan_tests::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

macro_rules! root_or_skip {
    ($name:expr) => {
        if !need_root($name) {
            return;
        }
    };
}

/// How long anything this file waits for may take.
const LIMIT: Duration = Duration::from_secs(30);

fn describe(o: &Output) -> String {
    format!(
        "{:?}; stdout: {}; stderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout).trim(),
        String::from_utf8_lossy(&o.stderr).trim()
    )
}

/// A local test user, for setpriv.
#[derive(Clone, Copy)]
struct User {
    uid: u32,
    gid: u32,
}

fn user(name: &str) -> User {
    let uid = test_user(name);
    let gid = nix::unistd::User::from_uid(uid.into())
        .ok()
        .flatten()
        .map(|u| u.gid.as_raw())
        .unwrap_or(uid);
    User { uid, gid }
}

/// `clan ARGS` run as `who` (setpriv, no supplementary groups) from /tmp, so that what it
/// starts runs as that user; timeout(1) keeps a hang from eating the run.
fn clan_as(c: &Cluster, who: User, args: &[&str]) -> Output {
    Command::new("timeout")
        .arg("120")
        .arg("setpriv")
        .arg(format!("--reuid={}", who.uid))
        .arg(format!("--regid={}", who.gid))
        .arg("--clear-groups")
        .arg(bin("clan"))
        .args(args)
        .env("CLAN_DIR", &c.dir)
        .env_remove("CLAN_NODE")
        .env(
            "PATH",
            format!("{}:/usr/local/bin:/usr/bin:/bin", bin_dir().display()),
        )
        .current_dir("/tmp")
        .stdin(Stdio::null())
        .output()
        .expect("timeout setpriv clan")
}

/// What a successful `clan run -d` printed: the gpids (stdout, one per copy) and the job
/// (stderr: "job J on node(s) ...").
fn started(o: &Output, what: &str) -> (Vec<u64>, String) {
    assert!(o.status.success(), "{what}: {}", describe(o));
    let gpids = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            l.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{what}: no gpid in {}", describe(o)))
        })
        .collect();
    let job = String::from_utf8_lossy(&o.stderr)
        .split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("{what}: no job in {}", describe(o)))
        .to_string();
    (gpids, job)
}

/// Polls `f` like `eventually`, but gives up with `None` instead of panicking, for checks
/// that go on to report everything they found.
fn within<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A host process as the kernel shows it.
#[derive(Debug, Clone)]
struct HostProc {
    pid: u32,
    argv: Vec<String>,
    state: char,
    ppid: u32,
    pgid: u32,
    sid: u32,
    uid: u32,
    /// Its cgroup v2 path (the `0::` line of /proc/PID/cgroup).
    cgroup: String,
}

fn host_proc(pid: u32) -> Option<HostProc> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let argv = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_string))
        .unwrap_or_default();
    Some(HostProc {
        pid,
        argv,
        state: f.first()?.chars().next()?,
        ppid: f.get(1)?.parse().ok()?,
        pgid: f.get(2)?.parse().ok()?,
        sid: f.get(3)?.parse().ok()?,
        uid,
        cgroup,
    })
}

fn host_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
        .collect()
}

/// Live host processes whose command line is two words, the second `mark` (`sleep 3001`,
/// `/bin/sleep 3007`, `b3011 3011`).
fn live_with_mark(mark: &str) -> Vec<HostProc> {
    host_pids()
        .into_iter()
        .filter_map(host_proc)
        .filter(|p| p.state != 'Z' && p.argv.len() == 2 && p.argv[1] == mark)
        .collect()
}

/// Signals a host process ignores (SigIgn of /proc/PID/status).
fn ignored_signals(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("SigIgn:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

fn sig_bit(sig: i32) -> u64 {
    1 << (sig - 1)
}

/// The directory of job `job`'s task on `node`.
fn task_dir(c: &Cluster, node: u32, job: &str) -> PathBuf {
    c.cgroup()
        .expect("a cluster cgroup")
        .join(format!("node{node}/job{job}"))
}

/// The directory of the pids cgroup of host process `pid`: in cgroup v2 when the pids
/// controller is there, else in its v1 hierarchy.
fn pids_cgroup_dir(pid: u32) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount_of = |v1: bool| -> Option<PathBuf> {
        info.lines().find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let mut post = post.split_whitespace();
            let fstype = post.next()?;
            let ok = if v1 {
                fstype == "cgroup" && post.nth(1)?.split(',').any(|o| o == "pids")
            } else {
                fstype == "cgroup2"
            };
            ok.then(|| PathBuf::from(pre.split_whitespace().nth(4).unwrap_or("/")))
        })
    };
    for l in text.lines() {
        let mut f = l.splitn(3, ':');
        let (_, ctls, path) = (f.next()?, f.next()?, f.next()?);
        if ctls.split(',').any(|c| c == "pids") {
            return Some(mount_of(true)?.join(path.trim_start_matches('/')));
        }
    }
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = mount_of(false)?.join(rel.trim_start_matches('/'));
    dir.join("pids.max").exists().then_some(dir)
}

/// The cgroup path (as /proc/PID/cgroup shows it) of job `job`'s task on `node`.
fn task_cgroup_path(c: &Cluster, node: u32, job: &str) -> String {
    let dir = task_dir(c, node, job);
    let mount = cgroup2().expect("cgroup2");
    format!(
        "/{}",
        dir.strip_prefix(&mount).expect("under the mount").display()
    )
}

/// The host pids in a task's cgroup, as a set.
fn task_procs(c: &Cluster, node: u32, job: &str) -> BTreeSet<u32> {
    std::fs::read_to_string(task_dir(c, node, job).join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// `key` of a task's `cgroup.events` (`frozen`, `populated`).
fn task_event(c: &Cluster, node: u32, job: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(task_dir(c, node, job).join("cgroup.events")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key} ")).map(str::to_string))
}

/// `usage_usec` of a task's `cpu.stat`: the CPU time of all its processes, dead or alive.
fn task_cpu_usec(c: &Cluster, node: u32, job: &str) -> u64 {
    std::fs::read_to_string(task_dir(c, node, job).join("cpu.stat"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("usage_usec "))
                .and_then(|v| v.trim().parse().ok())
        })
        .expect("cpu.stat usage_usec of the task")
}

/// `clan ps -o json --job J --node N` asked of node N's own cland, so that a node busy
/// listing many processes is not reported as silent by another node; must succeed.
fn ps_job(c: &Cluster, node: u32, job: &str) -> Vec<Value> {
    let n = node.to_string();
    let args = ["--from", &n, "ps", "-o", "json", "--job", job, "--node", &n];
    let out = c.clan(&args);
    assert!(out.status.success(), "clan {args:?}: {}", describe(&out));
    serde_json::from_slice::<Value>(&out.stdout)
        .unwrap_or_else(|e| panic!("clan {args:?}: {e}: {}", describe(&out)))
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn state(p: &Value) -> &str {
    p["state"].as_str().unwrap_or("?")
}

fn gpid(p: &Value) -> u64 {
    p["gpid"].as_u64().unwrap_or(0)
}

/// `clan job tree J` as (gpid, parent gpid or 0 for a root, command), from its indentation.
fn job_tree(c: &Cluster, job: &str) -> Vec<(u64, u64, String)> {
    let out = c.clan_ok(&["job", "tree", job]);
    let mut lines = Vec::new();
    let mut ancestors: Vec<u64> = Vec::new();
    for l in out.lines() {
        if l.starts_with("job ") {
            ancestors.clear();
            continue;
        }
        let depth = ((l.len() - l.trim_start().len()) / 2).saturating_sub(1);
        let (g, cmd) = l.trim_start().split_once(' ').unwrap_or((l.trim(), ""));
        let Ok(g) = g.parse::<u64>() else { continue };
        ancestors.truncate(depth);
        let parent = if depth == 0 {
            0
        } else {
            ancestors.last().copied().unwrap_or(0)
        };
        ancestors.push(g);
        lines.push((g, parent, cmd.to_string()));
    }
    lines
}

/// A directory of the test's own, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("clan-escape-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------------------
// 1. Escapes

/// What the kernel must show of a technique's process (given the gpid `clan run` printed)
/// for the technique to have been applied.
type Applied<'a> = Box<dyn Fn(&HostProc, u64) -> Result<(), String> + 'a>;

/// One way out of a job that a process may try.
struct Technique<'a> {
    what: &'static str,
    node: u32,
    /// Started by root (else by the job's owner, a non-root test user).
    by_root: bool,
    argv: Vec<String>,
    /// The second word of the command line of the process that tries to get away
    /// (`sleep 3001` → `3001`); unique to the technique.
    mark: &'static str,
    /// What the kernel must show of that process for the technique to have been applied
    /// (given the gpid `clan run` printed), else the test would prove nothing.
    applied: Applied<'a>,
}

fn argv(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

fn leads_session(p: &HostProc) -> Result<(), String> {
    if p.sid == p.pid {
        Ok(())
    } else {
        Err(format!("not a session leader (sid {})", p.sid))
    }
}

fn cwd_is_root(p: &HostProc) -> Result<(), String> {
    let cwd = std::fs::read_link(format!("/proc/{}/cwd", p.pid)).unwrap_or_default();
    if cwd == Path::new("/") {
        Ok(())
    } else {
        Err(format!("cwd is {}", cwd.display()))
    }
}

fn parent_cmdline(p: &HostProc) -> String {
    std::fs::read(format!("/proc/{}/cmdline", p.ppid))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// daemon(3) itself, from glibc: fork, the parent exits, setsid, chdir("/"), stdio to
/// /dev/null.
const DAEMON3: &str = r#"
import ctypes, os
if ctypes.CDLL(None).daemon(0, 0) != 0:
    os._exit(1)
os.execvp("sleep", ["sleep", "3003"])
"#;

const SETPGID: &str = r#"
import os
if os.fork() == 0:
    os.setpgid(0, 0)
    os.execvp("sleep", ["sleep", "3006"])
"#;

const CLOSE_ALL: &str = r#"
import os
if os.fork() == 0:
    os.chdir("/")
    os.closerange(0, 65536)
    os.execvp("sleep", ["sleep", "3008"])
"#;

/// clone(CLONE_PARENT | SIGCHLD): the new process is a sibling of its creator, a child of
/// the creator's parent (the shepherd, outside the task), not of a process of the job.
const CLONE_PARENT: &str = r#"
import ctypes, os
L = ctypes.c_long
nr = {"x86_64": 56, "aarch64": 220}[os.uname().machine]
libc = ctypes.CDLL(None, use_errno=True)
pid = libc.syscall(L(nr), L(0x8000 | 17), L(0), L(0), L(0), L(0))
if pid == 0:
    os.execvp("sleep", ["sleep", "3014"])
if pid < 0:
    os._exit(ctypes.get_errno())
"#;

/// Writes its pid into every cgroup.procs of the host, then becomes `sleep 3013`; reports
/// on stderr (clan logs) how many it tried and how many took it.
const CGROUP_HOP: &str = r#"
n=0; m=0
for f in $(find "$1" -name cgroup.procs 2>/dev/null); do
  n=$((n+1))
  if echo $$ 2>/dev/null >"$f"; then m=$((m+1)); echo "moved into $f" >&2; fi
done
echo "tried $n cgroups, moved $m times" >&2
exec sleep 3013
"#;

/// The classic fork bomb under a name of its own (its subshells keep its command line).
const BOMB: &str = "b3010() { b3010 | b3010 & }; b3010";

/// Every technique by which a process of a job might leave it, started inside one job
/// spread over two nodes, as a non-root user (and one as a second user, one bounded fork
/// bomb): each process must stay in the job's task (the kernel's cgroup, `clan ps --job`,
/// `clan job tree`), and `clan job kill` must leave nothing of any of them.
#[test]
fn no_technique_gets_a_process_out_of_its_job() {
    root_or_skip!("no_technique_gets_a_process_out_of_its_job");
    escapes("freeze");
}

/// The same, the kill done by the paper's top-down SIGKILL over the genealogy (rounds until
/// the task is empty) instead of cgroup.kill.
#[test]
fn no_technique_gets_a_process_out_of_its_job_killed_by_signals() {
    root_or_skip!("no_technique_gets_a_process_out_of_its_job_killed_by_signals");
    escapes("signals");
}

/// The two variants use the same marks (command lines they find processes by): one at a time.
static ESCAPES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn escapes(method: &str) {
    let _one_at_a_time = ESCAPES.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up(2);
    let a = user("clanesc1");
    let b = user("clanesc2");
    let mount = cgroup2().expect("cgroup2");
    let mut problems: Vec<String> = Vec::new();

    let techniques: Vec<Technique> = vec![
        Technique {
            what: "double fork and setsid",
            node: 1,
            by_root: false,
            argv: argv(&["sh", "-c", "(setsid sleep 3001 &); exit 0"]),
            mark: "3001",
            applied: Box::new(|p, _| leads_session(p)),
        },
        Technique {
            what: "setsid -f",
            node: 2,
            by_root: false,
            argv: argv(&["setsid", "-f", "sleep", "3002"]),
            mark: "3002",
            applied: Box::new(|p, _| leads_session(p)),
        },
        Technique {
            what: "daemon(3)",
            node: 1,
            by_root: false,
            argv: argv(&["/usr/bin/python3", "-c", DAEMON3]),
            mark: "3003",
            applied: Box::new(|p, _| {
                leads_session(p)?;
                cwd_is_root(p)?;
                let stdin = std::fs::read_link(format!("/proc/{}/fd/0", p.pid));
                match stdin {
                    Ok(t) if t == Path::new("/dev/null") => Ok(()),
                    other => Err(format!("stdin is {other:?}, not /dev/null")),
                }
            }),
        },
        Technique {
            what: "nohup and disown in bash",
            node: 2,
            by_root: false,
            argv: argv(&[
                "bash",
                "-c",
                "nohup sleep 3004 >/dev/null 2>&1 & disown; exit 0",
            ]),
            mark: "3004",
            applied: Box::new(|p, _| {
                if ignored_signals(p.pid) & sig_bit(libc::SIGHUP) != 0 {
                    Ok(())
                } else {
                    Err("SIGHUP not ignored: nohup did not run".into())
                }
            }),
        },
        Technique {
            what: "a grandchild that outlives its parent",
            node: 1,
            by_root: false,
            argv: argv(&["sh", "-c", "sh -c 'sleep 3005 &'; exec sleep 3105"]),
            mark: "3005",
            applied: Box::new(|p, _| {
                // Its parent exited: the kernel gave it to a reaper outside the task.
                match host_proc(p.ppid) {
                    Some(pp) if pp.cgroup != p.cgroup => Ok(()),
                    other => Err(format!("its kernel parent is {other:?}")),
                }
            }),
        },
        Technique {
            what: "setpgid to a group of its own",
            node: 2,
            by_root: false,
            argv: argv(&["/usr/bin/python3", "-c", SETPGID]),
            mark: "3006",
            applied: Box::new(|p, _| {
                if p.pgid == p.pid && p.sid != p.pid {
                    Ok(())
                } else {
                    Err(format!("pgid {} sid {}", p.pgid, p.sid))
                }
            }),
        },
        Technique {
            what: "exec of helpers (env -i, sh -c exec) wiping the environment",
            node: 1,
            by_root: false,
            argv: argv(&[
                "sh",
                "-c",
                "(exec env -i /bin/sh -c 'exec /bin/sleep 3007' &)",
            ]),
            mark: "3007",
            applied: Box::new(|p, _| {
                let env = std::fs::read(format!("/proc/{}/environ", p.pid)).unwrap_or_default();
                if String::from_utf8_lossy(&env).contains("CLAN_") {
                    Err("its environment still has CLAN_ variables".into())
                } else {
                    Ok(())
                }
            }),
        },
        Technique {
            what: "closing every fd and changing to /",
            node: 2,
            by_root: false,
            argv: argv(&["/usr/bin/python3", "-c", CLOSE_ALL]),
            mark: "3008",
            applied: Box::new(|p, _| {
                cwd_is_root(p)?;
                let fds = std::fs::read_dir(format!("/proc/{}/fd", p.pid))
                    .map(|d| d.count())
                    .unwrap_or(usize::MAX);
                if fds == 0 {
                    Ok(())
                } else {
                    Err(format!("{fds} fds open"))
                }
            }),
        },
        Technique {
            what: "a process of another user (setpriv) that double-forks",
            node: 1,
            by_root: true,
            argv: vec![
                "setpriv".into(),
                format!("--reuid={}", b.uid),
                format!("--regid={}", b.gid),
                "--clear-groups".into(),
                "sh".into(),
                "-c".into(),
                "(setsid sleep 3009 &)".into(),
            ],
            mark: "3009",
            applied: Box::new(move |p, _| {
                if p.uid == b.uid {
                    leads_session(p)
                } else {
                    Err(format!("runs as uid {}", p.uid))
                }
            }),
        },
        Technique {
            what: "a renamed process (exec -a)",
            node: 2,
            by_root: false,
            argv: argv(&["bash", "-c", "(exec -a b3011 sleep 3011 &)"]),
            mark: "3011",
            applied: Box::new(|p, _| {
                if p.argv[0] == "b3011" {
                    Ok(())
                } else {
                    Err(format!("argv {:?}", p.argv))
                }
            }),
        },
        Technique {
            what: "a process that ignores every catchable signal it can",
            node: 1,
            by_root: false,
            argv: argv(&[
                "sh",
                "-c",
                "trap '' HUP INT QUIT TERM; (setsid sleep 3012 &)",
            ]),
            mark: "3012",
            applied: Box::new(|p, _| {
                let want = [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGTERM]
                    .iter()
                    .fold(0, |m, s| m | sig_bit(*s));
                if ignored_signals(p.pid) & want == want {
                    leads_session(p)
                } else {
                    Err(format!("SigIgn {:x}", ignored_signals(p.pid)))
                }
            }),
        },
        Technique {
            what: "writing itself into every other cgroup.procs",
            node: 2,
            by_root: false,
            argv: vec![
                "sh".into(),
                "-c".into(),
                CGROUP_HOP.into(),
                "sh".into(),
                mount.display().to_string(),
            ],
            mark: "3013",
            applied: Box::new(|_, gpid| {
                let log = c.clan_ok(&["logs", &gpid.to_string()]);
                let tried = log
                    .lines()
                    .find_map(|l| l.strip_prefix("tried "))
                    .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok());
                match tried {
                    Some(n) if n >= 3 && log.contains("moved 0 times") => Ok(()),
                    _ => Err(format!("its report: {log:?}")),
                }
            }),
        },
        Technique {
            what: "clone(CLONE_PARENT): a child of the shepherd",
            node: 1,
            by_root: false,
            argv: argv(&["/usr/bin/python3", "-c", CLONE_PARENT]),
            mark: "3014",
            applied: Box::new(|p, _| {
                if parent_cmdline(p).contains("clan-shepherd") {
                    Ok(())
                } else {
                    Err(format!("its kernel parent is {:?}", parent_cmdline(p)))
                }
            }),
        },
    ];

    // Start them all in one job: the first one makes it.
    let mut job = String::new();
    let mut started_gpids: BTreeSet<u64> = BTreeSet::new();
    let mut gpid_of: Vec<u64> = Vec::new();
    for t in &techniques {
        let n = t.node.to_string();
        let mut args = vec!["run", "-d", "--node", &n];
        if !job.is_empty() {
            args.extend(["--job", &job]);
        }
        args.push("--");
        args.extend(t.argv.iter().map(String::as_str));
        let o = if t.by_root {
            c.clan(&args)
        } else {
            clan_as(&c, a, &args)
        };
        let (g, j) = started(&o, t.what);
        if job.is_empty() {
            job = j;
        } else {
            assert_eq!(j, job, "{}: started in another job", t.what);
        }
        started_gpids.extend(&g);
        gpid_of.push(g[0]);
    }

    // Every technique's process is up: it has exec'd its last command.
    let found = within(LIMIT, || {
        let all: Vec<HostProc> = techniques
            .iter()
            .map(|t| live_with_mark(t.mark).pop())
            .collect::<Option<_>>()?;
        live_with_mark("3105").pop()?;
        Some(all)
    });
    let Some(procs) = found else {
        let missing: Vec<_> = techniques
            .iter()
            .filter(|t| live_with_mark(t.mark).is_empty())
            .map(|t| t.what)
            .collect();
        panic!("these techniques' processes never ran: {missing:?}");
    };

    // The fork bomb, bounded by the pids limit `clan run --max-procs` sets on the task
    // (cgroup v2's pids controller, or its v1 hierarchy where v2 lacks it), last, once
    // every technique has made its processes: it fills the limit, so no process of the
    // task can fork after it on its node.
    const BOMB_LIMIT: u32 = 40;
    let o = clan_as(
        &c,
        a,
        &[
            "run",
            "-d",
            "--node",
            "2",
            "--job",
            &job,
            "--max-procs",
            &BOMB_LIMIT.to_string(),
            "--",
            "bash",
            "-c",
            BOMB,
        ],
    );
    if o.status.success() {
        let (g, _) = started(&o, "fork bomb");
        started_gpids.extend(&g);
        // The bomb's pids cgroup, by the kernel's account of one of its processes.
        let pids_dir = within(LIMIT, || {
            let p = live_with_mark("b3010")
                .into_iter()
                .chain(
                    host_pids()
                        .into_iter()
                        .filter_map(host_proc)
                        .filter(|p| p.argv.iter().any(|w| w.contains("b3010"))),
                )
                .next()?;
            pids_cgroup_dir(p.pid)
        })
        .expect("a process of the fork bomb, with its pids cgroup");
        // The bomb reaches the limit: forks fail, the task's process count stays under it.
        let hit = within(LIMIT, || {
            let ev = std::fs::read_to_string(pids_dir.join("pids.events")).ok()?;
            let max: u64 = ev
                .lines()
                .find_map(|l| l.strip_prefix("max "))?
                .trim()
                .parse()
                .ok()?;
            (max > 0).then_some(())
        });
        if hit.is_none() {
            problems.push(format!(
                "fork bomb: never reached its pids limit ({})",
                pids_dir.display()
            ));
        }
        let max = std::fs::read_to_string(pids_dir.join("pids.max")).unwrap_or_default();
        if max.trim() != BOMB_LIMIT.to_string() {
            problems.push(format!(
                "fork bomb: {}/pids.max is {max:?}, not {BOMB_LIMIT}",
                pids_dir.display()
            ));
        }
        let cur: u64 = std::fs::read_to_string(pids_dir.join("pids.current"))
            .unwrap_or_default()
            .trim()
            .parse()
            .unwrap_or(u64::MAX);
        if cur > u64::from(BOMB_LIMIT) {
            problems.push(format!(
                "fork bomb: {cur} processes over a limit of {BOMB_LIMIT}"
            ));
        }
        if host_processes_mentioning("b3010").is_empty() {
            problems.push("fork bomb: none of its processes is running".into());
        }
    } else if String::from_utf8_lossy(&o.stderr).contains("no pids controller") {
        eprintln!(
            "no_technique_gets_a_process_out_of_its_job: fork bomb SKIPPED: this kernel has no \
             pids controller, neither in cgroup v2 nor in a v1 hierarchy ({}), and an \
             unbounded bomb would take the machine down",
            describe(&o)
        );
    } else {
        problems.push(format!(
            "fork bomb: `clan run --max-procs {BOMB_LIMIT}` failed: {}",
            describe(&o)
        ));
    }

    // In the task, by the kernel's account, with the technique applied; in `clan ps --job`
    // and in `clan job tree`.
    let ps: Vec<Value> = (1..=2).flat_map(|n| ps_job(&c, n, &job)).collect();
    let listed: Vec<Option<&Value>> = procs
        .iter()
        .map(|p| {
            let cmd = p.argv.join(" ");
            ps.iter()
                .find(|q| q["cmd"] == cmd.as_str() && state(q) != "Z")
        })
        .collect();
    // The grandchild is under its nearest living ancestor, the process clan started
    // (which exec'd `sleep 3105`), not a root of the forest.
    let g3005 = ps
        .iter()
        .find(|q| q["cmd"] == "sleep 3005" && state(q) != "Z")
        .map(gpid);
    let top = techniques
        .iter()
        .position(|t| t.mark == "3005")
        .map(|i| gpid_of[i])
        .expect("the grandchild technique");
    // The genealogy follows the kernel's fork and exit events as they come: it may lag
    // behind a busy host for a moment (as in jobs.rs, wait for it).
    let complete = |tree: &[(u64, u64, String)]| {
        listed
            .iter()
            .flatten()
            .all(|q| tree.iter().any(|(g, _, _)| *g == gpid(q)))
            && g3005.is_none_or(|g| tree.iter().any(|(tg, p, _)| *tg == g && *p == top))
    };
    let t0 = Instant::now();
    let mut tree = job_tree(&c, &job);
    if !complete(&tree) {
        let first = tree.clone();
        tree = within(LIMIT, || {
            let t = job_tree(&c, &job);
            complete(&t).then_some(t)
        })
        .unwrap_or_else(|| job_tree(&c, &job));
        eprintln!(
            "`clan job tree {job}` was incomplete at first ({first:?}); after {:?}: {}",
            t0.elapsed(),
            if complete(&tree) {
                "complete"
            } else {
                "still not"
            }
        );
    }
    let tree_text: Vec<String> = tree
        .iter()
        .map(|(g, p, cmd)| format!("{g} (parent {p}) {cmd}"))
        .collect();
    for (((t, p), started_gpid), listed) in techniques.iter().zip(&procs).zip(&gpid_of).zip(&listed)
    {
        let want = task_cgroup_path(&c, t.node, &job);
        if p.cgroup != want {
            problems.push(format!(
                "{}: {:?} (pid {}) ESCAPED to cgroup {} (the task is {want})",
                t.what, p.argv, p.pid, p.cgroup
            ));
        }
        if let Err(e) = (t.applied)(p, *started_gpid) {
            problems.push(format!(
                "{}: the technique was not applied to {:?}: {e}",
                t.what, p.argv
            ));
        }
        let cmd = p.argv.join(" ");
        let Some(listed) = listed else {
            problems.push(format!("{}: {cmd:?} not in `clan ps --job {job}`", t.what));
            continue;
        };
        let g = gpid(listed);
        if listed["node"].as_u64() != Some(t.node.into())
            || listed["uid"].as_u64() != Some(p.uid.into())
        {
            problems.push(format!("{}: `clan ps` says {listed}", t.what));
        }
        if !tree.iter().any(|(tg, _, _)| *tg == g) {
            problems.push(format!(
                "{}: {cmd:?} ({g}) not in `clan job tree {job}` after {LIMIT:?}: \
                 {tree_text:#?}",
                t.what
            ));
        }
    }
    if let Some(g) = g3005 {
        let parent = tree.iter().find(|(tg, _, _)| *tg == g).map(|(_, p, _)| *p);
        if parent != Some(top) {
            problems.push(format!(
                "a grandchild that outlives its parent: in the tree under {parent:?}, not under \
                 its nearest living ancestor {top}: {tree_text:#?}"
            ));
        }
    }

    // The owner may not kill the task on node 1, which has a process of another user: it
    // is refused there and left alone; on node 2 the owner's kill leaves nothing.
    let o = clan_as(&c, a, &["job", "kill", "--method", method, &job]);
    if o.status.code() != Some(4) || !String::from_utf8_lossy(&o.stderr).contains("permission") {
        problems.push(format!(
            "`clan job kill {job}` by the owner, the task on node 1 holding another user's \
             process: expected exit 4, permission denied on node 1: {}",
            describe(&o)
        ));
    }
    for (t, p) in techniques.iter().zip(&procs) {
        let alive = host_proc(p.pid).is_some_and(|q| q.state != 'Z' && q.argv == p.argv);
        if t.node == 1 && !alive {
            problems.push(format!(
                "{}: killed on node 1 by a kill that was refused there",
                t.what
            ));
        }
        if t.node == 2 && !live_with_mark(t.mark).is_empty() {
            problems.push(format!(
                "{}: {:?} survived the owner's `clan job kill {job}` on node 2",
                t.what, p.argv
            ));
        }
    }

    // Root's kill: nothing is left, anywhere on the host.
    let o = c.clan(&["job", "kill", "--method", method, &job]);
    if !o.status.success() {
        problems.push(format!("`clan job kill {job}` by root: {}", describe(&o)));
    }
    for t in &techniques {
        let left: Vec<String> = live_with_mark(t.mark)
            .iter()
            .map(|p| format!("{p:?}"))
            .chain(host_processes_mentioning(&format!("sleep {}", t.mark)))
            .collect();
        if !left.is_empty() {
            problems.push(format!(
                "{}: SURVIVED `clan job kill {job}`: {left:?}",
                t.what
            ));
        }
    }
    for needle in ["sleep 3105", "b3010", "b3011"] {
        let left = host_processes_mentioning(needle);
        if !left.is_empty() {
            problems.push(format!(
                "{needle}: SURVIVED `clan job kill {job}`: {left:?}"
            ));
        }
    }
    // `clan ps --job` lists no live process, and as zombies only processes clan started
    // (they wait for `clan wait`); any other zombie should have been reaped by whoever
    // adopted it (given a few seconds).
    let strays = |c: &Cluster| -> Vec<Value> {
        (1..=2)
            .flat_map(|n| ps_job(c, n, &job))
            .filter(|p| state(p) != "Z" || !started_gpids.contains(&gpid(p)))
            .collect()
    };
    if within(LIMIT, || strays(&c).is_empty().then_some(())).is_none() {
        let s = strays(&c);
        let live: Vec<&Value> = s.iter().filter(|p| state(p) != "Z").collect();
        let zombies: Vec<String> = s
            .iter()
            .filter(|p| state(p) == "Z")
            .map(|p| format!("{} {}", gpid(p), p["cmd"]))
            .collect();
        if !live.is_empty() {
            problems.push(format!(
                "`clan ps --job {job}` after the kill lists live processes: {live:?}"
            ));
        }
        if !zombies.is_empty() {
            problems.push(format!(
                "`clan ps --job {job}` after the kill lists {} zombies of processes clan never \
                 started (processes clan started: {started_gpids:?}), still there after 5 s: \
                 {zombies:?}. They are orphans of the job, adopted by the shepherd (a child \
                 subreaper, outside the task) and never reaped by it",
                zombies.len()
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{} problem(s):\n- {}",
        problems.len(),
        problems.join("\n- ")
    );
}

/// `clan run` from a process of a job starts its process in that job: a process must not be
/// able to leave its job through clan's own remote execution either (else `clan job kill`
/// misses, say, the ranks an MPI launcher started with it), also when it drops CLAN_JOB
/// from its environment.
#[test]
fn clan_run_from_inside_a_job_starts_in_that_job() {
    root_or_skip!("clan_run_from_inside_a_job_starts_in_that_job");
    let c = Cluster::up(2);
    let a = user("clanesc1");
    let o = clan_as(
        &c,
        a,
        &[
            "run",
            "-d",
            "--node",
            "1",
            "--",
            "sh",
            "-c",
            "clan run -d --node 2 -- sleep 3201 >/dev/null 2>&1; \
             env -u CLAN_JOB clan run -d --node 1 -- sleep 3203 >/dev/null 2>&1; \
             exec sleep 3202",
        ],
    );
    let (_, job) = started(&o, "a job that runs clan run");
    eventually("the processes started from inside the job", LIMIT, || {
        (!live_with_mark("3201").is_empty()
            && !live_with_mark("3203").is_empty()
            && !live_with_mark("3202").is_empty())
        .then_some(())
    });
    let jobs_of = |cmd: &str| -> Vec<String> {
        c.ps(&[])
            .iter()
            .filter(|p| p["cmd"] == cmd && state(p) != "Z")
            .map(|p| p["job"].to_string())
            .collect()
    };
    let (in_3201, in_3203) = (jobs_of("sleep 3201"), jobs_of("sleep 3203"));
    c.clan_ok(&["job", "kill", &job]);
    let left: Vec<String> = ["sleep 3201", "sleep 3202", "sleep 3203"]
        .iter()
        .flat_map(|n| host_processes_mentioning(n))
        .collect();
    assert!(
        left.is_empty(),
        "`clan job kill {job}` left processes that a process of job {job} started with \
         `clan run` (sleep 3201 on node 2, in job(s) {in_3201:?}; sleep 3203 with CLAN_JOB \
         unset, in job(s) {in_3203:?}): {left:?}"
    );
}

/// A user may not put processes into another user's job: with one of its processes in it,
/// the owner could no longer suspend or kill its own job (refused: not all yours).
#[test]
fn another_user_can_not_join_a_job() {
    root_or_skip!("another_user_can_not_join_a_job");
    let c = Cluster::up(2);
    let a = user("clanesc1");
    let b = user("clanesc2");
    let (_, job) = started(
        &clan_as(&c, a, &["run", "-d", "--node", "1", "--", "sleep", "3211"]),
        "the owner's job",
    );
    let joined = clan_as(
        &c,
        b,
        &[
            "run", "-d", "--node", "1", "--job", &job, "--", "sleep", "3212",
        ],
    );
    let kill = clan_as(&c, a, &["job", "kill", &job]);
    assert!(
        kill.status.success() && host_processes_mentioning("sleep 3211").is_empty(),
        "the owner of job {job} could not kill it ({}) after another user ran \
         `clan run --job {job}` ({})",
        describe(&kill),
        describe(&joined)
    );
    assert!(
        !joined.status.success() && host_processes_mentioning("sleep 3212").is_empty(),
        "another user started a process in job {job}: {}",
        describe(&joined)
    );
}

// ---------------------------------------------------------------------------------------
// 2. A shell inside a suspended job

/// A job-control bash (`set -m`, so that `wait` also returns when its child stops) that
/// waits for its child, `sleep $2`, and logs why each wait returned; SIGUSR1 makes it log
/// `jobs -l` (the wait then returns 138, and it waits again). Once it has seen its child
/// stopped (147 to 150) it waits with -f, for the child's end only, instead of spinning.
const WATCHFUL_BASH: &str = r#"
set -m
log=$1
trap 'echo "jobs: $(jobs -l)" >> "$log"' USR1
sleep "$2" &
pid=$!
echo ready >> "$log"
f=
while :; do
  wait $f "$pid"
  rc=$?
  echo "wait returned $rc" >> "$log"
  case $rc in
    138) ;;
    147|148|149|150) f=-f ;;
    *) break ;;
  esac
done
echo "jobs at end: $(jobs -l)" >> "$log"
echo end >> "$log"
"#;

/// What the bash saw of a suspend and resume by `method`: its log, once its child (`sleep
/// mark`) was killed after the resume.
fn bash_through_suspension(method: &str, mark: &str) -> String {
    let child = format!("sleep {mark}");
    let c = Cluster::up(2);
    let tmp = TempDir::new(&format!("bash-{method}"));
    let log = tmp.0.join("log");
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let count = |what: &str| read().lines().filter(|l| l.starts_with(what)).count();
    let (g, job) = started(
        &c.clan(&[
            "run",
            "-d",
            "--node",
            "2",
            "--",
            "bash",
            "-c",
            WATCHFUL_BASH,
            "bash",
            log.to_str().unwrap(),
            mark,
        ]),
        "a bash",
    );
    let bash = g[0].to_string();
    eventually("bash ready", LIMIT, || {
        read().contains("ready").then_some(())
    });
    let sleep = eventually("bash's child", LIMIT, || {
        ps_job(&c, 2, &job)
            .into_iter()
            .find(|p| p["cmd"] == child.as_str() && state(p) != "Z")
            .map(|p| gpid(&p).to_string())
    });
    let probe = |n: usize| {
        c.clan_ok(&["kill", "-s", "USR1", &bash]);
        eventually("bash's jobs -l", LIMIT, || {
            (count("jobs:") == n && count("wait returned 138") == n).then_some(())
        });
    };
    probe(1);

    let out = c.clan_ok(&["job", "suspend", "--method", method, &job]);
    assert!(out.contains("suspended"), "{out}");
    let states: Vec<String> = ps_job(&c, 2, &job)
        .iter()
        .map(|p| state(p).to_string())
        .collect();
    if method == "signals" {
        assert!(
            states.len() == 2 && states.iter().all(|s| s == "T"),
            "bash and its child stopped: {states:?}"
        );
    } else {
        assert_eq!(task_event(&c, 2, &job, "frozen").as_deref(), Some("1"));
    }
    let out = c.clan_ok(&["job", "resume", "--method", method, &job]);
    assert!(out.contains("resumed"), "{out}");
    if method == "signals" {
        assert!(
            ps_job(&c, 2, &job).iter().all(|p| state(p) != "T"),
            "resumed"
        );
    } else {
        assert_eq!(task_event(&c, 2, &job, "frozen").as_deref(), Some("0"));
    }
    probe(2);
    // Now its child ends for real: that, and only that, ends bash's wait.
    c.clan_ok(&["kill", "-s", "KILL", &sleep]);
    eventually("bash's end", LIMIT, || {
        read().contains("end\n").then_some(())
    });
    // Bash has ended, or is about to: the job has finished (no such job) or is killed now.
    let o = c.clan(&["job", "kill", &job]);
    assert!(matches!(o.status.code(), Some(0 | 3)), "{}", describe(&o));
    assert!(host_processes_mentioning(&child).is_empty());
    read()
}

/// Asserts that the log shows a bash that never saw its child stopped: every `jobs -l`
/// says Running, and its wait returned only for the probes (138) and the kill (137).
fn assert_bash_saw_nothing(log: &str, method: &str) {
    let jobs: Vec<&str> = log.lines().filter(|l| l.starts_with("jobs:")).collect();
    assert_eq!(jobs.len(), 2, "{method}: {log}");
    assert!(
        jobs.iter().all(|l| l.contains("Running")) && !log.contains("Stopped"),
        "{method}: bash saw its job stopped:\n{log}"
    );
    let waits: Vec<&str> = log
        .lines()
        .filter_map(|l| l.strip_prefix("wait returned "))
        .collect();
    assert_eq!(
        waits.last(),
        Some(&"137"),
        "{method}: bash's wait ended for the kill:\n{log}"
    );
    assert!(
        waits[..waits.len() - 1].iter().all(|w| *w == "138"),
        "{method}: bash's wait returned because of the suspension (147..150 is a stop):\n{log}"
    );
}

/// Frozen by the cgroup freezer, a job's processes are not stopped in the job-control
/// sense: a bash of the job neither returns from `wait` nor lists its child as Stopped.
#[test]
fn bash_in_a_frozen_job_does_not_see_its_child_stopped() {
    root_or_skip!("bash_in_a_frozen_job_does_not_see_its_child_stopped");
    let log = bash_through_suspension("freeze", "3100");
    assert_bash_saw_nothing(&log, "freeze");
}

/// With `--method signals` the stops are real job-control stops, which a parent can notice
/// in principle. Here it does not, and deterministically so: the paper's order stops bash
/// (the parent) and checks it is stopped before it stops the child, and continues the child
/// and checks it runs before it continues bash. When bash runs again its child is no longer
/// stopped, so waitpid(WUNTRACED) has no stop to report, only WCONTINUED for a job bash
/// believes running: its `wait` carries on and `jobs -l` says Running. (A parent outside
/// the job, or one in another node's task, would see the stop.)
#[test]
fn bash_in_a_job_suspended_by_signals_does_not_see_its_child_stopped() {
    root_or_skip!("bash_in_a_job_suspended_by_signals_does_not_see_its_child_stopped");
    let log = bash_through_suspension("signals", "3110");
    assert_bash_saw_nothing(&log, "signals");
}

// ---------------------------------------------------------------------------------------
// 3. Suspending a job that forks all the time

/// Forks without end: each turn a subshell starts a short sleep (`sleep $2`) and exits,
/// orphaning it. Bounded by $1 turns only to protect the machine: clan's shepherds may keep
/// the zombies of such orphans (see the escape suite), and on a host with a small pid_max an
/// endless storm that outlived a failed test would exhaust the pids.
const STORM: &str = r#"i=0; while [ "$i" -lt "$1" ]; do (sleep "$2" &); i=$((i+1)); done"#;

/// Turns per node for a storm: a share of the free pids, so that even if every orphan
/// stayed a zombie until the cluster is gone, two storms at once leave most of them free.
fn storm_turns() -> String {
    let pid_max: usize = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(32768);
    let free = pid_max.saturating_sub(host_pids().len() + 2000);
    (free / 10).clamp(1000, 200_000).to_string()
}

/// Waits until the task on `node` has been seen with 100 different processes: it forks,
/// and keeps forking.
fn forking(c: &Cluster, node: u32, job: &str, what: &str) {
    let mut seen = BTreeSet::new();
    eventually(&format!("{what} on node {node}"), LIMIT, || {
        seen.extend(task_procs(c, node, job));
        (seen.len() >= 100).then_some(())
    });
}

/// A storm on two nodes (its sleeps last `nap`, unique to the test) suspended and resumed by
/// `method`, then killed.
fn storm(method: &str, nap: &str) {
    let c = Cluster::up(2);
    let turns = storm_turns();
    let (_, job) = started(
        &c.clan(&[
            "run", "-N", "2", "-d", "--", "sh", "-c", STORM, "sh", &turns, nap,
        ]),
        "a fork storm",
    );
    for n in 1..=2 {
        forking(&c, n, &job, "the storm");
    }

    // Suspended and resumed three times while it forks.
    for round in 1..=3 {
        let t0 = Instant::now();
        let out = c.clan_ok(&["job", "suspend", "--method", method, &job]);
        let took = t0.elapsed();
        assert_eq!(out.matches(": suspended (").count(), 2, "{out}");
        for n in 1..=2 {
            // Nothing of the task runs once suspend returned: its processes and its CPU time
            // are the same before and after the other checks (which take their time).
            let procs = task_procs(&c, n, &job);
            let cpu = task_cpu_usec(&c, n, &job);
            assert!(!procs.is_empty(), "node {n}: the storm ended early");
            let not_stopped: Vec<HostProc> = procs
                .iter()
                .filter_map(|p| host_proc(*p))
                .filter(|p| {
                    if method == "signals" {
                        p.state != 'T'
                    } else {
                        p.state == 'R'
                    }
                })
                .collect();
            assert!(
                not_stopped.is_empty(),
                "node {n}: `clan job suspend --method {method}` returned with processes not \
                 stopped: {not_stopped:?}"
            );
            if method == "freeze" {
                assert_eq!(
                    task_event(&c, n, &job, "frozen").as_deref(),
                    Some("1"),
                    "node {n}"
                );
            }
            let ps = ps_job(&c, n, &job);
            let live: Vec<&Value> = ps.iter().filter(|p| state(p) != "Z").collect();
            let bad: Vec<&&Value> = live
                .iter()
                .filter(|p| {
                    if method == "signals" {
                        state(p) != "T"
                    } else {
                        state(p) == "R"
                    }
                })
                .collect();
            assert!(
                bad.is_empty(),
                "node {n}: `clan ps --job {job}` after suspend: {bad:?}"
            );
            assert!(
                live.len() >= procs.len(),
                "node {n}: ps lists {} live processes, the task has {}",
                live.len(),
                procs.len()
            );
            assert_eq!(
                task_procs(&c, n, &job),
                procs,
                "node {n}: the task changed while suspended"
            );
            assert_eq!(
                task_cpu_usec(&c, n, &job),
                cpu,
                "node {n}: the task used CPU while suspended"
            );
            eprintln!(
                "storm ({method}), round {round}: node {n}: {} processes suspended in {took:?}; `clan ps --job` \
                 lists {} zombies",
                procs.len(),
                ps.len() - live.len()
            );
        }

        let out = c.clan_ok(&["job", "resume", "--method", method, &job]);
        assert_eq!(out.matches(": resumed (").count(), 2, "{out}");
        for n in 1..=2 {
            if method == "signals" {
                let stopped: Vec<u32> = task_procs(&c, n, &job)
                    .into_iter()
                    .filter(|p| host_proc(*p).is_some_and(|p| p.state == 'T'))
                    .collect();
                assert!(stopped.is_empty(), "node {n}: still stopped: {stopped:?}");
            } else {
                assert_eq!(
                    task_event(&c, n, &job, "frozen").as_deref(),
                    Some("0"),
                    "node {n}"
                );
            }
            forking(&c, n, &job, "the storm again");
        }
    }

    c.clan_ok(&["job", "kill", &job]);
    for n in 1..=2 {
        assert!(task_procs(&c, n, &job).is_empty(), "node {n}");
    }
    assert!(host_processes_mentioning(&format!("sleep {nap}")).is_empty());
    assert!(host_processes_mentioning(&format!("sh {turns} {nap}")).is_empty());
}

/// `clan job suspend` (the freezer) returns with every process of a forking job frozen.
#[test]
fn freezing_a_job_that_forks_all_the_time() {
    root_or_skip!("freezing_a_job_that_forks_all_the_time");
    storm("freeze", "0.0103");
}

/// `clan job suspend --method signals` returns with every process of a forking job stopped
/// (the paper's retries catch the children forked meanwhile).
#[test]
fn stopping_a_job_that_forks_all_the_time_by_signals() {
    root_or_skip!("stopping_a_job_that_forks_all_the_time_by_signals");
    storm("signals", "0.0104");
}

// ---------------------------------------------------------------------------------------
// 4. Suspending a job that burns CPU

/// The TIME of the `total` line of `clan job show J` (or of its one line).
fn shown_time(c: &Cluster, job: &str) -> String {
    let out = c.clan_ok(&["job", "show", job]);
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("total"))
        .or_else(|| out.lines().nth(1))
        .unwrap_or_else(|| panic!("no task line: {out}"));
    line.split_whitespace()
        .find(|w| w.contains(':') && w.contains('.'))
        .unwrap_or_else(|| panic!("no TIME in {line:?}"))
        .to_string()
}

/// Two `yes` per node on a two-core machine: suspended (by either method), the job's CPU
/// time stands still; resumed, it grows again.
#[test]
fn a_suspended_job_uses_no_cpu() {
    root_or_skip!("a_suspended_job_uses_no_cpu");
    let c = Cluster::up(2);
    let (_, job) = started(
        &c.clan(&[
            "run",
            "-N",
            "2",
            "-d",
            "--",
            "sh",
            "-c",
            "yes 3301 >/dev/null & yes 3301 >/dev/null & exec sleep 3301",
        ]),
        "busy processes",
    );
    let usage = |c: &Cluster| -> Vec<u64> { (1..=2).map(|n| task_cpu_usec(c, n, &job)).collect() };
    let grows = |c: &Cluster, from: &[u64], what: &str| {
        eventually(what, LIMIT, || {
            let now = usage(c);
            now.iter().zip(from).all(|(a, b)| a > b).then_some(())
        });
    };
    eventually("three processes per node", LIMIT, || {
        (1..=2)
            .all(|n| task_procs(&c, n, &job).len() == 3)
            .then_some(())
    });
    let start = usage(&c);
    grows(&c, &start, "the job's CPU time to grow");

    for method in ["freeze", "signals"] {
        let out = c.clan_ok(&["job", "suspend", "--method", method, &job]);
        assert_eq!(out.matches(": suspended (3 processes)").count(), 2, "{out}");
        let (cpu, shown) = (usage(&c), shown_time(&c, &job));
        // Other checks, while time passes.
        for n in 1..=2 {
            let procs = task_procs(&c, n, &job);
            let states: Vec<char> = procs
                .iter()
                .filter_map(|p| host_proc(*p))
                .map(|p| p.state)
                .collect();
            if method == "freeze" {
                assert_eq!(
                    task_event(&c, n, &job, "frozen").as_deref(),
                    Some("1"),
                    "node {n}"
                );
                assert!(!states.contains(&'R'), "node {n}: {states:?}");
            } else {
                assert_eq!(states, ['T', 'T', 'T'], "node {n}");
            }
            let ps = ps_job(&c, n, &job);
            assert_eq!(ps.len(), 3, "node {n}: {ps:?}");
        }
        let show = c.clan_ok(&["job", "show", &job]);
        assert_eq!(show.matches("suspended").count(), 2, "{show}");
        assert_eq!(
            usage(&c),
            cpu,
            "{method}: the job used CPU while suspended (cpu.stat usage_usec per node)"
        );
        assert_eq!(
            shown_time(&c, &job),
            shown,
            "{method}: `clan job show` TIME grew while suspended"
        );

        let out = c.clan_ok(&["job", "resume", "--method", method, &job]);
        assert_eq!(out.matches(": resumed (3 processes)").count(), 2, "{out}");
        grows(&c, &cpu, "the job's CPU time to grow after resume");
    }
    c.clan_ok(&["job", "kill", &job]);
    assert!(host_processes_mentioning("yes 3301").is_empty());
    assert!(host_processes_mentioning("sleep 3301").is_empty());
}

/// `clan job adopt` is no way out of a job either, nor out of any cgroup its caller could
/// not leave by itself: cland (root) moves the processes, so for a caller that is not root
/// it refuses a process of a clan task, and one whose cgroup the caller could not move it
/// out of under the kernel's delegation rule (write access to `cgroup.procs` of the common
/// ancestor of the process's cgroup and the new task's), such as a service's. Refused with
/// exit 4, `permission denied`, nothing moved.
#[test]
fn adopt_takes_no_process_out_of_its_job_or_cgroup() {
    root_or_skip!("adopt_takes_no_process_out_of_its_job_or_cgroup");
    let c = Cluster::up(2);
    let a = user("clanesc1");
    let (_, job) = started(
        &clan_as(&c, a, &["run", "-d", "--node", "1", "--", "sleep", "3231"]),
        "the owner's job",
    );
    let p = eventually("the job's sleep", LIMIT, || {
        live_with_mark("3231").into_iter().next()
    });
    let in_task = task_cgroup_path(&c, 1, &job);
    assert_eq!(p.cgroup, in_task, "{p:?}");
    let o = clan_as(&c, a, &["job", "adopt", &p.pid.to_string()]);
    let now = host_proc(p.pid).map(|p| p.cgroup).unwrap_or_default();
    assert!(
        o.status.code() == Some(4)
            && String::from_utf8_lossy(&o.stderr).contains("permission denied")
            && now == in_task,
        "the owner of job {job} adopted its process {} out of it ({}): now in {now:?}",
        p.pid,
        describe(&o)
    );
    let kill = clan_as(&c, a, &["job", "kill", &job]);
    assert!(
        kill.status.success() && live_with_mark("3231").is_empty(),
        "`clan job kill {job}`: {}",
        describe(&kill)
    );

    // A process of the user in a cgroup of root's (a service's): not the user's to move.
    let mount = cgroup2().expect("cgroup2");
    let svc = mount.join(format!("clan-test-svc-{}", std::process::id()));
    std::fs::create_dir_all(&svc).expect("a service cgroup");
    let mut outside = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {}/cgroup.procs && exec setpriv --reuid={} --regid={} --clear-groups \
             sleep 3232",
            svc.display(),
            a.uid,
            a.gid
        ))
        .spawn()
        .expect("a service's process");
    let q = eventually("the service's sleep", LIMIT, || {
        live_with_mark("3232").into_iter().next()
    });
    let svc_path = format!("/{}", svc.strip_prefix(&mount).unwrap().display());
    let o = clan_as(&c, a, &["job", "adopt", &q.pid.to_string()]);
    let now = host_proc(q.pid).map(|p| p.cgroup).unwrap_or_default();
    let _ = outside.kill();
    let _ = outside.wait();
    let _ = std::fs::remove_dir(&svc);
    assert!(
        o.status.code() == Some(4)
            && String::from_utf8_lossy(&o.stderr).contains("permission denied")
            && now == svc_path,
        "a user adopted its process {} out of root's cgroup {svc_path} ({}): now in {now:?}",
        q.pid,
        describe(&o)
    );
}
