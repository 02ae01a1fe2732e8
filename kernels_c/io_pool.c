/*
 * io_pool — persistent pthread pool executing batches of preads (see io_pool.h).
 *
 * One FIFO of tasks protected by the pool mutex. Workers are numbered; shrinking the pool
 * lowers `target` and every worker whose number is >= target leaves after its current task,
 * so queued tasks are never lost. Completion is counted per batch and per group under the
 * batch's own mutex; after a worker's final unlock it never touches the batch again.
 */
#include "io_pool.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/uio.h>
#include <unistd.h>

#define WORKER_STACK_BYTES (256 * 1024)

typedef struct worker_arg {
    sdq_pool *pool;
    int index;
} worker_arg;

struct sdq_pool {
    pthread_mutex_t mu;     /* queue, target, stop */
    pthread_cond_t cv;      /* work available or target/stop changed */
    pthread_mutex_t resize; /* serializes set_threads and destroy */
    sdq_task *head, *tail;
    int target, running, stop;
    pthread_t threads[SDQ_MAX_THREADS];
    worker_arg args[SDQ_MAX_THREADS];
    /* device emulation (sdq_pool_emulate): the virtual device's places, under emu_mu */
    pthread_mutex_t emu_mu;
    int emu_depth; /* 0: off */
    int64_t emu_latency_ns;
    double emu_stream_bps, emu_aggregate_bps;
    int64_t emu_free_ns[SDQ_MAX_THREADS]; /* when each place frees */
    int64_t emu_reads, emu_late;
    int64_t emu_over_ns; /* sum over held reads of (actual end - emulated end): wake-up lag */
};

int64_t sdq_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Reads what is left of r (from r->done) with pread until `need` bytes are in. */
static void read_rest(sdq_read *r) {
    int interrupted = 0; /* consecutive EINTRs */
    while (r->done < r->need) {
        ssize_t n = pread(r->fd, r->dest + r->done, (size_t)(r->length - r->done),
                          (off_t)(r->offset + r->done));
        if (n < 0) {
            if (errno == EINTR && ++interrupted < SDQ_MAX_EINTR) continue;
            r->err = errno;
            r->kind = SDQ_ERRNO;
            break;
        }
        if (n == 0) {
            r->kind = r->done == 0 ? SDQ_PAST_EOF : SDQ_SHORT;
            break;
        }
        interrupted = 0;
        r->done += n;
    }
}

/* DONTNEED over [offset, offset + done) in whole pages: the kernel keeps a partially covered
 * page at either end */
static void drop_range(int fd, int64_t offset, int64_t done) {
    int64_t lo = offset / SDQ_DIRECT_ALIGN * SDQ_DIRECT_ALIGN;
    int64_t hi = (offset + done + SDQ_DIRECT_ALIGN - 1) / SDQ_DIRECT_ALIGN * SDQ_DIRECT_ALIGN;
    posix_fadvise(fd, (off_t)lo, (off_t)(hi - lo), POSIX_FADV_DONTNEED);
}

static void reset_read(sdq_read *r, int64_t now) {
    r->start_ns = now;
    r->done = 0;
    r->err = 0;
    r->kind = SDQ_OK;
}

void sdq_run_read(sdq_read *r, int flags) {
    reset_read(r, sdq_now_ns());
    read_rest(r);
    if ((flags & SDQ_FLAG_DONTNEED) && r->done > 0) drop_range(r->fd, r->offset, r->done);
    r->end_ns = sdq_now_ns();
}

int sdq_merge_run(const sdq_read *r, int n) {
    int k = 1;
    while (k < n && k < SDQ_MAX_MERGE && r[k].fd == r[0].fd &&
           r[k].offset == r[k - 1].offset + r[k - 1].length && r[k - 1].need == r[k - 1].length)
        k++;
    return k;
}

