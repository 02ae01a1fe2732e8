/*
 * sdq._io — native I/O for the expert pager.
 *
 * For now: pread_into(fd, offset, buffer) reads exactly len(buffer) bytes at offset
 * with the GIL released. The thread pool, batches and cache modes build on this.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <string.h>
#include <unistd.h>

static PyObject *py_pread_into(PyObject *self, PyObject *args) {
    (void)self;
    int fd;
    long long offset;
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "iLw*", &fd, &offset, &buf)) return NULL;
    char *dst = buf.buf;
    Py_ssize_t want = buf.len, done = 0;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    while (done < want) {
        ssize_t n = pread(fd, dst + done, (size_t)(want - done), (off_t)(offset + done));
        if (n < 0) {
            if (errno == EINTR) continue;
            err = errno;
            break;
        }
        if (n == 0) break; /* end of file */
        done += n;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    if (err) {
        PyErr_Format(PyExc_OSError, "pread fd %d offset %lld length %zd: %s", fd, offset, want,
                     strerror(err));
        return NULL;
    }
    if (done < want) {
        PyErr_Format(PyExc_EOFError, "short read: fd %d offset %lld wanted %zd got %zd", fd,
                     offset, want, done);
        return NULL;
    }
    return PyLong_FromSsize_t(done);
}

static PyMethodDef methods[] = {
    {"pread_into", py_pread_into, METH_VARARGS,
     "pread_into(fd, offset, buffer) -> bytes read; fills the whole writable buffer."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "sdq._io", NULL, -1, methods};

PyMODINIT_FUNC PyInit__io(void) { return PyModule_Create(&module); }
