/*
 * keyshard.consumer_client._datapath._fastpath: the common case of CoordinatedConsumer's
 * per-record loop, in C.
 *
 * Why C: with a cheap handler the consumer's own per-record work (ordering key, murmur3
 * slot, fetch filter, inline dispatch) cost ~0.9 us in Python against ~0.1 us for a bare
 * `await handler(record)`, so a consumer owning every slot read at 0.64x a bare getmany
 * loop. This module does only what is cheap and certain; every other case goes back to the
 * Python loop (consumer_client/_datapath/dispatch.py `Dispatcher.dispatch_records`), the
 * reference implementation: `run` stops *before* touching any state for a record it does
 * not handle, Python handles that one record, and calls `run` again from the next index.
 *
 * `run` handles a record when all of this holds (else status PYTHON for it):
 *   - offset is an int, headers None or a tuple/list of (str, value) tuples, and the
 *     ordering key (first header named `header` whose value is not None, else record.key)
 *     is exactly `bytes` - anything else needs Python's conversions and errors;
 *   - the filter can decide from the grant table alone (see GrantRow);
 *   - an admitted record's lane key is not in `lanes` (a busy key is queued by Python).
 * The caller checks KeyLanes.can_start_inline() before every call; nothing `run` does can
 * make it false (only queueing, which is Python's, or lane tasks, which cannot run now).
 *
 * An admitted record's handler is called here; a coroutine gets its first step
 * (PyIter_Send). Completed: counted, its load bucket incremented in place, next record.
 * Every record examined for the first time (offset >= demand_upto), owned or not, also
 * counts in the partition's demand buffer: what the coordinator balances a backlog by.
 * Anything else is returned to Python (SUSPENDED / RAISED / AWAITABLE) with the slot and
 * key in an `Outcome`, and KeyLanes.begin turns it into exactly what KeyLanes.dispatch does.
 *
 * The handler is user code and may look at or change the consumer (a handler that awaits
 * `consumer.close()` freezes the grants and reads `progress.cursor` for the final
 * positions). So the cursor is written to `progress` before every handler call, and after
 * a handler completes the grants list is compared by identity with the one the table was
 * built from: replaced -> status CHANGED and Python rebuilds the table.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define SLOT_COUNT 65536
#define LOAD_BUCKET_SHIFT 4
#define LOAD_BUCKET_COUNT (SLOT_COUNT >> LOAD_BUCKET_SHIFT)

enum {
    ST_DONE = 0,      /* every record up to the end of the list was handled */
    ST_PYTHON = 1,    /* record `index` untouched: run the Python loop for it */
    ST_SUSPENDED = 2, /* admitted; coroutine a yielded b at its first await */
    ST_RAISED = 3,    /* admitted; the handler (or its first step) raised a */
    ST_AWAITABLE = 4, /* admitted; the handler returned a, not a coroutine */
    ST_CHANGED = 5,   /* admitted and completed, but the handler replaced the grants */
};

/* One slot range of one grant, as PartitionProgress.grant_for sees it (in grant order,
 * first match wins). `floor` = max(skip_below, start_done_below): at or above it a record
 * is admitted outright; below it Python's accept does the exact start-map lookup. */
typedef struct {
    int64_t start, end, floor, frozen;
} GrantRow;

static PyObject *s_offset, *s_headers, *s_key, *s_value, *s_key_size, *s_value_size, *s_cursor,
    *s_grants, *s_demand_upto;

/* MurmurHash3_x86_32 (Austin Appleby, public domain), byte-for-byte what mmh3.hash
 * computes: the slot numbers must match the coordinator's and Pulsar's. */
