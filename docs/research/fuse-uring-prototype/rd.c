// reader: N x (open + read 2048 until 0 + close), per-iteration latency percentiles in microseconds
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>
#include <time.h>
#include <sys/resource.h>
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
    const char *path = argv[1]; int n = argc > 2 ? atoi(argv[2]) : 20000;
    double *t = malloc(n * sizeof *t); char buf[2048]; long bytes = 0;
    for (int i = 0; i < n; i++) {
        struct timespec a, b; clock_gettime(CLOCK_MONOTONIC, &a);
        int fd = open(path, O_RDONLY); if (fd < 0) { perror("open"); return 1; }
        ssize_t r; while ((r = read(fd, buf, sizeof buf)) > 0) bytes += r;
        if (r < 0) { perror("read"); return 1; }
        close(fd);
        clock_gettime(CLOCK_MONOTONIC, &b);
        t[i] = (b.tv_sec - a.tv_sec) * 1e6 + (b.tv_nsec - a.tv_nsec) / 1e3;
    }
    struct rusage ru; getrusage(RUSAGE_SELF, &ru);
    qsort(t, n, sizeof *t, cmp);
    printf("%s n=%d bytes/iter=%ld p10=%.2f median=%.2f p90=%.2f us vcsw/iter=%.2f ivcsw/iter=%.2f cpu_us/iter=%.2f\n", path, n, bytes / n, t[n / 10], t[n / 2], t[n * 9 / 10], (double)ru.ru_nvcsw / n, (double)ru.ru_nivcsw / n, (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 / n + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / (double)n);
    return 0;
}
