//! clan's figures for jobs and tasks (issue 4): the context switch between two tasks of a
//! node (suspend one, resume the other, both verified) for trees of 3 to 1,023 processes,
//! idle and busy, by the freezer and by signals, against a bare cgroup v2 freeze + thaw of
//! the same trees; Slurm's `scontrol suspend` / `resume`; and what following every fork of
//! the machine for the genealogy costs a fork-heavy program.
//!
//! It runs on a one-node cluster of its own, started after the cost of forking has been
//! measured with no cland of this run on the machine: one cland per machine, as in a real
//! deployment (every cland of a local cluster follows every fork of the host).

use crate::clan::rt1;
use crate::cluster::{cpu_time, Cluster};
use crate::report::Report;
use crate::stats::{fmt, Samples};
use anyhow::{bail, Context};
use clan_client::{pb, Client, RunSpec};
use clan_core::{Gpid, NodeId};
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Tree sizes: complete binary trees of 2, 3, 4, 6, 8 and 10 levels.
const SIZES: [usize; 6] = [3, 7, 15, 63, 255, 1023];

/// The node the tasks run on (the cluster's only one).
const NODE: u32 = 1;

/// Each series is measured in this many blocks, the floor's and clan's taking turns, so that
/// the machine's drift over a configuration touches all of them alike.
const ROUNDS: usize = 3;

/// The most time one series (one method, one tree shape) may take; it stops early, after at
/// least [`MIN_PER_BLOCK`] switches per block, once over.
const BUDGET: Duration = Duration::from_secs(20);
const MIN_PER_BLOCK: usize = 2;

/// How long a freeze, a thaw or a tree's start may take before the run is abandoned.
const LIMIT: Duration = Duration::from_secs(60);

/// The pause before each timed switch, as a scheduler's time slice would leave. The kernel
/// notifies a change of a `cgroup.events` at most once per DIV_ROUND_UP(HZ, 100) jiffies
/// (12 ms at HZ=250) and defers a later one to the end of that interval, so a task frozen
/// less than that after its thaw was notified is reported late; the back-to-back floor row
/// shows that effect, the other rows leave it out.
const PACE: Duration = Duration::from_millis(20);

/// Rounds of the fork-rate measurement (each condition once per round, in turn).
const FORK_ROUNDS: usize = 5;

/// The Slurm comparison: tree size, switches per series, and the pause before each switch
/// of the paced series (longer than the 2 s slurmstepd waits between SIGTSTP and SIGSTOP,
/// during which it does not act on a resume of the same job).
const SLURM_PROCS: usize = 15;
const SLURM_SWITCHES: usize = 4;
const SLURM_PACE: Duration = Duration::from_secs(3);

const FREEZE: &str = "freeze";
const SIGNALS: &str = "signals";

/// Switches timed for a tree of `procs` processes, out of `n` for the small ones.
fn iterations(n: usize, procs: usize) -> usize {
    let k = match procs {
        0..=15 => n,
        16..=63 => n / 2,
        64..=255 => n / 4,
        _ => n / 10,
    };
    k.max(ROUNDS * MIN_PER_BLOCK)
}

fn shape(procs: usize, busy: bool) -> String {
    format!("{procs} {}", if busy { "busy" } else { "idle" })
}

/// Everything of issue 4, in one invocation: the fork rate first (before and after this
/// run's cland is up), then the switches, then Slurm.
pub fn jobs(
    bin: &Path,
    r: &mut Report,
    n: usize,
    base_port: u16,
    sizes: &[usize],
) -> anyhow::Result<()> {
    if let Some(bad) = sizes.iter().find(|s| !SIZES.contains(s)) {
        anyhow::bail!("no tree of {bad} processes (sizes: {SIZES:?})");
    }
    let exe = std::env::current_exe()?;
    let forks = 50 * n;
    let before = fork_rounds_host(&exe, forks)?;
    let c = Cluster::up(bin, "jobs", 1, base_port)?;
    genealogy(&c, &exe, forks, &before, r)?;
    let mut clan_15 = Vec::new();
    let mut summary = Vec::new();
    for busy in [false, true] {
        for procs in SIZES
            .into_iter()
            .filter(|s| sizes.is_empty() || sizes.contains(s))
        {
            let row = switch_config(&c, &exe, r, procs, busy, iterations(n, procs))?;
            if procs == SLURM_PROCS {
                clan_15.push((busy, row.freeze.clone()));
            }
            summary.push(row);
        }
    }
    let table = summary_table(&summary);
    println!("job switch summary (medians):\n{table}");
    r.note(&format!("Job switch, medians:\n\n{table}"));
    drop(c);
    match crate::baselines::slurm_ready() {
        Ok(()) => slurm(&exe, r, &clan_15)?,
        Err(why) => println!("slurm scontrol suspend/resume: skipped: {why}"),
    }
    Ok(())
}

// ---------------------------------------------------------------- the trees

