//! FUSE over io_uring (Linux 6.14 and later, `/sys/module/fuse/parameters/enable_uring`).
//!
//! The kernel keeps one queue of requests per possible CPU and puts each request on the
//! queue of the CPU its caller runs on. A server registers entries (a header buffer and a
//! payload buffer each) on every queue with `FUSE_IO_URING_CMD_REGISTER` commands; the
//! kernel copies a request into an entry and completes the command, as task work of the
//! thread that submitted it; the server writes its reply into the same entry and hands it
//! back with `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which also waits for the next request.
//! Each queue here has threads of its own, pinned to the queue's CPU, each with its own
//! ring: a request is read, served and answered on the CPU of the thread that asked, with
//! no wakeup of another CPU on the way (on a virtual machine whose idle CPUs halt, that
//! wakeup is most of a small request's time).
//!
//! Layouts: `include/uapi/linux/fuse.h` (protocol 7.42, `struct fuse_uring_req_header`,
//! `struct fuse_uring_cmd_req`); the kernel side is `fs/fuse/dev_uring.c`.
//!
//! What stays on `/dev/fuse`: INIT, FORGET, INTERRUPT, notifications, and requests made
//! before every queue has an entry. Once INIT's reply carries `FUSE_OVER_IO_URING`, the
//! kernel holds new requests until every queue has one, so everything that can fail
//! (rings, buffers, threads) is made before that reply; a REGISTER the kernel refuses
//! turns the connection back to `/dev/fuse`.
//!
//! Buffers are never freed: the kernel may write an entry's buffers as long as its
//! command is pending, which can outlive the ring's descriptor; a session's are a few
//! hundred KiB, held until the process ends.

use std::io;
use std::os::fd::AsRawFd;
use std::os::fd::FromRawFd;
use std::os::fd::OwnedFd;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::thread::ThreadId;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::error;
use log::warn;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::channel::Channel;
use crate::channel::ChannelSender;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `sizeof(struct fuse_in_header)` and `sizeof(struct fuse_out_header)`.
const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;
/// `FUSE_URING_OP_IN_OUT_SZ`.
const OP_IN: usize = 128;
/// The smallest payload the kernel takes (`FUSE_MIN_READ_BUFFER`).
const MIN_PAYLOAD: usize = 8192;
/// Entries a ring starts with. The kernel gives each request of a CPU's queue to an idle
/// entry of that queue, or queues it until an entry is handed back by a commit (an entry
/// registered later does not take requests already queued): a queue serves as many
/// requests at once as it has entries, and those answered later, on other threads (a
/// read that waits for a silent node), hold theirs until then. A thread busy with a
/// request keeps its other entries, which the kernel may fill meanwhile: they wait for
/// it (at most as long as the filesystem waits on a request's own thread).
const DEPTH: usize = 4;
/// Entries a ring may grow to: a request answered later, elsewhere, gets its ring a new
/// entry in its place, for the requests that come after (a read that waits for ever, on
/// `/proc/kmsg`, does not take its queue's capacity for good).
const MAX_ENTRIES: usize = 16;
/// `user_data` of the eventfd's poll (entries use their index).
const WAKE: u64 = u64::MAX;
/// Byte offset of `len` in an SQE (the io-uring crate has no setter for it on
/// `UringCmd80`, and REGISTER needs it).
const SQE_LEN: usize = 24;

/// `struct fuse_uring_req_header`: the first buffer of an entry.
#[repr(C)]
struct Header {
    /// `fuse_in_header` from the kernel, `fuse_out_header` to it.
    in_out: [u8; 128],
    /// The request's fixed argument (`in_args[0]`).
    op_in: [u8; OP_IN],
    /// `struct fuse_uring_ent_in_out`.
    flags: u64,
    commit_id: u64,
    payload_sz: u32,
    padding: u32,
    reserved: u64,
}

// The kernel's layout (`struct fuse_uring_req_header`, `struct fuse_uring_ent_in_out`).
const _: () = {
    assert!(std::mem::size_of::<Header>() == 288);
    assert!(std::mem::offset_of!(Header, op_in) == 128);
    assert!(std::mem::offset_of!(Header, flags) == 256);
    assert!(std::mem::offset_of!(Header, commit_id) == 264);
    assert!(std::mem::offset_of!(Header, payload_sz) == 272);
};

/// One entry's buffers, leaked (see the module's comment).
pub(crate) struct Entry {
    header: *mut Header,
    payload: *mut u8,
    payload_len: usize,
    /// The two buffers as REGISTER's `iovec[2]` (read by the kernel at registration).
    iov: *mut [libc::iovec; 2],
}

