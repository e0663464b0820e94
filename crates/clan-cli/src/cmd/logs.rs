use clan_client::Client;
use clan_core::{ExitCode as X, Gpid};
use std::io::Write;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// A process started with `clan run -d`.
    gpid: String,
    /// Keep printing output until the process exits (without it: what the log holds now).
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
    // Positions in the process's output (a log keeps its newest `log_max_bytes`: what is
    // older was dropped, and the node answers from the oldest byte kept).
    let mut offset = 0;
    // Without -f: up to where the log ended when the command started, so that the log of a
    // process that writes on is printed and done.
    let mut stop: Option<u64> = None;
    let mut out = std::io::stdout().lock();
    loop {
        match c.logs(g, offset, a.follow).await {
            Ok(chunk) => {
                // An older node says neither where the bytes start nor where the log ends.
                let at = chunk.at.max(offset);
                if !a.follow && stop.is_none() && chunk.size > 0 {
                    stop = Some(chunk.size);
                }
                let mut data = &chunk.data[..];
                if let Some(s) = stop {
                    data = &data[..(s.saturating_sub(at).min(data.len() as u64)) as usize];
                }
                offset = at + chunk.data.len() as u64;
                if out.write_all(data).and_then(|_| out.flush()).is_err() {
                    return ExitCode::SUCCESS; // a closed pipe is not an error
                }
                let read_all = stop.is_some_and(|s| offset >= s);
                if chunk.end || (!a.follow && (chunk.data.is_empty() || read_all)) {
                    return ExitCode::SUCCESS;
                }
            }
            Err(e) => return crate::client_error(&e),
        }
    }
}
