//! The node's part of the cluster /proc (DESIGN.md 10, Solaris MC 4.6; `ProcRequest`).
//!
//! Each node serves its own processes' files from the kernel's /proc of its pid namespace,
//! with the pid fields rewritten to gpids before they leave the node (`stat`, `status`,
//! thread ids in `task/`), and its node files; the node a request reaches lists every node
//! at once and merges the cluster files. The reader's rights are the kernel's rules applied
//! to the reader's identity: the mode and owner the node's /proc shows, and for the files
//! the kernel guards with a ptrace check, the same ids and a dumpable process.

use crate::error::{Error, Result};
use crate::node::Node;
use crate::process::group::Kind;
use clan_core::{Gpid, NodeId, CLUSTER_INIT};
use clan_proto::pb;
use std::sync::Arc;
use std::time::Duration;

/// The most of one file a read returns (cmdline and environ can be large).
const MAX_FILE: u64 = 4 << 20;

/// Bytes of file contents in one snapshot answer (a frame holds 16 MiB).
const SNAPSHOT_BUDGET: usize = 8 << 20;

/// Bytes of file contents one node puts in its answer to a listing of `nodes` nodes: a
/// share of [`SNAPSHOT_BUDGET`], so that the answer the node asked merges stays within it
/// however many nodes answer (the rest of a frame is left for the entries themselves,
/// tens of bytes per process). Files beyond it are left out; the view reads them alone.
fn file_budget(nodes: usize) -> usize {
    SNAPSHOT_BUDGET / nodes.max(1)
}

/// How long a listing or cluster file waits for a node before leaving it out.
const NODE_TIMEOUT: Duration = Duration::from_millis(1000);

/// The node files that the cluster view merges.
pub const CLUSTER_FILES: [&str; 6] = ["loadavg", "meminfo", "stat", "uptime", "cpuinfo", "locks"];

/// Entries of /proc/PID whose contents the kernel only shows after a ptrace access check
/// (PTRACE_MODE_READ_FSCREDS): root, or a reader with all of the process's ids while the
/// process is dumpable.
const PTRACE_GUARDED: [&str; 19] = [
    "environ",
    "auxv",
    "mem",
    "maps",
    "smaps",
    "smaps_rollup",
    "numa_maps",
    "pagemap",
    "io",
    "stack",
    "syscall",
    "personality",
    "fd",
    "fdinfo",
    "cwd",
    "exe",
    "root",
    "map_files",
    "ns",
];

/// Who reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reader {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    /// Effective capabilities (`None`: not known, all of them, for a request from before
    /// they were sent). They count for root only: a user's read is made with the user's
    /// uid, which leaves none.
    pub caps: Option<u64>,
}

impl Reader {
    pub(crate) fn from_creds(c: &pb::Creds) -> Reader {
        Reader {
            uid: c.uid,
            gid: c.gid,
            groups: c.groups.clone(),
            caps: c.cap_eff,
        }
    }

    /// Whether the reader is root with capability `cap`.
    fn root_with(&self, cap: u32) -> bool {
        self.uid == 0 && clan_core::sys::cap::has(self.caps.unwrap_or(u64::MAX), cap)
    }

    /// Whether a file of this mode and owner is readable by the reader (DAC, as the
    /// kernel: root with CAP_DAC_OVERRIDE or CAP_DAC_READ_SEARCH reads everything;
    /// otherwise owner bits for the owner, group bits for a member, other bits).
    pub fn may_read(&self, mode: u32, uid: u32, gid: u32) -> bool {
        use clan_core::sys::cap;
        if self.root_with(cap::DAC_OVERRIDE) || self.root_with(cap::DAC_READ_SEARCH) {
            return true;
        }
        let bits = if self.uid == uid {
            mode >> 6
        } else if self.gid == gid || self.groups.contains(&gid) {
            mode >> 3
        } else {
            mode
        };
        bits & 0o4 != 0
    }
}

/// The ids of a process from its `status` (real, effective, saved, fs).
#[derive(Debug, Default, PartialEq, Eq)]
struct Ids {
    uids: Vec<u32>,
    gids: Vec<u32>,
}

fn ids_of_status(text: &str) -> Ids {
    Ids {
        uids: clan_core::sys::status_numbers(text, "Uid"),
        gids: clan_core::sys::status_numbers(text, "Gid"),
    }
}

/// How a pid field of a local file becomes a cluster id.
pub trait PidMap {
    /// A process or thread id of the node.
    fn pid(&self, local: i64) -> i64;
    /// The parent of the process being rewritten (given its kernel ppid).
    fn ppid(&self, local: i64) -> i64;
    /// A process group id of the node (also tpgid).
    fn pgrp(&self, local: i64) -> i64;
    /// A session id of the node.
    fn sid(&self, local: i64) -> i64;
}

/// `/proc/PID/stat` with pid, ppid, pgrp, session and tpgid as cluster ids; the command
/// name (which may hold spaces and parentheses) and every other field as they were.
pub fn rewrite_stat(text: &[u8], m: &dyn PidMap) -> Option<Vec<u8>> {
    let open = text.iter().position(|&b| b == b'(')?;
    let close = text.iter().rposition(|&b| b == b')')?;
    if close < open {
        return None;
    }
    let pid: i64 = std::str::from_utf8(&text[..open])
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let rest = std::str::from_utf8(&text[close + 1..]).ok()?;
    let mut out = format!("{} ", m.pid(pid)).into_bytes();
    out.extend_from_slice(&text[open..=close]);
    // Fields after the command: state(3) ppid(4) pgrp(5) session(6) tty_nr(7) tpgid(8).
    let mut fields: Vec<String> = rest.split(' ').map(str::to_string).collect();
    // `rest` starts with the space after ')': fields[0] is empty.
    let num = |f: &str| f.trim().parse::<i64>().ok();
    for (i, f) in fields.iter_mut().enumerate() {
        let new = match i {
            2 => num(f).map(|v| m.ppid(v)),
            3 => num(f).map(|v| m.pgrp(v)),
            4 => num(f).map(|v| m.sid(v)),
            6 => num(f).map(|v| if v > 0 { m.pgrp(v) } else { v }),
            _ => None,
        };
        if let Some(v) = new {
            let nl = f.ends_with('\n');
            *f = v.to_string();
            if nl {
                f.push('\n');
            }
        }
    }
    out.extend_from_slice(fields.join(" ").as_bytes());
    Some(out)
}

/// `/proc/PID/status` with Tgid, Pid, PPid, TracerPid and the NS* lines as cluster ids. The
/// NS lines start with the number in the node's namespace (the one its /proc shows) and go
/// down nested namespaces; they get that one value: the cluster has one pid namespace.
pub fn rewrite_status(text: &[u8], m: &dyn PidMap) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + 64);
    let mut digits = itoa::Buffer::new();
    let mut rest = text;
    while !rest.is_empty() {
        // The ids come before the first memory line (`VmPeak`, or `VmSize`...) and end
        // with NSsid: what follows them is copied as it is, unparsed.
        if rest.starts_with(b"Vm") {
            break;
        }
        let end = rest
            .iter()
            .position(|&b| b == b'\n')
            .map_or(rest.len(), |i| i + 1);
        let (line, next) = rest.split_at(end);
        rest = next;
        // Only the key decides (the bytes before the first ':'; keys are ASCII).
        let colon = line.iter().take(16).position(|&b| b == b':');
        let new = colon.and_then(|c| {
            let map: fn(&dyn PidMap, i64) -> i64 = match &line[..c] {
                b"Tgid" | b"Pid" | b"NStgid" | b"NSpid" => |m, v| m.pid(v),
                b"PPid" => |m, v| m.ppid(v),
                b"TracerPid" => pid_if_any,
                b"NSpgid" => |m, v| m.pgrp(v),
                b"NSsid" => |m, v| m.sid(v),
                _ => return None,
            };
            Some((c, map(m, first_number(&line[c + 1..])?)))
        });
        match new {
            Some((c, v)) => {
                out.extend_from_slice(&line[..c]);
                out.extend_from_slice(b":\t");
                out.extend_from_slice(digits.format(v).as_bytes());
                out.push(b'\n');
                if &line[..c] == b"NSsid" {
                    break;
                }
            }
            None => out.extend_from_slice(line),
        }
    }
    out.extend_from_slice(rest);
    out
}

/// The first word of `value` (a status line's part after its key) as a number; `None`
/// when it is none.
fn first_number(value: &[u8]) -> Option<i64> {
    let word = value
        .split(|b| b.is_ascii_whitespace())
        .find(|w| !w.is_empty())?;
    std::str::from_utf8(word).ok()?.parse().ok()
}

/// `text` with each line `f` rewrites (given it as UTF-8) replaced; every other line, one
/// that is not UTF-8 among them (a command name), kept byte for byte.
fn by_line(text: &[u8], f: impl Fn(&str) -> Option<String>) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for line in text.split_inclusive(|&b| b == b'\n') {
        match std::str::from_utf8(line).ok().and_then(&f) {
            Some(l) => out.extend_from_slice(l.as_bytes()),
            None => out.extend_from_slice(line),
        }
    }
    out
}

/// A pid field that may say "none" (0, or -1 for a process gone): a gpid when it names one.
fn pid_if_any(m: &dyn PidMap, v: i64) -> i64 {
    if v > 0 {
        m.pid(v)
    } else {
        v
    }
}

