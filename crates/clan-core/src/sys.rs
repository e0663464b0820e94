//! The few raw system calls that neither std nor nix wrap: pidfds and waitid with rusage.
//! All unsafe code of the crate lives here.

use crate::WaitStatus;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `pidfd_open(2)`: a file descriptor that names exactly this process, race-free.
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes two integers and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us and nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `si_code` of a signal sent by sigqueue(3) (Linux's value; the libc crate has no name
/// for it here).
const SI_QUEUE: i32 = -1;

/// The kernel's `siginfo_t` for a queued signal (`_rt`: pid, uid, value), 128 bytes.
#[repr(C)]
struct QueuedInfo {
    signo: i32,
    errno: i32,
    code: i32,
    _pad: i32,
    pid: i32,
    uid: u32,
    value: i64,
    _rest: [u8; 128 - 32],
}

/// `pidfd_send_signal(2)` of a queued signal (si_code `SI_QUEUE`, as sigqueue(3) sends
/// it) carrying `value`, with `pid` and `uid` as the sender the receiver sees.
pub fn pidfd_send_queued(
    fd: &impl AsRawFd,
    sig: i32,
    pid: i32,
    uid: u32,
    value: i64,
) -> io::Result<()> {
    let info = QueuedInfo {
        signo: sig,
        errno: 0,
        code: SI_QUEUE,
        _pad: 0,
        pid,
        uid,
        value,
        _rest: [0; 96],
    };
    // SAFETY: `info` is a complete siginfo_t-sized buffer that outlives the call; fd is an
    // open descriptor we borrow.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            &info as *const QueuedInfo,
            0,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `pidfd_send_signal(2)` on a pidfd or on an open `/proc/PID` directory.
pub fn pidfd_send_signal(fd: &impl AsRawFd, sig: i32) -> io::Result<()> {
    // SAFETY: a null siginfo and zero flags are valid; fd is an open descriptor we borrow.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A child's state change as waitid(2) reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildEvent {
    Exited(WaitStatus),
    Stopped(i32),
    Continued,
}

/// `waitid(P_PIDFD, fd, WEXITED [| WNOWAIT] [| WNOHANG])` with the child's rusage.
/// `Ok(None)` when WNOHANG finds nothing to report. With `keep` the child stays a zombie
/// (WNOWAIT), so its pid is not reused until it is reaped.
pub fn wait_pidfd(fd: &impl AsRawFd, keep: bool, nohang: bool) -> io::Result<Option<ChildEvent>> {
    let mut flags = libc::WEXITED;
    if keep {
        flags |= libc::WNOWAIT;
    }
    if nohang {
        flags |= libc::WNOHANG;
    }
    waitid_pidfd(fd, flags)
}

/// The child's next stop or continue, if one is pending (`waitid(P_PIDFD, fd, WSTOPPED |
/// WCONTINUED | WNOHANG)`); the event is consumed, as a shell's waitpid(WUNTRACED) does.
/// Exits are left for [`wait_pidfd`].
pub fn wait_pidfd_stop(fd: &impl AsRawFd) -> io::Result<Option<ChildEvent>> {
    waitid_pidfd(fd, libc::WSTOPPED | libc::WCONTINUED | libc::WNOHANG)
}

fn waitid_pidfd(fd: &impl AsRawFd, flags: libc::c_int) -> io::Result<Option<ChildEvent>> {
    const P_PIDFD: libc::c_int = 3;
    // SAFETY: zeroed siginfo_t and rusage are valid out-parameters.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: the raw waitid syscall takes (idtype, id, infop, options, rusage); both
        // pointers are to live, writable locals of the right types.
        let r = unsafe {
            libc::syscall(
                libc::SYS_waitid,
                P_PIDFD,
                fd.as_raw_fd(),
                &mut info as *mut libc::siginfo_t,
                flags,
                &mut ru as *mut libc::rusage,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        break;
    }
    // SAFETY: waitid filled a SIGCHLD siginfo (or left it zeroed under WNOHANG); si_pid and
    // si_status are the fields of that layout.
    let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
    if pid == 0 {
        return Ok(None);
    }
    let us = |t: libc::timeval| (t.tv_sec as u64) * 1_000_000 + t.tv_usec as u64;
    let mut ws = WaitStatus {
        utime_us: us(ru.ru_utime),
        stime_us: us(ru.ru_stime),
        ..Default::default()
    };
    match info.si_code {
        libc::CLD_EXITED => ws.code = status,
        libc::CLD_KILLED => ws.signal = status,
        libc::CLD_DUMPED => {
            ws.signal = status;
            ws.core_dumped = true;
        }
        libc::CLD_STOPPED | libc::CLD_TRAPPED => return Ok(Some(ChildEvent::Stopped(status))),
        libc::CLD_CONTINUED => return Ok(Some(ChildEvent::Continued)),
        _ => ws.code = status,
    }
    Ok(Some(ChildEvent::Exited(ws)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spin_ends_when_data_comes_or_at_its_limit() {
        use std::io::Write;
        use std::os::fd::AsFd;
        use std::time::{Duration, Instant};
        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        // Nothing comes: not Ready, not before the limit (Expired; Offered sooner if
        // another thread took the CPU).
        assert_ne!(
            spin_until_readable(b.as_fd(), Duration::from_millis(2)),
            Spun::Ready
        );
        // Written before: at once.
        a.write_all(b"x").unwrap();
        assert_eq!(
            spin_until_readable(b.as_fd(), Duration::from_secs(5)),
            Spun::Ready
        );
        // Written by another thread while it polls: Ready, long before the limit.
        let (mut c, d) = std::os::unix::net::UnixStream::pair().unwrap();
        let t = Instant::now();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1));
            c.write_all(b"y").unwrap();
        });
        let mut ready = false;
        while !ready && t.elapsed() < Duration::from_secs(5) {
            ready = spin_until_readable(d.as_fd(), Duration::from_secs(5)) == Spun::Ready;
        }
        writer.join().unwrap();
        assert!(ready);
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_spinner_stops_polling_for_a_while_when_its_poll_held_up_the_answer() {
        use std::io::Write;
        use std::os::fd::AsFd;
        use std::time::Duration;
        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.write_all(b"x").unwrap();
        let mut s = Spinner::default();
        let polls =
            |s: &mut Spinner, n: u32| (0..n).filter(|_| s.wait(b.as_fd(), Duration::ZERO)).count();
        assert_eq!(polls(&mut s, 3), 3);
        // What came long after an expired poll (a client that paused): polls go on.
        s.ended(Spun::Expired);
        s.expired = s.expired.map(|t| t - STARVED_WITHIN * 2);
        s.arrived();
        assert_eq!(polls(&mut s, 1), 1);
        // What came at once after it: the next SKIP_FIRST waits do not poll (false, though
        // the socket is readable), then polls resume.
        s.ended(Spun::Expired);
        s.arrived();
        assert_eq!(polls(&mut s, SKIP_FIRST), 0);
        assert_eq!(polls(&mut s, 1), 1);
        // Signs in a row without a poll that found its answer: twice as long each time.
        s.ended(Spun::Expired);
        s.arrived();
        assert_eq!(polls(&mut s, SKIP_FIRST), 0);
        s.ended(Spun::Expired);
        s.arrived();
        assert_eq!(polls(&mut s, 2 * SKIP_FIRST), 0);
        assert_eq!(polls(&mut s, 1), 1);
    }

    #[test]
    fn programs_started_get_the_open_file_limit_this_process_started_with() {
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        // A soft limit below the hard one, as a service's usually is.
        let first = if soft < hard { soft } else { hard - 1 };
        setrlimit(Resource::RLIMIT_NOFILE, first, hard).unwrap();
        raise_open_files();
        assert_eq!(getrlimit(Resource::RLIMIT_NOFILE).unwrap(), (hard, hard));
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", "ulimit -Sn; ulimit -Hn"]);
        first_open_files_for(&mut cmd);
        let out = String::from_utf8(cmd.output().unwrap().stdout).unwrap();
        assert_eq!(out, format!("{first}\n{hard}\n"));
    }

    #[test]
    fn pidfd_wait_keeps_the_zombie_until_reaped() {
        let child = std::process::Command::new("sh")
            .args(["-c", "exit 7"])
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let fd = pidfd_open(pid).unwrap();
        let ev = wait_pidfd(&fd, true, false).unwrap().unwrap();
        assert!(matches!(
            ev,
            ChildEvent::Exited(WaitStatus {
                code: 7,
                signal: 0,
                ..
            })
        ));
        // Still a zombie: /proc/PID exists with state Z.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        assert!(stat.contains(") Z "), "{stat}");
        let again = wait_pidfd(&fd, false, false).unwrap().unwrap();
        assert_eq!(ev, again);
        assert!(std::fs::metadata(format!("/proc/{pid}")).is_err());
        std::mem::forget(child);
    }

    #[test]
    fn signal_through_pidfd() {
        let child = std::process::Command::new("sleep")
            .arg("100")
            .spawn()
            .unwrap();
        let fd = pidfd_open(child.id() as i32).unwrap();
        pidfd_send_signal(&fd, libc::SIGTERM).unwrap();
        let ev = wait_pidfd(&fd, false, false).unwrap().unwrap();
        assert!(matches!(
            ev,
            ChildEvent::Exited(WaitStatus { signal: 15, .. })
        ));
        std::mem::forget(child);
    }
}

/// `struct clone_args` of clone3(2), up to the `cgroup` field (Linux 5.7).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// fork(2) whose child is born in the cgroup `cgroup_dir` (clone3 with CLONE_INTO_CGROUP):
/// no migration afterwards, which costs milliseconds on a busy machine. Returns 0 in the
/// child and its pid in the parent, like fork.
///
/// # Safety
/// As for fork: the caller must be single-threaded, and the child may only do what is safe
/// after fork in such a process. No atfork handlers run.
pub unsafe fn fork_into(cgroup_dir: &impl AsRawFd) -> io::Result<i32> {
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup_dir.as_raw_fd() as u64,
        ..Default::default()
    };
    // SAFETY: clone3 without CLONE_VM copies the process like fork; args is a live struct of
    // the size we pass. The caller guarantees the process is single-threaded.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as i32)
    }
}

