//! The log of a detached process (`clan run -d`) in its node's state directory: what the
//! process writes to stdout and stderr, relayed by its shepherd through a pipe into
//! `logs/GPID.log`, of which at most `log_max_bytes` (the cluster file) is kept.
//!
//! When `GPID.log` holds half the cap, it becomes `GPID.log.1` (replacing the one before)
//! and a new `GPID.log` begins, as docker's json-file driver rotates with `max-size`: the
//! newest output is kept, between half the cap and the cap of it. Positions in a log count
//! every byte the process wrote since it started, dropped ones too: `GPID.log.base` holds
//! the position of the first byte of `GPID.log`, and its flock orders a rotation (exclusive)
//! against readers (shared), who so see the two files and the position together.
//!
//! The logs of processes that are gone are removed by their node's cland ([`sweep`]) once
//! they were left alone for the retention (`exit_retention_ms`): a shepherd touches its
//! process's log when it reaps it.

use crate::sys::flock;
use crate::Gpid;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The logs directory of a node's state directory (mode 0711: the files are found only by
/// name, and each is readable by its owner alone).
pub fn dir(state: &Path) -> PathBuf {
    state.join("logs")
}

/// The logs directory, made if missing, mode 0711.
pub fn make_dir(state: &Path) -> io::Result<PathBuf> {
    let d = dir(state);
    std::fs::create_dir_all(&d)?;
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o711))?;
    Ok(d)
}

/// The files of one process's log.
#[derive(Debug, Clone)]
pub struct LogPaths {
    /// `GPID.log`: the newest output.
    pub current: PathBuf,
    /// `GPID.log.1`: the part before it, once the log was rotated.
    pub previous: PathBuf,
    /// `GPID.log.base`: the position of `GPID.log`'s first byte; its flock orders
    /// rotations against readers.
    pub base: PathBuf,
    /// `GPID.log.new`: the next `GPID.log`, during a rotation.
    pub next: PathBuf,
}

impl LogPaths {
    pub fn new(dir: &Path, gpid: Gpid) -> LogPaths {
        let name = format!("{gpid}.log");
        LogPaths {
            current: dir.join(&name),
            previous: dir.join(format!("{name}.1")),
            base: dir.join(format!("{name}.base")),
            next: dir.join(format!("{name}.new")),
        }
    }
}

/// Creates (or empties) a log file, mode 0600, owned by `owner` (uid, gid) when given and
/// the file system lets it be (else by its writer: output is not lost for want of it).
pub fn create(path: &Path, owner: Option<(u32, u32)>) -> io::Result<File> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)?;
    // An existing file kept its mode: 0600 whatever it had.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    if let Some((uid, gid)) = owner {
        let _ = std::os::unix::fs::fchown(&f, Some(uid), Some(gid));
    }
    Ok(f)
}