static uint32_t
murmur3_32(const uint8_t *data, Py_ssize_t len, uint32_t seed)
{
    const uint32_t c1 = 0xcc9e2d51, c2 = 0x1b873593;
    uint32_t h = seed, k;
    Py_ssize_t nblocks = len / 4, i;

    for (i = 0; i < nblocks; i++) {
        memcpy(&k, data + 4 * i, 4); /* unaligned-safe; little-endian like mmh3 on x86/arm */
        k *= c1;
        k = (k << 15) | (k >> 17);
        k *= c2;
        h ^= k;
        h = (h << 13) | (h >> 19);
        h = h * 5 + 0xe6546b64;
    }
    const uint8_t *tail = data + 4 * nblocks;
    k = 0;
    switch (len & 3) {
    case 3:
        k ^= (uint32_t)tail[2] << 16; /* fall through */
    case 2:
        k ^= (uint32_t)tail[1] << 8; /* fall through */
    case 1:
        k ^= tail[0];
        k *= c1;
        k = (k << 15) | (k >> 17);
        k *= c2;
        h ^= k;
    }
    h ^= (uint32_t)len;
    h ^= h >> 16;
    h *= 0x85ebca6b;
    h ^= h >> 13;
    h *= 0xc2b2ae35;
    h ^= h >> 16;
    return h;
}

static long
slot_of(PyObject *bytes)
{
    uint32_t h = murmur3_32((const uint8_t *)PyBytes_AS_STRING(bytes), PyBytes_GET_SIZE(bytes), 0);
    return (long)((h & 0x7fffffffu) % SLOT_COUNT);
}

/* The ordering key as a new reference to an exact `bytes`, or NULL with no error set when
 * only Python can tell (missing attribute, odd header shapes, non-bytes, no key at all).
 * Mirrors coordinator.hashing.ordering_key; `record.key` is read first as Python does. */
static PyObject *
ordering_key(PyObject *rec, PyObject *header)
{
    PyObject *key = PyObject_GetAttr(rec, s_key);
    if (key == NULL)
        goto python;
    PyObject *headers = PyObject_GetAttr(rec, s_headers);
    if (headers == NULL) {
        Py_DECREF(key);
        goto python;
    }
    PyObject *found = NULL;
    int odd = 0;
    if (headers != Py_None) {
        if (!PyTuple_CheckExact(headers) && !PyList_CheckExact(headers)) {
            odd = 1;
        }
        else {
            /* Only tuples and lists are read here, so no user code runs while iterating. */
            Py_ssize_t n = PySequence_Fast_GET_SIZE(headers);
            PyObject **items = PySequence_Fast_ITEMS(headers);
            for (Py_ssize_t j = 0; j < n; j++) {
                PyObject *pair = items[j];
                if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) {
                    odd = 1;
                    break;
                }
                PyObject *name = PyTuple_GET_ITEM(pair, 0), *value = PyTuple_GET_ITEM(pair, 1);
                if (!PyUnicode_CheckExact(name)) { /* its __eq__ could be anything */
                    odd = 1;
                    break;
                }
                if (value == Py_None || PyUnicode_Compare(name, header) != 0)
                    continue;
                if (!PyBytes_CheckExact(value)) { /* Python converts with bytes(value) */
                    odd = 1;
                    break;
                }
                found = value;
                break;
            }
        }
    }
    if (!odd) {
        PyObject *okey = found != NULL ? found : key;
        if (PyBytes_CheckExact(okey)) { /* None (unkeyed) and str keys go to Python */
            Py_INCREF(okey);
            Py_DECREF(headers);
            Py_DECREF(key);
            return okey;
        }
    }
    Py_DECREF(headers);
    Py_DECREF(key);
python:
    PyErr_Clear();
    return NULL;
}

/* The record's offset, or -1 when only Python can tell (not an int, out of range). */
static int64_t
record_offset(PyObject *rec)
{
    PyObject *obj = PyObject_GetAttr(rec, s_offset);
    if (obj == NULL) {
        PyErr_Clear();
        return -1;
    }
    int64_t offset = -1;
    if (PyLong_CheckExact(obj)) {
        offset = PyLong_AsLongLong(obj);
        if (offset < 0) { /* negative or overflow: not a Kafka offset, Python decides */
            PyErr_Clear();
            offset = -1;
        }
    }
    Py_DECREF(obj);
    return offset;
}

static int
set_offset(PyObject *progress, PyObject *name, int64_t offset)
{
    PyObject *value = PyLong_FromLongLong(offset);
    if (value == NULL)
        return -1;
    int rc = PyObject_SetAttr(progress, name, value);
    Py_DECREF(value);
    return rc;
}

static int
set_cursor(PyObject *progress, int64_t cursor)
{
    return set_offset(progress, s_cursor, cursor);
}

/* The exception being raised, normalized with its traceback, as a new reference. */
static PyObject *
take_exception(void)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
}

