/*
 * Standalone driver of io_pool.c for valgrind (tests/test_io_valgrind.py builds and runs it).
 *
 * Exercises every path the Python binding uses — batches in serial / parallel / chunked
 * layouts, dontneed, resizing while work is queued, every failure kind, closing a pool with
 * queued tasks — and checks the bytes. Exit status 0 when every check passed.
 * Linked with fault_pread.c it also injects faults (EINTR, partial and short reads, EIO, stalls,
 * a descriptor closed underneath) into pread and preadv, on single and merged reads, and checks
 * bounded waits and a deterministic cancellation.
 * Usage: test_io_pool SCRATCH_FILE
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io_pool.h"

#define FILE_BYTES (1 << 20)

static int failures = 0;

/* fault_pread.c's controls: present only when it is linked in */
extern int sdq_faults_set(const char *spec) __attribute__((weak));
extern int64_t sdq_faults_fired(void) __attribute__((weak));
sdq_pool *volatile late_pool; /* a pool left allocated by a timed-out destroy (still reachable) */

#define CHECK(cond)                                                         \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                     \
        }                                                                   \
    } while (0)

static unsigned char byte_at(int64_t off) { return (unsigned char)((off * 131 + 7) % 251); }

/* n reads of `len` bytes at offsets spread over the file, `per_task` reads per task,
 * `per_group` tasks per group. */
static sdq_batch *make_batch(int fd, int n, int64_t len, int per_task, int per_group,
                             char *dest, int flags) {
    int n_tasks = (n + per_task - 1) / per_task;
    int n_groups = (n_tasks + per_group - 1) / per_group;
    sdq_batch *b = sdq_batch_new(n, n_tasks, n_groups, flags);
    if (!b) return NULL;
    for (int i = 0; i < n; i++) {
        sdq_read *r = &b->reads[i];
        r->fd = fd;
        r->offset = (int64_t)i * 7919 % (FILE_BYTES - len);
        r->length = r->need = len;
        r->dest = dest + (size_t)i * (size_t)len;
    }
    for (int t = 0; t < n_tasks; t++) {
        int first = t * per_task;
        int count = first + per_task <= n ? per_task : n - first;
        sdq_batch_set_task(b, t, first, count, t / per_group);
    }
    return b;
}

static int read_is_right(const sdq_read *r) {
    if (r->kind != SDQ_OK || r->done != r->length) return 0;
    for (int64_t k = 0; k < r->done; k++)
        if ((unsigned char)r->dest[k] != byte_at(r->offset + k)) return 0;
    return 1;
}

/* Every read either complete with the file's bytes or canceled; -> how many were canceled. */
static int check_complete_or_canceled(sdq_batch *b) {
    int canceled = 0;
    for (int i = 0; i < b->n_reads; i++) {
        const sdq_read *r = &b->reads[i];
        if (r->kind == SDQ_CANCELED) {
            CHECK(r->err == ECANCELED && r->done == 0);
            canceled++;
        } else {
            CHECK(read_is_right(r));
        }
    }
    return canceled;
}

/* One read of `len` bytes at `offset` under fault rule `spec`, on a 2-thread pool. */
static sdq_batch *one_read(sdq_pool *pool, int fd, int64_t offset, int64_t len, char *dest,
                           const char *spec) {
    CHECK(sdq_faults_set(spec) == 0);
    sdq_batch *b = sdq_batch_new(1, 1, 1, 0);
    b->reads[0] = (sdq_read){.fd = fd, .offset = offset, .length = len, .need = len, .dest = dest};
    sdq_batch_set_task(b, 0, 0, 1, 0);
    CHECK(sdq_pool_submit(pool, b) == 0);
    return b;
}

/* Three reads of 5000 bytes that continue each other from `offset`, one FLAG_MERGE task (one
 * preadv), under fault rule `spec`, on `pool`. */
