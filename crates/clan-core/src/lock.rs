//! Named locks that count their use (DESIGN.md 17, the Mach/4.3BSD lesson).
//!
//! Every shared table in cland sits behind a [`NamedMutex`] or [`NamedRwLock`]. Each
//! acquisition is counted; an acquisition that finds the lock taken is *contended*, and the
//! time it waited is added up. Locks with the same name share one set of counters, so a
//! per-peer lock shows up once. [`snapshot`] reads them all for `clan stats locks`.
//!
//! With the `giant-lock` feature every named lock also takes one process-wide lock, and
//! [`giant`] holds it around whole operations: the "one big lock" build that the benchmarks
//! compare against, as Mach/0.2 against Mach/0.5.

use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// Counters of one lock name.
#[derive(Debug, Default)]
pub struct LockStats {
    pub name: &'static str,
    acquisitions: AtomicU64,
    contended: AtomicU64,
    wait_ns: AtomicU64,
    max_wait_ns: AtomicU64,
}

/// A copy of one lock's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockSnapshot {
    pub name: &'static str,
    pub acquisitions: u64,
    pub contended: u64,
    pub wait_ns: u64,
    pub max_wait_ns: u64,
}

impl LockStats {
    fn uncontended(&self) {
        self.acquisitions.fetch_add(1, Ordering::Relaxed);
    }

    fn contended_for(&self, since: Instant) {
        let ns = since.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        self.acquisitions.fetch_add(1, Ordering::Relaxed);
        self.contended.fetch_add(1, Ordering::Relaxed);
        self.wait_ns.fetch_add(ns, Ordering::Relaxed);
        self.max_wait_ns.fetch_max(ns, Ordering::Relaxed);
    }
}

fn registry() -> &'static Mutex<Vec<Arc<LockStats>>> {
    static REG: OnceLock<Mutex<Vec<Arc<LockStats>>>> = OnceLock::new();
    REG.get_or_init(|| Mutex::new(Vec::new()))
}

/// The shared counters for `name`, created on first use.
pub fn stats_for(name: &'static str) -> Arc<LockStats> {
    let mut reg = registry().lock();
    if let Some(s) = reg.iter().find(|s| s.name == name) {
        return s.clone();
    }
    let s = Arc::new(LockStats {
        name,
        ..Default::default()
    });
    reg.push(s.clone());
    s
}

/// Every lock's counters, sorted by name.
pub fn snapshot() -> Vec<LockSnapshot> {
    let mut v: Vec<_> = registry()
        .lock()
        .iter()
        .map(|s| LockSnapshot {
            name: s.name,
            acquisitions: s.acquisitions.load(Ordering::Relaxed),
            contended: s.contended.load(Ordering::Relaxed),
            wait_ns: s.wait_ns.load(Ordering::Relaxed),
            max_wait_ns: s.max_wait_ns.load(Ordering::Relaxed),
        })
        .collect();
    v.sort_by_key(|s| s.name);
    v
}

/// Whether this build serializes the daemon behind one big lock.
pub const GIANT_LOCK: bool = cfg!(feature = "giant-lock");

/// Held for the duration of one operation in the giant-lock build; nothing otherwise.
pub struct GiantGuard {
    #[cfg(feature = "giant-lock")]
    _g: parking_lot::ReentrantMutexGuard<'static, ()>,
}

#[cfg(feature = "giant-lock")]
fn giant_lock() -> &'static parking_lot::ReentrantMutex<()> {
    static G: OnceLock<parking_lot::ReentrantMutex<()>> = OnceLock::new();
    G.get_or_init(|| parking_lot::ReentrantMutex::new(()))
}

/// Takes the big lock in the giant-lock build (counted as the lock `giant`).
pub fn giant() -> GiantGuard {
    #[cfg(feature = "giant-lock")]
    {
        static STATS: OnceLock<Arc<LockStats>> = OnceLock::new();
        let stats = STATS.get_or_init(|| stats_for("giant"));
        let g = match giant_lock().try_lock() {
            Some(g) => {
                stats.uncontended();
                g
            }
            None => {
                let t = Instant::now();
                let g = giant_lock().lock();
                stats.contended_for(t);
                g
            }
        };
        GiantGuard { _g: g }
    }
    #[cfg(not(feature = "giant-lock"))]
    GiantGuard {}
}

/// A mutex with a name and counters.
pub struct NamedMutex<T> {
    stats: Arc<LockStats>,
    inner: Mutex<T>,
}

/// Guard of a [`NamedMutex`].
pub struct NamedMutexGuard<'a, T> {
    _giant: GiantGuard,
    inner: MutexGuard<'a, T>,
}

