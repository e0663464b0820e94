//! Jobs and tasks on real local clusters (issue 4): suspend, resume and kill of every task
//! of a job on every node, verified against the kernel.

use clan_tests::*;
use std::time::Duration;

macro_rules! root_or_skip {
    ($name:expr) => {
        if !need_root($name) {
            return;
        }
    };
}

/// `cgroup.events` key `key` of job `job`'s task on `node`.
fn task_event(c: &Cluster, node: u32, job: &str, key: &str) -> Option<String> {
    let dir = c.cgroup()?.join(format!("node{node}/job{job}"));
    let text = std::fs::read_to_string(dir.join("cgroup.events")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key} ")).map(str::to_string))
}

/// The states (`clan ps`'s letters) of job `job`'s processes.
fn job_states(c: &Cluster, job: &str) -> Vec<String> {
    c.ps(&["--job", job])
        .iter()
        .map(|p| p["state"].as_str().unwrap_or("").to_string())
        .collect()
}

/// A parent that reports what waitpid(WUNTRACED) told it about its child.
const PARENT: &str = r#"
import os, sys
pid = os.fork()
if pid == 0:
    os.execvp('sleep', ['sleep', '1041'])
_, st = os.waitpid(pid, os.WUNTRACED)
with open(sys.argv[1] + '.tmp', 'w') as f:
    f.write('stopped' if os.WIFSTOPPED(st) else 'ended')
os.rename(sys.argv[1] + '.tmp', sys.argv[1])  # the test never reads a half-written report
"#;