// SAFETY: an entry's buffers are leaked and touched by one thread at a time: the ring's
// thread between a completion and the dispatch, the one replying to the request until it
// queues the commit.
unsafe impl Send for Entry {}
// SAFETY: as above.
unsafe impl Sync for Entry {}

/// One ring: its thread's io_uring, entries, and the replies waiting to be committed.
pub(crate) struct Ring {
    qid: u16,
    cpu: Option<usize>,
    ring: Mutex<Option<IoUring<squeue::Entry128, cqueue::Entry>>>,
    /// The entries made before INIT's reply (the ring's thread makes more as needed).
    entries: Vec<&'static Entry>,
    payload_len: usize,
    /// Replies written into entries, to be committed by the ring's thread (which alone
    /// may submit: the kernel delivers the next request as task work of the submitter).
    pending: Mutex<Vec<(usize, u64)>>,
    wake: OwnedFd,
    /// The ring's thread, once it runs (replies made on it need no wakeup).
    owner: std::sync::OnceLock<ThreadId>,
    stop: AtomicBool,
}

/// Every queue's rings, made before INIT's reply.
pub(crate) struct Rings {
    rings: Vec<Arc<Ring>>,
}

impl std::fmt::Debug for Rings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Rings({} rings)", self.rings.len())
    }
}

/// The number of queues the kernel makes (`num_possible_cpus()`), when the possible CPUs
/// are 0..n (the kernel numbers queues by CPU: anything else is not served here).
fn possible_cpus() -> Option<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible").ok()?;
    let s = s.trim();
    let last = match s.split_once('-') {
        Some(("0", last)) => last.parse::<usize>().ok()?,
        None if s == "0" => 0,
        _ => return None,
    };
    Some(last + 1)
}

/// Whether the kernel lets this process run on `cpu`.
fn allowed(cpu: usize) -> bool {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0
            && cpu < libc::CPU_SETSIZE as usize
            && libc::CPU_ISSET(cpu, &set)
    }
}

fn pin(cpu: usize) {
    // SAFETY: as in `allowed`.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            debug!(
                "io_uring: not pinned to CPU {cpu}: {}",
                io::Error::last_os_error()
            );
        }
    }
}

fn leak_entry(payload_len: usize) -> &'static Entry {
    let header: &'static mut Header = Box::leak(Box::new(Header {
        in_out: [0; 128],
        op_in: [0; OP_IN],
        flags: 0,
        commit_id: 0,
        payload_sz: 0,
        padding: 0,
        reserved: 0,
    }));
    let payload: &'static mut [u8] = Box::leak(vec![0u8; payload_len].into_boxed_slice());
    let header: *mut Header = header;
    let payload = payload.as_mut_ptr();
    let iov = Box::leak(Box::new([
        libc::iovec {
            iov_base: header.cast(),
            iov_len: std::mem::size_of::<Header>(),
        },
        libc::iovec {
            iov_base: payload.cast(),
            iov_len: payload_len,
        },
    ]));
    Box::leak(Box::new(Entry {
        header,
        payload,
        payload_len,
        iov,
    }))
}

impl Rings {
    /// Makes `per_queue` rings for each queue, with entries of `payload_len` bytes of
    /// payload. `None` (and a log line) when anything fails: the session then stays on
    /// `/dev/fuse`.
    pub(crate) fn prepare(per_queue: usize, payload_len: usize) -> Option<Rings> {
        let Some(queues) = possible_cpus() else {
            warn!("io_uring: possible CPUs are not 0..n: serving on /dev/fuse");
            return None;
        };
        let payload_len = payload_len.max(MIN_PAYLOAD);
        let mut rings = Vec::new();
        for qid in 0..queues {
            for _ in 0..per_queue.max(1) {
                match Ring::new(qid, payload_len) {
                    Ok(r) => rings.push(Arc::new(r)),
                    Err(e) => {
                        warn!("io_uring: ring for queue {qid}: {e}: serving on /dev/fuse");
                        return None;
                    }
                }
            }
        }
        Some(Rings { rings })
    }

