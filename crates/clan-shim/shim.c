// The preload library of `clan shell` (see src/lib.rs).
//
// Processes of a clan shell see the cluster's /proc, where every process is named by its
// gpid (node * 10,000,000 + its pid on its node). This library makes the calls that take a
// pid accept those numbers:
//   - a gpid of the shell's own node (CLAN_SHIM_NODE, see shim_init) becomes the local pid;
//     a number whose local part is 0 is no gpid (see is_gpid);
//   - a gpid of another node goes through `clan kill` (CLAN_BIN), whose exit code becomes
//     errno (3 ESRCH, 4 EPERM, 2 EINVAL, others EIO);
//   - a process group id below -10,000,000 (kill(-PGID)) is a cluster group, whose members
//     may be on any node: it always goes through `clan kill -g`;
//   - local pids (below 10,000,000: what fork() returns) pass through untouched;
//   - what can not cross nodes (pidfd_open or ptrace attach of a remote process) fails with
//     EREMOTE rather than give a wrong answer.
// It also serves the opens of a process that walks /proc (ps, top, pgrep) from walk files
// (walk.c).
// kill() may run in a signal handler: the remote path uses only system calls (a vfork-like
// clone on a stack of its own, execve, wait4) and stack buffers: no lock, no malloc, no
// atfork handler. SIGCHLD stays blocked in the calling thread until the helper is reaped,
// so that a shell's SIGCHLD handler does not reap it first; a helper reaped by someone else
// all the same (SIGCHLD ignored, another thread's wait) counts as failed (EIO), never as
// success. The helper gets 30 s (an alarm) before it counts as failed too, so a stuck cland
// can not hold a kill(2) forever.
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shim.h"

#define SPAN 10000000L
#define FUSE_MAGIC 0x65735546L

static long node;                 // this shell's node (0: not in a cluster: pass everything)
static char clan_bin[4096];       // the `clan` binary
static long (*real_syscall)(long, ...);
static int (*real_sigqueue)(pid_t, int, const union sigval);
static long (*real_ptrace)(enum __ptrace_request, ...);

// A node number from the environment: 1..=213 written in full, else 0.
static long node_of(const char *v) {
    if (!v || !*v)
        return 0;
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    return errno == 0 && *end == 0 && n >= 1 && n <= 213 ? n : 0;
}

// The node comes from CLAN_SHIM_NODE, which the first process of a chain sets from the
// CLAN_NODE its shepherd gave it: a user may point `clan` at another node with CLAN_NODE
// (docs/cli.md), and that must not turn another node's gpids into local pids here. cland
// does not pass CLAN_SHIM_NODE from one node to another.
__attribute__((constructor)) static void shim_init(void) {
    const char *b = getenv("CLAN_BIN");
    node = node_of(getenv("CLAN_SHIM_NODE"));
    if (node == 0) {
        node = node_of(getenv("CLAN_NODE"));
        char v[8];
        if (node > 0 && snprintf(v, sizeof v, "%ld", node) > 0)
            setenv("CLAN_SHIM_NODE", v, 1);
    }
    if (b && strlen(b) < sizeof clan_bin)
        strcpy(clan_bin, b);
    else
        strcpy(clan_bin, "/usr/bin/clan");
    // Every function looked up now: dlsym is not async-signal-safe, kill and sigqueue are.
    real_syscall = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    real_sigqueue = (int (*)(pid_t, int, const union sigval))dlsym(RTLD_NEXT, "sigqueue");
    real_ptrace = (long (*)(enum __ptrace_request, ...))dlsym(RTLD_NEXT, "ptrace");
}

static long raw(long n, long a, long b, long c, long d) {
    if (!real_syscall)
        shim_init();
    return real_syscall(n, a, b, c, d, 0L, 0L);
}

long shim_raw(long n, long a, long b, long c, long d) { return raw(n, a, b, c, d); }

// A gpid: 10,000,000 and above, and not a multiple of it (local part 0 names no process;
// such a number passes to the kernel untouched, which has no pid that large: ESRCH, where
// a translation would have made it kill(0) of the caller's own group).
static int is_gpid(long pid) { return pid >= SPAN && pid % SPAN != 0; }
static int is_local_gpid(long pid) { return node > 0 && pid / SPAN == node; }

