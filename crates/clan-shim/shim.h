// What shim.c and walk.c share.
#ifndef CLAN_SHIM_H
#define CLAN_SHIM_H

// A system call that does not go through the library's own syscall().
long shim_raw(long n, long a, long b, long c, long d);

// If the open of `path` with `flags` is served from a walk: 1, with the descriptor (or -1
// and errno) in *fd; 0: open it for real.
int shim_walk_open(const char *path, int flags, int *fd);

struct stat;

// If stat(2) of `path` (`follow`: not lstat) is answered from a walk: 1, with *st filled,
// or -1 with errno; 0: ask the kernel.
int shim_walk_stat(const char *path, struct stat *st, int follow);

// The process listed directory `dir`: a listing of /proc starts a new walk.
void shim_walk_listed(const char *dir);

#endif