fn remove_if_any(p: &Path) -> io::Result<()> {
    match std::fs::remove_file(p) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn write_base(lock: &File, base: u64) -> io::Result<()> {
    lock.set_len(0)?;
    lock.write_all_at(format!("{base}\n").as_bytes(), 0)
}

fn read_base(lock: &File) -> io::Result<u64> {
    let text = crate::sys::read_whole_at(lock)?;
    Ok(String::from_utf8_lossy(&text).trim().parse().unwrap_or(0))
}

/// The writing end of a log, in the shepherd.
#[derive(Debug)]
pub struct LogWriter {
    paths: LogPaths,
    file: File,
    lock: File,
    /// Bytes in `GPID.log`.
    len: u64,
    /// The position of `GPID.log`'s first byte.
    base: u64,
    /// `GPID.log` is rotated at this size (half the cap); 0: never.
    part: u64,
    owner: Option<(u32, u32)>,
    /// The log is no longer this process's (removed, or a new process with the same gpid
    /// has the name): output is dropped.
    lost: bool,
}

impl LogWriter {
    /// Makes `tmp` (made with [`create`] before the gpid was known, `file` open on it) the
    /// log of `gpid` in `dir`, keeping at most `max_bytes` (0: everything). Whatever an
    /// earlier process with the same gpid left goes.
    pub fn install(
        dir: &Path,
        gpid: Gpid,
        tmp: &Path,
        file: File,
        max_bytes: u64,
        owner: Option<(u32, u32)>,
    ) -> io::Result<LogWriter> {
        let paths = LogPaths::new(dir, gpid);
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&paths.base)?;
        {
            let _g = flock(&lock, true, true)?;
            write_base(&lock, 0)?;
            remove_if_any(&paths.previous)?;
            std::fs::rename(tmp, &paths.current)?;
        }
        let len = file.metadata()?.len();
        Ok(LogWriter {
            paths,
            file,
            lock,
            len,
            base: 0,
            part: max_bytes / 2,
            owner,
            lost: false,
        })
    }

    /// Appends output, rotating as needed. Output the file system does not take (full) is
    /// dropped: the process is not held up by its log.
    pub fn write(&mut self, mut data: &[u8]) {
        while !data.is_empty() && !self.lost {
            if self.part > 0 && self.len >= self.part && self.rotate().is_err() {
                self.lost = true;
                return;
            }
            let n = if self.part > 0 {
                (self.part - self.len).min(data.len() as u64) as usize
            } else {
                data.len()
            };
            if self.file.write_all(&data[..n]).is_err() {
                // What went in before the error counts.
                self.len = self.file.metadata().map(|m| m.len()).unwrap_or(self.len);
                return;
            }
            self.len += n as u64;
            data = &data[n..];
        }
    }

    /// `GPID.log` becomes `GPID.log.1`, and a new `GPID.log` begins.
    fn rotate(&mut self) -> io::Result<()> {
        let _g = flock(&self.lock, true, true)?;
        // Still this process's log: not removed after its retention (descendants of a
        // collected process may write on), nor taken by a new process with the same gpid.
        let named = std::fs::metadata(&self.paths.current)?;
        let mine = self.file.metadata()?;
        if (named.dev(), named.ino()) != (mine.dev(), mine.ino()) {
            return Err(io::Error::other("the log is no longer this process's"));
        }
        let next = create(&self.paths.next, self.owner)?;
        std::fs::rename(&self.paths.current, &self.paths.previous)?;
        std::fs::rename(&self.paths.next, &self.paths.current)?;
        self.base += self.len;
        self.file = next;
        self.len = 0;
        write_base(&self.lock, self.base)
    }

    /// Marks the log as written now (its process was just reaped: its retention starts).
    pub fn touch(&self) {
        let _ = self.file.set_modified(SystemTime::now());
    }
}

/// A reader's view of a log: its files as they were together at [`LogView::open`], read
/// from afterwards (`GPID.log` may grow meanwhile, and reading it on is right).
#[derive(Debug)]
pub struct LogView {
    current: File,
    /// The position of `current`'s first byte.
    base: u64,
    /// `GPID.log.1` and the position of its first byte.
    previous: Option<(File, u64)>,
    /// The owner of the log (the process's user).
    pub owner: u32,
}

/// How long [`LogView::open`] waits for a rotation to end (one takes microseconds; a
/// shepherd stopped in the middle of one must not hold a reader forever).
const ROTATION_WAIT: Duration = Duration::from_secs(2);

