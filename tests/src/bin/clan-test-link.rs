//! Requests on a direct link (docs/links.md) as whoever runs it, for the end-to-end tests
//! (tests/tests/foundation.rs): the client of node `CLAN_NODE` under `CLAN_DIR` opens a link
//! to NODE at once and sends one request on it.
//!
//! `clan-test-link NODE kill GPID SIG` and `clan-test-link NODE read GPID FILE`: prints
//! `ok` (a read: `ok` and the file), or `error CODE: MESSAGE`; exits 0 either way, 1 when
//! no link could be had.

use clan_client::{pb, Client, ClientError};
use clan_core::{Gpid, NodeId};
use std::process::ExitCode;

fn main() -> ExitCode {
    let a: Vec<String> = std::env::args().collect();
    let (Some(node), Some(what), Some(gpid), Some(arg)) = (
        a.get(1).and_then(|s| s.parse::<NodeId>().ok()),
        a.get(2),
        a.get(3).and_then(|s| s.parse::<Gpid>().ok()),
        a.get(4),
    ) else {
        eprintln!("usage: clan-test-link NODE kill GPID SIG | NODE read GPID FILE");
        return ExitCode::from(2);
    };
    let op = match what.as_str() {
        "kill" => pb::peer_request::Op::Signal(pb::SignalRequest {
            gpid: gpid.raw(),
            signal: arg.parse().unwrap_or(0),
            queued: None,
        }),
        _ => pb::peer_request::Op::Proc(pb::ProcRequest {
            op: pb::ProcOp::ProcRead as i32,
            gpid: gpid.raw(),
            path: arg.clone(),
            ..Default::default()
        }),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let res = rt.block_on(async {
        let client = Client::locate(None, None)?;
        client.link_request(node, op).await
    });
    match res {
        Ok(pb::peer_reply::Reply::Proc(p)) => {
            println!("ok\n{}", String::from_utf8_lossy(&p.data));
        }
        Ok(_) => println!("ok"),
        Err(ClientError::Remote(e)) => println!("error {:?}: {}", e.kind(), e.message),
        Err(e) => {
            eprintln!("clan-test-link: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