static sdq_batch *merged_reads(sdq_pool *pool, int fd, int64_t offset, char *dest,
                               const char *spec) {
    CHECK(sdq_faults_set(spec) == 0);
    sdq_batch *b = sdq_batch_new(3, 1, 1, SDQ_FLAG_MERGE);
    for (int k = 0; k < 3; k++)
        b->reads[k] = (sdq_read){.fd = fd, .offset = offset + k * 5000, .length = 5000,
                                 .need = 5000, .dest = dest + (2 - k) * 5000};
    sdq_batch_set_task(b, 0, 0, 3, 0);
    CHECK(sdq_merge_run(b->reads, 3) == 3);
    CHECK(sdq_pool_submit(pool, b) == 0);
    sdq_batch_wait_all(b);
    return b;
}

/* The merged path (one preadv for a run of reads) under every fault: a preadv that fails or
 * comes back short leaves each read to finish, or fail, on its own with pread; no read is
 * reported complete with bytes missing. */
static void merged_fault_checks(const char *path, char *dest) {
    int fd = open(path, O_RDONLY);
    sdq_pool *pool;
    CHECK(sdq_pool_create(&pool, 2) == 0);
    /* recovered: EINTR retried, a partial preadv (7,500 of 15,000 bytes: read 1 half done,
     * read 2 not begun) continued, one EIO retried read by read */
    const char *recover[] = {"eintr:times=5", "partial:times=3", "eio"};
    const int64_t fired[] = {5, 3, 1};
    for (int i = 0; i < 3; i++) {
        sdq_batch *b = merged_reads(pool, fd, 1000, dest, recover[i]);
        for (int k = 0; k < 3; k++) CHECK(read_is_right(&b->reads[k]));
        CHECK(sdq_faults_fired() == fired[i]);
        sdq_batch_free(b);
    }
    /* the first preadv partial, then every call on that fd partial: still complete */
    sdq_batch *b = merged_reads(pool, fd, 1000, dest, "partial:times=0");
    for (int k = 0; k < 3; k++) CHECK(read_is_right(&b->reads[k]));
    sdq_batch_free(b);
    /* failures, recorded on every read of the run */
    const char *fail[] = {"eio:times=0", "eintr:times=0"};
    const int err[] = {EIO, EINTR};
    for (int i = 0; i < 2; i++) {
        b = merged_reads(pool, fd, 1000, dest, fail[i]);
        for (int k = 0; k < 3; k++)
            CHECK(b->reads[k].kind == SDQ_ERRNO && b->reads[k].err == err[i]);
        sdq_batch_free(b);
    }
    /* a short preadv (end of file where it stopped, mid read 1): read 0 whole, read 1 short,
     * read 2 read on its own */
    b = merged_reads(pool, fd, 1000, dest, "short");
    CHECK(read_is_right(&b->reads[0]));
    CHECK(b->reads[1].kind == SDQ_SHORT && b->reads[1].done == 2500);
    CHECK(read_is_right(&b->reads[2]));
    sdq_batch_free(b);
    /* a fault only in the run's last read: the preadv (whose range holds it) and then that
     * read fail, the others are whole */
    b = merged_reads(pool, fd, 1000, dest, "eio:at=11000,times=0");
    CHECK(read_is_right(&b->reads[0]) && read_is_right(&b->reads[1]));
    CHECK(b->reads[2].kind == SDQ_ERRNO && b->reads[2].err == EIO);
    sdq_batch_free(b);
    int fd2 = open(path, O_RDONLY);
    b = merged_reads(pool, fd2, 1000, dest, "closefd");
    for (int k = 0; k < 3; k++) CHECK(b->reads[k].kind == SDQ_ERRNO && b->reads[k].err == EBADF);
    sdq_batch_free(b);
    /* a stalled preadv completes */
    b = merged_reads(pool, fd, 1000, dest, "stall:ms=50");
    for (int k = 0; k < 3; k++) CHECK(read_is_right(&b->reads[k]));
    sdq_batch_free(b);
    sdq_pool_destroy(pool);
    sdq_faults_set("");
    close(fd);
}

