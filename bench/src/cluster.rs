//! A local cluster for a benchmark, from a given build's binaries; `clan down` on drop.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub struct Cluster {
    pub dir: PathBuf,
    pub bin: PathBuf,
    pub nodes: u32,
}

impl Cluster {
    pub fn up(bin: &Path, name: &str, nodes: u32, base_port: u16) -> anyhow::Result<Cluster> {
        let dir = std::env::temp_dir().join(format!("clan-bench-{name}-{}", std::process::id()));
        let c = Cluster {
            dir,
            bin: bin.to_path_buf(),
            nodes,
        };
        let out = c
            .cmd()
            .args([
                "up",
                "--nodes",
                &nodes.to_string(),
                "--base-port",
                &base_port.to_string(),
            ])
            .output()?;
        if !out.status.success() {
            anyhow::bail!("clan up: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(c)
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new(self.bin.join("clan"));
        c.env("CLAN_DIR", &self.dir)
            .env_remove("CLAN_NODE")
            .stdin(Stdio::null());
        c
    }

    pub fn client(&self, node: u32) -> clan_client::Client {
        let n = clan_core::NodeId::new(node).expect("node");
        clan_client::Client::at(clan_client::socket_path(&self.dir, n), n)
    }

    /// SIGKILL to a process (or, with `group`, every member of its group, on every node),
    /// then `clan wait` for it: what a measurement leaves behind is gone before the next.
    pub fn kill_and_wait(&self, gpid: clan_core::Gpid, group: bool) {
        let g = gpid.to_string();
        let mut kill = self.cmd();
        kill.args(["kill", "-s", "KILL"]);
        if group {
            kill.arg("-g");
        }
        let _ = kill.arg(&g).stderr(Stdio::null()).status();
        let _ = self
            .cmd()
            .args(["wait", &g])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }

    /// On every node, a shell that starts `per_node` `sleep SECS` and waits for them: the
    /// shells' gpids (each leads the group of its sleeps).
    pub fn sleepers(&self, per_node: usize, secs: u32) -> Vec<clan_core::Gpid> {
        let script =
            format!("i=0; while [ $i -lt {per_node} ]; do sleep {secs} & i=$((i+1)); done; wait");
        (1..=self.nodes)
            .map(|node| self.spawn(node, &["sh", "-c", &script]).expect("sleepers"))
            .collect()
    }

    /// `clan run -d --node N -- ARGV`: the gpid.
    pub fn spawn(&self, node: u32, argv: &[&str]) -> anyhow::Result<clan_core::Gpid> {
        let out = self
            .cmd()
            .args(["run", "-d", "--node", &node.to_string(), "--"])
            .args(argv)
            .stderr(Stdio::null())
            .output()?;
        if !out.status.success() {
            anyhow::bail!("clan run -d failed");
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.cmd().arg("down").stdout(Stdio::null()).status();
    }
}
