//! `clan job`: list, show, suspend, resume and kill jobs; each acts on the job's task on
//! every node (or the nodes given) and reports per node.

use clan_client::pb::{self, JobAction as A};
use clan_client::{Client, ClientError};
use clan_core::{ExitCode as X, JobId, NodeId};
use std::process::ExitCode;

#[derive(clap::Subcommand)]
pub enum Args {
    /// List the jobs with a task on some node: per node, processes, state, CPU time.
    Ls(Where),
    /// One job per node: processes, state, CPU time, peak process count, memory.
    Show(Target),
    /// The genealogy forest of each task of the job: every process under its nearest living
    /// ancestor in the task (orphans are not given to init).
    Tree(Target),
    /// Stop every process of the job (cgroup freeze; invisible to their parents) and
    /// return once they all are.
    Suspend(Target),
    /// Continue a suspended job.
    Resume(Target),
    /// Suspend job OLD, then resume job NEW, on each node in one request (a gang
    /// scheduler's row switch): NEW runs only once every process of OLD is stopped.
    Switch(SwitchArgs),
    /// Send a signal to every process of the job (SIGKILL by default: none is left; 0, as
    /// kill(1)'s: check that the job exists and may be signalled, send nothing).
    Kill(KillArgs),
    /// Make a process started outside clan, with its descendants, a new job's task on this
    /// node (they can not leave it afterwards).
    Adopt {
        /// The process, as this machine numbers it.
        pid: u32,
    },
}

#[derive(clap::Args)]
pub struct Where {
    /// Only these nodes (repeatable).
    #[arg(long = "node", value_name = "N")]
    nodes: Vec<NodeId>,
}

#[derive(clap::Args)]
pub struct Target {
    /// The job id (as `clan run` prints it).
    job: JobId,
    /// Only the job's tasks on these nodes (repeatable).
    #[arg(long = "node", value_name = "N")]
    nodes: Vec<NodeId>,
    /// Only this process of the job and its descendants (suspend, resume and kill use
    /// signals over the genealogy then).
    #[arg(long, value_name = "GPID")]
    subtree: Option<clan_core::Gpid>,
    /// How to suspend and resume: freeze (the cgroup v2 freezer) or signals (SIGSTOP top-down
    /// and SIGCONT bottom-up over the task's genealogy, each verified; parents may notice).
    /// [default: freeze, or signals on a node without the freezer]
    #[arg(long, value_parser = ["freeze", "signals"])]
    method: Option<String>,
}

#[derive(clap::Args)]
pub struct SwitchArgs {
    /// The job to suspend.
    old: JobId,
    /// The job to resume once OLD is suspended.
    new: JobId,
    /// Only on these nodes (repeatable).
    #[arg(long = "node", value_name = "N")]
    nodes: Vec<NodeId>,
    /// freeze or signals (as for suspend). [default: freeze, or signals on a node without
    /// the freezer]
    #[arg(long, value_parser = ["freeze", "signals"])]
    method: Option<String>,
}

#[derive(clap::Args)]
pub struct KillArgs {
    /// Signal name or number (0: none, only check).
    #[arg(short, long, default_value = "KILL")]
    signal: String,
    #[command(flatten)]
    target: Target,
}

fn cpu(usec: u64) -> String {
    let s = usec / 1_000_000;
    format!(
        "{}:{:02}.{:02}",
        s / 60,
        s % 60,
        (usec % 1_000_000) / 10_000
    )
}

fn user(uid: u32) -> String {
    crate::users::name_of(uid).unwrap_or_else(|| uid.to_string())
}

/// Prints node errors; returns the worst exit code among them.
fn node_errors(nodes: &[pb::NodeJobs]) -> u8 {
    let mut code = X::OK;
    for n in nodes {
        if let Some(e) = &n.error {
            crate::fail_node(n.node, &e.message);
            code = code.max(ClientError::Remote(e.clone()).exit_code());
        }
    }
    code
}

