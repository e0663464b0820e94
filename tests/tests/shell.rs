//! `clan shell` (issue 5): unmodified procps, psmisc and the shell's own `kill` in a shell
//! whose /proc is the cluster view, on real local clusters, checked against the kernel.

use clan_tests::*;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

macro_rules! root_or_skip {
    ($name:expr) => {
        if !need_root($name) {
            return;
        }
    };
}

const LIMIT: Duration = Duration::from_secs(30);

/// `clan shell --node N -- bash -c SCRIPT`, as root or as the user `uid`.
fn shell(c: &Cluster, node: u32, uid: Option<u32>, script: &str) -> Output {
    let mut cmd = Command::new("timeout");
    cmd.arg("60");
    if let Some(u) = uid {
        cmd.arg("setpriv")
            .arg(format!("--reuid={u}"))
            .arg(format!("--regid={u}"))
            .arg("--clear-groups");
    }
    cmd.arg(bin("clan"))
        .args([
            "shell",
            "--node",
            &node.to_string(),
            "--",
            "bash",
            "-c",
            script,
        ])
        .env("CLAN_DIR", &c.dir)
        .env_remove("CLAN_NODE")
        .env("PATH", path_with_bins())
        .current_dir("/tmp")
        .stdin(Stdio::null())
        .output()
        .expect("clan shell")
}

fn text(o: &Output) -> String {
    format!(
        "{:?}\n--- stdout\n{}--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The gpid `clan run -d` printed.
fn run_d(c: &Cluster, node: u32, argv: &[&str]) -> u64 {
    let n = node.to_string();
    let mut args = vec!["run", "-d", "--node", &n, "--"];
    args.extend(argv);
    let out = c.clan_ok(&args);
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("a gpid: {out:?}"))
}

fn state_of(c: &Cluster, gpid: u64) -> Option<String> {
    c.ps_one(clan_core::Gpid::from_raw(gpid).expect("gpid"))
        .and_then(|p| p["state"].as_str().map(str::to_string))
}

/// ps, pgrep, pkill, top, pstree and bash's kill in a clan shell on node 1 see and act on the
/// processes of nodes 2 and 3 by gpid; none of them finds itself.
#[test]
fn procps_in_a_clan_shell_see_and_act_on_every_node() {
    root_or_skip!("procps_in_a_clan_shell_see_and_act_on_every_node");
    let c = Cluster::up(3);
    let a = run_d(&c, 2, &["sleep", "8101"]);
    let b = run_d(&c, 3, &["sleep", "8102"]);
    let d = run_d(&c, 3, &["sleep", "8103"]);

    let o = shell(
        &c,
        1,
        None,
        "ps -eo pid,ppid,user,stat,args; echo ---; pgrep -f 'sleep 81[0]'; echo ---; \
         top -b -n 1 | tail -n +7; echo ---; pstree -p",
    );
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let parts: Vec<&str> = out.split("---\n").collect();
    assert_eq!(parts.len(), 4, "{}", text(&o));
    for g in [a, b, d] {
        let line = parts[0]
            .lines()
            .find(|l| l.split_whitespace().next() == Some(&g.to_string()))
            .unwrap_or_else(|| panic!("ps does not list {g}:\n{}", parts[0]));
        assert!(line.contains("root") && line.contains("sleep 81"), "{line}");
        assert!(
            top_lists(parts[2], g),
            "top does not list {g}:\n{}",
            parts[2]
        );
        assert!(parts[3].contains(&format!("({g})")), "pstree: {}", parts[3]);
        // Started from outside the cluster (clan run -d): a child of the cluster's init.
        assert!(
            line.split_whitespace().nth(1) == Some("1"),
            "the parent of {g} is not the cluster's init: {line}"
        );
    }
    // Plain pstree starts from pid 1, the cluster's init, and draws every node under it.
    assert!(
        parts[3].starts_with("clan(1)-"),
        "pstree does not start from the cluster's init:\n{}",
        parts[3]
    );
    for n in 1..=3 {
        assert!(
            parts[3].contains(&format!("clan-shepherd({n}0000001)")),
            "pstree does not draw node {n}'s init:\n{}",
            parts[3]
        );
    }
    // pgrep lists the sleeps and not itself (its own line is not in the view it reads).
    let mut found: Vec<u64> = parts[1]
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    found.sort_unstable();
    assert_eq!(found, vec![a, b, d], "{}", text(&o));

    // pkill across nodes; bash's kill of a gpid; kill -STOP shows T.
    let o = shell(
        &c,
        1,
        None,
        &format!("pkill -f 'sleep 81[0]2' && kill -STOP {a} && echo done"),
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("done"),
        "{}",
        text(&o)
    );
    let ended = String::from_utf8_lossy(&c.clan(&["wait", &b.to_string()]).stdout).into_owned();
    assert!(ended.contains("SIGTERM"), "{ended}");
    assert_eq!(state_of(&c, a).as_deref(), Some("T"));
    assert!(
        state_of(&c, d).is_some_and(|s| s != "Z"),
        "pkill took 8103 too"
    );
    let o = shell(&c, 1, None, &format!("kill -CONT {a}; kill -9 {a} {d}"));
    assert!(o.status.success(), "{}", text(&o));
    for g in [a, d] {
        let ended = String::from_utf8_lossy(&c.clan(&["wait", &g.to_string()]).stdout).into_owned();
        assert!(ended.contains("SIGKILL"), "{g}: {ended}");
    }
    assert!(host_processes_mentioning("sleep 81").is_empty());
}

fn top_lists(top: &str, gpid: u64) -> bool {
    top.lines()
        .any(|l| l.split_whitespace().next() == Some(&gpid.to_string()))
}

/// The shell's own /proc/self is its node's real procfs (magic links work: process
/// substitution, /dev/fd, /proc/self/fd), while /proc lists the cluster; a gpid of the
/// shell's own node is translated for kill(2).
#[test]
fn a_clan_shell_keeps_its_own_proc_working() {
    root_or_skip!("a_clan_shell_keeps_its_own_proc_working");
    let c = Cluster::up(2);
    let o = shell(
        &c,
        2,
        None,
        "readlink /proc/self; cat <(echo substituted); echo piped | cat /dev/fd/0; \
         ls /proc/self/fd >/dev/null && echo fds; sleep 8201 & \
         g=$((20000000 + $!)); kill -0 $g && echo local-gpid-ok; kill $g; wait; \
         grep -c . /proc/loadavg",
    );
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{}", text(&o));
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].ends_with(&format!(
            "node2/nodeproc/{}",
            lines[0].rsplit('/').next().unwrap()
        )) && lines[0].contains("/nodeproc/"),
        "{}",
        text(&o)
    );
    for want in ["substituted", "piped", "fds", "local-gpid-ok"] {
        assert!(lines.contains(&want), "{want}: {}", text(&o));
    }
    assert!(host_processes_mentioning("sleep 8201").is_empty());
}

