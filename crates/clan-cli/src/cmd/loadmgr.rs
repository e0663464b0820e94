use clan_client::{pb::load_mgr_request::Action, pb::LoadMgrRegister, Client};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// Ask this program (JSON on stdin, a node id on stdout) or service for each placement.
    Register {
        /// A service listening on this Unix socket instead of a program.
        #[arg(long, conflicts_with = "command")]
        socket: Option<String>,
        /// The program and its arguments.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Go back to round-robin placement.
    Unregister,
    /// Show the registered load manager.
    Show,
}

pub async fn run(c: Client, a: Args) -> ExitCode {
    let action = match a.what {
        What::Register { socket, command } => {
            if socket.is_none() && command.is_empty() {
                crate::fail(&"register needs --socket PATH or -- COMMAND");
                return ExitCode::from(clan_core::ExitCode::USAGE);
            }
            Action::Register(LoadMgrRegister {
                command,
                socket: socket.unwrap_or_default(),
            })
        }
        What::Unregister => Action::Unregister(true),
        What::Show => Action::Show(true),
    };
    match c.loadmgr(action).await {
        Ok(d) if d.is_empty() => {
            println!("node {}: no load manager (round-robin)", c.node());
            ExitCode::SUCCESS
        }
        Ok(d) => {
            println!("node {}: {d}", c.node());
            ExitCode::SUCCESS
        }
        Err(e) => crate::client_error(&e),
    }
}
