"""A backward given None for its only gradient skips it (docs/api.md: `None` skips one): the call
checks its arguments, writes nothing and leaves output_grad as it was."""

import numpy as np
import pytest

from kernels import (
    ElementUnaryAttrs,
    ReshapeAttrs,
    ShapeError,
    SplitAttrs,
    TensorShape,
    TransposeAttrs,
    UnaryOpType,
    UpsampleAttrs,
    UpsampleMode,
    element_unary,
    reshape,
    split,
    transpose,
    upsample,
)

from .conftest import Dev, require

IN = (2, 3, 4, 6)
OPS = {
    "reshape": (reshape, ReshapeAttrs((6, -1)), (6, 24)),
    "transpose": (transpose, TransposeAttrs((3, 1, 0, 2)), (6, 3, 2, 4)),
    "element_unary": (element_unary, ElementUnaryAttrs(UnaryOpType.SILU), IN),
    "upsample_nearest": (upsample, UpsampleAttrs(2, UpsampleMode.NEAREST), (2, 3, 8, 12)),
    "upsample_bilinear": (upsample, UpsampleAttrs(3, UpsampleMode.BILINEAR), (2, 3, 12, 18)),
}


@pytest.mark.parametrize("device", [pytest.param("cpu"), pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("name", list(OPS))
def test_one_gradient_backward_with_none(device, name):
    require(device)
    dev = Dev(device)
    module, attrs, out_dims = OPS[name]
    state = module.init_kernel(dev.handle, attrs, TensorShape(IN, np.float32), TensorShape(out_dims, np.float32))
    x = np.arange(np.prod(IN), dtype=np.float32).reshape(IN) % 5 - 2
    input, output = dev.array(x), dev.array(np.zeros(out_dims, np.float32))
    module.forward_kernel(dev.stream, dev.handle, state, attrs, input, output)
    grad = np.arange(np.prod(out_dims), dtype=np.float32).reshape(out_dims) % 7 - 3
    output_grad = dev.array(grad)
    assert module.backward_kernel(dev.stream, dev.handle, state, attrs, output, output_grad, input, None) is None
    assert np.array_equal(dev.host(output_grad), grad)
    with pytest.raises(ShapeError, match=rf"^{module.OP}: output_grad: expected dims"):  # still checked
        module.backward_kernel(dev.stream, dev.handle, state, attrs, output, dev.array(np.zeros(5, np.float32)), input,
                              None)
    dev.handle.close()


@pytest.mark.parametrize("device", [pytest.param("cpu"), pytest.param("gpu", marks=pytest.mark.gpu)])
def test_split_backward_with_none(device):
    require(device)
    dev = Dev(device)
    attrs = SplitAttrs((1, 2, 3), -1)
    out_dims = split.output_dims(attrs, IN)
    state = split.init_kernel(dev.handle, attrs, TensorShape(IN, np.float32), [TensorShape(d, np.float32) for d in out_dims])
    grads = [np.full(d, i + 1, np.float32) for i, d in enumerate(out_dims)]
    output_grads = [dev.array(g) for g in grads]
    assert split.backward_kernel(dev.stream, dev.handle, state, attrs, None, output_grads, None, None) is None
    assert all(np.array_equal(dev.host(a), g) for a, g in zip(output_grads, grads))
    dev.handle.close()