/// `/proc/PID/sched` with the pid of its first line (`comm (pid, #threads: n)`) as a
/// cluster id; the rest (scheduler statistics) as it was.
pub fn rewrite_sched(text: &[u8], m: &dyn PidMap) -> Vec<u8> {
    // The header ends where the line of dashes starts: a command name may hold a newline
    // (and " (", and digits), but not the 20 dashes that follow (it has 15 bytes at most).
    let dashes = [b'-'; 20];
    let end = text
        .windows(21)
        .position(|w| w[0] == b'\n' && w[1..] == dashes)
        .unwrap_or_else(|| text.iter().position(|&b| b == b'\n').unwrap_or(text.len()));
    let first = &text[..end];
    // The command may hold " (": its pid is in the last parentheses.
    let Some(open) = first.windows(2).rposition(|w| w == b" (") else {
        return text.to_vec();
    };
    let Some(rest) = std::str::from_utf8(&first[open + 2..]).ok() else {
        return text.to_vec();
    };
    let Some((pid, tail)) = rest.split_once(',') else {
        return text.to_vec();
    };
    let Ok(pid) = pid.trim().parse::<i64>() else {
        return text.to_vec();
    };
    let mut out = first[..open + 2].to_vec();
    out.extend_from_slice(format!("{},{tail}", m.pid(pid)).as_bytes());
    out.extend_from_slice(&text[end..]);
    out
}

/// `/proc/PID/fdinfo/N`: a pidfd's `Pid:` and `NSpid:` lines (the process it refers to;
/// -1 once that exited) as cluster ids, as in `status`, an io_uring's polling thread
/// (`SqThread:`) and the holders of the file's locks (`lock:` lines, as in `/proc/locks`);
/// every other line as it was.
pub fn rewrite_fdinfo(text: &[u8], m: &dyn PidMap) -> Vec<u8> {
    by_line(text, |l| {
        let (key, val) = l.split_once(':')?;
        if key == "lock" {
            return Some(format!("lock:{}", rewrite_lock_line(val, m)?));
        }
        if !matches!(key, "Pid" | "NSpid" | "SqThread") {
            return None;
        }
        let v = val.split_whitespace().next()?.parse::<i64>().ok()?;
        Some(format!("{key}:\t{}\n", pid_if_any(m, v)))
    })
}

/// `line` with its `idx`th whitespace-separated token replaced by `f` of it (spacing kept);
/// `None` if it has no such token or `f` declines.
fn replace_token(line: &str, idx: usize, f: impl FnOnce(&str) -> Option<String>) -> Option<String> {
    let mut start = None;
    let mut n = 0;
    let mut prev_space = true;
    for (i, c) in line.char_indices() {
        let space = c.is_whitespace();
        if prev_space && !space {
            if n == idx {
                start = Some(i);
                break;
            }
            n += 1;
        }
        prev_space = space;
    }
    let start = start?;
    let end = line[start..]
        .find(char::is_whitespace)
        .map_or(line.len(), |e| start + e);
    Some(format!(
        "{}{}{}",
        &line[..start],
        f(&line[start..end])?,
        &line[end..]
    ))
}

/// One line of `/proc/locks` (or an fdinfo's `lock:` line without its key): the holder's
/// pid (after the lock's number, class, mode and type; a waiter's line has `->` after the
/// number) as a gpid. An OFD lock's -1 stays.
fn rewrite_lock_line(line: &str, m: &dyn PidMap) -> Option<String> {
    let waiter = line.split_whitespace().nth(1) == Some("->");
    replace_token(line, if waiter { 5 } else { 4 }, |t| {
        let v = t.parse::<i64>().ok()?;
        (v > 0).then(|| m.pid(v).to_string())
    })
}

/// `/proc/locks` (a node file) with the lock holders' pids as gpids of its node.
pub fn rewrite_locks(text: &[u8], m: &dyn PidMap) -> Vec<u8> {
    by_line(text, |l| rewrite_lock_line(l, m))
}

/// `/proc/PID/timers` with the pid or tid a timer notifies (`notify: signal/pid.N`) as a
/// gpid.
pub fn rewrite_timers(text: &[u8], m: &dyn PidMap) -> Vec<u8> {
    by_line(text, |l| {
        let rest = l.strip_prefix("notify:")?;
        let (head, num) = rest.trim_end_matches('\n').rsplit_once('.')?;
        let v = num.parse::<i64>().ok()?;
        let nl = if l.ends_with('\n') { "\n" } else { "" };
        Some(format!("notify:{head}.{}{nl}", pid_if_any(m, v)))
    })
}

/// One file of a listing's entry: its contents, or why the reader does not get them.
pub fn proc_file(name: &str, read: Result<Vec<u8>>) -> pb::ProcFile {
    let (data, error) = match read {
        Ok(d) => (d, None),
        Err(e) => (Vec::new(), Some(e.into())),
    };
    pb::ProcFile {
        name: name.to_string(),
        data,
        error,
    }
}

/// The files of a process (or thread) the kernel makes as one seq_file record from the task
/// and its counters, and gives every reader (S_IRUGO).
pub(crate) const RECORDS: [&str; 3] = ["stat", "status", "statm"];

/// Files whose read takes the lock of the process's memory map (see
/// [`crate::process::view::MapReads`]).
const MAP_FILES: [&str; 7] = [
    "cmdline",
    "environ",
    "maps",
    "smaps",
    "smaps_rollup",
    "numa_maps",
    "pagemap",
];

/// Whether answering `req` takes a few reads that never wait for another process: the
/// `stat`, `status` or `statm` of one process or thread, or the target of one of its links
/// (the kernel makes them from the task and its counters, without the lock of the
/// process's memory map that `cmdline`, `environ` or `maps` take, which a process stuck
/// in a page fault can hold for long). Those are answered on the worker that has the
/// request, with no `block_in_place` hand-over (a remote `status` read's critical path);
/// on a peer link still in a task of their own, as a reader can be left to free the
/// memory of a process that exits during the read, and the link's heartbeats must not
/// wait for that.
pub fn quick(req: &pb::ProcRequest) -> bool {
    use pb::ProcOp as P;
    // `task/TID/x` is the thread's `x`.
    let path = match req.path.strip_prefix("task/") {
        Some(rest) => rest.split_once('/').map_or("", |(_, p)| p),
        None => req.path.as_str(),
    };
    match P::try_from(req.op) {
        Ok(P::ProcRead) => RECORDS.contains(&path),
        // Not `map_files/`, whose links are found in the memory map.
        Ok(P::ProcReadlink) => matches!(
            path.split('/').next(),
            Some("cwd" | "exe" | "root" | "fd" | "ns")
        ),
        _ => false,
    }
}

/// Who a request from `client` reads as: a root client that could take any identity
/// itself (CAP_SETUID and CAP_SETGID: the FUSE server) reads on behalf of its callers,
/// with no capability it does not have itself; anyone else as itself.
pub fn delegated(reader: Option<pb::Creds>, client: &pb::Creds) -> pb::Creds {
    use clan_core::sys::cap;
    let caps = client.cap_eff.unwrap_or(u64::MAX);
    let may = client.uid == 0 && cap::has(caps, cap::SETUID) && cap::has(caps, cap::SETGID);
    match reader {
        Some(mut r) if may => {
            if let Some(mine) = client.cap_eff {
                r.cap_eff = Some(r.cap_eff.unwrap_or(u64::MAX) & mine);
            }
            r
        }
        _ => client.clone(),
    }
}

/// The reader a request names (set by `proc_request` before it is used).
fn reader_of(req: &pb::ProcRequest) -> pb::Creds {
    req.reader.clone().unwrap_or_default()
}

/// The rewriting of one process of this node.
struct NodeMap<'a> {
    node: &'a Node,
    /// The cluster parent of a process clan started (its kernel parent is its shepherd):
    /// the process that ran `clan run`, or the cluster's init.
    clan_parent: i64,
    /// Which parents are shepherds, as found so far in this request (a snapshot asks of
    /// the same parents again and again).
    shepherds: &'a ShepherdCache,
    /// The shepherd of the process, when clan manages it: a kernel parent of that pid is
    /// known to be a shepherd without reading its `stat` and `exe`.
    shepherd: Option<u32>,
}

/// Whether a local pid is one of clan's shepherds, remembered for one request.
#[derive(Default)]
pub struct ShepherdCache(std::cell::RefCell<std::collections::HashMap<u32, bool>>);

/// A node's pids as its gpids, for files that name processes only by pid.
struct NodePids(NodeId);

impl PidMap for NodePids {
    fn pid(&self, local: i64) -> i64 {
        u32::try_from(local)
            .ok()
            .and_then(|p| Gpid::new(self.0, p))
            .map_or(local, |g| g.raw() as i64)
    }
    fn ppid(&self, local: i64) -> i64 {
        self.pid(local)
    }
    fn pgrp(&self, local: i64) -> i64 {
        self.pid(local)
    }
    fn sid(&self, local: i64) -> i64 {
        self.pid(local)
    }
}

impl PidMap for NodeMap<'_> {
    fn pid(&self, local: i64) -> i64 {
        u32::try_from(local)
            .ok()
            .and_then(|p| Gpid::new(self.node.id, p))
            .map_or(local, |g| g.raw() as i64)
    }
    fn ppid(&self, local: i64) -> i64 {
        match u32::try_from(local) {
            // No parent in the node (its init): the cluster's init is the parent.
            Ok(0) => CLUSTER_INIT as i64,
            Err(_) => 0,
            Ok(p) if Some(p) == self.shepherd => self.clan_parent,
            Ok(p)
                if *self
                    .shepherds
                    .0
                    .borrow_mut()
                    .entry(p)
                    .or_insert_with(|| self.node.view.is_shepherd_pid(p)) =>
            {
                self.clan_parent
            }
            Ok(_) => self.pid(local),
        }
    }
    fn pgrp(&self, local: i64) -> i64 {
        u32::try_from(local).map_or(local, |g| self.node.cluster_id(Kind::Group, g) as i64)
    }
    fn sid(&self, local: i64) -> i64 {
        u32::try_from(local).map_or(local, |s| self.node.cluster_id(Kind::Session, s) as i64)
    }
}

