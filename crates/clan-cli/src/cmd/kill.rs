use clan_client::Client;
use clan_core::{ExitCode as X, Gpid};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Signal name or number (TERM, SIGKILL, 9, RTMIN+1).
    #[arg(short, long, default_value = "TERM")]
    signal: String,
    /// Signal every member of this process group, on every node.
    #[arg(short = 'g', long = "group", value_name = "PGID", conflicts_with_all = ["session", "gpids"])]
    group: Option<String>,
    /// Signal every process of this session, on every node.
    #[arg(long, value_name = "SID", conflicts_with = "gpids")]
    session: Option<String>,
    /// Queue the signal with this value, as sigqueue(3) (the receiver's siginfo has
    /// SI_QUEUE and the value); not with -g or --session.
    #[arg(long, value_name = "N", conflicts_with_all = ["group", "session"], allow_negative_numbers = true)]
    value: Option<i64>,
    /// Processes: gpids (30004711) or NODE:PID (3:4711).
    #[arg(required_unless_present_any = ["group", "session"])]
    gpids: Vec<String>,
}

pub async fn run(c: Client, a: Args) -> ExitCode {
    let Some(sig) = clan_core::parse_signal(&a.signal) else {
        crate::fail(&format!("invalid signal {:?}", a.signal));
        return ExitCode::from(X::USAGE);
    };
    for (key, what, id) in [
        ("pgid", "process group", &a.group),
        ("sid", "session", &a.session),
    ] {
        let Some(id) = id else { continue };
        return match id.parse::<Gpid>() {
            Ok(g) => {
                let none = format!("{what} {g}");
                crate::cmd::sigsend::send(&c, &format!("{key}={}", g.raw()), sig, &none).await
            }
            Err(e) => {
                crate::fail(&e);
                ExitCode::from(X::NOT_FOUND)
            }
        };
    }
    let mut code = X::OK;
    let mut gpids = Vec::new();
    for g in &a.gpids {
        match g.parse::<Gpid>() {
            Ok(g) => gpids.push(g),
            Err(e) => {
                crate::fail(&e);
                code = X::NOT_FOUND;
            }
        }
    }
    if gpids.is_empty() {
        return ExitCode::from(code);
    }
    let sent = match a.value {
        Some(v) => c.sigqueue(&gpids, sig, v).await,
        None => c.kill(&gpids, sig).await,
    };
    match sent {
        Ok(results) => {
            for (_, r) in results {
                if let Err(e) = r {
                    crate::fail(&e);
                    let err = clan_client::ClientError::Remote(e);
                    code = code.max(err.exit_code());
                }
            }
            ExitCode::from(code)
        }
        Err(e) => crate::client_error(&e),
    }
}
