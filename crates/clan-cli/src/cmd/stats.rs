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
    /// Per node, the number of entries in each of the daemon's tables.
    Tables {
        /// Only these nodes.
        #[arg(long = "node")]
        nodes: Vec<NodeId>,
    },
}

pub async fn run(c: Client, a: Args) -> ExitCode {
    let nodes = match a.what {
        What::Locks { nodes } => nodes,
        What::Tables { nodes } => return tables(c, &nodes).await,
    };
    match c.lock_stats(&nodes).await {
        Ok(stats) => {
            let mut code = ExitCode::SUCCESS;
            println!(
                "{:<5} {:<18} {:>12} {:>10} {:>12} {:>12}",
                "NODE", "LOCK", "ACQUIRED", "CONTENDED", "WAIT_US", "MAX_WAIT_US"
            );
            for n in stats {
                if !n.error.is_empty() {
                    crate::fail_node(n.node, &n.error);
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

async fn tables(c: Client, nodes: &[NodeId]) -> ExitCode {
    match c.lock_stats(nodes).await {
        Ok(stats) => {
            let mut code = ExitCode::SUCCESS;
            println!("{:<5} {:<18} {:>10}", "NODE", "TABLE", "ENTRIES");
            for n in stats {
                if !n.error.is_empty() {
                    crate::fail_node(n.node, &n.error);
                    code = ExitCode::from(clan_core::ExitCode::NODE_DOWN);
                }
                for t in n.tables {
                    println!("{:<5} {:<18} {:>10}", n.node, t.name, t.entries);
                }
            }
            code
        }
        Err(e) => crate::client_error(&e),
    }
}
