//! clan's figures (issue 2): remote exec latency, remote signal latency, cluster-wide ps,
//! and request throughput with concurrent clients against the one-big-lock build.

use crate::baselines::{self, wait_signals};
use crate::cluster::Cluster;
use crate::placement::{Pins, Placement};
use crate::report::Report;
use crate::stats::Samples;
use clan_client::{pb, Client, RunSpec};
use clan_core::Gpid;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A single-threaded runtime, as a client program (and the `clan` CLI) would use: the
/// thread that waits for a reply also drives the socket, with no wakeup across threads.
pub fn rt1() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// `clan run --node 2 true` from node 1, through the CLI and through the client library,
/// against a local `sh -c true` and Slurm's `srun -N1 true`; the commands' stdin is
/// /dev/null for all three, as in a batch script. The four are measured in
/// [`RUN_TURNS`] turns, so that each sees the same phases of a shared machine (whose
/// process starts vary by half within minutes).
pub fn run_latency(c: &Cluster, r: &mut Report, n: usize) {
    let g = "remote exec";
    println!("{g} (in {RUN_TURNS} turns):");
    let mut have_srun = match baselines::slurm_ready() {
        Ok(()) => true,
        Err(why) => {
            println!("  slurm srun -N1 true: skipped: {why}");
            false
        }
    };
    let clan_run = || {
        let t = Instant::now();
        let st = c
            .cmd()
            .args(["--from", "1", "run", "--node", "2", "--", "true"])
            .stdin(Stdio::null())
            .status()
            .expect("clan run");
        assert!(st.success());
        t.elapsed()
    };
    let client = c.client(1);
    let runtime = rt();
    let library_run = || {
        runtime.block_on(async {
            let t = Instant::now();
            let sess = client
                .run(RunSpec::command(["true"]).node(2).attached())
                .await
                .expect("run");
            let (started, mut rd, mut wr) = sess.split();
            let gpid = started.gpids[0];
            loop {
                match rd.next().await.expect("session") {
                    Some(pb::SessionOutput {
                        output: Some(pb::session_output::Output::Exited(_)),
                        ..
                    }) => break,
                    Some(_) => {}
                    None => panic!("session closed"),
                }
            }
            let d = t.elapsed();
            let _ = wr.send(gpid, pb::session_input::Input::Release(true)).await;
            d
        })
    };
    let per = n.div_ceil(RUN_TURNS);
    let srun_per = n.min(50).div_ceil(RUN_TURNS);
    let [mut sh, mut srun, mut cli, mut lib] = std::array::from_fn(|_| Samples::default());
    for _ in 0..RUN_TURNS {
        baselines::spawn_sh_true_into(per, &mut sh);
        if have_srun {
            for _ in 0..srun_per {
                match baselines::srun_once() {
                    Ok(d) => srun.push(d),
                    Err(why) => {
                        println!("  slurm srun -N1 true: failed ({why}): no Slurm rows");
                        have_srun = false;
                        break;
                    }
                }
            }
        }
        for _ in 0..per {
            cli.push(clan_run());
        }
        for _ in 0..per {
            lib.push(library_run());
        }
    }
    let local = "local sh -c true (fork/exec/wait)";
    r.latency(g, local, &sh, None);
    if have_srun {
        r.latency(g, "slurm srun -N1 true", &srun, None);
    }
    r.latency(
        g,
        "clan run --node 2 true (CLI, from node 1)",
        &cli,
        Some(local),
    );
    if have_srun {
        r.latency(
            g,
            "clan run --node 2 true (CLI) vs srun",
            &cli,
            Some("slurm srun -N1 true"),
        );
        // Issue 2's figure the way round it is stated ("at least 10x faster than srun").
        let times = srun.median().as_secs_f64() / cli.median().as_secs_f64().max(1e-9);
        let said = format!(
            "srun -N1 true takes {times:.2}x as long as clan run --node 2 true (CLI), medians"
        );
        println!("  {said}");
        r.note(&said);
    }
    // As a user types commands: each run after a quiet second, when the CPUs have halted
    // and the kernel's per-operation state (RCU, cgroup locks, caches) has gone idle; clan
    // and srun in turns.
    let spaced = (n / 10).clamp(3, 10);
    let (mut cs, mut ss) = (Samples::default(), Samples::default());
    for _ in 0..spaced {
        std::thread::sleep(QUIET);
        cs.push(clan_run());
        if have_srun {
            std::thread::sleep(QUIET);
            if let Ok(d) = baselines::srun_once() {
                ss.push(d);
            }
        }
    }
    let srun_spaced = "slurm srun -N1 true, after a quiet second";
    if !ss.0.is_empty() {
        r.latency(g, srun_spaced, &ss, None);
    }
    r.latency(
        g,
        "clan run --node 2 true (CLI), after a quiet second",
        &cs,
        (!ss.0.is_empty()).then_some(srun_spaced),
    );
    r.latency(
        g,
        "clan run on node 2 (client library, from node 1)",
        &lib,
        Some(local),
    );
}