pub async fn run(c: Client, a: Args) -> ExitCode {
    match a {
        Args::Ls(w) => list(&c, 0, &w.nodes, false).await,
        Args::Show(t) => list(&c, t.job.raw(), &t.nodes, true).await,
        Args::Tree(t) => tree(&c, &t).await,
        Args::Adopt { pid } => match c.job_adopt(pid).await {
            Ok(t) => {
                println!("{}", t.job);
                eprintln!(
                    "job {} on node {}: adopted process {pid} ({} process{})",
                    t.job,
                    t.node,
                    t.procs,
                    if t.procs == 1 { "" } else { "es" }
                );
                ExitCode::SUCCESS
            }
            Err(e) => crate::client_error(&e),
        },
        Args::Switch(w) => {
            let t = Target {
                job: w.old,
                nodes: w.nodes,
                subtree: None,
                method: w.method,
            };
            act_on(&c, A::JobSwitch, &t, 0, w.new.raw()).await
        }
        Args::Suspend(t) => act(&c, A::JobSuspend, &t, 0).await,
        Args::Resume(t) => act(&c, A::JobResume, &t, 0).await,
        Args::Kill(k) => match clan_core::parse_signal(&k.signal) {
            Some(sig) => act(&c, A::JobKill, &k.target, sig).await,
            None => {
                crate::fail(&format!("invalid signal {:?}", k.signal));
                ExitCode::from(X::USAGE)
            }
        },
    }
}

async fn list(c: &Client, job: u64, nodes: &[NodeId], show: bool) -> ExitCode {
    let answers = match c.job(A::JobList, job, nodes, 0, "").await {
        Ok(a) => a,
        Err(e) => return crate::client_error(&e),
    };
    let code = node_errors(&answers);
    let tasks: Vec<&pb::TaskInfo> = answers.iter().flat_map(|n| n.tasks.iter()).collect();
    if show && tasks.is_empty() && code == X::OK {
        crate::fail(&format!("no such job {job}"));
        return ExitCode::from(X::NOT_FOUND);
    }
    if show {
        println!(
            "{:>9} {:>4} {:<8} {:<10} {:>5} {:>5} {:>5} {:>10} {:>8} {:>8}",
            "JOB", "NODE", "USER", "STATE", "PROCS", "PEAK", "LIMIT", "TIME", "MEM", "MEMPEAK"
        );
    } else {
        println!(
            "{:>9} {:>4} {:<8} {:<10} {:>5} {:>10}",
            "JOB", "NODE", "USER", "STATE", "PROCS", "TIME"
        );
    }
    for t in &tasks {
        if show {
            let bytes = |b: u64| {
                if b == 0 {
                    "-".to_string()
                } else {
                    super::human_kb(b / 1024)
                }
            };
            let limit = if t.max_procs == 0 {
                "-".to_string()
            } else {
                t.max_procs.to_string()
            };
            println!(
                "{:>9} {:>4} {:<8} {:<10} {:>5} {:>5} {:>5} {:>10} {:>8} {:>8}",
                t.job,
                t.node,
                user(t.uid),
                t.state,
                t.procs,
                t.peak_procs,
                limit,
                cpu(t.cpu_usec),
                bytes(t.mem_bytes),
                bytes(t.mem_peak_bytes)
            );
        } else {
            println!(
                "{:>9} {:>4} {:<8} {:<10} {:>5} {:>10}",
                t.job,
                t.node,
                user(t.uid),
                t.state,
                t.procs,
                cpu(t.cpu_usec)
            );
        }
    }
    if show && tasks.len() > 1 {
        let procs: u32 = tasks.iter().map(|t| t.procs).sum();
        let cpu_usec: u64 = tasks.iter().map(|t| t.cpu_usec).sum();
        println!(
            "{:>9} {:>4} {:<8} {:<10} {:>5} {:>5} {:>5} {:>10}",
            "total",
            tasks.len(),
            "",
            "",
            procs,
            "",
            "",
            cpu(cpu_usec)
        );
    }
    ExitCode::from(code)
}

async fn act(c: &Client, action: A, t: &Target, sig: i32) -> ExitCode {
    act_on(c, action, t, sig, 0).await
}

