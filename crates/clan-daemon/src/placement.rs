//! Where a new process goes (Solaris MC 4.3): an explicit node, round-robin (the default),
//! least-loaded from the loads the nodes exchange, or a registered *load manager*
//! (registerloadmgr): an external program run for each placement, or a service on a Unix
//! socket, that is given the candidate nodes as one JSON line and answers with a node id.

use crate::error::{Error, Result};
use crate::node::Node;
use clan_core::NodeId;
use clan_proto::pb;
use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tracing::warn;

/// A registered load manager.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum LoadManager {
    /// A program run once per placement: JSON on stdin, a node id on stdout.
    Command(Vec<String>),
    /// A service on a Unix socket: one JSON line in, one line with a node id back.
    Socket(PathBuf),
}

impl LoadManager {
    pub fn describe(&self) -> String {
        match self {
            LoadManager::Command(c) => format!("command: {}", c.join(" ")),
            LoadManager::Socket(p) => format!("socket: {}", p.display()),
        }
    }
}

#[derive(Debug, Default)]
pub struct Placement {
    last: u32,
    pub manager: Option<LoadManager>,
    file: PathBuf,
}

#[derive(Serialize)]
struct Query<'a> {
    argv: Vec<String>,
    uid: u32,
    exclude: &'a [u32],
    nodes: Vec<NodeLoad>,
}

#[derive(Serialize)]
struct NodeLoad {
    id: u32,
    load: f64,
    procs: u32,
    mem_used_kb: u64,
    mem_total_kb: u64,
}

impl Placement {
    /// Loads a persisted load-manager registration from `file`.
    pub fn load(file: PathBuf) -> Placement {
        let manager = std::fs::read(&file)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        Placement {
            last: 0,
            manager,
            file,
        }
    }

    pub fn set_manager(&mut self, m: Option<LoadManager>) -> Result<()> {
        match &m {
            Some(m) => std::fs::write(&self.file, serde_json::to_vec(m).expect("serializable"))
                .map_err(|e| Error::internal("persist load manager", e))?,
            None => {
                let _ = std::fs::remove_file(&self.file);
            }
        }
        self.manager = m;
        Ok(())
    }
}

impl Node {
    /// Chooses `count` distinct live nodes for a new job's processes.
    pub async fn place(
        &self,
        explicit: u32,
        policy: pb::Policy,
        count: u32,
        spec: &pb::ProcSpec,
        uid: u32,
    ) -> Result<Vec<NodeId>> {
        let count = count.max(1) as usize;
        if explicit != 0 {
            let n = NodeId::new(explicit)
                .ok_or_else(|| Error::NotFound(format!("node {explicit} is not in the cluster")))?;
            if !self.node_alive(n)? {
                return Err(Error::NodeDead(n));
            }
            if count > 1 {
                return Err(Error::Invalid(
                    "--node places one process; use -N without --node for several".into(),
                ));
            }
            return Ok(vec![n]);
        }
        let infos: Vec<pb::NodeInfo> = self
            .nodes()
            .into_iter()
            .filter(|n| !crate::peer::is_down(&n.state))
            .collect();
        if count > infos.len() {
            return Err(Error::Invalid(format!(
                "{count} copies asked for, but only {} node(s) are up",
                infos.len()
            )));
        }
        let manager = self.placement.lock().manager.clone();
        let policy = match policy {
            pb::Policy::Default if manager.is_some() => pb::Policy::LoadManager,
            pb::Policy::Default => pb::Policy::RoundRobin,
            p => p,
        };
        let chosen = match (policy, manager) {
            (pb::Policy::LoadManager, None) => {
                return Err(Error::Invalid(
                    "no load manager is registered on this node".into(),
                ))
            }
            (pb::Policy::LoadManager, Some(m)) => {
                match self.ask_manager(&m, &infos, count, spec, uid).await {
                    Ok(v) => v,
                    Err(e) => {
                        warn!("load manager failed ({e}); placing round-robin");
                        self.round_robin(&infos, count)
                    }
                }
            }
            // Scored and noted at once: concurrent placements see each other's.
            (pb::Policy::LeastLoaded, _) => return Ok(self.least_loaded(&infos, count)),
            _ => self.round_robin(&infos, count),
        };
        for &n in &chosen {
            self.note_placement(n);
        }
        Ok(chosen)
    }

