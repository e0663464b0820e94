// Walks of the cluster /proc (part of the preload library of `clan shell`; see shim.c).
//
// ps, top, pgrep and pstree list /proc, then open a few files of every process. Through the
// FUSE view each open, read and close is a round trip to the view's server; with
// thousands of processes the round trips are most of the tool's time. So after a process
// lists /proc (opendir("/proc")), its opens of /proc/GPID/FILE (FILE one of walk_files)
// are served from a walk file, /proc/.clan-walk/FILE: that file of every process, as the
// view serves it to this reader, from the snapshot its listing took, in one read
// (crates/clan-procfs/src/walk.rs has the format). The open returns a memfd with the
// contents, which the tool reads, seeks and closes as the file it asked for. A file the
// walk says the reader may not read fails as the view would (EACCES). The walk also
// answers, as the view would, stat(2) of /proc/GPID (a directory owned by the process's
// owner, inode gpid << 24), opens of names a process directory of that node does not
// have (ENOENT: ps tries `ctty`), and stat(2) that follows /proc/GPID/ns/NAME (pstree asks
// for eight per process): the namespace's number as inode, from the walk file `ns` (the
// targets of every process's links, read on the process's node as the reader: EACCES
// where the kernel's ptrace check refuses them).
// Opens of /proc/uptime (pstree and pgrep read it once per process) get the contents the
// walk's first open read (a sealed memfd: reading it again gives the same line; procps
// opens the file again for a new value).
//
// The walk speaks for WALK_AGE after the listing, and after that for as long as the tool
// goes on with it (each open within WALK_IDLE of the one before), up to WALK_MAX: one pass
// of a slow tool over thousands of processes (pstree, through a loaded machine) stays one
// snapshot instead of falling to a round trip per file halfway, as the view's own walks
// do (`serves` in crates/clan-procfs/src/view.rs), while a look after a pause is live. It
// is dropped at the next listing: a walk is never older than the process's last look at
// /proc. Anything else
// (another path, a process not in the walk, a write, no walk file because /proc is not the
// cluster view, a thread already loading) goes to the real open.
//
// Signal safety: what runs on an open (a load included) uses only system calls and the
// stack, no malloc, and a thread that finds another one in here does not wait.
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

#define WALK_AGE_NS (2LL * 1000000000LL)
#define WALK_IDLE_NS (1LL * 1000000000LL)
#define WALK_MAX_NS (10LL * 1000000000LL)
#define MAGIC "clanwlk1"
#define HEADER (8 + 4 + 4 + 4 + 4)
#define SPAN 10000000ULL

// `ns` is no file of /proc: the targets of each process's namespace links, a line
// "NAME TARGET" each (crates/clan-procfs/src/walk.rs), for stat(2)s that follow them.
static const char *const walk_files[] = {"stat",    "status", "cmdline", "statm",
                                         "environ", "cgroup", "ns"};
#define NFILES (sizeof walk_files / sizeof walk_files[0])
#define NS_WALK 6

#define MAX_NODES 64

struct rec {
    uint64_t gpid;
    uint32_t uid, gid;
    uint32_t err;
    uint32_t len;
    const char *data;
};

// The names of a process directory on a node: NUL-ended names, back to back.
struct names {
    uint32_t node;
    uint32_t len;
    const char *list;
};

struct walk {
    int state; // 0: not loaded since the listing; 1: loaded; -1: none to load
    char *buf;
    size_t buf_size;
    struct rec *recs;
    size_t nrecs, recs_size;
    struct names names[MAX_NODES];
    size_t nnames;
};