async fn act_on(c: &Client, action: A, t: &Target, sig: i32, resume: u64) -> ExitCode {
    let req = pb::JobRequest {
        resume,
        action: action as i32,
        job: t.job.raw(),
        nodes: t.nodes.iter().map(|n| n.get()).collect(),
        signal: sig,
        method: t.method.clone().unwrap_or_default(),
        subtree: t.subtree.map(|g| g.raw()).unwrap_or(0),
        ..Default::default()
    };
    let answers = match c.job_request(req).await {
        Ok(a) => a,
        Err(e) => return crate::client_error(&e),
    };
    let mut code = node_errors(&answers);
    let mut any = false;
    let subtree = t
        .subtree
        .map(|g| format!(", subtree {g}"))
        .unwrap_or_default();
    for task in answers.iter().flat_map(|n| n.tasks.iter()) {
        any = true;
        let plural = if task.procs == 1 { "" } else { "es" };
        if action == A::JobKill && sig == 0 {
            println!(
                "job {} on node {}{subtree}: {} process{plural} (signal 0: none sent)",
                task.job, task.node, task.procs
            );
            continue;
        }
        // A switch reports the task it suspended and the one it resumed.
        let action = match action {
            A::JobSwitch if task.job == t.job.raw() => A::JobSuspend,
            A::JobSwitch => A::JobResume,
            a => a,
        };
        let (done, already) = match action {
            A::JobSuspend if task.procs == 0 => ("", "has no process left"),
            A::JobResume if task.procs == 0 => ("", "has no process left"),
            A::JobSuspend => ("suspended", "already suspended"),
            A::JobResume => ("resumed", "not suspended"),
            _ if sig == libc::SIGKILL => ("killed", "had no process"),
            _ => ("signalled", "had no process"),
        };
        if task.procs == 0 {
            println!("job {} on node {}{subtree}: {already}", task.job, task.node);
        } else {
            // How long the node took, verified (no round trip): what a switch costs it.
            let took = if task.changed && task.took_ns > 0 {
                format!(" in {:.2} ms", task.took_ns as f64 / 1e6)
            } else {
                String::new()
            };
            println!(
                "job {} on node {}{subtree}: {} ({} process{plural}){took}",
                task.job,
                task.node,
                if task.changed { done } else { already },
                task.procs,
            );
        }
        if !task.pids.is_empty() {
            crate::fail(&format!(
                "job {} on node {}: processes still there after the kill: {:?}",
                task.job, task.node, task.pids
            ));
            code = code.max(X::FAILURE);
        }
    }
    if resume != 0
        && code == X::OK
        && !answers
            .iter()
            .flat_map(|n| n.tasks.iter())
            .any(|t| t.job == resume)
    {
        crate::fail(&format!(
            "no such job {resume} (no process of it on the nodes asked)"
        ));
        return ExitCode::from(X::NOT_FOUND);
    }
    if !any && code == X::OK {
        crate::fail(&format!(
            "no such job {} (no process of it on any node: finished, or never started)",
            t.job
        ));
        return ExitCode::from(X::NOT_FOUND);
    }
    ExitCode::from(code)
}

async fn tree(c: &Client, t: &Target) -> ExitCode {
    let answers = match c.job(A::JobTree, t.job.raw(), &t.nodes, 0, "").await {
        Ok(a) => a,
        Err(e) => return crate::client_error(&e),
    };
    let code = node_errors(&answers);
    let tasks: Vec<&pb::TaskInfo> = answers.iter().flat_map(|n| n.tasks.iter()).collect();
    if tasks.is_empty() && code == X::OK {
        crate::fail(&format!("no such job {}", t.job));
        return ExitCode::from(X::NOT_FOUND);
    }
    for task in tasks {
        println!("job {} on node {}:", task.job, task.node);
        let known: std::collections::HashSet<u64> = task.tree.iter().map(|p| p.gpid).collect();
        // Each process once, whatever the links say (a cycle, a gpid listed twice: a
        // reply that changed meanwhile, or a daemon that got numbers wrong, must not make
        // the walk endless).
        type Seen = std::collections::HashSet<u64>;
        fn walk(all: &[pb::TreeProc], at: u64, depth: usize, seen: &mut Seen) {
            for p in all.iter().filter(|p| p.parent == at) {
                if !seen.insert(p.gpid) {
                    continue;
                }
                println!("  {}{} {}", "  ".repeat(depth), p.gpid, p.cmd);
                walk(all, p.gpid, depth + 1, seen);
            }
        }
        let mut seen = Seen::new();
        // Roots: no parent, or a parent that left the listing meanwhile; then whatever
        // only a cycle leads to.
        let roots = task
            .tree
            .iter()
            .filter(|p| p.parent == 0 || !known.contains(&p.parent))
            .chain(task.tree.iter());
        for r in roots {
            if !seen.insert(r.gpid) {
                continue;
            }
            println!("  {} {}", r.gpid, r.cmd);
            walk(&task.tree, r.gpid, 1, &mut seen);
        }
    }
    ExitCode::from(code)
}