PyDoc_STRVAR(run_doc,
"run(records, start, progress, grants, cursor, table, header, lanes, handler, load,\n"
"    demand, demand_from)\n"
"-> Outcome\n\n"
"Dispatch records[start:] of one partition until the end (DONE) or the first record\n"
"Python must see (`at`). `table`: int64 buffer of GrantRow quads built from `grants`;\n"
"`lanes`: the busy keys (a dict, membership only); `load`: writable int64 buffer of the\n"
"load buckets (completions); `demand`: the same, for every record examined at or above\n"
"`demand_from`, owned or not. Writes progress.cursor and progress.demand_upto.");

/* What `run` returns: a struct sequence, one meaning per field whatever the status. */
static PyTypeObject *OutcomeType;

static PyStructSequence_Field outcome_fields[] = {
    {"status", "DONE, PYTHON, SUSPENDED, RAISED, AWAITABLE or CHANGED"},
    {"at", "index of the record the status is about (len(records) when DONE)"},
    {"admitted", "records admitted by the fetch filter in this call"},
    {"processed", "handlers that completed in this call"},
    {"slot", "the slot of record `index` (SUSPENDED, RAISED, AWAITABLE)"},
    {"key", "the ordering key of record `index` (SUSPENDED, RAISED, AWAITABLE), else None"},
    {"coroutine", "SUSPENDED: the handler's coroutine, its first step taken, else None"},
    {"yielded", "SUSPENDED: what that first step yielded, else None"},
    {"error", "RAISED: what the handler or its first step raised, else None"},
    {"awaitable", "AWAITABLE: what the handler returned instead of a coroutine, else None"},
    {NULL, NULL},
};

static PyStructSequence_Desc outcome_desc = {
    "keyshard.consumer_client._datapath._fastpath.Outcome",
    "The outcome of one `run` call.",
    outcome_fields,
    10,
};

/* Field i of `outcome` := value (a new reference, or NULL: None). Steals the reference. */
static void
set_field(PyObject *outcome, Py_ssize_t i, PyObject *value)
{
    if (value == NULL) {
        value = Py_None;
        Py_INCREF(value);
    }
    PyStructSequence_SetItem(outcome, i, value);
}

static PyObject *
new_outcome(int status, Py_ssize_t index, Py_ssize_t admitted, Py_ssize_t processed, long slot,
            PyObject *key, PyObject *a, PyObject *b)
{
    PyObject *ints[5] = {PyLong_FromLong(status), PyLong_FromSsize_t(index),
                         PyLong_FromSsize_t(admitted), PyLong_FromSsize_t(processed),
                         PyLong_FromLong(slot)};
    PyObject *outcome = PyStructSequence_New(OutcomeType);
    int failed = outcome == NULL;
    for (int i = 0; i < 5; i++) {
        if (ints[i] == NULL)
            failed = 1;
    }
    if (failed) {
        for (int i = 0; i < 5; i++)
            Py_XDECREF(ints[i]);
        Py_XDECREF(outcome);
        return NULL;
    }
    for (int i = 0; i < 5; i++)
        set_field(outcome, i, ints[i]);
    /* `a` and `b` mean one thing per status: each goes to the field named for it. */
    PyObject *coroutine = NULL, *yielded = NULL, *error = NULL, *awaitable = NULL;
    if (status == ST_SUSPENDED) {
        coroutine = a;
        yielded = b;
    }
    else if (status == ST_RAISED) {
        error = a;
    }
    else if (status == ST_AWAITABLE) {
        awaitable = a;
    }
    Py_XINCREF(key);
    Py_XINCREF(coroutine);
    Py_XINCREF(yielded);
    Py_XINCREF(error);
    Py_XINCREF(awaitable);
    set_field(outcome, 5, key);
    set_field(outcome, 6, coroutine);
    set_field(outcome, 7, yielded);
    set_field(outcome, 8, error);
    set_field(outcome, 9, awaitable);
    return outcome;
}

