/*
 * sdq._io — Python binding of the pread pool (io_pool.c).
 *
 *   pool = Pool(threads, timeout=0)          persistent workers; pool.threads is settable;
 *       timeout: seconds any wait of its batches, and close, may block (0: no limit)
 *   batch = pool.submit(reads, flags=0, keepalive=None)
 *       reads: C-contiguous int64 array [R, 7]: fd, offset, length, need, dest, task, group
 *       rows of one task are consecutive and share one group; groups are 0..G-1.
 *       keepalive: object kept alive until the batch is freed (the arena the dests point into)
 *       flags: FLAG_DONTNEED, FLAG_DIRECT, FLAG_MERGE (a task's reads that continue each
 *       other in the file go out as one preadv; io_pool.h)
 *   batch.wait(g) / batch.wait_all()         block with the GIL released; raise IOFailure
 *                                            (kind "timeout" when the pool's timeout passed)
 *   batch.done(g) / batch.all_done()         poll
 *   batch.report() -> bytes of int64 [R, 6]: submit_ns, start_ns, end_ns, done, errno, kind
 *   pread_into(fd, offset, buffer)           one blocking read (GIL released)
 *   resident_fraction(fd, offset, length)    share of the range's pages in the page cache
 *
 * IOFailure (an OSError) carries fd, offset, length, done, kind ("error", "short", "eof",
 * "canceled", "timeout") and index (the read's row), so the Python layer can name the file and
 * segment.
 *
 * A read that never returns (a hung device) cannot be stopped: after a timeout its batch is
 * never freed and keeps its keepalive (the arena it writes into), and close() leaves its
 * worker detached with the pool allocated, so the process can still end cleanly.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "io_pool.h"

#define SDQ_TIMEOUT 5 /* not a read outcome: a wait gave up (raise_failure only) */
#define READ_COLS 7
#define REPORT_COLS 6

static PyObject *IOFailure;

static const char *kind_name(int kind) {
    switch (kind) {
    case SDQ_ERRNO: return "error";
    case SDQ_SHORT: return "short";
    case SDQ_PAST_EOF: return "eof";
    case SDQ_CANCELED: return "canceled";
    case SDQ_TIMEOUT: return "timeout";
    default: return "ok";
    }
}

static void set_attr_ll(PyObject *obj, const char *name, long long value) {
    PyObject *v = PyLong_FromLongLong(value);
    if (v) {
        PyObject_SetAttrString(obj, name, v);
        Py_DECREF(v);
    }
}

/* Raises IOFailure for read r (row index) with outcome `kind`. Always returns NULL. */
static PyObject *raise_kind(const sdq_read *r, int kind, Py_ssize_t index, double timeout) {
    char msg[256];
    int code = r->err;
    switch (kind) {
    case SDQ_TIMEOUT:
        code = ETIMEDOUT;
        snprintf(msg, sizeof msg, "read timed out after %.3g s: fd %d offset %lld length %lld",
                 timeout, r->fd, (long long)r->offset, (long long)r->need);
        break;
    case SDQ_ERRNO:
        snprintf(msg, sizeof msg, "pread fd %d offset %lld length %lld: %s", r->fd,
                 (long long)r->offset, (long long)r->length, strerror(r->err));
        break;
    case SDQ_SHORT:
        code = EIO;
        snprintf(msg, sizeof msg,
                 "short read: fd %d offset %lld length %lld: end of file after %lld bytes", r->fd,
                 (long long)r->offset, (long long)r->need, (long long)r->done);
        break;
    case SDQ_PAST_EOF:
        code = EIO;
        snprintf(msg, sizeof msg, "read past end of file: fd %d offset %lld length %lld", r->fd,
                 (long long)r->offset, (long long)r->need);
        break;
    default:
        snprintf(msg, sizeof msg, "read canceled (pool closed): fd %d offset %lld length %lld",
                 r->fd, (long long)r->offset, (long long)r->length);
    }
    PyObject *exc = PyObject_CallFunction(IOFailure, "is", code, msg);
    if (!exc) return NULL;
    set_attr_ll(exc, "fd", r->fd);
    set_attr_ll(exc, "offset", r->offset);
    set_attr_ll(exc, "length", r->need);
    set_attr_ll(exc, "done", r->done);
    set_attr_ll(exc, "index", index);
    PyObject *name = PyUnicode_FromString(kind_name(kind));
    if (name) {
        PyObject_SetAttrString(exc, "kind", name);
        Py_DECREF(name);
    }
    PyErr_SetObject(IOFailure, exc);
    Py_DECREF(exc);
    return NULL;
}

