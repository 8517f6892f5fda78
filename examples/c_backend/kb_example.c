/* An example kernel library of the C ABI of conformance/backends/kernels_backend.h: transpose (every
 * dtype: it moves bytes), softmax and element_binary (float32 and float64), forward and backward, on
 * the CPU. It honours the strides it is given, so the red zones' margins apply.
 *
 *     cc -O2 -shared -fPIC -I conformance/backends examples/c_backend/kb_example.c -o libkb_example.so -lm
 *     python -m conformance --backend c:./libkb_example.so --device cpu
 *
 * Deliberately broken builds, which the conformance run must fail:
 *     -DBREAK_TRANSPOSE   the forward copies the elements in order, as if every permutation were the
 *                         identity (it stays inside the tensors: a wrong stride that reads past them
 *                         could crash, as CRASH_SOFTMAX does below)
 *     -DBREAK_SOFTMAX     the forward does not subtract the row's maximum and takes exp in float
 *                         (a naive softmax: it overflows from inputs of 89 on)
 * and one that crashes, which the run (in its worker processes) must report as failed cases:
 *     -DCRASH_SOFTMAX     the forward writes through a null pointer where a finite input's magnitude
 *                         reaches 1000 (a SIGSEGV in softmax/stable_pm1000 and stable_pm1000_dim0)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_backend.h"

#define MAX_DIMS 8

int kb_abi_version(void) { return KB_ABI_VERSION; }

static int fail(const kb_call *call, int status, const char *message) {
    if (call->error && call->error_size) snprintf(call->error, call->error_size, "%s", message);
    return status;
}

/* The number after "key": in a flat JSON object (the attrs), or `otherwise`. */
static long json_int(const char *json, const char *key, long otherwise) {
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    const char *at = strstr(json, pattern);
    return at ? strtol(at + strlen(pattern), NULL, 10) : otherwise;
}

/* The list of integers after "key": into out (at most MAX_DIMS); their count, or -1. */
static int json_ints(const char *json, const char *key, long *out) {
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    const char *at = strstr(json, pattern);
    if (!at || !(at = strchr(at, '['))) return -1;
    int count = 0;
    for (char *end; *at != ']' && count < MAX_DIMS; at = end) {
        long value = strtol(at + 1, &end, 10);
        if (end == at + 1) break;
        out[count++] = value;
        while (*end == ' ') end++;
    }
    return count;
}

/* Whether the string after "key": is `value`. */
static int json_is(const char *json, const char *key, const char *value) {
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\": \"%s\"", key, value);
    return strstr(json, pattern) != NULL;
}

static const kb_tensor *arg(const kb_call *call, const char *name) {
    for (int i = 0; i < call->nargs; i++)
        if (strcmp(call->args[i].name, name) == 0) return call->args[i].tensors;
    return NULL;
}

static size_t itemsize(int dtype) {
    static const size_t sizes[] = {1, 1, 1, 2, 2, 4, 4, 8, 8, 2, 2, 4, 8, 8, 16};
    return sizes[dtype];
}

