//! The protocol's decoders on malformed input (DESIGN.md 18): random bytes, and valid
//! frames with bytes changed and cut, give an error or a value, never a panic; a
//! handshake of random bytes ends in a refusal, never a hang.

use clan_proto::auth::{self, Identity};
use clan_proto::pb::{self, local_request::Op, peer_frame::Frame, peer_request};
use clan_proto::{read_frame_sync, FrameError};
use proptest::collection::vec;
use proptest::prelude::*;
use prost::Message;
use std::time::Duration;

/// Valid messages of every kind a node or a client decodes, with nested fields.
fn samples() -> Vec<Vec<u8>> {
    let spec = pb::ProcSpec {
        argv: vec![b"sh".to_vec(), b"-c".to_vec(), b"exit 7".to_vec()],
        env: vec![b"A=1".to_vec()],
        cwd: b"/tmp".to_vec(),
        tty: true,
        rows: 24,
        cols: 80,
        ..Default::default()
    };
    let creds = pb::Creds {
        uid: 1000,
        gid: 1000,
        groups: vec![27, 100],
        pid: 4711,
        node: 2,
        pgid: 20000003,
        sid: 20000001,
        start: 99,
        job: 1000001,
        ruid: Some(1000),
        cap_eff: Some(0),
    };
    let proc_req = pb::ProcRequest {
        op: pb::ProcOp::ProcRead as i32,
        gpid: 20000009,
        path: "task/20000009/status".into(),
        reader: Some(creds.clone()),
        ..Default::default()
    };
    vec![
        pb::LocalRequest {
            id: 7,
            op: Some(Op::Run(pb::RunRequest {
                spec: Some(spec.clone()),
                node: 2,
                count: 3,
                ..Default::default()
            })),
        }
        .encode_to_vec(),
        pb::LocalRequest {
            id: 8,
            op: Some(Op::Kill(pb::KillRequest {
                gpids: vec![20000009, 30000001],
                signal: 15,
                queued: Some(pb::Queued { value: -5 }),
            })),
        }
        .encode_to_vec(),
        pb::LocalRequest {
            id: 9,
            op: Some(Op::Proc(proc_req.clone())),
        }
        .encode_to_vec(),
        pb::LocalRequest {
            id: 10,
            op: Some(Op::Link(pb::LinkRequest { node: 3 })),
        }
        .encode_to_vec(),
        pb::LocalReply {
            id: 9,
            reply: Some(pb::local_reply::Reply::Proc(pb::ProcReply {
                data: b"Name:\tsleep\n".to_vec(),
                entries: vec![pb::DirEntry {
                    name: "fd".into(),
                    mode: 0o40500,
                    uid: 0,
                    gid: 0,
                }],
                ..Default::default()
            })),
        }
        .encode_to_vec(),
        pb::PeerFrame {
            frame: Some(Frame::Request(pb::PeerRequest {
                id: 5,
                creds: None,
                op: Some(peer_request::Op::Proc(pb::ProcRequest {
                    op: pb::ProcOp::ProcStatLink as i32,
                    gpid: 20000009,
                    path: "task/20000009/fd".into(),
                    link: "pipe:[123]".into(),
                    hint: "1".into(),
                    start_ticks: 99,
                    ..Default::default()
                })),
            })),
        }
        .encode_to_vec(),
        pb::PeerFrame {
            frame: Some(Frame::Reply(pb::PeerReply {
                id: 5,
                reply: Some(pb::peer_reply::Reply::Proc(pb::ProcReply {
                    stat: Some(Box::new(pb::LinkStat {
                        mode: 0o10600,
                        ino: 123,
                        dev: 15,
                        nlink: 1,
                        uid: 1000,
                        gid: 1000,
                        atime: -1,
                        mtime_nsec: 999_999_999,
                        name: "1".into(),
                        ..Default::default()
                    })),
                    start_ticks: 99,
                    ..Default::default()
                })),
            })),
        }
        .encode_to_vec(),
        pb::PeerFrame {
            frame: Some(Frame::Hello(pb::Hello {
                version: clan_proto::VERSION,
                node: 2,
                incarnation: 5,
                nonce: vec![1; 16],
                proof: vec![2; 32],
                kind: pb::ConnKind::Client as i32,
                cluster: "c".into(),
                creds: Some(creds.clone()),
            })),
        }
        .encode_to_vec(),
        pb::PeerFrame {
            frame: Some(Frame::Request(pb::PeerRequest {
                id: 3,
                creds: Some(creds.clone()),
                op: Some(peer_request::Op::Spawn(pb::SpawnRequest {
                    spec: Some(spec),
                    creds: Some(creds),
                    job: 1000001,
                    rank: 1,
                    size: 2,
                    parent_node: 1,
                    parent: 10000004,
                })),
            })),
        }
        .encode_to_vec(),
        pb::PeerFrame {
            frame: Some(Frame::Request(pb::PeerRequest {
                id: 4,
                creds: None,
                op: Some(peer_request::Op::Proc(proc_req)),
            })),
        }
        .encode_to_vec(),
        pb::SessionInput {
            gpid: 20000009,
            input: Some(pb::session_input::Input::Stdin(b"hello".to_vec())),
        }
        .encode_to_vec(),
        pb::SessionOutput {
            gpid: 20000009,
            output: Some(pb::session_output::Output::Exited(pb::ExitStatus {
                code: 7,
                ..Default::default()
            })),
        }
        .encode_to_vec(),
    ]
}