static struct walk walks[NFILES];
static dev_t proc_dev;       // the device of /proc (the view's mount), when `listed`
static int listed;           // the process listed /proc and the walk may speak
static long long listed_at;  // when (CLOCK_MONOTONIC, ns)
static long long used_at;    // the walk's last open (CLOCK_MONOTONIC, ns)
static long long relisted;   // a listing made while another thread held `busy` (0: none)
static char busy;            // held while the walks change or are read
static char uptime[64];      // /proc/uptime as read in the walk of `uptime_at`
static uint32_t uptime_len;
static long long uptime_at;

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void drop(struct walk *w) {
    if (w->buf)
        munmap(w->buf, w->buf_size);
    if (w->recs)
        munmap(w->recs, w->recs_size);
    memset(w, 0, sizeof *w);
}

static void drop_all(void) {
    for (size_t i = 0; i < NFILES; i++)
        drop(&walks[i]);
}

static uint32_t u32_at(const char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v; // little-endian, as the machines clan runs on
}

// Checks and indexes w->buf[0..len): 0, or -1 if it is not a walk file (gpids must rise).
static int index_walk(struct walk *w, size_t len) {
    if (len < 12 || memcmp(w->buf, MAGIC, 8) != 0)
        return -1;
    uint32_t nodes = u32_at(w->buf + 8);
    size_t start = 12;
    for (uint32_t i = 0; i < nodes; i++) {
        if (len - start < 8)
            return -1;
        uint32_t node = u32_at(w->buf + start), l = u32_at(w->buf + start + 4);
        if (len - start - 8 < l || (l > 0 && w->buf[start + 8 + l - 1] != 0))
            return -1;
        if (w->nnames < MAX_NODES)
            w->names[w->nnames++] = (struct names){node, l, w->buf + start + 8};
        start += 8 + l;
    }
    size_t n = 0;
    for (size_t off = start; off < len; n++) {
        if (len - off < HEADER)
            return -1;
        uint32_t l = u32_at(w->buf + off + 20);
        if (len - off - HEADER < l)
            return -1;
        off += HEADER + l;
    }
    w->recs_size = (n ? n : 1) * sizeof(struct rec);
    void *r = mmap(NULL, w->recs_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) {
        w->recs_size = 0;
        return -1;
    }
    w->recs = r;
    size_t off = start;
    for (size_t i = 0; i < n; i++) {
        struct rec *x = &w->recs[i];
        memcpy(&x->gpid, w->buf + off, 8);
        x->uid = u32_at(w->buf + off + 8);
        x->gid = u32_at(w->buf + off + 12);
        x->err = u32_at(w->buf + off + 16);
        x->len = u32_at(w->buf + off + 20);
        x->data = w->buf + off + HEADER;
        if (i > 0 && x->gpid <= w->recs[i - 1].gpid)
            return -1;
        off += HEADER + x->len;
    }
    w->nrecs = n;
    return 0;
}

// Reads /proc/.clan-walk/NAME into walk i.
static void load(size_t i) {
    struct walk *w = &walks[i];
    char path[64] = "/proc/.clan-walk/";
    strcat(path, walk_files[i]);
    w->state = -1;
    int fd = (int)shim_raw(SYS_openat, AT_FDCWD, (long)path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return;
    size_t size = 1 << 20, len = 0;
    char *buf = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (;;) {
        if (buf == MAP_FAILED)
            break;
        if (len == size) {
            char *b = mremap(buf, size, size * 2, MREMAP_MAYMOVE);
            if (b == MAP_FAILED) {
                munmap(buf, size);
                buf = MAP_FAILED;
                break;
            }
            buf = b;
            size *= 2;
        }
        long n = shim_raw(SYS_read, fd, (long)(buf + len), (long)(size - len), 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n < 0) {
                munmap(buf, size);
                buf = MAP_FAILED;
            }
            break;
        }
        len += (size_t)n;
    }
    shim_raw(SYS_close, fd, 0, 0, 0);
    if (buf == MAP_FAILED)
        return;
    w->buf = buf;
    w->buf_size = size;
    if (index_walk(w, len) < 0) {
        drop(w);
        w->state = -1;
        return;
    }
    w->state = 1;
}