    /// Starts each ring's thread, serving `fs` on the connection `ch`. A thread that can
    /// not start stops the rings started before it: the kernel would hold requests for
    /// its queue for ever.
    pub(crate) fn start<FS: Filesystem>(
        self,
        ch: &Channel,
        make: impl Fn(String) -> SessionEventLoop<FS>,
    ) -> io::Result<RingThreads> {
        let mut threads = Vec::new();
        for ring in &self.rings {
            let name = format!("fuser-ring-{}", ring.qid);
            let se = make(name.clone());
            let fuse = std::os::fd::AsFd::as_fd(ch).as_raw_fd();
            let (ring, ch) = (ring.clone(), ch.sender());
            match std::thread::Builder::new()
                .name(name)
                .spawn(move || ring.serve(fuse, &se, ch))
            {
                Ok(t) => threads.push(t),
                Err(e) => {
                    // Dropped: the rings started so far stop.
                    drop(RingThreads {
                        rings: self.rings.clone(),
                        threads,
                    });
                    return Err(e);
                }
            }
        }
        Ok(RingThreads {
            rings: self.rings,
            threads,
        })
    }
}

/// The rings' threads, stopped when the session ends.
pub(crate) struct RingThreads {
    rings: Vec<Arc<Ring>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for RingThreads {
    /// Stops every ring's thread and waits for them (the filesystem they hold must be the
    /// session's alone again), also when the session ends early (an error, a panic).
    fn drop(&mut self) {
        for r in &self.rings {
            r.stop.store(true, Ordering::Release);
            r.notify();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Ring {
    fn new(qid: usize, payload_len: usize) -> io::Result<Ring> {
        let qid = u16::try_from(qid).map_err(|_| io::Error::other("too many CPUs"))?;
        // Entries' commands, the wake poll, and room for a commit of each.
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_cqsize(4 * (MAX_ENTRIES as u32 + 1))
            .build(2 * (MAX_ENTRIES as u32 + 1))?;
        // SAFETY: eventfd returns a new descriptor or -1.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if wake < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `wake` is a descriptor just made and owned by nothing else.
        let wake = unsafe { OwnedFd::from_raw_fd(wake) };
        let cpu = qid as usize;
        Ok(Ring {
            qid,
            cpu: allowed(cpu).then_some(cpu),
            ring: Mutex::new(Some(ring)),
            entries: (0..DEPTH).map(|_| leak_entry(payload_len)).collect(),
            payload_len,
            pending: Mutex::new(Vec::new()),
            wake,
            owner: std::sync::OnceLock::new(),
            stop: AtomicBool::new(false),
        })
    }

    fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to an eventfd we own.
        unsafe {
            libc::write(self.wake.as_raw_fd(), (&raw const one).cast(), 8);
        }
    }

    /// Queues the commit of entry `e` (its reply written), waking the ring's thread when
    /// another thread replied.
    fn commit(&self, e: usize, commit_id: u64) {
        self.pending.lock().push((e, commit_id));
        if self.owner.get() != Some(&std::thread::current().id()) {
            self.notify();
        }
    }

    fn cmd(&self, fuse: RawFd, op: u32, e: usize, ent: &Entry, commit_id: u64) -> squeue::Entry128 {
        let mut cmd = [0u8; 80];
        cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&self.qid.to_ne_bytes());
        let mut sqe = opcode::UringCmd80::new(types::Fd(fuse), op).cmd(cmd);
        if op == CMD_REGISTER {
            sqe = sqe.addr(Some(ent.iov as u64));
        }
        let mut sqe = sqe.build().user_data(e as u64);
        if op == CMD_REGISTER {
            // SAFETY: `Entry128` is `repr(C)` over the kernel's 128-byte SQE, whose `len`
            // (u32) is at byte 24: REGISTER takes the iovec count there.
            unsafe {
                (&raw mut sqe)
                    .cast::<u8>()
                    .add(SQE_LEN)
                    .cast::<u32>()
                    .write_unaligned(2)
            };
        }
        sqe
    }

    /// The ring's thread: registers its entries, then serves what the kernel puts in them
    /// until the connection ends or the session stops it.
    fn serve<FS: Filesystem>(
        self: &Arc<Ring>,
        fuse: RawFd,
        se: &SessionEventLoop<FS>,
        ch: ChannelSender,
    ) {
        let _abort = AbortOnPanic;
        if let Some(cpu) = self.cpu {
            pin(cpu);
        }
        let _ = self.owner.set(std::thread::current().id());
        let Some(mut ring) = self.ring.lock().take() else {
            return;
        };
        let mut entries = self.entries.clone();
        let mut sqes: Vec<squeue::Entry128> = (entries.iter().enumerate())
            .map(|(e, ent)| self.cmd(fuse, CMD_REGISTER, e, ent, 0))
            .collect();
        sqes.push(
            opcode::PollAdd::new(types::Fd(self.wake.as_raw_fd()), libc::POLLIN as u32)
                .multi(true)
                .build()
                .user_data(WAKE)
                .into(),
        );
        // Requests staged as /dev/fuse gives them (header, argument, payload), aligned
        // for the header.
        let biggest = self.payload_len + IN_HEADER + OP_IN;
        let mut stage = vec![0u64; biggest.div_ceil(8)];
        let mut live = entries.len();
        // Whether each entry's command in flight is a REGISTER (else a commit).
        let mut registering = vec![true; entries.len()];
        let mut done = Vec::new();
        while live > 0 && !self.stop.load(Ordering::Acquire) {
            sqes.extend(self.pending.lock().drain(..).map(|(e, id)| {
                registering[e] = false;
                self.cmd(fuse, CMD_COMMIT_AND_FETCH, e, entries[e], id)
            }));
            if !sqes.is_empty() {
                let mut sq = ring.submission();
                let mut pushed = 0;
                for sqe in &sqes {
                    // SAFETY: the SQE's buffers (an entry's iovec and buffers, leaked)
                    // outlive the command.
                    if unsafe { sq.push(sqe) }.is_err() {
                        // Full (it holds every command this ring can have): next turn.
                        break;
                    }
                    pushed += 1;
                }
                drop(sq);
                sqes.drain(..pushed);
            }
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
                Err(e) => {
                    // Its entries would be cancelled with the ring, and their CPU's
                    // requests wait for ever: end the server instead (as on a panic).
                    error!("io_uring queue {}: {e}: ending the server", self.qid);
                    std::process::abort();
                }
            }
            done.extend(
                ring.completion()
                    .map(|c| (c.user_data(), c.result(), c.flags())),
            );
            for (ud, res, flags) in done.drain(..) {
                if ud == WAKE {
                    let mut n = [0u8; 8];
                    // SAFETY: reads at most 8 bytes into a live buffer from our eventfd.
                    unsafe { libc::read(self.wake.as_raw_fd(), n.as_mut_ptr().cast(), 8) };
                    if !cqueue::more(flags) {
                        sqes.push(
                            opcode::PollAdd::new(
                                types::Fd(self.wake.as_raw_fd()),
                                libc::POLLIN as u32,
                            )
                            .multi(true)
                            .build()
                            .user_data(WAKE)
                            .into(),
                        );
                    }
                    continue;
                }
                let e = ud as usize;
                match -res {
                    0 => {
                        self.dispatch(e, entries[e], &mut stage, se, &ch);
                        // Answered later, elsewhere: the entry stays held until then, and
                        // a new one takes its place here.
                        let replied = self.pending.lock().iter().any(|&(x, _)| x == e);
                        if !replied && entries.len() < MAX_ENTRIES {
                            let ent = leak_entry(self.payload_len);
                            entries.push(ent);
                            registering.push(true);
                            live += 1;
                            sqes.push(self.cmd(fuse, CMD_REGISTER, entries.len() - 1, ent, 0));
                        }
                    }
                    libc::EAGAIN | libc::EINTR if registering[e] => {
                        // The connection is not initialized yet: again in a moment.
                        std::thread::sleep(std::time::Duration::from_millis(1));
                        sqes.push(self.cmd(fuse, CMD_REGISTER, e, entries[e], 0));
                    }
                    libc::ENOTCONN | libc::ECANCELED | libc::ENODEV | libc::ECONNABORTED => {
                        live -= 1
                    }
                    err if registering[e] => {
                        // The kernel refuses the ring (it then serves on /dev/fuse).
                        warn!(
                            "io_uring queue {}: registration refused: {}",
                            self.qid,
                            io::Error::from_raw_os_error(err)
                        );
                        live -= 1;
                    }
                    err => {
                        // A commit the kernel refused (a bug here): the entry is made
                        // again, so that the queue keeps serving.
                        error!(
                            "io_uring queue {}: commit refused: {}",
                            self.qid,
                            io::Error::from_raw_os_error(err)
                        );
                        registering[e] = true;
                        sqes.push(self.cmd(fuse, CMD_REGISTER, e, entries[e], 0));
                    }
                }
            }
        }
        debug!("io_uring queue {}: done", self.qid);
        // The ring's descriptor closes here; the buffers stay (see the module's comment).
    }

    /// Serves the request in entry `e`: staged as `/dev/fuse` gives it, then dispatched
    /// with a sender that replies into the entry.
    fn dispatch<FS: Filesystem>(
        self: &Arc<Ring>,
        e: usize,
        ent: &'static Entry,
        stage: &mut [u64],
        se: &SessionEventLoop<FS>,
        ch: &ChannelSender,
    ) {
        // SAFETY: the kernel filled the entry and completed its command: until this
        // request's reply is committed, the entry is ours.
        let (in_out, op_in, commit_id, payload_sz) = unsafe {
            let h = &*ent.header;
            (h.in_out, h.op_in, h.commit_id, h.payload_sz as usize)
        };
        let sender = RingSender {
            ring: self.clone(),
            ent,
            entry: e,
            commit_id,
            ch: ch.clone(),
        };
        let len = u32::from_ne_bytes([in_out[0], in_out[1], in_out[2], in_out[3]]) as usize;
        let op_len = len
            .checked_sub(IN_HEADER + payload_sz)
            .filter(|&n| n <= OP_IN && payload_sz <= ent.payload_len);
        let Some(op_len) = op_len else {
            error!(
                "io_uring queue {}: a request of {len} bytes with {payload_sz} of payload",
                self.qid
            );
            sender.error(commit_id, libc::EIO);
            return;
        };
        // SAFETY: `stage` is a live buffer of u64s, at least as long in bytes as a
        // header, a fixed argument and a payload.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(stage.as_mut_ptr().cast::<u8>(), stage.len() * 8)
        };
        bytes[..IN_HEADER].copy_from_slice(&in_out[..IN_HEADER]);
        bytes[IN_HEADER..IN_HEADER + op_len].copy_from_slice(&op_in[..op_len]);
        // SAFETY: the payload buffer holds `payload_len` >= `payload_sz` bytes (checked).
        let payload = unsafe { std::slice::from_raw_parts(ent.payload, payload_sz) };
        bytes[IN_HEADER + op_len..len].copy_from_slice(payload);
        match RequestWithSender::with_ring(sender.clone(), &bytes[..len]) {
            Some(req) => req.dispatch(se),
            None => sender.error(commit_id, libc::EIO),
        }
    }
}