    fn round_robin(&self, infos: &[pb::NodeInfo], count: usize) -> Vec<NodeId> {
        let mut pl = self.placement.lock();
        let start = infos.iter().position(|n| n.id > pl.last).unwrap_or(0);
        let v: Vec<NodeId> = (0..count)
            .filter_map(|i| NodeId::new(infos[(start + i) % infos.len()].id))
            .collect();
        if let Some(l) = v.last() {
            pl.last = l.get();
        }
        v
    }

    /// The `count` live nodes (of `infos`) with the lowest load, each placement its load may
    /// not show yet counting one (`node::Placed`), on this node too; the chosen are noted
    /// before the placement lock is let go, so a concurrent placement counts them.
    fn least_loaded(&self, infos: &[pb::NodeInfo], count: usize) -> Vec<NodeId> {
        let _pl = self.placement.lock();
        let mut scored: Vec<(f64, u32, u32)> = infos
            .iter()
            .filter_map(|n| NodeId::new(n.id))
            .map(|id| {
                // The load and the placements since it was sampled, read together.
                let (load, placed, procs) = if id == self.id {
                    let l = self.load.lock();
                    (l.load, l.placed.count(), l.procs)
                } else if let Some(p) = self.peers.get(&id) {
                    let st = p.state.lock();
                    let i = st.info.as_ref();
                    (
                        i.map_or(0.0, |i| i.load),
                        st.placed.count(),
                        i.map_or(0, |i| i.procs),
                    )
                } else {
                    (0.0, 0, 0)
                };
                (load + f64::from(placed), procs, id.get())
            })
            .collect();
        scored.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        let chosen: Vec<NodeId> = scored
            .into_iter()
            .take(count)
            .filter_map(|(_, _, id)| NodeId::new(id))
            .collect();
        for &n in &chosen {
            self.note_placement(n);
        }
        chosen
    }

    async fn ask_manager(
        &self,
        m: &LoadManager,
        infos: &[pb::NodeInfo],
        count: usize,
        spec: &pb::ProcSpec,
        uid: u32,
    ) -> Result<Vec<NodeId>> {
        let mut chosen: Vec<u32> = Vec::new();
        for _ in 0..count {
            let q = Query {
                argv: spec
                    .argv
                    .iter()
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect(),
                uid,
                exclude: &chosen,
                nodes: infos
                    .iter()
                    .filter(|n| !chosen.contains(&n.id))
                    .map(|n| NodeLoad {
                        id: n.id,
                        load: n.load,
                        procs: n.procs,
                        mem_used_kb: n.mem_used_kb,
                        mem_total_kb: n.mem_total_kb,
                    })
                    .collect(),
            };
            let mut line = serde_json::to_string(&q).expect("serializable");
            line.push('\n');
            let cg = self.cgroup.as_ref().map(|c| c.sub(MANAGER_CGROUP));
            let answer =
                tokio::time::timeout(Duration::from_secs(2), query(m, line, cg.as_deref()))
                    .await
                    .map_err(|_| Error::Internal("load manager timed out".into()))??;
            let id: u32 = answer.trim().parse().map_err(|_| {
                Error::Internal(format!(
                    "load manager answered {:?}, not a node id",
                    answer.trim()
                ))
            })?;
            if !infos.iter().any(|n| n.id == id) || chosen.contains(&id) {
                return Err(Error::Internal(format!(
                    "load manager chose node {id}, which is not a live candidate"
                )));
            }
            chosen.push(id);
        }
        Ok(chosen.into_iter().filter_map(NodeId::new).collect())
    }
}

/// The most of a load manager's answer read: a node id and a newline fit many times over.
const ANSWER_MAX: u64 = 1024;