static const struct rec *find(const struct walk *w, uint64_t gpid) {
    size_t lo = 0, hi = w->nrecs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (w->recs[mid].gpid == gpid)
            return &w->recs[mid];
        if (w->recs[mid].gpid < gpid)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

// "/proc/GPID...": the gpid and what follows its digits; NULL if the path does not start so.
static const char *after_gpid(const char *path, uint64_t *gpid) {
    if (!path || strncmp(path, "/proc/", 6) != 0)
        return NULL;
    const char *p = path + 6;
    uint64_t g = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        if (digits >= 18)
            return NULL;
        g = g * 10 + (uint64_t)(*p - '0');
    }
    if (digits == 0)
        return NULL;
    *gpid = g;
    return p;
}

// "/proc/GPID", "/proc/GPID/" or "/proc/GPID/NAME": the gpid and NAME ("" for the
// directory); NULL if the path is none of them (NAME with a slash included).
static const char *parse(const char *path, uint64_t *gpid) {
    uint64_t g;
    const char *p = after_gpid(path, &g);
    if (!p || (*p != '/' && *p != 0))
        return NULL;
    if (*p == '/')
        p++;
    if (strchr(p, '/'))
        return NULL;
    *gpid = g;
    return p;
}

// The kernel's namespace links (fs/proc/namespaces.c).
static const char *const ns_names[] = {"cgroup", "ipc", "mnt", "net", "pid", "pid_for_children",
                                       "time", "time_for_children", "user", "uts"};

// "/proc/GPID/ns/NAME" for one of `ns_names`: NAME, with the gpid; NULL if the path is not
// one.
static const char *parse_ns(const char *path, uint64_t *gpid) {
    uint64_t g;
    const char *p = after_gpid(path, &g);
    if (!p || strncmp(p, "/ns/", 4) != 0)
        return NULL;
    for (size_t i = 0; i < sizeof ns_names / sizeof ns_names[0]; i++)
        if (strcmp(p + 4, ns_names[i]) == 0) {
            *gpid = g;
            return p + 4;
        }
    return NULL;
}

// What the view's stat(2) gives of one of its files: on the view's device, timed now.
static void view_stat(struct stat *st, uint64_t ino, mode_t mode, nlink_t nlink, uid_t uid,
                      gid_t gid) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    memset(st, 0, sizeof *st);
    st->st_dev = proc_dev;
    st->st_ino = (ino_t)ino;
    st->st_mode = mode;
    st->st_nlink = nlink;
    st->st_uid = uid;
    st->st_gid = gid;
    st->st_blksize = 4096;
    st->st_atim = st->st_mtim = st->st_ctim = now;
}

// What stat(2) following the namespace link `name` gives, from a record of the `ns` walk
// ("NAME TARGET" lines, TARGET as "net:[4026531840]"), as the view answers it: a regular
// file of root, read-only, numbered as the namespace, on the view's device. 0 if the
// record has no such link (a kernel without that namespace: the view says ENOENT).
static int ns_stat(const struct rec *r, const char *name, struct stat *st) {
    size_t nlen = strlen(name);
    for (const char *p = r->data, *end = r->data + r->len; p < end;) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol)
            eol = end;
        const char *br = memchr(p, '[', (size_t)(eol - p));
        if ((size_t)(eol - p) > nlen && memcmp(p, name, nlen) == 0 && p[nlen] == ' ' && br &&
            eol[-1] == ']') {
            uint64_t ino = 0;
            const char *d = br + 1;
            for (; d < eol - 1 && *d >= '0' && *d <= '9'; d++)
                ino = ino * 10 + (uint64_t)(*d - '0');
            if (d != eol - 1 || d == br + 1)
                return 0;
            view_stat(st, ino, S_IFREG | 0444, 1, 0, 0);
            return 1;
        }
        p = eol + 1;
    }
    return 0;
}