/// Turns the remote exec figures and their baselines are measured in.
const RUN_TURNS: usize = 10;

/// The pause before each run of the "after a quiet second" rows.
const QUIET: Duration = Duration::from_secs(1);

/// Blocks the ping-pong and its TCP baseline are split into (see `sigping`).
const SIGNAL_TURNS: usize = 10;

/// Two processes on nodes 1 and 2 bouncing SIGUSR1 through clan (Solaris MC Table 4). The
/// pinging process measures the TCP loopback round trip itself, in turns with its pings,
/// so that both see the same moments of a shared machine.
pub fn signal_latency(c: &Cluster, r: &mut Report, n: usize) {
    println!("signals (clan and TCP in {SIGNAL_TURNS} turns):");
    for place in Placement::all() {
        signal_latency_in(c, r, n, place);
    }
}

/// [`signal_latency`] with its processes (and the TCP baselines' echo) placed as `place`
/// says: node 1's cland and the pinging process on node 1's side, node 2's cland and the
/// answering process on node 2's side.
fn signal_latency_in(c: &Cluster, r: &mut Report, n: usize, place: Placement) {
    let g = &format!("signals ({})", place.label());
    let exe = std::env::current_exe().expect("self");
    let exe = exe.to_str().expect("utf-8 path");
    let peer_file = c.dir.join("ping.peer");
    let out_file = c.dir.join("ping.out");
    let _ = std::fs::remove_file(&peer_file);
    let iters = n * 10;
    let iters = iters.to_string();
    let mut argv = vec![
        exe,
        "sigping",
        "--peer-file",
        peer_file.to_str().unwrap(),
        "--out",
        out_file.to_str().unwrap(),
        "--iters",
        &iters,
    ];
    let far = place.sides().map(|(_, far)| far.to_string());
    if let Some(far) = &far {
        argv.extend(["--echo-cpu", far]);
    }
    let ping = c.spawn(1, &argv).expect("ping");
    let pong = c
        .spawn(2, &[exe, "sigpong", "--peer", &ping.to_string()])
        .expect("pong");
    let mut pins = Pins::default();
    if let Some((near, far)) = place.sides() {
        for (pid, cpu) in [
            (c.cland_pid(1), near),
            (c.host_pid(ping).map(|p| p as i32), near),
            (c.cland_pid(2), far),
            (c.host_pid(pong).map(|p| p as i32), far),
        ] {
            pins.process(pid.expect("a process to place"), cpu);
        }
    }
    // The pinging process starts once it has its peer: placed by then.
    std::fs::write(&peer_file, pong.to_string()).expect("peer file");
    let st = c
        .cmd()
        .args(["wait", &ping.to_string()])
        .stdout(Stdio::null())
        .status()
        .expect("wait");
    drop(pins);
    let _ = c.cmd().args(["kill", &pong.to_string()]).status();
    let _ = c
        .cmd()
        .args(["wait", &pong.to_string()])
        .stdout(Stdio::null())
        .status();
    assert!(st.success(), "sigping failed; see clan logs {ping}");
    let text = std::fs::read_to_string(&out_file).expect("ping results");
    let series = |kind: &str| {
        Samples(
            text.lines()
                .filter_map(|l| l.strip_prefix(kind)?.parse::<u64>().ok())
                .map(Duration::from_nanos)
                .collect(),
        )
    };
    let (s, relayed, tcp, tcp_procs) = (series("s "), series("r "), series("t "), series("p "));
    r.latency(g, baselines::TCP_RTT, &tcp, None);
    r.latency(
        g,
        baselines::TCP_PROCS,
        &tcp_procs,
        Some(baselines::TCP_RTT),
    );
    if place == Placement::Free {
        r.latency(
            g,
            "local kill(2) ping-pong, one way",
            &baselines::kill_pingpong(n * 10),
            Some(baselines::TCP_RTT),
        );
    }
    r.latency(
        g,
        "clan kill ping-pong node 1 <-> node 2, one way",
        &s,
        Some(baselines::TCP_RTT),
    );
    r.latency(
        g,
        "  the same against the round trip between two processes",
        &s,
        Some(baselines::TCP_PROCS),
    );
    r.latency(
        g,
        "  (for reference) relayed by the clands (no links)",
        &relayed,
        Some(baselines::TCP_RTT),
    );
}