/// The first line of a load manager's answer, read up to [`ANSWER_MAX`] bytes: a manager
/// that floods its output is neither buffered nor waited for beyond its line.
async fn first_line(r: impl AsyncRead + Unpin) -> Result<String> {
    let mut buf = Vec::new();
    BufReader::new(r.take(ANSWER_MAX))
        .read_until(b'\n', &mut buf)
        .await
        .map_err(|e| Error::internal("load manager", e))?;
    if buf.last() != Some(&b'\n') && buf.len() as u64 == ANSWER_MAX {
        return Err(Error::Internal(format!(
            "load manager answered more than {ANSWER_MAX} bytes without a newline"
        )));
    }
    Ok(String::from_utf8_lossy(&buf).trim_end().to_string())
}

/// Ends a load manager run when dropped (once it answered, failed or timed out), and
/// everything it started: SIGKILL to its process group, and `cgroup.kill` of its own
/// cgroup, which holds whatever it started however it detached (`setsid`, a double
/// fork); the cgroup is removed once empty. Dropped before the manager's `Child`, which
/// is not reaped before then, so the group's number names no other group.
struct KillGroup(Option<nix::unistd::Pid>, Option<PathBuf>);

impl Drop for KillGroup {
    fn drop(&mut self) {
        if let Some(g) = self.0 {
            let _ = nix::sys::signal::killpg(g, nix::sys::signal::Signal::SIGKILL);
        }
        if let Some(dir) = self.1.take() {
            let _ = std::fs::write(dir.join("cgroup.kill"), "1");
            let gone = move || {
                if let Err(e) = crate::cgroup::kill_and_remove(&dir, Duration::from_secs(5)) {
                    warn!("load manager cgroup {}: {e}", dir.display());
                }
            };
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn_blocking(gone)),
                Err(_) => gone(),
            }
        }
    }
}

/// A cgroup for one load manager run: `qN` under `base` (the node's `loadmgr`).
fn manager_cgroup(base: &Path) -> Option<(PathBuf, CString)> {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let dir = base.join(format!("q{}", RUNS.fetch_add(1, Ordering::Relaxed)));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        warn!("load manager cgroup {}: {e}", dir.display());
        return None;
    }
    let procs = CString::new(dir.join("cgroup.procs").into_os_string().into_vec()).ok()?;
    Some((dir, procs))
}

/// Starts load manager program `argv` in a process group of its own, moved into the
/// cgroup whose `cgroup.procs` is `procs` before it runs anything of its own.
fn start_manager(
    argv: &[String],
    procs: Option<&CString>,
) -> std::io::Result<tokio::process::Child> {
    let mut cmd = tokio::process::Command::new(&argv[0]);
    clan_core::sys::first_open_files_for(cmd.as_std_mut());
    if let Some(procs) = procs {
        let procs = procs.clone();
        // SAFETY: between fork and exec, only open, write and close on a path prepared
        // before the fork (async-signal-safe).
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
                Ok(())
            });
        }
    }
    cmd.args(&argv[1..])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        // A group of its own, which goes whole (`KillGroup`).
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
}

/// [`start_manager`] on the runtime's blocking pool: its `pre_exec` rules out
/// `posix_spawn`, so the start is a fork of cland's whole address space, which would hold
/// a runtime worker (and every task waiting for it) for as long as it lasts.
async fn start_manager_blocking(
    argv: &[String],
    procs: Option<&CString>,
) -> std::io::Result<tokio::process::Child> {
    let (argv, procs) = (argv.to_vec(), procs.cloned());
    tokio::task::spawn_blocking(move || start_manager(&argv, procs.as_ref()))
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
}

/// Where, under a node's cgroup, load managers run (one cgroup per run). A cland starting
/// kills and removes what a crashed one left there.
pub const MANAGER_CGROUP: &str = "loadmgr";