/// The `tree` role: this process and its descendants become a complete binary tree of
/// `procs` processes (2^k - 1), each of which then blocks in pause(2), or spins when
/// `busy`; with `ignore_tstp` they ignore SIGTSTP (as programs that handle it, or whose
/// process group is orphaned, do not stop on it). Never returns; the root stays for the
/// tree's life.
pub fn tree(procs: usize, busy: bool, ignore_tstp: bool) -> anyhow::Result<()> {
    let levels = (procs + 1).trailing_zeros();
    if procs == 0 || procs + 1 != 1 << levels {
        bail!("--procs {procs}: a complete binary tree has 2^k - 1 processes");
    }
    if ignore_tstp {
        // SAFETY: setting a signal's disposition to SIG_IGN has no preconditions.
        unsafe { libc::signal(libc::SIGTSTP, libc::SIG_IGN) };
    }
    // No process spins before the whole tree is there (spinners would starve the forks):
    // each reports on `done` once it has forked its children and waits for EOF on `gate`,
    // whose only writer, the root, closes it once every other process has reported.
    let (gate_r, gate_w) = nix::unistd::pipe()?;
    let (done_r, done_w) = nix::unistd::pipe()?;
    let (mut gate_w, mut done_r) = (Some(gate_w), Some(done_r));
    // Levels still to grow below this process.
    let mut below = levels - 1;
    'grow: while below > 0 {
        for _ in 0..2 {
            // SAFETY: this process is single-threaded (no runtime has started), so the child
            // is a full copy and may go on running Rust code.
            match unsafe { libc::fork() } {
                0 => {
                    // The root's ends, closed before this process forks in turn.
                    gate_w = None;
                    done_r = None;
                    below -= 1;
                    continue 'grow;
                }
                -1 => bail!("fork: {}", std::io::Error::last_os_error()),
                _ => {}
            }
        }
        break;
    }
    {
        use std::io::{Read, Write};
        match (gate_w, done_r) {
            (Some(gate_w), Some(done_r)) => {
                File::from(done_r).read_exact(&mut vec![0u8; procs - 1])?;
                drop(gate_w);
            }
            _ => {
                File::from(done_w).write_all(b".")?;
                let mut gate = File::from(gate_r);
                while gate.read(&mut [0u8; 1])? > 0 {}
            }
        }
    }
    loop {
        if busy {
            std::hint::spin_loop();
        } else {
            // SAFETY: pause has no preconditions; a signal's default action ends us.
            unsafe { libc::pause() };
        }
    }
}

fn tree_args(procs: usize, busy: bool) -> Vec<String> {
    let mut v = vec!["tree".to_string(), "--procs".into(), procs.to_string()];
    if busy {
        v.push("--busy".into());
    }
    v
}

/// Where cgroup v1 hierarchy `controller` is mounted, if it is.
fn v1_mount(controller: &str) -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let mut post = post.split_whitespace();
        if post.next()? != "cgroup" || !post.nth(1)?.split(',').any(|o| o == controller) {
            return None;
        }
        Some(PathBuf::from(pre.split_whitespace().nth(4)?))
    })
}

/// Makes `cmd`'s process, before it execs, a member of each cgroup of `dirs` and, with
/// `session`, the leader of a session of its own (as a shepherd makes clan's processes: a
/// scheduler autogroup of its own, not the benchmark's).
fn born_in(cmd: &mut Command, dirs: &[PathBuf], session: bool) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let files = dirs
        .iter()
        .map(|d| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(d.join("cgroup.procs"))
                .with_context(|| format!("open {}/cgroup.procs", d.display()))
        })
        .collect::<anyhow::Result<Vec<File>>>()?;
    // SAFETY: the closure only calls setsid(2) and write(2), async-signal-safe, on
    // descriptors it owns ("0": the writing process itself).
    unsafe {
        cmd.pre_exec(move || {
            if session && libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            for f in &files {
                if libc::write(f.as_raw_fd(), b"0".as_ptr().cast(), 1) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        })
    };
    Ok(())
}

// ---------------------------------------------------------------- the floor

/// Where cgroup v2 is mounted (on these machines the hybrid /sys/fs/cgroup/unified).
fn cgroup2_mount() -> anyhow::Result<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    info.lines()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            if post.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            Some(PathBuf::from(pre.split_whitespace().nth(4)?))
        })
        .context("no cgroup2 mount in /proc/self/mountinfo")
}

/// The value of `key` ("frozen", "populated") in the text of a `cgroup.events`.
fn event_value(text: &str, key: &str) -> Option<bool> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse::<u8>().ok())
        .map(|v| v == 1)
}

/// One cgroup of the floor, with its `cgroup.events` kept open: reading through the same
/// descriptor that is polled is what makes poll(2) report only changes after the read.
struct Cg {
    dir: PathBuf,
    events: File,
}

