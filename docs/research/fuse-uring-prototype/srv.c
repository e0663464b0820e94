// Minimal FUSE server: mode a = classic /dev/fuse loop, mode b = FUSE-over-io_uring (kernel 6.18, proto 7.42 layout)
#define _GNU_SOURCE
#include <linux/fuse.h>
#include <linux/io_uring.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <sched.h>
#include <pthread.h>
#include <sys/mount.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <stdatomic.h>

#ifndef FUSE_OVER_IO_URING
#define FUSE_OVER_IO_URING (1ULL << 41)
#endif
#define OP_URING_CMD 46
#define SETUP_SQE128 (1U << 10)
#define ENTER_GETEVENTS 1U
#define CMD_REGISTER 1
#define CMD_COMMIT_AND_FETCH 2

struct uring_ent_in_out { uint64_t flags, commit_id; uint32_t payload_sz, padding; uint64_t reserved; };
struct uring_req_header { char in_out[128]; char op_in[128]; struct uring_ent_in_out ent; };
struct uring_cmd_req { uint64_t flags, commit_id; uint16_t qid; uint8_t pad[6]; };

static int fusefd;
static atomic_long nreq_dev, nreq_q[64];
static char fdata[1400];
#define PAYLOAD_SZ (1 << 20)
#define BUFSZ (PAYLOAD_SZ + 4096)

static void fill_attr(struct fuse_attr *a, uint64_t ino) {
    memset(a, 0, sizeof *a);
    a->ino = ino;
    if (ino == 1) { a->mode = S_IFDIR | 0755; a->nlink = 2; }
    else { a->mode = S_IFREG | 0444; a->nlink = 1; a->size = sizeof fdata; a->blocks = 3; }
    a->blksize = 4096;
}

/* returns body length (>=0), -1 = no reply; *err = fuse error (negative errno) */
static int handle(const struct fuse_in_header *in, const char *arg, char *out, int *err, int uring) {
    *err = 0;
    switch (in->opcode) {
    case FUSE_INIT: {
        const struct fuse_init_in *ii = (const void *)arg;
        struct fuse_init_out *o = (void *)out; memset(o, 0, sizeof *o);
        o->major = 7; o->minor = 38; o->max_readahead = ii->max_readahead;
        o->flags = FUSE_INIT_EXT; o->flags2 = uring ? (uint32_t)(FUSE_OVER_IO_URING >> 32) : 0;
        o->max_background = 16; o->congestion_threshold = 12; o->max_write = 65536; o->time_gran = 1;
        fprintf(stderr, "INIT kernel %u.%u flags=%#x flags2=%#x, replying flags2=%#x\n",
                ii->major, ii->minor, ii->flags, ii->flags2, o->flags2);
        return sizeof *o;
    }
    case FUSE_LOOKUP:
        if (in->nodeid == 1 && strcmp(arg, "f") == 0) {
            struct fuse_entry_out *e = (void *)out; memset(e, 0, sizeof *e);
            e->nodeid = 2; e->generation = 1; e->entry_valid = 3600; e->attr_valid = 3600;
            fill_attr(&e->attr, 2); return sizeof *e;
        }
        *err = -ENOENT; return 0;
    case FUSE_GETATTR: {
        struct fuse_attr_out *a = (void *)out; memset(a, 0, sizeof *a);
        a->attr_valid = 3600; fill_attr(&a->attr, in->nodeid); return sizeof *a;
    }
    case FUSE_OPEN: {
        struct fuse_open_out *o = (void *)out; memset(o, 0, sizeof *o);
        o->fh = 1; o->open_flags = FOPEN_DIRECT_IO; return sizeof *o;
    }
    case FUSE_READ: {
        const struct fuse_read_in *r = (const void *)arg;
        if (r->offset >= sizeof fdata) return 0;
        size_t n = sizeof fdata - r->offset; if (n > r->size) n = r->size;
        memcpy(out, fdata + r->offset, n); return n;
    }
    case FUSE_RELEASE: return 0;
    case FUSE_FORGET: case FUSE_BATCH_FORGET: case FUSE_INTERRUPT: return -1;
    default: *err = -ENOSYS; return 0;
    }
}