/// Ends the process when a ring's thread panics: its queue would be left without
/// entries, and every request made on that CPU would wait for ever; a server that ends
/// has its mount taken away instead.
struct AbortOnPanic;

impl Drop for AbortOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            error!("io_uring: a ring's thread panicked: ending the server");
            std::process::abort();
        }
    }
}

/// Replies into a ring entry.
#[derive(Clone)]
pub(crate) struct RingSender {
    ring: Arc<Ring>,
    ent: &'static Entry,
    entry: usize,
    commit_id: u64,
    ch: ChannelSender,
}

impl std::fmt::Debug for RingSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RingSender(queue {}, entry {})",
            self.ring.qid, self.entry
        )
    }
}

impl RingSender {
    /// The `/dev/fuse` channel (backing files are opened there).
    pub(crate) fn channel(&self) -> &ChannelSender {
        &self.ch
    }

    fn error(&self, unique: u64, errno: i32) {
        let mut h = [0u8; OUT_HEADER];
        h[..4].copy_from_slice(&(OUT_HEADER as u32).to_ne_bytes());
        h[4..8].copy_from_slice(&(-errno).to_ne_bytes());
        h[8..16].copy_from_slice(&unique.to_ne_bytes());
        let _ = self.send(&[io::IoSlice::new(&h)]);
    }

