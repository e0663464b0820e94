//! clan-core's parsers on malformed input (DESIGN.md 18): anything a user types or a
//! peer sends gives an error or a value, never a panic.

use clan_core::sigset::{self, Attrs};
use clan_core::{parse_signal, signal_name, ClusterConfig, Gpid, JobId, NodeId, WaitStatus};
use proptest::collection::vec;
use proptest::prelude::*;

const CONFIG: &str = r#"name = "c"
key = "0123456789abcdef0123456789abcdef"
heartbeat_ms = 500
dead_after_ms = 3000
state_dir = "/tmp/x/node{node}"

[[node]]
id = 1
addr = "127.0.0.1:7901"

[[node]]
id = 2
addr = "127.0.0.1:7902"
"#;

/// Text near what users type: sigset expressions, ids, signal names.
fn wordish() -> impl Strategy<Value = String> {
    let atoms = prop_oneof![
        Just("pid=".to_string()),
        Just("pgid=".to_string()),
        Just("sid=".to_string()),
        Just("uid=".to_string()),
        Just("job=".to_string()),
        Just("node=".to_string()),
        Just(" and ".to_string()),
        Just(" or ".to_string()),
        Just("not ".to_string()),
        Just("(".to_string()),
        Just(")".to_string()),
        Just(":".to_string()),
        Just("-".to_string()),
        Just("SIG".to_string()),
        "[0-9]{1,22}",
        "[a-zA-Z]{1,6}",
        any::<String>(),
    ];
    vec(atoms, 0..12).prop_map(|v| v.concat())
}

/// Any i32, the extremes and the small ones often.
fn edgy() -> impl Strategy<Value = i32> {
    prop_oneof![
        Just(i32::MAX),
        Just(i32::MIN),
        Just(0),
        Just(-1),
        -200i32..200,
        any::<i32>(),
    ]
}

proptest! {
    // No regression files written into the source tree.
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::with_cases(3000) })]

    #[test]
    fn user_text_parses_or_fails(s in wordish()) {
        if let Ok(e) = sigset::parse(&s) {
            let _ = e.route();
            let _ = e.uses_job();
            let _ = e.matches(&Attrs { gpid: 20000009, pgid: 1, sid: 1, uid: 0, job: 0, node: 2 });
        }
        let _ = parse_signal(&s);
        let _ = s.parse::<Gpid>();
        let _ = s.parse::<NodeId>();
        let _ = s.parse::<JobId>();
        let _ = clan_core::sys::status_numbers::<u32>(&s, "Uid");
    }

    #[test]
    fn any_exit_status_is_shown(code in edgy(), signal in edgy(), core in any::<bool>()) {
        let w = WaitStatus { code, signal, core_dumped: core, ..Default::default() };
        let _ = w.shell_code();
        let _ = w.describe();
        let _ = signal_name(signal);
    }
}

proptest! {
    // No regression files written into the source tree.
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::with_cases(500) })]

    /// A cluster file with bytes changed and cut: loaded or refused with an error.
    #[test]
    fn a_damaged_cluster_file_is_refused_or_loaded(
        edits in vec((any::<usize>(), any::<u8>()), 0..6),
        cut in any::<usize>(),
    ) {
        let mut b = CONFIG.as_bytes().to_vec();
        for (at, v) in edits {
            let i = at % b.len();
            b[i] = v;
        }
        b.truncate(cut % (b.len() + 1));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.toml");
        std::fs::write(&path, &b).unwrap();
        if let Ok(c) = ClusterConfig::load(&path) {
            let _ = c.dead_after();
            for n in c.node_ids().collect::<Vec<_>>() {
                let _ = c.node(n);
                let _ = c.state_dir(n);
            }
        }
    }
}