/* ---------------- classic /dev/fuse loop ---------------- */
static void *dev_loop(void *u) {
    int uring = (int)(intptr_t)u;
    char *buf = malloc(BUFSZ), *out = malloc(BUFSZ);
    for (;;) {
        ssize_t n = read(fusefd, buf, BUFSZ);
        if (n < 0) {
            if (errno == EINTR || errno == ENOENT || errno == EAGAIN) continue;
            if (errno == ENODEV) { fprintf(stderr, "dev_loop: unmounted; requests via /dev/fuse=%ld q0=%ld q1=%ld\n", (long)nreq_dev, (long)nreq_q[0], (long)nreq_q[1]); exit(0); }
            perror("read /dev/fuse"); exit(1);
        }
        struct fuse_in_header *in = (void *)buf; nreq_dev++;
        int err, len = handle(in, buf + sizeof *in, out + sizeof(struct fuse_out_header), &err, uring);
        if (len < 0) continue;
        struct fuse_out_header *oh = (void *)out;
        oh->len = sizeof *oh + len; oh->error = err; oh->unique = in->unique;
        if (write(fusefd, out, oh->len) < 0 && errno != ENOENT) perror("write /dev/fuse");
        if (in->opcode == FUSE_INIT && uring) return NULL; /* caller starts rings then continues loop */
    }
}

/* ---------------- io_uring (raw syscalls) ---------------- */
struct ring {
    int fd; unsigned *sq_head, *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
    unsigned char *sqes; struct io_uring_cqe *cqes; unsigned to_submit;
};
static int ring_init(struct ring *r, unsigned entries) {
    struct io_uring_params p; memset(&p, 0, sizeof p); p.flags = SETUP_SQE128 | (getenv("URING_FLAGS") ? strtoul(getenv("URING_FLAGS"), 0, 0) : 0);
    r->fd = syscall(__NR_io_uring_setup, entries, &p);
    if (r->fd < 0) { perror("io_uring_setup"); return -1; }
    size_t sqsz = p.sq_off.array + p.sq_entries * 4, cqsz = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    if (cqsz > sqsz) sqsz = cqsz; /* FEAT_SINGLE_MMAP */
    char *sq = mmap(0, sqsz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQ_RING);
    if (sq == MAP_FAILED) { perror("mmap sq"); return -1; }
    r->sqes = mmap(0, p.sq_entries * 128, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQES);
    if (r->sqes == MAP_FAILED) { perror("mmap sqes"); return -1; }
    r->sq_head = (void *)(sq + p.sq_off.head); r->sq_tail = (void *)(sq + p.sq_off.tail);
    r->sq_mask = (void *)(sq + p.sq_off.ring_mask); r->sq_array = (void *)(sq + p.sq_off.array);
    r->cq_head = (void *)(sq + p.cq_off.head); r->cq_tail = (void *)(sq + p.cq_off.tail);
    r->cq_mask = (void *)(sq + p.cq_off.ring_mask); r->cqes = (void *)(sq + p.cq_off.cqes);
    r->to_submit = 0; return 0;
}
static unsigned char *get_sqe(struct ring *r) {
    unsigned tail = *r->sq_tail, idx = tail & *r->sq_mask;
    unsigned char *s = r->sqes + idx * 128; memset(s, 0, 128);
    r->sq_array[idx] = idx;
    __atomic_store_n(r->sq_tail, tail + 1, __ATOMIC_RELEASE);
    r->to_submit++; return s;
}
static void prep_cmd(unsigned char *s, uint32_t cmd_op, uint64_t addr, uint32_t len, uint64_t ud, uint64_t commit_id, uint16_t qid) {
    s[0] = OP_URING_CMD;
    *(int32_t *)(s + 4) = fusefd;
    *(uint32_t *)(s + 8) = cmd_op;
    *(uint64_t *)(s + 16) = addr;
    *(uint32_t *)(s + 24) = len;
    *(uint64_t *)(s + 32) = ud;
    struct uring_cmd_req *c = (void *)(s + 48); c->commit_id = commit_id; c->qid = qid;
}

struct ent { struct uring_req_header *hdr; char *payload; struct iovec iov[2]; };
#define DEPTH 2
static atomic_int registered;