/// Turns glibc's fast bins off, for a daemon that serves many small requests (cland, the
/// view server): with them, the first allocation of 1 KiB or more after many small frees
/// (a connection's read buffer, a file's contents, after a request's many small messages
/// and tasks) merged every freed small chunk first (`malloc_consolidate`), about 120 us on
/// the path of a request (traced: docs/performance.md). Small allocations still come from
/// each thread's cache (tcache) first. Call it first thing in `main`, before any thread.
pub fn no_fast_bins() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets a parameter of glibc's allocator; no other thread runs yet.
    unsafe {
        libc::mallopt(libc::M_MXFAST, 0);
    }
}

/// Puts the calling thread under `SCHED_BATCH` (`batch`) or back under `SCHED_OTHER`. A
/// batch thread takes its fair share of the CPU, but its wakeups do not preempt the thread
/// running (the kernel's wakeup preemption is for `SCHED_OTHER` only), so bookkeeping that
/// many events wake (the proc connector's every fork and exit, the shepherd pool's refill)
/// waits for a CPU's next switch instead of delaying the work the event is about. What the
/// thread forks inherits the policy (`SCHED_RESET_ON_FORK` resets only real-time ones).
pub fn batch_scheduling(batch: bool) -> io::Result<()> {
    // SAFETY: sched_param is plain data; all zero is priority 0 (and zero budgets on musl).
    let param: libc::sched_param = unsafe { std::mem::zeroed() };
    let policy = if batch {
        libc::SCHED_BATCH
    } else {
        libc::SCHED_OTHER
    };
    // SAFETY: sched_setscheduler(2) on the calling thread (pid 0) with a valid param.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The calling thread (only) under the real-time policy `SCHED_FIFO` at a priority until
/// dropped, then back under the policy and priority it had. Ordinary (`SCHED_OTHER`)
/// threads never preempt it, so a short control action, such as a freeze and a thaw of
/// a task, is not held up behind the very processes it thaws, each of which would
/// otherwise run a time slice before it. Use it only around code that sleeps or ends
/// quickly (the kernel leaves ordinary threads 5 % of each second in any case, its
/// `sched_rt_runtime_us`), and on the thread that drops it.
pub struct RealTime {
    policy: libc::c_int,
    param: libc::sched_param,
}

impl RealTime {
    /// Puts the calling thread under `SCHED_FIFO` at `priority` (1 to 99). `Ok(None)` when
    /// `priority` is 0 or the thread is real-time already (nothing is changed); an error
    /// when the kernel refuses (no CAP_SYS_NICE, or a cpu cgroup without real-time
    /// runtime), and the thread goes on as it was.
    pub fn enter(priority: u8) -> io::Result<Option<RealTime>> {
        if priority == 0 {
            return Ok(None);
        }
        // SAFETY: sched_getscheduler with pid 0 reads the calling thread's policy.
        let policy = unsafe { libc::sched_getscheduler(0) };
        if policy < 0 {
            return Err(io::Error::last_os_error());
        }
        if matches!(
            policy & !libc::SCHED_RESET_ON_FORK,
            libc::SCHED_FIFO | libc::SCHED_RR
        ) {
            return Ok(None);
        }
        // SAFETY: sched_param is plain integers (more of them on musl), all valid at 0,
        // the only priority of the policies that are not real-time.
        let param: libc::sched_param = unsafe { std::mem::zeroed() };
        let mut fifo = param;
        fifo.sched_priority = libc::c_int::from(priority.min(99));
        // Threads and processes it starts meanwhile start ordinary.
        let fifo_policy = libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK;
        // SAFETY: sched_setscheduler with pid 0 changes the calling thread only (the
        // raw system call's meaning, which glibc's wrapper keeps) and reads `fifo`.
        if unsafe { libc::sched_setscheduler(0, fifo_policy, &fifo) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Some(RealTime { policy, param }))
    }
}

impl Drop for RealTime {
    fn drop(&mut self) {
        // SAFETY: as in `enter`; the thread's own policy and priority of before.
        unsafe { libc::sched_setscheduler(0, self.policy, &self.param) };
    }
}

/// The open-file limit of this process before [`raise_open_files`] raised it.
static FIRST_NOFILE: std::sync::OnceLock<(u64, u64)> = std::sync::OnceLock::new();

/// Raises this process's soft limit of open files to its hard limit, remembering the
/// limit it had for the programs it starts ([`first_open_files_for`]). cland (a socket per
/// peer, session and link, a /proc directory per link) and the view server (connections
/// and links per node) need more than the usual 1,024.
pub fn raise_open_files() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = FIRST_NOFILE.set((soft, hard));
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

/// Makes `cmd`'s program start with the open-file limit this process started with (not
/// the one [`raise_open_files`] raised it to), as the programs a user starts would.
pub fn first_open_files_for(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let Some(&(soft, hard)) = FIRST_NOFILE.get() else {
        return;
    };
    let lim = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: the closure runs between fork and exec and makes one async-signal-safe
    // call (setrlimit) on data prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            Ok(())
        });
    }
}

