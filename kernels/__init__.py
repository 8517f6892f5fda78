"""The YOLOv10 kernel library: every operator the detector needs, forward and
backward, on the CPU (NumPy) and the GPU (CUDA through NVRTC/CuPy, cuDNN, cuBLAS).

Each op is a module with the same functions in the same argument order:
``init_kernel``, ``forward_kernel``, ``backward_kernel``, ``cleanup_kernel`` and
their ``cpu_``/``gpu_`` twins. See DESIGN.md section 3.
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
from .core import (
    AttrsError,
    CudaError,
    DeviceError,
    DTypeError,
    KernelError,
    ShapeError,
    StateError,
    TensorShape,
    cpu_handle,
    cpu_stream,
)
from .element_binary import BinaryOpType, ElementBinaryAttrs
from .element_unary import ElementUnaryAttrs, UnaryOpType
from .gpu import gpu_handle, gpu_stream, gpu_unavailable_reason
from .gradient_reduction import GradientReductionAttrs
from .pool_2d import Pool2DAttrs, PoolOp
from .reshape import ReshapeAttrs
from .softmax import SoftmaxAttrs
from .split import SplitAttrs
from .transpose import TransposeAttrs
from .upsample import UpsampleAttrs, UpsampleMode

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