/// Through the shim, a user gets the kernel's answers for processes of other nodes: EPERM
/// for another user's, ESRCH for none, EREMOTE for what can not cross nodes (a pidfd); a
/// node's view server that dies leaves no dead mount and is replaced.
#[test]
fn remote_calls_answer_as_the_kernel_would() {
    root_or_skip!("remote_calls_answer_as_the_kernel_would");
    let c = Cluster::up(3);
    let user = test_user("clanshell1");
    let roots = run_d(&c, 2, &["sleep", "8301"]);
    let o = shell(
        &c,
        1,
        Some(user),
        &format!(
            "kill -TERM {roots}; echo rc=$?; kill -0 20009999; echo rc=$?; \
             python3 -c 'import os\ntry:\n os.pidfd_open({roots})\nexcept OSError as e:\n print(e.errno)'"
        ),
    );
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        err.contains("Operation not permitted") && err.contains("No such process"),
        "{}",
        text(&o)
    );
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["rc=1", "rc=1", &libc::EREMOTE.to_string()],
        "{}",
        text(&o)
    );
    assert!(
        state_of(&c, roots).is_some_and(|s| s != "Z"),
        "root's process was hit"
    );

    // Node 3's view server dies: its mount does not stay behind dead (the watcher removes
    // it), and cland starts a new server, with which clan shell works again.
    let pidfile = c.node_dir(3).join("procfs.pid");
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .expect("procfs.pid")
        .trim()
        .parse()
        .expect("a pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the view server");
    let init: u32 = std::fs::read_to_string(c.node_dir(3).join("init.pid"))
        .expect("init.pid")
        .trim()
        .parse()
        .expect("a pid");
    let view = c.node_dir(3).join("proc");
    eventually("a new view server on node 3", LIMIT, || {
        let now: i32 = std::fs::read_to_string(&pidfile)
            .ok()?
            .trim()
            .parse()
            .ok()?;
        (now != pid).then_some(())
    });
    // Exactly one view mounted there in the node's namespace: the new one.
    let mounts = std::fs::read_to_string(format!("/proc/{init}/mountinfo")).expect("mountinfo");
    let views = mounts
        .lines()
        .filter(|l| l.split_whitespace().nth(4) == view.to_str())
        .count();
    assert_eq!(views, 1, "{mounts}");
    let o = shell(&c, 3, None, &format!("ps -eo pid | grep -c {roots}"));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "1",
        "{}",
        text(&o)
    );
    c.clan_ok(&["kill", "-s", "KILL", &roots.to_string()]);
}