// Decimal of v into buf (no allocation; for the helper's argv).
static const char *dec(long v, char *buf, size_t len) {
    char tmp[32];
    int i = 0, neg = v < 0;
    unsigned long u = neg ? (unsigned long)(-v) : (unsigned long)v;
    do {
        tmp[i++] = (char)('0' + u % 10);
        u /= 10;
    } while (u && i < 30);
    size_t k = 0;
    if (neg && k + 1 < len)
        buf[k++] = '-';
    while (i > 0 && k + 1 < len)
        buf[k++] = tmp[--i];
    buf[k] = 0;
    return buf;
}

// What the helper runs: `clan kill -s SIG [-g | --value V] ID`.
struct helper {
    const char *argv[9];
    sigset_t mask; // the caller's signal mask, the helper's after exec
};

// The helper, on its own stack in the caller's memory until its exec (CLONE_VM|CLONE_VFORK:
// the calling thread waits meanwhile): only system calls, since it shares the caller's
// memory. Handlers are reset first so that no signal runs the caller's code here.
static int helper_main(void *arg) {
    const struct helper *h = arg;
    for (int sig = 1; sig < 65; sig++) {
        struct sigaction sa;
        if (sig != SIGKILL && sig != SIGSTOP && sigaction(sig, NULL, &sa) == 0 &&
            sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN) {
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = SIG_DFL;
            sigaction(sig, &sa, NULL);
        }
    }
    int null = (int)raw(SYS_openat, AT_FDCWD, (long)"/dev/null", O_RDWR | O_CLOEXEC, 0);
    if (null >= 0) {
        raw(SYS_dup3, null, 1, 0, 0);
        raw(SYS_dup3, null, 2, 0, 0);
    }
    struct itimerval limit = {.it_value = {.tv_sec = 30}};
    raw(SYS_setitimer, ITIMER_REAL, (long)&limit, 0, 0);
    raw(SYS_rt_sigprocmask, SIG_SETMASK, (long)&h->mask, 0, 8);
    raw(SYS_execve, (long)clan_bin, (long)h->argv, (long)environ, 0);
    raw(SYS_exit, 127, 0, 0, 0);
    return 127;
}

// `clan kill`: 0 or -1 with errno. `queued`: a sigqueue(3) carrying `value`.
static int via_clan_queued(long id, int sig, int group, int queued, long value) {
    if (node == 0) {
        errno = ESRCH;
        return -1;
    }
    char s[32], g[32], v[40];
    dec(sig, s, sizeof s);
    dec(id, g, sizeof g);
    dec(value, v, sizeof v);
    int saved = errno; // kept on success: a signal handler's kill must not change it
    struct helper h = {.argv = {"clan", "kill", "-s", s}};
    int k = 4;
    if (group) {
        h.argv[k++] = "-g";
    } else if (queued) {
        h.argv[k++] = "--value";
        h.argv[k++] = v;
    }
    h.argv[k++] = g;
    h.argv[k] = NULL;
    // Every signal blocked until the helper has exec'd (the clone returns then): a handler
    // of the caller's must not run in the helper, which shares its memory.
    sigset_t all;
    sigfillset(&all);
    raw(SYS_rt_sigprocmask, SIG_SETMASK, (long)&all, (long)&h.mask, 8);
    const long size = 64 * 1024;
    void *stack = (void *)real_syscall(SYS_mmap, 0L, size, (long)(PROT_READ | PROT_WRITE),
                                       (long)(MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK), -1L, 0L);
    pid_t child = stack == MAP_FAILED ? -1
                                      : clone(helper_main, (char *)stack + size,
                                              CLONE_VM | CLONE_VFORK | SIGCHLD, &h);
    sigset_t waiting = h.mask;
    sigaddset(&waiting, SIGCHLD);
    raw(SYS_rt_sigprocmask, SIG_SETMASK, (long)&waiting, 0, 8);
    int rc = -1, err = EAGAIN;
    if (child > 0) {
        int status = 0;
        long w;
        while ((w = raw(SYS_wait4, child, (long)&status, 0, 0)) < 0 && errno == EINTR) {
        }
        err = EIO;
        if (w == child && WIFEXITED(status)) {
            switch (WEXITSTATUS(status)) {
            case 0: rc = 0; break;
            case 2: err = EINVAL; break;
            case 3: err = ESRCH; break;
            case 4: err = EPERM; break;
            case 5: err = ESRCH; break; // its node is dead: the process is gone
            default: err = EIO;
            }
        }
    }
    if (stack != MAP_FAILED)
        raw(SYS_munmap, (long)stack, size, 0, 0);
    raw(SYS_rt_sigprocmask, SIG_SETMASK, (long)&h.mask, 0, 8);
    errno = rc < 0 ? err : saved;
    return rc;
}

