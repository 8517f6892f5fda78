"""The YOLOv10 kernel library: every operator the detector needs, forward and
backward, on the CPU (NumPy) and the GPU (CUDA through NVRTC/CuPy, cuDNN, cuBLAS).

Each op is a module with the same functions in the same argument order:
``init_kernel``, ``forward_kernel``, ``backward_kernel``, ``cleanup_kernel`` and
their ``cpu_``/``gpu_`` twins. See DESIGN.md section 3. ``kernels.functional`` is the
layer above them: one torch.nn.functional-like call per op, outputs allocated, states cached.
"""

# Ops, one module each; keep this list and OPS in the order of DESIGN.md section 2.
from . import (
    activation,
    batch_matmul,
    batch_norm,
    concat,
    conv_2d,
    element_binary,
    element_unary,
    functional,  # the layer above the ops: imports them itself
    gradient_reduction,
    pool_2d,
    reshape,
    softmax,
    split,
    transpose,
    upsample,
)
from .activation import Activation
from .batch_matmul import BatchMatmulAttrs
from .batch_norm import BatchNormAttrs, BatchNormMode
from .concat import ConcatAttrs
from .conv_2d import Conv2DAttrs
from .element_binary import BinaryOpType, ElementBinaryAttrs
from .element_unary import ElementUnaryAttrs, UnaryOpType
from .gradient_reduction import GradientReductionAttrs
from .pool_2d import Pool2DAttrs, PoolOp
from .reshape import ReshapeAttrs
from .runtime.core import (
    AttrsError,
    CudaError,
    DeviceError,
    DTypeError,
    KernelError,
    ShapeError,
    StateError,
    TensorShape,
)
from .runtime.cpu import cpu_handle, cpu_stream
from .runtime.gpu import gpu_handle, gpu_stream, gpu_unavailable_reason
from .softmax import SoftmaxAttrs
from .split import SplitAttrs
from .transpose import TransposeAttrs
from .upsample import UpsampleAttrs, UpsampleMode


def _version() -> str:
    """The installed distribution's version, else (a source tree not installed) pyproject.toml's."""
    from importlib import metadata

    try:
        return metadata.version("yolov10-kernels")
    except metadata.PackageNotFoundError:
        import os
        import re

        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml")
        try:
            with open(path, encoding="utf-8") as file:
                match = re.search(r'^version\s*=\s*"([^"]+)"', file.read(), re.MULTILINE)
        except OSError:
            match = None
        return match.group(1) if match else "0+unknown"


__version__ = _version()

OPS = {
    "conv_2d": conv_2d,
    "batch_norm": batch_norm,
    "pool_2d": pool_2d,
    "concat": concat,
    "split": split,
    "reshape": reshape,
    "transpose": transpose,
    "batch_matmul": batch_matmul,
    "upsample": upsample,
    "softmax": softmax,
    "gradient_reduction": gradient_reduction,
    "element_unary": element_unary,
    "element_binary": element_binary,
}

__all__ = [
    "__version__", "functional",
    "AttrsError", "CudaError", "DeviceError", "DTypeError", "KernelError", "ShapeError", "StateError",
    "TensorShape", "cpu_handle", "cpu_stream", "gpu_handle", "gpu_stream", "gpu_unavailable_reason",
    "OPS", "transpose", "TransposeAttrs",
    "conv_2d", "Conv2DAttrs",
    "element_unary", "ElementUnaryAttrs", "UnaryOpType",
    "element_binary", "ElementBinaryAttrs", "BinaryOpType",
    "pool_2d", "Pool2DAttrs", "PoolOp",
    "activation", "Activation",
    "batch_norm", "BatchNormAttrs", "BatchNormMode",
    "batch_matmul", "BatchMatmulAttrs", "softmax", "SoftmaxAttrs",
    "reshape", "ReshapeAttrs", "upsample", "UpsampleAttrs", "UpsampleMode",
    "concat", "ConcatAttrs", "split", "SplitAttrs", "gradient_reduction", "GradientReductionAttrs",
]
