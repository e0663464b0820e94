//! Requests on a direct link (docs/links.md) as whoever runs it, for the end-to-end tests
//! (tests/tests/foundation.rs): the client of node `CLAN_NODE` under `CLAN_DIR` opens a link
//! to NODE at once and sends one request on it.
//!
//! `clan-test-link NODE kill GPID SIG` and `clan-test-link NODE read GPID FILE`: prints
//! `ok` (a read: `ok` and the file), or `error CODE: MESSAGE`; exits 0 either way, 1 when
//! no link could be had.
//!
//! `clan-test-link NODE many GPID N`: N clients each open a link to NODE with `kill -0
//! GPID`, then each signals 0 again the ordinary way (on its link, or through cland);
//! prints `links L`, the first refusal's message if any (`refused MESSAGE`) and `signals
//! S` (those that succeeded), then waits for its stdin to close, keeping the links.

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
    if what == "many" {
        return many(node, gpid, arg.parse().unwrap_or(0));
    }
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

fn many(node: NodeId, gpid: Gpid, n: usize) -> ExitCode {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let zero = || {
        pb::peer_request::Op::Signal(pb::SignalRequest {
            gpid: gpid.raw(),
            signal: 0,
            queued: None,
        })
    };
    rt.block_on(async {
        let mut clients = Vec::new();
        let (mut links, mut refused) = (0, None);
        for _ in 0..n {
            let Ok(c) = Client::locate(None, None) else {
                eprintln!("clan-test-link: no cland");
                return ExitCode::FAILURE;
            };
            match c.link_request(node, zero()).await {
                Ok(_) => links += 1,
                Err(e) => {
                    refused.get_or_insert_with(|| e.to_string());
                }
            }
            clients.push(c);
        }
        let mut signals = 0;
        for c in &clients {
            if c.kill_one(gpid, 0).await.is_ok() {
                signals += 1;
            }
        }
        println!("links {links}");
        if let Some(r) = refused {
            println!("refused {r}");
        }
        println!("signals {signals}");
        use std::io::{Read, Write};
        let _ = std::io::stdout().flush();
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        ExitCode::SUCCESS
    })
}