impl Cg {
    fn create(dir: PathBuf) -> anyhow::Result<Cg> {
        std::fs::create_dir(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
        let events = File::open(dir.join("cgroup.events"))?;
        Ok(Cg { dir, events })
    }

    fn event(&self, key: &str) -> anyhow::Result<Option<bool>> {
        let mut buf = [0u8; 256];
        let n = self.events.read_at(&mut buf, 0)?;
        Ok(event_value(&String::from_utf8_lossy(&buf[..n]), key))
    }

    /// Waits until `key` is `want`: woken by the kernel's notification (POLLPRI) with
    /// `Wait::Poll`, reading again at once with `Wait::Spin`.
    fn wait(&self, key: &str, want: bool, how: Wait) -> anyhow::Result<()> {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let deadline = Instant::now() + LIMIT;
        while self.event(key)? != Some(want) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!(
                    "{}: {key} is not {} after {LIMIT:?}",
                    self.dir.display(),
                    u8::from(want)
                );
            }
            if how == Wait::Poll {
                let mut fds = [PollFd::new(self.events.as_fd(), PollFlags::POLLPRI)];
                let ms = left.as_millis().min(u16::MAX as u128) as u16;
                poll(&mut fds, PollTimeout::from(ms))?;
            }
        }
        Ok(())
    }

    /// `cgroup.freeze` = 1 or 0, then wait until the kernel reports it done.
    fn freeze(&self, on: bool, how: Wait) -> anyhow::Result<()> {
        std::fs::write(self.dir.join("cgroup.freeze"), if on { "1" } else { "0" })?;
        self.wait("frozen", on, how)
    }

    fn procs(&self) -> usize {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }

    /// Starts a tree whose root is born in this cgroup, in a session of its own, and waits
    /// until it is complete.
    fn start_tree(
        &self,
        exe: &Path,
        procs: usize,
        busy: bool,
    ) -> anyhow::Result<std::process::Child> {
        let mut cmd = Command::new(exe);
        cmd.args(tree_args(procs, busy))
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        born_in(&mut cmd, std::slice::from_ref(&self.dir), true)?;
        let child = cmd.spawn()?;
        let deadline = Instant::now() + LIMIT;
        while self.procs() < procs {
            if Instant::now() > deadline {
                bail!(
                    "{}: tree of {procs} not complete after {LIMIT:?}",
                    self.dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(child)
    }
}

/// How a block of the floor's switches runs.
#[derive(Clone, Copy, Debug)]
struct FloorMode {
    /// How each freeze and thaw is waited for.
    how: Wait,
    /// Each switch followed by [`PACE`], as a gang scheduler's switches are apart.
    paced: bool,
    /// The thread at the real-time priority cland's switch takes.
    rt: bool,
}

/// The floor: poll(2), paced, at an ordinary priority.
const FLOOR: FloorMode = FloorMode {
    how: Wait::Poll,
    paced: true,
    rt: false,
};

/// The floor at the real-time priority cland's switch takes.
const RT_FLOOR: FloorMode = FloorMode { rt: true, ..FLOOR };

/// The floor re-reading `cgroup.events` instead of polling it.
const SPIN_FLOOR: FloorMode = FloorMode {
    how: Wait::Spin,
    ..FLOOR
};

/// The floor's switches back to back.
const BACK_TO_BACK: FloorMode = FloorMode {
    paced: false,
    ..FLOOR
};

/// How the floor waits for `cgroup.events` to change.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Wait {
    /// poll(2) for POLLPRI on the descriptor it reads through: woken by the notification.
    Poll,
    /// Read again at once until it changes (what cland's wait does in effect: it polls a
    /// descriptor it never reads through, which the kernel reports changed at once).
    Spin,
}

/// Two cgroups of the benchmark's own under the cgroup v2 mount, `a` and `b`, each holding a
/// tree; parked (both frozen) between blocks. Killed, reaped and removed on drop, also on
/// error.
struct Floor {
    top: PathBuf,
    cgs: Vec<Cg>,
    roots: Vec<std::process::Child>,
}

impl Floor {
    fn new(exe: &Path, procs: usize, busy: bool) -> anyhow::Result<Floor> {
        let top = cgroup2_mount()?.join(format!("clan-bench-floor-{}", std::process::id()));
        std::fs::create_dir(&top).with_context(|| format!("mkdir {}", top.display()))?;
        let mut f = Floor {
            top,
            cgs: Vec::new(),
            roots: Vec::new(),
        };
        // One busy tree at a time: each is frozen before the next starts.
        for name in ["a", "b"] {
            let cg = Cg::create(f.top.join(name))?;
            f.cgs.push(cg);
            let cg = f.cgs.last().expect("just pushed");
            f.roots.push(cg.start_tree(exe, procs, busy)?);
            cg.freeze(true, Wait::Poll)?;
        }
        Ok(f)
    }

    /// Thaws `a`, times `k` switches (at most `budget`, at least [`MIN_PER_BLOCK`]) run as
    /// `mode` says; parks.
    fn block(
        &self,
        mode: FloorMode,
        k: usize,
        budget: Duration,
        s: &mut Samples,
    ) -> anyhow::Result<()> {
        let FloorMode { how, paced, rt } = mode;
        let _rt = if rt {
            let rt = clan_core::sys::RealTime::enter(clan_core::config::DEFAULT_SWITCH_PRIORITY)
                .context("SCHED_FIFO for the real-time floor")?;
            Some(rt.context("the benchmark's thread is real-time already")?)
        } else {
            None
        };
        self.cgs[0].freeze(false, Wait::Poll)?;
        let mut running = 0;
        let t0 = Instant::now();
        for i in 0..k {
            if i >= MIN_PER_BLOCK && t0.elapsed() > budget {
                break;
            }
            if paced {
                std::thread::sleep(PACE);
            }
            let (from, to) = (&self.cgs[running], &self.cgs[1 - running]);
            let t = Instant::now();
            from.freeze(true, how)?;
            to.freeze(false, how)?;
            s.push(t.elapsed());
            running = 1 - running;
        }
        self.cgs[running].freeze(true, Wait::Poll)
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        for cg in &self.cgs {
            let _ = std::fs::write(cg.dir.join("cgroup.kill"), "1");
        }
        for c in &mut self.roots {
            let _ = c.wait();
        }
        for cg in &self.cgs {
            let _ = cg.wait("populated", false, Wait::Poll);
            let _ = std::fs::remove_dir(&cg.dir);
        }
        if let Err(e) = std::fs::remove_dir(&self.top) {
            println!("  (could not remove {}: {e})", self.top.display());
        }
    }
}

// ---------------------------------------------------------------- clan's tasks

/// Two jobs on [`NODE`], each a tree; parked (both frozen) between blocks. Killed and
/// waited for on drop, through the CLI (so that it works from any context).
struct Tasks<'a> {
    c: &'a Cluster,
    client: Client,
    rt: tokio::runtime::Runtime,
    jobs: Vec<u64>,
    roots: Vec<Gpid>,
}