static int walk_file(const char *name) {
    for (size_t i = 0; i < NFILES; i++)
        if (strcmp(name, walk_files[i]) == 0)
            return (int)i;
    return -1;
}

// Whether node `node`'s process directories have no `name`; 0 if that is not known.
static int absent(const struct walk *w, uint64_t node, const char *name) {
    for (size_t i = 0; i < w->nnames; i++) {
        if (w->names[i].node != node)
            continue;
        for (const char *p = w->names[i].list, *end = p + w->names[i].len; p < end;
             p += strlen(p) + 1)
            if (strcmp(p, name) == 0)
                return 0;
        return 1;
    }
    return 0;
}

// Whether the walk may speak (a listing made meanwhile by another thread starts a new one).
static int walk_live(void) {
    long long again = __atomic_exchange_n(&relisted, 0, __ATOMIC_ACQ_REL);
    if (again > listed_at) {
        drop_all();
        proc_dev = 0;
        listed_at = used_at = again;
    }
    long long now = now_ns(), age = now - listed_at;
    if (age > WALK_AGE_NS && (now - used_at > WALK_IDLE_NS || age > WALK_MAX_NS)) {
        __atomic_store_n(&listed, 0, __ATOMIC_RELAXED);
        drop_all();
        return 0;
    }
    used_at = now;
    return 1;
}

// Walk i, loaded if it was not since the listing; NULL if the walk may not speak.
static struct walk *walk_of(size_t i) {
    if (!walk_live())
        return NULL;
    if (walks[i].state == 0) {
        load(i);
        struct stat st;
        if (walks[i].state == 1 && !proc_dev &&
            shim_raw(SYS_newfstatat, AT_FDCWD, (long)"/proc", (long)&st, 0) == 0)
            proc_dev = st.st_dev;
    }
    return walks[i].state == 1 ? &walks[i] : NULL;
}

// A memfd holding `len` bytes of `data`, at offset 0; -1 if it can not be made.
static int memfd_with(const char *data, uint32_t len, int cloexec) {
    int fd = (int)shim_raw(SYS_memfd_create, (long)"clan-proc",
                           MFD_ALLOW_SEALING | (cloexec ? MFD_CLOEXEC : 0), 0, 0);
    if (fd < 0)
        return -1;
    for (uint32_t done = 0; done < len;) {
        long n = shim_raw(SYS_pwrite64, fd, (long)(data + done), (long)(len - done), (long)done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            shim_raw(SYS_close, fd, 0, 0, 0);
            return -1;
        }
        done += (uint32_t)n;
    }
    // Read-only from now on, as the file it stands for (a write fails with EPERM).
    shim_raw(SYS_fcntl, fd, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK, 0);
    return fd;
}

// /proc/uptime during a walk: the contents its first open read (0: open it for real).
static int walk_uptime(int flags, int *fd) {
    if (__atomic_test_and_set(&busy, __ATOMIC_ACQUIRE))
        return 0;
    int saved = errno, served = 0;
    // Only where /proc is the cluster view (its stat walk file loads).
    if (walk_of(0) && proc_dev) {
        if (uptime_at != listed_at) {
            uptime_len = 0;
            int f = (int)shim_raw(SYS_openat, AT_FDCWD, (long)"/proc/uptime", O_RDONLY | O_CLOEXEC, 0);
            if (f >= 0) {
                long n;
                do
                    n = shim_raw(SYS_read, f, (long)uptime, sizeof uptime, 0);
                while (n < 0 && errno == EINTR);
                shim_raw(SYS_close, f, 0, 0, 0);
                // All of it (a line of two numbers) or nothing.
                if (n > 0 && (size_t)n < sizeof uptime && uptime[n - 1] == '\n') {
                    uptime_len = (uint32_t)n;
                    uptime_at = listed_at;
                }
            }
        }
        if (uptime_at == listed_at) {
            *fd = memfd_with(uptime, uptime_len, flags & O_CLOEXEC);
            served = *fd >= 0;
        }
    }
    __atomic_clear(&busy, __ATOMIC_RELEASE);
    errno = saved;
    return served;
}

