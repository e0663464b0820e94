//! clan's figures for POSIX semantics across nodes (issue 3): fork/exit/wait of a remote
//! child, a signal to a process group spread over the nodes, and how long waiting parents
//! take to learn of a node's death.

use crate::baselines;
use crate::clan::rt1;
use crate::cluster::Cluster;
use crate::report::Report;
use crate::stats::{fmt, Samples};
use anyhow::{bail, Context};
use clan_client::RunSpec;
use clan_core::Gpid;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Warm-up cycles of the `forkping` role, not counted.
const WARMUP: usize = 5;

/// Fork/exit/wait of `true` on node 2 (and on node 1 itself) by a process on node 1 that
/// waits for it as its parent, through the client library, against a local spawn+wait of
/// `true` and a bare fork+_exit+waitpid (Solaris MC Table 4, row 1).
pub fn fork_wait(c: &Cluster, r: &mut Report, n: usize) {
    let g = "fork/exit/wait";
    println!("{g}:");
    let base = "local spawn+wait of true (std Command)";
    r.latency(g, base, &baselines::spawn_true(n), None);
    r.latency(
        g,
        "local fork+_exit+waitpid (no exec)",
        &baselines::fork_exit_wait(n),
        Some(base),
    );
    for (node, what) in [
        (2, "node 2 (library, parent on node 1)"),
        (1, "node 1 (same node)"),
    ] {
        let (total, spawn) = forkping_on(c, node, n);
        r.latency(
            g,
            &format!("clan spawn+wait of true on {what}"),
            &total,
            Some(base),
        );
        r.latency(
            g,
            &format!("  of which spawn until Started (node {node})"),
            &spawn,
            Some(base),
        );
    }
}

/// Runs the `forkping` role on node 1 for `n` cycles of a child on `node`: (whole cycles,
/// spawn replies).
fn forkping_on(c: &Cluster, node: u32, n: usize) -> (Samples, Samples) {
    let exe = std::env::current_exe().expect("self");
    let out = c.dir.join(format!("forkping-{node}.out"));
    let parent = c
        .spawn(
            1,
            &[
                exe.to_str().expect("utf-8 path"),
                "forkping",
                "--node",
                &node.to_string(),
                "--out",
                out.to_str().expect("utf-8 path"),
                "--iters",
                &n.to_string(),
            ],
        )
        .expect("forkping");
    let st = c
        .cmd()
        .args(["wait", &parent.to_string()])
        .stdout(Stdio::null())
        .status()
        .expect("wait");
    assert!(st.success(), "forkping failed; see clan logs {parent}");
    let text = std::fs::read_to_string(&out).expect("forkping results");
    let (mut total, mut spawn) = (Samples::default(), Samples::default());
    for l in text.lines() {
        let mut f = l.split_whitespace().filter_map(|x| x.parse::<u64>().ok());
        if let (Some(a), Some(b)) = (f.next(), f.next()) {
            total.push(Duration::from_nanos(a));
            spawn.push(Duration::from_nanos(b));
        }
    }
    (total, spawn)
}

/// The `forkping` role, a process of node 1: `iters` times, starts a detached `true` on
/// `node` and waits for it (it is this process's child, so the wait is the parent's); writes
/// "cycle_ns spawn_reply_ns" per cycle.
pub fn forkping(node: u32, out: &Path, iters: usize) -> anyhow::Result<()> {
    let client = clan_client::Client::locate(None, None)?;
    let mut lines = String::new();
    rt1().block_on(async {
        for i in 0..iters + WARMUP {
            let t = Instant::now();
            let started = client.spawn(RunSpec::command(["true"]).node(node)).await?;
            let spawned = t.elapsed();
            let gpid = *started.gpids.first().context("nothing started")?;
            let st = client.wait_one(gpid).await?;
            let cycle = t.elapsed();
            if st.signal != 0 || st.code != 0 {
                bail!("{gpid}: {}", st.describe());
            }
            if i >= WARMUP {
                lines.push_str(&format!("{} {}\n", cycle.as_nanos(), spawned.as_nanos()));
            }
        }
        Ok(())
    })?;
    std::fs::write(out, lines)?;
    Ok(())
}

/// Members per node of the process group of [`group_signal`].
const PER_NODE: usize = 25;

/// A harmless signal: its default action is to ignore it, so the sleeps survive it.
const HARMLESS: i32 = libc::SIGWINCH;

