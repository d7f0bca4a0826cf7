/* Direct reads of msgspec Struct fields, for the compiled kernel.
 *
 * A Struct's field is a slot: a member descriptor on its class, with the object's value at a
 * fixed offset. Cython reads `obj.field` through PyObject_GetAttr (type look-up, descriptor,
 * PyMember_GetOne): ~25 ns, and mapping one trace message reads ~40 fields. Here the offset
 * is found once (`nats_otel_field_offset`, when the kernel is imported) and each read is a load.
 *
 * Only for objects whose type the caller has checked to be the class the offset was taken
 * from (or a subclass: a slot keeps its offset in subclasses). */
#ifndef NATS_OTEL_FIELDS_H
#define NATS_OTEL_FIELDS_H

#include <Python.h>
#include <structmember.h>

/* The offset of `cls`'s field `name`, or -1 with an exception set when it is not an object
 * slot (then the caller keeps the Python twin). */
static Py_ssize_t nats_otel_field_offset(PyObject *cls, PyObject *name) {
    PyObject *descr = PyObject_GetAttr(cls, name);
    Py_ssize_t offset = -1;
    if (descr == NULL) return -1;
    if (Py_TYPE(descr) == &PyMemberDescr_Type && ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX) {
        offset = ((PyMemberDescrObject *)descr)->d_member->offset;
    } else {
        PyErr_Format(PyExc_TypeError, "%R.%U is not an object slot", cls, name);
    }
    Py_DECREF(descr);
    return offset;
}

/* `obj`'s field at `offset` (a new reference), or NULL with AttributeError when unset, as
 * the attribute read would. */
static inline PyObject *nats_otel_field(PyObject *obj, Py_ssize_t offset) {
    PyObject *value = *(PyObject **)((char *)obj + offset);
    if (value == NULL) {
        PyErr_Format(PyExc_AttributeError, "a field of %R is not set", (PyObject *)Py_TYPE(obj));
        return NULL;
    }
    Py_INCREF(value);
    return value;
}

/* Replace `obj`'s field at `offset` with `value`: only for a record the caller has just made
 * (the kernel's parse, `_stage_parse.pxi`, fills a copy of a template), never one another
 * holder may have seen: frozen records are frozen to everyone else. */
static inline void nats_otel_set_field(PyObject *obj, Py_ssize_t offset, PyObject *value) {
    PyObject **slot = (PyObject **)((char *)obj + offset);
    PyObject *old = *slot;
    Py_INCREF(value);
    *slot = value;
    Py_XDECREF(old);
}

/* `tuple.__new__(cls, (items[0], ..., items[n-1]))` for a NamedTuple class `cls` and `n`
 * objects at `items` (borrowed): what CPython's tuple_subtype_new does (the class's own
 * allocation, the values' references), without calling `tuple.__new__` as a Python callable
 * (a type call, its argument parsing and checks: ~4x the allocation) and without a tuple of
 * the values made, copied and freed (the kernel makes ~5 such records a trace message).
 * `n` is the class's field count (`_records.pxi` checks the fields at import). */
static inline PyObject *nats_otel_record_n(PyObject *cls, Py_ssize_t n, PyObject *const *items) {
    PyObject *obj = ((PyTypeObject *)cls)->tp_alloc((PyTypeObject *)cls, n);
    if (obj == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_INCREF(items[i]);
        PyTuple_SET_ITEM(obj, i, items[i]);
    }
    return obj;
}

/* A new object of the msgspec Struct class `cls`, every field unset (NULL): what msgspec's
 * constructor and its `__copy__` allocate first (`Struct_alloc`: the class's own tp_alloc),
 * without calling the class as a Python callable (its argument handling and defaults: ~5x
 * the allocation, and the kernel makes several such records per trace message). The caller
 * sets every field (`nats_otel_set_field`) before anyone else sees it: only for the classes
 * `_records.pxi` checks are plain (no GC, no `__post_init__`, nothing but their fields'
 * slots). */
static inline PyObject *nats_otel_struct_new(PyObject *cls) {
    PyTypeObject *type = (PyTypeObject *)cls;
    return type->tp_alloc(type, type->tp_itemsize);
}

/* msgspec's `Struct.__copy__` of `obj` (a copy of each slot, no hook), without the method
 * call: only for the classes `_records.pxi` checks hold nothing but their fields' slots and
 * are not tracked by the GC (what msgspec's copy does beyond this is about tracking). */
static inline PyObject *nats_otel_struct_copy(PyObject *obj) {
    PyTypeObject *type = Py_TYPE(obj);
    PyObject *out = type->tp_alloc(type, type->tp_itemsize);
    if (out == NULL) return NULL;
    for (Py_ssize_t at = sizeof(PyObject); at < type->tp_basicsize; at += sizeof(PyObject *)) {
        PyObject *value = *(PyObject **)((char *)obj + at);
        Py_XINCREF(value);
        *(PyObject **)((char *)out + at) = value;
    }
    return out;
}

#endif