/// The signals whose disposition an exec keeps: those ignored (a handler does not survive
/// an exec), as a mask with bit `n - 1` for signal `n` (the form of `SigIgn` in
/// /proc/PID/status). The kernel's view, which also covers the two real-time signals glibc
/// keeps for itself.
/// `None` when /proc can not tell.
pub fn ignored_signals() -> Option<u64> {
    read_small("/proc/self/status")
        .ok()
        .and_then(|s| u64::from_str_radix(status_field(&s, "SigIgn")?.trim(), 16).ok())
}

/// What this program's caller left ignored, as far as it can tell: [`ignored_signals`]
/// but SIGPIPE, which every Rust program ignores from its start (so whether its caller
/// did is unknown; its processes get it at its default). None ignored when /proc can not
/// tell.
pub fn ignored_by_caller() -> u64 {
    ignored_signals().unwrap_or(0) & !signal_bit(libc::SIGPIPE)
}

/// The bit of signal `sig` in a mask of [`ignored_signals`].
pub fn signal_bit(sig: i32) -> u64 {
    if (1..=64).contains(&sig) {
        1 << (sig - 1)
    } else {
        0
    }
}

/// Sets signal `sig` to its default action (`ignore` false) or to be ignored, with the
/// system call itself: glibc refuses signals 32 and 33, which a process can still have
/// been given ignored. Async-signal-safe (for a child between fork and exec).
pub fn set_ignored(sig: i32, ignore: bool) -> io::Result<()> {
    /// The kernel's `struct sigaction` (x86-64, arm64; riscv64 has no restorer, and reads
    /// the zero restorer as the zero mask).
    #[repr(C)]
    struct KernelSigaction {
        handler: libc::sighandler_t,
        flags: libc::c_ulong,
        restorer: usize,
        mask: u64,
    }
    let act = KernelSigaction {
        handler: if ignore { libc::SIG_IGN } else { libc::SIG_DFL },
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    // SAFETY: rt_sigaction reads `act` (a valid kernel sigaction) and writes nothing (no
    // old action asked for); SIG_DFL and SIG_IGN run no code of ours.
    let r = unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            sig,
            &act as *const KernelSigaction,
            std::ptr::null_mut::<KernelSigaction>(),
            8usize,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The contents of a small kernel file (/proc, cgroupfs): one read into a page-sized
/// buffer, no `stat` first and no growing reads (std's `read_to_string` stats the file,
/// then reads it in chunks of 32, 32, 64, ... bytes, as these files have size 0); more
/// reads only when a page does not hold it.
pub fn read_small(path: impl AsRef<std::path::Path>) -> io::Result<String> {
    let buf = read_whole_at(&std::fs::File::open(path)?)?;
    String::from_utf8(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// The whole contents of an open small kernel file, read from its start (which also makes
/// the kernel render it afresh, so a descriptor kept open reads the current contents), as
/// [`read_small`] reads: a page first, more only when a page does not hold it.
pub fn read_whole_at(f: &std::fs::File) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 4096];
    let mut n = 0;
    loop {
        if n == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match f.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(n);
    Ok(buf)
}

/// One field of a /proc `status` file (`"Groups"`, `"NSpid"`): the text after the colon.
pub fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == key).then_some(v.trim())
    })
}