/// sigqueue(3) to a process of another node, from a clan shell (through the shim) and with
/// `clan kill --value` from outside the cluster: the receiver's siginfo has SI_QUEUE, the
/// value and the sender's uid; no pid (the kernel's for a sender outside the receiver's
/// pid namespace).
#[test]
fn sigqueue_carries_its_value_across_nodes() {
    root_or_skip!("sigqueue_carries_its_value_across_nodes");
    let c = Cluster::up(2);
    let helper = env!("CARGO_BIN_EXE_clan-test-sigqueue");
    let sig = libc::SIGRTMIN() + 3;
    let receive = |name: &str| {
        let out = c.dir.join(name);
        let g = run_d(
            &c,
            2,
            &[helper, "wait", &sig.to_string(), out.to_str().unwrap()],
        );
        let ready = c.dir.join(format!("{name}.ready"));
        eventually("the receiver to block the signal", LIMIT, || {
            ready.exists().then_some(())
        });
        (g, out)
    };
    let fields = |out: &std::path::Path| -> Vec<i64> {
        let line = eventually("the receiver's siginfo", LIMIT, || {
            std::fs::read_to_string(out)
                .ok()
                .filter(|l| l.ends_with('\n'))
        });
        line.split_whitespace()
            .map(|f| f.parse().unwrap())
            .collect()
    };

    // From a process of node 1, by sigqueue(3) itself.
    let (g, out) = receive("from-shell");
    let o = shell(&c, 1, None, &format!("{helper} send {g} {sig} -42"));
    assert!(o.status.success(), "{}", text(&o));
    let si_queue = -1;
    assert_eq!(
        fields(&out),
        vec![i64::from(sig), si_queue, 0, 0, -42],
        "signo code pid uid value"
    );

    // From outside the cluster, by clan kill --value.
    let (g, out) = receive("from-host");
    c.clan_ok(&[
        "kill",
        "-s",
        &sig.to_string(),
        "--value",
        "7",
        &g.to_string(),
    ]);
    assert_eq!(
        fields(&out),
        vec![i64::from(sig), si_queue, 0, 0, 7],
        "signo code pid uid value"
    );
}