void sdq_run_merged(sdq_read *r, int n, int flags) {
    struct iovec iov[SDQ_MAX_MERGE];
    int64_t now = sdq_now_ns();
    if (n > SDQ_MAX_MERGE) n = SDQ_MAX_MERGE;
    for (int i = 0; i < n; i++) {
        reset_read(&r[i], now);
        iov[i].iov_base = r[i].dest;
        iov[i].iov_len = (size_t)r[i].length;
    }
    ssize_t got;
    int interrupted = 0;
    do {
        got = preadv(r[0].fd, iov, n, (off_t)r[0].offset);
    } while (got < 0 && errno == EINTR && ++interrupted < SDQ_MAX_EINTR);
    /* a failed or short preadv: each read finishes (or reports its error) on its own */
    int64_t left = got > 0 ? (int64_t)got : 0;
    for (int i = 0; i < n; i++) {
        r[i].done = left < r[i].length ? left : r[i].length;
        left -= r[i].done;
        if (r[i].done < r[i].need) read_rest(&r[i]);
    }
    if (flags & SDQ_FLAG_DONTNEED)
        for (int i = 0; i < n; i++)
            if (r[i].done > 0) drop_range(r[i].fd, r[i].offset, r[i].done);
    int64_t end = sdq_now_ns();
    for (int i = 0; i < n; i++) r[i].end_ns = end;
}

static void finish_task(sdq_task *t) {
    sdq_batch *b = t->batch;
    int32_t g = t->group;
    pthread_mutex_lock(&b->mu);
    b->task_done[t - b->tasks] = 1;
    b->group_left[g]--;
    b->tasks_left--;
    if (b->group_left[g] == 0 || b->tasks_left == 0) pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* The emulated finish of a read of `length` bytes starting at now_ns; 0 when emulation is off. */
static int64_t emu_reserve(sdq_pool *pool, int64_t now_ns, int64_t length) {
    pthread_mutex_lock(&pool->emu_mu);
    int depth = pool->emu_depth;
    int64_t finish = 0;
    if (depth > 0) {
        int first = 0;
        for (int i = 1; i < depth; i++)
            if (pool->emu_free_ns[i] < pool->emu_free_ns[first]) first = i;
        int64_t begin = pool->emu_free_ns[first] > now_ns ? pool->emu_free_ns[first] : now_ns;
        int n = 1;
        for (int i = 0; i < depth; i++)
            if (i != first && pool->emu_free_ns[i] > begin) n++;
        double rate = pool->emu_aggregate_bps / n;
        if (pool->emu_stream_bps < rate) rate = pool->emu_stream_bps;
        finish = begin + pool->emu_latency_ns + (int64_t)((double)length / rate * 1e9);
        pool->emu_free_ns[first] = finish;
        pool->emu_reads++;
    }
    pthread_mutex_unlock(&pool->emu_mu);
    return finish;
}

#define EMU_SPIN_NS 100000

/* Holds a finished read until its emulated finish; counts it late if it is already past. */
static void emu_hold(sdq_pool *pool, sdq_read *r, int64_t finish_ns) {
    if (r->end_ns > finish_ns) {
        pthread_mutex_lock(&pool->emu_mu);
        pool->emu_late++;
        pthread_mutex_unlock(&pool->emu_mu);
        return;
    }
    /* sleep to EMU_SPIN_NS before the finish, then yield until it: a sleeping thread wakes
     * tens of microseconds late, which would add ~10% to a 0.6 ms read */
    int64_t wake = finish_ns - EMU_SPIN_NS;
    struct timespec ts = {(time_t)(wake / 1000000000LL), (long)(wake % 1000000000LL)};
    if (wake > r->end_ns)
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
        }
    while (sdq_now_ns() < finish_ns) sched_yield();
    r->end_ns = sdq_now_ns();
    pthread_mutex_lock(&pool->emu_mu);
    pool->emu_over_ns += r->end_ns - finish_ns;
    pthread_mutex_unlock(&pool->emu_mu);
}

static void run_task(sdq_pool *pool, sdq_task *t) {
    sdq_batch *b = t->batch;
    int32_t end = t->first + t->count;
    for (int32_t i = t->first; i < end;) {
        sdq_read *r = &b->reads[i];
        int n = (b->flags & SDQ_FLAG_MERGE) ? sdq_merge_run(r, end - i) : 1;
        int64_t length = 0;
        for (int k = 0; k < n; k++) length += r[k].length;
        int64_t start = sdq_now_ns();
        int64_t finish = emu_reserve(pool, start, length);
        if (n > 1)
            sdq_run_merged(r, n, b->flags);
        else
            sdq_run_read(r, b->flags);
        if (finish > 0) {
            int ok = 1;
            for (int k = 0; k < n; k++) {
                r[k].start_ns = start;
                ok = ok && r[k].kind == SDQ_OK;
            }
            if (ok) {
                emu_hold(pool, &r[n - 1], finish);
                for (int k = 0; k < n - 1; k++) r[k].end_ns = r[n - 1].end_ns;
            }
        }
        i += n;
    }
    finish_task(t);
}

