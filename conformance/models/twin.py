"""A test stand-in with the kernel model's API (kernels.models.YOLOv10) over the PyTorch reference,
so the whole-network comparison (conformance.models.session) can be exercised and its bounds
measured without the kernel model: it is never the thing under test.

`compute_dtype` runs the twin in another precision than it reports (float64 rounded to float32:
the reference's own float32 error then shows in every row); `native_conv` runs its convolutions
without oneDNN, by PyTorch's own im2col and GEMM (another summation order, much like a NumPy
implementation's); `perturb(kind, name, array)`
returns a changed copy of a result, so a test can check that the comparison catches it.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from conformance.models import reference

BRANCHES = ("one2many", "one2one")


class TorchTwin:
    def __init__(self, variant: str, num_classes: int = 80, device: str = "cpu", dtype: str = "float32",
                 compute_dtype: str | None = None, native_conv: bool = False, perturb=None):
        if device != "cpu":
            raise ValueError("the twin runs on the CPU only")
        self.dtype = np.dtype(dtype)
        self.compute_dtype = getattr(torch, compute_dtype or dtype)
        self.native_conv = native_conv
        self.perturb = perturb or (lambda kind, name, array: array)
        self.variant, self.num_classes = variant, num_classes
        self.model = reference.build(variant, num_classes, dtype=self.compute_dtype)
        self.grads: dict[str, np.ndarray] = {}
        self._x = None
        self._outputs = None
        self.closed = False

    def init_random(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        fresh = reference.build(self.variant, self.num_classes, dtype=self.compute_dtype)
        self.model.load_state_dict(fresh.state_dict())

    def load_state_dict(self, mapping) -> None:
        reference.load_numpy(self.model, mapping)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {name: self._out("state", name, t) for name, t in self.model.state_dict().items()}

    def train(self) -> None:
        self.model.train()

    def eval(self) -> None:
        self.model.eval()

    def _out(self, kind: str, name: str, tensor: torch.Tensor) -> np.ndarray:
        array = tensor.detach().cpu().numpy()
        if array.dtype.kind == "f":
            array = array.astype(self.dtype)
        return self.perturb(kind, name, array.copy())

    def _in(self, array: np.ndarray, requires_grad: bool = False) -> torch.Tensor:
        return torch.tensor(np.asarray(array), dtype=self.compute_dtype).requires_grad_(requires_grad)

    @contextlib.contextmanager
    def _conv_flags(self):
        before = torch.backends.mkldnn.enabled
        torch.backends.mkldnn.enabled = before and not self.native_conv
        try:
            yield
        finally:
            torch.backends.mkldnn.enabled = before

    def __call__(self, x):
        if self.model.training:
            self._x = self._in(x, requires_grad=True)
            with self._conv_flags():
                self._outputs = self.model(self._x)
            heads = self._outputs
            result = {}
        else:
            with torch.no_grad(), self._conv_flags():
                detections, heads = self.model(self._in(x))
            result = {"detections": self._out("detections", "detections", detections)}
        for branch in BRANCHES:
            result[branch] = [self._out(branch, f"{branch}.{i}", t) for i, t in enumerate(heads[branch])]
        return result

    def backward(self, output_grads):
        if self._outputs is None:
            raise RuntimeError("backward without a training forward before it")
        self.model.zero_grad(set_to_none=True)
        tensors = [t for branch in BRANCHES for t in self._outputs[branch]]
        grads = [self._in(g) for branch in BRANCHES for g in output_grads[branch]]
        with self._conv_flags():
            torch.autograd.backward(tensors, grads)
        self.grads = {name: self._out("grad", name, p.grad) for name, p in self.model.named_parameters() if p.requires_grad}
        self._outputs = None
        return {"input": self._out("grad", "input", self._x.grad)}

    def close(self) -> None:
        self.closed = True
