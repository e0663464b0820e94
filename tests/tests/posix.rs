//! POSIX process semantics across nodes on real local clusters: job control through the stub
//! with an unmodified interactive bash, process groups and sessions, sigsend, orphaned
//! groups, waits and zombies, node failure (issue 3).

use clan_core::Gpid;
use clan_tests::*;
use std::time::Duration;

macro_rules! root_or_skip {
    ($name:expr) => {
        if !need_root($name) {
            return;
        }
    };
}

/// The state letter of the only process on `node` whose command is `cmd`.
fn state_of(c: &Cluster, node: u32, cmd: &str) -> Option<String> {
    c.ps(&["--node", &node.to_string()])
        .into_iter()
        .find(|p| p["cmd"].as_str() == Some(cmd))
        .and_then(|p| p["state"].as_str().map(str::to_string))
}

/// Waits until bash shows its prompt again: what is typed before goes to the job.
fn at_prompt(t: &Terminal) {
    t.wait_for("the prompt", |s| {
        s.lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map(str::trim_end)
            == Some("$")
    });
}

#[test]
fn job_control_of_a_remote_process_from_an_interactive_bash() {
    root_or_skip!("job_control_of_a_remote_process_from_an_interactive_bash");
    let c = Cluster::up(2);
    let dir = c.dir.display().to_string();
    let path = path_with_bins();
    let t = Terminal::bash(&[("CLAN_DIR", &dir), ("PATH", &path)]);

    // Ctrl-Z stops the remote process, and bash reports the job stopped.
    t.line("clan run --node 2 -- sleep 1001");
    eventually("sleep on node 2", Duration::from_secs(20), || {
        state_of(&c, 2, "sleep 1001").filter(|s| s == "S")
    });
    t.keys(&["C-z"]);
    t.wait_for("bash to report the job stopped", |s| {
        s.contains("Stopped                 clan run --node 2 -- sleep 1001")
    });
    assert_eq!(state_of(&c, 2, "sleep 1001").as_deref(), Some("T"));

    // A continue from elsewhere wakes the stub too: bash sees the job running.
    let g = c
        .ps(&["--node", "2"])
        .into_iter()
        .find(|p| p["cmd"] == "sleep 1001")
        .expect("sleep 1001")["gpid"]
        .to_string();
    c.clan_ok(&["kill", "-s", "CONT", &g]);
    t.clear();
    t.line("jobs");
    t.wait_for("bash to see the job running", |s| {
        s.contains("Running                 clan run --node 2 -- sleep 1001")
    });
    // Stopped again from the terminal's side, as before.
    t.clear();
    t.line("kill -TSTP %1");
    eventually("sleep stopped again", Duration::from_secs(20), || {
        state_of(&c, 2, "sleep 1001").filter(|s| s == "T")
    });
    t.line("jobs");
    t.wait_for("stopped again", |s| {
        s.contains("Stopped                 clan run --node 2 -- sleep 1001")
    });

    // bg continues it in the background.
    t.line("bg");
    t.wait_for("bg", |s| s.contains("clan run --node 2 -- sleep 1001 &"));
    eventually("sleep running again", Duration::from_secs(20), || {
        state_of(&c, 2, "sleep 1001").filter(|s| s == "S")
    });

    // fg brings it back; Ctrl-C interrupts it, and the shell sees 130.
    t.clear();
    t.line("fg");
    t.wait_for("fg", |s| s.contains("clan run --node 2 -- sleep 1001\n"));
    t.keys(&["C-c"]);
    at_prompt(&t);
    t.line("echo status=$?");
    t.wait_for("the status of the interrupted job", |s| {
        s.contains("status=130")
    });
    assert_eq!(
        state_of(&c, 2, "sleep 1001"),
        None,
        "the remote sleep is gone"
    );

    // A background job that does not read its terminal keeps running; one that reads it
    // stops with SIGTTIN, as it would locally.
    t.clear();
    t.line("clan run --node 2 -- sleep 1002 &");
    t.line("clan run --node 2 -- cat &");
    eventually(
        "cat stopped by the terminal",
        Duration::from_secs(20),
        || state_of(&c, 2, "cat").filter(|s| s == "T"),
    );
    t.line("jobs -l");
    t.wait_for("bash to see the tty-input stop", |s| {
        s.contains("Stopped (tty input)     clan run --node 2 -- cat")
    });
    assert_eq!(state_of(&c, 2, "sleep 1002").as_deref(), Some("S"));

    // In the foreground again it reads the terminal.
    t.clear();
    t.line("fg %2");
    t.wait_for("fg %2", |s| s.contains("clan run --node 2 -- cat\n"));
    t.line("hello from the terminal");
    t.wait_for("cat's echo", |s| {
        s.matches("hello from the terminal").count() >= 2
    });
    t.keys(&["C-d"]);
    t.line("echo status=$?");
    t.wait_for("cat's exit status", |s| s.contains("status=0"));
    assert_eq!(state_of(&c, 2, "cat"), None);

    // A program that catches SIGTSTP and stops itself from its handler (as editors do)
    // stops: the remote group has a parent in its session, so its kernel is not told it is
    // orphaned.
    t.clear();
    t.line(
        "clan run --node 2 -- python3 -c \"import os, signal, time\n\
def h(s, f):\n    signal.signal(signal.SIGTSTP, signal.SIG_DFL); os.kill(0, signal.SIGTSTP)\n\
signal.signal(signal.SIGTSTP, h)\nprint('ready', flush=True)\ntime.sleep(1006)\"",
    );
    t.wait_for("the python job", |s| s.contains("ready\n"));
    t.keys(&["C-z"]);
    t.wait_for("bash to report it stopped", |s| s.contains("Stopped"));
    let py = eventually("python stopped", Duration::from_secs(20), || {
        c.ps(&["--node", "2"])
            .into_iter()
            .find(|p| p["cmd"].as_str().is_some_and(|c| c.contains("python3 -c")))
            .filter(|p| p["state"] == "T")
    });
    c.clan_ok(&["kill", "-9", &py["gpid"].to_string()]);
    t.clear();
    t.line("fg");
    t.wait_for("the python job's end", |s| s.contains("Killed"));
    t.line("echo status=$?");
    t.wait_for("its status", |s| s.contains("status=137"));

    // With -t, Ctrl-Z typed into the remote terminal stops the remote job.
    t.clear();
    t.line("clan run -t --node 2 -- sleep 1007");
    eventually("sleep 1007 on node 2", Duration::from_secs(20), || {
        state_of(&c, 2, "sleep 1007").filter(|s| s == "S")
    });
    t.keys(&["C-z"]);
    t.wait_for("bash to report the -t job stopped", |s| {
        s.contains("Stopped                 clan run -t --node 2 -- sleep 1007")
    });
    assert_eq!(state_of(&c, 2, "sleep 1007").as_deref(), Some("T"));
    t.clear();
    t.line("fg");
    t.wait_for("fg of the -t job", |s| s.contains("sleep 1007\n"));
    eventually("sleep 1007 running", Duration::from_secs(20), || {
        state_of(&c, 2, "sleep 1007").filter(|s| s == "S")
    });
    t.keys(&["C-c"]);
    at_prompt(&t);
    t.line("echo status=$?");
    t.wait_for("the -t job interrupted", |s| s.contains("status=130"));

    // Ctrl-C of a run with a copy on each node ends a shell loop around it.
    t.clear();
    t.line("for i in 1 2; do clan run -N 2 -- sleep 1003; echo next-$((i*10)); done");
    eventually("both copies", Duration::from_secs(20), || {
        (live(&c, "sleep 1003").len() == 2).then_some(())
    });
    t.keys(&["C-c"]);
    at_prompt(&t);
    t.line("echo after-$((2+3))");
    let screen = t.wait_for("the loop to end", |s| s.contains("after-5"));
    assert!(!screen.contains("next-10"), "{screen}");
    assert!(live(&c, "sleep 1003").is_empty());
}

/// The processes whose command is `cmd`, as `clan ps` lists them (zombies excluded).
fn live(c: &Cluster, cmd: &str) -> Vec<serde_json::Value> {
    c.ps(&[])
        .into_iter()
        .filter(|p| p["cmd"].as_str() == Some(cmd) && p["state"] != "Z")
        .collect()
}