/// The reply of a job request for one node, checked: no error, and each `(job, state)`.
fn check(reply: &[pb::NodeJobs], want: &[(u64, &str)]) -> anyhow::Result<()> {
    let [n] = reply else {
        bail!("{} node replies, expected 1", reply.len());
    };
    if let Some(e) = &n.error {
        bail!("node {}: {e}", n.node);
    }
    for (job, state) in want {
        match n.tasks.iter().find(|t| t.job == *job) {
            Some(t) if t.state == *state => {}
            Some(t) => bail!("job {job} is {}, expected {state}", t.state),
            None => bail!("no task of job {job} in the reply"),
        }
    }
    Ok(())
}

impl<'a> Tasks<'a> {
    fn new(c: &'a Cluster, exe: &Path, procs: usize, busy: bool) -> anyhow::Result<Tasks<'a>> {
        let mut t = Tasks {
            c,
            client: c.client(NODE),
            rt: rt1(),
            jobs: Vec::new(),
            roots: Vec::new(),
        };
        let node = NodeId::new(NODE).context("node")?;
        for _ in 0..2 {
            let mut argv = vec![exe.to_string_lossy().into_owned()];
            argv.extend(tree_args(procs, busy));
            let started =
                t.rt.block_on(t.client.spawn(RunSpec::command(&argv).node(NODE)))?;
            t.jobs.push(started.job);
            t.roots
                .push(*started.gpids.first().context("nothing started")?);
            let job = started.job;
            let deadline = Instant::now() + LIMIT;
            loop {
                let list =
                    t.rt.block_on(t.client.job(pb::JobAction::JobList, job, &[node], 0, ""))?;
                let have = list
                    .iter()
                    .flat_map(|n| &n.tasks)
                    .map(|t| t.procs as usize)
                    .sum::<usize>();
                if have >= procs {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("job {job}: {have} of {procs} processes after {LIMIT:?}");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            t.act(pb::JobAction::JobSuspend, job, FREEZE)?;
        }
        Ok(t)
    }

    /// Suspends or resumes one job by `method`, checked.
    fn act(&self, action: pb::JobAction, job: u64, method: &str) -> anyhow::Result<()> {
        let node = NodeId::new(NODE).context("node")?;
        let reply = self
            .rt
            .block_on(self.client.job(action, job, &[node], 0, method))?;
        let state = if action == pb::JobAction::JobSuspend {
            "suspended"
        } else {
            "running"
        };
        check(&reply, &[(job, state)]).with_context(|| format!("{action:?} {job} by {method}"))
    }

    /// From parked: the first job running, the other suspended by `method`; `k` switches
    /// timed (at most `budget`, at least [`MIN_PER_BLOCK`]), each after [`PACE`]: in `s`
    /// as the caller sees it, in `node` as the node took it (the sum of its two tasks'
    /// `took_ns`: the switch its gang scheduler would make, no request's round trip) and,
    /// when `rtt` is given, followed by the round trip of a trivial request (`nodes`) after
    /// the same pause; parked again.
    fn block(
        &self,
        method: &str,
        k: usize,
        budget: Duration,
        s: &mut Samples,
        node_time: &mut Samples,
        mut rtt: Option<&mut Samples>,
    ) -> anyhow::Result<()> {
        use pb::JobAction::{JobResume, JobSuspend};
        let node = NodeId::new(NODE).context("node")?;
        let j = &self.jobs;
        self.act(JobResume, j[0], FREEZE)?;
        if method == SIGNALS {
            self.act(JobResume, j[1], FREEZE)?;
            self.act(JobSuspend, j[1], SIGNALS)?;
        }
        let mut running = 0;
        let t0 = Instant::now();
        for i in 0..k {
            if i >= MIN_PER_BLOCK && t0.elapsed() > budget {
                break;
            }
            std::thread::sleep(PACE);
            let (from, to) = (j[running], j[1 - running]);
            let t = Instant::now();
            let reply = self
                .rt
                .block_on(self.client.job_switch(from, to, &[node], method))?;
            s.push(t.elapsed());
            check(&reply, &[(from, "suspended"), (to, "running")])
                .with_context(|| format!("switch {from} -> {to} by {method}"))?;
            let took: u64 = reply[0].tasks.iter().map(|t| t.took_ns).sum();
            node_time.push(Duration::from_nanos(took));
            running = 1 - running;
            if let Some(rtt) = rtt.as_deref_mut() {
                // After the same pause, so that it finds cland as idle as the switch did.
                std::thread::sleep(PACE);
                let t = Instant::now();
                self.rt.block_on(self.client.nodes())?;
                rtt.push(t.elapsed());
            }
        }
        if method == SIGNALS {
            self.act(JobResume, j[1 - running], SIGNALS)?;
            self.act(JobSuspend, j[1 - running], FREEZE)?;
        }
        self.act(JobSuspend, j[running], FREEZE)
    }

    /// Back to parked after a failed block by signals: whatever is stopped continued, then
    /// both frozen.
    fn recover(&self) -> anyhow::Result<()> {
        for j in &self.jobs {
            if let Err(e) = self.act(pb::JobAction::JobResume, *j, SIGNALS) {
                println!("  (recovery: {e:#})");
            }
        }
        for j in &self.jobs {
            self.act(pb::JobAction::JobSuspend, *j, FREEZE)?;
        }
        Ok(())
    }
}

impl Drop for Tasks<'_> {
    fn drop(&mut self) {
        for job in &self.jobs {
            let _ = self
                .c
                .cmd()
                .args(["job", "kill", &job.to_string(), "--node", &NODE.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        for g in &self.roots {
            let _ = self
                .c
                .cmd()
                .args(["wait", &g.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

// ---------------------------------------------------------------- the switch

/// One configuration's samples, for the summary.
struct SwitchRow {
    procs: usize,
    busy: bool,
    floor: Samples,
    /// The floor with the thread at the real-time priority cland's switch takes.
    rt_floor: Samples,
    spin: Samples,
    back_to_back: Samples,
    freeze: Samples,
    /// The freezer switch as the node took it (its own clock: no request's round trip).
    node_freeze: Samples,
    signals: Samples,
    node_signals: Samples,
    /// Why the signal method's series stopped, if it failed.
    signals_failed: Option<String>,
    rtt: Samples,
}

/// Switches between two trees of `procs` processes: the floor (bare freeze + thaw in the
/// benchmark's own cgroups, three ways), clan by the freezer and by signals, in [`ROUNDS`]
/// turns. A failure of the signal method (cland gives up after 10 s) ends its series only.
fn switch_config(
    c: &Cluster,
    exe: &Path,
    r: &mut Report,
    procs: usize,
    busy: bool,
    k: usize,
) -> anyhow::Result<SwitchRow> {
    let g = format!("job switch, {}", shape(procs, busy));
    println!("{g} ({k} switches each, in {ROUNDS} turns):");
    let t0 = Instant::now();
    let floor = Floor::new(exe, procs, busy)?;
    let tasks = Tasks::new(c, exe, procs, busy)?;
    println!("  (trees started in {})", fmt(t0.elapsed()));
    let per = k.div_ceil(ROUNDS);
    let budget = BUDGET / ROUNDS as u32;
    let mut row = SwitchRow {
        procs,
        busy,
        floor: Samples::default(),
        rt_floor: Samples::default(),
        spin: Samples::default(),
        back_to_back: Samples::default(),
        freeze: Samples::default(),
        node_freeze: Samples::default(),
        signals: Samples::default(),
        node_signals: Samples::default(),
        signals_failed: None,
        rtt: Samples::default(),
    };
    for _ in 0..ROUNDS {
        floor.block(FLOOR, per, budget, &mut row.floor)?;
        floor.block(RT_FLOOR, per, budget, &mut row.rt_floor)?;
        floor.block(SPIN_FLOOR, per, budget, &mut row.spin)?;
        floor.block(BACK_TO_BACK, per, budget, &mut row.back_to_back)?;
        tasks.block(
            FREEZE,
            per,
            budget,
            &mut row.freeze,
            &mut row.node_freeze,
            Some(&mut row.rtt),
        )?;
        if row.signals_failed.is_none() {
            let (s, n) = (&mut row.signals, &mut row.node_signals);
            if let Err(e) = tasks.block(SIGNALS, per, budget, s, n, None) {
                println!("  clan job_switch, signals: failed: {e:#}");
                row.signals_failed = Some(format!("{e:#}"));
                tasks.recover()?;
            }
        }
    }
    drop(tasks);
    drop(floor);
    let base = "bare cgroup v2 freeze A + thaw B (floor)";
    let freeze = "clan job_switch, freeze (library)";
    r.latency(&g, base, &row.floor, None);
    let rt_base = "  floor at real-time priority (SCHED_FIFO 1, as cland's switch)";
    r.latency(&g, rt_base, &row.rt_floor, Some(base));
    r.latency(
        &g,
        "  floor re-reading cgroup.events (no poll)",
        &row.spin,
        Some(base),
    );
    r.latency(
        &g,
        "  floor back to back (no pause between switches)",
        &row.back_to_back,
        Some(base),
    );
    r.latency(&g, freeze, &row.freeze, Some(base));
    r.latency(
        &g,
        "  the same as node 1 took it (its gang scheduler's switch)",
        &row.node_freeze,
        Some(base),
    );
    r.latency(
        &g,
        "    against the real-time floor",
        &row.node_freeze,
        Some(rt_base),
    );
    match (&row.signals_failed, row.signals.len()) {
        (None, _) => r.latency(
            &g,
            "clan job_switch, signals (library)",
            &row.signals,
            Some(freeze),
        ),
        (Some(why), 0) => {
            r.note(&format!("{g}: clan job_switch by signals failed: {why}"));
        }
        (Some(why), done) => {
            let name = format!("clan job_switch, signals (library), {done} before it failed");
            r.latency(&g, &name, &row.signals, Some(freeze));
            r.note(&format!("{g}: clan job_switch by signals failed: {why}"));
        }
    }
    if row.node_signals.len() > 0 {
        r.latency(
            &g,
            "  clan signals as node 1 took it",
            &row.node_signals,
            Some("  the same as node 1 took it (its gang scheduler's switch)"),
        );
    }
    r.latency(
        &g,
        "  round trip of a trivial request (nodes), same moments",
        &row.rtt,
        Some(freeze),
    );
    Ok(row)
}

/// The compact table of every configuration: medians (ms) and the goal ratios.
fn summary_table(rows: &[SwitchRow]) -> String {
    let ms = |s: &Samples| format!("{:.2}", s.median().as_secs_f64() * 1e3);
    let ratio = |a: &Samples, b: &Samples| {
        let b = b.median().as_secs_f64();
        if b > 0.0 && a.len() > 0 {
            format!("{:.2}x", a.median().as_secs_f64() / b)
        } else {
            "-".into()
        }
    };
    let mut t = String::from(
        "| processes | load | floor | floor, real-time | floor, no poll | floor, back to back | clan freeze | freeze / floor | node's own freeze switch | node's / floor | node's / real-time floor | clan signals | signals / freeze | nodes() round trip |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let (signals, ratio_s) = match &r.signals_failed {
            None => (ms(&r.signals), ratio(&r.signals, &r.freeze)),
            Some(_) if r.signals.len() > 0 => (
                format!("{} ({} done, then failed)", ms(&r.signals), r.signals.len()),
                ratio(&r.signals, &r.freeze),
            ),
            Some(_) => ("failed".into(), "-".into()),
        };
        t.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.3} |\n",
            r.procs,
            if r.busy { "busy" } else { "idle" },
            ms(&r.floor),
            ms(&r.rt_floor),
            ms(&r.spin),
            ms(&r.back_to_back),
            ms(&r.freeze),
            ratio(&r.freeze, &r.floor),
            ms(&r.node_freeze),
            ratio(&r.node_freeze, &r.floor),
            ratio(&r.node_freeze, &r.rt_floor),
            signals,
            ratio_s,
            r.rtt.median().as_secs_f64() * 1e3,
        ));
    }
    t
}

// ---------------------------------------------------------------- genealogy

/// The `forks` role: `iters` times fork a child that exits at once and wait for it; prints
/// the rate (forks per second).
pub fn forks(iters: usize) -> anyhow::Result<()> {
    let t = Instant::now();
    for _ in 0..iters {
        // SAFETY: the child calls only _exit, async-signal-safe.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: as above.
            unsafe { libc::_exit(0) };
        }
        if pid < 0 {
            bail!("fork: {}", std::io::Error::last_os_error());
        }
        let mut status = 0;
        // SAFETY: status is a live local.
        if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
            bail!("waitpid: {}", std::io::Error::last_os_error());
        }
    }
    println!("{}", iters as f64 / t.elapsed().as_secs_f64());
    Ok(())
}

/// Runs the `forks` roles `cmds` at once and returns the sum of the rates they printed.
fn fork_rate(cmds: Vec<Command>) -> anyhow::Result<f64> {
    let mut running = Vec::new();
    for mut cmd in cmds {
        cmd.stdin(Stdio::null()).stdout(Stdio::piped());
        let child = cmd.spawn().with_context(|| format!("{cmd:?}"))?;
        running.push((format!("{cmd:?}"), child));
    }
    let mut sum = 0.0;
    for (what, child) in running {
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("{what}: {}", out.status);
        }
        let text = String::from_utf8_lossy(&out.stdout);
        sum += text
            .lines()
            .last()
            .and_then(|l| l.trim().parse::<f64>().ok())
            .with_context(|| format!("{what} printed {text:?}"))?;
    }
    Ok(sum)
}

/// cland processes on the machine (each follows every fork of the host).
fn clands() -> usize {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter(|e| {
                    std::fs::read_to_string(e.path().join("comm"))
                        .is_ok_and(|c| c.trim() == "cland")
                })
                .count()
        })
        .unwrap_or(0)
}

/// Where a `forks` role runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    /// On the host, in the benchmark's own cgroups and namespaces.
    Host,
    /// In a pid namespace of its own (`unshare -pf`) and in cgroups of the benchmark's own
    /// shaped like a task's (cgroup v2, and the v1 pids and memory hierarchies that tasks
    /// join on these machines): a task in all but clan's tracking.
    Control,
    /// In a task of its own on the cluster's node (`clan run --node 1`): every fork tracked.
    Task,
}