/// Asks load manager `m` with the JSON `line`; a program is started in a cgroup of its own
/// under `cgroup` (the node's `loadmgr`) when there is one, in a process group of its own
/// always.
async fn query(m: &LoadManager, line: String, cgroup: Option<&Path>) -> Result<String> {
    let io = |e: std::io::Error| Error::internal("load manager", e);
    match m {
        LoadManager::Command(argv) => {
            let cg = cgroup.and_then(manager_cgroup);
            let mut spawned = start_manager_blocking(argv, cg.as_ref().map(|(_, p)| p)).await;
            if let (Err(e), Some((dir, _))) = (&spawned, &cg) {
                // The move into its cgroup failed (delegation, a pids limit): run it
                // without one rather than not at all.
                warn!(
                    "load manager not started in {}: {e}; started without",
                    dir.display()
                );
                spawned = start_manager_blocking(argv, None).await;
            }
            let dir = cg.map(|(d, _)| d);
            let mut child = match spawned {
                Ok(c) => c,
                Err(e) => {
                    drop(KillGroup(None, dir));
                    return Err(io(e));
                }
            };
            let _group = KillGroup(
                child.id().map(|p| nix::unistd::Pid::from_raw(p as i32)),
                dir,
            );
            let mut stdin = child.stdin.take().expect("piped");
            // A manager may answer without reading its input, and be gone before it is
            // written: its answer is what counts.
            match stdin.write_all(line.as_bytes()).await {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(io(e)),
                _ => {}
            }
            drop(stdin);
            first_line(child.stdout.take().expect("piped")).await
        }
        LoadManager::Socket(p) => {
            let s = tokio::net::UnixStream::connect(p).await.map_err(io)?;
            let (r, mut w) = s.into_split();
            w.write_all(line.as_bytes()).await.map_err(io)?;
            first_line(r).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_manager_answer_is_its_first_line_read_bounded() {
        assert_eq!(first_line(&b"3\nmore\n"[..]).await.unwrap(), "3");
        assert_eq!(first_line(&b"2"[..]).await.unwrap(), "2");
        // A flood with no newline is not read beyond the bound.
        let flood = vec![b'3'; 1 << 20];
        let e = first_line(&flood[..]).await.unwrap_err();
        assert!(e.to_string().contains("without a newline"), "{e}");
    }

    #[tokio::test]
    async fn a_manager_is_killed_with_its_group() {
        // Answers, then floods and leaves a child: both go once the answer is read.
        let d = tempfile::tempdir().unwrap();
        let pidfile = d.path().join("child");
        let m = LoadManager::Command(vec![
            "sh".into(),
            "-c".into(),
            "sleep 1000 & echo $! > \"$0\"; echo 2; exec yes".into(),
            pidfile.display().to_string(),
        ]);
        let answer = tokio::time::timeout(Duration::from_secs(10), query(&m, "{}\n".into(), None))
            .await
            .expect("answered before its end")
            .unwrap();
        assert_eq!(answer, "2");
        let child: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        // Killed (a zombie at most, until whoever adopted it reaps it).
        while crate::pid_alive(child) {
            assert!(std::time::Instant::now() < deadline, "the child lives on");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn a_manager_that_detaches_goes_with_its_cgroup() {
        // setsid leaves the process group; the cgroup holds it anyway.
        let Some(base) = crate::cgroup::cgroup2_mount()
            .map(|m| m.join(format!("clan-test-loadmgr-{}", std::process::id())))
            .filter(|_| nix::unistd::geteuid().is_root())
        else {
            eprintln!("skipped: needs root and a cgroup v2 mount");
            return;
        };
        let d = tempfile::tempdir().unwrap();
        let pidfile = d.path().join("child");
        let m = LoadManager::Command(vec![
            "sh".into(),
            "-c".into(),
            "setsid sh -c 'echo $$ > \"$0\"; exec sleep 1000' \"$0\" & \
             while [ ! -s \"$0\" ]; do :; done; echo 3"
                .into(),
            pidfile.display().to_string(),
        ]);
        let answer = tokio::time::timeout(
            Duration::from_secs(10),
            query(&m, "{}\n".into(), Some(&base)),
        )
        .await
        .expect("answered")
        .unwrap();
        assert_eq!(answer, "3");
        let child: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        // A cgroup directory always lists its control files: its runs' cgroups are the
        // directories in it.
        let gone = |p: &Path| {
            std::fs::read_dir(p).map_or(true, |d| {
                !d.flatten().any(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            })
        };
        while crate::pid_alive(child) || !gone(&base) {
            if std::time::Instant::now() > deadline {
                let _ = crate::cgroup::kill_and_remove(&base, Duration::from_secs(5));
                panic!("the detached child {child} lives on, or its cgroup stays");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = std::fs::remove_dir(&base);
    }
}
