"""`--backend torch`: each op through torch / torch.nn.functional, in the case's dtype on its device,
as a PyTorch user runs it: the forward builds an autograd graph on the harness's tensors (wrapped
without a copy: torch.from_numpy, torch.from_dlpack; bfloat16 through its 16-bit patterns), its
results are copied into the harness's outputs, and backward differentiates that graph with the output
gradients (torch.autograd.grad). On CUDA every call runs on the harness's stream
(torch.cuda.ExternalStream of its CuPy stream).

`torch` runs with the process's PyTorch settings (a fresh process has PyTorch's defaults: TF32 in cuDNN
convolutions, cuDNN free to pick non-deterministic algorithms, half matmuls free to reduce in half
precision); `torch-strict` turns those off around each call. The report lists the settings, and a
failure lists those that may explain it (`notes`)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import numpy as np

from kernels.registry import OPS
from kernels.runtime.core import BFLOAT16, HALF_DTYPES, is_floating

from . import SCHEDULES, Backend, running_statistics

# What torch-strict sets around each call: (module path, attribute, strict value).
_STRICT = (
    ("backends.cuda.matmul", "allow_tf32", False),
    ("backends.cudnn", "allow_tf32", False),
    ("backends.cudnn", "deterministic", True),
    ("backends.cudnn", "benchmark", False),
    ("backends.cuda.matmul", "allow_fp16_reduced_precision_reduction", False),
    ("backends.cuda.matmul", "allow_bf16_reduced_precision_reduction", False),
)


def _torch() -> Any:
    import torch

    return torch


def _setting(path: str) -> Any:
    owner = _torch()
    for part in path.split("."):
        owner = getattr(owner, part)
    return owner


def settings() -> dict[str, Any]:
    """The PyTorch settings that move results away from the goldens, as they are now."""
    torch = _torch()
    found = {f"{path}.{name}": getattr(_setting(path), name) for path, name, _ in _STRICT}
    found["deterministic_algorithms"] = torch.are_deterministic_algorithms_enabled()
    return found


def to_torch(array: Any) -> Any:
    """A torch tensor on the memory of a NumPy or CuPy array (no copy)."""
    torch = _torch()
    bfloat16 = np.dtype(array.dtype) == BFLOAT16
    if isinstance(array, np.ndarray):
        tensor = torch.from_numpy(array.view(np.uint16) if bfloat16 else array)
    else:
        tensor = torch.from_dlpack(array.view(np.uint16) if bfloat16 else array)
    return tensor.view(torch.bfloat16) if bfloat16 else tensor


def _activation(activation: Any, value: Any) -> Any:
    import torch.nn.functional as F

    return value if activation is None else getattr(F, activation.name.lower())(value)


def _unary(attrs: Any, x: Any) -> Any:
    import torch.nn.functional as F

    torch, op, scalar = _torch(), attrs.op_type.name, attrs.scalar
    named = {"RELU": torch.relu, "SIGMOID": torch.sigmoid, "TANH": torch.tanh, "GELU": F.gelu, "EXP": torch.exp,
             "IDENTITY": torch.clone, "RSQRT": torch.rsqrt, "SIN": torch.sin, "COS": torch.cos}
    if op in named:
        return named[op](x)
    scaled = {"ELU": lambda: F.elu(x, alpha=scalar), "POW": lambda: torch.pow(x, scalar),
              "SILU": lambda: F.silu(x) if scalar in (None, 1.0) else x * torch.sigmoid(scalar * x),
              "SCALAR_MULTIPLY": lambda: x * scalar, "SCALAR_ADD": lambda: x + scalar,
              "SCALAR_SUB": lambda: x - scalar, "SCALAR_TRUE_DIV": lambda: x / scalar}
    return scaled[op]()


def _pool(attrs: Any, x: Any) -> Any:
    import torch.nn.functional as F

    window = dict(kernel_size=(attrs.kernel_h, attrs.kernel_w), stride=(attrs.stride_h, attrs.stride_w),
                  padding=(attrs.padding_h, attrs.padding_w))
    if attrs.pool_type.name == "MAX":
        return _activation(attrs.activation, F.max_pool2d(x, **window))
    return _activation(attrs.activation, F.avg_pool2d(x, count_include_pad=attrs.count_include_pad, **window))


def _conv(attrs: Any, x: Any, w: Any, b: Any) -> Any:
    import torch.nn.functional as F

    y = F.conv2d(x, w, b, stride=(attrs.stride_h, attrs.stride_w), padding=(attrs.padding_h, attrs.padding_w),
                 dilation=(attrs.dilation_h, attrs.dilation_w), groups=attrs.groups)
    return _activation(attrs.activation, y)


def _batch_norm(attrs: Any, state: Any, x: Any, gamma: Any, beta: Any, training: bool) -> Any:
    import torch.nn.functional as F

    spatial = attrs.mode.name == "SPATIAL"
    stats = x.shape[1] if spatial else int(np.prod(x.shape[1:], dtype=np.int64))
    state.trained += bool(training)
    momentum = attrs.momentum if attrs.momentum is not None else 1.0 / max(state.trained, 1)
    y = F.batch_norm(x if spatial else x.reshape(x.shape[0], stats), to_torch(state.running_mean).reshape(stats),
                     to_torch(state.running_var).reshape(stats), None if gamma is None else gamma.reshape(stats),
                     None if beta is None else beta.reshape(stats), training=training, momentum=momentum, eps=attrs.eps)
    return _activation(attrs.activation, y.reshape(x.shape))


def _binary(attrs: Any, lhs: Any, rhs: Any) -> Any:
    torch = _torch()
    return {"ADD": torch.add, "SUB": torch.sub, "MUL": torch.mul, "DIV": torch.div, "MAX": torch.maximum,
            "MIN": torch.minimum}[attrs.op_type.name](lhs, rhs)


def _sum(tensors: list[Any]) -> Any:
    total = tensors[0].clone()
    for term in tensors[1:]:
        total = total + term
    return total


# Each op's forward: (attrs, state, forward tensors as torch tensors, options) -> its outputs, in order.
FORWARD = {
    "batch_matmul": lambda attrs, state, lhs, rhs: (_torch().matmul(lhs, rhs),),
    "batch_norm": lambda attrs, state, x, gamma, beta, training=True: (_batch_norm(attrs, state, x, gamma, beta, training),),
    "concat": lambda attrs, state, inputs: (_torch().cat(inputs, dim=attrs.axis),),
    "conv_2d": lambda attrs, state, x, w, b: (_conv(attrs, x, w, b),),
    "element_binary": lambda attrs, state, lhs, rhs: (_binary(attrs, lhs, rhs),),
    "element_unary": lambda attrs, state, x: (_unary(attrs, x),),
    "gradient_reduction": lambda attrs, state, inputs: (_sum(inputs),),
    "pool_2d": lambda attrs, state, x: (_pool(attrs, x),),
    "reshape": lambda attrs, state, x: (x.reshape(attrs.shape),),
    "softmax": lambda attrs, state, x: (_torch().softmax(x, attrs.dim),),
    "split": lambda attrs, state, x: (list(_torch().split(x, list(attrs.splits), dim=attrs.axis)),),
    "top_k": lambda attrs, state, x: tuple(t[..., :attrs.k] for t in _torch().sort(x, dim=-1, descending=True,
                                                                                   stable=True)),
    "transpose": lambda attrs, state, x: (x.permute(attrs.permutation),),
    "upsample": lambda attrs, state, x: (_torch().nn.functional.interpolate(
        x, scale_factor=attrs.scale_factor, mode=attrs.mode.value,
        **({"align_corners": False} if attrs.mode.name == "BILINEAR" else {})),),
}


class _State:
    def __init__(self, attrs: Any, shapes: tuple[Any, ...]):
        self.graph: tuple[dict[str, Any], list[Any]] | None = None  # the last forward's leaves and outputs
        self.trained = 0  # batch_norm: training steps so far (momentum None is their cumulative average)
        self.running_mean = self.running_var = None
        self.shapes = shapes


class _Op:
    """One op's four functions through PyTorch."""

    def __init__(self, backend: TorchBackend, name: str):
        self.backend, self.name, self.spec = backend, name, OPS[name]

    def init_kernel(self, handle: Any, attrs: Any, *shapes: Any) -> _State:
        return _State(attrs, shapes)

    def forward_kernel(self, stream: Any, handle: Any, state: _State, attrs: Any, *tensors: Any, **options: Any) -> None:
        torch = _torch()
        with self.backend.calling(stream):
            leaves: dict[str, Any] = {}
            arguments = []
            for arg, value in zip(self.spec.forward, tensors):
                if arg.role == "output":
                    continue
                wrapped = [self._leaf(v) for v in value] if arg.many else self._leaf(value)
                leaves[arg.name] = wrapped
                arguments.append(wrapped)
            if self.name == "batch_norm" and state.running_mean is None:
                state.running_mean, state.running_var = running_statistics(attrs, tensors[0], stream)
            outputs = FORWARD[self.name](attrs, state, *arguments, **options)
            written = [value for arg, value in zip(self.spec.forward, tensors) if arg.role == "output"]
            with torch.no_grad():
                for result, target in zip(outputs, written):
                    for one, array in zip(result, target) if isinstance(target, list) else [(result, target)]:
                        to_torch(array).copy_(one)
            state.graph = (leaves, [o for result in outputs for o in (result if isinstance(result, list) else [result])])

    @staticmethod
    def _leaf(array: Any) -> Any:
        if array is None:
            return None
        tensor = to_torch(array)
        return tensor.requires_grad_() if tensor.is_floating_point() else tensor

    def backward_kernel(self, stream: Any, handle: Any, state: _State, attrs: Any, *tensors: Any) -> None:
        torch = _torch()
        leaves, outputs = state.graph
        by_name = {arg.name: value for arg, value in zip(self.spec.backward, tensors)}
        grads_out = [by_name[arg.name] for arg in self.spec.backward if arg.role == "output_grad"]
        grads_out = [g for value in grads_out for g in (value if isinstance(value, list) else [value])]
        # The outputs autograd can differentiate (floating ones: top_k's int64 indices have no gradient).
        outputs = [output for output in outputs if output.is_floating_point()]
        wanted = []  # (leaf tensor, the harness's gradient buffer)
        for arg in self.spec.args("backward", "grad"):
            buffers, sources = by_name[arg.name], leaves.get(arg.of)
            pairs = zip(sources, buffers) if arg.many else [(sources, buffers)]
            wanted += [(leaf, buffer) for leaf, buffer in pairs if buffer is not None and leaf is not None]
        with self.backend.calling(stream):
            grads = torch.autograd.grad(outputs, [leaf for leaf, _ in wanted], [to_torch(g) for g in grads_out],
                                        allow_unused=True, retain_graph=True) if wanted else ()
            with torch.no_grad():
                for (_, buffer), grad in zip(wanted, grads):
                    target = to_torch(buffer)
                    target.copy_(grad.reshape(target.shape) if grad is not None else torch.zeros_like(target))

    def cleanup_kernel(self, handle: Any, state: _State) -> None:
        state.graph = None