/// The forks' surroundings: the exe, the count, the cluster, the control cgroups (removed
/// on drop).
struct ForkBench<'a> {
    exe: &'a Path,
    forks: usize,
    c: Option<&'a Cluster>,
    control: Vec<PathBuf>,
}

impl ForkBench<'_> {
    fn cmd(&self, at: Place) -> anyhow::Result<Command> {
        let n = self.forks.to_string();
        let role = [
            self.exe.as_os_str(),
            "forks".as_ref(),
            "--iters".as_ref(),
            n.as_ref(),
        ];
        Ok(match at {
            Place::Host => {
                let mut cmd = Command::new(self.exe);
                cmd.args(&role[1..]);
                cmd
            }
            Place::Control => {
                let mut cmd = Command::new("unshare");
                cmd.args(["--pid", "--fork", "--"]).args(role);
                born_in(&mut cmd, &self.control, false)?;
                cmd
            }
            Place::Task => {
                let mut cmd = self.c.context("no cluster")?.cmd();
                cmd.args(["run", "--node", &NODE.to_string(), "--"])
                    .args(role);
                cmd
            }
        })
    }

    /// `par` forkers at once at `at`: the rate of all, and cland's CPU time per fork.
    fn run(&self, at: Place, par: usize, cland: Option<i32>) -> anyhow::Result<(f64, Duration)> {
        let cmds = (0..par)
            .map(|_| self.cmd(at))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let c0 = cland.map(cpu_time);
        let rate = fork_rate(cmds)?;
        let cpu = match (cland, c0) {
            (Some(p), Some(c0)) => cpu_time(p).saturating_sub(c0) / (self.forks * par) as u32,
            _ => Duration::ZERO,
        };
        Ok((rate, cpu))
    }
}

