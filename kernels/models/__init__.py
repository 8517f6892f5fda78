"""Models built from the kernels' op calls: YOLOv10 (every variant), inference and a training step.

A model compiles a plan per (input shape, mode) on its first call: the op states made once, every
buffer allocated once, each call's arguments fixed. See docs/models.md.
"""

from . import parallel
from .graph import Graph, Plan, Tensor
from .network import Network, Registry, StateDictError
from .yolov10 import VARIANTS, YOLOv10

__all__ = ["YOLOv10", "VARIANTS", "StateDictError", "Network", "Registry", "Graph", "Plan", "Tensor", "parallel"]