static PyObject *
run(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "run() takes exactly 12 arguments");
        return NULL;
    }
    PyObject *records = args[0], *progress = args[2], *grants = args[3], *header = args[6],
             *lanes = args[7], *handler = args[8];
    if (!PyList_Check(records) || !PyUnicode_Check(header) || !PyDict_Check(lanes)) {
        PyErr_SetString(PyExc_TypeError, "run(): records must be a list, header a str, lanes a dict");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    int64_t cursor = PyLong_AsLongLong(args[4]);
    int64_t demand_from = PyLong_AsLongLong(args[11]), demand_upto = demand_from;
    if (PyErr_Occurred())
        return NULL;
    if (start < 0) {
        PyErr_SetString(PyExc_ValueError, "run(): start must be >= 0");
        return NULL;
    }

    Py_buffer table, load, demand;
    if (PyObject_GetBuffer(args[5], &table, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[9], &load, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&table);
        return NULL;
    }
    if (PyObject_GetBuffer(args[10], &demand, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&table);
        PyBuffer_Release(&load);
        return NULL;
    }
    PyObject *result = NULL;
    if (table.len % sizeof(GrantRow) != 0 || load.len != LOAD_BUCKET_COUNT * 8 ||
        demand.len != LOAD_BUCKET_COUNT * 8) {
        PyErr_SetString(PyExc_ValueError, "run(): bad table, load or demand buffer size");
        goto out;
    }
    /* The buffers are held for the whole call, so a handler cannot resize them. */
    const GrantRow *rows = (const GrantRow *)table.buf;
    Py_ssize_t nrows = table.len / (Py_ssize_t)sizeof(GrantRow), hit = 0;
    int64_t *buckets = (int64_t *)load.buf, *seen = (int64_t *)demand.buf;
    Py_ssize_t end = PyList_GET_SIZE(records), i, admitted = 0, processed = 0;
    int status = ST_DONE, dirty = 0; /* dirty: cursor advanced since it was last written */
    long slot = 0;
    PyObject *rec = NULL, *okey = NULL, *a = NULL, *b = NULL;

    for (i = start; i < end; i++) {
        /* A handler may have shrunk the list: Python's loop raises IndexError there. */
        if (i >= PyList_GET_SIZE(records)) {
            status = ST_PYTHON;
            break;
        }
        rec = PyList_GET_ITEM(records, i);
        Py_INCREF(rec); /* the handler may drop it from the list */
        int64_t offset = record_offset(rec);
        okey = offset < 0 ? NULL : ordering_key(rec, header);
        if (okey == NULL) {
            Py_CLEAR(rec);
            status = ST_PYTHON;
            break;
        }
        slot = slot_of(okey);
        if (offset < cursor) { /* fetched again after a rewind: already examined */
            Py_CLEAR(okey);
            Py_CLEAR(rec);
            continue;
        }
        const GrantRow *row = NULL;
        if (hit < nrows && rows[hit].start <= slot && slot <= rows[hit].end) {
            row = &rows[hit];
        }
        else {
            for (Py_ssize_t r = 0; r < nrows; r++) {
                if (rows[r].start <= slot && slot <= rows[r].end) {
                    row = &rows[hit = r];
                    break;
                }
            }
        }
        int admit = row != NULL && !row->frozen;
        int busy = admit ? PyDict_Contains(lanes, okey) : 0; /* bytes: no user code */
        if (busy < 0)
            goto error;
        if ((admit && offset < row->floor) || busy) {
            /* Skipped below skip_below, or done in the start map, or queued behind its
             * key: Python decides, from the cursor as it was before this record. */
            Py_CLEAR(okey);
            Py_CLEAR(rec);
            status = ST_PYTHON;
            break;
        }
        cursor = offset + 1;
        if (offset >= demand_upto) { /* first examined: demand (once per offset) */
            seen[slot >> LOAD_BUCKET_SHIFT]++;
            demand_upto = offset + 1;
        }
        if (!admit) { /* not ours (or frozen by StopFetcher): skipped */
            dirty = 1;
            Py_CLEAR(okey);
            Py_CLEAR(rec);
            continue;
        }
        admitted++;
        if (set_cursor(progress, cursor) < 0)
            goto error;
        dirty = 0;
        PyObject *started = PyObject_CallOneArg(handler, rec);
        if (started == NULL) {
            a = take_exception();
            status = ST_RAISED;
        }
        else if (!PyCoro_CheckExact(started)) {
            a = started;
            status = ST_AWAITABLE;
        }
        else {
            PyObject *yielded = NULL;
            switch (PyIter_Send(started, Py_None, &yielded)) {
            case PYGEN_RETURN:
                Py_DECREF(yielded);
                Py_DECREF(started);
                processed++;
                buckets[slot >> LOAD_BUCKET_SHIFT]++;
                break;
            case PYGEN_NEXT:
                a = started;
                b = yielded;
                status = ST_SUSPENDED;
                break;
            default: /* PYGEN_ERROR */
                Py_DECREF(started);
                a = take_exception();
                status = ST_RAISED;
            }
        }
        Py_CLEAR(rec);
        if (status != ST_DONE)
            break;
        PyObject *now = PyObject_GetAttr(progress, s_grants);
        if (now == NULL)
            goto error;
        Py_DECREF(now); /* only its identity matters; progress still holds it */
        if (now != grants) {
            status = ST_CHANGED;
            break;
        }
        Py_CLEAR(okey);
    }
    /* Records skipped since the last handler call moved the cursor; no user code has run
     * since, so nothing else can have changed it. */
    if (dirty && set_cursor(progress, cursor) < 0)
        goto error;
    /* Written here, not derived from the cursor afterwards: a handler may rewind it. */
    if (demand_upto != demand_from && set_offset(progress, s_demand_upto, demand_upto) < 0)
        goto error;
    if (status == ST_DONE)
        i = end;
    result = new_outcome(status, i, admitted, processed, slot, okey, a, b);
    Py_XDECREF(okey);
    Py_XDECREF(a);
    Py_XDECREF(b);
    goto out;

error:
    Py_XDECREF(rec);
    Py_XDECREF(okey);
    Py_XDECREF(a);
    Py_XDECREF(b);
out:
    PyBuffer_Release(&table);
    PyBuffer_Release(&load);
    PyBuffer_Release(&demand);
    return result;
}