    /// Writes a reply (`fuse_out_header` and body, as for `/dev/fuse`) into the entry
    /// and queues its commit.
    pub(crate) fn send(&self, data: &[io::IoSlice<'_>]) -> io::Result<()> {
        let ent = self.ent;
        let total: usize = data.iter().map(|d| d.len()).sum();
        if total < OUT_HEADER || total - OUT_HEADER > ent.payload_len {
            // Committed as an error rather than lost: the entry must go back.
            self.error(self.commit_id, libc::EIO);
            return Err(io::Error::other(format!("a reply of {total} bytes")));
        }
        // SAFETY: the entry is this request's until its commit (queued below, once).
        unsafe {
            let h = &mut *ent.header;
            let mut at = 0usize;
            for d in data {
                let mut d: &[u8] = d;
                if at < OUT_HEADER {
                    let n = d.len().min(OUT_HEADER - at);
                    h.in_out[at..at + n].copy_from_slice(&d[..n]);
                    at += n;
                    d = &d[n..];
                }
                if !d.is_empty() {
                    std::ptr::copy_nonoverlapping(
                        d.as_ptr(),
                        ent.payload.add(at - OUT_HEADER),
                        d.len(),
                    );
                    at += d.len();
                }
            }
            h.payload_sz = (total - OUT_HEADER) as u32;
        }
        self.ring.commit(self.entry, self.commit_id);
        Ok(())
    }
}