class TorchBackend(Backend):
    """PyTorch's ops, as its users call them; `strict`: TF32, reduced-precision reductions and
    non-deterministic cuDNN algorithms off around each call."""

    schedules = SCHEDULES
    views = True

    def __init__(self, strict: bool = False):
        self.strict = strict
        self.name = "torch-strict" if strict else "torch"
        self._ops: dict[str, _Op] = {}

    def op(self, name: str) -> Any:
        if name not in FORWARD:
            return None
        return self._ops.setdefault(name, _Op(self, name))

    @contextlib.contextmanager
    def calling(self, stream: Any) -> Iterator[None]:
        """A call's context: on CUDA, the harness's stream as PyTorch's current one; strict settings."""
        torch = _torch()
        with contextlib.ExitStack() as stack:
            cupy_stream = getattr(stream, "cupy_stream", None)
            if cupy_stream is not None:
                stack.enter_context(torch.cuda.device(stream.device))
                stack.enter_context(torch.cuda.stream(torch.cuda.ExternalStream(cupy_stream.ptr, device=stream.device)))
            if self.strict:
                saved = [(_setting(path), name, getattr(_setting(path), name)) for path, name, _ in _STRICT]
                for path, name, value in _STRICT:
                    setattr(_setting(path), name, value)
                stack.callback(lambda: [setattr(owner, name, value) for owner, name, value in saved])
            yield

    def layouts(self, device: str) -> tuple[str, ...] | None:
        """On the GPU, tensors at 256-byte boundaries only (in their margins), as PyTorch's allocator
        places them: the first run on the H200 with the misaligned layouts ended in
        cudaErrorMisalignedAddress, a sticky error that fails every later case of the process
        (docs/backends.md). On the CPU, every layout."""
        return None if device == "cpu" else ("aligned",)

    def supports(self, case: Any, device: str) -> str | None:
        try:
            torch = _torch()
        except ImportError as error:
            return f"PyTorch is not installed ({error})"
        if device != "cpu" and not torch.cuda.is_available():
            return "PyTorch sees no CUDA device (a CPU-only build, or no driver)"
        backward = any(name == "output_grad" or name.startswith("output_grads.") for name in case.inputs)
        dtype = np.dtype(case.dtype)
        if backward and not is_floating(dtype):
            return f"PyTorch's autograd differentiates floating-point tensors only, not {dtype}"
        return None

    def describe(self, device: str) -> str | None:
        try:
            torch = _torch()
        except ImportError:
            return None
        shown = settings()
        if self.strict:
            shown.update({f"{path}.{name}": value for path, name, value in _STRICT})
        if device == "cpu":
            shown = {"deterministic_algorithms": shown["deterministic_algorithms"]}
        return f"torch {torch.__version__}: " + ", ".join(f"{name}={value}" for name, value in shown.items())

    def notes(self, case: Any, device: str) -> list[str]:
        """The PyTorch settings and habits that may explain a failure of `case` on `device`."""
        now = settings()
        if self.strict:
            now.update({f"{path}.{name}": value for path, name, value in _STRICT})
        dtype = np.dtype(case.dtype)
        found = []
        if dtype in HALF_DTYPES:
            found.append(f"{dtype}: PyTorch rounds every op's result to {dtype}: a fused activation, batch norm's "
                         "normalisation and its affine step are several roundings where the golden is one")
        if device == "cpu":
            return found
        if case.op == "conv_2d" and dtype == np.float32 and now["backends.cudnn.allow_tf32"]:
            found.append("TF32: torch.backends.cudnn.allow_tf32 is True (PyTorch's default): cuDNN convolutions "
                         "may round float32 operands to 10 mantissa bits")
        if case.op == "batch_matmul" and dtype == np.float32 and now["backends.cuda.matmul.allow_tf32"]:
            found.append("TF32: torch.backends.cuda.matmul.allow_tf32 is True: cuBLAS may round float32 operands "
                         "to 10 mantissa bits")
        reduced = {np.dtype(np.float16): "allow_fp16_reduced_precision_reduction",
                   BFLOAT16: "allow_bf16_reduced_precision_reduction"}.get(dtype)
        if case.op == "batch_matmul" and reduced and now[f"backends.cuda.matmul.{reduced}"]:
            found.append(f"half accumulation: torch.backends.cuda.matmul.{reduced} is True (PyTorch's default): "
                         "cuBLAS may sum products in the half dtype")
        if case.op in ("conv_2d", "upsample", "pool_2d", "batch_norm") and not now["backends.cudnn.deterministic"] \
                and not now["deterministic_algorithms"]:
            found.append("non-deterministic algorithms: torch.backends.cudnn.deterministic and "
                         "torch.use_deterministic_algorithms are off (PyTorch's default): cuDNN's and ATen's "
                         "backward kernels may sum with atomics, in an order that changes from run to run")
        return found
