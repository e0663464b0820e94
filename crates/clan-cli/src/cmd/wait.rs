use clan_client::{Client, WaitOutcome};
use clan_core::Gpid;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Also report a stop (as waitpid's WUNTRACED).
    #[arg(short = 'u', long)]
    untraced: bool,
    /// Also report a continue (as waitpid's WCONTINUED).
    #[arg(short = 'c', long)]
    continued: bool,
    /// Processes started with `clan run -d` (gpid or NODE:PID).
    #[arg(required = true)]
    gpids: Vec<String>,
}

/// Prints one line per process; exits with the last one's shell status (exit code or
/// 128+signal, 128+signal for a stop too), or 127 when some process could not be waited
/// for, as bash's `wait`.
pub async fn run(c: Client, a: Args) -> ExitCode {
    let mut gpids = Vec::new();
    let mut failed = false;
    for g in &a.gpids {
        match g.parse::<Gpid>() {
            Ok(g) => gpids.push(g),
            Err(e) => {
                crate::fail(&e);
                failed = true;
            }
        }
    }
    let mut last = 0;
    if !gpids.is_empty() {
        match c.wait_for(&gpids, a.untraced, a.continued).await {
            Ok(results) => {
                for (g, r) in results {
                    match r {
                        Ok(WaitOutcome::Stopped(sig)) => {
                            println!("{g}: stopped by SIG{}", clan_core::signal_name(sig));
                            last = 128 + (sig & 0x7f);
                        }
                        Ok(WaitOutcome::Continued) => {
                            println!("{g}: continued");
                            last = 0;
                        }
                        Ok(WaitOutcome::Exited(s)) => {
                            println!(
                                "{g}: {} (user {:.3}s sys {:.3}s)",
                                s.describe(),
                                s.utime_us as f64 / 1e6,
                                s.stime_us as f64 / 1e6
                            );
                            last = s.shell_code();
                        }
                        Err(e) => {
                            crate::fail(&e);
                            failed = true;
                        }
                    }
                }
            }
            Err(e) => return crate::client_error(&e),
        }
    }
    if failed {
        ExitCode::from(127)
    } else {
        ExitCode::from(last.clamp(0, 255) as u8)
    }
}