/// A capability set of a `status` field (`CapEff`, `CapPrm`: hexadecimal), if it parses.
pub fn status_caps(status: &str, key: &str) -> Option<u64> {
    u64::from_str_radix(status_field(status, key)?, 16).ok()
}

/// Capability numbers (linux/capability.h) the cluster /proc applies the kernel's rules of.
pub mod cap {
    pub const DAC_OVERRIDE: u32 = 1;
    pub const DAC_READ_SEARCH: u32 = 2;
    pub const SETGID: u32 = 6;
    pub const SETUID: u32 = 7;
    pub const SYS_PTRACE: u32 = 19;

    /// Whether the set `caps` holds capability `cap`.
    pub fn has(caps: u64, cap: u32) -> bool {
        caps & (1 << cap) != 0
    }
}

/// The numbers of a `status` field, in order, skipping what does not parse.
pub fn status_numbers<T: std::str::FromStr>(status: &str, key: &str) -> Vec<T> {
    status_field(status, key)
        .map(|v| {
            v.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The pid of host process `host` in its innermost pid namespace (the last `NSpid`
/// number). That is its number in its node only for a process known to live directly in
/// the node's namespace: one of a nested namespace (`unshare -pf`) has its inner number
/// there; use [`ns_pid_at`] with the node's level for the processes of a task.
pub fn ns_pid_of_host(host: u32) -> Option<u32> {
    let s = read_small(format!("/proc/{host}/status")).ok()?;
    status_numbers(&s, "NSpid").last().copied()
}

/// The pid of host process `host` in the pid namespace `level` levels below the one of
/// this /proc (the node's: 0 on a real node, 1 on a local cluster, which is the number of
/// `NSpid` entries of a process living directly in the node's namespace, less one), also
/// for a process in a namespace nested deeper. A process above that level (outside the
/// node's namespace: an adopted host process of a local cluster) keeps its own number here.
pub fn ns_pid_at(host: u32, level: usize) -> Option<u32> {
    let s = read_small(format!("/proc/{host}/status")).ok()?;
    nspid_at(&s, level)
}

/// The `NSpid` entry of a `status` text at `level`, or its last one when it has fewer.
fn nspid_at(status: &str, level: usize) -> Option<u32> {
    let v = status_numbers::<u32>(status, "NSpid");
    v.get(level).or(v.last()).copied()
}

#[cfg(test)]
mod status_tests {
    use super::*;

    #[test]
    fn signals_set_ignored_and_back_show_in_sig_ign() {
        // In a child (dispositions are the whole process's): ignore SIGUSR1 and signal 32
        // (which glibc refuses), then set SIGUSR1 back; the exit code says what SigIgn had.
        // SAFETY: the child of this (possibly multi-threaded) test makes raw system calls
        // and reads /proc (allocating, which glibc's malloc allows after fork) before _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let before = ignored_signals().unwrap_or(u64::MAX);
            let ok = set_ignored(libc::SIGUSR1, true).is_ok() && set_ignored(32, true).is_ok();
            let both = ignored_signals().unwrap_or(0);
            let back = set_ignored(libc::SIGUSR1, false).is_ok();
            let after = ignored_signals().unwrap_or(0);
            let want = signal_bit(libc::SIGUSR1) | signal_bit(32);
            let good = ok
                && back
                && both == before | want
                && after == (before | signal_bit(32)) & !signal_bit(libc::SIGUSR1);
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(if good { 0 } else { 1 }) };
        }
        let mut st = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "status {st:#x}"
        );
    }

    #[test]
    fn a_queued_signal_carries_its_value_and_sender() {
        // A child (one thread, so the signal can only go to it) blocks SIGRTMIN+3, says so,
        // takes the signal with sigwaitinfo and exits 0 if it carries what was sent.
        let sig = libc::SIGRTMIN() + 3;
        let mut fds = [0; 2];
        // SAFETY: fds is a valid array of two ints.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child only makes async-signal-safe calls before _exit.
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: as above; every pointer is to this stack frame.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, sig);
                libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                libc::write(fds[1], b"r".as_ptr().cast(), 1);
                let mut info: libc::siginfo_t = std::mem::zeroed();
                let ok = libc::sigwaitinfo(&set, &mut info) == sig
                    && info.si_code == SI_QUEUE
                    && info.si_pid() == 20000006
                    && info.si_uid() == 1000
                    && info.si_value().sival_ptr as i64 == -42;
                libc::_exit(if ok { 0 } else { 1 });
            }
        }
        assert!(child > 0);
        let mut b = [0u8; 1];
        // SAFETY: reading one byte into b from our end of the pipe.
        assert_eq!(unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 1) }, 1);
        let fd = pidfd_open(child).unwrap();
        pidfd_send_queued(&fd, sig, 20000006, 1000, -42).unwrap();
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{status:#x}"
        );
        // SAFETY: closing our pipe ends.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }

    #[test]
    fn small_files_read_whole() {
        let d = std::env::temp_dir().join(format!("clan-read-small-{}", std::process::id()));
        let big: String = (0..3000).map(|i| format!("{i}\n")).collect();
        for text in ["", "0\n", big.as_str()] {
            std::fs::write(&d, text).unwrap();
            assert_eq!(read_small(&d).unwrap(), text);
        }
        std::fs::remove_file(&d).unwrap();
        assert!(read_small("/proc/self/stat").unwrap().ends_with('\n'));
        assert!(read_small(&d).is_err());
    }

    #[test]
    fn status_fields_by_exact_key() {
        let s = "Pid:\t7\nPPid:\t1\nNSpid:\tx 12 7\nGroups:\n";
        assert_eq!(status_numbers::<u32>(s, "Pid"), vec![7]);
        assert_eq!(status_numbers::<u32>(s, "PPid"), vec![1]);
        assert_eq!(status_numbers::<u64>(s, "NSpid"), vec![12, 7]);
        assert_eq!(status_field(s, "Groups"), Some(""));
        assert!(status_numbers::<u32>("garbage", "NSpid").is_empty());
    }

    #[test]
    fn stat_lines_split_at_the_last_parenthesis() {
        let line = b"4242 (a (b) c) S 1 4242 4243 0 -1 4194560 120 0 0 0 3 1 0 0 20 0 1 0 \
                     98765 11145216 777 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0\n";
        let s = StatLine::parse(line).unwrap();
        assert_eq!(s.comm, b"a (b) c");
        assert_eq!(s.state(), Some('S'));
        assert_eq!(s.number::<u32>(4), Some(1), "ppid");
        assert_eq!(s.number::<u32>(6), Some(4243), "session");
        assert_eq!(s.number::<i32>(8), Some(-1), "tpgid");
        assert_eq!(s.number::<u64>(22), Some(98765), "start time");
        assert_eq!(s.number::<u64>(24), Some(777), "rss");
        assert_eq!(s.number::<u64>(41), Some(0), "the last field of this line");
        assert_eq!(s.field(42), None);
        assert_eq!(s.field(2), None, "the name is not a field");
        assert!(StatLine::parse(b"12 (x)").is_none(), "cut short");
        assert!(StatLine::parse(b"garbage").is_none());
        assert!(StatLine::parse(b") (").is_none());
        let own = std::fs::read("/proc/self/stat").unwrap();
        let s = StatLine::parse(&own).unwrap();
        assert_eq!(s.number::<u32>(1 + 2), None, "the state is no number");
        assert_eq!(s.field(52).map(|_| ()), Some(()));
        let start = s.number::<u64>(22);
        assert_eq!(state_and_start(std::process::id()).map(|(_, t)| t), start);
    }

    #[test]
    fn nspid_is_taken_at_the_node_level() {
        // A process of a node of a local cluster (level 1), in a namespace nested twice.
        let s = "Pid:\t900\nNSpid:\t900\t42\t1\t3\n";
        assert_eq!(nspid_at(s, 1), Some(42));
        assert_eq!(nspid_at(s, 0), Some(900));
        // A host process outside the node's namespace keeps its host number.
        assert_eq!(nspid_at("NSpid:\t900\n", 1), Some(900));
        assert_eq!(nspid_at("Pid:\t1\n", 1), None);
    }
}
/// State letter and start time (clock ticks after boot) of host process `pid`, from
/// /proc/PID/stat; `None` once it is gone.
pub fn state_and_start(pid: u32) -> Option<(char, u64)> {
    state_and_start_in(std::path::Path::new("/proc"), pid)
}

