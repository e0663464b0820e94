use clan_client::Client;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    format: super::ps::Format,
}

pub async fn run(c: Client, a: Args) -> ExitCode {
    match c.nodes().await {
        Ok(nodes) if matches!(a.format, super::ps::Format::Json) => {
            let v: Vec<_> = nodes
                .iter()
                .map(|n| {
                    serde_json::json!({
                        "id": n.id, "state": n.state, "addr": n.addr, "load": n.load,
                        "procs": n.procs, "mem_used_kb": n.mem_used_kb,
                        "mem_total_kb": n.mem_total_kb, "incarnation": n.incarnation,
                    })
                })
                .collect();
            println!("{}", serde_json::Value::Array(v));
            ExitCode::SUCCESS
        }
        Ok(nodes) => {
            println!(
                "{:<5} {:<9} {:<21} {:>6} {:>6}  MEM",
                "NODE", "STATE", "ADDR", "LOAD", "PROCS"
            );
            for n in nodes {
                let mem = if n.state == "dead" || n.state == "away" {
                    "-".to_string()
                } else {
                    format!(
                        "{}/{}",
                        super::human_kb(n.mem_used_kb),
                        super::human_kb(n.mem_total_kb)
                    )
                };
                println!(
                    "{:<5} {:<9} {:<21} {:>6.2} {:>6}  {}",
                    n.id, n.state, n.addr, n.load, n.procs, mem
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => crate::client_error(&e),
    }
}