/// Every decoder a node or a client runs on what it reads, and what is done with the
/// decoded value right after (enum and exit status conversions).
fn decode_all(bytes: &[u8]) {
    if let Ok(r) = pb::LocalRequest::decode(bytes) {
        if let Some(Op::Proc(p)) = r.op {
            let _ = pb::ProcOp::try_from(p.op);
        }
    }
    if let Ok(r) = pb::LocalReply::decode(bytes) {
        if let Some(pb::local_reply::Reply::Error(e)) = r.reply {
            let _ = e.kind();
        }
    }
    if let Ok(f) = pb::PeerFrame::decode(bytes) {
        if let Some(Frame::Hello(h)) = f.frame {
            let _ = pb::ConnKind::try_from(h.kind);
        }
    }
    if let Ok(o) = pb::SessionOutput::decode(bytes) {
        if let Some(pb::session_output::Output::Exited(s)) = o.output {
            let w = clan_core::WaitStatus::from(s);
            let _ = (w.shell_code(), w.describe());
        }
    }
    let _ = pb::SessionInput::decode(bytes);
    let _ = pb::ShepherdIn::decode(bytes);
    let _ = pb::ShepherdOut::decode(bytes);
    let _ = pb::ShepherdSpec::decode(bytes);
    // Framed: a length prefix, then the body.
    let framed: Result<Option<pb::LocalRequest>, FrameError> = read_frame_sync(&mut &bytes[..]);
    let _ = framed;
    let framed: Result<Option<pb::PeerFrame>, FrameError> = read_frame_sync(&mut &bytes[..]);
    let _ = framed;
}

fn with_prefix(body: &[u8]) -> Vec<u8> {
    let mut v = (body.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn me() -> Identity {
    Identity {
        node: 1,
        incarnation: 1,
        cluster: "c".into(),
        kind: pb::ConnKind::Control,
        creds: None,
    }
}

proptest! {
    // No regression files written into the source tree.
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::with_cases(2000) })]

    #[test]
    fn random_bytes_decode_or_fail(bytes in vec(any::<u8>(), 0..2048)) {
        decode_all(&bytes);
        decode_all(&with_prefix(&bytes));
    }

    #[test]
    fn changed_and_cut_frames_decode_or_fail(
        which in any::<usize>(),
        edits in vec((any::<usize>(), any::<u8>()), 1..8),
        cut in any::<usize>(),
    ) {
        let all = samples();
        let mut b = all[which % all.len()].clone();
        for (at, v) in edits {
            let i = at % b.len();
            b[i] = v;
        }
        b.truncate(cut % (b.len() + 1));
        decode_all(&b);
        decode_all(&with_prefix(&b));
    }
}

proptest! {
    // No regression files written into the source tree.
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::with_cases(300) })]

    /// What a stranger sends to a node's port: refused, at the end of its bytes at the
    /// latest (a node that waits for more is bounded by its own timeout elsewhere).
    #[test]
    fn a_handshake_of_random_bytes_is_refused(
        bytes in vec(any::<u8>(), 0..1024),
        framed in any::<bool>(),
    ) {
        let input = if framed { with_prefix(&bytes) } else { bytes };
        let res = rt().block_on(async move {
            let (mut a, b) = tokio::io::duplex(1 << 16);
            tokio::io::AsyncWriteExt::write_all(&mut a, &input).await.unwrap();
            drop(a);
            let (r, w) = tokio::io::split(b);
            tokio::time::timeout(
                Duration::from_secs(5),
                auth::accept(r, w, b"0123456789abcdef", &me()),
            )
            .await
        });
        prop_assert!(matches!(res, Ok(Err(_))), "not refused: {:?}", res.map(|r| r.is_ok()));
    }

    /// Frames on an authenticated connection that were not made with its key fail their
    /// MAC (or end the stream), whatever they hold.
    #[test]
    fn frames_without_the_session_key_are_refused(
        bodies in vec(vec(any::<u8>(), 32..256), 1..4),
    ) {
        let mut input = Vec::new();
        for b in &bodies {
            input.extend(with_prefix(b));
        }
        let res = rt().block_on(async move {
            let (rd, _) = auth::resume(&input[..], tokio::io::sink(), &[7u8; 32], 0, 0)
                .expect("a 32-byte key");
            let mut rd = rd;
            rd.read().await
        });
        prop_assert!(
            matches!(res, Err(FrameError::BadMac)),
            "a forged frame was not refused for its MAC: {res:?}"
        );
    }
}
