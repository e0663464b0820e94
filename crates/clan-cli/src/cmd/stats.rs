use clan_client::Client;
use clan_core::NodeId;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// Per node, each named lock's acquisitions, contended acquisitions and wait time.
    Locks {
        /// Only these nodes.
        #[arg(long = "node")]
        nodes: Vec<NodeId>,
    },
}

pub async fn run(c: Client, a: Args) -> ExitCode {
    let What::Locks { nodes } = a.what;
    match c.lock_stats(&nodes).await {
        Ok(stats) => {
            let mut code = ExitCode::SUCCESS;
            println!(
                "{:<5} {:<18} {:>12} {:>10} {:>12} {:>12}",
                "NODE", "LOCK", "ACQUIRED", "CONTENDED", "WAIT_US", "MAX_WAIT_US"
            );
            for n in stats {
                if !n.error.is_empty() {
                    crate::fail(&format!("node {}: {}", n.node, n.error));
                    code = ExitCode::from(clan_core::ExitCode::NODE_DOWN);
                }
                for l in n.locks {
                    println!(
                        "{:<5} {:<18} {:>12} {:>10} {:>12} {:>12}",
                        n.node,
                        l.name,
                        l.acquisitions,
                        l.contended,
                        l.wait_ns / 1000,
                        l.max_wait_ns / 1000
                    );
                }
            }
            code
        }
        Err(e) => crate::client_error(&e),
    }
}