static void fault_checks(const char *path, char *dest) {
    int fd = open(path, O_RDONLY);
    sdq_pool *pool;
    CHECK(sdq_pool_create(&pool, 2) == 0);
    /* retried or continued: EINTR (several times), partial reads */
    const char *recover[] = {"eintr:times=5", "partial:times=3"};
    for (int i = 0; i < 2; i++) {
        sdq_batch *b = one_read(pool, fd, 1000, 50000, dest, recover[i]);
        sdq_batch_wait_all(b);
        CHECK(read_is_right(&b->reads[0]));
        CHECK(sdq_faults_fired() >= 3);
        sdq_batch_free(b);
    }
    /* failures, recorded: EIO, EINTR forever, a short read, a descriptor closed underneath */
    sdq_batch *b = one_read(pool, fd, 1000, 5000, dest, "eio");
    sdq_batch_wait_all(b);
    CHECK(b->reads[0].kind == SDQ_ERRNO && b->reads[0].err == EIO);
    sdq_batch_free(b);
    b = one_read(pool, fd, 1000, 5000, dest, "eintr:times=0");
    sdq_batch_wait_all(b);
    CHECK(b->reads[0].kind == SDQ_ERRNO && b->reads[0].err == EINTR);
    sdq_batch_free(b);
    b = one_read(pool, fd, 1000, 5000, dest, "short");
    sdq_batch_wait_all(b);
    CHECK(b->reads[0].kind == SDQ_SHORT && b->reads[0].done == 2500);
    sdq_batch_free(b);
    int fd2 = open(path, O_RDONLY);
    b = one_read(pool, fd2, 1000, 5000, dest, "closefd");
    sdq_batch_wait_all(b);
    CHECK(b->reads[0].kind == SDQ_ERRNO && b->reads[0].err == EBADF);
    sdq_batch_free(b);
    /* a stalled read: bounded waits time out, then it completes */
    b = one_read(pool, fd, 1000, 5000, dest, "stall:ms=300");
    CHECK(sdq_batch_wait_group_until(b, 0, sdq_now_ns() + 20 * 1000000LL) == ETIMEDOUT);
    CHECK(sdq_batch_wait_all_until(b, sdq_now_ns() + 20 * 1000000LL) == ETIMEDOUT);
    CHECK(sdq_batch_first_unfinished(b, 0) == 0 && !sdq_batch_group_done(b, 0));
    CHECK(sdq_batch_wait_all_until(b, sdq_now_ns() + 10000 * 1000000LL) == 0);
    CHECK(read_is_right(&b->reads[0]) && sdq_batch_first_unfinished(b, -1) == -1);
    sdq_batch_free(b);
    sdq_pool_destroy(pool);

    /* cancellation, deterministic: the one worker is stalled in the first read while the pool
     * closes, so the other 15 are still queued */
    CHECK(sdq_pool_create(&pool, 1) == 0);
    CHECK(sdq_faults_set("stall:ms=200") == 0);
    sdq_batch *bq = make_batch(fd, 16, 4099, 1, 1, dest, 0);
    CHECK(sdq_pool_submit(pool, bq) == 0);
    while (sdq_faults_fired() == 0) usleep(1000);
    sdq_pool_destroy(pool);
    sdq_batch_wait_all(bq);
    CHECK(check_complete_or_canceled(bq) == 15);
    sdq_batch_free(bq);

    /* closing while a read hangs: gives up at the deadline, the worker finishes later */
    CHECK(sdq_pool_create(&pool, 1) == 0);
    b = one_read(pool, fd, 1000, 5000, dest, "stall:ms=300");
    while (sdq_faults_fired() == 0) usleep(1000);
    CHECK(sdq_pool_destroy_until(pool, sdq_now_ns() + 20 * 1000000LL) == ETIMEDOUT);
    late_pool = pool;
    CHECK(sdq_batch_wait_all_until(b, sdq_now_ns() + 10000 * 1000000LL) == 0);
    CHECK(read_is_right(&b->reads[0]));
    sdq_batch_free(b);
    usleep(50 * 1000); /* the detached worker leaves once its task is finished */
    sdq_faults_set("");
    close(fd);
}

