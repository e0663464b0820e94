//! POSIX process semantics across nodes on real local clusters: job control through the stub
//! with an unmodified interactive bash, process groups and sessions, sigsend, orphaned
//! groups, waits and zombies, node failure (issue 3).

use clan_tests::*;
use std::time::Duration;

macro_rules! root_or_skip {
    ($name:expr) => {
        if !need_root($name) {
            return;
        }
    };
}

/// The state letter of the only process on `node` whose command is `cmd`.
fn state_of(c: &Cluster, node: u32, cmd: &str) -> Option<String> {
    c.ps(&["--node", &node.to_string()])
        .into_iter()
        .find(|p| p["cmd"].as_str() == Some(cmd))
        .and_then(|p| p["state"].as_str().map(str::to_string))
}

#[test]
fn job_control_of_a_remote_process_from_an_interactive_bash() {
    root_or_skip!("job_control_of_a_remote_process_from_an_interactive_bash");
    let c = Cluster::up(2);
    let dir = c.dir.display().to_string();
    let path = path_with_bins();
    let t = Terminal::bash(&[("CLAN_DIR", &dir), ("PATH", &path)]);

    // Ctrl-Z stops the remote process, and bash reports the job stopped.
    t.line("clan run --node 2 -- sleep 1001");
    eventually("sleep on node 2", Duration::from_secs(20), || {
        state_of(&c, 2, "sleep 1001").filter(|s| s == "S")
    });
    t.keys(&["C-z"]);
    t.wait_for("bash to report the job stopped", |s| {
        s.contains("Stopped                 clan run --node 2 -- sleep 1001")
    });
    assert_eq!(state_of(&c, 2, "sleep 1001").as_deref(), Some("T"));

    // bg continues it in the background.
    t.line("bg");
    t.wait_for("bg", |s| s.contains("clan run --node 2 -- sleep 1001 &"));
    eventually("sleep running again", Duration::from_secs(20), || {
        state_of(&c, 2, "sleep 1001").filter(|s| s == "S")
    });

    // fg brings it back; Ctrl-C interrupts it, and the shell sees 130.
    t.clear();
    t.line("fg");
    t.wait_for("fg", |s| s.contains("clan run --node 2 -- sleep 1001\n"));
    t.keys(&["C-c"]);
    t.line("echo status=$?");
    t.wait_for("the status of the interrupted job", |s| {
        s.contains("status=130")
    });
    assert_eq!(
        state_of(&c, 2, "sleep 1001"),
        None,
        "the remote sleep is gone"
    );

    // A background job that does not read its terminal keeps running; one that reads it
    // stops with SIGTTIN, as it would locally.
    t.clear();
    t.line("clan run --node 2 -- sleep 1002 &");
    t.line("clan run --node 2 -- cat &");
    eventually(
        "cat stopped by the terminal",
        Duration::from_secs(20),
        || state_of(&c, 2, "cat").filter(|s| s == "T"),
    );
    t.line("jobs -l");
    t.wait_for("bash to see the tty-input stop", |s| {
        s.contains("Stopped (tty input)     clan run --node 2 -- cat")
    });
    assert_eq!(state_of(&c, 2, "sleep 1002").as_deref(), Some("S"));

    // In the foreground again it reads the terminal.
    t.clear();
    t.line("fg %2");
    t.wait_for("fg %2", |s| s.contains("clan run --node 2 -- cat\n"));
    t.line("hello from the terminal");
    t.wait_for("cat's echo", |s| {
        s.matches("hello from the terminal").count() >= 2
    });
    t.keys(&["C-d"]);
    t.line("echo status=$?");
    t.wait_for("cat's exit status", |s| s.contains("status=0"));
    assert_eq!(state_of(&c, 2, "cat"), None);
}