/* len(data), 0 for None: a key, value or header value in the budget's count. */
static Py_ssize_t
data_length(PyObject *data)
{
    if (data == Py_None)
        return 0;
    if (PyBytes_CheckExact(data))
        return PyBytes_GET_SIZE(data);
    return PyObject_Size(data);
}

/* A key's or a value's bytes: the serialized size aiokafka recorded as it decoded the
 * record (-1: none), an int that stays right whatever a deserializer made of the data;
 * the data's own length for a record made elsewhere. -1 with an exception set on error. */
static Py_ssize_t
part_bytes(PyObject *rec, PyObject *size_name, PyObject *data_name)
{
    PyObject *attr = PyObject_GetAttr(rec, size_name);
    if (attr == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
    } else if (PyLong_CheckExact(attr)) {
        Py_ssize_t n = PyLong_AsSsize_t(attr);
        Py_DECREF(attr);
        if (n == -1 && PyErr_Occurred())
            return -1;
        return n < 0 ? 0 : n;
    } else {
        Py_DECREF(attr);
    }
    if ((attr = PyObject_GetAttr(rec, data_name)) == NULL)
        return -1;
    Py_ssize_t n = data_length(attr);
    Py_DECREF(attr);
    return n;
}

/* What a record weighs in the memory budget, exactly as budget.record_size counts it:
 * key + value + header names and values. -1 with an exception set on error. By
 * attribute: on Python 3.11+ a record's fields live inline, and asking for its __dict__
 * would build one per record. */
