use clan_client::Client;
use clan_core::{ExitCode as X, Gpid};
use std::io::Write;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// A process started with `clan run -d`.
    gpid: String,
    /// Keep printing output until the process exits.
    #[arg(short, long)]
    follow: bool,
}

pub async fn run(c: Client, a: Args) -> ExitCode {
    let g: Gpid = match a.gpid.parse() {
        Ok(g) => g,
        Err(e) => {
            crate::fail(&e);
            return ExitCode::from(X::NOT_FOUND);
        }
    };
    let mut offset = 0;
    let mut out = std::io::stdout().lock();
    loop {
        match c.logs(g, offset, a.follow).await {
            Ok(chunk) => {
                offset += chunk.data.len() as u64;
                if out
                    .write_all(&chunk.data)
                    .and_then(|_| out.flush())
                    .is_err()
                {
                    return ExitCode::SUCCESS; // a closed pipe is not an error
                }
                if chunk.end || (!a.follow && chunk.data.is_empty()) {
                    return ExitCode::SUCCESS;
                }
            }
            Err(e) => return crate::client_error(&e),
        }
    }
}