int sdq_pool_emulate(sdq_pool *pool, int64_t latency_ns, double stream_bps, double aggregate_bps,
                     int depth) {
    if (depth < 0 || depth > SDQ_MAX_THREADS || latency_ns < 0) return EINVAL;
    if (depth > 0 && !(stream_bps > 0 && aggregate_bps > 0)) return EINVAL;
    pthread_mutex_lock(&pool->emu_mu);
    pool->emu_depth = depth;
    pool->emu_latency_ns = latency_ns;
    pool->emu_stream_bps = stream_bps;
    pool->emu_aggregate_bps = aggregate_bps;
    for (int i = 0; i < SDQ_MAX_THREADS; i++) pool->emu_free_ns[i] = 0;
    pool->emu_reads = pool->emu_late = pool->emu_over_ns = 0;
    pthread_mutex_unlock(&pool->emu_mu);
    return 0;
}

void sdq_pool_emulated(sdq_pool *pool, int64_t *reads, int64_t *late, int64_t *over_ns) {
    pthread_mutex_lock(&pool->emu_mu);
    *reads = pool->emu_reads;
    *late = pool->emu_late;
    *over_ns = pool->emu_over_ns;
    pthread_mutex_unlock(&pool->emu_mu);
}

static void *worker_main(void *p) {
    worker_arg *arg = p;
    sdq_pool *pool = arg->pool;
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        while (!pool->stop && arg->index < pool->target && pool->head == NULL)
            pthread_cond_wait(&pool->cv, &pool->mu);
        if (pool->stop || arg->index >= pool->target) break;
        sdq_task *t = pool->head;
        pool->head = t->next;
        if (pool->head == NULL) pool->tail = NULL;
        pthread_mutex_unlock(&pool->mu);
        run_task(pool, t);
        pthread_mutex_lock(&pool->mu);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

int sdq_pool_create(sdq_pool **out, int threads) {
    *out = NULL;
    if (threads < 1 || threads > SDQ_MAX_THREADS) return EINVAL;
    sdq_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return ENOMEM;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    pthread_mutex_init(&pool->resize, NULL);
    pthread_mutex_init(&pool->emu_mu, NULL);
    int err = sdq_pool_set_threads(pool, threads);
    if (err) {
        sdq_pool_destroy(pool);
        return err;
    }
    *out = pool;
    return 0;
}

int sdq_pool_threads(sdq_pool *pool) {
    pthread_mutex_lock(&pool->mu);
    int n = pool->running;
    pthread_mutex_unlock(&pool->mu);
    return n;
}

/* Joins workers [keep, running). Caller holds pool->resize. */
static void join_from(sdq_pool *pool, int keep) {
    pthread_mutex_lock(&pool->mu);
    int running = pool->running;
    pool->target = keep;
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    for (int i = keep; i < running; i++) pthread_join(pool->threads[i], NULL);
    pthread_mutex_lock(&pool->mu);
    pool->running = keep;
    pthread_mutex_unlock(&pool->mu);
}

int sdq_pool_set_threads(sdq_pool *pool, int threads) {
    if (threads < 1 || threads > SDQ_MAX_THREADS) return EINVAL;
    int err = 0;
    pthread_mutex_lock(&pool->resize);
    if (pool->stop) {
        err = EPIPE;
    } else if (threads < pool->running) {
        join_from(pool, threads);
    } else if (threads > pool->running) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, WORKER_STACK_BYTES);
        pthread_mutex_lock(&pool->mu);
        pool->target = threads;
        int i = pool->running;
        for (; i < threads; i++) {
            pool->args[i].pool = pool;
            pool->args[i].index = i;
            err = pthread_create(&pool->threads[i], &attr, worker_main, &pool->args[i]);
            if (err) break;
        }
        pool->running = i;
        pool->target = i;
        pthread_mutex_unlock(&pool->mu);
        pthread_attr_destroy(&attr);
    }
    pthread_mutex_unlock(&pool->resize);
    return err;
}

