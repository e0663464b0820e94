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

    // lslocks(8) reads the cluster's /proc/locks: a lock taken on node 3, by its gpid.
    // Its output is the pipe to its log (a detached process's): lslocks names the lock's
    // file by the first descriptor whose stat (following the link) fails or has the lock's
    // inode, so the links to that pipe must be followed through the view to the pipe.
    let file = c.dir.join("locked-8105");
    let holder = run_d(
        &c,
        3,
        &[
            "sh",
            "-c",
            &format!(
                "exec python3 -c \"import fcntl, time; f = open('{}', 'w'); \
                 fcntl.flock(f, fcntl.LOCK_EX); time.sleep(8105)\"",
                file.display()
            ),
        ],
    );
    let line = eventually("lslocks lists the lock", LIMIT, || {
        let o = shell(&c, 1, None, "lslocks -n -o PID,COMMAND,PATH");
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .find(|l| l.split_whitespace().next() == Some(&holder.to_string()))
            .map(str::to_string)
    });
    assert!(
        line.contains("python3") && line.contains(&file.display().to_string()),
        "{line}"
    );
    let o = shell(
        &c,
        1,
        None,
        &format!("readlink /proc/{holder}/fd/1 && test -p /proc/{holder}/fd/1 && echo fifo"),
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.starts_with("pipe:[") && out.ends_with("]\nfifo\n"),
        "{}",
        text(&o)
    );
    c.clan_ok(&["kill", "-s", "KILL", &holder.to_string()]);
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