static int via_clan(long id, int sig, int group) {
    return via_clan_queued(id, sig, group, 0, 0);
}

int kill(pid_t pid, int sig) {
    long p = pid;
    if (p <= -SPAN)
        return via_clan(-p, sig, 1);
    if (is_gpid(p)) {
        if (is_local_gpid(p))
            return (int)raw(SYS_kill, p % SPAN, sig, 0, 0);
        return via_clan(p, sig, 0);
    }
    return (int)raw(SYS_kill, p, sig, 0, 0);
}

// glibc's killpg calls its internal kill, which a preload can not catch.
int killpg(pid_t pgrp, int sig) {
    if (pgrp < 0) {
        errno = EINVAL;
        return -1;
    }
    return kill(-pgrp, sig);
}

int sigqueue(pid_t pid, int sig, const union sigval value) {
    long p = pid;
    if (is_gpid(p)) {
        if (is_local_gpid(p))
            return real_sigqueue((pid_t)(p % SPAN), sig, value);
        return via_clan_queued(p, sig, 0, 1, (long)(intptr_t)value.sival_ptr);
    }
    return real_sigqueue(pid, sig, value);
}

int tgkill(pid_t tgid, pid_t tid, int sig) {
    long g = tgid, t = tid;
    if (is_gpid(g)) {
        if (t <= 0) {
            errno = EINVAL;
            return -1;
        }
        if (is_local_gpid(g))
            return (int)raw(SYS_tgkill, g % SPAN, is_gpid(t) ? t % SPAN : t, sig, 0);
        // Threads do not cross nodes: the main thread's signal goes to its process; another
        // thread of a remote process can not be named from here.
        if (t != g) {
            errno = EREMOTE;
            return -1;
        }
        return via_clan(g, sig, 0);
    }
    return (int)raw(SYS_tgkill, g, t, sig, 0);
}

int pidfd_open(pid_t pid, unsigned int flags) {
    long p = pid;
    if (is_gpid(p)) {
        if (is_local_gpid(p))
            return (int)raw(SYS_pidfd_open, p % SPAN, flags, 0, 0);
        errno = EREMOTE;
        return -1;
    }
    return (int)raw(SYS_pidfd_open, p, flags, 0, 0);
}

// A descriptor of a /proc/GPID directory of the cluster view (what killall opens): the view
// gives a process directory the inode number gpid << 24. 0 if it is not one.
static long gpid_of_dir_fd(int fd) {
    struct statfs fs;
    struct stat st;
    if (fstatfs(fd, &fs) < 0 || (long)fs.f_type != FUSE_MAGIC)
        return 0;
    if (fstat(fd, &st) < 0 || !S_ISDIR(st.st_mode) || (st.st_ino & 0xffffff) != 0)
        return 0;
    long g = (long)(st.st_ino >> 24);
    return is_gpid(g) ? g : 0;
}

int pidfd_send_signal(int fd, int sig, siginfo_t *info, unsigned int flags) {
    long g = gpid_of_dir_fd(fd);
    if (g) {
        if (flags != 0) {
            errno = EINVAL;
            return -1;
        }
        if (is_local_gpid(g)) {
            if (info)
                return (int)raw(SYS_rt_sigqueueinfo, g % SPAN, sig, (long)info, 0);
            return kill((pid_t)(g % SPAN), sig);
        }
        // A siginfo a program may send (sigqueue's SI_QUEUE) carries its value across.
        if (info && info->si_code == SI_QUEUE)
            return via_clan_queued(g, sig, 0, 1, (long)(intptr_t)info->si_value.sival_ptr);
        return via_clan(g, sig, 0);
    }
    return (int)raw(SYS_pidfd_send_signal, fd, sig, (long)info, flags);
}

