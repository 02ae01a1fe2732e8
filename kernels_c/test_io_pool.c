/*
 * Standalone driver of io_pool.c for valgrind (tests/test_io_valgrind.py builds and runs it).
 *
 * Exercises every path the Python binding uses — batches in serial / parallel / chunked
 * layouts, dontneed, resizing while work is queued, every failure kind, closing a pool with
 * queued tasks — and checks the bytes. Exit status 0 when every check passed.
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
    int canceled = 0;
    for (int i = 0; i < bq->n_reads; i++) canceled += bq->reads[i].kind == SDQ_CANCELED;
    CHECK(canceled <= bq->n_reads);
    sdq_batch_free(bq);

    free(dest);
    close(fd);
    unlink(argv[1]);
    if (failures) fprintf(stderr, "%d checks failed\n", failures);
    else printf("io_pool: all checks passed\n");
    return failures ? 1 : 0;
}
