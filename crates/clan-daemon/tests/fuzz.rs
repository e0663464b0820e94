//! cland's parsers on malformed input (DESIGN.md 18): the /proc rewrites (files of any
//! content, as a process's command name makes them), the merges of other nodes' files, and
//! the proc connector's datagrams give a value, never a panic.

use clan_core::NodeId;
use clan_daemon::genealogy;
use clan_daemon::procfs::{self, PidMap};
use proptest::collection::vec;
use proptest::prelude::*;

struct Plus;

impl PidMap for Plus {
    fn pid(&self, l: i64) -> i64 {
        l.saturating_add(10_000_000)
    }
    fn ppid(&self, l: i64) -> i64 {
        l.saturating_add(20_000_000)
    }
    fn pgrp(&self, l: i64) -> i64 {
        l.saturating_add(30_000_000)
    }
    fn sid(&self, l: i64) -> i64 {
        l.saturating_add(40_000_000)
    }
}

const STAT: &[u8] = b"9 (sleep) S 7 9 7 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 1234 2363392 210 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n";
const STATUS: &[u8] = b"Name:\tsleep\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t9\nNgid:\t0\nPid:\t9\nPPid:\t7\nTracerPid:\t0\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nNStgid:\t9\t3\nNSpid:\t9\t3\nNSpgid:\t7\t1\nNSsid:\t7\t1\nThreads:\t1\n";
const SCHED: &[u8] = b"sleep (9, #threads: 1)\n-------------------------------------------------------------------\nse.exec_start                                :        123.456\n";
const FDINFO: &[u8] = b"pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\nPid:\t9\nNSpid:\t9\t3\nlock:\t1: FLOCK  ADVISORY  WRITE 9 00:2d:1057 0 EOF\n";
const LOCKS: &[u8] = b"1: POSIX  ADVISORY  WRITE 9 00:2d:1057 0 EOF\n1: -> POSIX  ADVISORY  WRITE 12 00:2d:1057 0 EOF\n";
const TIMERS: &[u8] = b"ID: 0\nsignal: 14/0000000000000000\nnotify: signal/pid.9\nClockID: 0\n";
const LOADAVG: &str = "0.50 0.25 0.10 2/100 4000\n";
const MEMINFO: &str =
    "MemTotal:       24684084 kB\nMemFree:        21036256 kB\nHugePages_Total:       0\n";
const STATF: &str = "cpu  10 0 20 300 0 0 0 0 0 0\ncpu0 5 0 10 150 0 0 0 0 0 0\nintr 5 1 2\nctxt 100\nbtime 1700000000\nprocesses 50\nprocs_running 1\nprocs_blocked 0\n";
const UPTIME: &str = "1234.56 2345.67\n";
const CPUINFO: &str = "processor\t: 0\nmodel name\t: x\n\nprocessor\t: 1\nmodel name\t: x\n\n";

/// `sample` with bytes changed and cut.
fn damaged(sample: &[u8], edits: &[(usize, u8)], cut: usize) -> Vec<u8> {
    let mut b = sample.to_vec();
    for &(at, v) in edits {
        let i = at % b.len();
        b[i] = v;
    }
    b.truncate(cut % (b.len() + 1));
    b
}

fn rewrite_all(b: &[u8]) {
    let _ = procfs::rewrite_stat(b, &Plus);
    let _ = procfs::rewrite_status(b, &Plus);
    let _ = procfs::rewrite_sched(b, &Plus);
    let _ = procfs::rewrite_fdinfo(b, &Plus);
    let _ = procfs::rewrite_timers(b, &Plus);
    let _ = procfs::rewrite_locks(b, &Plus);
}

fn merge_all(texts: &[String]) {
    let parts: Vec<(NodeId, String)> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| (NodeId::new(i as u32 + 1).expect("a node"), t.clone()))
        .collect();
    let _ = procfs::merge_loadavg(&parts);
    let _ = procfs::merge_meminfo(&parts);
    let _ = procfs::merge_stat(&parts);
    let _ = procfs::merge_uptime(&parts);
    let _ = procfs::merge_cpuinfo(&parts);
    let _ = procfs::merge_locks(&parts);
    for (n, t) in &parts {
        let _ = procfs::node_loadavg(t, *n, Some(u32::MAX));
    }
}

proptest! {
    // No regression files written into the source tree.
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::with_cases(2000) })]

    #[test]
    fn proc_files_of_any_content_are_rewritten_or_kept(bytes in vec(any::<u8>(), 0..1024)) {
        rewrite_all(&bytes);
    }

    #[test]
    fn damaged_proc_files_are_rewritten_or_kept(
        which in 0usize..6,
        edits in vec((any::<usize>(), any::<u8>()), 0..8),
        cut in any::<usize>(),
    ) {
        let sample = [STAT, STATUS, SCHED, FDINFO, LOCKS, TIMERS][which];
        rewrite_all(&damaged(sample, &edits, cut));
    }

    #[test]
    fn node_files_of_any_content_merge(texts in vec(any::<String>(), 1..4)) {
        merge_all(&texts);
    }

    /// Node files whose numbers are as large as a u64 (or larger): sums saturate.
    #[test]
    fn node_files_with_huge_numbers_merge(
        which in 0usize..5,
        big in "[0-9]{18,21}",
        nodes in 2usize..4,
    ) {
        let sample = [LOADAVG, MEMINFO, STATF, UPTIME, CPUINFO][which];
        let text: String = sample
            .split_inclusive(|c: char| !c.is_ascii_digit())
            .map(|part| if part.starts_with(|c: char| c.is_ascii_digit()) {
                let tail: String = part.chars().skip_while(char::is_ascii_digit).collect();
                format!("{big}{tail}")
            } else {
                part.to_string()
            })
            .collect();
        merge_all(&vec![text; nodes]);
    }

    #[test]
    fn damaged_node_files_merge(
        which in 0usize..5,
        edits in vec((any::<usize>(), any::<u8>()), 0..6),
        cut in any::<usize>(),
        nodes in 1usize..4,
    ) {
        let sample = [LOADAVG, MEMINFO, STATF, UPTIME, CPUINFO][which];
        let text = String::from_utf8_lossy(&damaged(sample.as_bytes(), &edits, cut)).into_owned();
        let mut texts = vec![sample.to_string(); nodes];
        texts.push(text);
        merge_all(&texts);
    }

    #[test]
    fn proc_connector_datagrams_of_any_content_decode(bytes in vec(any::<u8>(), 0..512)) {
        let _ = genealogy::decode(&bytes);
    }
}
