use clan_client::{pb, Client};
use clan_core::{ExitCode as X, NodeId};
use std::io::Write;
use std::process::ExitCode;

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

#[derive(clap::Args)]
pub struct Args {
    /// Only these nodes (repeatable).
    #[arg(long = "node")]
    nodes: Vec<NodeId>,
    /// Only processes of this job.
    #[arg(long)]
    job: Option<u64>,
    /// Only processes of this user (name or uid).
    #[arg(short, long)]
    user: Option<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    format: Format,
}

fn time(ms: u64) -> String {
    let s = ms / 1000;
    format!("{}:{:02}", s / 60, s % 60)
}

pub async fn run(c: Client, a: Args) -> ExitCode {
    let mut filter = pb::PsFilter {
        job: a.job.unwrap_or(0),
        ..Default::default()
    };
    if let Some(u) = &a.user {
        let uid = u.parse::<u32>().ok().or_else(|| crate::users::uid_of(u));
        match uid {
            Some(uid) => {
                filter.has_uid = true;
                filter.uid = uid;
            }
            None => {
                crate::fail(&format!("no such user {u}"));
                return ExitCode::from(X::NOT_FOUND);
            }
        }
    }
    let nodes = match c.ps(filter, &a.nodes).await {
        Ok(n) => n,
        Err(e) => return crate::client_error(&e),
    };
    let mut code = X::OK;
    let mut procs = Vec::new();
    for n in nodes {
        if !n.error.is_empty() {
            crate::fail_node(n.node, &n.error);
            code = X::NODE_DOWN;
        }
        procs.extend(n.procs);
    }
    let mut out = std::io::stdout().lock();
    let res = match a.format {
        Format::Json => {
            let v: Vec<_> = procs
                .iter()
                .map(|p| {
                    serde_json::json!({
                        "gpid": p.gpid, "node": p.node, "uid": p.uid, "user": p.user, "state": p.state,
                        "cpu_ms": p.cpu_ms, "rss_kb": p.rss_kb, "cmd": p.cmd, "ppid": p.ppid, "job": p.job,
                        "managed": p.managed, "pgid": p.pgid, "sid": p.sid,
                    })
                })
                .collect();
            writeln!(out, "{}", serde_json::Value::Array(v))
        }
        Format::Table => (|| {
            writeln!(
                out,
                "{:>9} {:>4} {:<8} {:<4} {:>7} {:>8} {:>8} CMD",
                "GPID", "NODE", "USER", "STAT", "TIME", "RSS", "JOB"
            )?;
            for p in &procs {
                let job = if p.job == 0 {
                    "-".to_string()
                } else {
                    p.job.to_string()
                };
                writeln!(
                    out,
                    "{:>9} {:>4} {:<8} {:<4} {:>7} {:>8} {:>8} {}",
                    p.gpid,
                    p.node,
                    p.user,
                    p.state,
                    time(p.cpu_ms),
                    p.rss_kb,
                    job,
                    p.cmd
                )?;
            }
            Ok(())
        })(),
    };
    if res.is_err() {
        return ExitCode::SUCCESS; // a closed pipe is not an error
    }
    ExitCode::from(code)
}