/// A view server that does not answer (stopped here; at a node's start, one that has
/// mounted and not begun to serve yet) gets a `clan shell` of its node refused in a few
/// seconds, and the node goes on answering and sending heartbeats meanwhile: the start's
/// look at the view (a request to its server) blocks no thread of the node's runtime.
#[test]
fn a_stuck_view_server_stalls_no_node() {
    root_or_skip!("a_stuck_view_server_stalls_no_node");
    let c = Cluster::up(2);
    let server = eventually("node 2's view server", LIMIT, || view_server(&c, 2));
    let held = Stopped::new(server);
    let o = shell(&c, 2, None, "echo ran");
    // The shell's start took longer than the peers' failure detector (2 s).
    let nodes = c.clan(&["nodes"]);
    // A second shell meanwhile is refused too (at once: the stuck look is not repeated).
    let again = shell(&c, 2, None, "echo ran");
    drop(held);
    for o in [&o, &again] {
        assert!(
            !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("did not answer"),
            "{}",
            text(o)
        );
    }
    let listed = String::from_utf8_lossy(&nodes.stdout).into_owned();
    assert_eq!(
        listed.lines().filter(|l| l.contains(" up ")).count(),
        2,
        "{listed}"
    );
    assert!(
        !c.log(1).contains("declared dead"),
        "node 2 went silent: {}",
        c.log(1)
    );
    // Answering again, the server serves the next shell (once the stuck look has come
    // back).
    eventually("a shell served again", LIMIT, || {
        let o = shell(&c, 2, None, "echo ran");
        (String::from_utf8_lossy(&o.stdout) == "ran\n").then_some(())
    });
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
             python3 -c 'import os\ntry:\n os.pidfd_open({roots})\nexcept OSError as e:\n print(e.errno)'; \
             CLAN_NODE=2 python3 -c 'import os\nfor g in ({roots}, 10000000):\n try:\n  os.kill(g, 0)\n  print(0)\n except OSError as e:\n  print(e.errno)'"
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
        // The last two: a user's CLAN_NODE (which `clan` obeys) does not make node 2's
        // gpids local ones here (EPERM from node 2, not ESRCH from a local pid), and a gpid
        // whose local part is 0 names no process (not kill(0): the caller's own group).
        [
            "rc=1",
            "rc=1",
            &libc::EREMOTE.to_string(),
            &libc::EPERM.to_string(),
            &libc::ESRCH.to_string(),
        ],
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
    eventually("a new view server on node 3", LIMIT, || {
        let now: i32 = std::fs::read_to_string(&pidfile)
            .ok()?
            .trim()
            .parse()
            .ok()?;
        (now != pid).then_some(())
    });
    // Exactly one view mounted there in the node's namespace, over its base: the new one.
    let mounts = mounts_at_view(&c, 3);
    assert!(
        mounts.len() == 2 && !mounts[0].starts_with("fuse") && mounts[1] == "fuse.clanproc",
        "{mounts:?}"
    );
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

/// A user follows the namespace links of their own process on another node, through the
/// mount and through a walk (after a listing): the namespace's number, as the kernel's
/// stat gives it on that node; root does too, and another user may not (EACCES, the
/// kernel's ptrace check made on that node as the reader).
#[test]
fn a_user_follows_the_namespace_links_of_their_own_processes() {
    root_or_skip!("a_user_follows_the_namespace_links_of_their_own_processes");
    let c = Cluster::up(2);
    let user = test_user("clanshellns");
    let other = test_user("clanshellns2");
    let o = as_uid(user, "clan")
        .args(["run", "-d", "--node", "2", "--", "sleep", "8403"])
        .env("CLAN_DIR", &c.dir)
        .env_remove("CLAN_NODE")
        .output()
        .expect("clan run -d");
    assert!(o.status.success(), "{}", text(&o));
    let g: u64 = String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .expect("a gpid");
    // Node 2's pid namespace: its init's, pid 1 there, as the kernel numbers it.
    let init = std::fs::read_to_string(c.node_dir(2).join("init.pid")).expect("init.pid");
    let native: u64 = std::fs::metadata(format!("/proc/{}/ns/pid", init.trim()))
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .expect("the native namespace");
    let script = format!(
        r#"python3 - <<'PY'
import json, os
def look():
    try:
        st = os.stat("/proc/{g}/ns/pid")
        return [st.st_ino, st.st_mode & 0o170000]
    except OSError as e:
        return e.errno
mount = look()
os.listdir("/proc")
print(json.dumps([mount, look()]))
PY"#
    );
    for (who, want) in [
        (Some(user), serde_json::json!([native, libc::S_IFREG])),
        (None, serde_json::json!([native, libc::S_IFREG])),
        (Some(other), serde_json::json!(libc::EACCES)),
    ] {
        let o = shell(&c, 1, who, &script);
        assert!(o.status.success(), "{}", text(&o));
        let v: serde_json::Value =
            serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
        assert_eq!(v[0], want, "through the mount, as {who:?}");
        assert_eq!(v[1], want, "through a walk, as {who:?}");
    }
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
    # uptime first: the walk speaks for two seconds after the listing.
    out = {{"uptime": read_all("/proc/uptime")}}
    out.update({{f: read_all("/proc/%d/%s" % (g, f))
               for f in ["stat", "status", "cmdline", "statm", "environ", "ctty"]}})
    st = os.stat("/proc/%d" % g)
    out["dir"] = [st.st_dev, st.st_ino, st.st_uid, st.st_gid, st.st_mode]
    try:
        os.stat("/proc/29999999")
        out["missing"] = 0
    except OSError as e:
        out["missing"] = e.errno
    for ns in ["cgroup", "pid", "nosuch"]:
        for follow in [True, False]:
            try:
                path = "/proc/%d/ns/%s" % (g, ns)
                st = os.stat(path, follow_symlinks=follow)
                r = ["ok", st.st_mode & 0o170000]
                if follow:
                    # The namespace's own number, as the link reads it ("pid:[N]").
                    r.append(st.st_ino == int(os.readlink(path).split("[")[1][:-1]))
            except OSError as e:
                r = ["err", e.errno]
            out["ns/%s %s" % (ns, follow)] = r
    try:
        os.stat("/proc/1/ns/pid")
        out["init ns"] = 0
    except OSError as e:
        out["init ns"] = e.errno
    return out
before = look()
# A listing's walk serves reads for two seconds: a python descheduled that long on a busy
# machine reads from the mount again, so the listing and the look are tried again.
for _ in range(5):
    os.listdir("/proc")
    after = look()
    if all(after[f][-1] is True for f in ["stat", "status", "cmdline", "statm"]):
        break
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
        // The namespace links answer as through the mount: root follows them to the
        // namespace (a regular file numbered as the namespace, as the kernel gives it),
        // another user may not (EACCES); lstat sees the links; a name that is no
        // namespace is not there.
        for ns in ["cgroup", "pid", "nosuch"] {
            for follow in [true, false] {
                let k = format!("ns/{ns} {}", if follow { "True" } else { "False" });
                assert_eq!(mount[&k], walk[&k], "{k} (uid {uid:?})");
                let want = match (uid, follow, ns) {
                    // Not a namespace (the walk leaves it to the view): not there, as
                    // the kernel says to anyone.
                    (_, _, "nosuch") => serde_json::json!(["err", libc::ENOENT]),
                    (None, true, _) => serde_json::json!(["ok", libc::S_IFREG, true]),
                    (_, false, _) => serde_json::json!(["ok", libc::S_IFLNK]),
                    (Some(_), true, _) => serde_json::json!(["err", libc::EACCES]),
                };
                assert_eq!(walk[&k], want, "{k} (uid {uid:?})");
            }
        }
        // The cluster's init has no namespaces in the view.
        assert_eq!(mount["init ns"], libc::ENOENT, "(uid {uid:?})");
        assert_eq!(walk["init ns"], libc::ENOENT, "(uid {uid:?})");
        // /proc/uptime: the walk's copy, in the kernel's format.
        assert_eq!(mount["uptime"][2], false);
        assert_eq!(walk["uptime"][2], true, "uptime during a walk: {walk}");
        for u in [&mount["uptime"][1], &walk["uptime"][1]] {
            let u = u.as_str().unwrap_or_default();
            let f: Vec<f64> = u
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            assert!(f.len() == 2 && u.ends_with('\n'), "uptime {u:?}");
        }
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

/// A walk goes on past its first two seconds while its tool keeps using it (a slow pass
/// over thousands of processes stays one snapshot instead of falling to a round trip per
/// file halfway), and ends after a pause of more than a second: the look after the pause
/// is the mount's, as it is now.
#[test]
fn a_walk_goes_on_while_it_is_used_and_ends_after_a_pause() {
    root_or_skip!("a_walk_goes_on_while_it_is_used_and_ends_after_a_pause");
    let c = Cluster::up(2);
    let g = run_d(&c, 2, &["sleep", "8402"]);
    let script = format!(
        r#"python3 - <<'PY'
import json, os, time
g = {g}
def from_walk():
    fd = os.open("/proc/%d/stat" % g, os.O_RDONLY)
    walk = os.readlink("/proc/self/fd/%d" % fd).startswith("/memfd:")
    os.close(fd)
    return walk
result = None
# A python descheduled for most of a second would look like a pause: such a try is
# made again.
for attempt in range(5):
    os.listdir("/proc")
    start = last = time.monotonic()
    steady, used = True, []
    while last - start < 3.0:
        time.sleep(0.05)
        now = time.monotonic()
        steady = steady and now - last < 0.8
        last = now
        used.append([round(now - start, 2), from_walk()])
    if not steady:
        continue
    time.sleep(1.5)
    result = [used, from_walk()]
    break
print(json.dumps(result))
PY"#
    );
    let o = shell(&c, 1, None, &script);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    assert!(!v.is_null(), "no try without a pause: {}", text(&o));
    let used = v[0].as_array().expect("reads");
    assert!(
        used.iter().all(|r| r[1] == true),
        "every read of the pass from the walk, also after two seconds: {used:?}"
    );
    assert!(used.last().is_some_and(|r| r[0].as_f64() >= Some(2.5)));
    assert_eq!(v[1], false, "after a pause, the mount's: {}", text(&o));
    c.clan_ok(&["kill", "-s", "KILL", &g.to_string()]);
}

/// The pid of node `n`'s view server, from its pid file.
fn view_server(c: &Cluster, n: u32) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(c.node_dir(n).join("procfs.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    (comm.trim() == "clan-procfs").then_some(pid)
}

/// The file system types of the mounts at node `n`'s view directory in its mount
/// namespace, bottom first.
fn mounts_at_view(c: &Cluster, n: u32) -> Vec<String> {
    let init = std::fs::read_to_string(c.node_dir(n).join("init.pid")).expect("init.pid");
    let mounts = std::fs::read_to_string(format!("/proc/{}/mountinfo", init.trim()))
        .expect("the node's mountinfo");
    let view = c.node_dir(n).join("proc");
    mounts
        .lines()
        .filter(|l| l.split_whitespace().nth(4) == view.to_str())
        .filter_map(|l| l.split_once(" - ")?.1.split(' ').next().map(str::to_string))
        .collect()
}

/// How many cluster /proc views (FUSE mounts) are at node `n`'s view directory.
fn views_mounted(c: &Cluster, n: u32) -> usize {
    mounts_at_view(c, n)
        .iter()
        .filter(|t| t.starts_with("fuse"))
        .count()
}

/// Writes a line into a fifo once its reader (a shell waiting in `read`) has it open.
fn tell_fifo(path: &std::path::Path) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = eventually("the shell to wait on its fifo", LIMIT, || {
        std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .ok()
    });
    f.write_all(b"go\n").expect("write the fifo");
}

/// Sends SIGCONT to a process stopped by the test when dropped, also on a panic.
struct Stopped(i32);

impl Stopped {
    fn new(pid: i32) -> Stopped {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGSTOP,
        )
        .expect("SIGSTOP");
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0),
            nix::sys::signal::Signal::SIGCONT,
        );
    }
}