static long long count_of(const kb_tensor *t) {
    long long n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

/* The element offset of flat (C-order) index `flat` of `shape` in a tensor of `strides`. */
static long long offset_of(long long flat, int ndim, const int64_t *shape, const int64_t *strides) {
    long long offset = 0;
    for (int d = ndim - 1; d >= 0; d--) {
        offset += (flat % shape[d]) * strides[d];
        flat /= shape[d];
    }
    return offset;
}

static long double load(const kb_tensor *t, long long offset) {
    return t->dtype == KB_FLOAT32 ? ((const float *)t->data)[offset] : ((const double *)t->data)[offset];
}

static void store(const kb_tensor *t, long long offset, long double value) {
    if (t->dtype == KB_FLOAT32) ((float *)t->data)[offset] = (float)value;
    else ((double *)t->data)[offset] = (double)value;
}

static int floats_only(const kb_call *call, const kb_tensor *t) {
    if (call->device >= 0) return fail(call, KB_UNSUPPORTED, "the example runs on the CPU only");
    if (t->dtype != KB_FLOAT32 && t->dtype != KB_FLOAT64)
        return fail(call, KB_UNSUPPORTED, "the example takes float32 and float64 only");
    return KB_OK;
}

/* ------------------------------------------------------------------------------------- transpose */

/* to[o] = from[o permuted]: for each element of `out_shape` (the output's), `from` at the permuted
 * strides and `to` at its own; the backward swaps the roles of the strides. */
static void permute_copy(const kb_tensor *from, const int64_t *from_strides, const kb_tensor *to,
                         const int64_t *to_strides, const int64_t *out_shape, int ndim) {
    size_t size = itemsize(to->dtype);
    long long n = 1;
    for (int d = 0; d < ndim; d++) n *= out_shape[d];
    for (long long i = 0; i < n; i++) {
        long long src = offset_of(i, ndim, out_shape, from_strides);
        long long dst = offset_of(i, ndim, out_shape, to_strides);
        memcpy((char *)to->data + dst * size, (const char *)from->data + src * size, size);
    }
}

static int transpose(const kb_call *call, int backward) {
    if (call->device >= 0) return fail(call, KB_UNSUPPORTED, "the example runs on the CPU only");
    long perm[MAX_DIMS];
    const kb_tensor *input = arg(call, "input"), *output = arg(call, "output");
    int ndim = json_ints(call->attrs, "permutation", perm);
    if (ndim != input->ndim) return fail(call, KB_ERROR, "permutation does not match the input's rank");
    int64_t permuted[MAX_DIMS];
    if (!backward) {
#ifdef BREAK_TRANSPOSE
        size_t size = itemsize(input->dtype);
        for (long long i = 0, n = count_of(input); i < n; i++)
            memcpy((char *)output->data + offset_of(i, ndim, output->shape, output->strides) * size,
                   (const char *)input->data + offset_of(i, ndim, input->shape, input->strides) * size, size);
        return KB_OK;
#endif
        for (int d = 0; d < ndim; d++) permuted[d] = input->strides[(perm[d] + ndim) % ndim];
        permute_copy(input, permuted, output, output->strides, output->shape, ndim);
        return KB_OK;
    }
    const kb_tensor *output_grad = arg(call, "output_grad"), *input_grad = arg(call, "input_grad");
    if (!input_grad || !input_grad->data) return KB_OK;
    for (int d = 0; d < ndim; d++) permuted[d] = input_grad->strides[(perm[d] + ndim) % ndim];
    permute_copy(output_grad, output_grad->strides, input_grad, permuted, output_grad->shape, ndim);
    return KB_OK;
}

int kb_transpose_forward(const kb_call *call) { return transpose(call, 0); }
int kb_transpose_backward(const kb_call *call) { return transpose(call, 1); }

/* --------------------------------------------------------------------------------------- softmax */

/* The rows along `dim`: row r's first element and the step between its elements, per tensor. */
typedef struct rows {
    long long count, length, outer, inner;
} rows;

static rows rows_of(const kb_tensor *t, int dim) {
    rows r = {0, t->shape[dim], 1, 1};
    for (int d = 0; d < dim; d++) r.outer *= t->shape[d];
    for (int d = dim + 1; d < t->ndim; d++) r.inner *= t->shape[d];
    r.count = r.outer * r.inner;
    return r;
}

/* Element k of row `row` of `t`, as an offset (the row's other dims walked through its strides). */
static long long row_offset(const kb_tensor *t, int dim, long long row, long long k) {
    int64_t shape[MAX_DIMS];
    int64_t strides[MAX_DIMS];
    int n = 0;
    for (int d = 0; d < t->ndim; d++)
        if (d != dim) shape[n] = t->shape[d], strides[n++] = t->strides[d];
    return offset_of(row, n, shape, strides) + k * t->strides[dim];
}

static int softmax_forward(const kb_call *call) {
    const kb_tensor *x = arg(call, "input"), *y = arg(call, "output");
    int status = floats_only(call, x);
    if (status != KB_OK) return status;
    int dim = (int)((json_int(call->attrs, "dim", -1) + x->ndim) % x->ndim);
    rows r = rows_of(x, dim);
#ifdef CRASH_SOFTMAX
    static float *volatile nowhere; /* NULL, and volatile: the compiler must really store through it */
    for (long long i = 0, n = count_of(x); i < n; i++) {
        long double v = load(x, offset_of(i, x->ndim, x->shape, x->strides));
        if (isfinite(v) && fabsl(v) >= 1000) *nowhere = 0;
    }
#endif
    for (long long row = 0; row < r.count; row++) {
        long double top = -INFINITY, sum = 0;
#ifndef BREAK_SOFTMAX
        for (long long k = 0; k < r.length; k++) {
            long double v = load(x, row_offset(x, dim, row, k));
            if (v > top || isnan(v)) top = v;
        }
#define EXP(v) expl(v)
#else
        top = 0;
#define EXP(v) expf((float)(v))
#endif
        for (long long k = 0; k < r.length; k++) sum += EXP(load(x, row_offset(x, dim, row, k)) - top);
        for (long long k = 0; k < r.length; k++)
            store(y, row_offset(y, dim, row, k), EXP(load(x, row_offset(x, dim, row, k)) - top) / sum);
    }
    return KB_OK;
}

/* input_grad = y (g - sum(g y)) along the row, y the forward's output as stored. */
static int softmax_backward(const kb_call *call) {
    const kb_tensor *y = arg(call, "output"), *g = arg(call, "output_grad"), *dx = arg(call, "input_grad");
    int status = floats_only(call, y);
    if (status != KB_OK || !dx || !dx->data) return status;
    int dim = (int)((json_int(call->attrs, "dim", -1) + y->ndim) % y->ndim);
    rows r = rows_of(y, dim);
    for (long long row = 0; row < r.count; row++) {
        long double dot = 0;
        for (long long k = 0; k < r.length; k++)
            dot += load(g, row_offset(g, dim, row, k)) * load(y, row_offset(y, dim, row, k));
        for (long long k = 0; k < r.length; k++) {
            long double yk = load(y, row_offset(y, dim, row, k));
            store(dx, row_offset(dx, dim, row, k), yk * (load(g, row_offset(g, dim, row, k)) - dot));
        }
    }
    return KB_OK;
}

int kb_softmax_forward(const kb_call *call) { return softmax_forward(call); }
int kb_softmax_backward(const kb_call *call) { return softmax_backward(call); }

/* -------------------------------------------------------------------------------- element_binary */

enum { ADD, SUB, MUL, DIV, MAX, MIN, UNKNOWN };

static int binary_op(const char *attrs) {
    static const char *names[] = {"ADD", "SUB", "MUL", "DIV", "MAX", "MIN"};
    for (int op = ADD; op < UNKNOWN; op++)
        if (json_is(attrs, "op_type", names[op])) return op;
    return UNKNOWN;
}

/* The offset in `t` (broadcast against the output's shape, aligned on the right) of output element i. */
static long long broadcast_offset(const kb_tensor *t, const kb_tensor *out, long long i) {
    long long offset = 0;
    for (int d = out->ndim - 1, e = t->ndim - 1; d >= 0; d--, e--) {
        long long index = i % out->shape[d];
        i /= out->shape[d];
        if (e >= 0 && t->shape[e] != 1) offset += index * t->strides[e];
    }
    return offset;
}

/* The flat (C-order) index in `t` of output element i, for the gradients' sums. */
static long long broadcast_flat(const kb_tensor *t, const kb_tensor *out, long long i) {
    long long flat = 0, step = 1;
    for (int d = out->ndim - 1, e = t->ndim - 1; d >= 0; d--, e--) {
        long long index = i % out->shape[d];
        i /= out->shape[d];
        if (e >= 0) {
            if (t->shape[e] != 1) flat += index * step;
            step *= t->shape[e];
        }
    }
    return flat;
}

static long double apply(int op, long double a, long double b) {
    switch (op) {
    case ADD: return a + b;
    case SUB: return a - b;
    case MUL: return a * b;
    case DIV: return a / b;
    case MAX: return isnan(a) || isnan(b) ? NAN : (a > b ? a : b);
    default: return isnan(a) || isnan(b) ? NAN : (a < b ? a : b);
    }
}

static int binary_forward(const kb_call *call) {
    const kb_tensor *a = arg(call, "lhs"), *b = arg(call, "rhs"), *out = arg(call, "output");
    int status = floats_only(call, out), op = binary_op(call->attrs);
    if (status != KB_OK) return status;
    if (op == UNKNOWN) return fail(call, KB_UNSUPPORTED, "an op_type the example does not know");
    for (long long i = 0, n = count_of(out); i < n; i++)
        store(out, offset_of(i, out->ndim, out->shape, out->strides),
              apply(op, load(a, broadcast_offset(a, out, i)), load(b, broadcast_offset(b, out, i))));
    return KB_OK;
}

/* d(a op b)/da times g, and d/db times g, as PyTorch defines them (a tie of MAX or MIN halves g). */
static void partials(int op, long double a, long double b, long double g, long double *da, long double *db) {
    switch (op) {
    case ADD: *da = g, *db = g; return;
    case SUB: *da = g, *db = -g; return;
    case MUL: *da = g * b, *db = g * a; return;
    case DIV: *da = g / b, *db = -g * a / (b * b); return;
    default: {
        int a_wins = op == MAX ? a > b : a < b, b_wins = op == MAX ? b > a : b < a;
        long double share = a == b ? g / 2 : g;
        *da = b_wins ? 0 : share;
        *db = a_wins ? 0 : share;
    }
    }
}

/* Sum each gradient over the output elements broadcast from it (in long double), then store it. */
static int binary_backward(const kb_call *call) {
    const kb_tensor *g = arg(call, "output_grad"), *a = arg(call, "lhs"), *b = arg(call, "rhs");
    const kb_tensor *da = arg(call, "lhs_grad"), *db = arg(call, "rhs_grad");
    int status = floats_only(call, g), op = binary_op(call->attrs);
    if (status != KB_OK) return status;
    if (op == UNKNOWN) return fail(call, KB_UNSUPPORTED, "an op_type the example does not know");
    long long na = count_of(a), nb = count_of(b);
    long double *sa = calloc(na ? na : 1, sizeof *sa), *sb = calloc(nb ? nb : 1, sizeof *sb);
    if (!sa || !sb) {
        free(sa), free(sb);
        return fail(call, KB_ERROR, "out of memory");
    }
    for (long long i = 0, n = count_of(g); i < n; i++) {
        long double pa, pb;
        partials(op, load(a, broadcast_offset(a, g, i)), load(b, broadcast_offset(b, g, i)),
                 load(g, offset_of(i, g->ndim, g->shape, g->strides)), &pa, &pb);
        sa[broadcast_flat(a, g, i)] += pa;
        sb[broadcast_flat(b, g, i)] += pb;
    }
    for (long long i = 0; da && da->data && i < na; i++) store(da, offset_of(i, da->ndim, da->shape, da->strides), sa[i]);
    for (long long i = 0; db && db->data && i < nb; i++) store(db, offset_of(i, db->ndim, db->shape, db->strides), sb[i]);
    free(sa), free(sb);
    return KB_OK;
}

int kb_element_binary_forward(const kb_call *call) { return binary_forward(call); }
int kb_element_binary_backward(const kb_call *call) { return binary_backward(call); }