void sdq_pool_destroy(sdq_pool *pool) { sdq_pool_destroy_until(pool, 0); }

/* Joins worker i by deadline_ns (0: no limit); detaches it and returns ETIMEDOUT if late. */
static int join_until(pthread_t thread, int64_t deadline_ns) {
    if (deadline_ns <= 0) return pthread_join(thread, NULL);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* pthread_timedjoin_np takes a CLOCK_REALTIME time */
    int64_t left = deadline_ns - sdq_now_ns();
    if (left < 0) left = 0;
    int64_t at = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec + left;
    ts.tv_sec = (time_t)(at / 1000000000LL);
    ts.tv_nsec = (long)(at % 1000000000LL);
    int err = pthread_timedjoin_np(thread, NULL, &ts);
    if (err == ETIMEDOUT) pthread_detach(thread);
    return err;
}

int sdq_pool_destroy_until(sdq_pool *pool, int64_t deadline_ns) {
    if (!pool) return 0;
    pthread_mutex_lock(&pool->resize);
    pthread_mutex_lock(&pool->mu);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->cv);
    int running = pool->running;
    /* cancel what never ran, so no waiter hangs (stop is set: no worker takes a task now) */
    sdq_task *t = pool->head;
    pool->head = pool->tail = NULL;
    pthread_mutex_unlock(&pool->mu);
    int late = 0;
    for (int i = 0; i < running; i++)
        if (join_until(pool->threads[i], deadline_ns) == ETIMEDOUT) late = 1;
    while (t) {
        sdq_task *next = t->next;
        sdq_batch *b = t->batch;
        for (int32_t i = t->first; i < t->first + t->count; i++) {
            b->reads[i].kind = SDQ_CANCELED;
            b->reads[i].err = ECANCELED;
            b->reads[i].start_ns = b->reads[i].end_ns = sdq_now_ns();
        }
        finish_task(t);
        t = next;
    }
    pthread_mutex_unlock(&pool->resize);
    if (late) return ETIMEDOUT; /* a detached worker still uses the pool: it stays allocated */
    pthread_mutex_destroy(&pool->resize);
    pthread_mutex_destroy(&pool->emu_mu);
    pthread_cond_destroy(&pool->cv);
    pthread_mutex_destroy(&pool->mu);
    free(pool);
    return 0;
}

sdq_batch *sdq_batch_new(int32_t n_reads, int32_t n_tasks, int32_t n_groups, int flags) {
    if (n_reads < 1 || n_tasks < 1 || n_groups < 1) return NULL;
    sdq_batch *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->reads = calloc((size_t)n_reads, sizeof *b->reads);
    b->tasks = calloc((size_t)n_tasks, sizeof *b->tasks);
    b->group_left = calloc((size_t)n_groups, sizeof *b->group_left);
    b->task_done = calloc((size_t)n_tasks, 1);
    if (!b->reads || !b->tasks || !b->group_left || !b->task_done) {
        free(b->reads);
        free(b->tasks);
        free(b->group_left);
        free(b->task_done);
        free(b);
        return NULL;
    }
    pthread_mutex_init(&b->mu, NULL);
    pthread_condattr_t attr; /* timed waits count on the monotonic clock, as sdq_now_ns does */
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&b->cv, &attr);
    pthread_condattr_destroy(&attr);
    b->n_reads = n_reads;
    b->n_tasks = n_tasks;
    b->n_groups = n_groups;
    b->flags = flags;
    return b;
}

void sdq_batch_set_task(sdq_batch *b, int32_t task, int32_t first, int32_t count, int32_t group) {
    sdq_task *t = &b->tasks[task];
    t->batch = b;
    t->first = first;
    t->count = count;
    t->group = group;
}