/// [`state_and_start`] of process `pid` of the /proc at `proc_root`.
pub fn state_and_start_in(proc_root: &std::path::Path, pid: u32) -> Option<(char, u64)> {
    let f = std::fs::File::open(proc_root.join(format!("{pid}/stat"))).ok()?;
    state_and_start_of(&f)
}

/// [`state_and_start`] read through `f`, a process's `stat` file kept open: it stays with
/// that process (once it is gone, reads fail, whoever has its pid since), and reads it
/// afresh from its start without a path walk.
pub fn state_and_start_of(f: &std::fs::File) -> Option<(char, u64)> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; STAT_LINE_MAX];
    let n = f.read_at(&mut buf, 0).ok()?;
    let line = StatLine::parse(&buf[..n])?;
    Some((line.state()?, line.number(22)?))
}

/// Room for a whole `stat` line in one read: a command name of at most 64 bytes and 52
/// numbers stay under 1.5 KiB.
pub const STAT_LINE_MAX: usize = 2048;

/// A process's `stat` line (proc(5)), split once: the command name (between the first
/// `(` and the last `)`, as it may hold either and spaces) and the fields after it. Read
/// for every process a job operation, a liveness check or a heartbeat's scan looks at,
/// where the fields used are a handful of the 52.
pub struct StatLine<'a> {
    pub comm: &'a [u8],
    /// Fields 3 (the state) and on.
    rest: Vec<&'a [u8]>,
}

impl<'a> StatLine<'a> {
    /// `None` for a line cut short or not a `stat` line.
    pub fn parse(line: &'a [u8]) -> Option<StatLine<'a>> {
        let open = line.iter().position(|&b| b == b'(')?;
        let close = line.iter().rposition(|&b| b == b')')?;
        let comm = line.get(open + 1..close)?;
        let rest: Vec<&[u8]> = line[close + 1..]
            .split(|b| b.is_ascii_whitespace())
            .filter(|f| !f.is_empty())
            .collect();
        (!rest.is_empty()).then_some(StatLine { comm, rest })
    }

    /// Field `n`, numbered as in proc(5) (3 is the state); `None` past the end.
    pub fn field(&self, n: usize) -> Option<&'a [u8]> {
        self.rest.get(n.checked_sub(3)?).copied()
    }

    /// Field `n` as a number.
    pub fn number<T: std::str::FromStr>(&self, n: usize) -> Option<T> {
        std::str::from_utf8(self.field(n)?).ok()?.parse().ok()
    }

    /// The state letter (field 3).
    pub fn state(&self) -> Option<char> {
        self.field(3)?.first().map(|&b| char::from(b))
    }
}

