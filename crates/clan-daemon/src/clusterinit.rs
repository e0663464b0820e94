//! The cluster's init: pid 1 of the cluster /proc.
//!
//! Each node's processes descend from that node's init (or, without a pid namespace, from
//! the host's), whose parent is 0. In the cluster view those parents are 1, and `/proc/1` is
//! this process: one root for the whole cluster, so that tools that start from pid 1
//! (`pstree`) or draw forests (`ps -ef --forest`) show one machine. It is no process of any
//! node: it has the few files tools read of every process, in the kernel's formats, owned
//! by root, and nothing can signal or trace it (its node is no node).

use crate::error::{Error, Result};
use crate::procfs::Reader;
use clan_core::CLUSTER_INIT;
use clan_proto::pb;

/// Its name (`comm`, and what `ps` shows).
const NAME: &str = "clan";

/// Its files: name and mode (as the kernel gives an init's).
const FILES: [(&str, u32); 6] = [
    ("cmdline", 0o100444),
    ("comm", 0o100644),
    ("environ", 0o100400),
    ("stat", 0o100444),
    ("statm", 0o100444),
    ("status", 0o100444),
];

/// `stat`: a sleeping root-owned process with no parent, alone in its group and session,
/// started at boot, using nothing (52 fields, as the kernel writes them).
fn stat() -> String {
    let mut f: Vec<String> = vec![
        CLUSTER_INIT.to_string(),
        format!("({NAME})"),
        "S".into(),
        "0".into(),               // ppid
        CLUSTER_INIT.to_string(), // pgrp
        CLUSTER_INIT.to_string(), // session
        "0".into(),               // tty_nr
        "-1".into(),              // tpgid
        "4194560".into(),         // flags
    ];
    f.extend(std::iter::repeat_n("0".to_string(), 8)); // faults, times
    f.extend(["20", "0", "1", "0", "0", "0", "0"].map(String::from)); // prio .. rss
    f.push(u64::MAX.to_string()); // rsslim
    f.extend(std::iter::repeat_n("0".to_string(), 12)); // code .. cnswap
    f.push("17".into()); // exit_signal
    f.extend(std::iter::repeat_n("0".to_string(), 14)); // processor .. exit_code
    f.join(" ") + "\n"
}

/// `status`, with the lines ps, top and pgrep read.
fn status() -> String {
    let i = CLUSTER_INIT;
    let zero = "0000000000000000";
    format!(
        "Name:\t{NAME}\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{i}\nNgid:\t0\nPid:\t{i}\n\
         PPid:\t0\nTracerPid:\t0\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nFDSize:\t0\nGroups:\t\n\
         NStgid:\t{i}\nNSpid:\t{i}\nNSpgid:\t{i}\nNSsid:\t{i}\nThreads:\t1\nSigQ:\t0/0\n\
         SigPnd:\t{zero}\nShdPnd:\t{zero}\nSigBlk:\t{zero}\nSigIgn:\t{zero}\nSigCgt:\t{zero}\n\
         CapInh:\t{zero}\nCapPrm:\t000001ffffffffff\nCapEff:\t000001ffffffffff\n\
         CapBnd:\t000001ffffffffff\nCapAmb:\t{zero}\nNoNewPrivs:\t0\nSeccomp:\t0\n\
         voluntary_ctxt_switches:\t0\nnonvoluntary_ctxt_switches:\t0\n"
    )
}

/// The entries of `/proc/1`.
pub fn entries() -> Vec<pb::DirEntry> {
    FILES
        .iter()
        .map(|&(name, mode)| pb::DirEntry {
            name: name.into(),
            mode,
            uid: 0,
            gid: 0,
        })
        .collect()
}

/// `/proc/1/PATH` as `reader` may read it.
pub fn read(reader: &Reader, path: &str) -> Result<Vec<u8>> {
    let shown = || format!("/proc/{CLUSTER_INIT}/{path}");
    let &(_, mode) = FILES
        .iter()
        .find(|(n, _)| *n == path)
        .ok_or_else(|| Error::NotFound(format!("no such file: {}", shown())))?;
    if !reader.may_read(mode, 0, 0) {
        return Err(Error::Permission(format!("permission denied: {}", shown())));
    }
    Ok(match path {
        "cmdline" => format!("{NAME}\0"),
        "comm" => format!("{NAME}\n"),
        "stat" => stat(),
        "statm" => "0 0 0 0 0 0 0\n".into(),
        "status" => status(),
        _ => String::new(), // environ: empty
    }
    .into_bytes())
}

/// Its answer to a request on gpid 1 (read, readlink or listing of `path`).
pub fn answer(req: &pb::ProcRequest, reader: &Reader) -> Result<pb::ProcReply> {
    use pb::ProcOp as P;
    let mut reply = pb::ProcReply::default();
    match P::try_from(req.op) {
        Ok(P::ProcRead) => reply.data = read(reader, &req.path)?,
        Ok(P::ProcReaddir) if req.path.is_empty() => reply.entries = entries(),
        _ => {
            return Err(Error::NotFound(format!(
                "no such file: /proc/{CLUSTER_INIT}/{}",
                req.path
            )))
        }
    }
    Ok(reply)
}

/// Its entry in a listing of every process, with `files` read as `reader` may.
pub fn listed(files: &[String], reader: &Reader) -> pb::ProcEntry {
    pb::ProcEntry {
        gpid: CLUSTER_INIT,
        uid: 0,
        gid: 0,
        start_ticks: 0,
        files: files
            .iter()
            .map(|f| crate::procfs::proc_file(f, read(reader, f)))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> Reader {
        Reader {
            uid: 0,
            gid: 0,
            groups: vec![],
            caps: None,
        }
    }

    #[test]
    fn stat_has_the_kernels_52_fields_and_no_parent() {
        let s = stat();
        let f: Vec<&str> = s.trim_end().split(' ').collect();
        assert_eq!(f.len(), 52, "{s}");
        assert_eq!(&f[..4], ["1", "(clan)", "S", "0"]);
        assert!(s.ends_with('\n'));
    }

    #[test]
    fn files_follow_the_kernels_rules() {
        let user = Reader {
            uid: 1000,
            gid: 1000,
            groups: vec![],
            caps: None,
        };
        assert!(read(&user, "status").is_ok_and(|d| d.starts_with(b"Name:\tclan\n")));
        assert!(matches!(read(&user, "environ"), Err(Error::Permission(_))));
        assert!(read(&root(), "environ").is_ok_and(|d| d.is_empty()));
        assert!(matches!(read(&root(), "maps"), Err(Error::NotFound(_))));
        let req = pb::ProcRequest {
            op: pb::ProcOp::ProcReadlink as i32,
            gpid: CLUSTER_INIT,
            path: "exe".into(),
            ..Default::default()
        };
        assert!(matches!(answer(&req, &root()), Err(Error::NotFound(_))));
    }
}