static void *ring_thread(void *u) {
    int q = (int)(intptr_t)u;
    cpu_set_t cs; CPU_ZERO(&cs); CPU_SET(q, &cs);
    if (sched_setaffinity(0, sizeof cs, &cs)) perror("setaffinity");
    struct ring r; if (ring_init(&r, 8)) exit(1);
    struct ent ents[DEPTH];
    char *stage = malloc(BUFSZ), *out = malloc(BUFSZ);
    for (int i = 0; i < DEPTH; i++) {
        ents[i].hdr = aligned_alloc(4096, 4096); memset(ents[i].hdr, 0, 4096);
        ents[i].payload = aligned_alloc(4096, PAYLOAD_SZ); memset(ents[i].payload, 0, PAYLOAD_SZ);
        ents[i].iov[0].iov_base = ents[i].hdr; ents[i].iov[0].iov_len = sizeof(struct uring_req_header);
        ents[i].iov[1].iov_base = ents[i].payload; ents[i].iov[1].iov_len = PAYLOAD_SZ;
        prep_cmd(get_sqe(&r), CMD_REGISTER, (uint64_t)(uintptr_t)ents[i].iov, 2, i, 0, q);
    }
    int ret = syscall(__NR_io_uring_enter, r.fd, r.to_submit, 0, 0, NULL, 0);
    if (ret < 0) { perror("io_uring_enter register"); exit(1); }
    r.to_submit = 0;
    registered++;
    fprintf(stderr, "queue %d (tid %ld): %d REGISTER submitted\n", q, (long)gettid(), DEPTH);
    for (;;) {
        ret = syscall(__NR_io_uring_enter, r.fd, r.to_submit, 1, ENTER_GETEVENTS, NULL, 0);
        if (ret < 0) { if (errno == EINTR) continue; perror("io_uring_enter"); exit(1); }
        if (ret > 0) r.to_submit -= ret; /* ret = number submitted */
        unsigned head = *r.cq_head, tail = __atomic_load_n(r.cq_tail, __ATOMIC_ACQUIRE);
        for (; head != tail; head++) {
            struct io_uring_cqe *c = &r.cqes[head & *r.cq_mask];
            int res = c->res; struct ent *e = &ents[c->user_data];
            if (res < 0) {
                fprintf(stderr, "queue %d: cqe res %d (%s)\n", q, res, strerror(-res));
                if (res == -ENOTCONN || res == -ECANCELED) exit(0);
                exit(1);
            }
            struct fuse_in_header *in = (void *)e->hdr->in_out;
            uint32_t psz = e->hdr->ent.payload_sz;
            uint32_t oplen = in->len - sizeof *in - psz;
            /* stage op_in + payload contiguously, as /dev/fuse would deliver them */
            memcpy(stage, e->hdr->op_in, oplen); memcpy(stage + oplen, e->payload, psz);
            stage[oplen + psz] = 0;
            uint64_t unique = in->unique; nreq_q[q]++;
            int err, len = handle(in, stage, e->payload, &err, 1);
            if (len < 0) { len = 0; err = -ENOSYS; }
            struct fuse_out_header *oh = (void *)e->hdr->in_out;
            oh->len = sizeof *oh + len; oh->error = err; oh->unique = unique;
            e->hdr->ent.payload_sz = len;
            prep_cmd(get_sqe(&r), CMD_COMMIT_AND_FETCH, 0, 0, c->user_data, unique, q);
        }
        __atomic_store_n(r.cq_head, head, __ATOMIC_RELEASE);
    }
    (void)out;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: srv a|b MOUNTPOINT [server_cpu]\n"); return 2; }
    int uring = argv[1][0] == 'b';
    for (size_t i = 0; i < sizeof fdata; i++) fdata[i] = 'a' + i % 26;
    if (argc > 3) { cpu_set_t cs; CPU_ZERO(&cs); CPU_SET(atoi(argv[3]), &cs); sched_setaffinity(0, sizeof cs, &cs); }
    fusefd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (fusefd < 0) { perror("open /dev/fuse"); return 1; }
    char opts[128]; snprintf(opts, sizeof opts, "fd=%d,rootmode=40000,user_id=0,group_id=0", fusefd);
    if (mount("furing", argv[2], "fuse", MS_NOSUID | MS_NODEV, opts)) { perror("mount"); return 1; }
    fprintf(stderr, "mounted %s mode %s pid %d\n", argv[2], uring ? "io_uring" : "classic", getpid());
    if (!uring) { dev_loop((void *)0); return 0; }
    dev_loop((void *)1); /* returns after INIT reply */
    long ncpu = sysconf(_SC_NPROCESSORS_CONF);
    for (long q = 0; q < ncpu; q++) { pthread_t t; pthread_create(&t, NULL, ring_thread, (void *)(intptr_t)q); }
    dev_loop((void *)1); /* FORGET etc. */
    return 0;
}