static PyObject *raise_failure(const sdq_read *r, Py_ssize_t index) {
    return raise_kind(r, r->kind, index, 0.0);
}

/* ---------------------------------------------------------------- Batch */

typedef struct {
    PyObject_HEAD sdq_batch *b;
    PyObject *keepalive;
    double timeout; /* seconds a wait may block; 0: no limit */
    int timed_out;  /* a wait gave up: dealloc does not wait again */
} BatchObject;

static int64_t deadline_after(double timeout) {
    return timeout > 0 ? sdq_now_ns() + (int64_t)(timeout * 1e9) : 0;
}

static void Batch_dealloc(BatchObject *self) {
    int late = 0;
    if (self->b) {
        sdq_batch *b = self->b;
        self->b = NULL;
        int64_t deadline = self->timed_out ? sdq_now_ns() : deadline_after(self->timeout);
        Py_BEGIN_ALLOW_THREADS late = sdq_batch_wait_all_until(b, deadline) == ETIMEDOUT;
        if (!late) sdq_batch_free(b);
        Py_END_ALLOW_THREADS
    }
    if (!late) Py_CLEAR(self->keepalive); /* else a running read still writes into it */
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Raises the timeout IOFailure of group (-1: any) of a batch whose wait gave up. */
static PyObject *raise_timeout(BatchObject *self, int32_t group) {
    self->timed_out = 1;
    int32_t i = sdq_batch_first_unfinished(self->b, group);
    if (i < 0) i = 0; /* finished in between: name the first read */
    return raise_kind(&self->b->reads[i], SDQ_TIMEOUT, i, self->timeout);
}

static PyObject *check_group(BatchObject *self, int32_t group) {
    sdq_batch *b = self->b;
    for (int32_t t = 0; t < b->n_tasks; t++) {
        const sdq_task *task = &b->tasks[t];
        if (group >= 0 && task->group != group) continue;
        for (int32_t i = task->first; i < task->first + task->count; i++)
            if (b->reads[i].kind != SDQ_OK) return raise_failure(&b->reads[i], i);
    }
    Py_RETURN_NONE;
}

static int parse_group(BatchObject *self, PyObject *arg, int32_t *group) {
    long g = PyLong_AsLong(arg);
    if (g == -1 && PyErr_Occurred()) return -1;
    if (g < 0 || g >= self->b->n_groups) {
        PyErr_Format(PyExc_IndexError, "group %ld out of range 0..%d", g, self->b->n_groups - 1);
        return -1;
    }
    *group = (int32_t)g;
    return 0;
}

static PyObject *Batch_wait(BatchObject *self, PyObject *arg) {
    int32_t g;
    if (parse_group(self, arg, &g)) return NULL;
    sdq_batch *b = self->b;
    int64_t deadline = deadline_after(self->timeout);
    int err;
    Py_BEGIN_ALLOW_THREADS err = sdq_batch_wait_group_until(b, g, deadline);
    Py_END_ALLOW_THREADS if (err) return raise_timeout(self, g);
    return check_group(self, g);
}

static PyObject *Batch_wait_all(BatchObject *self, PyObject *Py_UNUSED(ignored)) {
    sdq_batch *b = self->b;
    int64_t deadline = deadline_after(self->timeout);
    int err;
    Py_BEGIN_ALLOW_THREADS err = sdq_batch_wait_all_until(b, deadline);
    Py_END_ALLOW_THREADS if (err) return raise_timeout(self, -1);
    return check_group(self, -1);
}

static PyObject *Batch_done(BatchObject *self, PyObject *arg) {
    int32_t g;
    if (parse_group(self, arg, &g)) return NULL;
    return PyBool_FromLong(sdq_batch_group_done(self->b, g));
}

static PyObject *Batch_all_done(BatchObject *self, PyObject *Py_UNUSED(ignored)) {
    return PyBool_FromLong(sdq_batch_all_done(self->b));
}

static PyObject *Batch_report(BatchObject *self, PyObject *Py_UNUSED(ignored)) {
    sdq_batch *b = self->b;
    int64_t deadline = deadline_after(self->timeout);
    int err;
    Py_BEGIN_ALLOW_THREADS err = sdq_batch_wait_all_until(b, deadline);
    Py_END_ALLOW_THREADS if (err) return raise_timeout(self, -1);
    PyObject *out =
        PyBytes_FromStringAndSize(NULL, (Py_ssize_t)b->n_reads * REPORT_COLS * 8);
    if (!out) return NULL;
    int64_t *row = (int64_t *)PyBytes_AS_STRING(out);
    for (int32_t i = 0; i < b->n_reads; i++, row += REPORT_COLS) {
        const sdq_read *r = &b->reads[i];
        row[0] = r->submit_ns;
        row[1] = r->start_ns;
        row[2] = r->end_ns;
        row[3] = r->done;
        row[4] = r->err;
        row[5] = r->kind;
    }
    return out;
}

static PyObject *Batch_get_n_reads(BatchObject *self, void *Py_UNUSED(c)) {
    return PyLong_FromLong(self->b->n_reads);
}

static PyObject *Batch_get_n_groups(BatchObject *self, void *Py_UNUSED(c)) {
    return PyLong_FromLong(self->b->n_groups);
}

static PyMethodDef Batch_methods[] = {
    {"wait", (PyCFunction)Batch_wait, METH_O,
     "wait(group): block until the group's reads are done; raise IOFailure on the first failure"},
    {"wait_all", (PyCFunction)Batch_wait_all, METH_NOARGS, "wait_all(): every group"},
    {"done", (PyCFunction)Batch_done, METH_O, "done(group) -> bool, without blocking"},
    {"all_done", (PyCFunction)Batch_all_done, METH_NOARGS, "all_done() -> bool"},
    {"report", (PyCFunction)Batch_report, METH_NOARGS,
     "report() -> bytes of int64 [R, 6]: submit_ns, start_ns, end_ns, done, errno, kind "
     "(waits for every read)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Batch_getset[] = {
    {"n_reads", (getter)Batch_get_n_reads, NULL, "number of reads", NULL},
    {"n_groups", (getter)Batch_get_n_groups, NULL, "number of groups", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject BatchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sdq._io.Batch",
    .tp_basicsize = sizeof(BatchObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A submitted batch of reads (made by Pool.submit).",
    .tp_dealloc = (destructor)Batch_dealloc,
    .tp_methods = Batch_methods,
    .tp_getset = Batch_getset,
};

/* ---------------------------------------------------------------- Pool */

typedef struct {
    PyObject_HEAD sdq_pool *pool;
    double timeout;
} PoolObject;

static int Pool_init(PoolObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"threads", "timeout", NULL};
    int threads;
    double timeout = 0.0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i|d", kwlist, &threads, &timeout)) return -1;
    if (!(timeout >= 0 && timeout < 1e9)) {
        PyErr_Format(PyExc_ValueError, "timeout must be 0 (none) or a positive number of seconds");
        return -1;
    }
    self->timeout = timeout;
    if (self->pool) {
        PyErr_SetString(PyExc_RuntimeError, "Pool already initialized");
        return -1;
    }
    if (threads < 1 || threads > SDQ_MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "threads must be 1..%d, got %d", SDQ_MAX_THREADS,
                     threads);
        return -1;
    }
    int err = sdq_pool_create(&self->pool, threads);
    if (err) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return 0;
}

static void pool_close(PoolObject *self) {
    if (self->pool) {
        sdq_pool *pool = self->pool;
        self->pool = NULL;
        int64_t deadline = deadline_after(self->timeout);
        Py_BEGIN_ALLOW_THREADS sdq_pool_destroy_until(pool, deadline);
        Py_END_ALLOW_THREADS
    }
}

static void Pool_dealloc(PoolObject *self) {
    pool_close(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int pool_open(PoolObject *self) {
    if (!self->pool) {
        PyErr_SetString(PyExc_ValueError, "I/O pool is closed");
        return -1;
    }
    return 0;
}

static PyObject *Pool_close(PoolObject *self, PyObject *Py_UNUSED(ignored)) {
    pool_close(self);
    Py_RETURN_NONE;
}

static PyObject *Pool_get_threads(PoolObject *self, void *Py_UNUSED(c)) {
    if (pool_open(self)) return NULL;
    return PyLong_FromLong(sdq_pool_threads(self->pool));
}

static int Pool_set_threads(PoolObject *self, PyObject *value, void *Py_UNUSED(c)) {
    if (pool_open(self)) return -1;
    if (!value) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete threads");
        return -1;
    }
    long n = PyLong_AsLong(value);
    if (n == -1 && PyErr_Occurred()) return -1;
    if (n < 1 || n > SDQ_MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "threads must be 1..%d, got %ld", SDQ_MAX_THREADS, n);
        return -1;
    }
    int err;
    sdq_pool *pool = self->pool;
    Py_BEGIN_ALLOW_THREADS err = sdq_pool_set_threads(pool, (int)n);
    Py_END_ALLOW_THREADS if (err) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return 0;
}

/* Validates the [R, 7] int64 table and copies it into a new batch. */
static sdq_batch *build_batch(Py_buffer *view, int flags) {
    if (view->ndim != 2 || view->shape[1] != READ_COLS || view->itemsize != 8 ||
        (view->format && strchr("lq", view->format[0]) == NULL)) {
        PyErr_SetString(PyExc_ValueError, "reads must be a C-contiguous int64 array [R, 7]");
        return NULL;
    }
    Py_ssize_t n = view->shape[0];
    if (n < 1 || n > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "reads must have at least one row");
        return NULL;
    }
    const int64_t *rows = view->buf;
    int64_t n_tasks = 0, n_groups = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t *r = rows + i * READ_COLS;
        int64_t offset = r[1], length = r[2], need = r[3], dest = r[4], task = r[5], group = r[6];
        if (offset < 0 || length < 1 || need < 1 || need > length || dest == 0 || group < 0 ||
            group >= INT32_MAX) {
            PyErr_Format(PyExc_ValueError,
                         "read %zd invalid: offset %lld length %lld need %lld dest %lld group %lld",
                         i, (long long)offset, (long long)length, (long long)need,
                         (long long)dest, (long long)group);
            return NULL;
        }
        if ((flags & SDQ_FLAG_DIRECT) &&
            (offset % SDQ_DIRECT_ALIGN || length % SDQ_DIRECT_ALIGN || dest % SDQ_DIRECT_ALIGN)) {
            PyErr_Format(PyExc_ValueError,
                         "direct read %zd not %d-aligned: offset %lld length %lld dest 0x%llx", i,
                         SDQ_DIRECT_ALIGN, (long long)offset, (long long)length,
                         (unsigned long long)dest);
            return NULL;
        }
        if (i == 0 || task != rows[(i - 1) * READ_COLS + 5]) {
            if (i > 0 && task != rows[(i - 1) * READ_COLS + 5] + 1) {
                PyErr_Format(PyExc_ValueError, "read %zd: task ids must be 0, 1, 2... in order",
                             i);
                return NULL;
            }
            if (i == 0 && task != 0) {
                PyErr_SetString(PyExc_ValueError, "the first read's task id must be 0");
                return NULL;
            }
            n_tasks++;
        } else if (group != rows[(i - 1) * READ_COLS + 6]) {
            PyErr_Format(PyExc_ValueError, "read %zd: the reads of one task share one group", i);
            return NULL;
        }
        if (group + 1 > n_groups) n_groups = group + 1;
    }
    sdq_batch *b = sdq_batch_new((int32_t)n, (int32_t)n_tasks, (int32_t)n_groups, flags);
    if (!b) {
        PyErr_NoMemory();
        return NULL;
    }
    int32_t task = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t *r = rows + i * READ_COLS;
        sdq_read *rd = &b->reads[i];
        rd->fd = (int)r[0];
        rd->offset = r[1];
        rd->length = r[2];
        rd->need = r[3];
        rd->dest = (char *)(uintptr_t)r[4];
        if (r[5] != task) {
            task = (int32_t)r[5];
            sdq_batch_set_task(b, task, (int32_t)i, 0, (int32_t)r[6]);
        }
        b->tasks[task].count++;
    }
    return b;
}