#[test]
fn a_job_is_suspended_resumed_and_killed_on_every_node() {
    root_or_skip!("a_job_is_suspended_resumed_and_killed_on_every_node");
    let c = Cluster::up(3);
    let dir = std::env::temp_dir().join(format!("clan-jobs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let report = dir.join("report");
    // One job over three nodes: CPU-busy processes on each, and on node 2 a parent that
    // watches its child with WUNTRACED.
    let o = c.clan(&[
        "run",
        "-N",
        "3",
        "-d",
        "--",
        "sh",
        "-c",
        "yes >/dev/null & yes >/dev/null & exec sleep 1040",
    ]);
    assert!(o.status.success(), "{o:?}");
    let job = job_of(&o);
    let o = c.clan(&[
        "run",
        "--job",
        &job,
        "--node",
        "2",
        "-d",
        "--",
        "python3",
        "-c",
        PARENT,
        report.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{o:?}");
    let child = eventually("the watched child", Duration::from_secs(20), || {
        c.ps(&["--node", "2"])
            .into_iter()
            .find(|p| p["cmd"] == "sleep 1041")
    });
    eventually("the job's sleeps", Duration::from_secs(20), || {
        (c.ps(&["--job", &job])
            .iter()
            .filter(|p| p["cmd"] == "sleep 1040")
            .count()
            == 3)
            .then_some(())
    });

    // Suspend returns once every task is frozen (the kernel says so), on every node.
    let out = c.clan_ok(&["job", "suspend", &job]);
    for n in 1..=3 {
        assert!(
            out.contains(&format!("job {job} on node {n}: suspended")),
            "{out}"
        );
        assert_eq!(task_event(&c, n, &job, "frozen").as_deref(), Some("1"));
    }
    let again = c.clan_ok(&["job", "suspend", &job]);
    assert!(again.contains("already suspended"), "{again}");
    let show = c.clan_ok(&["job", "show", &job]);
    assert_eq!(show.matches("suspended").count(), 3, "{show}");

    // Resume: every task runs again; the parent never saw its child stopped.
    let out = c.clan_ok(&["job", "resume", &job]);
    assert_eq!(out.matches("resumed").count(), 3, "{out}");
    for n in 1..=3 {
        assert_eq!(task_event(&c, n, &job, "frozen").as_deref(), Some("0"));
    }
    c.clan_ok(&["kill", &child["gpid"].to_string()]);
    let seen = eventually("the parent's report", Duration::from_secs(20), || {
        std::fs::read_to_string(&report).ok()
    });
    assert_eq!(
        seen, "ended",
        "a suspended job must not look stopped to parents"
    );

    // Kill: nothing of the job is left on any node.
    let out = c.clan_ok(&["job", "kill", &job]);
    assert_eq!(out.matches("killed").count(), 3, "{out}");
    assert!(host_processes_mentioning("sleep 1040").is_empty());
    assert!(c.ps(&["--job", &job]).iter().all(|p| p["state"] == "Z"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn job_operations_report_bad_input_and_dead_nodes() {
    root_or_skip!("job_operations_report_bad_input_and_dead_nodes");
    let c = Cluster::up(3);
    let o = c.clan(&["job", "suspend", "1000777"]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("no such job 1000777"));
    let o = c.clan(&["job", "kill", "banana"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");

    let o = c.clan(&["run", "-N", "3", "-d", "--", "sleep", "1050"]);
    let job = job_of(&o);
    // Not the owner: refused on every node, nothing suspended.
    let user = test_user("clantesta");
    let o = std::process::Command::new("setpriv")
        .args([
            &format!("--reuid={user}"),
            &format!("--regid={user}"),
            "--clear-groups",
        ])
        .arg(bin("clan"))
        .args(["job", "suspend", &job])
        .env("CLAN_DIR", &c.dir)
        .current_dir("/tmp")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(4), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("permission denied"));
    assert_eq!(task_event(&c, 1, &job, "frozen").as_deref(), Some("0"));

    // A dead node is reported; the job is suspended on the others.
    c.power_cut(3);
    let o = c.clan(&["job", "suspend", &job]);
    assert_eq!(o.status.code(), Some(5), "{o:?}");
    // One line naming the node once ("node 3 is dead", not "node 3: node 3 is dead").
    let named_once = |o: &std::process::Output| {
        let err = String::from_utf8_lossy(&o.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| l.contains("node 3")).collect();
        assert_eq!(lines.len(), 1, "{err}");
        assert_eq!(lines[0].matches("node 3").count(), 1, "{err}");
    };
    named_once(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(out.matches("suspended").count(), 2, "{out}");
    let o = c.clan(&["job", "ls"]);
    assert_eq!(o.status.code(), Some(5), "{o:?}");
    named_once(&o);
    assert!(String::from_utf8_lossy(&o.stdout).contains(&job), "{o:?}");
    c.clan_ok(&["job", "kill", &job, "--node", "1", "--node", "2"]);
    assert!(host_processes_mentioning("sleep 1050").is_empty());
}

#[test]
fn a_task_keeps_its_genealogy_when_parents_exit_first() {
    root_or_skip!("a_task_keeps_its_genealogy_when_parents_exit_first");
    let c = Cluster::up(2);
    let rt = tokio::runtime::Runtime::new().unwrap();
    // The subshell exits at once; its child, a shell with two sleeps, outlives it. The
    // kernel gives that orphan to a reaper; the task's genealogy to its grandparent.
    let top = c.spawn(
        2,
        &[
            "sh",
            "-c",
            "(sh -c 'sleep 1091 & exec sleep 1093' &); exec sleep 1092",
        ],
    );
    let o = c.clan(&["job", "ls", "--node", "2"]);
    let job: u64 = String::from_utf8_lossy(&o.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .expect("a job");
    let tree = eventually("the task's forest", Duration::from_secs(20), || {
        let answers = rt
            .block_on(
                c.client(1)
                    .job(clan_client::pb::JobAction::JobTree, job, &[], 0, ""),
            )
            .ok()?;
        let tree: Vec<_> = answers
            .into_iter()
            .flat_map(|n| n.tasks)
            .flat_map(|t| t.tree)
            .collect();
        let cmds = ["sleep 1091", "sleep 1092", "sleep 1093"];
        (tree.len() == 3 && cmds.iter().all(|c| tree.iter().any(|p| p.cmd == *c))).then_some(tree)
    });
    let by_cmd = |cmd: &str| tree.iter().find(|p| p.cmd == cmd).expect(cmd);
    let orphan = by_cmd("sleep 1093");
    let sleeper = by_cmd("sleep 1091");
    assert_eq!(
        by_cmd("sleep 1092").gpid,
        top.raw(),
        "the top shell exec'd sleep 1092"
    );
    assert_eq!(
        orphan.parent,
        top.raw(),
        "adopted by its nearest living ancestor: {tree:?}"
    );
    assert_eq!(sleeper.parent, orphan.gpid, "{tree:?}");
    // The kernel's view differs: the orphan's parent is no longer the top process.
    let ps = c.ps(&["--node", "2"]);
    let kernel_parent = ps
        .iter()
        .find(|p| p["gpid"].as_u64() == Some(orphan.gpid))
        .map(|p| p["ppid"].as_u64().unwrap_or(0));
    assert_ne!(kernel_parent, Some(top.raw()));
    c.clan_ok(&["job", "kill", &job.to_string()]);
}

#[test]
fn the_signal_method_suspends_and_resumes_busy_tasks() {
    root_or_skip!("the_signal_method_suspends_and_resumes_busy_tasks");
    let c = Cluster::up(2);
    let o = c.clan(&[
        "run",
        "-N",
        "2",
        "-d",
        "--",
        "sh",
        "-c",
        "yes >/dev/null & (yes >/dev/null &) ; exec sleep 1045",
    ]);
    assert!(o.status.success(), "{o:?}");
    let job = job_of(&o);
    let states = |c: &Cluster| job_states(c, &job);
    eventually("six processes", Duration::from_secs(20), || {
        (states(&c).len() == 6).then_some(())
    });
    let out = c.clan_ok(&["job", "suspend", "--method", "signals", &job]);
    assert_eq!(out.matches("suspended (3 processes)").count(), 2, "{out}");
    // Verified before the command returned: every process is stopped now.
    assert!(states(&c).iter().all(|s| s == "T"), "{:?}", states(&c));
    let again = c.clan_ok(&["job", "suspend", "--method", "signals", &job]);
    assert_eq!(again.matches("already suspended").count(), 2, "{again}");
    let out = c.clan_ok(&["job", "resume", "--method", "signals", &job]);
    assert_eq!(out.matches("resumed").count(), 2, "{out}");
    assert!(states(&c).iter().all(|s| s != "T"), "{:?}", states(&c));
    let o = c.clan(&["job", "suspend", "--method", "magic", &job]);
    assert_eq!(o.status.code(), Some(2));
    c.clan_ok(&["job", "kill", &job]);
    assert!(host_processes_mentioning("sleep 1045").is_empty());
}

#[test]
fn outside_processes_are_adopted_and_subtrees_act_alone() {
    root_or_skip!("outside_processes_are_adopted_and_subtrees_act_alone");
    let c = Cluster::up(2);
    // A process tree started outside clan becomes a task, and can not leave it.
    let mut outside = std::process::Command::new("sh")
        .args(["-c", "sleep 3801 & exec sleep 3802"])
        .spawn()
        .unwrap();
    let pid = outside.id();
    let child = eventually("the outside child", Duration::from_secs(20), || {
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .ok()
            .filter(|s| !s.trim().is_empty())
    });
    let o = c.clan(&["job", "adopt", &pid.to_string()]);
    assert!(o.status.success(), "{o:?}");
    let job = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let show = c.clan_ok(&["job", "show", &job]);
    assert!(show.contains("running        2"), "{show}");
    let cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", child.trim())).unwrap();
    assert!(cgroup.contains(&format!("/job{job}")), "{cgroup}");
    let o = c.clan(&["job", "adopt", "999999999"]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    c.clan_ok(&["job", "kill", &job]);
    let st = outside.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(libc::SIGKILL));
    assert!(host_processes_mentioning("sleep 380").is_empty());

    // A subtree is suspended, resumed and killed alone.
    let o = c.clan(&[
        "run",
        "-d",
        "--node",
        "2",
        "--",
        "sh",
        "-c",
        "sh -c 'sleep 3811 & exec sleep 3812' & exec sleep 3813",
    ]);
    let job = job_of(&o);
    let gpid_of = |cmd: &str| {
        eventually(cmd, Duration::from_secs(20), || {
            c.ps(&["--job", &job])
                .into_iter()
                .find(|p| p["cmd"] == cmd)
                .map(|p| (p["gpid"].to_string(), p))
        })
    };
    let (sub, _) = gpid_of("sleep 3812");
    gpid_of("sleep 3811");
    let state = |cmd: &str| gpid_of(cmd).1["state"].as_str().unwrap_or("").to_string();
    c.clan_ok(&["job", "suspend", &job, "--subtree", &sub]);
    assert_eq!(state("sleep 3812"), "T");
    assert_eq!(state("sleep 3811"), "T");
    assert_ne!(state("sleep 3813"), "T", "outside the subtree");
    c.clan_ok(&["job", "resume", &job, "--subtree", &sub]);
    assert_ne!(state("sleep 3811"), "T");
    c.clan_ok(&["job", "kill", &job, "--subtree", &sub]);
    eventually("the subtree gone", Duration::from_secs(20), || {
        c.ps(&["--job", &job])
            .iter()
            .all(|p| p["cmd"] != "sleep 3811" && p["cmd"] != "sleep 3812")
            .then_some(())
    });
    assert_ne!(state("sleep 3813"), "T");
    let o = c.clan(&["job", "suspend", &job, "--subtree", "2:99999"]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    c.clan_ok(&["job", "kill", &job]);
}

/// `clan job switch OLD NEW` (a gang scheduler's row switch) leaves OLD frozen and NEW
/// running on every node, both verified by the kernel, either way round, with both methods.
#[test]
fn a_switch_suspends_one_job_and_resumes_the_other() {
    root_or_skip!("a_switch_suspends_one_job_and_resumes_the_other");
    let c = Cluster::up(2);
    let started = c.clan(&["run", "-N", "2", "-d", "--", "sleep", "1061"]);
    let a = job_of(&started);
    let a_gpids: Vec<String> = String::from_utf8_lossy(&started.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let b = job_of(&c.clan(&["run", "-N", "2", "-d", "--", "sleep", "1062"]));
    c.clan_ok(&["job", "suspend", &b]);
    let frozen = |job: &str| -> Vec<Option<String>> {
        (1..=2).map(|n| task_event(&c, n, job, "frozen")).collect()
    };
    let yes = vec![Some("1".to_string()); 2];
    let no = vec![Some("0".to_string()); 2];
    let out = c.clan_ok(&["job", "switch", &a, &b]);
    assert_eq!(out.matches("suspended (1 process)").count(), 2, "{out}");
    assert_eq!(out.matches("resumed (1 process)").count(), 2, "{out}");
    assert_eq!((frozen(&a), frozen(&b)), (yes.clone(), no.clone()), "{out}");
    c.clan_ok(&["job", "switch", &b, &a]);
    assert_eq!((frozen(&a), frozen(&b)), (no.clone(), yes.clone()));
    // One node only.
    c.clan_ok(&["job", "switch", &a, &b, "--node", "2"]);
    assert_eq!(frozen(&a), vec![Some("0".into()), Some("1".into())]);
    assert_eq!(frozen(&b), vec![Some("1".into()), Some("0".into())]);
    c.clan_ok(&["job", "switch", &b, &a, "--node", "2"]);
    // A's processes stopped by job control, then frozen by a switch: the switch back (which
    // reads the new task while it freezes the old one) finds them held and continues them.
    let mut stop = vec!["kill", "-s", "STOP"];
    stop.extend(a_gpids.iter().map(String::as_str));
    c.clan_ok(&stop);
    let all_t = |job: &str| {
        let s = job_states(&c, job);
        !s.is_empty() && s.iter().all(|s| s.starts_with('T'))
    };
    eventually("A's processes stopped", Duration::from_secs(10), || {
        all_t(&a).then_some(())
    });
    c.clan_ok(&["job", "switch", &a, &b]);
    assert_eq!((frozen(&a), frozen(&b)), (yes.clone(), no.clone()));
    c.clan_ok(&["job", "switch", &b, &a]);
    assert_eq!((frozen(&a), frozen(&b)), (no.clone(), yes.clone()));
    let states = job_states(&c, &a);
    assert!(
        states.len() == 2 && states.iter().all(|s| !s.starts_with('T')),
        "{states:?}"
    );
    // By signals: stopped processes, state T.
    let out = c.clan_ok(&["job", "switch", "--method", "signals", &a, &b]);
    assert_eq!(out.matches("suspended (1 process)").count(), 2, "{out}");
    let stat = |job: &str| job_states(&c, job);
    assert!(
        stat(&a).iter().all(|s| s.starts_with('T')),
        "{:?}",
        stat(&a)
    );
    assert!(
        stat(&b).iter().all(|s| !s.starts_with('T')),
        "{:?}",
        stat(&b)
    );
    // A freezer switch runs at a real-time priority (switch_priority) and gives it back:
    // no thread of either node's cland is left real-time.
    for n in 1..=2 {
        let pid = c.cland_pid(n);
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
        for t in tasks.flatten() {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            let Some((_, after)) = stat.rsplit_once(") ") else {
                continue; // gone meanwhile
            };
            // SCHED_FIFO 1, SCHED_RR 2 (the proc events thread is SCHED_BATCH, 3).
            let policy = after.split(' ').nth(38);
            assert!(
                !matches!(policy, Some("1" | "2")),
                "node {n}'s cland thread {stat}"
            );
        }
    }
    // An unknown job to resume: said, exit 3.
    let o = c.clan(&["job", "switch", &b, "1000999"]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("no such job 1000999"));
    for j in [&a, &b] {
        c.clan_ok(&["job", "kill", j]);
    }
    assert!(host_processes_mentioning("sleep 106").is_empty());

    // Once its exits are collected, the emptied task is removed; a new process of the job
    // makes it again, and the job's operations act on the new cgroup (not through
    // descriptors kept on the old one).
    let mut wait = vec!["wait"];
    wait.extend(a_gpids.iter().map(String::as_str));
    let _ = c.clan(&wait);
    let task = c.cgroup().map(|g| g.join(format!("node1/job{a}")));
    if let Some(task) = task {
        eventually("the empty task removed", Duration::from_secs(20), || {
            (!task.exists()).then_some(())
        });
    }
    c.clan_ok(&[
        "run", "-d", "--job", &a, "--node", "1", "--", "sleep", "1063",
    ]);
    let out = c.clan_ok(&["job", "suspend", &a]);
    assert!(out.contains("suspended (1 process)"), "{out}");
    assert_eq!(task_event(&c, 1, &a, "frozen").as_deref(), Some("1"));
    // A switch reports each task with its processes: three in one, one in the other.
    let sh = "sleep 1064 & sleep 1065 & wait";
    let three = job_of(&c.clan(&["run", "-d", "--node", "1", "--", "sh", "-c", sh]));
    eventually("three processes", Duration::from_secs(10), || {
        (job_states(&c, &three).len() == 3).then_some(())
    });
    let out = c.clan_ok(&["job", "switch", &three, &a, "--node", "1"]);
    assert!(out.contains("suspended (3 processes)"), "{out}");
    assert!(out.contains("resumed (1 process)"), "{out}");
    assert_eq!(task_event(&c, 1, &three, "frozen").as_deref(), Some("1"));
    assert_eq!(task_event(&c, 1, &a, "frozen").as_deref(), Some("0"));
    for j in [&a, &three] {
        c.clan_ok(&["job", "kill", j]);
    }
    assert!(host_processes_mentioning("sleep 106").is_empty());
}

/// Whether this machine has the memory controller (in cgroup v2's root, or a v1 hierarchy).
fn memory_controller() -> bool {
    let v2 = cgroup2().is_some_and(|m| {
        std::fs::read_to_string(m.join("cgroup.controllers"))
            .is_ok_and(|t| t.split_whitespace().any(|c| c == "memory"))
    });
    let v1 = std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|m| {
        m.lines().any(|l| {
            l.split_once(" - ").is_some_and(|(_, post)| {
                let f: Vec<&str> = post.split_whitespace().collect();
                f.first() == Some(&"cgroup")
                    && f.get(2)
                        .is_some_and(|o| o.split(',').any(|o| o == "memory"))
            })
        })
    });
    v2 || v1
}

/// `clan run --max-procs N` caps the job's task at N processes (the pids controller; forks
/// beyond fail), `clan job show` gives the limit and the task's memory use and peak where
/// the memory controller is there; `--job` names an existing job of the caller only.
#[test]
fn limits_accounting_and_joining_jobs() {
    root_or_skip!("limits_accounting_and_joining_jobs");
    let c = Cluster::up(2);
    // 5 processes at most: the shell forks 8 sleeps; 4 run beside it, then its fork fails.
    let o = c.clan(&[
        "run",
        "-d",
        "--node",
        "2",
        "--max-procs",
        "5",
        "--",
        "sh",
        "-c",
        "for i in 1 2 3 4 5 6 7 8; do sleep 1070 & done",
    ]);
    if !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("no pids controller") {
        eprintln!("limits_accounting_and_joining_jobs: SKIPPED: no pids controller: {o:?}");
        return;
    }
    let job = job_of(&o);
    let gpid = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let log = eventually("the shell's fork to fail", Duration::from_secs(30), || {
        let log = c.clan_ok(&["logs", &gpid]);
        log.contains("fork").then_some(log)
    });
    // Four sleeps, once the shell (whose command line mentions them too) has ended.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let seen = loop {
        let seen = host_processes_mentioning("sleep 1070");
        if seen.len() == 4 || std::time::Instant::now() > deadline {
            break seen;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        seen.len() == 4 && seen.iter().all(|l| l.trim_end().ends_with(": sleep 1070")),
        "{log}: {seen:?}"
    );
    let show = c.clan_ok(&["job", "show", &job]);
    let row: Vec<&str> = show
        .lines()
        .find(|l| l.trim_start().starts_with(&job))
        .expect("a row")
        .split_whitespace()
        .collect();
    // JOB NODE USER STATE PROCS PEAK LIMIT TIME MEM MEMPEAK
    assert_eq!(row[4], "4", "{show}");
    assert_eq!(row[6], "5", "{show}");
    let memory_controller = memory_controller();
    // Sleeps need a little memory.
    if memory_controller {
        assert_ne!(row[8], "-", "no memory use shown: {show}");
        assert_ne!(row[9], "-", "no memory peak shown: {show}");
    }
    c.clan_ok(&["job", "kill", &job]);

    // Memory: a job that holds 64 MiB shows at least that much.
    let o = c.clan(&[
        "run",
        "-d",
        "--node",
        "1",
        "--",
        "python3",
        "-c",
        "import sys, time; x = bytearray(64 << 20); x[::4096] = b'1' * len(x[::4096]); \
         print('ready', flush=True); time.sleep(1072)",
    ]);
    let big = job_of(&o);
    let gpid = String::from_utf8_lossy(&o.stdout).trim().to_string();
    eventually(
        "python to touch its memory",
        Duration::from_secs(30),
        || c.clan_ok(&["logs", &gpid]).contains("ready").then_some(()),
    );
    if memory_controller {
        let out = std::process::Command::new(bin("clan"))
            .args(["job", "show", &big])
            .env("CLAN_DIR", &c.dir)
            .output()
            .unwrap();
        let show = String::from_utf8_lossy(&out.stdout);
        let mem = show
            .lines()
            .find(|l| l.trim_start().starts_with(&big))
            .and_then(|l| l.split_whitespace().nth(8).map(str::to_string))
            .unwrap_or_default();
        assert!(mem.ends_with('M') || mem.ends_with('G'), "{show}");
        let mb: f64 = mem.trim_end_matches(['M', 'G']).parse().unwrap_or(0.0);
        assert!(mem.ends_with('G') || mb >= 60.0, "{show}");
    }
    // --job: an unknown job is refused and nothing is started.
    let o = c.clan(&["run", "-d", "--job", "1000999", "--", "sleep", "1073"]);
    assert_eq!(o.status.code(), Some(125), "{o:?}"); // clan run's own failure
    assert!(String::from_utf8_lossy(&o.stderr).contains("no such job 1000999"));
    assert!(host_processes_mentioning("sleep 1073").is_empty());
    // The owner adds to its job on another node; it is then one job on both.
    let o = c.clan(&[
        "run", "-d", "--node", "2", "--job", &big, "--", "sleep", "1074",
    ]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(job_of(&o), big);
    c.clan_ok(&["job", "kill", &big]);
    assert!(host_processes_mentioning("sleep 107").is_empty());
}

/// A resume undoes a suspension by either method, and a suspend of a job the other method
/// holds says it is suspended already (the freezer's processes could not take a SIGSTOP).
#[test]
fn either_method_resumes_what_the_other_suspended() {
    root_or_skip!("either_method_resumes_what_the_other_suspended");
    let c = Cluster::up(1);
    let o = c.clan(&[
        "run",
        "-d",
        "--",
        "sh",
        "-c",
        "yes >/dev/null & exec sleep 1046",
    ]);
    assert!(o.status.success(), "{o:?}");
    let job = job_of(&o);
    let states = |c: &Cluster| job_states(c, &job);
    eventually("two processes", Duration::from_secs(20), || {
        (states(&c).len() == 2).then_some(())
    });
    let frozen = || task_event(&c, 1, &job, "frozen");

    // Frozen, then asked to stop by signals: suspended already, at once.
    c.clan_ok(&["job", "suspend", &job]);
    assert_eq!(frozen().as_deref(), Some("1"));
    let again = c.clan_ok(&["job", "suspend", "--method", "signals", &job]);
    assert!(again.contains("already suspended"), "{again}");
    // Resumed by signals: thawed too.
    let out = c.clan_ok(&["job", "resume", "--method", "signals", &job]);
    assert!(out.contains("resumed"), "{out}");
    assert_eq!(frozen().as_deref(), Some("0"));
    assert!(states(&c).iter().all(|s| s != "T"), "{:?}", states(&c));

    // Stopped by signals, resumed by the freezer: continued too.
    c.clan_ok(&["job", "suspend", "--method", "signals", &job]);
    assert!(states(&c).iter().all(|s| s == "T"), "{:?}", states(&c));
    let out = c.clan_ok(&["job", "resume", &job]);
    assert!(out.contains("resumed"), "{out}");
    assert!(states(&c).iter().all(|s| s != "T"), "{:?}", states(&c));
    c.clan_ok(&["job", "kill", &job]);
    assert!(host_processes_mentioning("sleep 1046").is_empty());
}

/// `clan job kill -s 0 J` is kill(1)'s signal 0: it checks that the job exists and that the
/// caller may signal it, and sends nothing. A job whose processes are all gone (killed, its
/// zombies still known to cland) is no such job for every action (exit 3), not a job with
/// no process left, and `clan job ls` no longer lists it.
#[test]
fn signal_0_sends_nothing_and_a_finished_job_is_no_such_job() {
    root_or_skip!("signal_0_sends_nothing_and_a_finished_job_is_no_such_job");
    let c = Cluster::up(2);
    let o = c.clan(&["run", "-N", "2", "-d", "--", "sleep", "1081"]);
    assert!(o.status.success(), "{o:?}");
    let job = job_of(&o);
    eventually("the job's sleeps", Duration::from_secs(20), || {
        (host_processes_mentioning("sleep 1081").len() == 2).then_some(())
    });
    let out = c.clan_ok(&["job", "kill", "-s", "0", &job]);
    assert_eq!(out.matches("signal 0: none sent").count(), 2, "{out}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        host_processes_mentioning("sleep 1081").len(),
        2,
        "`clan job kill -s 0` killed the job: {out}"
    );
    let user = test_user("clantesta");
    let o = std::process::Command::new("setpriv")
        .args([
            &format!("--reuid={user}"),
            &format!("--regid={user}"),
            "--clear-groups",
        ])
        .arg(bin("clan"))
        .args(["job", "kill", "-s", "0", &job])
        .env("CLAN_DIR", &c.dir)
        .current_dir("/tmp")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(4), "{o:?}");

    let out = c.clan_ok(&["job", "kill", &job]);
    assert_eq!(out.matches("killed (1 process)").count(), 2, "{out}");
    // cland still knows the zombies of the processes it started (for `clan wait`).
    assert!(c.ps(&["--job", &job]).iter().all(|p| p["state"] == "Z"));
    for args in [
        vec!["job", "kill", &job],
        vec!["job", "kill", "-s", "0", &job],
        vec!["job", "kill", "--method", "signals", &job],
        vec!["job", "suspend", &job],
        vec!["job", "resume", &job],
        vec!["job", "show", &job],
        vec!["job", "tree", &job],
    ] {
        let o = c.clan(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.code() == Some(3)
                && err.contains(&format!("no such job {job}"))
                && err.lines().count() == 1,
            "clan {args:?} on a finished job: {o:?}"
        );
    }
    let ls = c.clan_ok(&["job", "ls"]);
    assert!(!ls.contains(&job), "{ls}");
}

/// Subtree operations report the subtree (its processes, its state): a second suspend says
/// it is suspended already; a subtree of a task frozen as a whole is not resumed alone
/// (refused, exit 2), since the freezer would hold it still.
#[test]
fn subtree_operations_report_the_subtree() {
    root_or_skip!("subtree_operations_report_the_subtree");
    let c = Cluster::up(2);
    let o = c.clan(&[
        "run",
        "-d",
        "--node",
        "2",
        "--",
        "sh",
        "-c",
        "sh -c 'sleep 3841 & exec sleep 3842' & exec sleep 3843",
    ]);
    let job = job_of(&o);
    let sub = eventually("the subtree", Duration::from_secs(20), || {
        let ps = c.ps(&["--job", &job]);
        let sub = ps.iter().find(|p| p["cmd"] == "sleep 3842")?;
        ps.iter()
            .any(|p| p["cmd"] == "sleep 3841")
            .then(|| sub["gpid"].to_string())
    });
    let out = c.clan_ok(&["job", "suspend", &job, "--subtree", &sub]);
    assert!(out.contains("suspended (2 processes)"), "{out}");
    let out = c.clan_ok(&["job", "suspend", &job, "--subtree", &sub]);
    assert!(out.contains("already suspended (2 processes)"), "{out}");
    let out = c.clan_ok(&["job", "resume", &job, "--subtree", &sub]);
    assert!(out.contains("resumed (2 processes)"), "{out}");
    let out = c.clan_ok(&["job", "resume", &job, "--subtree", &sub]);
    assert!(out.contains("not suspended (2 processes)"), "{out}");

    c.clan_ok(&["job", "suspend", &job]);
    let o = c.clan(&["job", "resume", &job, "--subtree", &sub]);
    assert!(
        o.status.code() == Some(2) && String::from_utf8_lossy(&o.stderr).contains("frozen"),
        "a subtree resume of a frozen task: {o:?}"
    );
    assert_eq!(task_event(&c, 2, &job, "frozen").as_deref(), Some("1"));
    c.clan_ok(&["job", "resume", &job]);
    let out = c.clan_ok(&["job", "kill", &job, "--subtree", &sub]);
    assert!(out.contains("killed (2 processes)"), "{out}");
    assert!(host_processes_mentioning("sleep 3841").is_empty());
    assert!(host_processes_mentioning("sleep 3842").is_empty());
    assert_eq!(host_processes_mentioning("sleep 3843").len(), 1);
    c.clan_ok(&["job", "kill", &job]);
}

/// A subtree kill leaves no descendant alive, also of a subtree that forks all the time:
/// stopped top-down first, then killed, and verified.
#[test]
fn a_subtree_kill_leaves_no_descendant_of_a_forking_subtree() {
    root_or_skip!("a_subtree_kill_leaves_no_descendant_of_a_forking_subtree");
    let c = Cluster::up(1);
    let o = c.clan(&[
        "run",
        "-d",
        "--",
        "sh",
        "-c",
        "sh -c 'for i in $(seq 3000); do sleep 3851 & done; wait' & exec sleep 3852",
    ]);
    let job = job_of(&o);
    let sub = eventually("the forking shell", Duration::from_secs(20), || {
        c.ps(&["--job", &job])
            .into_iter()
            .find(|p| p["cmd"].as_str().is_some_and(|s| s.contains("seq 3000")))
            .map(|p| p["gpid"].to_string())
    });
    eventually("the shell forking", Duration::from_secs(20), || {
        (host_processes_mentioning("sleep 3851").len() >= 100).then_some(())
    });
    let o = c.clan(&["job", "kill", &job, "--subtree", &sub]);
    let left = host_processes_mentioning("sleep 3851");
    assert!(
        o.status.success() && left.is_empty(),
        "{} left alive by {o:?}",
        left.len()
    );
    assert_eq!(host_processes_mentioning("sleep 3852").len(), 1);
    c.clan_ok(&["job", "kill", &job]);
}

/// The host pid of the process whose command line is exactly `cmd` (words by spaces).
fn host_pid_of(cmd: &str) -> Option<u32> {
    let want: Vec<u8> = cmd.split(' ').flat_map(|w| w.bytes().chain([0])).collect();
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .find(|p| std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c == want))
}

/// Starts `argv[2:]` with posix_spawn, which glibc makes a vfork, its standard input opened
/// from the FIFO `argv[1]` before the exec: until a writer opens the FIFO, the spawning
/// process waits in the kernel for its child (state D, killable only) and takes no other
/// signal, a SIGSTOP included; it takes it once the FIFO is opened ([`release`]). (A
/// traced process would not do: the signal method counts a ptrace stop as stopped.)
const SPAWN: &str = r#"
import os, sys
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ,
                      file_actions=[(os.POSIX_SPAWN_OPEN, 0, sys.argv[1], os.O_RDONLY, 0)])
os.waitpid(pid, 0)
"#;

/// A directory with [`SPAWN`] as `spawn.py` and FIFOs for it, removed when dropped.
struct Holds(std::path::PathBuf);

/// The Python interpreter itself (not a wrapper script that runs it: one that forks
/// would be taken for the waiting process).
fn python() -> String {
    static PYTHON: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let o = std::process::Command::new("python3")
                .args([
                    "-c",
                    "import os, sys; print(os.path.realpath(sys.executable))",
                ])
                .output()
                .unwrap();
            String::from_utf8_lossy(&o.stdout).trim().to_string()
        })
        .clone()
}

impl Holds {
    fn new(tag: &str) -> Holds {
        let dir = std::env::temp_dir().join(format!("clan-jobs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("spawn.py"), SPAWN).unwrap();
        Holds(dir)
    }

    /// A new FIFO of the directory, and the command line (for `sh -c`) of a process that
    /// waits on it before it runs `cmd`.
    fn fifo(&self, name: &str, cmd: &str) -> (String, String) {
        let fifo = self.0.join(name);
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let fifo = fifo.display().to_string();
        let line = format!("{} {}/spawn.py {fifo} {cmd}", python(), self.0.display());
        (fifo, line)
    }
}

impl Drop for Holds {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The host pid of the Python process ([`SPAWN`]) that waits on `fifo` in the kernel for
/// its vfork child (state D, with a child), and its `status`.
fn waiting_on(fifo: &str) -> Option<(u32, String)> {
    let python = std::path::PathBuf::from(python());
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .find_map(|p| {
            let cmd = std::fs::read(format!("/proc/{p}/cmdline")).ok()?;
            let exe = std::fs::read_link(format!("/proc/{p}/exe")).ok()?;
            let status = std::fs::read_to_string(format!("/proc/{p}/status")).ok()?;
            let children = std::fs::read_to_string(format!("/proc/{p}/task/{p}/children"));
            (String::from_utf8_lossy(&cmd).contains(fifo)
                && exe == python
                && status.lines().any(|l| l.starts_with("State:\tD"))
                && children.is_ok_and(|c| !c.trim().is_empty()))
            .then_some((p, status))
        })
}

/// The host pid of the process that waits on `fifo` ([`SPAWN`]) once a SIGSTOP is pending
/// for it (it can not take it before the FIFO is opened).
fn stop_pending(fifo: &str) -> u32 {
    eventually(
        "a SIGSTOP for the waiting process",
        Duration::from_secs(60),
        || {
            let (p, status) = waiting_on(fifo)?;
            status
                .lines()
                .find_map(|l| l.strip_prefix("ShdPnd:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                .is_some_and(|m| m & (1 << (libc::SIGSTOP - 1)) != 0)
                .then_some(p)
        },
    )
}

/// Opens `fifo` for writing, which lets the process waiting on it ([`SPAWN`]) go on (and
/// fails at once, doing nothing, if none waits).
fn release(fifo: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(fifo);
}

/// A subtree operation on another node may take as long as the signal method does (its
/// processes stop one after the other, up to 120 s), not only the freezer's 10 s: two
/// processes of the subtree that take 7 and 14 s to stop are suspended, asked from node 1.
#[test]
fn a_slow_subtree_suspend_on_another_node_is_waited_for() {
    root_or_skip!("a_slow_subtree_suspend_on_another_node_is_waited_for");
    let c = Cluster::up(2);
    let holds = Holds::new("hold");
    let (f1, p1) = holds.fifo("f1", "sleep 3861");
    let (f2, p2) = holds.fifo("f2", "sleep 3862");
    let o = c.clan(&[
        "run",
        "-d",
        "--node",
        "2",
        "--",
        "sh",
        "-c",
        &format!("sh -c '{p1} & {p2} & wait' & exec sleep 3863"),
    ]);
    let job = job_of(&o);
    let sub = eventually("the subtree", Duration::from_secs(20), || {
        let ps = c.ps(&["--job", &job]);
        let sh = ps
            .iter()
            .find(|p| p["cmd"].as_str().is_some_and(|s| s.starts_with("sh -c /")))?;
        (waiting_on(&f1).is_some() && waiting_on(&f2).is_some()).then(|| sh["gpid"].to_string())
    });
    // Each waiting process takes its SIGSTOP 7 and 14 s after it was sent.
    let holders: Vec<_> = [(f1.clone(), 7), (f2.clone(), 14)]
        .into_iter()
        .map(|(fifo, secs)| {
            std::thread::spawn(move || {
                stop_pending(&fifo);
                std::thread::sleep(Duration::from_secs(secs));
                release(&fifo);
            })
        })
        .collect();
    let started = std::time::Instant::now();
    let o = c.clan(&["--from", "1", "job", "suspend", &job, "--subtree", &sub]);
    let took = started.elapsed();
    for h in holders {
        let _ = h.join();
    }
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("suspended"),
        "after {took:?}: {o:?}"
    );
    assert!(
        took > Duration::from_secs(12),
        "{took:?}: the holders did not hold"
    );
    c.clan_ok(&["job", "kill", &job]);
    assert!(host_processes_mentioning("sleep 386").is_empty());
}

/// A job suspended with signals does not look stopped to the stub of its attached process
/// (nor to a shell running that stub): the suspension's stops and continues are not
/// reported, as the freezer makes none. A run into a suspended job is refused.
#[test]
fn a_signals_suspend_does_not_stop_the_stub() {
    root_or_skip!("a_signals_suspend_does_not_stop_the_stub");
    use std::io::{BufRead, BufReader, Write};
    let c = Cluster::up_restartable(2);
    let mut stub = KillOnDrop(
        c.cmd()
            .args([
                "run",
                "--node",
                "2",
                "--",
                "sh",
                "-c",
                "echo $CLAN_JOB; read l; echo \"got $l\"",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(stub.0.stdout.take().unwrap());
    let mut job = String::new();
    out.read_line(&mut job).unwrap();
    let job = job.trim().to_string();
    let out_s = c.clan_ok(&["job", "suspend", "--method", "signals", &job]);
    assert!(out_s.contains("suspended"), "{out_s}");
    assert!(job_states(&c, &job).iter().all(|s| s == "T"));
    // Had the stop been reported, the stub would mirror it within milliseconds.
    let state = || proc_state(stub.0.id());
    let never_stopped = || {
        for _ in 0..20 {
            assert_ne!(
                state(),
                Some('T'),
                "the stub mirrored the suspension's stop"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    never_stopped();
    // A run into the suspended job is refused at once (it could not start before a resume).
    let refused = |c: &Cluster| {
        let o = c.clan(&["run", "--job", &job, "--node", "2", "--", "true"]);
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(
            !o.status.success() && err.contains("is suspended on node 2"),
            "{err}"
        );
    };
    refused(&c);
    // The process's node restarts while the job is suspended: its shepherd still knows the
    // stop was the suspension's, and does not tell the stub that reattaches.
    c.kill_cland(2);
    let mut daemon = KillOnDrop(c.restart_cland(2));
    eventually("the stub reattached", Duration::from_secs(10), || {
        c.log(2).contains("stub reattached").then_some(())
    });
    never_stopped();
    // The restarted cland still knows the job is suspended.
    refused(&c);
    c.clan_ok(&["job", "resume", "--method", "signals", &job]);
    c.clan_ok(&["job", "suspend", &job]);
    refused(&c);
    c.clan_ok(&["job", "resume", &job]);
    let mut input = stub.0.stdin.take().unwrap();
    writeln!(input, "on").unwrap();
    let mut l = String::new();
    out.read_line(&mut l).unwrap();
    assert_eq!(l, "got on\n");
    assert!(stub.0.wait().unwrap().success());
    drop(c);
    let _ = daemon.0.wait();
}

/// The host pids of job `job`'s task on node `node` (its `cgroup.procs`).
fn task_pids(c: &Cluster, node: u32, job: &str) -> Vec<u32> {
    c.cgroup()
        .and_then(|g| {
            std::fs::read_to_string(g.join(format!("node{node}/job{job}/cgroup.procs"))).ok()
        })
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// The processes of job `job`'s task on node `node` in a stop (`T`, or `t` under a tracer).
fn stopped_in_task(c: &Cluster, node: u32, job: &str) -> Vec<(u32, char)> {
    task_pids(c, node, job)
        .into_iter()
        .filter_map(|p| Some((p, proc_state(p)?)))
        .filter(|(_, s)| matches!(s, 'T' | 't'))
        .collect()
}

/// How many times node `node`'s lock `name` was taken (`clan stats locks`; 0 before its
/// first use).
fn lock_acquired(c: &Cluster, node: u32, name: &str) -> u64 {
    c.clan_ok(&["stats", "locks", "--node", &node.to_string()])
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3 && f[1] == name).then(|| f[2].parse().ok())?
        })
        .unwrap_or(0)
}

/// Operations on one job's task run one at a time: a resume asked while a slow signals
/// suspend is still stopping the job's processes (a forking loop among them) waits for it,
/// then continues every process, rather than run meanwhile and leave the processes the
/// suspend stops after it stopped behind a job reported resumed.
#[test]
fn a_resume_waits_for_a_slow_suspend_of_the_same_job() {
    root_or_skip!("a_resume_waits_for_a_slow_suspend_of_the_same_job");
    let c = Cluster::up(1);
    let holds = Holds::new("race");
    let (fifo, held) = holds.fifo("f", "sleep 3895");
    let o = c.clan(&[
        "run",
        "-d",
        "--",
        "sh",
        "-c",
        &format!("while :; do sleep 0.01; done & {held} & wait"),
    ]);
    assert!(o.status.success(), "{o:?}");
    let job = job_of(&o);
    eventually(
        "the process waiting on its FIFO",
        Duration::from_secs(20),
        || waiting_on(&fifo),
    );
    std::thread::scope(|s| {
        let suspend = s.spawn(|| c.clan(&["job", "suspend", "--method", "signals", &job]));
        // The suspend has stopped the shells and waits for the held process.
        stop_pending(&fifo);
        let entered = lock_acquired(&c, 1, "task.ops");
        let resume = s.spawn(|| c.clan(&["job", "resume", "--method", "signals", &job]));
        // The resume has reached the task's lock (and waits there), or, were it not
        // serialised, has acted already.
        eventually(
            "the resume to reach the task",
            Duration::from_secs(20),
            || (resume.is_finished() || lock_acquired(&c, 1, "task.ops") > entered).then_some(()),
        );
        release(&fifo);
        let (suspend, resume) = (suspend.join().unwrap(), resume.join().unwrap());
        let said = |o: &std::process::Output| String::from_utf8_lossy(&o.stdout).to_string();
        assert!(
            suspend.status.success() && said(&suspend).contains("suspended"),
            "{suspend:?}"
        );
        assert!(
            resume.status.success() && said(&resume).contains("resumed"),
            "{resume:?}"
        );
    });
    // Both returned: nothing of the job stays stopped (the resume verified each continue;
    // polled only for processes the loop forks meanwhile).
    eventually(
        "no process of the job stopped",
        Duration::from_secs(10),
        || stopped_in_task(&c, 1, &job).is_empty().then_some(()),
    );
    let o = c.clan(&["run", "--job", &job, "--", "true"]);
    assert!(o.status.success(), "a run into the resumed job: {o:?}");
    c.clan_ok(&["job", "kill", &job]);
    assert!(host_processes_mentioning("sleep 3895").is_empty());
}

/// A signals suspend that left only some processes stopped (one continued behind its back
/// here, as a suspend that failed midway leaves them) is undone by a plain resume: every
/// process continued, the job no longer marked suspended, so runs into it are accepted.
#[test]
fn a_plain_resume_continues_a_partial_signals_suspend() {
    root_or_skip!("a_plain_resume_continues_a_partial_signals_suspend");
    let c = Cluster::up(1);
    let o = c.clan(&[
        "run",
        "-d",
        "--",
        "sh",
        "-c",
        "sleep 3896 & sleep 3897 & wait",
    ]);
    let job = job_of(&o);
    let sleep = eventually("the sleeps", Duration::from_secs(20), || {
        host_pid_of("sleep 3896").zip(host_pid_of("sleep 3897"))
    });
    c.clan_ok(&["job", "suspend", "--method", "signals", &job]);
    assert_eq!(stopped_in_task(&c, 1, &job).len(), 3);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sleep.1 as i32),
        nix::sys::signal::Signal::SIGCONT,
    )
    .unwrap();
    assert_ne!(proc_state(sleep.1), Some('T'));
    let out = c.clan_ok(&["job", "resume", &job]);
    assert!(out.contains(": resumed"), "{out}");
    assert_eq!(stopped_in_task(&c, 1, &job), vec![]);
    let o = c.clan(&["run", "--job", &job, "--", "true"]);
    assert!(o.status.success(), "a run into the resumed job: {o:?}");
    c.clan_ok(&["job", "kill", &job]);
    assert!(host_processes_mentioning("sleep 3896").is_empty());
    assert!(host_processes_mentioning("sleep 3897").is_empty());
}

/// A job running a traced process (strace) is suspended with signals: the traced process
/// stops for its tracer (`t`, the tracer being stopped first), which counts as stopped;
/// the resume continues it too.
#[test]
fn a_signals_suspend_stops_traced_processes() {
    root_or_skip!("a_signals_suspend_stops_traced_processes");
    if !std::path::Path::new("/usr/bin/strace").exists() {
        eprintln!("a_signals_suspend_stops_traced_processes: SKIPPED: no strace");
        return;
    }
    let c = Cluster::up(1);
    let o = c.clan(&[
        "run",
        "-d",
        "--",
        "strace",
        "-f",
        "-o",
        "/dev/null",
        "sh",
        "-c",
        "sleep 3898 & sleep 3899; wait",
    ]);
    let job = job_of(&o);
    // strace, sh and the two sleeps (whose names are in the command lines of the first
    // two as well: counted in the job, not found by name).
    eventually("the traced sleeps", Duration::from_secs(20), || {
        (job_states(&c, &job).len() == 4).then_some(())
    });
    let out = c.clan_ok(&["job", "suspend", "--method", "signals", &job]);
    assert!(out.contains(": suspended (4 processes)"), "{out}");
    let stopped = stopped_in_task(&c, 1, &job);
    assert_eq!(stopped.len(), 4, "{stopped:?}");
    assert!(stopped.iter().any(|(_, s)| *s == 't'), "{stopped:?}");
    let show = c.clan_ok(&["job", "show", &job]);
    assert!(show.contains("suspended"), "{show}");
    let out = c.clan_ok(&["job", "resume", &job]);
    assert!(out.contains(": resumed"), "{out}");
    // The traced processes run once their tracer lets them.
    eventually(
        "the traced processes running",
        Duration::from_secs(10),
        || stopped_in_task(&c, 1, &job).is_empty().then_some(()),
    );
    c.clan_ok(&["job", "kill", &job]);
    assert!(host_processes_mentioning("sleep 3898").is_empty());
    assert!(host_processes_mentioning("sleep 3899").is_empty());
}

/// A process of a job in a pid namespace nested in the node's (`unshare -pf`) has inner
/// numbers 1, 2, 3 that mean nothing to the node: `clan job tree` lists each process once
/// under its node gpid (the one `clan ps` shows), `--subtree` acts on the process named,
/// and `clan job kill` leaves nothing.
#[test]
fn processes_of_a_nested_pid_namespace_keep_their_node_gpids() {
    root_or_skip!("processes_of_a_nested_pid_namespace_keep_their_node_gpids");
    let c = Cluster::up(1);
    let o = c.clan(&["run", "--", "unshare", "-pf", "--mount-proc", "true"]);
    if !o.status.success() {
        eprintln!("processes_of_a_nested_pid_namespace_keep_their_node_gpids: SKIPPED: {o:?}");
        return;
    }
    let o = c.clan(&[
        "run",
        "-d",
        "--",
        "sh",
        "-c",
        "unshare -pf --mount-proc sh -c 'sleep 3901 & sleep 3902 & wait'; exit",
    ]);
    assert!(o.status.success(), "{o:?}");
    let job = job_of(&o);
    let gpid_of = |ps: &[serde_json::Value], cmd: &str| -> Option<String> {
        ps.iter()
            .find(|p| p["cmd"] == cmd)
            .map(|p| p["gpid"].to_string())
    };
    // The task's processes as ps sees them, once the tree lists them all.
    let (ps, tree) = eventually("the whole tree", Duration::from_secs(20), || {
        let ps: Vec<serde_json::Value> = c
            .ps(&["--job", &job])
            .into_iter()
            .filter(|p| p["state"] != "Z")
            .collect();
        gpid_of(&ps, "sleep 3901")?;
        gpid_of(&ps, "sleep 3902")?;
        let tree = c.clan_ok(&["job", "tree", &job]);
        let lines = tree.lines().skip(1).count();
        (lines == ps.len() && ps.len() == 5).then_some((ps, tree))
    });
    let mut listed: Vec<String> = tree
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    listed.sort();
    let mut want: Vec<String> = ps.iter().map(|p| p["gpid"].to_string()).collect();
    want.sort();
    assert_eq!(listed, want, "{tree}");
    // The sleeps under the inner shell, the inner shell under unshare.
    let depth = |cmd: &str| {
        let l = tree
            .lines()
            .find(|l| l.trim().split_once(' ').is_some_and(|(_, c)| c == cmd))
            .unwrap_or_else(|| panic!("{cmd} not in {tree}"));
        l.len() - l.trim_start().len()
    };
    assert_eq!(depth("sleep 3901"), depth("sleep 3902"));
    assert_eq!(
        depth("sleep 3901"),
        depth("sh -c sleep 3901 & sleep 3902 & wait") + 2
    );

    let sub = gpid_of(&ps, "sleep 3901").unwrap();
    let out = c.clan_ok(&["job", "suspend", &job, "--subtree", &sub]);
    assert!(out.contains("suspended (1 process)"), "{out}");
    assert_eq!(host_pid_of("sleep 3901").and_then(proc_state), Some('T'));
    assert_ne!(host_pid_of("sleep 3902").and_then(proc_state), Some('T'));
    assert_eq!(stopped_in_task(&c, 1, &job).len(), 1);

    c.clan_ok(&["job", "kill", &job]);
    assert!(host_processes_mentioning("sleep 390").is_empty());
}

/// A local cluster whose nodes do not use the cgroup freezer nor `cgroup.kill`
/// (`clan up --no-freezer`), as on kernels without them: jobs go by signals.
fn cluster_without_freezer(n: u32) -> Cluster {
    Cluster::up_with(
        n,
        &[
            "--heartbeat-ms",
            "200",
            "--dead-after-ms",
            "2000",
            "--no-freezer",
        ],
    )
}

/// The rows of job `job` in `clan job ls` or `clan job show` output, split in fields
/// (JOB NODE USER STATE PROCS ...).
fn job_rows(out: &str, job: &str) -> Vec<Vec<String>> {
    out.lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .filter(|f| f.first().map(String::as_str) == Some(job) && f.len() > 4)
        .collect()
}

/// The host processes, not zombies, whose cgroup is job `job`'s task on any node of `c`
/// (a scan of the host's /proc, which holds every node's processes).
fn left_in_job(c: &Cluster, job: &str) -> Vec<(u32, char)> {
    let Some(cluster) = c.cgroup().and_then(|g| g.file_name()) else {
        return Vec::new();
    };
    let cluster = format!("/{}/", cluster.to_string_lossy());
    let suffix = format!("/job{job}");
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/cgroup")).is_ok_and(|t| {
                t.lines()
                    .filter_map(|l| l.strip_prefix("0::"))
                    .any(|path| path.contains(&cluster) && path.trim_end().ends_with(&suffix))
            })
        })
        .filter_map(|p| Some((p, proc_state(p)?)))
        .filter(|(_, s)| !matches!(s, 'Z' | 'X'))
        .collect()
}

/// Without the freezer (`clan up --no-freezer`) a job is still a job: listed, suspended by
/// signals when no method is named (every process really stopped, `T`), resumed, and
/// killed with nothing left; `--method freeze` fails on each node with one line that says
/// why. A job-control shell inside the job (bash with `set -m`, whose `wait` returns 147
/// when its child stops) never sees its child stopped: stopped after it, continued before.
#[test]
fn without_the_freezer_a_job_is_suspended_resumed_and_killed_by_signals() {
    root_or_skip!("without_the_freezer_a_job_is_suspended_resumed_and_killed_by_signals");
    use clan_client::pb::JobAction as A;
    let c = cluster_without_freezer(2);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = std::env::temp_dir().join(format!("clan-jobs-nofreezer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let report = dir.join("report").display().to_string();
    let o = c.clan(&[
        "run",
        "-N",
        "2",
        "-d",
        "--",
        "sh",
        "-c",
        "yes >/dev/null & (yes >/dev/null &) ; exec sleep 1047",
    ]);
    assert!(o.status.success(), "{o:?}");
    let job = job_of(&o);
    let id: u64 = job.parse().unwrap();
    let o = c.clan(&[
        "run",
        "--job",
        &job,
        "--node",
        "2",
        "-d",
        "--",
        "bash",
        "-c",
        &format!("set -m; sleep 1048 & wait $!; echo \"wait $?\" > {report}.tmp; mv {report}.tmp {report}"),
    ]);
    assert!(o.status.success(), "{o:?}");
    let child = eventually("the watched child", Duration::from_secs(20), || {
        c.ps(&["--node", "2"])
            .into_iter()
            .find(|p| p["cmd"] == "sleep 1048")
    });
    eventually("the job's processes", Duration::from_secs(20), || {
        (task_pids(&c, 1, &job).len() == 3 && task_pids(&c, 2, &job).len() == 5).then_some(())
    });
    let states = |out: &str| -> Vec<String> {
        job_rows(out, &job)
            .into_iter()
            .map(|r| r[3].clone())
            .collect()
    };
    let ls = c.clan_ok(&["job", "ls"]);
    assert_eq!(states(&ls), ["running", "running"], "{ls}");
    let show = c.clan_ok(&["job", "show", &job]);
    assert_eq!(states(&show), ["running", "running"], "{show}");

    // The freezer asked for: refused on each node, one line each, nothing stopped.
    let o = c.clan(&["job", "suspend", "--method", "freeze", &job]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert_eq!(err.lines().count(), 2, "{err}");
    for n in 1..=2 {
        let line = err.lines().find(|l| l.contains(&format!("node {n}:")));
        assert!(
            line.is_some_and(|l| l.contains("no cgroup freezer") && l.contains("freezer = false")),
            "{err}"
        );
        assert_eq!(stopped_in_task(&c, n, &job), vec![], "{err}");
    }

    // No method named: by signals; every process of each task stopped when it returns.
    let answers = rt
        .block_on(c.client(1).job(A::JobSuspend, id, &[], 0, ""))
        .unwrap();
    assert_eq!(answers.len(), 2, "{answers:?}");
    for a in &answers {
        assert!(a.error.is_none(), "{answers:?}");
        assert!(
            a.tasks.len() == 1 && a.tasks[0].state == "suspended" && a.tasks[0].changed,
            "{answers:?}"
        );
    }
    for n in 1..=2 {
        let pids = task_pids(&c, n, &job);
        let stopped = stopped_in_task(&c, n, &job);
        assert!(
            stopped.len() == pids.len() && stopped.iter().all(|(_, s)| *s == 'T'),
            "node {n}: {pids:?} {stopped:?}"
        );
        assert_eq!(task_event(&c, n, &job, "frozen").as_deref(), Some("0"));
    }
    let show = c.clan_ok(&["job", "show", &job]);
    assert_eq!(states(&show), ["suspended", "suspended"], "{show}");
    let again = c.clan_ok(&["job", "suspend", "--method", "signals", &job]);
    assert_eq!(again.matches("already suspended").count(), 2, "{again}");
    let o = c.clan(&["run", "--job", &job, "--node", "1", "--", "true"]);
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("is suspended"),
        "a run into the suspended job: {o:?}"
    );

    // Resumed: nothing stopped; the shell never saw its child stopped.
    let out = c.clan_ok(&["job", "resume", &job]);
    assert_eq!(out.matches(": resumed").count(), 2, "{out}");
    for n in 1..=2 {
        assert_eq!(stopped_in_task(&c, n, &job), vec![]);
    }
    let ls = c.clan_ok(&["job", "ls"]);
    assert_eq!(states(&ls), ["running", "running"], "{ls}");
    c.clan_ok(&["kill", &child["gpid"].to_string()]);
    let seen = eventually("the shell's report", Duration::from_secs(20), || {
        std::fs::read_to_string(&report).ok()
    });
    assert_eq!(
        seen.trim(),
        "wait 143",
        "the shell saw its child stopped (147) or did not see it end by SIGTERM"
    );

    // Killed by signals: nothing of the job is left on any node.
    let out = c.clan_ok(&["job", "kill", &job]);
    assert_eq!(out.matches(": killed").count(), 2, "{out}");
    assert_eq!(left_in_job(&c, &job), vec![]);
    assert!(host_processes_mentioning("sleep 1047").is_empty());
    let o = c.clan(&["job", "show", &job]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without the freezer, a switch (no method named) stops the old job by signals before the
/// new one runs, a switch with `--method freeze` is refused and changes nothing, and
/// subtrees are suspended, resumed and killed alone; a stopped job is killed too.
#[test]
fn without_the_freezer_switches_and_subtrees_go_by_signals() {
    root_or_skip!("without_the_freezer_switches_and_subtrees_go_by_signals");
    use clan_client::pb;
    let c = cluster_without_freezer(1);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let o = c.clan(&[
        "run",
        "-d",
        "--",
        "sh",
        "-c",
        "sh -c 'sleep 3871 & exec sleep 3872' & exec sleep 3873",
    ]);
    let a = job_of(&o);
    let b = job_of(&c.clan(&["run", "-d", "--", "sleep", "3874"]));
    let sub = eventually("the subtree", Duration::from_secs(20), || {
        let ps = c.ps(&["--job", &a]);
        let sub = ps.iter().find(|p| p["cmd"] == "sleep 3872")?;
        (ps.iter().any(|p| p["cmd"] == "sleep 3871") && host_pid_of("sleep 3874").is_some())
            .then(|| sub["gpid"].to_string())
    });
    let state = |cmd: &str| host_pid_of(cmd).and_then(proc_state);
    let all_stopped = |job: &str| {
        let pids = task_pids(&c, 1, job);
        !pids.is_empty() && stopped_in_task(&c, 1, job).len() == pids.len()
    };

    // A subtree, alone.
    let out = c.clan_ok(&["job", "suspend", &a, "--subtree", &sub]);
    assert!(out.contains("suspended (2 processes)"), "{out}");
    assert_eq!(state("sleep 3871"), Some('T'));
    assert_eq!(state("sleep 3872"), Some('T'));
    assert_ne!(state("sleep 3873"), Some('T'), "outside the subtree");
    let out = c.clan_ok(&["job", "resume", &a, "--subtree", &sub]);
    assert!(out.contains("resumed (2 processes)"), "{out}");
    assert_eq!(stopped_in_task(&c, 1, &a), vec![]);

    // A switch with no method named: A stopped, every process, then B running.
    let switch = |old: &str, new: &str| {
        rt.block_on(c.client(1).job_request(pb::JobRequest {
            action: pb::JobAction::JobSwitch as i32,
            job: old.parse().unwrap(),
            resume: new.parse().unwrap(),
            ..Default::default()
        }))
        .unwrap()
    };
    c.clan_ok(&["job", "suspend", "--method", "signals", &b]);
    assert!(all_stopped(&b));
    let answers = switch(&a, &b);
    let tasks: Vec<(String, String)> = answers
        .iter()
        .flat_map(|n| n.tasks.iter())
        .map(|t| (t.job.to_string(), t.state.clone()))
        .collect();
    assert_eq!(
        tasks,
        [
            (a.clone(), "suspended".into()),
            (b.clone(), "running".into())
        ],
        "{answers:?}"
    );
    assert!(all_stopped(&a));
    assert_eq!(stopped_in_task(&c, 1, &b), vec![]);
    let out = c.clan_ok(&["job", "switch", "--method", "signals", &b, &a]);
    assert!(out.contains("suspended (1 process)"), "{out}");
    assert!(all_stopped(&b) && stopped_in_task(&c, 1, &a).is_empty());
    // The CLI without --method: signals here, as the library's request above.
    let out = c.clan_ok(&["job", "switch", &a, &b]);
    assert!(
        all_stopped(&a) && stopped_in_task(&c, 1, &b).is_empty(),
        "{out}"
    );
    let out = c.clan_ok(&["job", "switch", &b, &a]);
    assert!(
        all_stopped(&b) && stopped_in_task(&c, 1, &a).is_empty(),
        "{out}"
    );
    // The freezer asked for: refused, nothing changed.
    let o = c.clan(&["job", "switch", "--method", "freeze", &a, &b]);
    assert!(
        o.status.code() == Some(2)
            && String::from_utf8_lossy(&o.stderr).contains("no cgroup freezer"),
        "{o:?}"
    );
    assert!(all_stopped(&b) && stopped_in_task(&c, 1, &a).is_empty());

    // A subtree killed alone; then both jobs, B stopped: nothing left.
    let out = c.clan_ok(&["job", "kill", &a, "--subtree", &sub]);
    assert!(out.contains("killed (2 processes)"), "{out}");
    assert!(host_processes_mentioning("sleep 3871").is_empty());
    assert!(host_processes_mentioning("sleep 3872").is_empty());
    assert_eq!(host_processes_mentioning("sleep 3873").len(), 1);
    for j in [&a, &b] {
        c.clan_ok(&["job", "kill", j]);
        assert_eq!(left_in_job(&c, j), vec![]);
    }
    assert!(host_processes_mentioning("sleep 387").is_empty());
}

/// Where the pids controller is a v1 hierarchy (hybrid hosts), a node keeps directories
/// made ahead there (`spare<N>`), and a new task takes one, renamed `job<J>`, instead of
/// waiting for a mkdir: the process is in that directory from its start, and the node
/// makes another spare once the start is answered.
#[test]
fn a_new_task_takes_v1_directories_made_ahead() {
    root_or_skip!("a_new_task_takes_v1_directories_made_ahead");
    let v2_pids = cgroup2().is_some_and(|m| {
        std::fs::read_to_string(m.join("cgroup.controllers"))
            .is_ok_and(|t| t.split_whitespace().any(|c| c == "pids"))
    });
    let Some(v1) = clan_daemon::cgroup::v1_mount("pids").filter(|_| !v2_pids) else {
        eprintln!(
            "SKIP a_new_task_takes_v1_directories_made_ahead: the pids controller is not a \
             v1 hierarchy here (cgroup v2 serves it: no v1 directories to make ahead)"
        );
        return;
    };
    let c = Cluster::up(2);
    let rel = c
        .cgroup()
        .expect("cluster cgroup")
        .strip_prefix(cgroup2().expect("cgroup2"))
        .expect("under the cgroup2 mount")
        .to_path_buf();
    let node1 = v1.join(rel).join("node1");
    let spares = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&node1)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("spare"))
            .collect();
        v.sort();
        v
    };
    // Node 1's two spare sets, once they are made.
    let two_spares = |what: &str| {
        eventually(what, Duration::from_secs(10), || {
            let s = spares();
            (s.len() == 2).then_some(s)
        })
    };
    let before = two_spares("node 1's spare v1 directories");
    let o = c.clan(&["run", "--node", "1", "-d", "--", "sleep", "1071"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let job = job_of(&o);
    let gpid: u64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    // The process is in its task's v1 directory (its `tasks` names it), and that directory
    // was one of the spares (the pids controller's own `pids.current` counts it).
    let dir = node1.join(format!("job{job}"));
    let host_pid = host_processes_mentioning("sleep 1071")
        .first()
        .and_then(|l| l.split(':').next().map(str::to_string))
        .expect("the sleep runs");
    let tasks = std::fs::read_to_string(dir.join("tasks")).unwrap_or_default();
    assert!(
        tasks.lines().any(|l| l.trim() == host_pid),
        "{} holds {tasks:?}, not {host_pid} (gpid {gpid})",
        dir.display()
    );
    let after = two_spares("node 1's spares made again");
    let taken: Vec<&String> = before.iter().filter(|s| !after.contains(s)).collect();
    assert_eq!(taken.len(), 1, "one spare taken: {before:?} then {after:?}");
    // A second process of the same job on the node: its task is there, no spare is taken.
    let o = c.clan(&[
        "run", "--node", "1", "--job", &job, "-d", "--", "sleep", "1072",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(spares(), after, "a spare taken for a task that was there");
    assert_eq!(
        std::fs::read_to_string(dir.join("tasks"))
            .unwrap_or_default()
            .lines()
            .count(),
        2,
        "both processes in {}",
        dir.display()
    );
    c.clan_ok(&["job", "kill", &job]);
    assert!(host_processes_mentioning("sleep 1071").is_empty());
    assert!(host_processes_mentioning("sleep 1072").is_empty());
}
