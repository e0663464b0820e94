use clan_client::Client;
use std::process::ExitCode;

pub async fn run(c: Client) -> ExitCode {
    match c.nodes().await {
        Ok(nodes) => {
            println!(
                "{:<5} {:<8} {:<21} {:>6} {:>6}  MEM",
                "NODE", "STATE", "ADDR", "LOAD", "PROCS"
            );
            for n in nodes {
                let mem = if n.state == "dead" {
                    "-".to_string()
                } else {
                    format!(
                        "{}/{}",
                        super::human_kb(n.mem_used_kb),
                        super::human_kb(n.mem_total_kb)
                    )
                };
                println!(
                    "{:<5} {:<8} {:<21} {:>6.2} {:>6}  {}",
                    n.id, n.state, n.addr, n.load, n.procs, mem
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => crate::client_error(&e),
    }
}