/// Whether a process known by pid and start time still lives (not a zombie, not gone, not
/// replaced by a later process with its pid).
pub fn lives(pid: u32, start: u64) -> bool {
    matches!(state_and_start(pid), Some((st, t)) if t == start && !matches!(st, 'Z' | 'X'))
}

/// How a [`spin_until_readable`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spun {
    /// The descriptor is readable.
    Ready,
    /// Another thread took the CPU when it was offered.
    Offered,
    /// The limit passed with the descriptor not readable and no other thread taking the CPU.
    Expired,
}

/// Waits up to `limit` for `fd` to become readable while keeping a CPU no other thread
/// wants: polls it without blocking, and offers the CPU between polls; once another
/// thread takes it (the offer took more than 5 us), it stops and returns, so it
/// never holds up the threads it waits for when they share its CPU. For a call whose
/// answer comes from another CPU within a few tens of microseconds: on a virtual machine
/// whose idle CPUs halt, a thread that sleeps for it has its CPU halted and woken again by
/// an interrupt from the answering one (about 50 us on the VMs clan is measured on), and
/// one that polls does not. A poll can still hold up its own answer (seen, its cause not
/// known): [`Spinner`] stops polling for a while when it seems to have.
fn spin_until_readable(fd: std::os::fd::BorrowedFd<'_>, limit: std::time::Duration) -> Spun {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::time::Instant;
    let until = Instant::now() + limit;
    loop {
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        if poll(&mut fds, PollTimeout::ZERO).is_ok_and(|n| n > 0) {
            return Spun::Ready;
        }
        let now = Instant::now();
        if now >= until {
            return Spun::Expired;
        }
        std::thread::yield_now();
        if now.elapsed() > YIELDED {
            return Spun::Offered;
        }
    }
}

/// How long an offer of the CPU ([`std::thread::yield_now`]) takes when no other thread
/// takes it, at most (a system call, about a microsecond on a VM); longer, another ran.
const YIELDED: std::time::Duration = std::time::Duration::from_micros(5);

/// One thread's waits for one descriptor, each polling (`spin_until_readable`) before
/// the caller sleeps for it, that stop polling for a while when polling seems to have held
/// up what they wait for. The sign of that: a poll ran its whole limit with no other
/// thread taking the CPU offered, and what it waited for came at once after it gave up
/// ([`Spinner::arrived`] within `STARVED_WITHIN`), as when the thread that answers
/// shares the CPU and did not get it (with every process of a read through the cluster
/// /proc on one vCPU, Linux 6.18: whole series of reads at 365 us instead of 70, in 2 of
/// 16 benchmark runs). The next `SKIP_FIRST` waits then sleep at once, twice as many
/// after each further sign, up to `SKIP_MOST`; a poll that ends with the descriptor
/// readable clears that. What comes later than that after an expired poll (a client that
/// paused between requests, a slow answer) does not count.
#[derive(Debug, Default)]
pub struct Spinner {
    /// Waits left that do not poll, and how many the next sign gives.
    skip: u32,
    next_skip: u32,
    /// When the last poll expired, until [`Spinner::arrived`] sees what came after it.
    expired: Option<std::time::Instant>,
}

/// What comes within this of an expired poll was held up by it (see [`Spinner`]).
const STARVED_WITHIN: std::time::Duration = std::time::Duration::from_micros(100);
/// Waits that sleep at once after the first sign of a poll holding up its answer, and at
/// most after several in a row (see [`Spinner`]).
const SKIP_FIRST: u32 = 16;
const SKIP_MOST: u32 = 1024;

impl Spinner {
    /// Waits up to `limit` for `fd` to become readable by polling (or not at all while
    /// polls are held off); true if it is. The caller then reads, blocking, and calls
    /// [`Spinner::arrived`] once what it waited for came.
    pub fn wait(&mut self, fd: std::os::fd::BorrowedFd<'_>, limit: std::time::Duration) -> bool {
        self.expired = None;
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        self.ended(spin_until_readable(fd, limit))
    }

    /// Takes note of how a poll ended; whether the descriptor is readable.
    fn ended(&mut self, spun: Spun) -> bool {
        match spun {
            Spun::Ready => self.next_skip = 0,
            Spun::Offered => {}
            Spun::Expired => self.expired = Some(std::time::Instant::now()),
        }
        spun == Spun::Ready
    }

    /// What the last [`Spinner::wait`] waited for came (read by the caller).
    pub fn arrived(&mut self) {
        let Some(at) = self.expired.take() else {
            return;
        };
        if at.elapsed() < STARVED_WITHIN {
            self.skip = self.next_skip.clamp(SKIP_FIRST, SKIP_MOST);
            self.next_skip = self.skip.saturating_mul(2);
        }
    }
}

/// The calling thread (only) acting as another user until dropped: its effective uid and
/// gid and its groups become the user's, with raw syscalls (glibc's wrappers would change
/// every thread). Taking a non-zero effective uid clears the thread's effective
/// capabilities, so the kernel applies its own rules (modes, ptrace checks, what `stat`,
/// `wchan` or `kallsyms` show) as if the user had asked; the real and saved uids stay 0,
/// so dropping the guard takes the daemon's identity back. Use it only around code that
/// does not yield to other tasks (no `.await`): the thread must be the one that drops it.
pub struct ActingAs {
    gid: u32,
    groups: Vec<libc::gid_t>,
    /// The thread's capabilities before, when it kept uid 0 and lowered its effective set
    /// ([`ActingAs::reader`]); `None` when it took a user's uid.
    caps: Option<[CapData; 2]>,
    /// Not `Send`: the thread that made it gives its identity back.
    _thread: std::marker::PhantomData<*const ()>,
}

/// `struct __user_cap_header_struct` (linux/capability.h).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct`: one 32-bit half of each set.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit sets, as two `CapData`.
const CAP_VERSION_3: u32 = 0x2008_0522;