/// One `kill -g` (sigsend `pgid=G`) of SIGWINCH to a process group of 25 sleeps on each
/// node, from node 1, against 100 local kill(2) calls to 100 local sleeps.
pub fn group_signal(c: &Cluster, r: &mut Report, n: usize) {
    let g = "group signal";
    let total = PER_NODE * c.nodes as usize;
    println!(
        "{g} (SIGWINCH to {total} processes, {PER_NODE} on each of {} nodes):",
        c.nodes
    );
    let base = format!("{total} local kill(2), one per process");
    {
        let local = baselines::LocalGroup::start(total);
        r.latency(g, &base, &local.kill_each(n, HARMLESS), None);
        r.latency(
            g,
            &format!("local killpg(2), {total}-member group"),
            &local.killpg(n, HARMLESS),
            Some(&base),
        );
    }
    // A shell on node 1 starts the others with `clan run -d` (so they join its group),
    // then becomes one of the sleeps.
    let clan = c.bin.join("clan");
    let script = format!(
        "clan='{}'; for n in $(seq 1 {nodes}); do k={PER_NODE}; [ $n = 1 ] && k=$((k-1)); \
         i=0; while [ $i -lt $k ]; do \"$clan\" run -d --node $n -- sleep 3600 >/dev/null || exit 1; \
         i=$((i+1)); done; done; exec sleep 3600",
        clan.display(),
        nodes = c.nodes
    );
    let leader = c.spawn(1, &["sh", "-c", &script]).expect("group leader");
    let expr = format!("pgid={}", leader.raw());
    let client = c.client(1);
    let rt = rt1();
    // Every member reached, and as many on each node, before any timing.
    let check = |res: &[(Option<Gpid>, Result<(), clan_client::pb::Error>)]| -> Result<(), String> {
        let mut per = vec![0usize; c.nodes as usize + 1];
        for (gp, e) in res {
            match (gp, e) {
                (Some(gp), Ok(())) => per[gp.node().get() as usize] += 1,
                (_, Err(e)) => return Err(format!("{gp:?}: {e}")),
                (None, Ok(())) => return Err("a result without a gpid".into()),
            }
        }
        if per[1..].iter().all(|&k| k == PER_NODE) {
            Ok(())
        } else {
            Err(format!("members per node {:?}", &per[1..]))
        }
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let res = rt.block_on(client.sigsend(&expr, 0)).expect("sigsend -0");
        match check(&res) {
            Ok(()) => break,
            Err(why) if Instant::now() > deadline => {
                panic!("group {leader} not complete: {why}; {}", census(c, leader))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    let mut s = Samples::default();
    rt.block_on(async {
        for _ in 0..n {
            let t = Instant::now();
            let res = client.sigsend(&expr, HARMLESS).await.expect("sigsend");
            s.push(t.elapsed());
            if let Err(why) = check(&res) {
                panic!("kill -g {leader}: {why}");
            }
        }
    });
    r.latency(
        g,
        &format!(
            "clan kill -g, {total} members on {} nodes (library, node 1)",
            c.nodes
        ),
        &s,
        Some(&base),
    );
    // Where the time goes: the same request narrowed to the members on node 1 (the node
    // asked: no peer hop) and to those on node 2 (one peer hop).
    for node in [1, 2] {
        let narrow = format!("{expr} && node={node}");
        let mut s = Samples::default();
        rt.block_on(async {
            for _ in 0..n {
                let t = Instant::now();
                let res = client.sigsend(&narrow, HARMLESS).await.expect("sigsend");
                s.push(t.elapsed());
                let ok = res.iter().filter(|(g, e)| g.is_some() && e.is_ok()).count();
                assert!(ok == PER_NODE && res.len() == PER_NODE, "{narrow}: {res:?}");
            }
        });
        r.latency(
            g,
            &format!("  same, only the {PER_NODE} on node {node} (library, node 1)"),
            &s,
            Some(&base),
        );
    }
    let mut s = Samples::default();
    for _ in 0..n {
        let t = Instant::now();
        let st = c
            .cmd()
            .args([
                "--from",
                "1",
                "kill",
                "-s",
                "WINCH",
                "-g",
                &leader.to_string(),
            ])
            .status()
            .expect("clan kill -g");
        s.push(t.elapsed());
        assert!(st.success(), "clan kill -g {leader} failed");
    }
    r.latency(
        g,
        &format!("clan kill -g, {total} members (CLI, from node 1)"),
        &s,
        Some(&base),
    );
    let _ = rt.block_on(client.sigsend(&expr, libc::SIGKILL));
    let _ = c
        .cmd()
        .args(["wait", &leader.to_string()])
        .stdout(Stdio::null())
        .status();
    // Gone from every node before the next measurement.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = members(c, leader);
        if left.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            let some: Vec<String> = left
                .iter()
                .take(5)
                .map(|p| format!("{} ({} {:?} ppid {})", p.gpid, p.state, p.cmd, p.ppid))
                .collect();
            println!(
                "  ({} members of {leader} still listed 30 s after SIGKILL: {})",
                left.len(),
                some.join(", ")
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The processes `ps` lists in group `pgid`, on every node.
fn members(c: &Cluster, pgid: Gpid) -> Vec<clan_client::pb::ProcInfo> {
    rt1()
        .block_on(c.client(1).ps(clan_client::pb::PsFilter::default(), &[]))
        .map(|nodes| {
            nodes
                .into_iter()
                .flat_map(|n| n.procs)
                .filter(|p| p.pgid == pgid.raw())
                .collect()
        })
        .unwrap_or_default()
}

/// What `ps` says of the group `pgid`: its members per node (to tell a member that
/// `sigsend` missed from one that is not there).
fn census(c: &Cluster, pgid: Gpid) -> String {
    let m = members(c, pgid);
    let per: Vec<String> = (1..=c.nodes)
        .map(|n| format!("{}", m.iter().filter(|p| p.node == n).count()))
        .collect();
    format!("ps lists [{}]", per.join(", "))
}

/// The node that is crashed by [`death_notice`]; the waiting parents are on the others.
const VICTIM: u32 = 4;

/// How a parent on another node was waiting for its child on the victim.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Waiter {
    /// `Client::wait` (the client library) on a detached child: killed by SIGKILL.
    Wait,
    /// `clan wait` (the CLI) on a detached child: exit status 137.
    CliWait,
    /// `Client::run` (the client library) of an attached child: its session reports the
    /// process lost (which the CLI shows as killed by SIGKILL) or killed by SIGKILL.
    Session,
    /// An attached `clan run --node 4 sleep 1000` (its stub): 137, killed by SIGKILL itself.
    Stub,
}

/// Each waiter with its row in the table.
const WAITERS: [(Waiter, &str); 4] = [
    (Waiter::Wait, "Client::wait returns killed by SIGKILL"),
    (Waiter::CliWait, "clan wait (CLI) exits 137"),
    (
        Waiter::Session,
        "Client::run session reports the child lost",
    ),
    (Waiter::Stub, "stub clan run --node 4 (CLI) exits 137"),
];

/// When the waiter on `node` was told, with the shell status it was told.
struct Told {
    kind: Waiter,
    node: u32,
    code: Result<i32, String>,
    at: Instant,
}

/// The waiters' threads of one crash, each with the CLI process it waits for (none for the
/// client library's waiters, which time out by themselves). On drop, a CLI process still
/// there is killed and its thread reaps it.
#[derive(Default)]
struct Round {
    threads: Vec<(Option<i32>, std::thread::JoinHandle<()>)>,
}

impl Drop for Round {
    fn drop(&mut self) {
        for (pid, t) in self.threads.drain(..) {
            if let (Some(p), false) = (pid, t.is_finished()) {
                // SAFETY: kill has no memory-safety preconditions; the thread that reaps
                // this child is still running, so the pid is still the child's.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
            let _ = t.join();
        }
    }
}

/// Node 4 of a 4-node local cluster of its own crashed (`clan node crash 4`, a cgroup.kill
/// of the node) `crashes` times, each with parents on nodes 1 to 3 waiting for children on
/// node 4 four ways; time from the crash until each is told, against the configured
/// `dead_after_ms`. The cluster goes down at the end, also on error.
pub fn death_notice(
    bin: &Path,
    r: &mut Report,
    crashes: usize,
    base_port: u16,
) -> anyhow::Result<()> {
    let g = "death notice";
    let c = Cluster::up(bin, "death", VICTIM, base_port)?;
    let cfg = clan_core::ClusterConfig::load(&c.dir.join("cluster.toml"))?;
    let dead_after = Duration::from_millis(cfg.dead_after_ms);
    println!(
        "{g} (node {VICTIM} crashed, parents on nodes 1-{}; heartbeat {} ms, dead after {} ms):",
        VICTIM - 1,
        cfg.heartbeat_ms,
        cfg.dead_after_ms
    );
    let base = format!("configured dead_after_ms ({} ms)", cfg.dead_after_ms);
    let mut by_kind: Vec<Samples> = vec![Samples::default(); WAITERS.len()];
    let mut slowest = Samples::default();
    for i in 0..crashes {
        let told = crash_once(&c, &cfg, dead_after)?;
        let mut all = Samples::default();
        for (d, kind) in &told {
            let k = WAITERS.iter().position(|w| w.0 == *kind).expect("known");
            by_kind[k].push(*d);
            all.push(*d);
        }
        let per_kind: Vec<String> = WAITERS
            .iter()
            .map(|(w, _)| {
                let mut v: Vec<Duration> = told.iter().filter(|t| t.1 == *w).map(|t| t.0).collect();
                v.sort();
                let v: Vec<String> = v.into_iter().map(fmt).collect();
                format!("{w:?} {}", v.join(" "))
            })
            .collect();
        println!("  crash {}: {}", i + 1, per_kind.join(", "));
        slowest.push(all.quantile(1.0));
        let st = c
            .cmd()
            .args(["node", "start", &VICTIM.to_string()])
            .stdout(Stdio::null())
            .status()?;
        if !st.success() {
            bail!("clan node start {VICTIM} failed");
        }
    }
    r.latency(g, &base, &Samples(vec![dead_after]), None);
    let w = WAITERS.len() * (VICTIM as usize - 1);
    r.latency(
        g,
        &format!("node crash -> all {w} waiting parents told (last)"),
        &slowest,
        Some(&base),
    );
    for (k, (_, name)) in WAITERS.iter().enumerate() {
        r.latency(
            g,
            &format!("node crash -> {name}"),
            &by_kind[k],
            Some(&base),
        );
    }
    Ok(())
}

/// A thread that waits for process `pid` to end (through a pidfd, so a zombie counts) and
/// returns when it did; `None` when no pidfd could be had.
fn watch_death(pid: i32, limit: Duration) -> Option<std::thread::JoinHandle<Option<Instant>>> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: pidfd_open takes a pid and flags, no pointers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    Some(std::thread::spawn(move || {
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: p is a live pollfd, and the count is 1.
        let n = unsafe { libc::poll(&mut p, 1, limit.as_millis() as i32) };
        (n == 1).then(Instant::now)
    }))
}

/// Runs `sleep 1000` on the victim attached, says when it started, and returns how its
/// session reports its end, as a shell status (a process lost counts as killed by SIGKILL,
/// as the CLI shows it).
async fn session_told(
    client: &clan_client::Client,
    ready: mpsc::Sender<()>,
) -> anyhow::Result<i32> {
    use clan_client::pb::{session_output::Output, SessionOutput};
    let spec = RunSpec::command(["sleep", "1000"]).node(VICTIM);
    let (_, mut rd, _wr) = client.run(spec.attached()).await?.split();
    let _ = ready.send(());
    loop {
        match rd.next().await? {
            Some(SessionOutput {
                output: Some(Output::Exited(st)),
                ..
            }) => return Ok(clan_core::WaitStatus::from(st).shell_code()),
            Some(SessionOutput {
                output: Some(Output::Lost(_)),
                ..
            }) => return Ok(128 + libc::SIGKILL),
            Some(_) => {}
            None => bail!("session closed"),
        }
    }
}

/// One crash of the victim with every kind of waiter on every other node: the time from the
/// start of `clan node crash` (its cgroup.kill follows within milliseconds) until each was
/// told. The caller starts the victim again.
fn crash_once(
    c: &Cluster,
    cfg: &clan_core::ClusterConfig,
    dead_after: Duration,
) -> anyhow::Result<Vec<(Duration, Waiter)>> {
    let (tx, rx) = mpsc::channel::<Told>();
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    let mut round = Round::default();
    let limit = dead_after * 3 + Duration::from_secs(10);
    let victim = VICTIM.to_string();
    let rt = rt1();
    for node in 1..VICTIM {
        let children = rt.block_on(async {
            let mut v = Vec::new();
            for _ in 0..2 {
                let spec = RunSpec::command(["sleep", "1000"]).node(VICTIM);
                let s = c.client(node).spawn(spec).await?;
                v.push(*s.gpids.first().context("nothing started")?);
            }
            anyhow::Ok(v)
        })?;
        // The client library's wait and attached run, on threads with a runtime (and a
        // client) of their own.
        let (client, child, tx2) = (c.client(node), children[0], tx.clone());
        round.threads.push((
            None,
            std::thread::spawn(move || {
                let (res, at) = rt1().block_on(async {
                    let res = tokio::time::timeout(limit, client.wait_one(child)).await;
                    (res, Instant::now())
                });
                let code = match res {
                    Ok(Ok(st)) => Ok(st.shell_code()),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err("not told".into()),
                };
                let kind = Waiter::Wait;
                let _ = tx2.send(Told {
                    kind,
                    node,
                    code,
                    at,
                });
            }),
        ));
        let (client, tx2, ready) = (c.client(node), tx.clone(), ready_tx.clone());
        round.threads.push((
            None,
            std::thread::spawn(move || {
                let (res, at) = rt1().block_on(async {
                    let res = tokio::time::timeout(limit, session_told(&client, ready)).await;
                    (res, Instant::now())
                });
                let code = match res {
                    Ok(Ok(code)) => Ok(code),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err("not told".into()),
                };
                let kind = Waiter::Session;
                let _ = tx2.send(Told {
                    kind,
                    node,
                    code,
                    at,
                });
            }),
        ));
        // `clan wait` and the stub of an attached `clan run`, both from this node.
        let from = node.to_string();
        let child = children[1].to_string();
        for (kind, args) in [
            (Waiter::CliWait, vec!["--from", &from, "wait", &child]),
            (
                Waiter::Stub,
                vec![
                    "--from", &from, "run", "--node", &victim, "--", "sleep", "1000",
                ],
            ),
        ] {
            let mut p = c
                .cmd()
                .args(&args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?;
            let pid = p.id() as i32;
            let tx2 = tx.clone();
            let t = std::thread::spawn(move || {
                let st = p.wait();
                let at = Instant::now();
                // As a shell shows it: `clan run` ends the way the remote process ended,
                // so a stub is killed by SIGKILL itself (137).
                let code = match st {
                    Ok(st) => st
                        .code()
                        .or(st.signal().map(|s| 128 + s))
                        .ok_or_else(|| format!("{st}")),
                    Err(e) => Err(e.to_string()),
                };
                let _ = tx2.send(Told {
                    kind,
                    node,
                    code,
                    at,
                });
            });
            round.threads.push((Some(pid), t));
        }
    }
    drop(tx);
    drop(ready_tx);
    for _ in 1..VICTIM {
        ready_rx
            .recv_timeout(limit)
            .context("an attached run did not start")?;
    }
    // Let every wait and stub settle in; none may have ended yet.
    std::thread::sleep(Duration::from_millis(500));
    if let Ok(t) = rx.try_recv() {
        bail!(
            "{:?} on node {} ended before the crash: {:?}",
            t.kind,
            t.node,
            t.code
        );
    }
    let victim_id = clan_core::NodeId::new(VICTIM).context("node id")?;
    let cland = std::fs::read_to_string(cfg.state_dir(victim_id).join("cland.pid"))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok());
    let watch = cland.and_then(|p| watch_death(p, limit));
    let t0 = Instant::now();
    let st = c
        .cmd()
        .args(["node", "crash", &victim])
        .stdout(Stdio::null())
        .status()?;
    let crash_took = t0.elapsed();
    if !st.success() {
        bail!("clan node crash {VICTIM} failed");
    }
    // Only to show that the power cut lands within milliseconds of the command's start
    // (which is the reference: sockets close before the cland's exit is complete).
    match watch.and_then(|w| w.join().ok().flatten()) {
        Some(d) => println!(
            "  node {VICTIM}'s cland died {} after `clan node crash` started (which took {})",
            fmt(d.saturating_duration_since(t0)),
            fmt(crash_took)
        ),
        None => println!("  (could not watch node {VICTIM}'s cland)"),
    }
    let want = WAITERS.len() * (VICTIM as usize - 1);
    let mut told = Vec::new();
    while told.len() < want {
        let t = rx
            .recv_timeout(limit)
            .with_context(|| format!("only {} of {want} waiters told", told.len()))?;
        match t.code {
            Ok(137) => told.push((t.at.saturating_duration_since(t0), t.kind)),
            other => bail!(
                "{:?} on node {}: told {other:?}, not SIGKILL",
                t.kind,
                t.node
            ),
        }
    }
    Ok(told)
}