int sdq_pool_submit(sdq_pool *pool, sdq_batch *b) {
    int64_t now = sdq_now_ns();
    for (int32_t i = 0; i < b->n_reads; i++) b->reads[i].submit_ns = now;
    pthread_mutex_lock(&b->mu);
    for (int32_t g = 0; g < b->n_groups; g++) b->group_left[g] = 0;
    for (int32_t i = 0; i < b->n_tasks; i++) {
        b->group_left[b->tasks[i].group]++;
        b->task_done[i] = 0;
    }
    b->tasks_left = b->n_tasks;
    pthread_mutex_unlock(&b->mu);

    pthread_mutex_lock(&pool->mu);
    if (pool->stop) {
        pthread_mutex_unlock(&pool->mu);
        pthread_mutex_lock(&b->mu);
        b->tasks_left = 0;
        for (int32_t g = 0; g < b->n_groups; g++) b->group_left[g] = 0;
        for (int32_t i = 0; i < b->n_tasks; i++) b->task_done[i] = 1;
        for (int32_t i = 0; i < b->n_reads; i++) {
            b->reads[i].kind = SDQ_CANCELED;
            b->reads[i].err = ECANCELED;
        }
        pthread_mutex_unlock(&b->mu);
        return EPIPE;
    }
    for (int32_t i = 0; i < b->n_tasks; i++) {
        sdq_task *t = &b->tasks[i];
        t->next = NULL;
        if (pool->tail)
            pool->tail->next = t;
        else
            pool->head = t;
        pool->tail = t;
    }
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    return 0;
}

void sdq_batch_wait_group(sdq_batch *b, int32_t group) {
    pthread_mutex_lock(&b->mu);
    while (b->group_left[group] > 0) pthread_cond_wait(&b->cv, &b->mu);
    pthread_mutex_unlock(&b->mu);
}

void sdq_batch_wait_all(sdq_batch *b) {
    pthread_mutex_lock(&b->mu);
    while (b->tasks_left > 0) pthread_cond_wait(&b->cv, &b->mu);
    pthread_mutex_unlock(&b->mu);
}

/* Waits on b->cv (b->mu held) while *left > 0, until deadline_ns (0: no limit). */
static int wait_until(sdq_batch *b, const int32_t *left, int64_t deadline_ns) {
    struct timespec ts;
    ts.tv_sec = (time_t)(deadline_ns / 1000000000LL);
    ts.tv_nsec = (long)(deadline_ns % 1000000000LL);
    while (*left > 0) {
        if (deadline_ns <= 0) {
            pthread_cond_wait(&b->cv, &b->mu);
        } else if (pthread_cond_timedwait(&b->cv, &b->mu, &ts) == ETIMEDOUT) {
            if (*left > 0) return ETIMEDOUT;
        }
    }
    return 0;
}

int sdq_batch_wait_group_until(sdq_batch *b, int32_t group, int64_t deadline_ns) {
    pthread_mutex_lock(&b->mu);
    int err = wait_until(b, &b->group_left[group], deadline_ns);
    pthread_mutex_unlock(&b->mu);
    return err;
}

int sdq_batch_wait_all_until(sdq_batch *b, int64_t deadline_ns) {
    pthread_mutex_lock(&b->mu);
    int err = wait_until(b, &b->tasks_left, deadline_ns);
    pthread_mutex_unlock(&b->mu);
    return err;
}

int32_t sdq_batch_first_unfinished(sdq_batch *b, int32_t group) {
    int32_t found = -1;
    pthread_mutex_lock(&b->mu);
    for (int32_t t = 0; t < b->n_tasks && found < 0; t++)
        if (!b->task_done[t] && (group < 0 || b->tasks[t].group == group)) found = b->tasks[t].first;
    pthread_mutex_unlock(&b->mu);
    return found;
}

int sdq_batch_group_done(sdq_batch *b, int32_t group) {
    pthread_mutex_lock(&b->mu);
    int done = b->group_left[group] == 0;
    pthread_mutex_unlock(&b->mu);
    return done;
}

int sdq_batch_all_done(sdq_batch *b) {
    pthread_mutex_lock(&b->mu);
    int done = b->tasks_left == 0;
    pthread_mutex_unlock(&b->mu);
    return done;
}

void sdq_batch_free(sdq_batch *b) {
    if (!b) return;
    sdq_batch_wait_all(b);
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    free(b->reads);
    free(b->tasks);
    free(b->group_left);
    free(b->task_done);
    free(b);
}
