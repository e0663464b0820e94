//! Where the processes of a request/response figure run on the machine's vCPUs.
//!
//! On a VM whose idle vCPUs halt, a message that wakes a thread on another, halted vCPU
//! costs far more than one that wakes a thread on the sender's own vCPU, and the kernel
//! moves a ping-pong between the two ways from one moment to the next: the same TCP
//! loopback round trip reads about 17 µs on one vCPU and 110 to 135 µs across two
//! (docs/performance.md, "Placement"). A ratio whose two sides were measured in different
//! ways means little, so the request/response figures are measured three times: as the
//! kernel places things, with every process of the path and of its baseline on one vCPU,
//! and with node 1's side on one vCPU and node 2's side (and the baselines' echo) on the
//! other, as two machines would have it.

use nix::sched::{sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// Where a measurement's processes run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Where the kernel puts them.
    Free,
    /// Every process of the path, and of the baseline, on vCPU 0.
    Together,
    /// Node 1's side (the client, node 1's cland, the mount's daemon) on vCPU 0; node 2's
    /// side (its cland and processes) and the baselines' echo on vCPU 1.
    Apart,
}

impl Placement {
    /// The placements measured, in order; only the free one on a machine of one CPU.
    pub fn all() -> Vec<Placement> {
        if online_cpus() < 2 {
            vec![Placement::Free]
        } else {
            vec![Placement::Free, Placement::Together, Placement::Apart]
        }
    }

    /// How reports name it (a suffix of the group's name).
    pub fn label(self) -> &'static str {
        match self {
            Placement::Free => "placed by the kernel",
            Placement::Together => "all on one vCPU",
            Placement::Apart => "each node on its own vCPU",
        }
    }

    /// The vCPUs of node 1's side and of node 2's side; None when the kernel places them.
    pub fn sides(self) -> Option<(usize, usize)> {
        match self {
            Placement::Free => None,
            Placement::Together => Some((0, 0)),
            Placement::Apart => Some((0, 1)),
        }
    }
}

/// The number of CPUs this process may run on.
fn online_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Threads whose CPU affinity was set, with what it was: given back when dropped (a
/// server's threads pinned to their CPUs stay so).
#[derive(Default)]
pub struct Pins {
    threads: Vec<(i32, Option<CpuSet>)>,
}

impl Pins {
    /// Every thread of process `pid` on `cpu`.
    pub fn process(&mut self, pid: i32, cpu: usize) {
        for tid in tasks(pid) {
            self.thread(tid, cpu);
        }
    }

    /// Thread `tid` (and those it makes later) on `cpu`.
    pub fn thread(&mut self, tid: i32, cpu: usize) {
        let mut set = CpuSet::new();
        if set.set(cpu).is_ok() {
            let was = nix::sched::sched_getaffinity(Pid::from_raw(tid)).ok();
            if sched_setaffinity(Pid::from_raw(tid), &set).is_ok() {
                self.threads.push((tid, was));
            }
        }
    }

    /// A baseline's echo on `cpu`.
    pub fn echo(&mut self, e: crate::baselines::Echo, cpu: usize) {
        match e {
            crate::baselines::Echo::Thread(tid) => self.thread(tid, cpu),
            crate::baselines::Echo::Process(pid) => self.process(pid, cpu),
        }
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        let mut all = CpuSet::new();
        for cpu in 0..CpuSet::count() {
            let _ = all.set(cpu);
        }
        for (tid, was) in self.threads.drain(..).rev() {
            let _ = sched_setaffinity(Pid::from_raw(tid), &was.unwrap_or(all));
        }
    }
}

/// The names (`comm`) of the threads of process `pid` now.
pub fn thread_names(pid: i32) -> Vec<String> {
    tasks(pid)
        .into_iter()
        .filter_map(|t| std::fs::read_to_string(format!("/proc/{pid}/task/{t}/comm")).ok())
        .map(|n| n.trim().to_string())
        .collect()
}

/// The threads of process `pid` now (none once it is gone).
fn tasks(pid: i32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Host pids of the processes whose command line is `argv0` (its file name) with `last`
/// as its last argument.
pub fn processes_of(argv0: &str, last: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<&[u8]> = cmd.split(|&b| b == 0).filter(|a| !a.is_empty()).collect();
            let name = args.first()?.rsplit(|&b| b == b'/').next()?;
            (name == argv0.as_bytes() && *args.last()? == last.as_bytes()).then_some(pid)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sched::sched_getaffinity;

    /// A thread's CPUs, as the kernel has them.
    fn cpus_of(tid: i32) -> Vec<usize> {
        let set = sched_getaffinity(Pid::from_raw(tid)).expect("sched_getaffinity");
        (0..CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect()
    }

    #[test]
    fn a_pinned_thread_runs_on_its_cpu_until_the_pins_go() {
        if online_cpus() < 2 {
            eprintln!("skipped: needs two CPUs");
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(nix::unistd::gettid().as_raw()).expect("send");
            let _ = wait.recv();
        });
        let tid = rx.recv().expect("the thread's id");
        let before = cpus_of(tid);
        assert!(before.len() >= 2, "{before:?}");
        {
            let mut pins = Pins::default();
            pins.thread(tid, 1);
            assert_eq!(cpus_of(tid), vec![1]);
        }
        // Given back as it was (a thread its program pinned stays pinned).
        assert_eq!(cpus_of(tid), before);
        {
            let mut pins = Pins::default();
            pins.thread(tid, 1);
            pins.thread(tid, 0);
            assert_eq!(cpus_of(tid), vec![0]);
        }
        assert_eq!(cpus_of(tid), before);
        let _ = done.send(());
        t.join().expect("join");
    }

    #[test]
    fn placements_name_their_sides() {
        assert_eq!(Placement::Free.sides(), None);
        assert_eq!(Placement::Together.sides(), Some((0, 0)));
        assert_eq!(Placement::Apart.sides(), Some((0, 1)));
        assert_eq!(Placement::all()[0], Placement::Free);
    }
}