fn one(c: &Cluster, cmd: &str) -> serde_json::Value {
    eventually(cmd, Duration::from_secs(20), || {
        let v = live(c, cmd);
        (v.len() == 1).then(|| v[0].clone())
    })
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn groups_and_sessions_span_nodes() {
    root_or_skip!("groups_and_sessions_span_nodes");
    let c = Cluster::up(3);
    let user = test_user("clantesta");
    // A shell on node 1 starts members of its group on nodes 2 and 3; one of them leaves the
    // group with setsid (on node 2), so does a local child (on node 1); one runs as a user.
    let script = format!(
        "clan run -d --node 2 -- sh -c 'setsid sleep 1006 & exec sleep 1001' >/dev/null; \
         clan run -d --node 3 -- sleep 1002 >/dev/null; \
         setpriv --reuid={user} --regid={user} --clear-groups clan run -d --node 2 -- sleep 1007 >/dev/null; \
         setsid sleep 1004 & exec sleep 1003"
    );
    let leader = c.spawn(1, &["sh", "-c", &script]);
    let g = leader.raw();
    // The shell execs sleep 1003 once every `clan run` before it has returned, that is
    // once their processes are members (a process is visible a moment before that).
    one(&c, "sleep 1003");
    let members: Vec<serde_json::Value> = ["sleep 1001", "sleep 1002", "sleep 1003", "sleep 1007"]
        .iter()
        .map(|cmd| one(&c, cmd))
        .collect();
    for m in &members {
        assert_eq!(m["pgid"], g, "{m}");
        assert_eq!(m["sid"], g, "{m}");
    }
    assert_eq!(members[0]["node"], 2);
    assert_eq!(members[1]["node"], 3);
    let (left2, left1) = (one(&c, "sleep 1006"), one(&c, "sleep 1004"));
    for m in [&left2, &left1] {
        assert_ne!(m["pgid"], g, "setsid leaves the group: {m}");
        assert_eq!(m["sid"], m["gpid"], "and makes a session of its own: {m}");
    }

    // The user may signal only their own member: it is signalled, the others are refused
    // by name, and the exit status says so.
    let o = std::process::Command::new("setpriv")
        .args([
            &format!("--reuid={user}"),
            &format!("--regid={user}"),
            "--clear-groups",
        ])
        .arg(bin("clan"))
        .args(["kill", "-g", &g.to_string()])
        .env("CLAN_DIR", &c.dir)
        .current_dir("/tmp")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    for m in &members[..3] {
        assert!(
            stderr(&o).contains(&m["gpid"].to_string()),
            "{}",
            stderr(&o)
        );
    }
    eventually("the user's member gone", Duration::from_secs(20), || {
        live(&c, "sleep 1007").is_empty().then_some(())
    });
    assert_eq!(live(&c, "sleep 1001").len(), 1, "root's members stay");

    // Root signals the whole group: members on three nodes go, the ones that left stay.
    c.clan_ok(&["kill", "-g", &format!("1:{}", leader.local())]);
    for cmd in ["sleep 1001", "sleep 1002", "sleep 1003"] {
        eventually(cmd, Duration::from_secs(20), || {
            live(&c, cmd).is_empty().then_some(())
        });
    }
    assert_eq!(live(&c, "sleep 1006").len(), 1);
    assert_eq!(live(&c, "sleep 1004").len(), 1);

    // A session by its id: the one made on node 2.
    c.clan_ok(&["kill", "--session", &left2["sid"].to_string()]);
    eventually("sleep 1006 gone", Duration::from_secs(20), || {
        live(&c, "sleep 1006").is_empty().then_some(())
    });
    assert_eq!(live(&c, "sleep 1004").len(), 1);

    // Groups and sessions that do not exist.
    let o = c.clan(&["kill", "-g", "2:99999"]);
    assert_eq!(o.status.code(), Some(3));
    assert!(
        stderr(&o).contains("no process group 20099999"),
        "{}",
        stderr(&o)
    );
    let o = c.clan(&["kill", "--session", "3:99999"]);
    assert_eq!(o.status.code(), Some(3));
    assert!(stderr(&o).contains("no session 30099999"), "{}", stderr(&o));
}

#[test]
fn sigsend_takes_set_expressions() {
    root_or_skip!("sigsend_takes_set_expressions");
    let c = Cluster::up(3);
    let a = c.spawn(1, &["sleep", "1011"]);
    let b = c.spawn(2, &["sleep", "1012"]);
    let d = c.spawn(3, &["sleep", "1013"]);
    let job_b = c.ps_one(b).unwrap()["job"].as_u64().unwrap();
    // Signal 0 probes: exit 0 when something matched.
    c.clan_ok(&["sigsend", "-s", "0", &format!("pid={a} or pid={d}")]);
    // STOP exactly the set: node 2's sleep by its job, node 3's by node and pid.
    c.clan_ok(&[
        "sigsend",
        "-s",
        "STOP",
        &format!("job={job_b} || (node=3 && not pid={a} && pid={d})"),
    ]);
    for (g, want) in [(a, "S"), (b, "T"), (d, "T")] {
        eventually("states", Duration::from_secs(20), || {
            (c.ps_one(g).unwrap()["state"] == want).then_some(())
        });
    }
    c.clan_ok(&["sigsend", "-CONT", "uid=root and (node=2 or node=3)"]);
    for g in [b, d] {
        eventually("continued", Duration::from_secs(20), || {
            (c.ps_one(g).unwrap()["state"] == "S").then_some(())
        });
    }
    // Nothing matches: exit 3 naming the expression.
    let o = c.clan(&["sigsend", "-s", "0", "pid=2:99999"]);
    assert_eq!(o.status.code(), Some(3));
    assert!(
        stderr(&o).contains("no process matches \"pid=2:99999\""),
        "{}",
        stderr(&o)
    );
    // A malformed expression: usage exit, the offending token pointed at.
    let o = c.clan(&["sigsend", "pid=1:5 and colour=red"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("column 13: unknown key 'colour'"),
        "{}",
        stderr(&o)
    );
    let o = c.clan(&["sigsend", "(pid=1:5"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("expected ')'"), "{}", stderr(&o));
    // A dead node is reported and the others still act.
    c.power_cut(3);
    eventually("node 3 dead", Duration::from_secs(20), || {
        c.clan_ok(&["nodes"])
            .lines()
            .any(|l| l.trim_start().starts_with('3') && l.contains("dead"))
            .then_some(())
    });
    let o = c.clan(&[
        "sigsend",
        "-KILL",
        "uid=0 and (pid=1:1 or pid=3:1 or pid=2:1 or all)",
    ]);
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    assert!(stderr(&o).contains("node 3"), "{}", stderr(&o));
    for g in [a, b] {
        eventually("killed", Duration::from_secs(20), || {
            c.ps_one(g).is_none_or(|p| p["state"] == "Z").then_some(())
        });
    }
}

#[test]
fn node_failure_looks_like_a_kill_and_the_node_rejoins() {
    root_or_skip!("node_failure_looks_like_a_kill_and_the_node_rejoins");
    use std::os::unix::process::ExitStatusExt;
    let c = Cluster::up(4);
    // On node 3: a detached process waited for from node 1, attached ones from nodes 1 and 2.
    let d = c.spawn(3, &["sleep", "1021"]);
    let waiter = c
        .cmd()
        .args(["--from", "1", "wait", &d.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stubs: Vec<std::process::Child> = [1, 2]
        .iter()
        .map(|from| {
            c.cmd()
                .args([
                    "--from",
                    &from.to_string(),
                    "run",
                    "--node",
                    "3",
                    "--",
                    "sleep",
                    "1022",
                ])
                .stdin(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    eventually(
        "both attached sleeps on node 3",
        Duration::from_secs(20),
        || (live(&c, "sleep 1022").len() == 2).then_some(()),
    );
    // A parent on node 3 with a child on node 2: once node 3 is gone, nobody waits for
    // the child, so it leaves no zombie, even after node 3 is back.
    c.spawn(
        3,
        &[
            "sh",
            "-c",
            "clan run -d --node 2 -- sleep 1091 >/dev/null 2>&1; exec sleep 1092",
        ],
    );
    let orphan = one(&c, "sleep 1091")["gpid"].clone();
    // ps listings keep going on node 2 while node 3 dies.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let lister = {
        let (cmd, stop) = (c.cmd(), stop.clone());
        let mut cmd = cmd;
        cmd.args(["--from", "2", "ps"]);
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let o = cmd.output().unwrap();
                assert!(matches!(o.status.code(), Some(0) | Some(5)), "{o:?}");
                n += 1;
            }
            n
        })
    };

    c.power_cut(3);
    // The waiting parent hears "killed by SIGKILL"; the stubs die of SIGKILL.
    let o = waiter.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(128 + 9));
    assert!(String::from_utf8_lossy(&o.stdout).contains("killed by SIGKILL"));
    for s in stubs {
        let st = s.wait_with_output().unwrap().status;
        assert_eq!(st.signal(), Some(libc::SIGKILL), "{st:?}");
    }
    // Its processes leave the listing, which names the node once and exits 5.
    let o = c.clan(&["ps"]);
    assert_eq!(o.status.code(), Some(5));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(!text.contains("sleep 102"), "{text}");
    assert_eq!(stderr(&o).matches("node 3").count(), 1, "{}", stderr(&o));
    // The others keep working.
    let o = c.clan(&["run", "--node", "4", "--", "hostname"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "node4");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(lister.join().unwrap() > 0);

    // It comes back and rejoins: every node sees it up and it runs processes again.
    c.node_start(3);
    for from in 1..=4 {
        let nodes = c.clan_ok(&["--from", &from.to_string(), "nodes"]);
        assert_eq!(
            nodes.lines().filter(|l| l.contains(" up ")).count(),
            4,
            "{nodes}"
        );
    }
    let o = c.clan(&[
        "--from",
        "1",
        "run",
        "--node",
        "3",
        "--",
        "sh",
        "-c",
        "hostname; exit 4",
    ]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "node3");
    assert_eq!(o.status.code(), Some(4));
    let g = c.spawn(3, &["sleep", "1023"]);
    c.clan_ok(&["--from", "2", "kill", "-9", &g.to_string()]);
    let o = c.clan(&["wait", &g.to_string()]);
    assert_eq!(o.status.code(), Some(128 + 9));
    c.clan_ok(&["kill", &orphan.to_string()]);
    eventually("the orphan reaped", Duration::from_secs(20), || {
        c.ps(&["--node", "2"])
            .iter()
            .all(|p| p["gpid"] != orphan)
            .then_some(())
    });
}

/// Every node's table sizes, by (node, table).
fn tables(c: &Cluster) -> std::collections::BTreeMap<(u32, String), u64> {
    let out = c.clan_ok(&["stats", "tables"]);
    out.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((
                (f.first()?.parse().ok()?, f.get(1)?.to_string()),
                f.get(2)?.parse().ok()?,
            ))
        })
        .collect()
}

fn zombies(c: &Cluster) -> Vec<serde_json::Value> {
    c.ps(&[])
        .into_iter()
        .filter(|p| p["state"] == "Z")
        .collect()
}

#[test]
fn waits_follow_the_zombie_state_machine() {
    root_or_skip!("waits_follow_the_zombie_state_machine");
    let c = Cluster::up(3);
    // A stopped and continued child is reported when asked (WUNTRACED, WCONTINUED), once.
    let g = c.spawn(2, &["sleep", "1031"]);
    c.clan_ok(&["kill", "-s", "STOP", &g.to_string()]);
    let o = c.clan(&["wait", "-u", &g.to_string()]);
    assert_eq!(o.status.code(), Some(128 + libc::SIGSTOP));
    assert!(String::from_utf8_lossy(&o.stdout).contains("stopped by SIGSTOP"));
    c.clan_ok(&["kill", "-s", "CONT", &g.to_string()]);
    let o = c.clan(&["wait", "-u", "-c", &g.to_string()]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("continued"),
        "{o:?}"
    );
    // An exit with a core dump flag and times.
    c.clan_ok(&["kill", "-s", "QUIT", &g.to_string()]);
    let o = c.clan(&["wait", "-u", "-c", &g.to_string()]);
    assert_eq!(o.status.code(), Some(128 + libc::SIGQUIT), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("killed by SIGQUIT"),
        "{o:?}"
    );
    assert!(c.ps_one(g).is_none(), "reaped once waited for");

    // A wait whose caller goes away collects nothing: the next wait gets the status (of a
    // process that lives until it is killed: a busy machine may take long to get here).
    let g = c.spawn(2, &["sleep", "1032"]);
    let o = std::process::Command::new("timeout")
        .args(["0.2", bin("clan").to_str().unwrap(), "wait", &g.to_string()])
        .env("CLAN_DIR", &c.dir)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(124), "{o:?}");
    // Only the parent's node collects it: a wait from another node is refused.
    let o = c.clan(&["--from", "3", "wait", &g.to_string()]);
    assert_eq!(o.status.code(), Some(127), "{o:?}");
    assert!(stderr(&o).contains("not a child"), "{}", stderr(&o));
    c.clan_ok(&["kill", &g.to_string()]);
    let o = c.clan(&["wait", &g.to_string()]);
    assert_eq!(o.status.code(), Some(128 + libc::SIGTERM), "{o:?}");

    // A parent inside the cluster that exits without waiting releases its children: their
    // zombies go (the ones that exited before it, and the one that exits after it).
    let script = "clan run -d --node 2 -- true >/dev/null; \
                  clan run -d --node 3 -- true >/dev/null; \
                  clan run -d --node 3 -- sleep 0.5 >/dev/null; sleep 0.2";
    let p = c.spawn(1, &["sh", "-c", script]);
    let o = c.clan(&["wait", &p.to_string()]);
    assert_eq!(o.status.code(), Some(0));
    eventually("no zombie nor child left", Duration::from_secs(20), || {
        (zombies(&c).is_empty() && live(&c, "sleep 0.5").is_empty()).then_some(())
    });
}

#[test]
fn ten_thousand_short_remote_processes_leave_the_tables_as_they_were() {
    root_or_skip!("ten_thousand_short_remote_processes_leave_the_tables_as_they_were");
    let c = Cluster::up(3);
    let before = tables(&c);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // 8,000 through the client library, eight at a time from every node to the next one:
    // half attached (the stub's path), half detached and waited for.
    let clients: Vec<(clan_client::Client, u32)> = (0..8u32)
        .map(|w| (c.client(w % 3 + 1), (w + 1) % 3 + 1))
        .collect();
    rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for (cl, target) in clients {
            set.spawn(async move {
                for i in 0..1000 {
                    let spec = clan_client::RunSpec::command(["true"]).node(target);
                    if i % 2 == 0 {
                        let st = cl.run_status(spec).await.expect("run");
                        assert_eq!(st.code, 0);
                    } else {
                        let s = cl.spawn(spec).await.expect("spawn");
                        let st = cl.wait_one(s.gpids[0]).await.expect("wait");
                        assert_eq!(st.code, 0);
                    }
                }
            });
        }
        set.join_all().await;
    });
    // 2,000 more started by a shell inside the cluster that never waits; it exits.
    let script = "i=0; while [ $i -lt 2000 ]; do \
                  clan run -d --node $((i % 2 + 2)) -- true >/dev/null 2>&1 || exit 9; \
                  i=$((i + 1)); done";
    let sh = c.spawn(1, &["sh", "-c", script]);
    // Waited for without the CLI helper's two-minute cap: 2,000 starts of a debug `clan`
    // take their time on a busy machine.
    let st = rt.block_on(c.client(1).wait_one(sh)).expect("wait");
    assert_eq!(st.code, 0, "{st:?}");
    // The spare session connections are a cache, not a record of what ran: they may grow
    // from none, up to their bound (four per peer).
    let records = |t: std::collections::BTreeMap<(u32, String), u64>| {
        let (spares, rest): (std::collections::BTreeMap<_, _>, _) = t
            .into_iter()
            .partition(|((_, name), _)| name == "sessions.spare");
        (spares, rest)
    };
    let (_, before) = records(before);
    eventually(
        "the tables back to their size",
        Duration::from_secs(60),
        || (records(tables(&c)).1 == before).then_some(()),
    );
    let (spares, _) = records(tables(&c));
    assert_eq!(spares.len(), 3, "{spares:?}");
    assert!(spares.values().all(|&n| n <= 4 * 2), "{spares:?}");
    assert!(zombies(&c).is_empty(), "{:?}", zombies(&c));
}

