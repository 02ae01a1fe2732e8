/*
 * fault_pread — a test-only pread and preadv that fail on purpose, for the read pool's fault
 * tests.
 *
 * Never part of sdq._io: the tests build it as a shared library and load it with LD_PRELOAD
 * (or link it into the C driver), where its pread, pread64, preadv and preadv64 stand in for
 * libc's and pass every call through to them unless a rule matches. Every read call the pool
 * makes is one of these, so every read path (one read, a chunk, a merged run) meets the same
 * faults. A preadv is matched on its whole range [offset, offset + sum of the iov lengths).
 * Without it the pool pays nothing.
 *
 * Rules come from $SDQ_FAULTS at load time or from sdq_faults_set(spec) at any time (ctypes);
 * spec is rules separated by ';', each KIND[:key=value,...]:
 *
 *   eio       fail with EIO
 *   eintr     fail with EINTR (the caller is expected to retry)
 *   partial   read only half of what was asked (the caller is expected to continue)
 *   short     read half of what was asked, then report end of file on the next call at the
 *             offset where it stopped
 *   stall     sleep `ms` milliseconds, then read normally
 *   closefd   close the descriptor, then read (EBADF)
 *
 *   at=OFFSET   only calls whose range [offset, offset + count) holds this file offset
 *   to=END      with at: only calls whose range overlaps [at, END) instead
 *   fd=N        only calls on this descriptor
 *   nth=N       fire from the N-th matching call on (1-based; default 1)
 *   times=N     fire N times (default 1; 0: every matching call from nth on)
 *   ms=N        stall duration (default 1000)
 *
 * sdq_faults_fired() returns how many times a rule fired since the last sdq_faults_set.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_RULES 16

enum { EIO_, EINTR_, PARTIAL, SHORT_, STALL, CLOSEFD };

typedef struct rule {
    int kind, fd;
    int64_t at, to, nth, times, ms;
    int64_t seen, fired;
    int eof_next;    /* short: the call that continues the shortened one reports end of file */
    int eof_fd;
    int64_t eof_at; /* ... identified by its descriptor and offset */
} rule;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static rule rules[MAX_RULES];
static int n_rules;
static int64_t fired_total;

typedef ssize_t (*pread_fn)(int, void *, size_t, off_t);
typedef ssize_t (*preadv_fn)(int, const struct iovec *, int, off_t);

static int parse_rule(char *text, rule *r) {
    memset(r, 0, sizeof *r);
    r->at = -1;
    r->to = -1;
    r->fd = -1;
    r->nth = 1;
    r->times = 1;
    r->ms = 1000;
    char *args = strchr(text, ':');
    if (args) *args++ = 0;
    static const char *names[] = {"eio", "eintr", "partial", "short", "stall", "closefd"};
    r->kind = -1;
    for (int k = 0; k < 6; k++)
        if (strcmp(text, names[k]) == 0) r->kind = k;
    if (r->kind < 0) return -1;
    for (char *kv = args ? strtok(args, ",") : NULL; kv; kv = strtok(NULL, ",")) {
        char *eq = strchr(kv, '=');
        if (!eq) return -1;
        *eq = 0;
        int64_t v = strtoll(eq + 1, NULL, 10);
        if (strcmp(kv, "at") == 0) r->at = v;
        else if (strcmp(kv, "to") == 0) r->to = v;
        else if (strcmp(kv, "fd") == 0) r->fd = (int)v;
        else if (strcmp(kv, "nth") == 0) r->nth = v;
        else if (strcmp(kv, "times") == 0) r->times = v;
        else if (strcmp(kv, "ms") == 0) r->ms = v;
        else return -1;
    }
    return 0;
}

/* Replaces the rules; returns 0, or -1 (and no rule) when spec does not parse. */
int sdq_faults_set(const char *spec) {
    char *copy = strdup(spec ? spec : "");
    if (!copy) return -1;
    rule parsed[MAX_RULES];
    int n = 0, bad = 0;
    char *save = NULL;
    /* split on ';' first: strtok inside parse_rule would clobber strtok's state */
    char *items[MAX_RULES];
    for (char *it = strtok_r(copy, ";", &save); it; it = strtok_r(NULL, ";", &save)) {
        if (n == MAX_RULES) {
            bad = 1;
            break;
        }
        items[n++] = it;
    }
    for (int i = 0; i < n && !bad; i++) bad = parse_rule(items[i], &parsed[i]) != 0;
    pthread_mutex_lock(&mu);
    n_rules = bad ? 0 : n;
    if (!bad) memcpy(rules, parsed, sizeof(rule) * (size_t)n);
    fired_total = 0;
    pthread_mutex_unlock(&mu);
    free(copy);
    return bad ? -1 : 0;
}

int64_t sdq_faults_fired(void) {
    pthread_mutex_lock(&mu);
    int64_t n = fired_total;
    pthread_mutex_unlock(&mu);
    return n;
}

