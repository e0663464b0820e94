//! The cluster /proc's figures (issue 5): reading `status` of a process of another node
//! through the API and through the mount against a native /proc read and the TCP loopback
//! round trip (Solaris MC Table 4), and `ps aux` in `clan shell` over 4 nodes x N processes
//! against a native `ps aux` of the same processes.

use crate::baselines;
use crate::cluster::Cluster;
use crate::placement::{self, Pins, Placement};
use crate::report::Report;
use crate::stats::Samples;
use clan_client::pb;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// One whole read of a /proc file, as `cat` does it (open, read to the end, close).
fn read_whole(path: &Path) -> usize {
    let mut f = std::fs::File::open(path).expect("open");
    let mut buf = Vec::with_capacity(2048);
    f.read_to_end(&mut buf).expect("read");
    buf.len()
}

/// Blocks each measurement is split into: the four series take turns, so that each sees
/// the same moments of a shared, noisy machine.
const TURNS: usize = 10;

/// `status` of a process on node 2, read from node 1's side: natively, through the API and
/// through the mount, with the TCP loopback round trip, in [`TURNS`] turns.
pub fn status_read(c: &Cluster, r: &mut Report, n: usize) {
    let g = "cluster /proc: status of a process on another node";
    println!("{g} (in {TURNS} turns):");
    let target = c.spawn(2, &["sleep", "3700"]).expect("a process on node 2");
    let near = c.spawn(1, &["sleep", "3700"]).expect("a process on node 1");
    let host = c.host_pid(target).expect("its host pid");
    let native = PathBuf::from(format!("/proc/{host}/status"));
    // The view served on /dev/fuse, and (where the kernel has it, clan proc mount's
    // default once scripts/install-deps.sh turned its switch on) over io_uring.
    let mnt = c.dir.join("bench-proc");
    mount_view(c, &mnt, false);
    let file = mnt.join(format!("{target}/status"));
    read_whole(&file);
    let ring_mnt = c.dir.join("bench-proc-uring");
    let ring_file = mount_view(c, &ring_mnt, true)
        .then(|| {
            let f = ring_mnt.join(format!("{target}/status"));
            read_whole(&f);
            f
        })
        .filter(|_| served_over_io_uring(&ring_mnt));
    let client = c.client(1);
    let rt = crate::clan::rt1();
    let req = pb::ProcRequest {
        op: pb::ProcOp::ProcRead as i32,
        gpid: target.raw(),
        path: "status".into(),
        ..Default::default()
    };
    // Enough to connect and to open the client's direct link to node 2 (docs/links.md).
    for _ in 0..=clan_client::LINK_AFTER {
        rt.block_on(client.proc(req.clone())).expect("proc read");
    }
    let near_req = pb::ProcRequest {
        gpid: near.raw(),
        ..req.clone()
    };
    let mut tcp = baselines::TcpPair::new();
    let mut tcp_procs = baselines::TcpPair::with_process();
    let relayed = c.client(1).without_links();
    rt.block_on(relayed.proc(req.clone())).expect("proc read");
    let mount_daemons: Vec<i32> = [&mnt, &ring_mnt]
        .iter()
        .flat_map(|m| placement::processes_of("clan-procfs", m.to_str().expect("utf-8")))
        .collect();
    for place in Placement::all() {
        let mut pins = Pins::default();
        if let Some((near_cpu, far_cpu)) = place.sides() {
            pins.process(std::process::id() as i32, near_cpu);
            for &pid in &mount_daemons {
                pins.process(pid, near_cpu);
            }
            if let Some(pid) = c.cland_pid(1) {
                pins.process(pid, near_cpu);
            }
            if let Some(pid) = c.cland_pid(2) {
                pins.process(pid, far_cpu);
            }
            pins.process(host as i32, far_cpu);
            pins.echo(tcp.echo(), far_cpu);
            pins.echo(tcp_procs.echo(), far_cpu);
        }
        let (mut rtt, mut rtt_procs, mut nat, mut api, mut through, mut api_near, mut api_relayed): (
            Samples,
            Samples,
            Samples,
            Samples,
            Samples,
            Samples,
            Samples,
        ) = Default::default();
        let mut through_ring = Samples::default();
        let per = n.div_ceil(TURNS);
        for _ in 0..TURNS {
            tcp.sample(per, &mut rtt);
            tcp_procs.sample(per, &mut rtt_procs);
            nat_block(per, &native, &mut nat);
            rt.block_on(async {
                for _ in 0..per {
                    let t = Instant::now();
                    let reply = client.proc(req.clone()).await.expect("proc read");
                    api.push(t.elapsed());
                    assert!(!reply.data.is_empty());
                }
                for _ in 0..per {
                    let t = Instant::now();
                    let reply = relayed.proc(req.clone()).await.expect("proc read");
                    api_relayed.push(t.elapsed());
                    assert!(!reply.data.is_empty());
                }
                for _ in 0..per {
                    let t = Instant::now();
                    let reply = client.proc(near_req.clone()).await.expect("proc read");
                    api_near.push(t.elapsed());
                    assert!(!reply.data.is_empty());
                }
            });
            nat_block(per, &file, &mut through);
            if let Some(f) = &ring_file {
                nat_block(per, f, &mut through_ring);
            }
        }
        drop(pins);
        let g = &format!("{g} ({})", place.label());
        println!(" {}:", place.label());
        let tcp_name = baselines::TCP_RTT;
        let native_name = "native read of /proc/PID/status";
        r.latency(g, tcp_name, &rtt, None);
        r.latency(g, baselines::TCP_PROCS, &rtt_procs, Some(tcp_name));
        r.latency(g, native_name, &nat, None);
        r.latency(
            g,
            "through the API (client library, node 1)",
            &api,
            Some(tcp_name),
        );
        r.latency(
            g,
            "  the same against the round trip between two processes",
            &api,
            Some(baselines::TCP_PROCS),
        );
        r.latency(
            g,
            "  (for reference) the same relayed by node 1's cland (no link)",
            &api_relayed,
            Some(tcp_name),
        );
        r.latency(
            g,
            "  (for reference) the API read of a process of node 1 itself",
            &api_near,
            Some(tcp_name),
        );
        if ring_file.is_some() {
            r.latency(
                g,
                "through the mount over io_uring (clan proc mount's default, node 1)",
                &through_ring,
                Some(native_name),
            );
        }
        r.latency(
            g,
            "through the mount on /dev/fuse (node 1)",
            &through,
            Some(native_name),
        );
    }
    drop(tcp);
    drop(tcp_procs);
    for m in [&mnt, &ring_mnt] {
        let _ = c
            .cmd()
            .args(["proc", "umount"])
            .arg(m)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    c.kill_and_wait(target, false);
    c.kill_and_wait(near, false);
}

/// The kernel's switch for FUSE over io_uring (Linux 6.14 and later).
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Mounts the cluster /proc at `mnt`, served on /dev/fuse or, with `ring`, over io_uring:
/// the kernel's switch is turned on for the mount's handshake (the only moment it is
/// read) and given back as it was. False (with a line saying why) when the kernel has no
/// FUSE over io_uring.
fn mount_view(c: &Cluster, mnt: &Path, ring: bool) -> bool {
    std::fs::create_dir_all(mnt).expect("mount point");
    let was = std::fs::read_to_string(ENABLE_URING).ok();
    if ring {
        if was.is_none() {
            println!("  (no FUSE over io_uring in this kernel: {ENABLE_URING} is missing)");
            return false;
        }
        if let Err(e) = std::fs::write(ENABLE_URING, "Y") {
            println!("  (FUSE over io_uring not measured: {ENABLE_URING}: {e})");
            return false;
        }
    }
    let st = c
        .cmd()
        .args(["proc", "mount"])
        .arg(mnt)
        .env("CLAN_PROC_URING_THREADS", if ring { "2" } else { "0" })
        .stdout(Stdio::null())
        .status()
        .expect("clan proc mount");
    if ring {
        let _ = std::fs::write(ENABLE_URING, was.as_deref().unwrap_or("N").trim());
    }
    assert!(st.success(), "clan proc mount failed");
    true
}

/// Whether the view at `mnt` serves over io_uring: its rings' threads are there (once a
/// read came back: the kernel holds every request until each queue has an entry).
fn served_over_io_uring(mnt: &Path) -> bool {
    let rings = placement::processes_of("clan-procfs", mnt.to_str().expect("utf-8"))
        .into_iter()
        .flat_map(placement::thread_names)
        .filter(|n| n.starts_with("fuser-ring"))
        .count();
    if rings == 0 {
        println!("  (the kernel did not offer FUSE over io_uring to the view: not measured)");
    }
    rings > 0
}

/// `n` whole reads of `path`, timed into `s`.
fn nat_block(n: usize, path: &Path, s: &mut Samples) {
    for _ in 0..n {
        let t = Instant::now();
        read_whole(path);
        s.push(t.elapsed());
    }
}

/// Times of `ps aux` runs as bash reports them (`TIMEFORMAT=%R`), from a script's stderr.
fn bash_times(stderr: &[u8]) -> Samples {
    let mut s = Samples::default();
    for l in String::from_utf8_lossy(stderr).lines() {
        if let Ok(secs) = l.trim().parse::<f64>() {
            s.push(Duration::from_secs_f64(secs));
        }
    }
    s
}

/// `ps aux` and `pstree -p` in a clan shell over every node's processes, against the same
/// tools run natively over the same processes (on a local cluster every node's processes
/// are on this machine).
pub fn ps_aux(c: &Cluster, r: &mut Report, per_node: usize, n: usize) {
    let g = "ps aux in clan shell";
    println!("{g} ({} nodes x {per_node} processes):", c.nodes);
    let parents = c.sleepers(per_node, 3701);
    let want = c.nodes as usize * per_node;
    // ps aux, and pstree -p (which also lists each process's `task/` and asks for its
    // namespaces), natively and in a clan shell on node 1.
    for (tool, grep) in [("ps aux", "sleep 370[1]"), ("pstree -p", "sleep([0-9]")] {
        let loop_script = format!(
            "TIMEFORMAT=%R; for i in $(seq {n}); do time {tool} >/dev/null; done; \
             echo listed $({tool} | grep -c '{grep}') >&2"
        );
        let base = format!("native {tool} (same processes)");
        let native = std::process::Command::new("bash")
            .args(["-c", &loop_script])
            .output()
            .expect("native run");
        r.latency(g, &base, &bash_times(&native.stderr), None);
        let shell = c
            .cmd()
            .args(["shell", "--node", "1", "--", "bash", "-c", &loop_script])
            .output()
            .expect("clan shell");
        let listed = String::from_utf8_lossy(&shell.stderr)
            .lines()
            .find_map(|l| l.strip_prefix("listed ")?.trim().parse::<usize>().ok())
            .unwrap_or(0);
        println!("  ({tool} in clan shell listed {listed} of the {want} sleeps)");
        r.latency(
            g,
            &format!("{tool} in clan shell ({} nodes)", c.nodes),
            &bash_times(&shell.stderr),
            Some(&base),
        );
    }
    for p in parents {
        c.kill_and_wait(p, true);
    }
}

/// `iters` reads of `file` of `gpid` through the client library (see `clan-bench
/// proc-loop`); prints their median.
pub fn proc_loop(
    gpid: clan_core::Gpid,
    file: &str,
    iters: usize,
    no_link: bool,
) -> anyhow::Result<()> {
    let mut client = clan_client::Client::locate(None, None)?;
    if no_link {
        client = client.without_links();
    }
    let req = pb::ProcRequest {
        op: pb::ProcOp::ProcRead as i32,
        gpid: gpid.raw(),
        path: file.into(),
        ..Default::default()
    };
    let rt = crate::clan::rt1();
    let mut s = Samples::default();
    rt.block_on(async {
        for _ in 0..iters {
            let t = Instant::now();
            client.proc(req.clone()).await?;
            s.push(t.elapsed());
        }
        anyhow::Ok(())
    })?;
    println!("{iters} reads of {gpid}/{file}: median {:?}", s.median());
    Ok(())
}