/// Writes `member.sh` in the cluster's directory: a process that records each SIGHUP and
/// SIGCONT it gets in `marks` there. Returns the directory.
fn marking_member(c: &Cluster) -> String {
    let d = c.dir.display().to_string();
    std::fs::write(
        c.dir.join("member.sh"),
        format!(
            "trap 'echo hup >> {d}/marks' HUP; trap 'echo cont >> {d}/marks' CONT\n\
             while :; do sleep 0.05; done\n"
        ),
    )
    .unwrap();
    d
}

/// The signals `member.sh` recorded.
fn marks(c: &Cluster) -> String {
    std::fs::read_to_string(c.dir.join("marks")).unwrap_or_default()
}

#[test]
fn an_orphaned_group_with_a_stopped_remote_member_gets_hup_and_cont() {
    root_or_skip!("an_orphaned_group_with_a_stopped_remote_member_gets_hup_and_cont");
    let c = Cluster::up(2);
    let d = marking_member(&c);
    // A session on node 1 (sh, group A) with a job group J: L1 (J's leader, child of sh)
    // starts the member on node 2; L2 joins J as a child of sh2 (a child of sh in group A).
    // sh and sh2 are J's controlling links.
    let script = format!(
        "python3 -c 'import os,sys; os.setpgid(0,0); os.execvp(\"sh\", [\"sh\",\"-c\",sys.argv[1]])' \
           'clan run -d --node 2 -- sh {d}/member.sh >/dev/null; exec sleep 1041' &\n\
         J=$!\n\
         while [ \"$(ps -o pgid= -p $J | tr -d ' ')\" != \"$J\" ]; do sleep 0.01; done\n\
         ( python3 -c \"import os; os.setpgid(0, $J); os.execvp('sleep', ['sleep','1042'])\" &\n\
           while [ ! -e {d}/go2 ]; do sleep 0.02; done ) &\n\
         while [ ! -e {d}/go1 ]; do sleep 0.02; done\n"
    );
    c.spawn(1, &["sh", "-c", &script]);
    let l1 = one(&c, "sleep 1041");
    let l2 = one(&c, "sleep 1042");
    let m = one(&c, &format!("sh {d}/member.sh"));
    let j = l1["gpid"].clone();
    assert_eq!(l1["pgid"], j);
    assert_eq!(l2["pgid"], j);
    assert_eq!(m["pgid"], j, "the remote member is in J");
    assert_eq!(m["sid"], l1["sid"], "and in the session");
    let mg: Gpid = m["gpid"].as_u64().unwrap().to_string().parse().unwrap();
    c.clan_ok(&["kill", "-s", "STOP", &mg.to_string()]);
    eventually("member stopped", Duration::from_secs(20), || {
        (c.ps_one(mg).unwrap()["state"] == "T").then_some(())
    });

    // sh2 exits: J keeps a link (sh), so nothing is sent. (J's home samples its links: wait
    // until it has seen both.)
    eventually(
        "node 1 to see J's two links",
        Duration::from_secs(20),
        || (tables(&c).get(&(1, "group.links".to_string())) == Some(&2)).then_some(()),
    );
    std::fs::write(c.dir.join("go2"), "").unwrap();
    eventually(
        "the check after sh2's exit",
        Duration::from_secs(20),
        || {
            let log = c.log(1);
            log.contains("still controlled").then_some(())
        },
    );
    assert!(
        !c.dir.join("marks").exists(),
        "a controlled group got signals"
    );
    assert_eq!(c.ps_one(mg).unwrap()["state"], "T");

    // sh exits: J is orphaned with a stopped member: every member gets SIGHUP then SIGCONT.
    std::fs::write(c.dir.join("go1"), "").unwrap();
    eventually(
        "SIGHUP and SIGCONT at the member",
        Duration::from_secs(20),
        || {
            let m = marks(&c);
            (m.contains("hup") && m.contains("cont")).then_some(())
        },
    );
    eventually("the member running again", Duration::from_secs(20), || {
        (c.ps_one(mg).unwrap()["state"] != "T").then_some(())
    });
    // The local members had no handler: SIGHUP ended them.
    for cmd in ["sleep 1041", "sleep 1042"] {
        eventually(cmd, Duration::from_secs(20), || {
            live(&c, cmd).is_empty().then_some(())
        });
    }
}

