// breakdown reader: median per step (open / read#1 / read#2 (EOF) / close), microseconds
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>
#include <time.h>
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
int main(int argc, char **argv) {
    int n = argc > 2 ? atoi(argv[2]) : 20000; char buf[2048];
    double *t[4]; for (int k = 0; k < 4; k++) t[k] = malloc(n * sizeof(double));
    for (int i = 0; i < n; i++) {
        double a = now(); int fd = open(argv[1], O_RDONLY); if (fd < 0) { perror("open"); return 1; }
        double b = now(); ssize_t r1 = read(fd, buf, sizeof buf);
        double c = now(); ssize_t r2 = read(fd, buf, sizeof buf);
        double d = now(); close(fd); double e = now();
        if (r1 <= 0 || r2 != 0) { fprintf(stderr, "unexpected %zd %zd\n", r1, r2); return 1; }
        t[0][i] = b - a; t[1][i] = c - b; t[2][i] = d - c; t[3][i] = e - d;
    }
    const char *nm[4] = {"open", "read1", "read2", "close"};
    for (int k = 0; k < 4; k++) { qsort(t[k], n, sizeof(double), cmp); printf("%s=%.2f ", nm[k], t[k][n / 2]); }
    printf("\n"); return 0;
}