static PyObject *Pool_submit(PoolObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"reads", "flags", "keepalive", NULL};
    PyObject *reads, *keepalive = Py_None;
    int flags = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|iO", kwlist, &reads, &flags, &keepalive))
        return NULL;
    if (pool_open(self)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(reads, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    sdq_batch *b = build_batch(&view, flags);
    PyBuffer_Release(&view);
    if (!b) return NULL;
    BatchObject *obj = PyObject_New(BatchObject, &BatchType);
    if (!obj) {
        sdq_batch_free(b);
        return NULL;
    }
    obj->b = b;
    obj->timeout = self->timeout;
    obj->timed_out = 0;
    Py_INCREF(keepalive);
    obj->keepalive = keepalive;
    int err = sdq_pool_submit(self->pool, b);
    if (err) {
        Py_DECREF(obj);
        PyErr_SetString(PyExc_ValueError, "I/O pool is closed");
        return NULL;
    }
    return (PyObject *)obj;
}

static PyObject *Pool_emulate(PoolObject *self, PyObject *args) {
    long long latency_ns;
    double stream_bps, aggregate_bps;
    int depth;
    if (!PyArg_ParseTuple(args, "Lddi", &latency_ns, &stream_bps, &aggregate_bps, &depth))
        return NULL;
    if (pool_open(self)) return NULL;
    if (sdq_pool_emulate(self->pool, (int64_t)latency_ns, stream_bps, aggregate_bps, depth)) {
        PyErr_Format(PyExc_ValueError,
                     "emulate: depth must be 0..%d, latency >= 0 and bandwidths > 0",
                     SDQ_MAX_THREADS);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Pool_emulated(PoolObject *self, PyObject *Py_UNUSED(ignored)) {
    if (pool_open(self)) return NULL;
    int64_t reads, late, over_ns;
    sdq_pool_emulated(self->pool, &reads, &late, &over_ns);
    return Py_BuildValue("LLL", (long long)reads, (long long)late, (long long)over_ns);
}

static PyObject *Pool_enter(PoolObject *self, PyObject *Py_UNUSED(ignored)) {
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *Pool_exit(PoolObject *self, PyObject *Py_UNUSED(args)) {
    pool_close(self);
    Py_RETURN_NONE;
}

static PyMethodDef Pool_methods[] = {
    {"submit", (PyCFunction)(void (*)(void))Pool_submit, METH_VARARGS | METH_KEYWORDS,
     "submit(reads, flags=0, keepalive=None) -> Batch; returns at once"},
    {"close", (PyCFunction)Pool_close, METH_NOARGS,
     "close(): stop the workers; queued reads are canceled"},
    {"emulate", (PyCFunction)Pool_emulate, METH_VARARGS,
     "emulate(latency_ns, stream_bps, aggregate_bps, depth): hold each read until a device of "
     "that model would have finished it (depth 0: off; sdq/paging/device_model.py)"},
    {"emulated", (PyCFunction)Pool_emulated, METH_NOARGS,
     "emulated() -> (reads, late, over_ns): reads run under emulation, those whose bytes "
     "arrived after their emulated finish, and the others' summed lag past it"},
    {"__enter__", (PyCFunction)Pool_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Pool_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyObject *Pool_get_timeout(PoolObject *self, void *Py_UNUSED(c)) {
    return PyFloat_FromDouble(self->timeout);
}

static PyGetSetDef Pool_getset[] = {
    {"timeout", (getter)Pool_get_timeout, NULL, "seconds a wait or close may block (0: none)",
     NULL},
    {"threads", (getter)Pool_get_threads, (setter)Pool_set_threads,
     "number of worker threads (settable: the pool grows or shrinks)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PoolType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sdq._io.Pool",
    .tp_basicsize = sizeof(PoolObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Pool(threads): persistent pthread workers executing batches of preads.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Pool_init,
    .tp_dealloc = (destructor)Pool_dealloc,
    .tp_methods = Pool_methods,
    .tp_getset = Pool_getset,
};

/* ---------------------------------------------------------------- functions */

static PyObject *py_pread_into(PyObject *self, PyObject *args) {
    (void)self;
    int fd;
    long long offset;
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "iLw*", &fd, &offset, &buf)) return NULL;
    sdq_read r = {.fd = fd, .offset = offset, .length = buf.len, .need = buf.len,
                  .dest = buf.buf};
    if (buf.len > 0) {
        Py_BEGIN_ALLOW_THREADS sdq_run_read(&r, 0);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&buf);
    if (r.kind != SDQ_OK) return raise_failure(&r, 0);
    return PyLong_FromLongLong(r.done);
}

static PyObject *py_resident_fraction(PyObject *self, PyObject *args) {
    (void)self;
    int fd;
    long long offset, length;
    if (!PyArg_ParseTuple(args, "iLL", &fd, &offset, &length)) return NULL;
    if (offset < 0 || length < 1) {
        PyErr_SetString(PyExc_ValueError, "offset must be >= 0 and length >= 1");
        return NULL;
    }
    long page = sysconf(_SC_PAGESIZE);
    long long start = offset / page * page;
    size_t span = (size_t)(offset + length - start);
    size_t pages = (span + (size_t)page - 1) / (size_t)page;
    unsigned char *vec = PyMem_Malloc(pages);
    if (!vec) return PyErr_NoMemory();
    int err = 0;
    size_t resident = 0;
    Py_BEGIN_ALLOW_THREADS void *map = mmap(NULL, span, PROT_READ, MAP_SHARED, fd, (off_t)start);
    if (map == MAP_FAILED) {
        err = errno;
    } else {
        if (mincore(map, span, vec) != 0) err = errno;
        else
            for (size_t i = 0; i < pages; i++) resident += vec[i] & 1;
        munmap(map, span);
    }
    Py_END_ALLOW_THREADS PyMem_Free(vec);
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyFloat_FromDouble((double)resident / (double)pages);
}

static PyMethodDef module_methods[] = {
    {"pread_into", py_pread_into, METH_VARARGS,
     "pread_into(fd, offset, buffer) -> bytes read; fills the whole writable buffer "
     "(GIL released); raises IOFailure"},
    {"resident_fraction", py_resident_fraction, METH_VARARGS,
     "resident_fraction(fd, offset, length) -> share of the range's pages in the page cache"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "sdq._io",
    .m_doc = "Native I/O for the expert pager: a pthread pread pool.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__io(void) {
    if (PyType_Ready(&PoolType) < 0 || PyType_Ready(&BatchType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    IOFailure = PyErr_NewExceptionWithDoc(
        "sdq._io.IOFailure",
        "A read failed: attributes fd, offset, length, done, kind, index.", PyExc_OSError, NULL);
    if (!IOFailure || PyModule_AddObjectRef(m, "IOFailure", IOFailure) < 0 ||
        PyModule_AddObjectRef(m, "Pool", (PyObject *)&PoolType) < 0 ||
        PyModule_AddIntConstant(m, "FLAG_DONTNEED", SDQ_FLAG_DONTNEED) < 0 ||
        PyModule_AddIntConstant(m, "FLAG_DIRECT", SDQ_FLAG_DIRECT) < 0 ||
        PyModule_AddIntConstant(m, "FLAG_MERGE", SDQ_FLAG_MERGE) < 0 ||
        PyModule_AddIntConstant(m, "MAX_MERGE", SDQ_MAX_MERGE) < 0 ||
        PyModule_AddIntConstant(m, "DIRECT_ALIGN", SDQ_DIRECT_ALIGN) < 0 ||
        PyModule_AddIntConstant(m, "MAX_THREADS", SDQ_MAX_THREADS) < 0) {
        Py_XDECREF(m);
        return NULL;
    }
    return m;
}