/// A node that said goodbye may hold controlling links (its processes live on): a group
/// whose other links are gone is not taken for orphaned while that node is away; once it
/// answers again (and holds none), the group gets SIGHUP and SIGCONT.
#[test]
fn an_orphan_check_waits_for_a_node_that_is_away() {
    root_or_skip!("an_orphan_check_waits_for_a_node_that_is_away");
    let c = Cluster::up(3);
    let d = marking_member(&c);
    // sh (group A) on node 1 with a job group J: L1, its child, starts the member on node
    // 2. sh is J's one controlling link.
    let script = format!(
        "python3 -c 'import os,sys; os.setpgid(0,0); os.execvp(\"sh\", [\"sh\",\"-c\",sys.argv[1]])' \
           'clan run -d --node 2 -- sh {d}/member.sh >/dev/null; exec sleep 1043' &\n\
         while [ ! -e {d}/go1 ]; do sleep 0.02; done\n"
    );
    c.spawn(1, &["sh", "-c", &script]);
    let l1 = one(&c, "sleep 1043");
    let m = one(&c, &format!("sh {d}/member.sh"));
    assert_eq!(m["pgid"], l1["gpid"], "the remote member is in J");
    let mg: Gpid = m["gpid"].as_u64().unwrap().to_string().parse().unwrap();
    c.clan_ok(&["kill", "-s", "STOP", &mg.to_string()]);
    eventually("member stopped", Duration::from_secs(20), || {
        (c.ps_one(mg).unwrap()["state"] == "T").then_some(())
    });
    eventually("node 1 to see J's link", Duration::from_secs(20), || {
        (tables(&c).get(&(1, "group.links".to_string())) == Some(&1)).then_some(())
    });
    // Node 3's cland stops cleanly: away, its processes (none here) might hold links.
    let pid = nix::unistd::Pid::from_raw(c.cland_pid(3));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    eventually("node 3 away for node 1", Duration::from_secs(20), || {
        node_states(&c, 1)
            .contains(&(3, "away".into()))
            .then_some(())
    });
    gone(pid, "node 3's cland");
    // sh exits: no link left on the nodes that answer, but node 3 can not be counted.
    std::fs::write(c.dir.join("go1"), "").unwrap();
    eventually("the deferred check", Duration::from_secs(20), || {
        let log = c.log(1);
        log.contains("can not be counted").then_some(())
    });
    assert!(marks(&c).is_empty(), "signals while a node is away");
    assert_eq!(c.ps_one(mg).unwrap()["state"], "T");
    // Node 3 is back with no link: J is orphaned with a stopped member.
    let mut daemon = c.restart_cland(3);
    eventually(
        "SIGHUP and SIGCONT at the member",
        Duration::from_secs(30),
        || {
            let m = marks(&c);
            (m.contains("hup") && m.contains("cont")).then_some(())
        },
    );
    eventually("the member running again", Duration::from_secs(20), || {
        (c.ps_one(mg).unwrap()["state"] != "T").then_some(())
    });
    drop(c); // clan down stops the daemon we started
    assert!(daemon.wait().unwrap().success());
}