/// A node's `loadavg` with its last field (the newest pid) as a gpid of the node: the
/// highest process number of the node's view (the kernel gives the reader's namespace's
/// last pid, which for cland is the host's).
pub fn node_loadavg(text: &str, node: NodeId, newest: Option<u32>) -> String {
    let mut f: Vec<String> = text.split_whitespace().map(str::to_string).collect();
    if let (Some(last), Some(g)) = (f.get_mut(4), newest.and_then(|p| Gpid::new(node, p))) {
        *last = g.raw().to_string();
    }
    f.join(" ") + "\n"
}

/// Sums the numbers of several nodes' `loadavg`: the loads and the counts add up, the last
/// pid is the highest gpid (each node gives its own as a gpid, see [`node_loadavg`]).
pub fn merge_loadavg(parts: &[(NodeId, String)]) -> String {
    let (mut l, mut run, mut total, mut last) = ([0f64; 3], 0u64, 0u64, 0u64);
    for (n, t) in parts {
        let f: Vec<&str> = t.split_whitespace().collect();
        for (i, x) in l.iter_mut().enumerate() {
            *x += f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        }
        if let Some((r, a)) = f.get(3).and_then(|v| v.split_once('/')) {
            run = run.saturating_add(r.parse::<u64>().unwrap_or(0));
            total = total.saturating_add(a.parse::<u64>().unwrap_or(0));
        }
        let lp = f.get(4).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let g = match Gpid::from_raw(lp) {
            Some(g) if g.node() == *n => Some(g),
            _ => u32::try_from(lp).ok().and_then(|p| Gpid::new(*n, p)),
        };
        if let Some(g) = g {
            last = last.max(g.raw());
        }
    }
    format!("{:.2} {:.2} {:.2} {run}/{total} {last}\n", l[0], l[1], l[2])
}

/// Sums `meminfo` line by line (`Hugepagesize` is a size, not an amount: the first node's).
pub fn merge_meminfo(parts: &[(NodeId, String)]) -> String {
    let mut keys: Vec<(String, u64, bool)> = Vec::new();
    for (_, t) in parts {
        for line in t.lines() {
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            let mut w = v.split_whitespace();
            let n: u64 = w.next().and_then(|x| x.parse().ok()).unwrap_or(0);
            let kb = w.next() == Some("kB");
            match keys.iter_mut().find(|(key, _, _)| key == k) {
                Some(e) if k != "Hugepagesize" => e.1 = e.1.saturating_add(n),
                Some(_) => {}
                None => keys.push((k.to_string(), n, kb)),
            }
        }
    }
    let mut out = String::new();
    for (k, n, kb) in keys {
        let key = format!("{k}:");
        if kb {
            out.push_str(&format!("{key:<16}{n:>8} kB\n"));
        } else {
            out.push_str(&format!("{key:<16}{n:>8}\n"));
        }
    }
    out
}

/// Merges `stat`: the `cpu` line and the counters summed (per column for `intr` and
/// `softirq`), `cpuN` lines renumbered node after node, `btime` the earliest.
pub fn merge_stat(parts: &[(NodeId, String)]) -> String {
    let mut cpu: Vec<u64> = Vec::new();
    let mut cpus: Vec<String> = Vec::new();
    let mut order: Vec<String> = Vec::new();
    let mut sums: std::collections::HashMap<String, Vec<u64>> = Default::default();
    let mut btime: Option<u64> = None;
    let add = |acc: &mut Vec<u64>, vals: &[u64]| {
        if acc.len() < vals.len() {
            acc.resize(vals.len(), 0);
        }
        for (a, v) in acc.iter_mut().zip(vals) {
            *a = a.saturating_add(*v);
        }
    };
    for (_, t) in parts {
        for line in t.lines() {
            let mut w = line.split_whitespace();
            let Some(key) = w.next() else { continue };
            let vals: Vec<u64> = w.filter_map(|x| x.parse().ok()).collect();
            if key == "cpu" {
                add(&mut cpu, &vals);
            } else if let Some(_n) = key.strip_prefix("cpu").filter(|n| n.parse::<u32>().is_ok()) {
                let rest: Vec<String> = vals.iter().map(u64::to_string).collect();
                cpus.push(format!("cpu{} {}", cpus.len(), rest.join(" ")));
            } else if key == "btime" {
                let b = vals.first().copied().unwrap_or(0);
                btime = Some(btime.map_or(b, |x: u64| x.min(b)));
            } else {
                if !sums.contains_key(key) {
                    order.push(key.to_string());
                }
                add(sums.entry(key.to_string()).or_default(), &vals);
            }
        }
    }
    let join = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(" ");
    let mut out = format!("cpu  {}\n", join(&cpu));
    for c in cpus {
        out.push_str(&c);
        out.push('\n');
    }
    for k in order {
        out.push_str(&format!("{k} {}\n", join(&sums[&k])));
        if k == "ctxt" {
            if let Some(b) = btime.take() {
                out.push_str(&format!("btime {b}\n"));
            }
        }
    }
    if let Some(b) = btime {
        out.push_str(&format!("btime {b}\n"));
    }
    out
}

/// `uptime`: the longest-running node's, with the idle time of every CPU summed.
pub fn merge_uptime(parts: &[(NodeId, String)]) -> String {
    let (mut up, mut idle) = (0f64, 0f64);
    for (_, t) in parts {
        let mut w = t.split_whitespace().filter_map(|x| x.parse::<f64>().ok());
        up = up.max(w.next().unwrap_or(0.0));
        idle += w.next().unwrap_or(0.0);
    }
    format!("{up:.2} {idle:.2}\n")
}

/// `cpuinfo`: every node's processors, renumbered node after node.
pub fn merge_cpuinfo(parts: &[(NodeId, String)]) -> String {
    let mut out = String::new();
    let mut n = 0;
    for (_, t) in parts {
        for block in t.split("\n\n").filter(|b| !b.trim().is_empty()) {
            for line in block.lines() {
                match line.split_once(':') {
                    Some((k, _)) if k.trim() == "processor" => {
                        out.push_str(&format!("{k}: {n}\n"));
                        n += 1;
                    }
                    _ => {
                        out.push_str(line);
                        out.push('\n');
                    }
                }
            }
            out.push('\n');
        }
    }
    out
}

/// `locks`: every node's locks (holders already gpids, see [`rewrite_locks`]), numbered
/// node after node. A waiter's line (`N: -> ...`) keeps the number of the lock it waits for,
/// as the kernel prints it: right after that lock's line. A node's last line cut short (its
/// file was longer than a read takes) is left out, and so is everything past
/// 8 MiB (`SNAPSHOT_BUDGET`), which keeps the answer within a frame.
pub fn merge_locks(parts: &[(NodeId, String)]) -> String {
    let mut out = String::new();
    let mut n = 0u64;
    for (_, t) in parts {
        let mut mine: Vec<(u64, u64)> = Vec::new(); // this node's number -> the merged one
        for line in t.split_inclusive('\n') {
            let Some(line) = line.strip_suffix('\n') else {
                break; // cut short
            };
            let Some((num, rest)) = line.split_once(':') else {
                continue;
            };
            let Ok(num) = num.trim().parse::<u64>() else {
                continue;
            };
            if out.len() + line.len() >= SNAPSHOT_BUDGET {
                return out;
            }
            let new = if rest.trim_start().starts_with("->") {
                match mine.iter().rev().find(|(o, _)| *o == num) {
                    Some(&(_, m)) => m,
                    None => continue, // a waiter without its lock: the file was torn
                }
            } else {
                n += 1;
                mine.push((num, n));
                n
            };
            out.push_str(&format!("{new}:{rest}\n"));
        }
    }
    out
}

fn merge(name: &str, parts: &[(NodeId, String)]) -> Result<String> {
    Ok(match name {
        "loadavg" => merge_loadavg(parts),
        "meminfo" => merge_meminfo(parts),
        "stat" => merge_stat(parts),
        "uptime" => merge_uptime(parts),
        "cpuinfo" => merge_cpuinfo(parts),
        "locks" => merge_locks(parts),
        other => {
            return Err(Error::NotFound(format!(
                "no cluster file {other:?} (cluster files: {})",
                CLUSTER_FILES.join(", ")
            )))
        }
    })
}

/// A relative path inside a process directory: plain names only.
fn check_path(path: &str) -> Result<Vec<&str>> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    let parts: Vec<&str> = path.split('/').collect();
    if parts
        .iter()
        .any(|p| p.is_empty() || *p == "." || *p == ".." || p.contains('\0'))
    {
        return Err(Error::Invalid(format!("invalid /proc path {path:?}")));
    }
    Ok(parts)
}

/// The attributes stat() gave, for the asker; `name`: the link followed.
// `st_nlink` and `st_blksize` are of other types on other architectures (u32, i32 on arm64).
#[allow(clippy::useless_conversion)]
fn link_stat(st: &nix::sys::stat::FileStat, name: String) -> pb::LinkStat {
    pb::LinkStat {
        mode: st.st_mode,
        ino: st.st_ino,
        dev: st.st_dev,
        nlink: u64::from(st.st_nlink),
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev,
        size: st.st_size,
        blocks: st.st_blocks,
        blksize: i64::from(st.st_blksize),
        atime: st.st_atime,
        atime_nsec: st.st_atime_nsec,
        mtime: st.st_mtime,
        mtime_nsec: st.st_mtime_nsec,
        ctime: st.st_ctime,
        ctime_nsec: st.st_ctime_nsec,
        name,
    }
}

