// The preload library of `clan shell` (see src/lib.rs).
//
// Processes of a clan shell see the cluster's /proc, where every process is named by its
// gpid (node * 10,000,000 + its pid on its node). This library makes the calls that take a
// pid accept those numbers:
//   - a gpid of the shell's own node (CLAN_NODE) becomes the local pid;
//   - a gpid of another node goes through `clan kill` (CLAN_BIN), whose exit code becomes
//     errno (3 ESRCH, 4 EPERM, 2 EINVAL, others EIO);
//   - a process group id below -10,000,000 (kill(-PGID)) is a cluster group, whose members
//     may be on any node: it always goes through `clan kill -g`;
//   - local pids (below 10,000,000: what fork() returns) pass through untouched;
//   - what can not cross nodes (pidfd_open or ptrace attach of a remote process) fails with
//     EREMOTE rather than give a wrong answer.
// It also serves the opens of a process that walks /proc (ps, top, pgrep) from walk files
// (walk.c).
// kill() may run in a signal handler: the remote path uses only fork, execve, waitpid and
// stack buffers, and blocks SIGCHLD meanwhile so that a shell's SIGCHLD handler does not
// reap the helper before we do.
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

__attribute__((constructor)) static void shim_init(void) {
    const char *n = getenv("CLAN_NODE");
    const char *b = getenv("CLAN_BIN");
    node = n ? atol(n) : 0;
    if (b && strlen(b) < sizeof clan_bin)
        strcpy(clan_bin, b);
    else
        strcpy(clan_bin, "/usr/bin/clan");
    real_syscall = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
}

static long raw(long n, long a, long b, long c, long d) {
    if (!real_syscall)
        shim_init();
    return real_syscall(n, a, b, c, d, 0L, 0L);
}

long shim_raw(long n, long a, long b, long c, long d) { return raw(n, a, b, c, d); }

static int is_gpid(long pid) { return pid >= SPAN; }
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

// `clan kill -s SIG [-g | --value V] ID`: 0 or -1 with errno. `queued`: a sigqueue(3)
// carrying `value`.
static int via_clan_queued(long id, int sig, int group, int queued, long value) {
    if (node == 0) {
        errno = ESRCH;
        return -1;
    }
    char s[32], g[32], v[40];
    dec(sig, s, sizeof s);
    dec(id, g, sizeof g);
    dec(value, v, sizeof v);
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGCHLD);
    sigprocmask(SIG_BLOCK, &block, &old);
    pid_t child = fork();
    if (child == 0) {
        int null = open("/dev/null", O_RDWR);
        if (null >= 0) {
            dup2(null, 1);
            dup2(null, 2);
        }
        sigprocmask(SIG_SETMASK, &old, NULL);
        if (group)
            execl(clan_bin, "clan", "kill", "-s", s, "-g", g, (char *)NULL);
        else if (queued)
            execl(clan_bin, "clan", "kill", "-s", s, "--value", v, g, (char *)NULL);
        else
            execl(clan_bin, "clan", "kill", "-s", s, g, (char *)NULL);
        _exit(127);
    }
    int status = 0, rc = -1, err = EIO;
    if (child > 0) {
        while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
        }
        if (WIFEXITED(status)) {
            switch (WEXITSTATUS(status)) {
            case 0: rc = 0; break;
            case 2: err = EINVAL; break;
            case 3: err = ESRCH; break;
            case 4: err = EPERM; break;
            case 5: err = ESRCH; break; // its node is dead: the process is gone
            default: err = EIO;
            }
        }
    } else {
        err = EAGAIN;
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (rc < 0)
        errno = err;
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
    static int (*real)(pid_t, int, const union sigval);
    if (!real)
        real = (int (*)(pid_t, int, const union sigval))dlsym(RTLD_NEXT, "sigqueue");
    long p = pid;
    if (is_gpid(p)) {
        if (is_local_gpid(p))
            return real((pid_t)(p % SPAN), sig, value);
        return via_clan_queued(p, sig, 0, 1, (long)(intptr_t)value.sival_ptr);
    }
    return real(pid, sig, value);
}

int tgkill(pid_t tgid, pid_t tid, int sig) {
    long g = tgid, t = tid;
    if (is_gpid(g)) {
        if (is_local_gpid(g))
            return (int)raw(SYS_tgkill, g % SPAN, is_gpid(t) ? t % SPAN : t, sig, 0);
        return via_clan(g, sig, 0); // to the process: threads do not cross nodes
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
        if (is_local_gpid(g))
            return kill((pid_t)(g % SPAN), sig);
        return via_clan(g, sig, 0);
    }
    return (int)raw(SYS_pidfd_send_signal, fd, sig, (long)info, flags);
}

long ptrace(enum __ptrace_request req, ...) {
    static long (*real)(enum __ptrace_request, ...);
    if (!real)
        real = (long (*)(enum __ptrace_request, ...))dlsym(RTLD_NEXT, "ptrace");
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
    return real(req, (pid_t)pid, addr, data);
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