impl Drop for ForkBench<'_> {
    fn drop(&mut self) {
        for d in &self.control {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// The fork rate on the host before this run's cluster is up: one forker, then two at once
/// (both cores), in turns.
fn fork_rounds_host(exe: &Path, forks: usize) -> anyhow::Result<[Vec<f64>; 2]> {
    println!(
        "fork rate on the host, before this run's cland starts ({} cland on the machine):",
        clands()
    );
    let b = ForkBench {
        exe,
        forks,
        c: None,
        control: Vec::new(),
    };
    let mut rates = [Vec::new(), Vec::new()];
    for _ in 0..FORK_ROUNDS {
        for (i, par) in [1, 2].into_iter().enumerate() {
            rates[i].push(b.run(Place::Host, par, None)?.0);
        }
    }
    Ok(rates)
}

/// Fork rates with this run's cland up, in turns: outside any task, in the control (a task
/// without the tracking) and inside a task; one forker and two at once; with cland's CPU
/// time per fork.
fn genealogy(
    c: &Cluster,
    exe: &Path,
    forks: usize,
    before: &[Vec<f64>; 2],
    r: &mut Report,
) -> anyhow::Result<()> {
    let g = "fork rate (genealogy)";
    let cfg = clan_core::ClusterConfig::load(&c.dir.join("cluster.toml"))?;
    let node = NodeId::new(NODE).context("node")?;
    let cland: i32 = std::fs::read_to_string(cfg.state_dir(node).join("cland.pid"))?
        .trim()
        .parse()?;
    println!(
        "{g} (fork+exit+wait, {forks} per forker, {FORK_ROUNDS} turns; {} cland on the machine):",
        clands()
    );
    let mut b = ForkBench {
        exe,
        forks,
        c: Some(c),
        control: Vec::new(),
    };
    let name = format!("clan-bench-forks-{}", std::process::id());
    let mut roots = vec![cgroup2_mount()?];
    roots.extend(["pids", "memory"].iter().filter_map(|c| v1_mount(c)));
    for root in roots {
        let d = root.join(&name);
        std::fs::create_dir(&d).with_context(|| format!("mkdir {}", d.display()))?;
        b.control.push(d);
    }
    let conditions = [
        ("1 forker, host, outside any task", Place::Host, 1),
        (
            "1 forker, own pid namespace + cgroups like a task's",
            Place::Control,
            1,
        ),
        ("1 forker, inside a clan task (tracked)", Place::Task, 1),
        ("2 forkers, host, outside any task", Place::Host, 2),
        ("2 forkers, inside clan tasks (tracked)", Place::Task, 2),
    ];
    let mut rates = vec![Vec::new(); conditions.len()];
    let mut cpu = vec![Samples::default(); conditions.len()];
    for _ in 0..FORK_ROUNDS {
        for (i, (_, at, par)) in conditions.iter().enumerate() {
            let (rate, per_fork) = b.run(*at, *par, Some(cland))?;
            rates[i].push(rate);
            cpu[i].push(per_fork);
        }
    }
    let unit = "forks/s";
    let (b1, b2) = (
        "1 forker, host, before this run's cland started",
        "2 forkers, host, before this run's cland started",
    );
    r.rates(g, b1, &before[0], unit, None);
    r.rates(g, conditions[0].0, &rates[0], unit, Some(b1));
    r.rates(g, conditions[1].0, &rates[1], unit, Some(conditions[0].0));
    r.rates(g, conditions[2].0, &rates[2], unit, Some(conditions[0].0));
    r.rates(
        g,
        "  the same, against the control",
        &rates[2],
        unit,
        Some(conditions[1].0),
    );
    r.rates(g, b2, &before[1], unit, None);
    r.rates(g, conditions[3].0, &rates[3], unit, Some(b2));
    r.rates(g, conditions[4].0, &rates[4], unit, Some(conditions[3].0));
    for (i, (name, _, _)) in conditions.iter().enumerate() {
        r.latency(
            g,
            &format!("  cland CPU time per fork: {name}"),
            &cpu[i],
            None,
        );
    }
    Ok(())
}

// ---------------------------------------------------------------- Slurm

/// A batch job's processes: the `tree` role's, found by their environment.
fn slurm_pids(job: u64) -> Vec<i32> {
    let tag = format!("SLURM_JOB_ID={job}");
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .filter(|p| {
                    std::fs::read_to_string(format!("/proc/{p}/comm"))
                        .is_ok_and(|c| c.trim() == "clan-bench")
                        && std::fs::read(format!("/proc/{p}/environ"))
                            .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == tag.as_bytes()))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The state letter of a process (`None` once it is gone).
fn proc_state(pid: i32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Polls (every 0.2 ms: nothing notifies another process's stop) until every process of
/// `pids` is stopped (`T`), or none is.
fn wait_stopped(pids: &[i32], want: bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + LIMIT;
    loop {
        let stopped = pids.iter().filter(|p| proc_state(**p) == Some('T')).count();
        if (want && stopped == pids.len()) || (!want && stopped == 0) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{stopped} of {} processes stopped after {LIMIT:?}",
                pids.len()
            );
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn scontrol(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("scontrol").args(args).output()?;
    if !out.status.success() {
        bail!(
            "scontrol {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Batch jobs of the comparison, each with its processes; cancelled on drop, and their
/// processes waited out.
#[derive(Default)]
struct SlurmJobs(Vec<(u64, Vec<i32>)>);

impl SlurmJobs {
    /// `sbatch --wrap 'exec clan-bench tree ...'`, and its processes once all are there.
    fn submit(&mut self, exe: &Path, args: &[String], procs: usize) -> anyhow::Result<()> {
        let wrap = format!("exec {} {}", exe.display(), args.join(" "));
        let out = Command::new("sbatch")
            .args([
                "--parsable",
                "-o",
                "/dev/null",
                "-J",
                "clan-bench-tree",
                "--wrap",
                &wrap,
            ])
            .output()?;
        if !out.status.success() {
            bail!("sbatch: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let job: u64 = text
            .trim()
            .split(';')
            .next()
            .and_then(|j| j.parse().ok())
            .with_context(|| format!("sbatch printed {text:?}"))?;
        self.0.push((job, Vec::new()));
        let deadline = Instant::now() + LIMIT;
        loop {
            let pids = slurm_pids(job);
            if pids.len() >= procs {
                self.0.last_mut().expect("just pushed").1 = pids;
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "slurm job {job}: {} of {procs} processes after {LIMIT:?}",
                    pids.len()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `scontrol suspend` of job `from` until all its processes are stopped, then `scontrol
    /// resume` of job `to` until none is: (the whole, the suspend part).
    fn switch(&self, from: usize, to: usize) -> anyhow::Result<(Duration, Duration)> {
        let (from, to) = (&self.0[from], &self.0[to]);
        let t = Instant::now();
        scontrol(&["suspend", &from.0.to_string()])?;
        wait_stopped(&from.1, true)?;
        let stopped = t.elapsed();
        scontrol(&["resume", &to.0.to_string()])?;
        wait_stopped(&to.1, false)?;
        Ok((t.elapsed(), stopped))
    }
}

impl Drop for SlurmJobs {
    fn drop(&mut self) {
        let ids: Vec<String> = self.0.iter().map(|(j, _)| j.to_string()).collect();
        if ids.is_empty() {
            return;
        }
        let _ = Command::new("scancel").args(&ids).status();
        let deadline = Instant::now() + LIMIT;
        while self.0.iter().any(|(j, _)| !slurm_pids(*j).is_empty()) {
            if Instant::now() > deadline {
                println!("  (processes of slurm jobs {ids:?} still there)");
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Slurm's switch of two batch jobs of 15 processes: `scontrol suspend A` until every
/// process of A is stopped, then `scontrol resume B` until none of B is; back to back, and
/// [`SLURM_PACE`] apart; idle, busy, and idle ignoring SIGTSTP. Against clan's switch of the
/// same trees (`clan_15`: by the freezer, idle and busy).
fn slurm(exe: &Path, r: &mut Report, clan_15: &[(bool, Samples)]) -> anyhow::Result<()> {
    for (busy, ignore_tstp) in [(false, false), (true, false), (false, true)] {
        let mut args = tree_args(SLURM_PROCS, busy);
        let mut what = shape(SLURM_PROCS, busy);
        if ignore_tstp {
            args.push("--ignore-tstp".into());
            what.push_str(", ignoring SIGTSTP");
        }
        let g = format!("slurm, {what}");
        println!("{g} (scontrol suspend A + resume B, {SLURM_SWITCHES} switches each way):");
        let mut jobs = SlurmJobs::default();
        jobs.submit(exe, &args, SLURM_PROCS)?;
        scontrol(&["suspend", &jobs.0[0].0.to_string()])?;
        wait_stopped(&jobs.0[0].1, true)?;
        jobs.submit(exe, &args, SLURM_PROCS)?;
        // The second runs, the first is suspended.
        let mut running = 1;
        let mut back_to_back = Samples::default();
        for _ in 0..SLURM_SWITCHES {
            back_to_back.push(jobs.switch(running, 1 - running)?.0);
            running = 1 - running;
        }
        let (mut paced, mut stop, mut cont) =
            (Samples::default(), Samples::default(), Samples::default());
        for _ in 0..SLURM_SWITCHES {
            std::thread::sleep(SLURM_PACE);
            let (whole, stopped) = jobs.switch(running, 1 - running)?;
            paced.push(whole);
            stop.push(stopped);
            cont.push(whole - stopped);
            running = 1 - running;
        }
        drop(jobs);
        let clan = "clan job_switch, freeze (library)";
        let base = match clan_15.iter().find(|(b, _)| *b == busy) {
            Some((_, s)) => {
                r.latency(&g, clan, s, None);
                Some(clan)
            }
            None => None,
        };
        r.latency(
            &g,
            "scontrol suspend A + resume B, back to back",
            &back_to_back,
            base,
        );
        r.latency(
            &g,
            &format!(
                "scontrol suspend A + resume B, {} s apart",
                SLURM_PACE.as_secs()
            ),
            &paced,
            base,
        );
        r.latency(
            &g,
            "  of which suspend until every process stopped",
            &stop,
            base,
        );
        r.latency(&g, "  of which resume until none stopped", &cont, base);
    }
    Ok(())
}