/// What a failed access to `what` of the node's /proc tells the asker. Only the kernel's
/// "not there" (`ENOENT`, or `ESRCH` from a process that exited while it was read) is an
/// absence: the view tells its readers so and the kernel may remember it. Anything else
/// (`EMFILE`, `ENOMEM`, `EIO`, `EINTR`, ...) is a failure to read, not an answer.
fn io_err(e: std::io::Error, what: &str) -> Error {
    match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => {
            Error::Permission(format!("permission denied: {what}"))
        }
        Some(libc::ENOENT) | Some(libc::ESRCH) => Error::NotFound(format!("no such file: {what}")),
        _ => Error::Internal(format!("reading /proc/{what}: {e}")),
    }
}

impl Node {
    /// The local pid of `gpid` when it is a process of this node that users see.
    fn proc_pid(&self, gpid: u64) -> Result<u32> {
        let g = Gpid::from_raw(gpid)
            .filter(|g| g.node() == self.id)
            .ok_or_else(|| {
                Error::Invalid(format!("{gpid} is not a process of node {}", self.id))
            })?;
        let p = g.local();
        // A process clan manages that has not exited is no shepherd (its pid is not
        // reaped, so not reused): no need to read its `stat` and `exe` to know.
        let running = self
            .vprocs
            .read()
            .get(&g)
            .is_some_and(|v| v.exited().is_none());
        if (!running && self.view.is_shepherd_pid(p))
            || self.view.stat_entry(&p.to_string()).is_err()
        {
            return Err(Error::NoSuchProcess(g));
        }
        Ok(p)
    }

    /// Path `parts` under the process, in the node's numbers (`task/<gpid>` → `task/<tid>`).
    fn local_path(&self, pid: u32, parts: &[&str]) -> Result<String> {
        let mut out = pid.to_string();
        for (i, p) in parts.iter().enumerate() {
            out.push('/');
            if i == 1 && parts[0] == "task" {
                let tid = p
                    .parse::<u64>()
                    .ok()
                    .and_then(Gpid::from_raw)
                    .filter(|g| g.node() == self.id)
                    .ok_or_else(|| Error::NotFound(format!("no such thread {p}")))?;
                out.push_str(&tid.local().to_string());
            } else {
                out.push_str(p);
            }
            // Never through a link: the daemon (root) would follow `root/`, `cwd/` or
            // `fd/N/` into directories the reader may not enter. Only the last part may
            // be one (read as the kernel reads it, or its target given).
            if i + 1 < parts.len() {
                self.require_dir(&out)?;
            }
        }
        Ok(out)
    }

