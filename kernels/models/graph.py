"""The model layer's machinery: a network traced once per input shape and mode into a flat
list of primitive op calls (a Graph), compiled into a Plan whose op states and buffers are
made once and reused by every call.

A Graph is symbolic: values are dims only, nodes are (op, attrs, the values they read, the
values they write). Parameters are leaf values bound by name to the network's arrays, so a
parameter read twice gets its gradient summed like any other value. A Plan binds every value
to an array (parameters to the network's own, activations and gradients to buffers allocated
at compile time), makes every op state with init_kernel, and precomputes each call's arguments:
a forward is `for function, args in calls: function(*args)`.

Backward runs the forward's nodes in reverse through each op's backward_kernel. A value read
by one differentiable use receives its gradient directly in its gradient buffer; a value read by
several gets one buffer per use, summed by gradient_reduction (never by hand) before the
backward of the node that wrote it. Reads through `Graph.detach` carry no gradient (None is
passed for that input gradient), as torch's `detach()`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .. import (
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
from ..runtime import core
from ..runtime.core import TensorShape

# How each op's forward and backward take their tensors (docs/api.md#signatures), by node kind:
#   CONV:   forward (input, filter, bias, output)
#           backward (output, output_grad, input, input_grad, filter, filter_grad, bias_grad)
#   BN:     forward (input, gamma, beta, output, training=)
#           backward (output, output_grad, input, input_grad, gamma, beta, gamma_grad, beta_grad)
#   UNARY:  forward (input, output);        backward (output, output_grad, input, input_grad)
#   BINARY: forward (lhs, rhs, output);     backward (output, output_grad, lhs, lhs_grad, rhs, rhs_grad)
#   CONCAT: forward (inputs, output);       backward (output, output_grad, inputs, input_grads)
#   SPLIT:  forward (input, outputs);       backward (outputs, output_grads, input, input_grad)
CONV, BN, UNARY, BINARY, CONCAT, SPLIT = "conv", "bn", "unary", "binary", "concat", "split"
ARENA_ALIGN = 256  # bytes: where each activation of an inference plan's arena starts (cudaMalloc's alignment)


@dataclass(frozen=True)
class Tensor:
    """A value of a Graph: its index and dims; `detached` marks a read that carries no gradient."""

    index: int
    dims: tuple[int, ...]
    detached: bool = False


@dataclass
class Value:
    """kind: "input" (copied in by each call), "param" (a network array, gradient wanted),
    "frozen" (a network array without gradient), "constant" (an array made at compile time) or
    "activation" (written by a node)."""

    dims: tuple[int, ...]
    kind: str
    name: str | None = None  # the parameter's name; "constant": the key of Graph.constants


@dataclass
class Node:
    kind: str  # CONV, BN, UNARY, BINARY, CONCAT or SPLIT
    module: Any  # the op module
    attrs: Any
    inputs: tuple[int, ...]  # values read, in the order of the op's forward (weights included)
    outputs: tuple[int, ...]
    no_grad: tuple[bool, ...]  # per input: read through detach (no gradient flows back)
    bn: str | None = None  # a batch norm's name (its running statistics are the network's)
    layer: str | None = None  # the network's layer that traced it (Graph.layer then), for profiles


@dataclass
class Graph:
    """A network traced at one input shape: values, nodes in forward order, the outputs."""

    values: list[Value] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    params: dict[str, int] = field(default_factory=dict)  # parameter name -> value
    constants: dict[str, np.ndarray] = field(default_factory=dict)  # host arrays, placed at compile time
    fused: bool = False  # the fused inference graph (BatchNorms folded into the convs: Network.fuse)
    layer: str | None = None  # the layer being traced (a network sets it; each node records it)

    def _value(self, dims: Sequence[int], kind: str, name: str | None = None) -> Tensor:
        self.values.append(Value(tuple(int(d) for d in dims), kind, name))
        return Tensor(len(self.values) - 1, self.values[-1].dims)

    def input(self, dims: Sequence[int]) -> Tensor:
        return self._value(dims, "input")

    def param(self, name: str, dims: Sequence[int], frozen: bool = False) -> Tensor:
        """The leaf value of a parameter (one per name, however often it is read)."""
        if name not in self.params:
            self.params[name] = self._value(dims, "frozen" if frozen else "param", name).index
        index = self.params[name]
        return Tensor(index, self.values[index].dims)

    def constant(self, name: str, array: np.ndarray) -> Tensor:
        """A fixed host array (anchors, strides), copied to the device when a Plan is compiled."""
        self.constants[name] = array
        return self._value(array.shape, "constant", name)

    @staticmethod
    def detach(x: Tensor) -> Tensor:
        """x read without gradient (torch's x.detach())."""
        return Tensor(x.index, x.dims, detached=True)

    def _node(self, kind: str, module: Any, attrs: Any, inputs: Sequence[Tensor], output_dims: Sequence[Sequence[int]],
              bn: str | None = None) -> list[Tensor]:
        outputs = [self._value(dims, "activation") for dims in output_dims]
        self.nodes.append(Node(kind, module, attrs, tuple(t.index for t in inputs), tuple(t.index for t in outputs),
                               tuple(t.detached for t in inputs), bn, self.layer))
        return outputs

    # The ops, one builder each: they check nothing (init_kernel does, at compile time) but the dims.

    def conv2d(self, x: Tensor, weight: Tensor, bias: Tensor | None, attrs: conv_2d.Conv2DAttrs) -> Tensor:
        inputs = [x, weight] + ([bias] if bias is not None else [])
        return self._node(CONV, conv_2d, attrs, inputs, [conv_2d.output_dims(attrs, x.dims)])[0]

    def batch_norm(self, x: Tensor, gamma: Tensor, beta: Tensor, attrs: batch_norm.BatchNormAttrs, name: str) -> Tensor:
        return self._node(BN, batch_norm, attrs, [x, gamma, beta], [x.dims], bn=name)[0]

    def pool2d(self, x: Tensor, attrs: pool_2d.Pool2DAttrs) -> Tensor:
        return self._node(UNARY, pool_2d, attrs, [x], [pool_2d.output_dims(attrs, x.dims)])[0]

    def upsample(self, x: Tensor, attrs: upsample.UpsampleAttrs) -> Tensor:
        return self._node(UNARY, upsample, attrs, [x], [upsample.output_dims(attrs, x.dims)])[0]

    def reshape(self, x: Tensor, dims: Sequence[int]) -> Tensor:
        attrs = reshape.ReshapeAttrs(tuple(dims))
        return self._node(UNARY, reshape, attrs, [x], [reshape.output_dims(attrs, x.dims)])[0]

    def transpose(self, x: Tensor, permutation: Sequence[int]) -> Tensor:
        attrs = transpose.TransposeAttrs(tuple(permutation))
        return self._node(UNARY, transpose, attrs, [x], [transpose.output_dims(attrs, x.dims)])[0]

    def unary(self, x: Tensor, op_type: Any, scalar: float | None = None) -> Tensor:
        return self._node(UNARY, element_unary, element_unary.ElementUnaryAttrs(op_type, scalar), [x], [x.dims])[0]

    def softmax(self, x: Tensor, dim: int) -> Tensor:
        return self._node(UNARY, softmax, softmax.SoftmaxAttrs(dim), [x], [x.dims])[0]

    def binary(self, lhs: Tensor, rhs: Tensor, op_type: Any) -> Tensor:
        attrs = element_binary.ElementBinaryAttrs(op_type)
        return self._node(BINARY, element_binary, attrs, [lhs, rhs], [element_binary.broadcast_dims(lhs.dims, rhs.dims)])[0]

    def matmul(self, lhs: Tensor, rhs: Tensor) -> Tensor:
        attrs = batch_matmul.BatchMatmulAttrs()
        return self._node(BINARY, batch_matmul, attrs, [lhs, rhs], [batch_matmul.output_dims(lhs.dims, rhs.dims)])[0]

    def concat(self, xs: Sequence[Tensor], axis: int) -> Tensor:
        attrs = concat.ConcatAttrs(axis, len(xs))
        return self._node(CONCAT, concat, attrs, xs, [concat.output_dims(attrs, [x.dims for x in xs])])[0]

    def split(self, x: Tensor, sizes: Sequence[int], axis: int) -> list[Tensor]:
        attrs = split.SplitAttrs(tuple(sizes), axis)
        return self._node(SPLIT, split, attrs, [x], split.output_dims(attrs, x.dims))


def _structure(outputs: Any, function: Callable[[Tensor], Any]) -> Any:
    """outputs (a Tensor, or a dict of Tensors and lists of Tensors) with function applied to each Tensor."""
    if isinstance(outputs, Tensor):
        return function(outputs)
    if isinstance(outputs, dict):
        return {key: _structure(value, function) for key, value in outputs.items()}
    return [_structure(value, function) for value in outputs]


def _inference_attrs(attrs: Any) -> Any:
    """attrs with backward=False where the op takes that option (its state then keeps nothing for a backward)."""
    if getattr(attrs, "backward", False):
        return dataclasses.replace(attrs, backward=False)
    return attrs


def _arrays(items: Any, xp: Any) -> list[Any]:
    """The arrays among items, and among the values of the dicts among them (a state's fields)."""
    found = []
    for item in items:
        if isinstance(item, dict):
            found += _arrays(item.values(), xp)
        elif isinstance(item, (np.ndarray, xp.ndarray)):
            found.append(item)
    return found


def _leaves(outputs: Any) -> list[Tensor]:
    found: list[Tensor] = []
    _structure(outputs, found.append)
    return found


class Plan:
    """A Graph compiled for one device and dtype, in one mode: every op state made (init_kernel),
    every buffer allocated, every call's arguments fixed. Runs the forward, and after a training
    forward the backward, without allocating."""

    def __init__(self, graph: Graph, outputs: Any, runtime: Any, training: bool,
                 grad_outputs: Sequence[str] = (), reuse: bool = True, inference_states: bool = True):
        """outputs: the Tensors to return (a dict); grad_outputs: its keys whose gradients backward takes
        (training plans only). runtime: the network's device runtime (stream, handle, arrays, parameters).
        reuse: share buffers between values whose lives do not overlap: the activations of an inference
        plan, the gradients of a training plan (it keeps every activation: its backward reads them).
        inference_states: an inference plan makes the states of the ops that take it with
        ``attrs.backward=False``, so that they keep nothing for a backward (False: as a training plan's)."""
        self.graph, self.training, self.runtime = graph, training, runtime
        self.states: list[tuple[Any, Any]] = []  # (op module, state) of every call, for cleanup
        self.node_states: list[Any] = []  # the state of each node
        # The attrs each node's state is made and called with.
        self.node_attrs = [_inference_attrs(node.attrs) if inference_states and not training else node.attrs
                           for node in graph.nodes]
        self.activation_bytes = 0  # of the activation buffers the plan made (see memory())
        self.checked: set[str] = set()  # "forward", "backward", "after": the runs whose calls have run once
        # What a network runs after the forward on its outputs, made by the network (YOLOv10's detections,
        # kernels.models.detections): an object with `calls` (as forward_calls) and `close()`, or None.
        self.after: Any = None
        # run(graphs=True): the CUDA graph of the forward, with (True) or without (False) the calls after it.
        self.graphs: dict[bool, Any] = {}
        dtype = runtime.dtype
        with runtime.active():
            self.buffers: list[Any] = self._allocate(outputs, runtime, reuse=reuse and not training)
            self.input = next(b for b, v in zip(self.buffers, graph.values) if v.kind == "input")
            self.outputs = _structure(outputs, lambda t: self.buffers[t.index])
            self.forward_calls = [self._forward_call(node, attrs, runtime, dtype)
                                  for node, attrs in zip(graph.nodes, self.node_attrs)]
            self.bn_names = [node.bn for node in graph.nodes if node.bn is not None]
            self.grads: dict[str, Any] = {}
            self.backward_calls: list[tuple[Callable[..., None], tuple]] = []
            self.backward_layers: list[str | None] = []  # the layer of each backward call (Node.layer)
            self.output_grads: Any = None
            self.input_grad: Any = None
            self.gradient_bytes = 0  # of the gradient buffers the plan made (the network's parameter ones aside)
            if training:
                self._compile_backward(outputs, grad_outputs, runtime, dtype, reuse)

    def _allocate(self, outputs: Any, runtime: Any, reuse: bool) -> list[Any]:
        """A buffer per value. With reuse, the activations (outputs aside, which are never shared) are views
        of one arena, placed at compile time: each lives from the node that writes it to the last node that
        reads it, and two values whose lives overlap (a node's inputs and outputs included) never overlap in
        the arena. Placement is greedy by size: the largest value first, each at the lowest offset clear of
        every placed value whose life overlaps its own (offsets aligned to ARENA_ALIGN bytes)."""
        values = self.graph.values
        kept = {tensor.index for tensor in _leaves(outputs)}
        shared = [i for i, value in enumerate(values) if reuse and value.kind == "activation" and i not in kept]
        buffers = [None if i in shared else self._bind(value, runtime) for i, value in enumerate(values)]
        self.activation_bytes = sum(b.nbytes for b, v in zip(buffers, values) if b is not None and v.kind == "activation")
        if not shared:
            return buffers
        life = {i: [len(self.graph.nodes), -1] for i in shared}  # [written, last read]
        for n, node in enumerate(self.graph.nodes):
            for index in node.outputs:
                if index in life:
                    life[index] = [n, n]
            for index in node.inputs:
                if index in life:
                    life[index][1] = n
        itemsize = np.dtype(runtime.dtype).itemsize
        align = ARENA_ALIGN // itemsize
        sizes = {i: -(-math.prod(values[i].dims) // align) * align for i in shared}
        placed: list[tuple[int, int, int, int]] = []  # (offset, end, written, last read), in elements
        offsets: dict[int, int] = {}
        for index in sorted(shared, key=lambda i: (-sizes[i], life[i][0])):
            first, last = life[index]
            offset = 0
            for begin, end, _, _ in sorted(p for p in placed if p[2] <= last and first <= p[3]):
                if offset + sizes[index] <= begin:
                    break
                offset = max(offset, end)
            offsets[index] = offset
            placed.append((offset, offset + sizes[index], first, last))
        arena = runtime.empty((max(end for _, end, _, _ in placed),))
        self.activation_bytes += arena.nbytes
        for index in shared:
            dims = values[index].dims
            buffers[index] = arena[offsets[index]:offsets[index] + math.prod(dims)].reshape(dims)
        return buffers

    def _bind(self, value: Value, runtime: Any) -> Any:
        if value.kind in ("param", "frozen"):
            return runtime.array(value.name)
        if value.kind == "constant":
            return runtime.place(self.graph.constants[value.name])
        return runtime.empty(value.dims)

    def _shape(self, index: int, dtype: Any) -> TensorShape:
        return TensorShape(self.graph.values[index].dims, dtype)

    def _state(self, node: Node, attrs: Any, runtime: Any, dtype: Any) -> Any:
        ins = [self._shape(i, dtype) for i in node.inputs]
        outs = [self._shape(o, dtype) for o in node.outputs]
        if node.kind == BINARY:
            state = node.module.init_kernel(runtime.handle, attrs, ins[0], ins[1], outs[0])
        elif node.kind == CONCAT:
            state = node.module.init_kernel(runtime.handle, attrs, ins, outs[0])
        elif node.kind == SPLIT:
            state = node.module.init_kernel(runtime.handle, attrs, ins[0], outs)
        else:  # conv, bn and the unary-like ops: (input_shape, output_shape)
            state = node.module.init_kernel(runtime.handle, attrs, ins[0], outs[0])
        self.node_states.append(state)
        self.states.append((node.module, state))
        if node.kind == BN:
            # One pair of running statistics per batch norm, shared by every plan (and the state_dict).
            state.running_mean, state.running_var = runtime.running[node.bn]
        return state

    def _forward_call(self, node: Node, attrs: Any, runtime: Any, dtype: Any) -> tuple[Callable[..., None], tuple]:
        state = self._state(node, attrs, runtime, dtype)
        function = getattr(node.module, runtime.prefix + "forward_kernel")
        head = (runtime.stream, runtime.handle, state, attrs)
        ins = [self.buffers[i] for i in node.inputs]
        outs = [self.buffers[o] for o in node.outputs]
        if node.kind == CONV:
            args = head + (ins[0], ins[1], ins[2] if len(ins) > 2 else None, outs[0])
        elif node.kind == BN:
            function = functools.partial(function, training=self.training)
            args = head + (ins[0], ins[1], ins[2], outs[0])
        elif node.kind == CONCAT:
            args = head + (ins, outs[0])
        elif node.kind == SPLIT:
            args = head + (ins[0], outs)
        else:  # unary-like (input, output) and binary (lhs, rhs, output)
            args = head + tuple(ins) + (outs[0],)
        return function, args

    def _compile_backward(self, outputs: Any, grad_outputs: Sequence[str], runtime: Any, dtype: Any,
                          reuse: bool) -> None:
        graph = self.graph
        values = graph.values
        # The nodes backward runs (those with an output a gradient reaches, from the given ones back) and the
        # differentiable uses of each value by them: (node, input slot).
        reached = [False] * len(values)
        for key in grad_outputs:
            for tensor in _leaves(outputs[key]):
                reached[tensor.index] = True
        active = [False] * len(graph.nodes)
        uses: list[list[tuple[int, int]]] = [[] for _ in values]
        for n in range(len(graph.nodes) - 1, -1, -1):
            node = graph.nodes[n]
            if not any(reached[o] for o in node.outputs):
                continue  # nothing downstream of this node wants a gradient
            active[n] = True
            for slot, (index, no_grad) in enumerate(zip(node.inputs, node.no_grad)):
                if not no_grad and values[index].kind in ("input", "param", "activation"):
                    uses[index].append((n, slot))
                    reached[index] = True
        grad: list[Any] = [None] * len(values)  # the gradient of each value that gets one
        given = set()  # the outputs' gradients, filled by each backward call: never shared
        for key in grad_outputs:
            for tensor in _leaves(outputs[key]):
                grad[tensor.index] = runtime.empty(tensor.dims)
                given.add(tensor.index)
        self.output_grads = {key: _structure(outputs[key], lambda t: grad[t.index]) for key in grad_outputs}

        # Gradient buffers are placed when first written and, with reuse, return to a pool (by element count)
        # after their last read: an activation's gradient after the backward of the node that wrote the
        # activation, a per-use part after its sum. A call's written buffers are taken before the buffers it
        # reads are released, so no call writes what it reads. Parameter gradients are the network's arrays;
        # the input's gradient and the outputs' are never shared.
        pool: dict[int, list[Any]] = {}

        def take(index: int, part: bool = False) -> Any:
            """A buffer for a value's gradient, or (part) for one of its terms."""
            value = values[index]
            if value.kind == "param" and not part:
                return runtime.grad(value.name)  # the network's gradient array, shared by its plans
            free = pool.get(math.prod(value.dims)) if reuse and value.kind == "activation" else None
            if free:
                return free.pop().reshape(value.dims)
            # A parameter's term in its dtype (a half network's BatchNorm parameters are float32).
            buffer = runtime.empty(value.dims, runtime.array(value.name).dtype if value.kind == "param" else None)
            self.gradient_bytes += buffer.nbytes
            return buffer

        def release(index: int, buffer: Any) -> None:
            if reuse and values[index].kind == "activation":
                pool.setdefault(buffer.size, []).append(buffer)

        parts: dict[int, list[Any]] = {}  # per value read more than once: its gradient's terms so far
        calls = self.backward_calls

        def reduce(index: int, layer: str | None) -> None:
            """Sum a value's per-use gradients (and the given one of an output also read) into its gradient
            (a call of `layer`'s)."""
            terms = ([grad[index]] if index in given else []) + parts.pop(index)
            grad[index] = take(index)
            shape = TensorShape(values[index].dims, grad[index].dtype)
            attrs = gradient_reduction.GradientReductionAttrs()
            state = gradient_reduction.init_kernel(runtime.handle, attrs, [shape] * len(terms), shape)
            self.states.append((gradient_reduction, state))
            function = getattr(gradient_reduction, runtime.prefix + "forward_kernel")
            calls.append((function, (runtime.stream, runtime.handle, state, attrs, terms, grad[index])))
            self.backward_layers.append(layer)
            for term in terms[1 if index in given else 0:]:
                release(index, term)

        for n in range(len(graph.nodes) - 1, -1, -1):
            if not active[n]:
                continue
            node = graph.nodes[n]
            for o in node.outputs:
                if o in parts:
                    reduce(o, node.layer)
                elif grad[o] is None:  # an output nothing reads (one part of a split): its gradient is zero
                    grad[o] = runtime.zeros(values[o].dims)
                    given.add(o)  # a constant: never shared
            in_grads: list[Any] = []
            for slot, index in enumerate(node.inputs):
                if (n, slot) not in uses[index]:
                    in_grads.append(None)
                elif len(uses[index]) == 1 and index not in given:
                    grad[index] = take(index)
                    in_grads.append(grad[index])
                else:
                    in_grads.append(take(index, part=True))
                    parts.setdefault(index, []).append(in_grads[-1])
            calls.append(self._backward_call(n, node, grad, in_grads, runtime))
            self.backward_layers.append(node.layer)
            for o in node.outputs:
                if o not in given:
                    release(o, grad[o])
        for index in list(parts):  # the leaves (input, parameters) read more than once: their first reader's
            reduce(index, graph.nodes[uses[index][-1][0]].layer)
        self.input_grad = next((grad[i] for i, v in enumerate(values) if v.kind == "input"), None)
        self.grads = {v.name: grad[i] for i, v in enumerate(values) if v.kind == "param" and grad[i] is not None}

    def _backward_call(self, n: int, node: Node, grad: list[Any], in_grads: list[Any],
                       runtime: Any) -> tuple[Callable[..., None], tuple]:
        state = self.node_states[n]
        function = getattr(node.module, runtime.prefix + "backward_kernel")
        head = (runtime.stream, runtime.handle, state, self.node_attrs[n])
        ins = [self.buffers[i] for i in node.inputs]
        outs = [self.buffers[o] for o in node.outputs]
        out_grads = [grad[o] for o in node.outputs]
        if node.kind == CONV:
            bias_grad = in_grads[2] if len(ins) > 2 else None
            args = head + (outs[0], out_grads[0], ins[0], in_grads[0], ins[1], in_grads[1], bias_grad)
        elif node.kind == BN:
            args = head + (outs[0], out_grads[0], ins[0], in_grads[0], ins[1], ins[2], in_grads[1], in_grads[2])
        elif node.kind == BINARY:
            args = head + (outs[0], out_grads[0], ins[0], in_grads[0], ins[1], in_grads[1])
        elif node.kind == CONCAT:
            args = head + (outs[0], out_grads[0], ins, in_grads)
        elif node.kind == SPLIT:
            args = head + (outs, out_grads, ins[0], in_grads[0])
        else:
            args = head + (outs[0], out_grads[0], ins[0], in_grads[0])
        return function, args

    def memory(self) -> dict[str, int]:
        """Bytes the plan holds beside the network's parameters and running statistics: "activations" (the
        activation buffers it made, shared ones counted once), "gradients" (gradient_bytes), "states" (the
        arrays its op states keep: pre-activations, argmax taps, saved statistics; made by a state's first
        call, so count after a forward) and "total"."""
        shared = {id(array) for array in [*self.runtime.params.values(), *self.runtime.fused_params.values()]}
        shared.update(id(array) for pair in self.runtime.running.values() for array in pair)
        seen: set[int] = set()
        states = 0
        for _, state in self.states:
            for array in _arrays(vars(state).values(), self.runtime.xp):
                if id(array) not in shared and id(array) not in seen:
                    seen.add(id(array))
                    states += array.nbytes
        result = {"activations": self.activation_bytes, "gradients": self.gradient_bytes, "states": states}
        result["total"] = sum(result.values())
        return result

    def forward(self) -> None:
        self._run(self.forward_calls, "forward")

    def backward(self) -> None:
        self._run(self.backward_calls, "backward")

    def run(self, after: bool = False, graphs: bool = False) -> None:
        """forward(), then run_after() where `after`. With `graphs` (a GPU inference plan; the network says
        when), a run after the first is a CUDA graph of the same calls: the second run captures it
        (capture(after=after)), and it and every later run replay it, one graph for each value of `after`.
        A replay does no host work per op and writes the bits the calls write (tests/test_models_graph.py)."""
        if graphs and not self.training and "forward" in self.checked:  # pragma: no cover - GPU: CUDA graphs
            graph = self.graphs.get(after)
            if graph is None:
                graph = self.graphs[after] = self.capture(after=after)
            graph.launch(self.runtime.stream.cupy_stream)
            return
        self.forward()
        if after:
            self.run_after()

    def run_after(self) -> None:
        """The network's calls after the forward (`after`: YOLOv10's detections), on the plan's buffers."""
        if self.after is not None:
            self._run(self.after.calls, "after")

    def _run(self, calls: list[tuple[Callable[..., None], tuple]], direction: str) -> None:
        """Make the calls. Their argument tuples are fixed when the plan is made (its own buffers, the
        network's parameters and gradients, never replaced), so once a run of them has passed every
        check, later runs skip the per-array checks and enter the GPU stream once (core.replaying);
        the states' checks stay."""
        if direction in self.checked:
            with core.replaying(self.runtime.stream):
                for function, args in calls:
                    function(*args)
            return
        for function, args in calls:
            function(*args)
        self.checked.add(direction)

    def capture(self, backward: bool = False, after: bool = True) -> Any:  # pragma: no cover - GPU: CUDA graphs
        """GPU: a CUDA graph (``cupy.cuda.Graph``) of this plan's forward, then (`after`) the network's calls
        after it (an eval YOLOv10's detections), and its backward when asked (training plans), captured on
        the network's stream. Run the plan once eagerly first (states make what they keep on their first
        call; the calls after the forward are run once here if they have not run yet).
        ``graph.launch(stream.cupy_stream)`` replays it: it reads the plan's input (and output-gradient)
        buffers and writes the same buffers as ``forward()``, ``run_after()`` and ``backward()`` do, with no
        host work; running statistics are updated by a training replay, ``num_batches_tracked`` is not (the
        network counts that on the host)."""
        stream = self.runtime.stream.cupy_stream
        after = after and self.after is not None
        if after and "after" not in self.checked:
            self.run_after()  # eagerly, once: what its states make on a first call is made outside the graph
        with self.runtime.active():
            stream.begin_capture()
            try:
                self.forward()
                if after:
                    self.run_after()
                if backward:
                    self.backward()
            finally:
                graph = stream.end_capture()
        return graph

    def close(self) -> None:
        """Clean up every op state of the plan (each once) and drop the buffers."""
        self.graphs = {}
        states, self.states, self.node_states = self.states, [], []
        for module, state in states:
            module.cleanup_kernel(self.runtime.handle, state)
        if self.after is not None:
            self.after.close()
            self.after = None
        self.buffers = []
        self.forward_calls = self.backward_calls = []
