/* kernels_backend.h: the C ABI through which `python -m conformance --backend c:PATH` judges a kernel
 * library written in C, C++ or CUDA (docs/backends.md).
 *
 * A library exports, for each op it implements (the names of kernels.registry: transpose, softmax,
 * element_binary, conv_2d, ...), one function per direction:
 *
 *     int kb_<op>_forward(const kb_call *call);
 *     int kb_<op>_backward(const kb_call *call);
 *
 * and, where it keeps something between the calls of one case (a plan, saved statistics):
 *
 *     int  kb_<op>_init(const kb_call *call, void **state);   (tensors described, data NULL)
 *     void kb_<op>_cleanup(void *state);
 *
 * and once: int kb_abi_version(void), returning KB_ABI_VERSION. An op without kb_<op>_forward is not
 * supported (its cases are skipped, saying so); one without kb_<op>_backward, only its cases that
 * call backward are.
 *
 * Every call returns KB_OK, KB_ERROR (the case fails with the message written to call->error) or
 * KB_UNSUPPORTED (the case is skipped with that message: a dtype, a device, an attribute the library
 * does not take).
 */
#ifndef KERNELS_BACKEND_H
#define KERNELS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KB_ABI_VERSION 1

/* Status codes. */
#define KB_OK 0
#define KB_ERROR 1
#define KB_UNSUPPORTED 2

/* dtype codes: the element type of a tensor. */
enum kb_dtype {
    KB_BOOL = 0,
    KB_INT8 = 1,
    KB_UINT8 = 2,
    KB_INT16 = 3,
    KB_UINT16 = 4,
    KB_INT32 = 5,
    KB_UINT32 = 6,
    KB_INT64 = 7,
    KB_UINT64 = 8,
    KB_FLOAT16 = 9,   /* IEEE binary16 */
    KB_BFLOAT16 = 10, /* the upper half of a binary32 */
    KB_FLOAT32 = 11,
    KB_FLOAT64 = 12,
    KB_COMPLEX64 = 13,
    KB_COMPLEX128 = 14
};

/* One tensor. data is NULL for an absent tensor (an optional bias, a gradient not wanted, a forward
 * value a backward does not need), and in kb_<op>_init. The harness's tensors are C-contiguous, but
 * they lie at any element offset inside a larger allocation (the red zones): never assume alignment
 * beyond the element's, never touch memory outside [data, data + extent). strides are in elements. */
typedef struct kb_tensor {
    void *data;
    int32_t dtype;          /* enum kb_dtype */
    int32_t ndim;
    const int64_t *shape;   /* ndim sizes */
    const int64_t *strides; /* ndim strides, in elements */
} kb_tensor;

/* One argument of the op's signature, in the order kernels.registry declares it (docs/api.md's
 * table): one tensor, or a list of them (concat's inputs, split's outputs). */
typedef struct kb_arg {
    const char *name;       /* "input", "output", "output_grad", "input_grad", "inputs", ... */
    int32_t role;           /* enum kb_role */
    int32_t count;          /* 1, or the list's length */
    const kb_tensor *tensors;
} kb_arg;

enum kb_role {
    KB_ROLE_INPUT = 0,       /* read by the forward */
    KB_ROLE_WEIGHT = 1,      /* a parameter the forward reads */
    KB_ROLE_OUTPUT = 2,      /* written by the forward; read (the forward's result) by a backward */
    KB_ROLE_OUTPUT_GRAD = 3, /* read by the backward */
    KB_ROLE_GRAD = 4         /* written (overwritten, never accumulated) by the backward */
};

/* A call. attrs is the op's attrs dataclass as JSON (enums by name, tuples as lists, "__class__" the
 * class name), say {"__class__": "SoftmaxAttrs", "dim": -1}; options the forward's keyword options
 * as JSON ("{}" for most ops; batch_norm: {"training": true}). stream is the cudaStream_t to enqueue
 * on (NULL on the CPU, where the call completes before it returns); device the CUDA ordinal (-1 on the
 * CPU). Write at most error_size bytes, NUL included, to error on a status other than KB_OK. */
typedef struct kb_call {
    int32_t abi_version; /* KB_ABI_VERSION */
    const char *op;
    const char *attrs;
    const char *options;
    void *stream;
    int32_t device;
    void *state;         /* what kb_<op>_init stored, else NULL */
    int32_t nargs;
    const kb_arg *args;
    char *error;
    size_t error_size;
} kb_call;

/* batch_norm only: its forward's arguments are followed by "running_mean" and "running_var"
 * (float32 for half inputs, else the input's dtype; 0 and 1 at the case's start), which the forward
 * updates in training mode and the harness compares with the goldens. */

#ifdef __cplusplus
}
#endif

#endif /* KERNELS_BACKEND_H */