/// The calling thread's capabilities.
fn thread_caps() -> io::Result<[CapData; 2]> {
    let mut head = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget writes one header and two data structs, both ours and live.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut head, data.as_mut_ptr()) };
    if r == 0 {
        Ok(data)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets the calling thread's (only: the raw system call with pid 0) capabilities.
fn set_thread_caps(data: &[CapData; 2]) -> io::Result<()> {
    let mut head = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    // SAFETY: capset reads one header and two data structs, both ours and live.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut head, data.as_ptr()) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn effective(data: &[CapData; 2]) -> u64 {
    u64::from(data[0].effective) | u64::from(data[1].effective) << 32
}

/// A thread's own identity, as [`ActingAs`] finds it before it changes anything.
#[derive(Clone, Copy)]
struct Own {
    euid: u32,
    caps: [CapData; 2],
}

thread_local! {
    /// This thread's own identity, read at its first [`ActingAs`]: only an [`ActingAs`]
    /// changes a thread's credentials (the daemons change no others once they serve), and
    /// it gives them back when dropped, so outside one they are what they were. A
    /// request served on a daemon's thread then costs no `geteuid` or `capget` to learn
    /// that its reader is the daemon itself.
    static OWN: std::cell::Cell<Option<Own>> = const { std::cell::Cell::new(None) };
    /// The [`ActingAs`] alive on this thread (inside one, the identity is read again).
    static ACTING: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// The calling thread's effective uid and capabilities.
fn own() -> io::Result<Own> {
    let acting = ACTING.with(|a| a.get()) > 0;
    if !acting {
        if let Some(o) = OWN.with(|o| o.get()) {
            return Ok(o);
        }
    }
    let o = Own {
        // SAFETY: geteuid has no preconditions.
        euid: unsafe { libc::geteuid() },
        caps: thread_caps()?,
    };
    if !acting {
        OWN.with(|c| c.set(Some(o)));
    }
    Ok(o)
}

impl ActingAs {
    /// Acts as `uid`/`gid`/`groups`; `Ok(None)` when the caller is not root or the user is
    /// root (nothing to change).
    pub fn user(uid: u32, gid: u32, groups: &[u32]) -> io::Result<Option<ActingAs>> {
        if uid == 0 || own()?.euid != 0 {
            return Ok(None);
        }
        ActingAs::switch(Some(uid), gid, groups, None)
    }

    /// Acts as a reader with these ids and effective capabilities (`caps`: its `CapEff`;
    /// `None`: not known, all of them). A user's uid drops every capability, as
    /// [`ActingAs::user`]; root keeps its uid and takes the reader's gid and groups and,
    /// in place of its effective set, the part of it the reader has: the kernel's
    /// privilege is the capability, not uid 0 (a root process without CAP_SYS_PTRACE may
    /// not read another user's `cwd`). `Ok(None)` when there is nothing to change.
    pub fn reader(
        uid: u32,
        gid: u32,
        groups: &[u32],
        caps: Option<u64>,
    ) -> io::Result<Option<ActingAs>> {
        let own = own()?;
        if own.euid != 0 {
            return Ok(None);
        }
        if uid != 0 {
            return ActingAs::user(uid, gid, groups);
        }
        let Some(caps) = caps else {
            return Ok(None);
        };
        let before = own.caps;
        let mine = effective(&before);
        if mine & !caps == 0 {
            return Ok(None);
        }
        let lowered = mine & caps;
        let mut after = before;
        after[0].effective = lowered as u32;
        after[1].effective = (lowered >> 32) as u32;
        ActingAs::switch(None, gid, groups, Some((before, after)))
    }

    /// Takes `groups`, `gid`, then `uid` (a user's) or the capabilities `caps` (before,
    /// after) on this thread.
    fn switch(
        uid: Option<u32>,
        gid: u32,
        groups: &[u32],
        caps: Option<([CapData; 2], [CapData; 2])>,
    ) -> io::Result<Option<ActingAs>> {
        // SAFETY: getgroups with size 0 only counts the groups.
        let count = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
        if count < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut saved = vec![0 as libc::gid_t; count as usize];
        // SAFETY: getgroups writes at most `saved.len()` gids into the buffer we own.
        let n = unsafe { libc::getgroups(count, saved.as_mut_ptr()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        saved.truncate(n as usize);
        let undo = ActingAs {
            // SAFETY: getegid has no preconditions.
            gid: unsafe { libc::getegid() },
            groups: saved,
            caps: caps.map(|(before, _)| before),
            _thread: std::marker::PhantomData,
        };
        ACTING.with(|a| a.set(a.get() + 1));
        let check = |ret: libc::c_long| {
            if ret == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        };
        // SAFETY: raw setgroups with a pointer to `groups.len()` valid gid_t values that
        // live across the call; it changes only this thread's supplementary groups.
        check(unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) })?;
        // From here on, dropping `undo` puts back what changed (a failed step included).
        // SAFETY: raw setresgid/setresuid take plain integers (-1: unchanged) and change
        // only this thread's credentials.
        check(unsafe { libc::syscall(libc::SYS_setresgid, -1i32, gid, -1i32) })?;
        match (uid, caps) {
            (Some(uid), _) => {
                // SAFETY: as above.
                check(unsafe { libc::syscall(libc::SYS_setresuid, -1i32, uid, -1i32) })?
            }
            (None, Some((_, after))) => set_thread_caps(&after)?,
            (None, None) => {}
        }
        Ok(Some(undo))
    }
}

impl Drop for ActingAs {
    fn drop(&mut self) {
        // The capabilities (or the effective uid, which gives them back) first: the other
        // two need them. Failing here would leave a thread of the daemon with a user's
        // identity: abort rather than go on.
        if let Some(caps) = &self.caps {
            if set_thread_caps(caps).is_err() {
                std::process::abort();
            }
        }
        // SAFETY: as in `switch`.
        unsafe {
            if (self.caps.is_none() && libc::syscall(libc::SYS_setresuid, -1i32, 0u32, -1i32) != 0)
                || libc::syscall(libc::SYS_setresgid, -1i32, self.gid, -1i32) != 0
                || libc::syscall(libc::SYS_setgroups, self.groups.len(), self.groups.as_ptr()) != 0
            {
                std::process::abort();
            }
        }
        ACTING.with(|a| a.set(a.get() - 1));
    }
}

/// An flock(2) on a file, released when dropped (or when the file is closed).
#[derive(Debug)]
pub struct FileLock<'a>(&'a std::fs::File);

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        // SAFETY: flock(2) on a descriptor the borrowed file keeps open.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Takes an flock(2) on `f`: shared or exclusive, waiting for it or not (`Ok(None)` when
/// it is held elsewhere and `wait` is false).
pub fn flock(f: &std::fs::File, exclusive: bool, wait: bool) -> io::Result<Option<FileLock<'_>>> {
    let mut op = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    };
    if !wait {
        op |= libc::LOCK_NB;
    }
    loop {
        // SAFETY: flock(2) on a descriptor the borrowed file keeps open.
        if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
            return Ok(Some(FileLock(f)));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) if !wait => return Ok(None),
            _ => return Err(e),
        }
    }
}