#[test]
fn a_stopped_remote_job_whose_shell_dies_gets_hup_and_cont() {
    root_or_skip!("a_stopped_remote_job_whose_shell_dies_gets_hup_and_cont");
    let c = Cluster::up(2);
    let d = marking_member(&c);
    let path = path_with_bins();
    let t = Terminal::bash(&[("CLAN_DIR", &d), ("PATH", &path)]);
    t.line(&format!("clan run --node 2 -- sh {d}/member.sh"));
    let m = one(&c, &format!("sh {d}/member.sh"));
    t.keys(&["C-z"]);
    t.wait_for("the job stopped", |s| s.contains("Stopped"));
    assert_eq!(
        c.ps_one(m["gpid"].as_u64().unwrap().to_string().parse().unwrap())
            .unwrap()["state"],
        "T"
    );
    // The shell dies: the stub's group is orphaned with a stopped member (the stub), so the
    // kernel sends it SIGHUP and SIGCONT, which it passes on to the remote process.
    let bash: i32 = t.pane_pid();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(bash),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    eventually(
        "SIGHUP and SIGCONT at the remote process",
        Duration::from_secs(20),
        || {
            let m = marks(&c);
            (m.contains("hup") && m.contains("cont")).then_some(())
        },
    );
}

/// Host processes whose command line starts with `prefix` (not the stubs naming them).
fn host_running(prefix: &str) -> Vec<String> {
    host_processes_mentioning(prefix)
        .into_iter()
        .filter(|l| {
            l.split_once(": ")
                .is_some_and(|(_, c)| c.starts_with(prefix))
        })
        .collect()
}

/// How `child` ended, within 30 s; one that has not is killed and the test fails (a hang
/// here would otherwise hold the whole suite).
fn ended_within(mut child: std::process::Child, what: &str) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            return st;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not end within 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until each of the `n` nodes sees every node up.
fn all_up_everywhere(c: &Cluster, n: u32) {
    eventually("every node up everywhere", Duration::from_secs(20), || {
        (1..=n)
            .all(|from| node_states(c, from).iter().all(|(_, s)| s == "up"))
            .then_some(())
    });
}

/// `clan nodes` from `from`: (node, state) pairs.
fn node_states(c: &Cluster, from: u32) -> Vec<(u32, String)> {
    c.clan_ok(&["--from", &from.to_string(), "nodes"])
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((f.first()?.parse().ok()?, f.get(1)?.to_string()))
        })
        .collect()
}

fn stub(c: &Cluster, from: u32, node: u32, argv: &[&str]) -> std::process::Child {
    c.cmd()
        .args([
            "--from",
            &from.to_string(),
            "run",
            "--node",
            &node.to_string(),
            "--",
        ])
        .args(argv)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// A stub from node `from` of `sleep N` on node `node`, returned once its session is up:
/// the process has printed a line through it (a cut before the start's reply reached the
/// stub's node would fail the start instead).
fn ready_stub(c: &Cluster, from: u32, node: u32, n: u32) -> std::process::Child {
    use std::io::BufRead;
    let mut child = stub(
        c,
        from,
        node,
        &["sh", "-c", &format!("echo ready; exec sleep {n}")],
    );
    let out = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut out = std::io::BufReader::new(out);
        let mut line = String::new();
        let _ = out.read_line(&mut line);
        let _ = tx.send(line);
        // Read on to the end: a stub whose stdout closed would pass SIGPIPE on.
        let _ = std::io::copy(&mut out, &mut std::io::sink());
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(l) if l.trim() == "ready" => child,
        other => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the stub of sleep {n} on node {node}: {other:?}");
        }
    }
}