/// The `sigping` role: times `iters` round trips of a signal with its peer through clan on
/// the client's direct link to the peer's node (SIGUSR1, lines `s NANOS`, half a round
/// trip each), as many relayed by the two nodes' clands (SIGUSR2, the clients without
/// links, lines `r NANOS`), and as many TCP loopback round trips (`t NANOS`, `p NANOS`), in
/// [`SIGNAL_TURNS`] turns of each.
pub fn sigping(
    peer_file: &Path,
    out: &Path,
    iters: usize,
    echo_cpu: Option<usize>,
) -> anyhow::Result<()> {
    let peer: Gpid = loop {
        if let Ok(s) = std::fs::read_to_string(peer_file) {
            if let Ok(g) = s.trim().parse() {
                break g;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let linked = Client::locate(None, None)?;
    let relayed = Client::locate(None, None)?.without_links();
    let mut lines = String::new();
    let mut tcp = baselines::TcpPair::new();
    let mut tcp_procs = baselines::TcpPair::with_process();
    let mut pins = Pins::default();
    if let Some(cpu) = echo_cpu {
        pins.echo(tcp.echo(), cpu);
        pins.echo(tcp_procs.echo(), cpu);
    }
    let per = iters.div_ceil(SIGNAL_TURNS);
    rt1().block_on(async {
        // Warm: connections, and the link to the peer's node (both roles').
        for _ in 0..20 {
            bounce(&linked, peer, libc::SIGUSR1).await?;
            bounce(&relayed, peer, libc::SIGUSR2).await?;
        }
        for turn in 0..SIGNAL_TURNS {
            let n = per.min(iters.saturating_sub(turn * per));
            for (kind, pair) in [("t", &mut tcp), ("p", &mut tcp_procs)] {
                let mut s = Samples::default();
                pair.sample(n, &mut s);
                for d in s.0 {
                    lines.push_str(&format!("{kind} {}\n", d.as_nanos()));
                }
            }
            for (kind, client, sig) in [
                ("s", &linked, libc::SIGUSR1),
                ("r", &relayed, libc::SIGUSR2),
            ] {
                for _ in 0..n {
                    let d = bounce(client, peer, sig).await?;
                    lines.push_str(&format!("{kind} {}\n", d.as_nanos()));
                }
            }
        }
        Ok::<_, anyhow::Error>(())
    })?;
    std::fs::write(out, lines)?;
    Ok(())
}

/// One signal `sig` to `peer` through `client` and the answer: half the round trip.
async fn bounce(client: &Client, peer: Gpid, sig: i32) -> anyhow::Result<Duration> {
    let t = Instant::now();
    client.kill_one(peer, sig).await?;
    match wait_signals(&[libc::SIGUSR1, libc::SIGUSR2], Duration::from_secs(10)) {
        Some((s, _)) if s == sig => Ok(t.elapsed() / 2),
        Some((s, _)) => anyhow::bail!("answered with signal {s}, not {sig}"),
        None => anyhow::bail!("no answer from {peer}"),
    }
}

/// The `sigpong` role: answers every SIGUSR1 with one to `peer` on its direct link, and
/// every SIGUSR2 with one relayed by the clands (see [`sigping`]).
pub fn sigpong(peer: Gpid) -> anyhow::Result<()> {
    let linked = Client::locate(None, None)?;
    let relayed = Client::locate(None, None)?.without_links();
    rt1().block_on(async {
        while let Some((sig, _)) =
            wait_signals(&[libc::SIGUSR1, libc::SIGUSR2], Duration::from_secs(30))
        {
            let client = if sig == libc::SIGUSR1 {
                &linked
            } else {
                &relayed
            };
            client.kill_one(peer, sig).await?;
        }
        Ok(())
    })
}

/// `clan ps` over 4 nodes x `per_node` processes against `ps -e` of the same processes.
pub fn ps_scale(c: &Cluster, r: &mut Report, per_node: usize, n: usize) {
    let g = "cluster ps";
    println!("{g} ({} nodes x {per_node} processes):", c.nodes);
    let parents = c.sleepers(per_node, 3600);
    let want = c.nodes as usize * per_node;
    // The sleeps of our shells (each shell leads the group of its sleeps).
    let groups: Vec<u64> = parents.iter().map(|p| p.raw()).collect();
    let sleepers = || {
        let out = c.cmd().args(["ps", "-o", "json"]).output().expect("ps");
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .ok()
            .and_then(|v| {
                v.as_array().map(|a| {
                    a.iter()
                        .filter(|p| {
                            p["cmd"] == "sleep 3600"
                                && p["pgid"].as_u64().is_some_and(|g| groups.contains(&g))
                        })
                        .cloned()
                        .collect::<Vec<_>>()
                })
            })
            .unwrap_or_default()
    };
    let count = || sleepers().len();
    let deadline = Instant::now() + Duration::from_secs(120);
    while count() < want {
        assert!(Instant::now() < deadline, "sleepers did not start");
        std::thread::sleep(Duration::from_millis(200));
    }
    r.latency(
        g,
        "ps -e (native, same processes)",
        &baselines::ps_e(n),
        None,
    );
    let mut s = Samples::default();
    for _ in 0..n {
        let t = Instant::now();
        let st = c
            .cmd()
            .arg("ps")
            .stdout(Stdio::null())
            .status()
            .expect("clan ps");
        s.push(t.elapsed());
        assert!(st.success());
    }
    r.latency(
        g,
        "clan ps (CLI, all nodes)",
        &s,
        Some("ps -e (native, same processes)"),
    );
    let client = c.client(1);
    let mut s = Samples::default();
    rt().block_on(async {
        for _ in 0..n {
            let t = Instant::now();
            let ps = client.ps(pb::PsFilter::default(), &[]).await.expect("ps");
            s.push(t.elapsed());
            assert!(ps.iter().map(|n| n.procs.len()).sum::<usize>() >= want);
        }
    });
    r.latency(
        g,
        "clan ps (client library, all nodes)",
        &s,
        Some("ps -e (native, same processes)"),
    );
    // The whole group of each shell: its sleeps too, so later measurements on this cluster
    // do not run beside 4,000 leftover processes.
    for p in parents {
        c.kill_and_wait(p, true);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut left = count();
    while left > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        left = count();
    }
    if left > 0 {
        let some: Vec<String> = sleepers().iter().take(5).map(|p| p.to_string()).collect();
        println!(
            "  ({left} sleepers still there after the kill: {})",
            some.join(" ")
        );
    }
}

/// Requests per second with `k` concurrent clients for `secs`, each on its own connection:
/// `kill -0` of a process on node 2 and a one-process `ps`, both sent to node 1.
pub fn throughput(c: &Cluster, target: Gpid, k: usize, secs: f64) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    rt().block_on(async {
        let stop = Instant::now() + Duration::from_secs_f64(secs);
        let mut tasks = Vec::new();
        for i in 0..k {
            let (client, done) = (c.client(1), done.clone());
            tasks.push(tokio::spawn(async move {
                let filter = pb::PsFilter {
                    gpids: vec![target.raw()],
                    ..Default::default()
                };
                let mut n = 0u64;
                while Instant::now() < stop {
                    if (n + i as u64).is_multiple_of(2) {
                        client.kill_one(target, 0).await.expect("kill -0");
                    } else {
                        client
                            .ps(filter.clone(), &[target.node()])
                            .await
                            .expect("ps");
                    }
                    n += 1;
                }
                done.fetch_add(n, Ordering::Relaxed);
            }));
        }
        for t in tasks {
            t.await.expect("client task");
        }
    });
    done.load(Ordering::Relaxed) as f64 / secs
}

pub fn throughput_rows(fine: &Cluster, giant: Option<&Cluster>, r: &mut Report, secs: f64) {
    let g = "requests/s";
    println!("{g} (kill -0 and one-process ps to node 2 through node 1):");
    let t_fine = fine.spawn(2, &["sleep", "3600"]).expect("target");
    let t_giant = giant.map(|g| g.spawn(2, &["sleep", "3600"]).expect("target"));
    for k in [1usize, 2, 5, 10] {
        let base = format!("one big lock, {k} clients");
        if let (Some(gc), Some(t)) = (giant, t_giant) {
            r.rate(g, &base, throughput(gc, t, k, secs), k, None);
        }
        let rate = throughput(fine, t_fine, k, secs);
        r.rate(
            g,
            &format!("named locks, {k} clients"),
            rate,
            k,
            giant.map(|_| base.as_str()),
        );
    }
    for (c, t) in [(Some(fine), Some(t_fine)), (giant, t_giant)] {
        if let (Some(c), Some(t)) = (c, t) {
            c.kill_and_wait(t, false);
        }
    }
}