static void check_bytes(sdq_batch *b) {
    for (int i = 0; i < b->n_reads; i++) {
        const sdq_read *r = &b->reads[i];
        CHECK(r->kind == SDQ_OK && r->done == r->length);
        CHECK(r->start_ns >= r->submit_ns && r->end_ns >= r->start_ns);
        for (int64_t k = 0; k < r->done; k++)
            if ((unsigned char)r->dest[k] != byte_at(r->offset + k)) {
                CHECK(!"bytes differ from the file");
                break;
            }
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s SCRATCH_FILE\n", argv[0]);
        return 2;
    }
    int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
        perror(argv[1]);
        return 2;
    }
    unsigned char *data = malloc(FILE_BYTES);
    for (int64_t i = 0; i < FILE_BYTES; i++) data[i] = byte_at(i);
    CHECK(write(fd, data, FILE_BYTES) == FILE_BYTES);
    free(data);

    sdq_pool *pool;
    CHECK(sdq_pool_create(&pool, 0) == EINVAL && pool == NULL);
    CHECK(sdq_pool_create(&pool, 4) == 0);
    CHECK(sdq_pool_threads(pool) == 4);
    char *dest = malloc((size_t)48 * 4099);

    /* serial (3 reads per task), parallel (1 per task), with dontneed */
    int layouts[][2] = {{3, 1}, {1, 3}, {1, 1}, {5, 2}};
    for (int l = 0; l < 4; l++) {
        sdq_batch *b = make_batch(fd, 24, 4099, layouts[l][0], layouts[l][1], dest,
                                  l == 2 ? SDQ_FLAG_DONTNEED : 0);
        CHECK(sdq_pool_submit(pool, b) == 0);
        sdq_batch_wait_group(b, 0);
        CHECK(sdq_batch_group_done(b, 0));
        sdq_batch_wait_all(b);
        CHECK(sdq_batch_all_done(b));
        check_bytes(b);
        sdq_batch_free(b);
    }

    /* FLAG_MERGE: 3 tasks of 8 reads; in each, reads 0-3 and 5-7 continue each other in the
     * file (two preadvs), read 4 starts elsewhere; the bytes land in separate destinations */
    {
        sdq_batch *b = sdq_batch_new(24, 3, 3, SDQ_FLAG_MERGE);
        for (int i = 0; i < 24; i++) {
            sdq_read *r = &b->reads[i];
            int t = i / 8, k = i % 8;
            r->fd = fd;
            r->offset = (int64_t)t * 100000 + (k == 4 ? 60000 : k * 4099);
            r->length = r->need = 4099;
            r->dest = dest + (size_t)(23 - i) * 4099; /* destinations not in file order */
        }
        for (int t = 0; t < 3; t++) sdq_batch_set_task(b, t, t * 8, 8, t);
        CHECK(sdq_merge_run(&b->reads[0], 8) == 4 && sdq_merge_run(&b->reads[5], 3) == 3);
        CHECK(sdq_pool_submit(pool, b) == 0);
        sdq_batch_wait_all(b);
        check_bytes(b);
        sdq_batch_free(b);
    }
    /* FLAG_MERGE at the end of the file: full, short, past the end; and a need < length tail */
    {
        sdq_batch *b = sdq_batch_new(3, 1, 1, SDQ_FLAG_MERGE);
        for (int k = 0; k < 3; k++)
            b->reads[k] = (sdq_read){.fd = fd, .offset = FILE_BYTES - 5000 + k * 4096,
                                     .length = 4096, .need = 4096, .dest = dest + k * 4096};
        sdq_batch_set_task(b, 0, 0, 3, 0);
        CHECK(sdq_pool_submit(pool, b) == 0);
        sdq_batch_wait_all(b);
        CHECK(read_is_right(&b->reads[0]));
        CHECK(b->reads[1].kind == SDQ_SHORT && b->reads[1].done == 904);
        CHECK(b->reads[2].kind == SDQ_PAST_EOF && b->reads[2].done == 0);
        sdq_batch_free(b);
        b = sdq_batch_new(2, 1, 1, SDQ_FLAG_MERGE);
        b->reads[0] = (sdq_read){.fd = fd, .offset = FILE_BYTES - 8192, .length = 4096,
                                 .need = 4096, .dest = dest};
        b->reads[1] = (sdq_read){.fd = fd, .offset = FILE_BYTES - 4096, .length = 8192,
                                 .need = 4096, .dest = dest + 4096};
        sdq_batch_set_task(b, 0, 0, 2, 0);
        CHECK(sdq_pool_submit(pool, b) == 0);
        sdq_batch_wait_all(b);
        CHECK(read_is_right(&b->reads[0]));
        CHECK(b->reads[1].kind == SDQ_OK && b->reads[1].done == 4096);
        sdq_batch_free(b);
    }

    /* resize while batches are queued; free without waiting (free waits) */
    sdq_batch *b1 = make_batch(fd, 48, 4099, 1, 1, dest, 0);
    CHECK(sdq_pool_submit(pool, b1) == 0);
    CHECK(sdq_pool_set_threads(pool, 1) == 0);
    CHECK(sdq_pool_threads(pool) == 1);
    CHECK(sdq_pool_set_threads(pool, 9) == 0);
    CHECK(sdq_pool_threads(pool) == 9);
    CHECK(sdq_pool_set_threads(pool, SDQ_MAX_THREADS + 1) == EINVAL);
    sdq_batch_wait_all(b1);
    check_bytes(b1);
    sdq_batch_free(b1);

    /* failures: bad fd, past end of file, short read */
    sdq_batch *bf = sdq_batch_new(3, 3, 3, 0);
    bf->reads[0] = (sdq_read){.fd = 12345, .offset = 0, .length = 16, .need = 16, .dest = dest};
    bf->reads[1] = (sdq_read){
        .fd = fd, .offset = FILE_BYTES + 100, .length = 16, .need = 16, .dest = dest};
    bf->reads[2] = (sdq_read){
        .fd = fd, .offset = FILE_BYTES - 10, .length = 16, .need = 16, .dest = dest};
    for (int i = 0; i < 3; i++) sdq_batch_set_task(bf, i, i, 1, i);
    CHECK(sdq_pool_submit(pool, bf) == 0);
    sdq_batch_wait_all(bf);
    CHECK(bf->reads[0].kind == SDQ_ERRNO && bf->reads[0].err == EBADF);
    CHECK(bf->reads[1].kind == SDQ_PAST_EOF && bf->reads[1].done == 0);
    CHECK(bf->reads[2].kind == SDQ_SHORT && bf->reads[2].done == 10);
    sdq_batch_free(bf);

    /* need < length: a tail past the end of file is fine */
    sdq_batch *bt = sdq_batch_new(1, 1, 1, 0);
    bt->reads[0] = (sdq_read){
        .fd = fd, .offset = FILE_BYTES - 10, .length = 4096, .need = 10, .dest = dest};
    sdq_batch_set_task(bt, 0, 0, 1, 0);
    CHECK(sdq_pool_submit(pool, bt) == 0);
    sdq_batch_wait_group(bt, 0);
    CHECK(bt->reads[0].kind == SDQ_OK && bt->reads[0].done == 10);
    sdq_batch_free(bt);

    /* close with work queued: queued tasks are canceled, nothing hangs or leaks */
    CHECK(sdq_pool_set_threads(pool, 1) == 0);
    sdq_batch *bq = make_batch(fd, 48, 4099, 1, 1, dest, 0);
    CHECK(sdq_pool_submit(pool, bq) == 0);
    sdq_pool_destroy(pool);
    sdq_batch_wait_all(bq);
    check_complete_or_canceled(bq);
    sdq_batch_free(bq);

    if (sdq_faults_set) {
        fault_checks(argv[1], dest);
        merged_fault_checks(argv[1], dest);
    }

    free(dest);
    close(fd);
    unlink(argv[1]);
    if (failures) fprintf(stderr, "%d checks failed\n", failures);
    else printf("io_pool: all checks passed\n");
    return failures ? 1 : 0;
}