static pread_fn real_pread, real_pread64;
static preadv_fn real_preadv, real_preadv64;

__attribute__((constructor)) static void load_rules(void) {
    real_pread = (pread_fn)dlsym(RTLD_NEXT, "pread");
    real_pread64 = (pread_fn)dlsym(RTLD_NEXT, "pread64");
    real_preadv = (preadv_fn)dlsym(RTLD_NEXT, "preadv");
    real_preadv64 = (preadv_fn)dlsym(RTLD_NEXT, "preadv64");
    const char *spec = getenv("SDQ_FAULTS");
    if (spec && sdq_faults_set(spec) != 0) fprintf(stderr, "fault_pread: bad SDQ_FAULTS\n");
}

/* What partial and short read: half of what was asked (all of one byte). */
static size_t half(size_t count) { return count > 1 ? count / 2 : count; }

/* The rule that fires for this call (-1: none), its kind and stall in *kind, *ms. */
static int match(int fd, size_t count, off_t offset, int *kind, int64_t *ms) {
    int fire = -1;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n_rules && fire < 0; i++) {
        rule *r = &rules[i];
        if (r->eof_next && r->eof_fd == fd && r->eof_at == offset) {
            r->eof_next = 0;
            fire = i;
            *kind = -1; /* end of file */
            break;
        }
        if (r->fd >= 0 && r->fd != fd) continue;
        if (r->at >= 0 && r->to < 0 && !(r->at >= offset && r->at < offset + (off_t)count))
            continue;
        if (r->at >= 0 && r->to >= 0 && !(r->at < offset + (off_t)count && offset < r->to))
            continue;
        r->seen++;
        if (r->seen < r->nth || (r->times > 0 && r->fired >= r->times)) continue;
        r->fired++;
        fired_total++;
        if (r->kind == SHORT_) {
            r->eof_next = 1;
            r->eof_fd = fd;
            r->eof_at = offset + (off_t)half(count);
        }
        fire = i;
        *kind = r->kind;
        *ms = r->ms;
    }
    pthread_mutex_unlock(&mu);
    return fire;
}

enum { READ_ALL, READ_HALF, DONE };

/* What one call of `count` bytes at `offset` does under the rule that fires (none: READ_ALL).
 * Sleeps or closes the descriptor as the rule says; DONE sets *ret (0 at end of file, -1 with
 * errno set). Shared by pread and preadv, so every read call meets the same faults. */
static int fault_for(int fd, size_t count, off_t offset, ssize_t *ret) {
    int kind = 0;
    int64_t ms = 0;
    if (match(fd, count, offset, &kind, &ms) < 0) return READ_ALL;
    switch (kind) {
    case -1: *ret = 0; return DONE;
    case EIO_: errno = EIO; *ret = -1; return DONE;
    case EINTR_: errno = EINTR; *ret = -1; return DONE;
    case PARTIAL:
    case SHORT_: return READ_HALF;
    case STALL: {
        struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
        return READ_ALL;
    }
    default: close(fd); return READ_ALL;
    }
}

static ssize_t faulty(pread_fn real, int fd, void *buf, size_t count, off_t offset) {
    ssize_t ret = 0;
    switch (fault_for(fd, count, offset, &ret)) {
    case DONE: return ret;
    case READ_HALF: return real(fd, buf, half(count), offset);
    default: return real(fd, buf, count, offset);
    }
}

ssize_t pread(int fd, void *buf, size_t count, off_t offset) {
    return faulty(real_pread, fd, buf, count, offset);
}

ssize_t pread64(int fd, void *buf, size_t count, off_t offset) {
    return faulty(real_pread64, fd, buf, count, offset);
}

#define MAX_IOV 1024

/* The first iovs of iov[n] that hold `want` bytes, the last one cut short: -> their count. */
static int first_bytes(const struct iovec *iov, int n, size_t want, struct iovec *out) {
    int k = 0;
    for (; k < n && k < MAX_IOV && want > 0; k++) {
        out[k] = iov[k];
        if (out[k].iov_len > want) out[k].iov_len = want;
        want -= out[k].iov_len;
    }
    return k;
}

static ssize_t faulty_v(preadv_fn real, int fd, const struct iovec *iov, int n, off_t offset) {
    size_t count = 0;
    for (int i = 0; i < n; i++) count += iov[i].iov_len;
    ssize_t ret = 0;
    switch (fault_for(fd, count, offset, &ret)) {
    case DONE: return ret;
    case READ_HALF: {
        struct iovec first[MAX_IOV];
        return real(fd, first, first_bytes(iov, n, half(count), first), offset);
    }
    default: return real(fd, iov, n, offset);
    }
}

ssize_t preadv(int fd, const struct iovec *iov, int n, off_t offset) {
    return faulty_v(real_preadv, fd, iov, n, offset);
}

ssize_t preadv64(int fd, const struct iovec *iov, int n, off_t offset) {
    return faulty_v(real_preadv64, fd, iov, n, offset);
}