impl<T> NamedMutex<T> {
    pub fn new(name: &'static str, value: T) -> Self {
        NamedMutex {
            stats: stats_for(name),
            inner: Mutex::new(value),
        }
    }

    pub fn lock(&self) -> NamedMutexGuard<'_, T> {
        let giant = giant();
        let inner = match self.inner.try_lock() {
            Some(g) => {
                self.stats.uncontended();
                g
            }
            None => {
                let t = Instant::now();
                let g = self.inner.lock();
                self.stats.contended_for(t);
                g
            }
        };
        NamedMutexGuard {
            _giant: giant,
            inner,
        }
    }
}

impl<T> Deref for NamedMutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> DerefMut for NamedMutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}

/// A read/write lock with a name and counters, for read-mostly tables.
pub struct NamedRwLock<T> {
    stats: Arc<LockStats>,
    inner: RwLock<T>,
}

/// Read guard of a [`NamedRwLock`].
pub struct NamedReadGuard<'a, T> {
    _giant: GiantGuard,
    inner: RwLockReadGuard<'a, T>,
}

/// Write guard of a [`NamedRwLock`].
pub struct NamedWriteGuard<'a, T> {
    _giant: GiantGuard,
    inner: RwLockWriteGuard<'a, T>,
}

impl<T> NamedRwLock<T> {
    pub fn new(name: &'static str, value: T) -> Self {
        NamedRwLock {
            stats: stats_for(name),
            inner: RwLock::new(value),
        }
    }

    pub fn read(&self) -> NamedReadGuard<'_, T> {
        let giant = giant();
        let inner = match self.inner.try_read() {
            Some(g) => {
                self.stats.uncontended();
                g
            }
            None => {
                let t = Instant::now();
                let g = self.inner.read();
                self.stats.contended_for(t);
                g
            }
        };
        NamedReadGuard {
            _giant: giant,
            inner,
        }
    }

    pub fn write(&self) -> NamedWriteGuard<'_, T> {
        let giant = giant();
        let inner = match self.inner.try_write() {
            Some(g) => {
                self.stats.uncontended();
                g
            }
            None => {
                let t = Instant::now();
                let g = self.inner.write();
                self.stats.contended_for(t);
                g
            }
        };
        NamedWriteGuard {
            _giant: giant,
            inner,
        }
    }
}

impl<T> Deref for NamedReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> Deref for NamedWriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> DerefMut for NamedWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}

/// An async mutex with a name and counters, for what must be held across an `.await`
/// (a connection's writer).
pub struct NamedAsyncMutex<T> {
    stats: Arc<LockStats>,
    inner: tokio::sync::Mutex<T>,
}

impl<T> NamedAsyncMutex<T> {
    pub fn new(name: &'static str, value: T) -> Self {
        NamedAsyncMutex {
            stats: stats_for(name),
            inner: tokio::sync::Mutex::new(value),
        }
    }

    /// Cancel safety: cancel safe (tokio's Mutex::lock is).
    pub async fn lock(&self) -> tokio::sync::MutexGuard<'_, T> {
        match self.inner.try_lock() {
            Ok(g) => {
                self.stats.uncontended();
                g
            }
            Err(_) => {
                let t = Instant::now();
                let g = self.inner.lock().await;
                self.stats.contended_for(t);
                g
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_acquisitions_and_contention() {
        let m = Arc::new(NamedMutex::new("test.counted", 0u64));
        for _ in 0..10 {
            *m.lock() += 1;
        }
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        *m.lock() += 1;
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(*m.lock(), 4010);
        let s = snapshot()
            .into_iter()
            .find(|s| s.name == "test.counted")
            .unwrap();
        assert_eq!(s.acquisitions, 4011);
        assert!(s.contended <= 4000);
        // A contended acquisition adds its wait.
        let st = stats_for("test.direct");
        st.contended_for(Instant::now() - std::time::Duration::from_micros(50));
        let d = snapshot()
            .into_iter()
            .find(|s| s.name == "test.direct")
            .unwrap();
        assert_eq!((d.acquisitions, d.contended), (1, 1));
        assert!(d.wait_ns >= 50_000 && d.max_wait_ns == d.wait_ns);
    }

    #[test]
    fn rwlock_readers_share() {
        let l = NamedRwLock::new("test.rw", 5);
        let a = l.read();
        let b = l.read();
        assert_eq!(*a + *b, 10);
        drop((a, b));
        *l.write() = 6;
        assert_eq!(*l.read(), 6);
        let s = snapshot()
            .into_iter()
            .find(|s| s.name == "test.rw")
            .unwrap();
        assert_eq!(s.acquisitions, 4);
        assert_eq!(s.contended, 0);
    }
}
