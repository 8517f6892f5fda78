"""The README's opening example runs, and gives what torch gives, so it cannot rot."""

import pathlib
import re

import numpy as np
import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def readme_example() -> str:
    """The first ```python block of README.md."""
    match = re.search(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    assert match, "README.md lost its ```python example"
    return match.group(1)


def test_readme_example_matches_torch():
    namespace: dict = {}
    exec(compile(readme_example(), str(README), "exec"), namespace)
    x, w, y, grads = (namespace[name] for name in ("x", "w", "y", "grads"))
    assert y.shape == (2, 4, 3, 3) and grads.input.shape == x.shape and grads.weight.shape == w.shape
    assert grads.bias is None  # the example's conv has no bias
    torch = pytest.importorskip("torch")
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    tw = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    ty = torch.nn.functional.conv2d(tx, tw, stride=2, padding=1)
    ty.backward(ty.detach())  # the example's grad_output is y itself
    # Multiples of 1/4 and small integers: every sum is exact, so the results are equal.
    np.testing.assert_array_equal(y, ty.detach().numpy())
    np.testing.assert_array_equal(grads.input, tx.grad.numpy())
    np.testing.assert_array_equal(grads.weight, tw.grad.numpy())