/// What a process of a clan shell reads of every process after listing /proc (a walk:
/// one read of `/proc/.clan-walk/FILE` for every process, served from memory by the
/// preloaded library) is what the mount gives it file by file: the same bytes, the same
/// owner, inode and device of `/proc/GPID`, the same errors (EACCES for another user's
/// `environ`, ENOENT for names a process directory does not have and gpids that do not
/// exist); and a new listing sees the processes as they are now.
#[test]
fn a_walk_of_proc_reads_what_the_mount_gives() {
    root_or_skip!("a_walk_of_proc_reads_what_the_mount_gives");
    let c = Cluster::up(2);
    let user = test_user("clanshell2");
    let g = run_d(&c, 2, &["sleep", "8401"]);
    let compare = format!(
        r#"python3 - <<'PY'
import json, os
g = {g}
def read_all(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        return ["err", e.errno]
    memfd = os.readlink("/proc/self/fd/%d" % fd).startswith("/memfd:")
    data = b""
    while True:
        b = os.read(fd, 65536)
        if not b:
            break
        data += b
    os.close(fd)
    return ["ok", data.decode(errors="replace"), memfd]
def look():
    out = {{f: read_all("/proc/%d/%s" % (g, f))
           for f in ["stat", "status", "cmdline", "statm", "environ", "ctty"]}}
    st = os.stat("/proc/%d" % g)
    out["dir"] = [st.st_dev, st.st_ino, st.st_uid, st.st_gid, st.st_mode]
    try:
        os.stat("/proc/29999999")
        out["missing"] = 0
    except OSError as e:
        out["missing"] = e.errno
    return out
before = look()
os.listdir("/proc")
after = look()
fd = os.open("/proc/%d/stat" % g, os.O_RDONLY)
try:
    os.write(fd, b"x")
    wrote = "written"
except OSError as e:
    wrote = e.errno
os.close(fd)
os.close(os.open("/proc/%d/." % g, os.O_RDONLY))
print(json.dumps([before, after, wrote]))
PY"#
    );
    for uid in [None, Some(user)] {
        let o = shell(&c, 1, uid, &compare);
        assert!(o.status.success(), "{}", text(&o));
        let v: serde_json::Value =
            serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
        let (mount, walk) = (&v[0], &v[1]);
        // `SigQ` in `status` counts the signals queued for the owner's user, any process:
        // it may change between the two reads, which are the same otherwise.
        let steady = |v: &serde_json::Value| -> String {
            v.as_str()
                .unwrap_or_default()
                .lines()
                .filter(|l| !l.starts_with("SigQ:"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        for f in ["stat", "status", "cmdline", "statm"] {
            assert_eq!(mount[f][0], "ok", "{f} through the mount: {mount}");
            assert_eq!(
                steady(&mount[f][1]),
                steady(&walk[f][1]),
                "{f} differs (uid {uid:?})"
            );
            assert_eq!(
                mount[f][2], false,
                "{f} read before a listing is the mount's"
            );
            assert_eq!(walk[f][2], true, "{f} after a listing comes from the walk");
        }
        assert!(
            mount["stat"][1]
                .as_str()
                .is_some_and(|s| s.starts_with(&format!("{g} (sleep) S "))),
            "{mount}"
        );
        match uid {
            None => {
                assert_eq!(mount["environ"][1], walk["environ"][1]);
                assert_eq!(walk["environ"][2], true);
            }
            Some(_) => {
                let eacces = serde_json::json!(["err", libc::EACCES]);
                assert_eq!(mount["environ"], eacces, "another user's environ");
                assert_eq!(walk["environ"], eacces, "another user's environ");
            }
        }
        let enoent = serde_json::json!(["err", libc::ENOENT]);
        assert_eq!(mount["ctty"], enoent);
        assert_eq!(walk["ctty"], enoent);
        assert_eq!(mount["dir"], walk["dir"], "stat of /proc/{g}");
        assert_eq!(mount["dir"][1], g << 24, "the view's inode for /proc/{g}");
        assert_eq!(mount["missing"], libc::ENOENT);
        assert_eq!(walk["missing"], libc::ENOENT);
        assert!(v[2].is_i64(), "a served file is read-only: {}", v[2]);
    }

    // A new listing starts a new walk: a process stopped since is seen stopped.
    let fresh = format!(
        r#"python3 - <<'PY'
import os, subprocess, time
g = {g}
def state():
    os.listdir("/proc")
    with open("/proc/%d/stat" % g) as f:
        return f.read().rsplit(")", 1)[1].split()[0]
print(state())
subprocess.run(["clan", "kill", "-s", "STOP", str(g)], check=True)
deadline = time.monotonic() + 20
while state() != "T" and time.monotonic() < deadline:
    pass
print(state())
PY"#
    );
    let o = shell(&c, 1, None, &fresh);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .collect::<Vec<_>>(),
        ["S", "T"],
        "{}",
        text(&o)
    );
    c.clan_ok(&["kill", "-s", "KILL", &g.to_string()]);
}