/// A running clan shell keeps a working /proc across a crash of its node's view server:
/// while no server runs, a read of its /proc fails at once (no hang); once cland has
/// started a new one, the same shell sees every node's processes again, with its own
/// /proc/self and /dev/fd.
#[test]
fn a_clan_shell_outlives_a_restart_of_its_view_server() {
    use std::io::BufRead;
    root_or_skip!("a_clan_shell_outlives_a_restart_of_its_view_server");
    // Node 1's cland is stopped for a moment below (so that it does not replace its view
    // server yet): a long failure detector keeps the other nodes from declaring it dead.
    let c = Cluster::up_with(3, &["--heartbeat-ms", "200", "--dead-after-ms", "30000"]);
    let a = run_d(&c, 2, &["sleep", "8501"]);
    let b = run_d(&c, 3, &["sleep", "8502"]);
    let dir = c.dir.join("restart");
    std::fs::create_dir_all(&dir).expect("test dir");
    let (go1, go2) = (dir.join("go1"), dir.join("go2"));
    for f in [&go1, &go2] {
        nix::unistd::mkfifo(f, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    }
    let down = dir.join("down");
    let script = format!(
        "d={d}; ls /proc >/dev/null && echo ready; read x < $d/go1; \
         t0=$(date +%s%N); timeout 20 ls /proc >/dev/null 2>&1; echo ls=$? > $d/tmp; \
         timeout 20 cat /proc/self/status >/dev/null 2>&1; echo self=$? >> $d/tmp; \
         echo ms=$(( ($(date +%s%N) - t0) / 1000000 )) >> $d/tmp; mv $d/tmp $d/down; \
         read x < $d/go2; \
         echo ---; ls /proc; echo ---; ps aux; echo ---; head -1 /proc/self/status; \
         ls /dev/fd/ >/dev/null && echo fd-ok",
        d = dir.display()
    );
    let mut sh = Command::new("timeout")
        .arg("120")
        .arg(bin("clan"))
        .args(["shell", "--node", "1", "--", "bash", "-c", &script])
        .env("CLAN_DIR", &c.dir)
        .env_remove("CLAN_NODE")
        .env("PATH", path_with_bins())
        .current_dir("/tmp")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("clan shell");
    let mut out = std::io::BufReader::new(sh.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("the shell's first line");
    if line.trim() != "ready" {
        let o = sh.wait_with_output().expect("clan shell");
        panic!("the shell did not start: {line:?}\n{}", text(&o));
    }

    // Kill -9 node 1's view server while its cland can not start another: the watcher
    // removes the dead view from the node's namespace.
    let old = view_server(&c, 1).expect("node 1's view server");
    let held = Stopped::new(c.cland_pid(1));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the view server");
    eventually("the dead view to be removed", LIMIT, || {
        (views_mounted(&c, 1) == 0).then_some(())
    });
    // The shell's reads fail now, and at once.
    tell_fifo(&go1);
    let said = eventually("the shell's reads without a server", LIMIT, || {
        std::fs::read_to_string(&down).ok()
    });
    let field = |k: &str| -> i64 {
        said.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{k} in {said:?}"))
    };
    assert_ne!(field("self"), 0, "/proc/self read without a server: {said}");
    assert!(field("ms") < 5000, "reads without a server hung: {said}");

    // cland starts a new server; the same shell sees the cluster again.
    drop(held);
    eventually("a new view server on node 1", LIMIT, || {
        view_server(&c, 1)
            .filter(|&p| p != old && views_mounted(&c, 1) == 1)
            .map(|_| ())
    });
    tell_fifo(&go2);
    let o = sh.wait_with_output().expect("clan shell");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).expect("the shell's output");
    let all = format!(
        "{:?}\n--- stdout\n{rest}--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{all}");
    let parts: Vec<&str> = rest.split("---\n").collect();
    assert_eq!(parts.len(), 4, "{all}");
    let listed: Vec<&str> = parts[1].lines().collect();
    for g in [10000001, 20000001, 30000001, a, b] {
        assert!(
            listed.contains(&g.to_string().as_str()),
            "ls /proc does not list {g}: {all}"
        );
    }
    for g in [a, b] {
        assert!(
            parts[2]
                .lines()
                .any(|l| l.split_whitespace().nth(1) == Some(&g.to_string())
                    && l.contains("sleep 850")),
            "ps aux does not list {g}: {all}"
        );
    }
    assert!(
        parts[3].starts_with("Name:\thead\nfd-ok"),
        "/proc/self or /dev/fd: {all}"
    );
    for g in [a, b] {
        c.clan_ok(&["kill", "-s", "KILL", &g.to_string()]);
    }
}