long ptrace(enum __ptrace_request req, ...) {
    va_list ap;
    va_start(ap, req);
    long pid = (long)va_arg(ap, pid_t);
    void *addr = va_arg(ap, void *);
    void *data = va_arg(ap, void *);
    va_end(ap);
    if (is_gpid(pid)) {
        if (!is_local_gpid(pid)) {
            errno = EREMOTE; // a process of another node can not be traced from here
            return -1;
        }
        pid %= SPAN;
    }
    return real_ptrace(req, (pid_t)pid, addr, data);
}

// Programs that call syscall(2) directly (psmisc killall, procps pidwait).
long syscall(long n, ...) {
    va_list ap;
    va_start(ap, n);
    long a[6];
    for (int i = 0; i < 6; i++)
        a[i] = va_arg(ap, long);
    va_end(ap);
    switch (n) {
    case SYS_kill:
        return kill((pid_t)a[0], (int)a[1]);
    case SYS_tgkill:
        return tgkill((pid_t)a[0], (pid_t)a[1], (int)a[2]);
    case SYS_pidfd_open:
        return pidfd_open((pid_t)a[0], (unsigned)a[1]);
    case SYS_pidfd_send_signal:
        return pidfd_send_signal((int)a[0], (int)a[1], (siginfo_t *)a[2], (unsigned)a[3]);
    }
    if (!real_syscall)
        shim_init();
    return real_syscall(n, a[0], a[1], a[2], a[3], a[4], a[5]);
}

// ------------------------------------------------------------------ opens (walk.c)

static void *next(const char *name) { return dlsym(RTLD_NEXT, name); }

// Whether an openat path ignores its directory (a NULL is passed on, for EFAULT).
static int absolute(const char *path) { return path && path[0] == '/'; }

// The mode argument of an open that creates.
#define MODE_OF(flags, last)                                                                   \
    mode_t mode = 0;                                                                           \
    if (((flags) & O_CREAT) || ((flags) & O_TMPFILE) == O_TMPFILE) {                           \
        va_list ap;                                                                            \
        va_start(ap, last);                                                                    \
        mode = va_arg(ap, mode_t);                                                             \
        va_end(ap);                                                                            \
    }

#define SERVE(path, flags)                                                                     \
    do {                                                                                       \
        int fd_;                                                                               \
        if (node > 0 && shim_walk_open(path, flags, &fd_))                                     \
            return fd_;                                                                        \
    } while (0)