int shim_walk_open(const char *path, int flags, int *fd) {
    if (!__atomic_load_n(&listed, __ATOMIC_RELAXED))
        return 0;
    if ((flags & O_ACCMODE) != O_RDONLY || (flags & (O_CREAT | O_DIRECTORY | O_PATH | O_TRUNC)))
        return 0;
    if (path && strcmp(path, "/proc/uptime") == 0)
        return walk_uptime(flags, fd);
    uint64_t gpid;
    const char *name = parse(path, &gpid);
    if (!name || !*name)
        return 0;
    if (__atomic_test_and_set(&busy, __ATOMIC_ACQUIRE))
        return 0;
    int saved = errno, served = 0, err = 0, i = walk_file(name);
    if (i == NS_WALK)
        i = -1; // the directory `ns`, not a walk's file
    struct walk *w = walk_of(i >= 0 ? (size_t)i : 0);
    const struct rec *r = w ? find(w, gpid) : NULL;
    if (r && i < 0) {
        if (strcmp(name, ".") != 0 && strcmp(name, "..") != 0 && absent(w, gpid / SPAN, name)) {
            served = 1;
            *fd = -1;
            err = ENOENT;
        }
    } else if (r && r->err) {
        served = 1;
        *fd = -1;
        err = (int)r->err;
    } else if (r) {
        *fd = memfd_with(r->data, r->len, flags & O_CLOEXEC);
        served = *fd >= 0;
    }
    __atomic_clear(&busy, __ATOMIC_RELEASE);
    errno = err ? err : saved;
    return served;
}

int shim_walk_stat(const char *path, struct stat *st, int follow) {
    if (!__atomic_load_n(&listed, __ATOMIC_RELAXED))
        return 0;
    uint64_t gpid;
    const char *name = parse(path, &gpid), *ns = NULL;
    if (!name) {
        if (!follow || !(ns = parse_ns(path, &gpid)))
            return 0;
    } else if (*name) {
        return 0;
    }
    if (__atomic_test_and_set(&busy, __ATOMIC_ACQUIRE))
        return 0;
    int saved = errno, served = 0;
    struct walk *w = walk_of(0);
    const struct rec *r = w && proc_dev ? find(w, gpid) : NULL;
    // Not the cluster's init (gpid 1), which has no `ns` in the view.
    if (r && ns && gpid >= SPAN) {
        // The targets, read as the view's server knows the reader (by its file system user
        // id): the kernel's EACCES where the reader may not follow the process's links.
        struct walk *nw = walk_of(NS_WALK);
        const struct rec *n = nw ? find(nw, gpid) : NULL;
        if (n && n->err) {
            served = -1;
            saved = (int)n->err;
        } else if (n && ns_stat(n, ns, st)) {
            served = 1;
        }
    } else if (r && !ns) {
        view_stat(st, gpid << 24, S_IFDIR | 0555, 2, r->uid, r->gid);
        served = 1;
    }
    __atomic_clear(&busy, __ATOMIC_RELEASE);
    errno = saved;
    return served;
}

void shim_walk_listed(const char *dir) {
    if (!dir || (strcmp(dir, "/proc") != 0 && strcmp(dir, "/proc/") != 0))
        return;
    if (__atomic_test_and_set(&busy, __ATOMIC_ACQUIRE)) {
        // Another thread is in a walk: the next one to take it starts the new one.
        __atomic_store_n(&relisted, now_ns(), __ATOMIC_RELEASE);
        __atomic_store_n(&listed, 1, __ATOMIC_RELAXED);
        return;
    }
    drop_all();
    proc_dev = 0;
    listed_at = used_at = now_ns();
    __atomic_store_n(&listed, 1, __ATOMIC_RELAXED);
    __atomic_clear(&busy, __ATOMIC_RELEASE);
}