#[cfg(test)]
mod acting_tests {
    use super::*;

    /// The calling thread's effective capabilities, as /proc shows them.
    fn eff() -> u64 {
        let s = read_small("/proc/thread-self/status").unwrap();
        status_caps(&s, "CapEff").unwrap()
    }

    #[test]
    fn root_reader_without_a_capability_lowers_this_thread_only() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root");
            return;
        }
        let mine = eff();
        if !cap::has(mine, cap::SYS_PTRACE) {
            eprintln!("skipped: needs CAP_SYS_PTRACE");
            return;
        }
        // A thread started before (a new one starts with a copy of its creator's).
        let (ask, asked) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            asked.recv().unwrap();
            eff()
        });
        let without = mine & !(1 << cap::SYS_PTRACE);
        let acting = ActingAs::reader(0, 0, &[], Some(without)).unwrap();
        assert!(acting.is_some());
        assert_eq!(eff(), without);
        ask.send(()).unwrap();
        assert_eq!(
            other.join().unwrap(),
            mine,
            "another thread keeps its capabilities"
        );
        drop(acting);
        assert_eq!(eff(), mine, "given back");
        // Nothing to lower, or not known: nothing changes.
        assert!(ActingAs::reader(0, 0, &[], Some(u64::MAX))
            .unwrap()
            .is_none());
        assert!(ActingAs::reader(0, 0, &[], None).unwrap().is_none());
    }

    /// The thread's own identity is read once, and again inside an [`ActingAs`]: one made
    /// inside another starts from what the outer one left and gives that back.
    #[test]
    fn acting_inside_acting_starts_from_the_outer_identity() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root");
            return;
        }
        let mine = eff();
        if !cap::has(mine, cap::SYS_PTRACE) || !cap::has(mine, cap::DAC_READ_SEARCH) {
            eprintln!("skipped: needs CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH");
            return;
        }
        std::thread::spawn(move || {
            // The identity read and kept: nothing to change for the daemon itself.
            assert!(ActingAs::reader(0, 0, &[], Some(mine)).unwrap().is_none());
            let outer = mine & !(1 << cap::SYS_PTRACE);
            let inner = outer & !(1 << cap::DAC_READ_SEARCH);
            let a = ActingAs::reader(0, 0, &[], Some(outer))
                .unwrap()
                .expect("lowered");
            let b = ActingAs::reader(0, 0, &[], Some(inner))
                .unwrap()
                .expect("lowered");
            assert_eq!(eff(), inner);
            drop(b);
            assert_eq!(eff(), outer, "the inner one gives back the outer's set");
            drop(a);
            assert_eq!(eff(), mine);
            // As a user, the thread can take no other user's identity, and says so.
            let u = ActingAs::user(65534, 65534, &[]).unwrap().expect("a user");
            // SAFETY: geteuid has no preconditions.
            assert_eq!(unsafe { libc::geteuid() }, 65534);
            assert!(ActingAs::user(65533, 65533, &[]).unwrap().is_none());
            drop(u);
            // SAFETY: geteuid has no preconditions.
            assert_eq!(unsafe { libc::geteuid() }, 0);
            assert_eq!(eff(), mine);
        })
        .join()
        .unwrap();
    }
}

#[cfg(test)]
mod realtime_tests {
    use super::*;

    /// The policy of the calling thread, as /proc shows it (field 41 of its `stat`).
    fn policy() -> u32 {
        let s = read_small("/proc/thread-self/stat").unwrap();
        let after = &s[s.rfind(')').unwrap() + 2..];
        after.split(' ').nth(38).unwrap().parse().unwrap()
    }

    #[test]
    fn real_time_holds_for_this_thread_until_dropped() {
        assert!(
            RealTime::enter(0).unwrap().is_none(),
            "priority 0: nothing changes"
        );
        assert_eq!(policy(), libc::SCHED_OTHER as u32);
        // A thread started before.
        let (ask, asked) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            asked.recv().unwrap();
            policy()
        });
        let rt = match RealTime::enter(1) {
            Ok(rt) => rt.expect("an ordinary thread"),
            Err(e) => {
                eprintln!("skipped: the kernel refuses SCHED_FIFO to this thread: {e}");
                ask.send(()).unwrap();
                return;
            }
        };
        assert_eq!(policy(), libc::SCHED_FIFO as u32);
        let started = std::thread::spawn(policy).join().unwrap();
        assert_eq!(started, libc::SCHED_OTHER as u32, "a thread it starts");
        ask.send(()).unwrap();
        assert_eq!(
            other.join().unwrap(),
            libc::SCHED_OTHER as u32,
            "another thread keeps its policy"
        );
        assert!(RealTime::enter(1).unwrap().is_none(), "real-time already");
        drop(rt);
        assert_eq!(policy(), libc::SCHED_OTHER as u32, "given back");
    }
}