#[test]
fn a_cut_off_node_is_declared_dead_fences_itself_and_rejoins() {
    root_or_skip!("a_cut_off_node_is_declared_dead_fences_itself_and_rejoins");
    use std::os::unix::process::ExitStatusExt;
    let net = Net::new(3);
    let c = net.cluster(3, &["--heartbeat-ms", "200", "--dead-after-ms", "1500"]);
    // Each node follows process events though it lives in a network namespace of its own
    // (the proc connector answers in the initial one only).
    for n in 1..=3 {
        let log = c.log(n);
        assert!(
            log.contains("following process events"),
            "node {n} has no job genealogy: {log}"
        );
    }
    // Node 3 holds: a process with its stub on node 1, a detached one whose parent is on
    // node 1, one with its stub on node 3; and node 3 holds a stub of a process on node 2.
    let across = ready_stub(&c, 1, 3, 2001);
    let d = c.spawn(3, &["sleep", "2002"]);
    let waiter = c
        .cmd()
        .args(["--from", "1", "wait", &d.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let at_home = ready_stub(&c, 3, 3, 2003);
    let outward = ready_stub(&c, 3, 2, 2004);
    let mut missing = Vec::new();
    let all_four = (0..1000).any(|_| {
        missing = (2001..=2004)
            .filter(|n| host_running(&format!("sleep {n}")).is_empty())
            .collect::<Vec<_>>();
        missing.is_empty() || {
            std::thread::sleep(Duration::from_millis(20));
            false
        }
    });
    assert!(
        all_four,
        "sleeps {missing:?} never ran; host: {:?}",
        host_processes_mentioning("sleep 200")
    );

    net.cut(3);
    // The majority (nodes 1 and 2) declares node 3 dead: the stub and the waiter hear
    // SIGKILL, node 2's process whose stub was on node 3 is hung up.
    let st = ended_within(across, "the stub on node 1");
    assert_eq!(st.signal(), Some(libc::SIGKILL), "{st:?}");
    let st = ended_within(waiter, "the waiter on node 1");
    assert_eq!(st.code(), Some(128 + 9), "{st:?}");
    // Node 3 loses quorum and fences itself: every process it ran is killed, its stubs
    // end as their processes were (killed), and it says it has no quorum.
    for (s, what) in [
        (at_home, "the stub on node 3"),
        (outward, "node 3's stub of node 2's process"),
    ] {
        let st = ended_within(s, what);
        assert_eq!(st.signal(), Some(libc::SIGKILL), "{st:?}");
    }
    // Exactly those four: a `sleep 200` of something else on the machine once failed this.
    let ours = |l: &String| {
        l.split_once(": ")
            .is_some_and(|(_, c)| (2001..=2004).any(|n| c.trim_end() == format!("sleep {n}")))
    };
    let mut left = Vec::new();
    let none_left = (0..1000).any(|_| {
        left = host_running("sleep 200").into_iter().filter(ours).collect();
        left.is_empty() || {
            std::thread::sleep(Duration::from_millis(20));
            false
        }
    });
    assert!(
        none_left,
        "still running 20 s after the cut: {left:?}; node 2 sees {:?}, node 3 {:?}",
        node_states(&c, 2),
        node_states(&c, 3)
    );
    let seen = node_states(&c, 3);
    assert!(
        seen.contains(&(3, "no-quorum".into())) && seen.contains(&(1, "dead".into())),
        "{seen:?}"
    );
    // The majority keeps working and lists no process of node 3.
    let o = c.clan(&["run", "--node", "2", "--", "sh", "-c", "exit 3"]);
    assert_eq!(o.status.code(), Some(3));
    assert!(node_states(&c, 1).contains(&(3, "dead".into())));
    let o = c.clan(&["ps"]);
    assert_eq!(o.status.code(), Some(5), "{o:?}");
    assert!(!String::from_utf8_lossy(&o.stdout).contains("sleep 200"));

    // The link comes back: node 3 rejoins as a new incarnation, with nothing stale.
    net.mend(3);
    eventually("node 3 back everywhere", Duration::from_secs(20), || {
        (1..=3)
            .all(|from| node_states(&c, from).iter().all(|(_, s)| s == "up"))
            .then_some(())
    });
    let o = c.clan(&["run", "--node", "3", "--", "sh", "-c", "hostname; exit 5"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "node3");
    assert_eq!(o.status.code(), Some(5));
    let o = c.clan(&["--from", "3", "run", "--node", "1", "--", "true"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(!c.clan_ok(&["ps"]).contains("sleep 200"));
}

/// A start whose reply never comes (the target node stops answering right after the
/// request left) ends when the target is declared dead: the stub fails, it does not wait
/// for ever, and the process the target starts once it runs again does not stay.
#[test]
fn a_start_cut_short_by_the_target_node_death_fails_instead_of_hanging() {
    root_or_skip!("a_start_cut_short_by_the_target_node_death_fails_instead_of_hanging");
    let c = Cluster::up(3);
    let pid = nix::unistd::Pid::from_raw(c.cland_pid(2));
    /// Node 2's daemon runs again however the test ends.
    struct Resume(nix::unistd::Pid);
    impl Drop for Resume {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
        }
    }
    let resume = Resume(pid);
    // Node 3 sends the request (a spare session connection is open and authenticated),
    // node 2 reads nothing: the reply will never come.
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let o = c
        .cmd()
        .args(["--from", "3", "run", "--node", "2", "--", "sleep", "2091"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let st = ended_within(o, "the stub of a start node 2 never answered");
    assert_eq!(st.code(), Some(125), "{st:?}");
    drop(resume);
    // Node 2 learns it was declared dead and fences: whatever it started is killed.
    eventually("node 2 back everywhere", Duration::from_secs(20), || {
        (1..=3)
            .all(|from| node_states(&c, from).iter().all(|(_, s)| s == "up"))
            .then_some(())
    });
    eventually("no sleep 2091 left", Duration::from_secs(20), || {
        host_running("sleep 2091").is_empty().then_some(())
    });
}

#[test]
fn a_frozen_node_declared_dead_fences_itself_when_it_wakes() {
    root_or_skip!("a_frozen_node_declared_dead_fences_itself_when_it_wakes");
    use std::os::unix::process::ExitStatusExt;
    let c = Cluster::up(3);
    // Its session up before the stop (a stop before the start's reply would fail the
    // start instead).
    let across = ready_stub(&c, 1, 3, 2011);
    let d = c.spawn(3, &["sleep", "2012"]);
    eventually("both sleeps", Duration::from_secs(20), || {
        (host_running("sleep 201").len() == 2).then_some(())
    });
    let pid = nix::unistd::Pid::from_raw(c.cland_pid(3));
    let inc = |from: u32| incarnation_seen(&c, from, 3);
    let before = inc(1);
    // Node 3's daemon stops (its processes keep running): the others declare it dead and
    // tell the stub and parent their processes were killed.
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let st = across.wait_with_output().unwrap().status;
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
    assert_eq!(st.signal(), Some(libc::SIGKILL), "{st:?}");
    // When it runs again, the others tell it it was declared dead: it kills what they
    // gave up for dead and comes back as a new incarnation.
    eventually(
        "the sleeps killed by the fence",
        Duration::from_secs(20),
        || host_running("sleep 201").is_empty().then_some(()),
    );
    all_up_everywhere(&c, 3);
    assert_ne!(inc(1), before, "node 3 rejoined as a new incarnation");
    let o = c.clan(&["wait", &d.to_string()]);
    assert_eq!(o.status.code(), Some(128 + 9), "{o:?}");
    let o = c.clan(&["run", "--node", "3", "--", "true"]);
    assert_eq!(o.status.code(), Some(0));
}

#[test]
fn a_cland_restarted_after_its_node_was_declared_dead_fences_what_it_took_over() {
    root_or_skip!("a_cland_restarted_after_its_node_was_declared_dead_fences_what_it_took_over");
    let c = Cluster::up(3);
    let d = c.spawn(3, &["sleep", "2021"]);
    eventually("the sleep", Duration::from_secs(20), || {
        (host_running("sleep 2021").len() == 1).then_some(())
    });
    // Node 3's daemon dies; its process keeps running under its shepherd, but the others
    // declare the node dead and its parent hears SIGKILL.
    let pid = nix::unistd::Pid::from_raw(c.cland_pid(3));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    let o = c.clan(&["wait", &d.to_string()]);
    assert_eq!(o.status.code(), Some(128 + 9), "{o:?}");
    assert!(
        !host_running("sleep 2021").is_empty(),
        "still running, stale"
    );
    // A new cland takes the process over, then hears that its predecessor was declared
    // dead: what the cluster reported killed is killed.
    let mut daemon = c.restart_cland(3);
    eventually("the stale sleep fenced", Duration::from_secs(20), || {
        host_running("sleep 2021").is_empty().then_some(())
    });
    // Up everywhere as the incarnation it took after fencing (the others may still show
    // the one that took the process over, whose loss they settle when they hear the new
    // one): only then is a session to it safe from that settling.
    let seen = |from: u32| incarnation_seen(&c, from, 3);
    eventually(
        "node 3's new incarnation known everywhere",
        Duration::from_secs(20),
        || {
            let own = seen(3);
            (seen(1) == own && seen(2) == own).then_some(())
        },
    );
    all_up_everywhere(&c, 3);
    let o = c.clan(&["run", "--node", "3", "--", "sh", "-c", "exit 6"]);
    assert_eq!(o.status.code(), Some(6));
    drop(c); // clan down stops the daemon we started
    assert!(daemon.wait().unwrap().success());
}

/// A cland stopped cleanly (SIGTERM: it says goodbye) leaves its processes running under
/// their shepherds: the other nodes show the node dead but do not take its processes for
/// killed, and once a new cland has taken them over, they are signalled and waited for
/// with their own statuses, from another node.
#[test]
fn a_clean_cland_restart_keeps_remote_statuses() {
    root_or_skip!("a_clean_cland_restart_keeps_remote_statuses");
    let c = Cluster::up(3);
    let d = c.spawn(3, &["sleep", "2041"]);
    let e = c.spawn(3, &["sleep", "2042"]);
    eventually("the sleeps", Duration::from_secs(20), || {
        (host_running("sleep 2041").len() == 1 && host_running("sleep 2042").len() == 1)
            .then_some(())
    });
    let pid = nix::unistd::Pid::from_raw(c.cland_pid(3));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    eventually("node 3 down everywhere", Duration::from_secs(20), || {
        (1..=2)
            .all(|from| {
                node_states(&c, from)
                    .iter()
                    .any(|(n, s)| *n == 3 && s == "away")
            })
            .then_some(())
    });
    // The process that exits while its node's cland is away keeps its status too.
    let other = host_running("sleep 2042");
    let other: i32 = other[0].split_once(':').unwrap().0.parse().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(other),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(host_running("sleep 2041").len(), 1, "still running");
    gone(pid, "node 3's cland");
    let mut daemon = c.restart_cland(3);
    all_up_everywhere(&c, 3);
    c.clan_ok(&["kill", "-s", "TERM", &d.to_string()]);
    let o = c.clan(&["wait", &d.to_string()]);
    assert_eq!(o.status.code(), Some(128 + 15), "{o:?}");
    let o = c.clan(&["wait", &e.to_string()]);
    assert_eq!(o.status.code(), Some(128 + 15), "{o:?}");
    drop(c); // clan down stops the daemon we started
    assert!(daemon.wait().unwrap().success());
}

/// A restarted cland knows again which of its node's processes started processes
/// elsewhere (it kept that in memory): a parent that exits afterwards releases its remote
/// child's zombie, as before the restart.
#[test]
fn a_restarted_cland_knows_its_parents_again() {
    root_or_skip!("a_restarted_cland_knows_its_parents_again");
    let c = Cluster::up(3);
    let d = c.dir.display().to_string();
    // Three parents on node 1, each with a child on node 2 that ends on `go{i}`; a parent
    // ends on `done{i}` without waiting.
    let mut kids = Vec::new();
    for i in 1..=3 {
        std::fs::write(
            c.dir.join(format!("kid{i}.sh")),
            format!("while [ ! -e {d}/go{i} ]; do sleep 0.05; done\n"),
        )
        .unwrap();
        let script = format!(
            "clan run -d --node 2 -- sh {d}/kid{i}.sh >/dev/null; \
             while [ ! -e {d}/done{i} ]; do sleep 0.05; done"
        );
        c.spawn(1, &["sh", "-c", &script]);
        let kid = one(&c, &format!("sh {d}/kid{i}.sh"));
        kids.push(Gpid::from_raw(kid["gpid"].as_u64().unwrap()).unwrap());
    }
    eventually("node 1's parent records", Duration::from_secs(20), || {
        (table_at(&c, 1, 1, "parents") == Some(3)).then_some(())
    });
    // The third child ends before the restart: its status is the old cland's news.
    std::fs::write(c.dir.join("go3"), "").unwrap();
    eventually("the third child a zombie", Duration::from_secs(20), || {
        (c.ps_one(kids[2])?["state"] == "Z").then_some(())
    });
    // Stopped cleanly (a crash that the others noticed in time would fence the node).
    let pid = nix::unistd::Pid::from_raw(c.cland_pid(1));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    gone(pid, "node 1's cland");
    // Meanwhile the second child ends, then its parent.
    std::fs::write(c.dir.join("go2"), "").unwrap();
    eventually("the second child a zombie", Duration::from_secs(20), || {
        (c.ps_one(kids[1])?["state"] == "Z").then_some(())
    });
    std::fs::write(c.dir.join("done2"), "").unwrap();
    eventually("the second parent gone", Duration::from_secs(20), || {
        host_running(&format!("sh -c clan run -d --node 2 -- sh {d}/kid2.sh"))
            .is_empty()
            .then_some(())
    });
    let mut daemon = c.restart_cland(1);
    // The first parent is known again; the second one's zombie child is released.
    eventually(
        "the first and third parent records known again",
        Duration::from_secs(20),
        || (table_at(&c, 1, 1, "parents") == Some(2)).then_some(()),
    );
    // The third child's status, which the new cland was not told, is waited for.
    let o = c.clan(&["wait", &kids[2].to_string()]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    eventually(
        "the second zombie released",
        Duration::from_secs(20),
        || c.ps_one(kids[1]).is_none().then_some(()),
    );
    // The first child ends, then its parent without waiting: the zombie goes.
    std::fs::write(c.dir.join("go1"), "").unwrap();
    eventually("the first child a zombie", Duration::from_secs(20), || {
        (c.ps_one(kids[0])?["state"] == "Z").then_some(())
    });
    std::fs::write(c.dir.join("done1"), "").unwrap();
    eventually("the first zombie released", Duration::from_secs(20), || {
        c.ps_one(kids[0]).is_none().then_some(())
    });
    drop(c); // clan down stops the daemon we started
    assert!(daemon.wait().unwrap().success());
}

/// The members of group `g` that a SIGCONT to it from `from` reaches, sorted.
fn group_reach(c: &Cluster, rt: &tokio::runtime::Runtime, from: u32, g: u64) -> Vec<u64> {
    let r = rt
        .block_on(c.client(from).sigsend(&format!("pgid={g}"), libc::SIGCONT))
        .expect("sigsend");
    let mut v: Vec<u64> = r
        .into_iter()
        .filter_map(|(g, res)| res.is_ok().then_some(g?.raw()))
        .collect();
    v.sort();
    v
}

/// Node `node`'s incarnation as `clan --from FROM nodes` shows it.
fn incarnation_seen(c: &Cluster, from: u32, node: usize) -> u64 {
    let v: serde_json::Value =
        serde_json::from_str(&c.clan_ok(&["--from", &from.to_string(), "nodes", "-o", "json"]))
            .unwrap();
    v.as_array().unwrap()[node - 1]["incarnation"]
        .as_u64()
        .unwrap()
}

/// Waits until process `pid` (not our child) is gone.
fn gone(pid: nix::unistd::Pid, what: &str) {
    eventually(&format!("{what} gone"), Duration::from_secs(20), || {
        nix::sys::signal::kill(pid, None).is_err().then_some(())
    });
}

/// `clan --from N stats tables`: the size of `table` on `node`, if it answered.
fn table_at(c: &Cluster, from: u32, node: u32, table: &str) -> Option<u64> {
    let o = c.clan(&["--from", &from.to_string(), "stats", "tables"]);
    String::from_utf8_lossy(&o.stdout).lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.first()? == &node.to_string().as_str() && f.get(1)? == &table)
            .then(|| f.get(2)?.parse().ok())
            .flatten()
    })
}

#[test]
fn a_dead_homes_member_lists_move_to_the_next_node_and_back() {
    root_or_skip!("a_dead_homes_member_lists_move_to_the_next_node_and_back");
    let c = Cluster::up(4);
    let rt = tokio::runtime::Runtime::new().unwrap();
    // A group whose home is node 1, with members on nodes 3 and 4.
    let script = "clan run -d --node 3 -- sleep 2031 >/dev/null; \
                  clan run -d --node 4 -- sleep 2032 >/dev/null; exec sleep 2033";
    let g = c.spawn(1, &["sh", "-c", script]).raw();
    one(&c, "sleep 2033");
    assert_eq!(table_at(&c, 2, 2, "group.members"), Some(0));
    let reach = |from: u32| group_reach(&c, &rt, from, g);

    // The home dies: node 2, next in order, keeps the list (group and session), and a
    // group signal from node 4 still reaches both members through it.
    let members: Vec<u64> = ["sleep 2031", "sleep 2032"]
        .iter()
        .map(|cmd| one(&c, cmd)["gpid"].as_u64().unwrap())
        .collect();
    c.power_cut(1);
    eventually("node 2 keeps the lists", Duration::from_secs(20), || {
        (table_at(&c, 2, 2, "group.members") == Some(2)).then_some(())
    });
    // Members register with the new keeper within a round trip of the death.
    eventually(
        "a group signal through node 2",
        Duration::from_secs(20),
        || (reach(4) == members).then_some(()),
    );

    // The home comes back: the lists return to it and leave node 2.
    c.node_start(1);
    eventually("the lists back at node 1", Duration::from_secs(20), || {
        (table_at(&c, 1, 1, "group.members") == Some(2)
            && table_at(&c, 2, 2, "group.members") == Some(0))
        .then_some(())
    });
    eventually(
        "a group signal through node 1",
        Duration::from_secs(20),
        || (reach(3) == members).then_some(()),
    );
    c.clan_ok(&["--from", "2", "kill", "-g", &g.to_string()]);
    for cmd in ["sleep 2031", "sleep 2032"] {
        eventually(cmd, Duration::from_secs(20), || {
            live(&c, cmd).is_empty().then_some(())
        });
    }
}

/// The same when the home only stops cleanly (its cland says goodbye, its processes live
/// on): the lists move to the next node meanwhile, and return when a new cland has taken
/// the node's processes over.
#[test]
fn a_home_that_said_goodbye_hands_its_member_lists_on() {
    root_or_skip!("a_home_that_said_goodbye_hands_its_member_lists_on");
    let c = Cluster::up(4);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let script = "clan run -d --node 3 -- sleep 2061 >/dev/null; \
                  clan run -d --node 4 -- sleep 2062 >/dev/null; exec sleep 2063";
    let g = c.spawn(1, &["sh", "-c", script]).raw();
    one(&c, "sleep 2063");
    let members: Vec<u64> = ["sleep 2061", "sleep 2062"]
        .iter()
        .map(|cmd| one(&c, cmd)["gpid"].as_u64().unwrap())
        .collect();
    let reach = |from: u32| group_reach(&c, &rt, from, g);
    let pid = nix::unistd::Pid::from_raw(c.cland_pid(1));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    eventually("node 2 keeps the lists", Duration::from_secs(20), || {
        (table_at(&c, 2, 2, "group.members") == Some(2)).then_some(())
    });
    eventually(
        "a group signal through node 2",
        Duration::from_secs(20),
        || (reach(4) == members).then_some(()),
    );
    gone(pid, "node 1's cland");
    let mut daemon = c.restart_cland(1);
    eventually("the lists back at node 1", Duration::from_secs(20), || {
        (table_at(&c, 1, 1, "group.members") == Some(2)
            && table_at(&c, 2, 2, "group.members") == Some(0))
        .then_some(())
    });
    // Every node routes the group to its home again before the kill (which also holds
    // the leader, on node 1).
    all_up_everywhere(&c, 4);
    eventually(
        "a group signal through node 1",
        Duration::from_secs(20),
        || {
            let r = reach(3);
            members.iter().all(|m| r.contains(m)).then_some(())
        },
    );
    // Nothing of node 1 was lost: its member, the group's leader, is signalled too.
    c.clan_ok(&["--from", "3", "kill", "-g", &g.to_string()]);
    for cmd in ["sleep 2061", "sleep 2062", "sleep 2063"] {
        eventually(cmd, Duration::from_secs(20), || {
            live(&c, cmd).is_empty().then_some(())
        });
    }
    drop(c); // clan down stops the daemon we started
    assert!(daemon.wait().unwrap().success());
}

#[test]
fn terminal_stops_reach_remote_members_of_a_group() {
    root_or_skip!("terminal_stops_reach_remote_members_of_a_group");
    let c = Cluster::up(3);
    // A group whose leader is on node 1 and members on nodes 2 and 3; each node's kernel
    // sees its part as orphaned, which would discard SIGTSTP.
    let script = "clan run -d --node 2 -- sleep 1061 >/dev/null; \
                  clan run -d --node 3 -- sleep 1062 >/dev/null; exec sleep 1063";
    let g = c.spawn(1, &["sh", "-c", script]).raw();
    let members = ["sleep 1061", "sleep 1062", "sleep 1063"];
    for m in members {
        one(&c, m);
    }
    c.clan_ok(&["kill", "-s", "TSTP", "-g", &g.to_string()]);
    for (n, m) in [(2, "sleep 1061"), (3, "sleep 1062"), (1, "sleep 1063")] {
        eventually(m, Duration::from_secs(20), || {
            state_of(&c, n, m).filter(|s| s == "T")
        });
    }
    // A member that ignores SIGTSTP is left running, as locally.
    let o = c.clan(&[
        "run",
        "-d",
        "--node",
        "2",
        "--",
        "sh",
        "-c",
        "trap '' TSTP; exec sleep 1064",
    ]);
    assert!(o.status.success());
    let ign = one(&c, "sleep 1064")["gpid"].to_string();
    c.clan_ok(&["kill", "-s", "TSTP", &ign]);
    c.clan_ok(&["kill", "-s", "CONT", "-g", &g.to_string()]);
    for (n, m) in [(2, "sleep 1061"), (3, "sleep 1062"), (1, "sleep 1063")] {
        eventually(m, Duration::from_secs(20), || {
            state_of(&c, n, m).filter(|s| s == "S")
        });
    }
    // Stopped by a TSTP sent after it, on the same node: had the ignoring one been
    // stopped, it would be by now.
    c.clan_ok(&["kill", "-s", "TSTP", "-g", &g.to_string()]);
    eventually("sleep 1061 stopped again", Duration::from_secs(20), || {
        state_of(&c, 2, "sleep 1061").filter(|s| s == "T")
    });
    assert_eq!(state_of(&c, 2, "sleep 1064").as_deref(), Some("S"));
}

/// A node that died numbers its processes afresh when it comes back, so a new process may
/// get the gpid of one that died with it: the new one's status is its own, and collecting
/// the old one's ("killed by SIGKILL") releases nothing on the node.
#[test]
fn a_gpid_reused_after_a_node_death_gets_its_own_status() {
    root_or_skip!("a_gpid_reused_after_a_node_death_gets_its_own_status");
    let c = Cluster::up(2);
    let old = c.spawn(2, &["sleep", "1093"]);
    c.power_cut(2);
    eventually("node 2 dead", Duration::from_secs(20), || {
        c.clan_ok(&["nodes"])
            .lines()
            .any(|l| l.starts_with("2 ") && l.contains("dead"))
            .then_some(())
    });
    c.node_start(2);
    // New processes on node 2, each waited for, until one has the old gpid: the node's
    // new pid namespace is told to hand out the old number next (ns_last_pid, written from
    // inside it); the shepherd pool's own forks can take it first, so a few tries.
    let init = std::fs::read_to_string(c.node_dir(2).join("init.pid")).expect("init.pid");
    let mut reused = false;
    for _ in 0..20 {
        let _ = std::process::Command::new("nsenter")
            .args(["-t", init.trim(), "-p", "-m", "--", "sh", "-c"])
            .arg(format!(
                "echo {} > /proc/sys/kernel/ns_last_pid",
                old.local() - 1
            ))
            .status();
        let g = c.spawn(2, &["sh", "-c", "exit 3"]);
        let o = c.clan(&["wait", &g.to_string()]);
        assert_eq!(o.status.code(), Some(3), "{g} (old {old}): {o:?}");
        if g == old {
            reused = true;
            break;
        }
    }
    let o = c.clan(&["wait", &old.to_string()]);
    if reused {
        // Its record went to the new process, which was collected.
        assert_eq!(o.status.code(), Some(127), "{o:?}");
    } else {
        assert_eq!(o.status.code(), Some(128 + 9), "{o:?}");
    }
    eprintln!("gpid {old} reused after the node's death: {reused}");
}

/// A wait for several processes whose caller goes away collects nothing, not even the
/// processes that had ended: `clan wait A B` interrupted after A's end and before B's
/// leaves A's status for the next wait (and A's zombie in place).
#[test]
fn an_interrupted_wait_for_several_leaves_the_ended_ones_to_the_next() {
    root_or_skip!("an_interrupted_wait_for_several_leaves_the_ended_ones_to_the_next");
    let c = Cluster::up(2);
    let go = c.dir.join("go-a");
    let a = c.spawn(
        2,
        &[
            "sh",
            "-c",
            &format!(
                "while [ ! -e {} ]; do sleep 0.02; done; exit 5",
                go.display()
            ),
        ],
    );
    let b = c.spawn(2, &["sleep", "1101"]);
    let waiter = c
        .cmd()
        .args(["wait", &a.to_string(), &b.to_string()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("clan wait");
    let pid = nix::unistd::Pid::from_raw(waiter.id() as i32);
    // Its request is out once it holds its connection to cland (its only socket).
    eventually("the waiter connected", Duration::from_secs(20), || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .ok()?
            .flatten()
            .any(|f| {
                std::fs::read_link(f.path())
                    .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
            })
            .then_some(())
    });
    // A ends while the wait waits for B.
    std::fs::write(&go, "").unwrap();
    eventually("A's end", Duration::from_secs(20), || {
        c.ps_one(a).is_none_or(|p| p["state"] == "Z").then_some(())
    });
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let o = waiter.wait_with_output().unwrap();
    assert_eq!(ended(&o), (None, Some(libc::SIGINT)), "{o:?}");
    // A's status is still there, and B is still waited for.
    let o = c.clan(&["wait", &a.to_string()]);
    assert_eq!(o.status.code(), Some(5), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("exited 5"),
        "{o:?}"
    );
    assert!(c.ps_one(a).is_none(), "reaped once waited for");
    c.clan_ok(&["kill", "-s", "KILL", &b.to_string()]);
    let o = c.clan(&["wait", &b.to_string()]);
    assert_eq!(o.status.code(), Some(128 + libc::SIGKILL), "{o:?}");
}

/// kill(2)'s rule: a sender whose real uid (not only its effective one) is the target's
/// owner may signal it; one whose real and effective uids both differ may not.
#[test]
fn a_real_uid_that_owns_the_target_may_signal_it() {
    root_or_skip!("a_real_uid_that_owns_the_target_may_signal_it");
    let c = Cluster::up(2);
    let (a, b) = (test_user("clantesta"), test_user("clantestb"));
    let as_ids = |ruid: u32, euid: u32, args: &[&str]| {
        std::process::Command::new("setpriv")
            .args([
                &format!("--ruid={ruid}"),
                &format!("--euid={euid}"),
                &format!("--rgid={ruid}"),
                &format!("--egid={euid}"),
                "--clear-groups",
            ])
            .arg(bin("clan"))
            .args(args)
            .env("CLAN_DIR", &c.dir)
            .current_dir("/tmp")
            .output()
            .unwrap()
    };
    let o = as_ids(a, a, &["run", "-d", "--node", "2", "--", "sleep", "1111"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let g = String::from_utf8_lossy(&o.stdout).trim().to_string();
    one(&c, "sleep 1111");
    // Real and effective uid both another user's: refused.
    let o = as_ids(b, b, &["kill", &g]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    assert!(stderr(&o).contains("permission denied"), "{}", stderr(&o));
    assert_eq!(live(&c, "sleep 1111").len(), 1);
    // Real uid the owner's, effective another's: signalled.
    let o = as_ids(a, b, &["kill", &g]);
    assert!(o.status.success(), "{}", stderr(&o));
    eventually("sleep 1111 gone", Duration::from_secs(20), || {
        live(&c, "sleep 1111").is_empty().then_some(())
    });
}
