//! `clan sigsend -s SIG EXPR` (Solaris's sigsendset) and the group and session forms of
//! `clan kill`, which are the expressions `pgid=G` and `sid=S`.

use clan_client::{Client, ClientError};
use clan_core::{sigset, ExitCode as X};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Signal name or number (TERM, SIGKILL, 9, RTMIN+1).
    #[arg(short, long, default_value = "TERM")]
    signal: String,
    /// The set: predicates pid=G, pgid=G, sid=G, uid=U|NAME, job=J, node=N or `all`, combined
    /// with and, or, not (&&, ||, !) and parentheses; gpids as 30004711 or 3:4711.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    expr: Vec<String>,
}

fn user_id(name: &str) -> Option<u32> {
    crate::users::uid_of(name)
}

pub async fn run(c: Client, a: Args) -> ExitCode {
    let Some(sig) = clan_core::parse_signal(&a.signal) else {
        crate::fail(&format!("invalid signal {:?}", a.signal));
        return ExitCode::from(X::USAGE);
    };
    let text = a.expr.join(" ");
    let expr = match sigset::parse_with(&text, &user_id) {
        Ok(e) => e,
        Err(e) => {
            crate::fail(&format!("set expression {text:?} {e}"));
            crate::fail(&format!(
                "  {text}\n        {}^",
                " ".repeat(e.column.saturating_sub(1))
            ));
            return ExitCode::from(X::USAGE);
        }
    };
    send(
        &c,
        &expr.to_string(),
        sig,
        &format!("process matches {text:?}"),
    )
    .await
}

/// Sends `sig` to the set `expr`, prints every refusal and unreachable node, and returns the
/// exit code: 0 when every match got it, 3 when nothing matched (`none` names what), else
/// the worst failure's code (4 permission, 5 node down).
pub async fn send(c: &Client, expr: &str, sig: i32, none: &str) -> ExitCode {
    match c.sigsend(expr, sig).await {
        Ok(results) => {
            let mut code = X::OK;
            let mut matched = false;
            for (g, r) in results {
                matched |= g.is_some();
                if let Err(e) = r {
                    crate::fail(&e);
                    code = code.max(ClientError::Remote(e).exit_code());
                }
            }
            if !matched && code == X::OK {
                crate::fail(&format!("no {none}"));
                return ExitCode::from(X::NOT_FOUND);
            }
            ExitCode::from(code)
        }
        Err(e) => crate::client_error(&e),
    }
}