impl LogView {
    /// Opens the log of `gpid` in `dir` (a blocking call: it may wait for a rotation).
    /// `NotFound` when there is none.
    pub fn open(dir: &Path, gpid: Gpid) -> io::Result<LogView> {
        let paths = LogPaths::new(dir, gpid);
        // No base file: a log of an older shepherd, never rotated.
        let lock = match File::open(&paths.base) {
            Ok(f) => Some(f),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let deadline = std::time::Instant::now() + ROTATION_WAIT;
        let _g = match &lock {
            Some(l) => loop {
                if let Some(g) = flock(l, false, false)? {
                    break Some(g);
                }
                if std::time::Instant::now() > deadline {
                    return Err(io::Error::new(
                        io::ErrorKind::WouldBlock,
                        "the log is being rotated",
                    ));
                }
                std::thread::sleep(Duration::from_millis(1));
            },
            None => None,
        };
        let current = File::open(&paths.current)?;
        let base = match &lock {
            Some(l) => read_base(l)?,
            None => 0,
        };
        let previous = match lock.as_ref().map(|_| File::open(&paths.previous)) {
            Some(Ok(f)) => {
                let len = f.metadata()?.len();
                Some((f, base.saturating_sub(len)))
            }
            Some(Err(e)) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => None,
        };
        let owner = current.metadata()?.uid();
        Ok(LogView {
            current,
            base,
            previous,
            owner,
        })
    }

    /// The position of the oldest byte kept.
    pub fn start(&self) -> u64 {
        self.previous.as_ref().map_or(self.base, |(_, b)| *b)
    }

    /// The position after the newest byte, now.
    pub fn end(&self) -> io::Result<u64> {
        Ok(self.base + self.current.metadata()?.len())
    }

    /// Up to `limit` bytes from position `offset`, or from the oldest byte kept when the
    /// output there was dropped: the position of the first byte returned, and the bytes.
    pub fn read(&self, offset: u64, limit: usize) -> io::Result<(u64, Vec<u8>)> {
        let from = offset.max(self.start());
        let mut buf = Vec::new();
        if let Some((f, b)) = &self.previous {
            if from < self.base {
                read_at(f, from - b, limit, &mut buf)?;
            }
        }
        let at = from + buf.len() as u64;
        if buf.len() < limit && at >= self.base {
            read_at(&self.current, at - self.base, limit - buf.len(), &mut buf)?;
        }
        Ok((from, buf))
    }
}

/// Appends up to `limit` bytes of `f` from `pos` to `buf` (fewer at its end).
fn read_at(f: &File, mut pos: u64, limit: usize, buf: &mut Vec<u8>) -> io::Result<()> {
    let want = buf.len().saturating_add(limit);
    while buf.len() < want {
        let have = buf.len();
        // In pieces: `limit` may be far more than the file holds.
        buf.resize(want.min(have + (1 << 20)), 0);
        match f.read_at(&mut buf[have..], pos) {
            Ok(0) => {
                buf.truncate(have);
                break;
            }
            Ok(n) => {
                buf.truncate(have + n);
                pos += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => buf.truncate(have),
            Err(e) => {
                buf.truncate(have);
                return Err(e);
            }
        }
    }
    Ok(())
}

/// How long the temporary log of a shepherd that died before its process had a gpid
/// (`.new-PID`) stays at least: starts take milliseconds.
const TMP_KEEP: Duration = Duration::from_secs(60);

/// Removes the logs in `dir` of processes that are gone: those whose gpid `live` does not
/// hold, none of whose files changed for `keep` (a shepherd touches its process's log when
/// it reaps it, so that is `keep` after the process was collected), and the temporary logs
/// of shepherds that died while starting. Returns how many processes' logs went.
pub fn sweep(dir: &Path, keep: Duration, live: impl Fn(Gpid) -> bool) -> usize {
    let now = SystemTime::now();
    let old = |t: Option<SystemTime>, keep: Duration| {
        t.is_some_and(|t| now.duration_since(t).is_ok_and(|age| age >= keep))
    };
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut newest: HashMap<Gpid, Option<SystemTime>> = HashMap::new();
    for e in rd.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let mtime = e.metadata().and_then(|m| m.modified()).ok();
        if name.starts_with(".new-") {
            if old(mtime, keep.max(TMP_KEEP)) {
                let _ = std::fs::remove_file(e.path());
            }
            continue;
        }
        let Some(g) = name
            .split_once(".log")
            .and_then(|(g, _)| g.parse::<u64>().ok())
            .and_then(Gpid::from_raw)
        else {
            continue;
        };
        if live(g) {
            continue;
        }
        let t = newest.entry(g).or_insert(mtime);
        *t = (*t).max(mtime);
    }
    let mut removed = 0;
    for (g, t) in newest {
        if !old(t, keep) {
            continue;
        }
        let paths = LogPaths::new(dir, g);
        let lock = File::open(&paths.base).ok();
        let _g = match &lock {
            Some(l) => match flock(l, true, false) {
                Ok(Some(g)) => Some(g),
                _ => continue, // being rotated: next time
            },
            None => None,
        };
        // Looked at again: a new process may have taken the gpid meanwhile.
        let fresh = std::fs::metadata(&paths.current)
            .and_then(|m| m.modified())
            .ok();
        if live(g) || (fresh.is_some() && !old(fresh, keep)) {
            continue;
        }
        for p in [&paths.current, &paths.previous, &paths.next, &paths.base] {
            let _ = std::fs::remove_file(p);
        }
        removed += 1;
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpid() -> Gpid {
        Gpid::from_raw(20_000_042).unwrap()
    }

    fn writer(dir: &Path, max: u64) -> LogWriter {
        let tmp = dir.join(".new-1");
        let f = create(&tmp, None).unwrap();
        LogWriter::install(dir, gpid(), &tmp, f, max, None).unwrap()
    }

    fn all(v: &LogView) -> (u64, Vec<u8>) {
        v.read(0, usize::MAX).unwrap()
    }

    #[test]
    fn keeps_the_newest_output_under_the_cap() {
        let d = tempfile::tempdir().unwrap();
        let mut w = writer(d.path(), 1000);
        let p = LogPaths::new(d.path(), gpid());
        // 0600 however the umask is.
        let mode = std::fs::metadata(&p.current).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let stream: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        for piece in stream.chunks(333) {
            w.write(piece);
            let kept = std::fs::metadata(&p.current).unwrap().len()
                + std::fs::metadata(&p.previous).map(|m| m.len()).unwrap_or(0);
            assert!(kept <= 1000, "{kept} bytes kept");
        }
        assert_eq!(
            std::fs::metadata(&p.previous).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let v = LogView::open(d.path(), gpid()).unwrap();
        assert_eq!(v.end().unwrap(), 10_000);
        let (from, data) = all(&v);
        assert_eq!(from, v.start());
        assert!((500..=1000).contains(&data.len()), "{}", data.len());
        assert_eq!(&data[..], &stream[from as usize..]);
        // A position in what was dropped reads from the oldest kept; one inside reads on
        // from there, across the two files.
        let (f, d1) = v.read(10, 100).unwrap();
        assert_eq!(
            (f, &d1[..]),
            (from, &stream[from as usize..from as usize + 100])
        );
        let at = from + 400;
        let (f, d2) = v.read(at, 10_000).unwrap();
        assert_eq!((f, &d2[..]), (at, &stream[at as usize..]));
        let (f, d3) = v.read(20_000, 10).unwrap();
        assert_eq!((f, d3.len()), (20_000, 0));
    }

    #[test]
    fn no_cap_keeps_everything_and_a_new_process_starts_afresh() {
        let d = tempfile::tempdir().unwrap();
        let mut w = writer(d.path(), 0);
        w.write(&[7u8; 5000]);
        let v = LogView::open(d.path(), gpid()).unwrap();
        assert_eq!(all(&v), (0, vec![7u8; 5000]));
        // The same gpid again (its pid reused): its own log, from 0.
        let mut w2 = writer(d.path(), 1000);
        w2.write(b"new");
        let v = LogView::open(d.path(), gpid()).unwrap();
        assert_eq!(all(&v), (0, b"new".to_vec()));
        // The old process's descendants write on: nothing of it gets into the new log.
        w.write(&[7u8; 5000]);
        assert_eq!(all(&LogView::open(d.path(), gpid()).unwrap()).1, b"new");
        // An old writer with a cap finds at its rotation that the name is not its own.
        let mut old = writer(d.path(), 1000);
        old.write(&[1u8; 100]);
        let mut new = writer(d.path(), 1000);
        new.write(b"mine");
        old.write(&[1u8; 1000]);
        assert!(old.lost);
        assert_eq!(
            all(&LogView::open(d.path(), gpid()).unwrap()),
            (0, b"mine".to_vec())
        );
    }

    #[test]
    fn a_lost_log_is_not_written_again() {
        let d = tempfile::tempdir().unwrap();
        let mut w = writer(d.path(), 1000);
        w.write(&[1u8; 400]);
        let p = LogPaths::new(d.path(), gpid());
        std::fs::remove_file(&p.current).unwrap();
        w.write(&[1u8; 400]); // up to the rotation: into the removed file
        w.write(&[1u8; 400]); // the rotation finds it gone
        assert!(!p.current.exists() && !p.previous.exists());
    }

    #[test]
    fn sweep_removes_logs_of_gone_processes_after_keep() {
        let d = tempfile::tempdir().unwrap();
        let mut w = writer(d.path(), 1000);
        w.write(&[1u8; 1200]);
        let p = LogPaths::new(d.path(), gpid());
        assert!(p.previous.exists());
        // Live, or recent: kept.
        assert_eq!(sweep(d.path(), Duration::ZERO, |_| true), 0);
        assert_eq!(sweep(d.path(), Duration::from_secs(60), |_| false), 0);
        assert!(p.current.exists());
        // Reaped an hour ago: gone, every file of it.
        let hour_ago = SystemTime::now() - Duration::from_secs(3600);
        for f in [&p.current, &p.previous, &p.base] {
            File::options()
                .write(true)
                .open(f)
                .unwrap()
                .set_modified(hour_ago)
                .unwrap();
        }
        std::fs::write(d.path().join("unrelated"), "x").unwrap();
        assert_eq!(sweep(d.path(), Duration::from_secs(60), |_| false), 1);
        assert!(!p.current.exists() && !p.previous.exists() && !p.base.exists());
        assert!(d.path().join("unrelated").exists());
        assert!(matches!(
            LogView::open(d.path(), gpid()),
            Err(e) if e.kind() == io::ErrorKind::NotFound
        ));
    }
}
