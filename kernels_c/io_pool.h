/*
 * io_pool — a persistent pool of POSIX threads that executes batches of preads.
 *
 * Pure C (no Python): sdq._io wraps it (io_module.c), and kernels_c/test_io_pool.c drives it
 * under valgrind. A batch is an array of reads grouped into tasks and groups:
 *
 *   read   one pread loop: (fd, offset, length, need, dest). It succeeds when at least `need`
 *          bytes arrived (need < length only for O_DIRECT reads whose aligned tail may lie
 *          past the end of the file).
 *   task   consecutive reads executed in order by one worker (mode serial: an expert's three
 *          segments; mode parallel: one segment; mode split: one chunk).
 *   group  the unit a caller waits for (one expert): done when all its tasks are done.
 *
 * Nothing here exits or aborts: every failure is recorded in the read (err, kind) and returned.
 */
#ifndef SDQ_IO_POOL_H
#define SDQ_IO_POOL_H

#include <pthread.h>
#include <stdint.h>

#define SDQ_MAX_THREADS 256
#define SDQ_DIRECT_ALIGN 4096

/* batch flags */
#define SDQ_FLAG_DONTNEED 1 /* posix_fadvise(DONTNEED) on each read's range after it */
#define SDQ_FLAG_DIRECT 2   /* reads go to an O_DIRECT fd: offset, length, dest 4096-aligned */
/* a task's consecutive reads that continue each other in the file (the next offset is this
 * one's offset + length, same fd) go out as one preadv of up to SDQ_MAX_MERGE destinations */
#define SDQ_FLAG_MERGE 4
#define SDQ_MAX_MERGE 64

/* read outcome */
#define SDQ_OK 0
#define SDQ_ERRNO 1     /* pread failed: err holds errno */
#define SDQ_SHORT 2     /* end of file after some bytes but before `need` */
#define SDQ_PAST_EOF 3  /* offset at or past end of file: no byte read */
#define SDQ_CANCELED 4  /* the pool was closed before the read ran */

/* consecutive EINTRs one read retries before it fails with EINTR (a signal storm, not a hang) */
#define SDQ_MAX_EINTR 10000

typedef struct sdq_read {
    int fd;
    int64_t offset, length, need;
    char *dest;
    int64_t submit_ns, start_ns, end_ns; /* CLOCK_MONOTONIC */
    int64_t done;                        /* bytes read */
    int err, kind;
} sdq_read;

struct sdq_batch;

typedef struct sdq_task {
    struct sdq_task *next;
    struct sdq_batch *batch;
    int32_t first, count, group;
} sdq_task;

typedef struct sdq_batch {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t n_reads, n_tasks, n_groups;
    int flags;
    sdq_read *reads;
    sdq_task *tasks;
    int32_t *group_left; /* tasks not finished, per group */
    int32_t tasks_left;
    char *task_done;     /* per task: finished (under mu) */
} sdq_batch;

typedef struct sdq_pool sdq_pool;

/* Pool. Functions returning int return 0 or an errno value. */
int sdq_pool_create(sdq_pool **out, int threads);
int sdq_pool_set_threads(sdq_pool *pool, int threads); /* grows or shrinks; joins leavers */
int sdq_pool_threads(sdq_pool *pool);
/* Stops the workers (running reads finish), cancels queued tasks, frees the pool. */
void sdq_pool_destroy(sdq_pool *pool);
/* The same, but waits for running reads only until deadline_ns (sdq_now_ns clock; 0: no
 * limit). Returns 0, or ETIMEDOUT: a read still runs, its worker is left detached and the
 * pool is not freed (that worker still uses it); queued tasks are canceled either way. */
int sdq_pool_destroy_until(sdq_pool *pool, int64_t deadline_ns);

/* Batch: allocate, fill reads[i] (fd, offset, length, need, dest) and the task layout with
 * sdq_batch_set_task, then submit. Returns NULL when out of memory. */
sdq_batch *sdq_batch_new(int32_t n_reads, int32_t n_tasks, int32_t n_groups, int flags);
void sdq_batch_set_task(sdq_batch *b, int32_t task, int32_t first, int32_t count, int32_t group);
int sdq_pool_submit(sdq_pool *pool, sdq_batch *b); /* EPIPE if the pool is closed */
void sdq_batch_wait_group(sdq_batch *b, int32_t group);
void sdq_batch_wait_all(sdq_batch *b);
/* Bounded waits: 0 when done, ETIMEDOUT once deadline_ns (sdq_now_ns clock) passed first. */
int sdq_batch_wait_group_until(sdq_batch *b, int32_t group, int64_t deadline_ns);
int sdq_batch_wait_all_until(sdq_batch *b, int64_t deadline_ns);
/* The first read of the first unfinished task of `group` (-1: every group), or -1. */
int32_t sdq_batch_first_unfinished(sdq_batch *b, int32_t group);
int sdq_batch_group_done(sdq_batch *b, int32_t group);
int sdq_batch_all_done(sdq_batch *b);
void sdq_batch_free(sdq_batch *b); /* waits for every read first */

/* Device emulation (sdq/paging/device_model.py states the rule). With depth > 0, every read
 * the pool runs still moves its bytes, then its completion is held until a virtual device of
 * `depth` places would have finished it: it takes the place that frees first, begins at
 * max(its start, that time), counts the places busy then (n, itself included) and ends at
 * begin + latency_ns + length / min(stream_bps, aggregate_bps / n). depth 0 turns it off.
 * EINVAL for a depth above SDQ_MAX_THREADS or a bandwidth <= 0. */
int sdq_pool_emulate(sdq_pool *pool, int64_t latency_ns, double stream_bps, double aggregate_bps,
                     int depth);
/* Reads run under emulation since it was set, those whose real bytes arrived after the
 * emulated finish (the source was slower than the model: the hold could not be honoured), and
 * the sum over the others of how long after their emulated finish they ended (a worker woken
 * late on a busy machine). */
void sdq_pool_emulated(sdq_pool *pool, int64_t *reads, int64_t *late, int64_t *over_ns);

int64_t sdq_now_ns(void);
/* Runs one read in the calling thread (used by the pool's workers and by pread_into). */
void sdq_run_read(sdq_read *r, int flags);
/* Runs n <= SDQ_MAX_MERGE reads that continue each other in the file as one preadv; a short
 * return is finished read by read with pread. Each read's outcome is recorded as by
 * sdq_run_read (all share the start and end times). */
void sdq_run_merged(sdq_read *r, int n, int flags);
/* How many reads from r[0] (at most n, at most SDQ_MAX_MERGE) continue each other in the file. */
int sdq_merge_run(const sdq_read *r, int n);

#endif