#define OPEN_HOOK(fn)                                                                          \
    int fn(const char *path, int flags, ...) {                                                 \
        static int (*real)(const char *, int, ...);                                            \
        MODE_OF(flags, flags);                                                                 \
        SERVE(path, flags);                                                                    \
        if (!real)                                                                             \
            real = (int (*)(const char *, int, ...))next(#fn);                                 \
        return real(path, flags, mode);                                                        \
    }

#define OPENAT_HOOK(fn)                                                                        \
    int fn(int dir, const char *path, int flags, ...) {                                        \
        static int (*real)(int, const char *, int, ...);                                       \
        MODE_OF(flags, flags);                                                                 \
        if (absolute(path))                                                                    \
            SERVE(path, flags);                                                                \
        if (!real)                                                                             \
            real = (int (*)(int, const char *, int, ...))next(#fn);                            \
        return real(dir, path, flags, mode);                                                   \
    }

// What _FORTIFY_SOURCE builds call for an open without a mode.
#define OPEN2_HOOK(fn)                                                                         \
    int fn(const char *path, int flags) {                                                      \
        static int (*real)(const char *, int);                                                 \
        SERVE(path, flags);                                                                    \
        if (!real)                                                                             \
            real = (int (*)(const char *, int))next(#fn);                                      \
        return real(path, flags);                                                              \
    }

#define OPENAT2_HOOK(fn)                                                                       \
    int fn(int dir, const char *path, int flags) {                                             \
        static int (*real)(int, const char *, int);                                            \
        if (absolute(path))                                                                    \
            SERVE(path, flags);                                                                \
        if (!real)                                                                             \
            real = (int (*)(int, const char *, int))next(#fn);                                 \
        return real(dir, path, flags);                                                         \
    }

OPEN_HOOK(open)
OPEN_HOOK(open64)
OPENAT_HOOK(openat)
OPENAT_HOOK(openat64)
OPEN2_HOOK(__open_2)
OPEN2_HOOK(__open64_2)
OPENAT2_HOOK(__openat_2)
OPENAT2_HOOK(__openat64_2)

// A read-only fopen served from a walk: the stream, or NULL with errno; `*served` 0 if not.
static FILE *fopen_walk(const char *path, const char *mode, int *served) {
    *served = 0;
    if (node <= 0 || !mode || mode[0] != 'r' || strchr(mode, '+'))
        return NULL;
    int fd;
    if (!shim_walk_open(path, O_RDONLY | (strchr(mode, 'e') ? O_CLOEXEC : 0), &fd))
        return NULL;
    *served = 1;
    if (fd < 0)
        return NULL;
    FILE *f = fdopen(fd, mode);
    if (!f) {
        int e = errno;
        close(fd);
        errno = e;
    }
    return f;
}

#define FOPEN_HOOK(fn)                                                                         \
    FILE *fn(const char *path, const char *mode) {                                             \
        static FILE *(*real)(const char *, const char *);                                      \
        int served;                                                                            \
        FILE *f = fopen_walk(path, mode, &served);                                             \
        if (served)                                                                            \
            return f;                                                                          \
        if (!real)                                                                             \
            real = (FILE * (*)(const char *, const char *)) next(#fn);                         \
        return real(path, mode);                                                               \
    }

FOPEN_HOOK(fopen)
FOPEN_HOOK(fopen64)

DIR *opendir(const char *name) {
    static DIR *(*real)(const char *);
    if (!real)
        real = (DIR * (*)(const char *)) next("opendir");
    DIR *d = real(name);
    if (d && node > 0)
        shim_walk_listed(name);
    return d;
}

// stat(2) of /proc/GPID and /proc/GPID/ns/NAME during a walk (walk.c); x86_64 and arm64
// share struct stat and struct stat64.
#define STAT_HOOK(fn, type, follow)                                                            \
    int fn(const char *restrict path, struct type *restrict st) {                              \
        static int (*real)(const char *restrict, struct type *restrict);                       \
        int served_ = node > 0 ? shim_walk_stat(path, (struct stat *)st, follow) : 0;         \
        if (served_)                                                                           \
            return served_ > 0 ? 0 : -1;                                                       \
        if (!real)                                                                             \
            real = (int (*)(const char *restrict, struct type *restrict))next(#fn);            \
        return real(path, st);                                                                 \
    }

#if defined(__x86_64__) || defined(__aarch64__)
STAT_HOOK(stat, stat, 1)
STAT_HOOK(stat64, stat64, 1)
STAT_HOOK(lstat, stat, 0)
STAT_HOOK(lstat64, stat64, 0)

#define STATAT_HOOK(fn, type)                                                                  \
    int fn(int dir, const char *restrict path, struct type *restrict st, int flags) {          \
        static int (*real)(int, const char *restrict, struct type *restrict, int);             \
        int served_ = node > 0 && absolute(path) && !(flags & AT_EMPTY_PATH)                   \
                          ? shim_walk_stat(path, (struct stat *)st,                            \
                                           !(flags & AT_SYMLINK_NOFOLLOW))                     \
                          : 0;                                                                 \
        if (served_)                                                                           \
            return served_ > 0 ? 0 : -1;                                                       \
        if (!real)                                                                             \
            real = (int (*)(int, const char *restrict, struct type *restrict, int))next(#fn);  \
        return real(dir, path, st, flags);                                                     \
    }

STATAT_HOOK(fstatat, stat)
STATAT_HOOK(fstatat64, stat64)
#endif