    /// `rel` is a directory of the view itself, not a link to one.
    fn require_dir(&self, rel: &str) -> Result<()> {
        let (mode, _, _) = self.view.stat_entry(rel).map_err(|e| io_err(e, rel))?;
        if mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(Error::NotFound(format!(
                "no such directory: /proc/{rel} (the cluster /proc does not follow links)"
            )));
        }
        Ok(())
    }

    /// May `reader` see what `rel` (a path of the view, under process `pid`) holds? Says
    /// whether it is a link.
    fn check_read(&self, reader: &Reader, pid: u32, parts: &[&str], rel: &str) -> Result<bool> {
        // Every reader may read these (a thread's too): nothing to look at (the read itself
        // finds a process that is gone).
        if let [f] | ["task", _, f] = parts {
            if RECORDS.contains(f) {
                return Ok(false);
            }
        }
        let (mode, uid, gid) = self.view.stat_entry(rel).map_err(|e| io_err(e, rel))?;
        let is_dir = mode & libc::S_IFMT == libc::S_IFDIR;
        let is_link = mode & libc::S_IFMT == libc::S_IFLNK;
        if !is_link && !reader.may_read(mode, uid, gid) {
            return Err(Error::Permission(format!("permission denied: /proc/{rel}")));
        }
        // The entry (or the thread's entry) the kernel guards: `task/TID/x` as `x`.
        let name = match parts {
            ["task", _, rest @ ..] => rest.first().copied(),
            _ => parts.first().copied(),
        };
        let guarded = name.is_some_and(|n| PTRACE_GUARDED.contains(&n));
        // Root's reads are decided by the kernel alone: they are made with root's
        // capabilities lowered to the reader's (`ActingAs::reader`), and which of them a
        // ptrace check accepts depends on the kernel (6.x lets CAP_PERFMON or
        // CAP_SYS_ADMIN open `environ` or `maps`, not read `cwd`).
        if guarded && !(is_dir && parts.len() == 1) && reader.uid != 0 {
            let status = self
                .view
                .read_file(&format!("{pid}/status"), 16384)
                .map_err(|e| io_err(e, rel))?;
            let ids = ids_of_status(&String::from_utf8_lossy(&status));
            // The kernel gives a non-dumpable process's files to root.
            let (_, env_owner, _) = self
                .view
                .stat_entry(&format!("{pid}/environ"))
                .map_err(|e| io_err(e, rel))?;
            let same = !ids.uids.is_empty()
                && ids.uids.iter().take(3).all(|&u| u == reader.uid)
                && ids.gids.iter().take(3).all(|&g| g == reader.gid);
            if !same || env_owner != reader.uid {
                return Err(Error::Permission(format!("permission denied: /proc/{rel}")));
            }
        }
        Ok(is_link)
    }

    /// What stat() following a link of the directory `rel` (of descriptors or namespaces)
    /// gives, of the first link (`hint` tried before the others, then descriptors by
    /// number, namespaces by name) whose target reads `link`: the pipe, socket, anonymous
    /// inode or namespace it leads to (every descriptor on one pipe leads to the same
    /// inode). Read as the reader, so the kernel's own check decides whether the reader may
    /// follow the process's links. `NotFound` when no link has that target (any more).
    fn stat_link(&self, rel: &str, link: &str, hint: &str) -> Result<pb::LinkStat> {
        if !hint.is_empty() {
            if let Some(st) = self.follow_if(rel, hint, link)? {
                return Ok(st);
            }
        }
        let mut names: Vec<String> = self
            .view
            .list_entry(rel)
            .map_err(|e| io_err(e, rel))?
            .into_iter()
            .filter(|n| n != hint)
            .collect();
        let number = |n: &str| n.parse::<u64>().unwrap_or(u64::MAX);
        names.sort_unstable_by(|a, b| number(a).cmp(&number(b)).then_with(|| a.cmp(b)));
        for n in names {
            if let Some(st) = self.follow_if(rel, &n, link)? {
                return Ok(st);
            }
        }
        Err(Error::NotFound(format!(
            "no such file: /proc/{rel}/{link} (no link there leads to it)"
        )))
    }

    /// [`Node::stat_link`] of the link `name` if it reads `link`; `None` if it does not,
    /// or is gone (a descriptor closed meanwhile).
    fn follow_if(&self, rel: &str, name: &str, link: &str) -> Result<Option<pb::LinkStat>> {
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Ok(None);
        }
        let path = format!("{rel}/{name}");
        let closed = |e: &std::io::Error| e.raw_os_error() == Some(libc::ENOENT);
        match self.view.readlink_entry(&path) {
            Ok(t) if t == link.as_bytes() => {}
            Ok(_) => return Ok(None),
            Err(e) if closed(&e) => return Ok(None),
            Err(e) => return Err(io_err(e, &path)),
        }
        match self.view.stat_link_to(&path, link.as_bytes()) {
            Ok(st) => Ok(st.map(|st| link_stat(&st, name.to_string()))),
            Err(e) if closed(&e) => Ok(None),
            Err(e) => Err(io_err(e, &path)),
        }
    }

    fn rewrite(&self, pid: u32, file: &str, data: Vec<u8>, shepherds: &ShepherdCache) -> Vec<u8> {
        let rec = Gpid::new(self.id, pid).and_then(|g| {
            self.vprocs
                .read()
                .get(&g)
                .map(|v| (v.cluster_parent(), v.shepherd_pid))
        });
        let m = NodeMap {
            node: self,
            shepherds,
            // Started from outside the cluster (clan run -d, a clan shell), or its parent
            // exited: no parent in the cluster, so the cluster's init, as for an orphan.
            clan_parent: rec
                .map(|(p, _)| p)
                .filter(|&p| p != 0)
                .unwrap_or(CLUSTER_INIT) as i64,
            shepherd: rec.map(|(_, s)| s).filter(|&s| s > 1),
        };
        match file {
            "stat" => rewrite_stat(&data, &m).unwrap_or(data),
            "status" => rewrite_status(&data, &m),
            "sched" => rewrite_sched(&data, &m),
            "timers" => rewrite_timers(&data, &m),
            "fdinfo" => rewrite_fdinfo(&data, &m),
            // `task/TID/children`: the children's pids, separated by spaces.
            "children" => String::from_utf8_lossy(&data)
                .split_whitespace()
                .map(|p| {
                    p.parse::<i64>()
                        .map_or(p.to_string(), |n| m.pid(n).to_string())
                })
                .map(|p| p + " ")
                .collect::<String>()
                .into_bytes(),
            _ => data,
        }
    }

    fn read_one(
        &self,
        reader: &Reader,
        pid: u32,
        parts: &[&str],
        shepherds: &ShepherdCache,
    ) -> Result<Vec<u8>> {
        let rel = self.local_path(pid, parts)?;
        if self.check_read(reader, pid, parts, &rel)? {
            // `fd/N`, `cwd`, `exe`, `root`: the kernel would open what they point at
            // with the opener's rights on the file itself; served as links only.
            return Err(Error::Invalid(format!(
                "/proc/{rel} is a link: the cluster /proc does not follow links (read its target)"
            )));
        }
        let data = match parts.last() {
            Some(f) if RECORDS.contains(f) => self.view.read_record(&rel, MAX_FILE),
            Some(f) if MAP_FILES.contains(f) => {
                let Some(_reading) = self.view.map_reads.begin(pid) else {
                    return Err(Error::Internal(format!(
                        "/proc/{rel}: the process's memory map is busy (a read of it has \
                         waited over {:?})",
                        crate::process::view::MAP_BUSY_AFTER
                    )));
                };
                self.view.read_file(&rel, MAX_FILE)
            }
            _ => self.view.read_file(&rel, MAX_FILE),
        }
        .map_err(|e| io_err(e, &rel))?;
        // The rewritten file is the last component's (`task/TID/stat` as `stat`), or
        // `fdinfo` for an entry of an `fdinfo` directory.
        let file = match parts {
            [.., "fdinfo", _] => "fdinfo",
            _ => parts.last().copied().unwrap_or(""),
        };
        Ok(self.rewrite(pid, file, data, shepherds))
    }

    /// The targets of the namespace links of process `pid` (`ns/*`), a line `NAME TARGET`
    /// each, by name: what a snapshot's file `ns` holds, so that a walk (a `clan shell`'s
    /// pstree) answers a `stat` that follows them without a round trip each. Read as the
    /// reader: EACCES where the kernel refuses the reader the listing or a link.
    fn ns_links(&self, reader: &Reader, pid: u32) -> Result<Vec<u8>> {
        let rel = self.local_path(pid, &["ns"])?;
        self.check_read(reader, pid, &["ns"], &rel)?;
        let mut names = self.view.list_entry(&rel).map_err(|e| io_err(e, &rel))?;
        names.sort_unstable();
        let mut out = Vec::with_capacity(names.len() * 32);
        for n in names {
            let path = format!("{rel}/{n}");
            let target = self
                .view
                .readlink_entry(&path)
                .map_err(|e| io_err(e, &path))?;
            out.extend_from_slice(n.as_bytes());
            out.push(b' ');
            out.extend_from_slice(&target);
            out.push(b'\n');
        }
        Ok(out)
    }

    /// The start time of process `pid`, read after an answer about it was made: when it
    /// is `want`, the start of the process the asker means, that process had the pid
    /// from before the request to now, so the answer is its own, not that of a process
    /// that took its pid after it exited. `NoSuchProcess` if another has it now, or none
    /// (`want` 0: whichever).
    fn started(&self, pid: u32, want: u64) -> Result<u64> {
        let g = Gpid::new(self.id, pid).ok_or_else(|| Error::NotFound(format!("no pid {pid}")))?;
        match self.view.start_ticks(pid) {
            Some(start) if want == 0 || start == want => Ok(start),
            _ => Err(Error::NoSuchProcess(g)),
        }
    }

    /// [`Node::started`], keeping the process's directory open for [`Node::read_kept`]
    /// (the start time is read through it, after the answer was made).
    fn started_kept(&self, pid: u32, want: u64) -> Result<u64> {
        match self.view.open_dir(pid) {
            Some(start) if want == 0 || start == want => Ok(start),
            _ => {
                self.view.forget_dir(pid);
                Err(Error::NoSuchProcess(
                    Gpid::new(self.id, pid)
                        .ok_or_else(|| Error::NotFound(format!("no pid {pid}")))?,
                ))
            }
        }
    }

    /// The read of a record (`stat`, `status`, `statm`) of a process whose directory a
    /// read before kept open ([`Node::started_kept`]): one open, one read, in that very
    /// process's directory, so neither its start time nor whether it is there need be
    /// read again (a file opened there is its own, or the open fails once it has gone);
    /// read again by the same reader, not even the open: the file that reader opened is
    /// kept too and read from its start ([`ProcView::read_kept_record`]). Every reader
    /// may read these files (the kernel still checks, as the reader, that it may look in
    /// the directory: `hidepid`, at each reader's first open). `None`: the long way.
    ///
    /// [`ProcView::read_kept_record`]: crate::process::view::ProcView::read_kept_record
    fn read_kept(
        &self,
        req: &pb::ProcRequest,
        parts: &[&str],
        reader: &Reader,
    ) -> Option<pb::ProcReply> {
        let [f] = parts else { return None };
        let f = RECORDS.iter().copied().find(|r| r == f)?;
        let g = Gpid::from_raw(req.gpid).filter(|g| g.node() == self.id)?;
        let pid = g.local();
        let (dir, start) = self.view.dir_of(pid)?;
        if req.start_ticks != 0 && req.start_ticks != start {
            return None;
        }
        match self.view.read_kept_record(pid, &dir, f, reader, MAX_FILE) {
            Ok(data) => Some(pb::ProcReply {
                data: self.rewrite(pid, f, data, &ShepherdCache::default()),
                start_ticks: start,
                ..Default::default()
            }),
            Err(_) => {
                // Gone (or not to be looked at by this reader): the long way says which.
                self.view.forget_dir(pid);
                None
            }
        }
    }

    fn proc_entry(&self, pid: u32) -> Option<pb::ProcEntry> {
        let (_, uid, gid) = self.view.stat_entry(&pid.to_string()).ok()?;
        let attrs = self.view.attrs(pid, false)?;
        Some(pb::ProcEntry {
            gpid: Gpid::new(self.id, pid)?.raw(),
            uid,
            gid,
            start_ticks: attrs.start_ticks,
            files: Vec::new(),
        })
    }

    /// This node's answer to a /proc request (runs on a blocking thread). Errors name the
    /// file as the cluster sees it (`/proc/GPID/PATH`).
    pub fn proc_local(&self, req: &pb::ProcRequest) -> Result<pb::ProcReply> {
        let shown = || {
            if req.path.is_empty() {
                format!("/proc/{}", req.gpid)
            } else if req.gpid == 0 {
                format!("/proc/{}", req.path)
            } else {
                format!("/proc/{}/{}", req.gpid, req.path)
            }
        };
        self.proc_local_inner(req).map_err(|e| match e {
            Error::Permission(_) => Error::Permission(format!("permission denied: {}", shown())),
            Error::NotFound(m) if m.starts_with("no such file") => {
                Error::NotFound(format!("no such file: {}", shown()))
            }
            e => e,
        })
    }

    fn proc_local_inner(&self, req: &pb::ProcRequest) -> Result<pb::ProcReply> {
        use pb::ProcOp as P;
        let reader = match &req.reader {
            Some(c) => Reader::from_creds(c),
            None => Reader::from_creds(&self.own_creds()),
        };
        // Everything below reads as the reader: what the kernel shows depends on who asks
        // (a `stat`'s addresses, `wchan`, `stack`, `kallsyms`), not only whether it opens;
        // root with the capabilities it has, no more.
        let _as =
            clan_core::sys::ActingAs::reader(reader.uid, reader.gid, &reader.groups, reader.caps)
                .map_err(|e| Error::Internal(format!("reading as uid {}: {e}", reader.uid)))?;
        let op = P::try_from(req.op)
            .map_err(|_| Error::Invalid(format!("unknown /proc operation {}", req.op)))?;
        let mut reply = pb::ProcReply::default();
        match op {
            P::ProcList | P::ProcSnapshot => {
                for f in &req.files {
                    check_path(f)?;
                }
                let mut pids = self.view.pids();
                pids.sort_unstable();
                let cache = ShepherdCache::default();
                // One answer, one frame: files beyond the budget are left out (the view
                // asks for each of those alone), so that huge command lines can not make
                // the answer, and with it the node, go missing. The node the request came
                // to merges every node's answer into one: each has its share.
                let asked = if req.nodes.is_empty() {
                    self.cfg.nodes.len()
                } else {
                    req.nodes.len()
                };
                let mut budget = file_budget(asked);
                for pid in pids {
                    let Some(mut e) = self.proc_entry(pid) else {
                        continue; // gone, or a shepherd
                    };
                    for f in &req.files {
                        let parts: Vec<&str> = f.split('/').collect();
                        let read = match parts[..] {
                            ["ns"] => self.ns_links(&reader, pid),
                            _ => self.read_one(&reader, pid, &parts, &cache),
                        };
                        let file = proc_file(f, read);
                        let size = file.data.len() + 64;
                        if size <= budget {
                            budget -= size;
                            e.files.push(file);
                        }
                    }
                    reply.procs.push(e);
                }
            }
            P::ProcRead => {
                let parts = check_path(&req.path)?;
                if parts.is_empty() {
                    return Err(Error::Invalid("read of a process directory".into()));
                }
                if let Some(r) = self.read_kept(req, &parts, &reader) {
                    return Ok(r);
                }
                let pid = self.proc_pid(req.gpid)?;
                reply.data = self.read_one(&reader, pid, &parts, &ShepherdCache::default())?;
                reply.start_ticks = self.started_kept(pid, req.start_ticks)?;
            }
            P::ProcReadlink => {
                let parts = check_path(&req.path)?;
                let pid = self.proc_pid(req.gpid)?;
                let rel = self.local_path(pid, &parts)?;
                self.check_read(&reader, pid, &parts, &rel)?;
                reply.data = self
                    .view
                    .readlink_entry(&rel)
                    .map_err(|e| io_err(e, &rel))?;
                reply.start_ticks = self.started(pid, req.start_ticks)?;
            }
            P::ProcStatLink => {
                let parts = check_path(&req.path)?;
                // Only what has no path to follow: a descriptor's link to a file is not
                // followed (into a file system that may hang: NFS, another FUSE mount).
                if !clan_proto::followed_link(&req.path, &req.link) {
                    return Err(Error::Invalid(format!(
                        "{:?} is not a pipe, socket, anonymous inode or namespace that a \
                         link of {:?} (fd, ns, task/TID/fd, task/TID/ns) reads",
                        req.link, req.path
                    )));
                }
                let pid = self.proc_pid(req.gpid)?;
                let rel = self.local_path(pid, &parts)?;
                self.require_dir(&rel)?;
                self.check_read(&reader, pid, &parts, &rel)?;
                reply.stat = Some(Box::new(self.stat_link(&rel, &req.link, &req.hint)?));
                reply.start_ticks = self.started(pid, req.start_ticks)?;
            }
            P::ProcReaddir => {
                let parts = check_path(&req.path)?;
                let pid = self.proc_pid(req.gpid)?;
                let rel = self.local_path(pid, &parts)?;
                if !parts.is_empty() {
                    self.require_dir(&rel)?;
                    self.check_read(&reader, pid, &parts, &rel)?;
                }
                let tasks = parts == ["task"];
                for name in self.view.list_entry(&rel).map_err(|e| io_err(e, &rel))? {
                    let Ok((mode, uid, gid)) = self.view.stat_entry(&format!("{rel}/{name}"))
                    else {
                        // A process directory's names are fixed for its life: one that
                        // can not be looked at means the process is gone, and a listing
                        // without it would be taken for all the names such directories
                        // have (the view's per-node template, walks). A thread or an fd
                        // gone meanwhile is just left out.
                        if parts.is_empty() {
                            return Err(Error::NotFound(format!("no such process {}", req.gpid)));
                        }
                        continue;
                    };
                    let name = if tasks {
                        match name.parse::<u32>().ok().and_then(|t| Gpid::new(self.id, t)) {
                            Some(g) => g.raw().to_string(),
                            None => continue,
                        }
                    } else {
                        name
                    };
                    reply.entries.push(pb::DirEntry {
                        name,
                        mode,
                        uid,
                        gid,
                    });
                }
                reply.start_ticks = self.started(pid, req.start_ticks)?;
            }
            P::ProcGlobal => {
                let parts = check_path(&req.path)?;
                let [name] = parts[..] else {
                    return Err(Error::Invalid(format!("invalid node file {:?}", req.path)));
                };
                if name.bytes().all(|b| b.is_ascii_digit()) || name == "self" {
                    return Err(Error::Invalid(format!("{name:?} is not a node file")));
                }
                let (mode, uid, gid) = self.view.stat_entry(name).map_err(|e| io_err(e, name))?;
                if mode & libc::S_IFMT != libc::S_IFREG || !reader.may_read(mode, uid, gid) {
                    return Err(Error::Permission(format!(
                        "permission denied: /proc/{name}"
                    )));
                }
                reply.data = self
                    .view
                    .read_file(name, MAX_FILE)
                    .map_err(|e| io_err(e, name))?;
                if name == "loadavg" {
                    let newest = self.view.pids().into_iter().max();
                    let text = String::from_utf8_lossy(&reply.data);
                    reply.data = node_loadavg(&text, self.id, newest).into_bytes();
                }
                if name == "locks" {
                    reply.data = rewrite_locks(&reply.data, &NodePids(self.id));
                }
            }
        }
        Ok(reply)
    }

    /// A /proc request from a local client: listings from every node at once (a node that
    /// does not answer in time is left out and named in `down`), a process's files from its
    /// node, cluster files merged.
    pub async fn proc_request(
        self: &Arc<Self>,
        mut req: pb::ProcRequest,
        creds: &pb::Creds,
    ) -> Result<pb::ProcReply> {
        use pb::ProcOp as P;
        req.reader = Some(delegated(req.reader.take(), creds));
        let op = P::try_from(req.op)
            .map_err(|_| Error::Invalid(format!("unknown /proc operation {}", req.op)))?;
        match op {
            P::ProcRead | P::ProcReadlink | P::ProcReaddir | P::ProcStatLink
                if req.gpid == CLUSTER_INIT =>
            {
                crate::clusterinit::answer(&req, &Reader::from_creds(&reader_of(&req)))
            }
            P::ProcRead | P::ProcReadlink | P::ProcReaddir | P::ProcStatLink => {
                let g = Gpid::from_raw(req.gpid)
                    .ok_or_else(|| Error::NotFound(format!("no such process {}", req.gpid)))?;
                let mut replies = self.proc_on(vec![g.node()], req, None).await;
                let (_, r) = replies.pop().expect("one node asked");
                r
            }
            P::ProcGlobal if req.nodes.len() == 1 => {
                let n = NodeId::new(req.nodes[0])
                    .ok_or_else(|| Error::NotFound(format!("no such node {}", req.nodes[0])))?;
                self.target_nodes(&req.nodes)?;
                let mut replies = self.proc_on(vec![n], req, None).await;
                let (_, r) = replies.pop().expect("one node asked");
                r
            }
            P::ProcGlobal => {
                let name = req.path.clone();
                merge(&name, &[])?; // a name it knows, before asking anyone
                let targets = self.target_nodes(&req.nodes)?;
                let mut parts = Vec::new();
                let mut reply = pb::ProcReply::default();
                for (n, r) in self.proc_on(targets, req, Some(NODE_TIMEOUT)).await {
                    match r {
                        Ok(r) => parts.push((n, String::from_utf8_lossy(&r.data).into_owned())),
                        Err(Error::Permission(m)) => return Err(Error::Permission(m)),
                        Err(_) => reply.down.push(n.get()),
                    }
                }
                reply.data = merge(&name, &parts)?.into_bytes();
                Ok(reply)
            }
            P::ProcList | P::ProcSnapshot => {
                let targets = self.target_nodes(&req.nodes)?;
                let mut reply = pb::ProcReply::default();
                if req.nodes.is_empty() {
                    let reader = Reader::from_creds(&reader_of(&req));
                    reply
                        .procs
                        .push(crate::clusterinit::listed(&req.files, &reader));
                }
                for (n, r) in self.proc_on(targets, req, Some(NODE_TIMEOUT)).await {
                    match r {
                        Ok(mut r) => reply.procs.append(&mut r.procs),
                        Err(Error::Invalid(m)) => return Err(Error::Invalid(m)),
                        Err(_) => reply.down.push(n.get()),
                    }
                }
                Ok(reply)
            }
        }
    }

    /// Sends `req` to each of `nodes` at once (this one answered on a blocking thread);
    /// a node that does not answer within `limit` is an error for that node.
    /// This node's answer to `req`, where the caller is: a [`quick`] request inline, others
    /// with [`crate::fanout::blocking`] (a snapshot of thousands of processes, or a file
    /// that waits for the process's memory map, must not hold a worker).
    pub async fn proc_here(self: &Arc<Self>, req: pb::ProcRequest) -> Result<pb::ProcReply> {
        if quick(&req) {
            return self.proc_local(&req);
        }
        let node = self.clone();
        crate::fanout::blocking(move || node.proc_local(&req))
            .await
            .unwrap_or_else(|e| Err(Error::Internal(e.to_string())))
    }

    async fn proc_on(
        self: &Arc<Self>,
        nodes: Vec<NodeId>,
        req: pb::ProcRequest,
        limit: Option<Duration>,
    ) -> Vec<(NodeId, Result<pb::ProcReply>)> {
        crate::fanout::on_each(nodes, |n| {
            let (node, req) = (self.clone(), req.clone());
            let limit = limit.unwrap_or(node.cfg.dead_after());
            async move {
                if n == node.id {
                    node.proc_here(req).await
                } else {
                    let op = pb::peer_request::Op::Proc(req);
                    match node.call_within(n, node.own_creds(), op, limit).await {
                        Ok(pb::peer_reply::Reply::Proc(r)) => Ok(r),
                        Ok(other) => Err(Error::Internal(format!("unexpected reply {other:?}"))),
                        Err(e) => Err(e),
                    }
                }
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record read again comes from the directory kept open by the first read, and is
    /// that process's own: once it has gone, the read says so (a reused pid can not
    /// answer for it).
    #[test]
    fn a_kept_directory_answers_for_its_process_only() {
        let dir = tempfile::tempdir().unwrap();
        let node = crate::node::lone_node(dir.path());
        let mut child = std::process::Command::new("sleep")
            .arg("1000")
            .spawn()
            .unwrap();
        let pid = child.id();
        let g = Gpid::new(node.id, pid).unwrap();
        let read = |start: u64| {
            node.proc_local(&pb::ProcRequest {
                op: pb::ProcOp::ProcRead as i32,
                gpid: g.raw(),
                path: "status".into(),
                start_ticks: start,
                ..Default::default()
            })
        };
        let first = read(0).unwrap();
        assert!(first.start_ticks > 0);
        let (_, kept) = node.view.dir_of(pid).expect("kept");
        assert_eq!(kept, first.start_ticks);
        let again = read(first.start_ticks).unwrap();
        assert_eq!(again.start_ticks, first.start_ticks);
        let text = String::from_utf8_lossy(&again.data).into_owned();
        assert!(text.starts_with("Name:\tsleep\n"), "{text}");
        assert!(text.contains(&format!("\nPid:\t{}\n", g.raw())), "{text}");
        // The file that read opened is kept for its reader, and read again from its start
        // it is made afresh: a stop since shows.
        let root = Reader::from_creds(&node.own_creds());
        assert_eq!(
            node.view.kept_file_reader(pid, "status"),
            Some(root.clone())
        );
        let state = |r: &pb::ProcReply| {
            let t = String::from_utf8_lossy(&r.data).into_owned();
            t.lines()
                .find_map(|l| l.strip_prefix("State:\t"))
                .map(|s| s.chars().next().unwrap_or('?'))
                .unwrap_or('?')
        };
        assert_ne!(state(&again), 'T');
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGSTOP,
        )
        .unwrap();
        let stopped = (0..500)
            .map(|_| {
                std::thread::sleep(std::time::Duration::from_millis(2));
                state(&read(first.start_ticks).unwrap())
            })
            .find(|s| *s == 'T');
        assert_eq!(
            stopped,
            Some('T'),
            "the kept file read again is the kernel's now"
        );
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGCONT,
        )
        .unwrap();
        // Another reader opens the file itself (the kernel checks it may), and its file
        // is the one kept then.
        let nobody = pb::Creds {
            uid: 65534,
            gid: 65534,
            ..Default::default()
        };
        let theirs = node
            .proc_local(&pb::ProcRequest {
                op: pb::ProcOp::ProcRead as i32,
                gpid: g.raw(),
                path: "status".into(),
                start_ticks: first.start_ticks,
                reader: Some(nobody.clone()),
                ..Default::default()
            })
            .unwrap();
        assert!(String::from_utf8_lossy(&theirs.data).starts_with("Name:\tsleep\n"));
        assert_eq!(
            node.view.kept_file_reader(pid, "status"),
            Some(Reader::from_creds(&nobody))
        );
        // Another start time is another process: not answered from the kept directory.
        assert!(matches!(
            read(first.start_ticks + 1),
            Err(Error::NoSuchProcess(_))
        ));
        let _ = read(0).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(matches!(
            read(first.start_ticks),
            Err(Error::NoSuchProcess(_))
        ));
        assert!(node.view.dir_of(pid).is_none());
        assert_eq!(node.view.kept_file_reader(pid, "status"), None);
    }

    struct Plus;
    impl PidMap for Plus {
        fn pid(&self, l: i64) -> i64 {
            10_000_000 + l
        }
        fn ppid(&self, l: i64) -> i64 {
            if l == 0 {
                0
            } else {
                20_000_000 + l
            }
        }
        fn pgrp(&self, l: i64) -> i64 {
            30_000_000 + l
        }
        fn sid(&self, l: i64) -> i64 {
            40_000_000 + l
        }
    }

    #[test]
    fn stat_fields_become_cluster_ids_and_the_rest_stays() {
        let s = b"57 (a) b) c) S 12 57 57 34816 57 4194560 111 0 0 0 1 2 0 0 20 0 1 0 99 1 2\n";
        let out = rewrite_stat(s, &Plus).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "10000057 (a) b) c) S 20000012 30000057 40000057 34816 30000057 4194560 111 0 0 0 \
             1 2 0 0 20 0 1 0 99 1 2\n"
        );
        // No controlling terminal: tpgid -1 stays.
        let s = b"5 (sh) S 1 5 5 0 -1 0\n";
        assert_eq!(
            rewrite_stat(s, &Plus).unwrap(),
            b"10000005 (sh) S 20000001 30000005 40000005 0 -1 0\n"
        );
        for junk in [
            &b""[..],
            b"(",
            b")(",
            b"x (y) z",
            b"12 (",
            b"\xff\xfe (a) S 1 2 3 4 5",
        ] {
            let _ = rewrite_stat(junk, &Plus);
        }
    }

    #[test]
    fn status_ids_become_cluster_ids() {
        let s = b"Name:\tsleep\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t9\nNgid:\t0\nPid:\t9\n\
PPid:\t0\nTracerPid:\t0\nUid:\t0\t0\t0\t0\nNStgid:\t9\t3\nNSpid:\t9\t3\nNSpgid:\t7\t1\n\
NSsid:\t7\t1\nThreads:\t1\n";
        let out = String::from_utf8(rewrite_status(s, &Plus)).unwrap();
        assert!(out.contains("\nTgid:\t10000009\n"), "{out}");
        assert!(out.contains("\nPid:\t10000009\n"), "{out}");
        assert!(out.contains("\nPPid:\t0\n"), "{out}");
        assert!(out.contains("\nTracerPid:\t0\n"), "{out}");
        assert!(out.contains("\nNSpid:\t10000009\n"), "{out}");
        assert!(out.contains("\nNSpgid:\t30000007\n"), "{out}");
        assert!(out.contains("\nNSsid:\t40000007\n"), "{out}");
        assert!(out.contains("\nUid:\t0\t0\t0\t0\n") && out.ends_with("Threads:\t1\n"));
        let _ = rewrite_status(b"\xff:\n:::\nPid:\tx\n", &Plus);
        // A name that is not UTF-8 stays byte for byte; the ids after it are rewritten.
        let odd = rewrite_status(b"Name:\t\xff\xfe\nPid:\t9\n", &Plus);
        assert_eq!(odd, b"Name:\t\xff\xfe\nPid:\t10000009\n");
        // What follows the ids (from the first memory line) is copied unparsed.
        let tail = b"VmPeak:\t  1 kB\nx:\t\xff\nThreads:\t1";
        let whole = [&b"Pid:\t9\nNSsid:\t7\n"[..], tail].concat();
        assert_eq!(
            rewrite_status(&whole, &Plus),
            [&b"Pid:\t10000009\nNSsid:\t40000007\n"[..], tail].concat()
        );
    }

    #[test]
    fn sched_and_pidfd_fdinfo_ids_become_cluster_ids() {
        let sched = b"we(i)rd (x) (9, #threads: 2)\n---------\nse.exec_start : 1.5\n";
        let out = String::from_utf8(rewrite_sched(sched, &Plus)).unwrap();
        assert_eq!(
            out,
            "we(i)rd (x) (10000009, #threads: 2)\n---------\nse.exec_start : 1.5\n"
        );
        // A command name with a newline, parentheses and digits of its own.
        let odd = b"a (5,\nb (9, #threads: 1)\n--------------------------\nx : 1\n";
        let out = String::from_utf8(rewrite_sched(odd, &Plus)).unwrap();
        assert!(
            out.starts_with("a (5,\nb (10000009, #threads: 1)\n---"),
            "{out}"
        );
        // Anything else is left as it was, never a panic.
        for odd in [&b""[..], b"no parentheses\n", b"x (y, z)\n", b"\xff (\xff"] {
            assert_eq!(rewrite_sched(odd, &Plus), odd);
        }
        let pidfd = b"pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\nPid:\t9\nNSpid:\t9\t3\n";
        let out = String::from_utf8(rewrite_fdinfo(pidfd, &Plus)).unwrap();
        assert!(out.starts_with("pos:\t0\nflags:\t02000002\n"), "{out}");
        assert!(out.ends_with("Pid:\t10000009\nNSpid:\t10000009\n"), "{out}");
        // An io_uring's polling thread.
        let ring = rewrite_fdinfo(b"SqMask:\t0x3\nSqThread:\t12\nSqThreadCpu:\t1\n", &Plus);
        assert_eq!(
            ring,
            b"SqMask:\t0x3\nSqThread:\t10000012\nSqThreadCpu:\t1\n"
        );
        // The process it referred to exited: -1 stays.
        let gone = rewrite_fdinfo(b"Pid:\t-1\nNSpid:\t-1\n", &Plus);
        assert_eq!(gone, b"Pid:\t-1\nNSpid:\t-1\n");
        let _ = rewrite_fdinfo(b"\xff:\nPid:\tx\n:\n", &Plus);
        // A file's locks in its fdinfo, and the node file of all locks: the holder's pid.
        let flock = b"pos:\t0\nlock:\t1: FLOCK  ADVISORY  WRITE 9 00:2d:1057 0 EOF\n";
        let out = String::from_utf8(rewrite_fdinfo(flock, &Plus)).unwrap();
        assert!(
            out.ends_with("lock:\t1: FLOCK  ADVISORY  WRITE 10000009 00:2d:1057 0 EOF\n"),
            "{out}"
        );
        let locks = b"1: POSIX  ADVISORY  WRITE 9 00:2d:1057 0 EOF\n1: -> POSIX  ADVISORY  WRITE 12 00:2d:1057 0 EOF\n2: OFDLCK ADVISORY  READ  -1 00:2d:5 0 EOF\n";
        let out = String::from_utf8(rewrite_locks(locks, &Plus)).unwrap();
        assert_eq!(
            out,
            "1: POSIX  ADVISORY  WRITE 10000009 00:2d:1057 0 EOF\n1: -> POSIX  ADVISORY  WRITE 10000012 00:2d:1057 0 EOF\n2: OFDLCK ADVISORY  READ  -1 00:2d:5 0 EOF\n"
        );
        // Two nodes' locks merged: numbered node after node, waiters under their lock.
        let n = |i| NodeId::new(i).unwrap();
        let merged = merge_locks(&[
            (n(1), out.clone()),
            (
                n(2),
                "1: FLOCK  ADVISORY  WRITE 20000007 00:2d:9 0 EOF\n2: -> torn\nx\n3: POSIX  ADVIS"
                    .into(),
            ),
        ]);
        assert_eq!(
            merged,
            "1: POSIX  ADVISORY  WRITE 10000009 00:2d:1057 0 EOF\n1: -> POSIX  ADVISORY  WRITE 10000012 00:2d:1057 0 EOF\n2: OFDLCK ADVISORY  READ  -1 00:2d:5 0 EOF\n3: FLOCK  ADVISORY  WRITE 20000007 00:2d:9 0 EOF\n"
        );
        let timers = b"ID: 0\nsignal: 14/0000000000000000\nnotify: signal/pid.9\nClockID: 0\nID: 1\nnotify: thread/tid.12\n";
        let out = String::from_utf8(rewrite_timers(timers, &Plus)).unwrap();
        assert!(out.contains("notify: signal/pid.10000009\n"), "{out}");
        assert!(out.ends_with("notify: thread/tid.10000012\n"), "{out}");
        for odd in [&b"notify:"[..], b"notify: x.y\n", b"lock:\n", b"-> ->\n"] {
            let _ = (
                rewrite_timers(odd, &Plus),
                rewrite_locks(odd, &Plus),
                rewrite_fdinfo(odd, &Plus),
            );
        }
    }

    fn n(i: u32) -> NodeId {
        NodeId::new(i).unwrap()
    }

    #[test]
    fn cluster_files_add_up() {
        let la = merge_loadavg(&[
            (n(1), "0.50 0.25 0.10 2/100 4000\n".into()),
            (n(2), "1.00 0.50 0.20 1/50 17\n".into()),
        ]);
        assert_eq!(la, "1.50 0.75 0.30 3/150 20000017\n");
        // Nodes give their newest process as a gpid.
        let one = node_loadavg("0.50 0.25 0.10 2/100 4000\n", n(1), Some(37));
        assert_eq!(one, "0.50 0.25 0.10 2/100 10000037\n");
        assert_eq!(node_loadavg("0.5\n", n(1), Some(37)), "0.5\n");
        let la = merge_loadavg(&[(n(1), one), (n(2), "1.00 0.50 0.20 1/50 20000009\n".into())]);
        assert_eq!(la, "1.50 0.75 0.30 3/150 20000009\n");
        let mi = merge_meminfo(&[
            (
                n(1),
                "MemTotal:        1000 kB\nHugePages_Total:       2\nHugepagesize:       2048 kB\n"
                    .into(),
            ),
            (
                n(2),
                "MemTotal:         500 kB\nHugePages_Total:       1\nHugepagesize:       2048 kB\n"
                    .into(),
            ),
        ]);
        assert_eq!(
            mi,
            "MemTotal:           1500 kB\nHugePages_Total:       3\nHugepagesize:       2048 kB\n"
        );
        let st = merge_stat(&[
            (
                n(1),
                "cpu  1 2 3\ncpu0 1 2 3\nintr 10 1 2\nctxt 5\nbtime 100\nprocesses 7\n".into(),
            ),
            (
                n(2),
                "cpu  4 5 6\ncpu0 4 5 6\nintr 20 3\nctxt 6\nbtime 90\nprocesses 1\n".into(),
            ),
        ]);
        assert_eq!(
            st,
            "cpu  5 7 9\ncpu0 1 2 3\ncpu1 4 5 6\nintr 30 4 2\nctxt 11\nbtime 90\nprocesses 8\n"
        );
        assert_eq!(
            merge_uptime(&[(n(1), "10.5 3.0\n".into()), (n(2), "20.25 1.0\n".into())]),
            "20.25 4.00\n"
        );
        let ci = merge_cpuinfo(&[
            (
                n(1),
                "processor\t: 0\nmodel name\t: X\n\nprocessor\t: 1\nmodel name\t: X\n\n".into(),
            ),
            (n(2), "processor\t: 0\nmodel name\t: Y\n\n".into()),
        ]);
        assert_eq!(ci.matches("processor").count(), 3);
        assert!(ci.contains("processor\t: 2\nmodel name\t: Y\n"), "{ci}");
        assert!(merge("nope", &[]).is_err());
    }

    #[test]
    fn quick_requests_are_the_ones_that_never_wait_for_a_process() {
        let req = |op: pb::ProcOp, path: &str| pb::ProcRequest {
            op: op as i32,
            gpid: 20_000_005,
            path: path.into(),
            ..Default::default()
        };
        use pb::ProcOp as P;
        for (op, path) in [
            (P::ProcRead, "status"),
            (P::ProcRead, "stat"),
            (P::ProcRead, "task/20000006/statm"),
            (P::ProcReadlink, "cwd"),
            (P::ProcReadlink, "fd/3"),
            (P::ProcReadlink, "task/20000006/exe"),
        ] {
            assert!(quick(&req(op, path)), "{op:?} {path}");
        }
        for (op, path) in [
            (P::ProcRead, "cmdline"),
            (P::ProcRead, "environ"),
            (P::ProcRead, "task/20000006/maps"),
            (P::ProcRead, "task/status"),
            (P::ProcReadlink, "map_files/400000-401000"),
            (P::ProcReaddir, ""),
            (P::ProcSnapshot, ""),
            (P::ProcGlobal, "loadavg"),
            // A scan of the descriptors, as many links as the process has.
            (P::ProcStatLink, "fd"),
        ] {
            assert!(!quick(&req(op, path)), "{op:?} {path}");
        }
    }

    #[test]
    fn dac_as_the_kernel() {
        let r = Reader {
            uid: 1000,
            gid: 1000,
            groups: vec![5],
            caps: None,
        };
        assert!(r.may_read(0o100444, 0, 0));
        assert!(r.may_read(0o100400, 1000, 0));
        assert!(!r.may_read(0o100400, 1001, 1000));
        assert!(r.may_read(0o100040, 0, 5));
        assert!(!r.may_read(0o100044, 1000, 0)); // the owner's bits, not the others'
        let root = Reader {
            uid: 0,
            gid: 0,
            groups: vec![],
            caps: None,
        };
        assert!(root.may_read(0o100000, 1000, 1000));
        // Root is privileged by its capabilities, not its uid.
        let bare = Reader {
            caps: Some(0),
            ..root.clone()
        };
        assert!(!bare.may_read(0o100400, 1000, 1000));
        assert!(bare.may_read(0o100400, 0, 1000));
        let searching = Reader {
            caps: Some(1 << clan_core::sys::cap::DAC_READ_SEARCH),
            ..root
        };
        assert!(searching.may_read(0o100000, 1000, 1000));
    }

    #[test]
    fn a_root_client_reads_for_its_callers_with_no_more_than_its_own_capabilities() {
        let creds = |uid, cap_eff| pb::Creds {
            uid,
            cap_eff,
            ..Default::default()
        };
        let ids = 1 << clan_core::sys::cap::SETUID | 1 << clan_core::sys::cap::SETGID;
        let caller = creds(0, Some(ids | 0b111));
        assert_eq!(delegated(Some(caller.clone()), &creds(0, None)), caller);
        assert_eq!(
            delegated(Some(caller.clone()), &creds(0, Some(ids | 0b101))).cap_eff,
            Some(ids | 0b101)
        );
        assert_eq!(
            delegated(Some(creds(0, None)), &creds(0, Some(ids))).cap_eff,
            Some(ids)
        );
        // Root that could not take another's identity, and anyone else, read as itself.
        let capless = creds(0, Some(0b101));
        assert_eq!(delegated(Some(creds(1000, None)), &capless), capless);
        let user = creds(1000, Some(0));
        assert_eq!(delegated(Some(caller), &user), user);
        assert_eq!(delegated(None, &user), user);
    }

    #[test]
    fn a_listing_of_any_number_of_nodes_fits_in_a_frame() {
        for (nodes, each) in [
            (1, 8 << 20),
            (32, 256 << 10),
            (64, 128 << 10),
            (213, (8 << 20) / 213),
        ] {
            assert_eq!(file_budget(nodes), each, "{nodes} nodes");
            assert!(
                nodes * file_budget(nodes) <= SNAPSHOT_BUDGET,
                "{nodes} nodes"
            );
        }
        assert_eq!(file_budget(0), SNAPSHOT_BUDGET);
        // The merged answer, every node's share full (as the listing fills it) and 1,000
        // processes on each, goes in one frame.
        for nodes in [1usize, 32, 64, 213] {
            let mut reply = pb::ProcReply::default();
            for n in 0..nodes {
                let mut budget = file_budget(nodes);
                for p in 0..1000u64 {
                    let mut e = pb::ProcEntry {
                        gpid: (n as u64 + 1) * 10_000_000 + 9_000_000 + p,
                        uid: 4_000_000_000,
                        gid: 4_000_000_000,
                        start_ticks: u64::MAX >> 1,
                        files: Vec::new(),
                    };
                    for name in ["stat", "status", "cmdline", "statm"] {
                        let file = proc_file(name, Ok(vec![b'x'; 4000]));
                        let size = file.data.len() + 64;
                        if size <= budget {
                            budget -= size;
                            e.files.push(file);
                        }
                    }
                    reply.procs.push(e);
                }
            }
            let len = prost::Message::encoded_len(&reply);
            assert!(
                crate::error::too_large(len).is_none(),
                "{nodes} nodes: {len} bytes"
            );
        }
    }

    #[test]
    fn only_an_absence_is_not_found() {
        let e = |n| io_err(std::io::Error::from_raw_os_error(n), "12/stat");
        assert!(matches!(e(libc::ENOENT), Error::NotFound(_)));
        assert!(matches!(e(libc::ESRCH), Error::NotFound(_)));
        assert!(matches!(e(libc::EACCES), Error::Permission(_)));
        for n in [
            libc::EMFILE,
            libc::ENOMEM,
            libc::EIO,
            libc::EINTR,
            libc::ENFILE,
        ] {
            assert!(matches!(e(n), Error::Internal(_)), "errno {n}");
        }
    }

    #[test]
    fn paths_are_plain_names() {
        assert!(check_path("status").is_ok());
        assert!(check_path("task/10000005/stat").is_ok());
        assert!(check_path("").unwrap().is_empty());
        for bad in [
            "../1/environ",
            "fd/../../x",
            "a//b",
            "/status",
            "task/.",
            "x\0y",
        ] {
            assert!(check_path(bad).is_err(), "{bad}");
        }
    }
}
