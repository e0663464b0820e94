//! The FUSE layer: each request becomes a call of the [`View`] on a tokio task, which
//! replies when the answer is there, so a slow node never holds up other readers. Lookups
//! and listings of one directory run in parallel (`FUSE_PARALLEL_DIROPS`): without it the
//! kernel makes them wait for each other, and a lookup of a process of a silent node would
//! hold up every lookup of `/proc`.
//! Files are opened with direct I/O: their size is unknown (0 in their attributes, as in
//! /proc), and their contents, fetched at open, are read by offset.

use crate::inode::Node;
use crate::source::Source;
use crate::view::{Contents, Dirent, View, Who};
use fuser::{
    AccessFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    IoctlFlags, KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, Request,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Handle;

/// Open directories: their entries once listed (at the first readdir).
type OpenDirs = Arc<Mutex<HashMap<u64, Option<Arc<Vec<Dirent>>>>>>;

/// An open file: its contents, and whether a read has taken them yet.
struct OpenFile {
    contents: Arc<Contents>,
    read: bool,
    /// What to fetch again for a read from the start (of the process that started then),
    /// and as whom: the opener.
    again: Option<(Node, u64, Who)>,
    /// Fetches asked for so far, and the number of the one `contents` holds: of two
    /// fetches at once (threads sharing the descriptor), the later is kept.
    asked: u64,
    held: u64,
}

/// Open files by handle.
type OpenFiles = Arc<Mutex<HashMap<u64, OpenFile>>>;

/// The file system served to the kernel.
pub struct ProcFs<S> {
    view: Arc<View<S>>,
    rt: Handle,
    files: OpenFiles,
    dirs: OpenDirs,
    next: AtomicU64,
}

fn who(req: &Request) -> Who {
    Who {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

fn errno(e: i32) -> Errno {
    Errno::from_i32(e)
}

fn slice(data: &[u8], offset: u64, size: u32) -> &[u8] {
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(data.len());
    let end = start.saturating_add(size as usize).min(data.len());
    &data[start..end]
}

impl<S: Source> ProcFs<S> {
    /// Serves `view`, running its work on `rt`.
    pub fn new(view: View<S>, rt: Handle) -> ProcFs<S> {
        ProcFs {
            view: Arc::new(view),
            rt,
            files: Arc::new(Mutex::new(HashMap::new())),
            dirs: Arc::new(Mutex::new(HashMap::new())),
            next: AtomicU64::new(1),
        }
    }

    /// Runs `work` (which replies): at once on the calling loop thread as far as it goes
    /// without waiting (answers from caches cost no thread hop), the rest on the runtime.
    fn run<F>(&self, work: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let _in_runtime = self.rt.enter();
        let mut work = Box::pin(work);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if crate::source::may_wait_in(|| work.as_mut().poll(&mut cx)).is_pending() {
            // Polled again there with a real waker, as the Future contract allows.
            self.rt.spawn(work);
        }
    }

    fn handle(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    fn fill(entries: &[Dirent], offset: u64, mut reply: ReplyDirectory) {
        let skip = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, e) in entries.iter().enumerate().skip(skip) {
            if reply.add(INodeNo(e.ino), (i + 1) as u64, e.kind, &e.name) {
                break;
            }
        }
        reply.ok();
    }
}

impl<S: Source> Filesystem for ProcFs<S> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // A kernel without it (before 4.7) keeps serializing: slower, still correct.
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        // The view takes no writes; over io_uring every entry's payload buffer is as big
        // as the largest write (fuser's default is 16 MiB).
        let _ = config.set_max_write(128 << 10);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let (view, who, name) = (self.view.clone(), who(req), name.to_owned());
        self.run(async move {
            let entry_ttl = view.entry_ttl(parent.0, &name);
            match view.lookup_entry(&who, parent.0, &name).await {
                Ok(Some(a)) => {
                    let generation = Generation(view.generation(a.ino.0));
                    // Counted before the reply: the kernel may forget it at once.
                    view.looked_up(a.ino.0);
                    reply.entry_with_ttls(&view.attr_ttl(a.ino.0), &entry_ttl, &a, generation)
                }
                // Known to be absent (the node answered; a process directory's names never
                // change): the kernel keeps that. An error (ENOENT for a process gone or
                // its node down, EIO) is not kept, so the next lookup asks again.
                Ok(None) if view.caches_absence(parent.0) => reply.entry_with_ttls(
                    &Duration::ZERO,
                    &entry_ttl,
                    &View::<S>::absent(),
                    Generation(0),
                ),
                Ok(None) => reply.error(Errno::ENOENT),
                Err(e) => reply.error(errno(e)),
            }
        });
    }

    /// The kernel let go of an inode it had from `nlookup` lookups: the view keeps a path's
    /// number no longer than the kernel holds it, once the path is gone (FUSE's forget).
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.view.forgot(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let (view, who) = (self.view.clone(), who(req));
        self.run(async move {
            match view.getattr(&who, ino.0).await {
                Ok(a) => reply.attr(&view.attr_ttl(ino.0), &a),
                Err(e) => reply.error(errno(e)),
            }
        });
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let (view, who) = (self.view.clone(), who(req));
        self.run(async move {
            match view.readlink(&who, ino.0).await {
                Ok(t) => reply.data(&t),
                Err(e) => reply.error(errno(e)),
            }
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        let (view, who, files, fh) = (
            self.view.clone(),
            who(req),
            self.files.clone(),
            self.handle(),
        );
        self.run(async move {
            match view.open(&who, ino.0).await {
                Ok(c) => {
                    let again = view.made_anew(ino.0).map(|(n, start)| (n, start, who));
                    files.lock().insert(
                        fh,
                        OpenFile {
                            contents: Arc::new(c),
                            read: false,
                            again,
                            asked: 0,
                            held: 0,
                        },
                    );
                    reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO);
                }
                Err(e) => reply.error(errno(e)),
            }
        });
    }

    /// Contents fetched at open are read by offset. A read from the start after a first
    /// read fetches them again, as of now: the kernel makes its files anew for each read
    /// from their start, and tools keep some open and read them again after a seek to 0
    /// (procps's `top` and `free` do so with `/proc/stat`, `meminfo` and `uptime`).
    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let (c, again) = {
            let mut files = self.files.lock();
            let Some(f) = files.get_mut(&fh.0) else {
                return reply.error(Errno::EBADF);
            };
            let again = match &f.again {
                Some(a) if offset == 0 && f.read => {
                    f.asked += 1;
                    Some((a.clone(), f.asked))
                }
                _ => None,
            };
            f.read = true;
            (f.contents.clone(), again)
        };
        match (&*c, again) {
            (Contents::Data(_), Some(((node, start, who), n))) => {
                let (view, files) = (self.view.clone(), self.files.clone());
                let process = matches!(node, Node::ProcPath(..));
                self.run(async move {
                    match view.open_node(&who, node, start).await {
                        Ok(c) => {
                            // Kept before the reply: the next read goes on from it.
                            let c = Arc::new(c);
                            if let Some(f) = files.lock().get_mut(&fh.0) {
                                if n > f.held {
                                    f.contents = c.clone();
                                    f.held = n;
                                }
                            }
                            match &*c {
                                Contents::Data(d) => reply.data(slice(d, 0, size)),
                                Contents::File(..) => reply.error(Errno::EIO),
                            }
                        }
                        // A file of a process that has exited since its open (another one
                        // may have its pid now): ESRCH, as the kernel's read says.
                        Err(libc::ENOENT) if process => reply.error(Errno::ESRCH),
                        Err(e) => reply.error(errno(e)),
                    }
                });
            }
            (Contents::Data(d), _) => reply.data(slice(d, offset, size)),
            (Contents::File(..), _) => {
                // A local file may block (or be slow): read it off the loop, as the reader.
                self.rt.spawn_blocking(move || {
                    let Contents::File(f, reader, switch) = &*c else {
                        return;
                    };
                    let read = crate::pass::as_reader(reader, *switch, || {
                        let mut buf = vec![0u8; size as usize];
                        let n = f.read_at(&mut buf, offset)?;
                        buf.truncate(n);
                        Ok(buf)
                    });
                    match read {
                        Ok(buf) => reply.data(&buf),
                        Err(e) => reply.error(errno(e.raw_os_error().unwrap_or(libc::EIO))),
                    }
                });
            }
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.files.lock().remove(&fh.0);
        reply.ok();
    }

    /// No file of /proc is a terminal or takes an ioctl (isatty's TCGETS comes here from
    /// every buffered reader that opens one, Python's `open` for one): ENOTTY, the
    /// kernel's own answer, without a warning logged for each.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // Listed at the first readdir, so that opening a directory (as killall does with
        // /proc/PID) costs nothing.
        let fh = self.handle();
        self.dirs.lock().insert(fh, None);
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        if offset > 0 {
            if let Some(Some(entries)) = self.dirs.lock().get(&fh.0).cloned() {
                return Self::fill(&entries, offset, reply);
            }
        }
        let (view, who, dirs) = (self.view.clone(), who(req), self.dirs.clone());
        self.run(async move {
            match view.readdir(&who, ino.0).await {
                Ok(v) => {
                    let v = Arc::new(v);
                    if let Some(slot) = dirs.lock().get_mut(&fh.0) {
                        *slot = Some(v.clone());
                    }
                    Self::fill(&v, offset, reply);
                }
                Err(e) => reply.error(errno(e)),
            }
        });
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.dirs.lock().remove(&fh.0);
        reply.ok();
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        if mask.contains(AccessFlags::W_OK) {
            return reply.error(Errno::EROFS);
        }
        let (view, who) = (self.view.clone(), who(req));
        self.run(async move {
            match view.getattr(&who, ino.0).await {
                Ok(a) => {
                    let bits = u32::from(a.perm);
                    let reader = view.reader(&who);
                    let executes =
                        mask.contains(AccessFlags::X_OK) && a.kind != fuser::FileType::Directory;
                    let class = if reader.overrides_modes(executes) {
                        // root with CAP_DAC_OVERRIDE (CAP_DAC_READ_SEARCH to read or
                        // search): everything but executing what no one may execute
                        if executes && bits & 0o111 == 0 {
                            return reply.error(Errno::EACCES);
                        }
                        return reply.ok();
                    } else if who.uid == a.uid {
                        bits >> 6
                    } else if who.gid == a.gid || reader.groups.binary_search(&a.gid).is_ok() {
                        bits >> 3
                    } else {
                        bits
                    };
                    let want = (if mask.contains(AccessFlags::R_OK) {
                        4
                    } else {
                        0
                    }) | (if mask.contains(AccessFlags::X_OK) {
                        1
                    } else {
                        0
                    });
                    if class & want == want {
                        reply.ok()
                    } else {
                        reply.error(Errno::EACCES)
                    }
                }
                Err(e) => reply.error(errno(e)),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::slice;

    #[test]
    fn reads_by_offset_never_past_the_end() {
        let d = b"0123456789";
        assert_eq!(slice(d, 0, 4), b"0123");
        assert_eq!(slice(d, 8, 4), b"89");
        assert_eq!(slice(d, 10, 4), b"");
        assert_eq!(slice(d, u64::MAX, u32::MAX), b"");
    }
}