static Py_ssize_t
record_bytes(PyObject *rec)
{
    Py_ssize_t size = part_bytes(rec, s_key_size, s_key), part;
    if (size < 0)
        return -1;
    part = part_bytes(rec, s_value_size, s_value);
    PyObject *attr;
    if (part < 0 || (attr = PyObject_GetAttr(rec, s_headers)) == NULL)
        return -1;
    size += part;
    int truth = PyObject_IsTrue(attr);
    if (truth <= 0) { /* None or empty: no headers (or an error, passed on) */
        Py_DECREF(attr);
        return truth < 0 ? -1 : size;
    }
    PyObject *headers = PySequence_Fast(attr, "record headers must be a sequence");
    Py_DECREF(attr);
    if (headers == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(headers);
    for (Py_ssize_t i = 0; i < n && size >= 0; i++) {
        PyObject *pair = PySequence_Fast(PySequence_Fast_GET_ITEM(headers, i),
                                         "a record header must be a (name, value) pair");
        if (pair == NULL || PySequence_Fast_GET_SIZE(pair) != 2) {
            if (pair != NULL)
                PyErr_SetString(PyExc_ValueError, "a record header must be a (name, value) pair");
            Py_XDECREF(pair);
            size = -1;
            break;
        }
        Py_ssize_t name = PyObject_Size(PySequence_Fast_GET_ITEM(pair, 0));
        Py_ssize_t value = name < 0 ? -1 : data_length(PySequence_Fast_GET_ITEM(pair, 1));
        Py_DECREF(pair);
        size = value < 0 ? -1 : size + name + value;
    }
    Py_DECREF(headers);
    return size;
}

PyDoc_STRVAR(take_doc,
"take(records, room) -> (count, bytes, largest): budget.take in C. Records are taken\n"
"while the bytes taken before each are below `room`; their count, total bytes and the\n"
"largest one's bytes.");

static PyObject *
take(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "take(records, room) takes 2 arguments");
        return NULL;
    }
    Py_ssize_t room = PyNumber_AsSsize_t(args[1], PyExc_OverflowError);
    if (room == -1 && PyErr_Occurred())
        return NULL;
    PyObject *records = PySequence_Fast(args[0], "take() needs a sequence of records");
    if (records == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(records), count = 0, taken = 0, largest = 0;
    for (; count < n && taken < room; count++) {
        Py_ssize_t size = record_bytes(PySequence_Fast_GET_ITEM(records, count));
        if (size < 0) {
            Py_DECREF(records);
            return NULL;
        }
        taken += size;
        if (size > largest)
            largest = size;
    }
    Py_DECREF(records);
    return Py_BuildValue("nnn", count, taken, largest);
}

static PyObject *
hash(PyObject *module, PyObject *arg)
{
    if (!PyBytes_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "hash() needs bytes, not %.100s", Py_TYPE(arg)->tp_name);
        return NULL;
    }
    return PyLong_FromUnsignedLong(
        murmur3_32((const uint8_t *)PyBytes_AS_STRING(arg), PyBytes_GET_SIZE(arg), 0));
}

static PyMethodDef methods[] = {
    {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL, run_doc},
    {"take", (PyCFunction)(void (*)(void))take, METH_FASTCALL, take_doc},
    {"hash", hash, METH_O, "murmur3_32(data, seed=0), unsigned: mmh3.hash(data, 0, signed=False)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "keyshard.consumer_client._datapath._fastpath",
    "C fast path of CoordinatedConsumer's per-record loop (see _fastpath.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__fastpath(void)
{
    if (!(s_offset = PyUnicode_InternFromString("offset")) ||
        !(s_headers = PyUnicode_InternFromString("headers")) ||
        !(s_key = PyUnicode_InternFromString("key")) ||
        !(s_value = PyUnicode_InternFromString("value")) ||
        !(s_key_size = PyUnicode_InternFromString("serialized_key_size")) ||
        !(s_value_size = PyUnicode_InternFromString("serialized_value_size")) ||
        !(s_cursor = PyUnicode_InternFromString("cursor")) ||
        !(s_grants = PyUnicode_InternFromString("grants")) ||
        !(s_demand_upto = PyUnicode_InternFromString("demand_upto")))
        return NULL;
    if (OutcomeType == NULL && !(OutcomeType = PyStructSequence_NewType(&outcome_desc)))
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    Py_INCREF(OutcomeType);
    if (PyModule_AddObject(m, "Outcome", (PyObject *)OutcomeType) < 0) {
        Py_DECREF(OutcomeType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "DONE", ST_DONE) < 0 ||
        PyModule_AddIntConstant(m, "PYTHON", ST_PYTHON) < 0 ||
        PyModule_AddIntConstant(m, "SUSPENDED", ST_SUSPENDED) < 0 ||
        PyModule_AddIntConstant(m, "RAISED", ST_RAISED) < 0 ||
        PyModule_AddIntConstant(m, "AWAITABLE", ST_AWAITABLE) < 0 ||
        PyModule_AddIntConstant(m, "CHANGED", ST_CHANGED) < 0 ||
        PyModule_AddIntConstant(m, "LOAD_BUCKET_COUNT", LOAD_BUCKET_COUNT) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
