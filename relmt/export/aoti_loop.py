"""The whole search in one compiled call for engine=aoti (issue 76 §1): relmt.export.graphs.LoopGraph compiled by
AOTInductor with the loop body's weights as constants.

torch.export passes the weights a while_loop's body multiplies by into the body as operands, and inductor lowers the
body as a graph of its own whose inputs they are. A GEMM by an input is ATen's `addmm`: the unpacked library call,
which on an AMD host runs MKL's generic path at a few rows (1.8-2.6x slower than oneDNN's prepacked product in
scripts/bench/search_loop.py's GEMM table), and inductor's own GEMM template, which search_small.pt2 runs, takes only
a constant weight (torch/_inductor/utils.py: use_cpp_gemm_template). So the loop was 0.70-0.77x as fast as a call
per step (docs/results/engines/search_loop.md).

`body_constants()`, around the compile, lowers each body input that the parent graph passes from one of its frozen
constants as that constant itself, and lets the body's graph register constants in the parent's table (the C++
wrapper inlines the body into the parent's code, and AOTInductor stores the parent's constants): the body's GEMMs
then get what the per-step graph's get, the template's prepacked weights at a few rows. The body input stays
declared (the wrapper binds the loop's operands to the body's inputs by position) and goes unused. Where this torch's
inductor lacks what it changes, the compile goes on without it: the loop is then slower, not different.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from relmt.export.graphs import LoopGraph, loop_examples
from relmt.model.transformer import Transformer

SHARED = ("constants", "allocated_constant_name", "constant_reprs", "named_buffers", "named_parameters")


@contextlib.contextmanager
def body_constants():
    """Inside it, an AOTInductor compile lowers a while_loop body's inputs that are the parent graph's frozen
    constants as those constants (the module's docstring)."""
    try:
        from torch._inductor import ir
        from torch._inductor.graph import GraphLowering, SubgraphLowering
    except ImportError:
        yield
        return
    if not all(hasattr(GraphLowering, name) for name in ("placeholder", "__init__")):
        yield
        return
    init, placeholder = SubgraphLowering.__init__, SubgraphLowering.placeholder

    def shared_init(self, parent, *args, **kwargs):
        init(self, parent, *args, **kwargs)
        for name in SHARED:
            if hasattr(parent, name):
                setattr(self, name, getattr(parent, name))
        self.relmt_operands = list(kwargs.get("example_inputs") or [])  # the parent's nodes, in the body's order

    def constant_placeholder(self, target, args, kwargs):
        position = self.placeholder_idx + 1  # the index GraphLowering.placeholder gives this input
        lowered = placeholder(self, target, args, kwargs)
        operands = getattr(self, "relmt_operands", [])
        node = operands[position] if position < len(operands) else None
        if isinstance(node, torch.fx.Node) and node.op == "get_attr":
            value = self.parent.env.get(node)
            if isinstance(value, ir.TensorBox) and isinstance(value.data, ir.StorageBox) and \
                    isinstance(value.data.data, ir.ConstantBuffer):
                return value
        return lowered

    SubgraphLowering.__init__, SubgraphLowering.placeholder = shared_init, constant_placeholder
    try:
        yield
    finally:
        SubgraphLowering.__init__, SubgraphLowering.placeholder = init, placeholder


def compile_loop(model: Transformer, path: str | Path, configs: dict | None = None) -> float:
    """LoopGraph of `model` exported and compiled into the package `path` as engine=aoti compiles its graphs, with
    the body's weights as constants (`body_constants`) and `configs` besides; the seconds it took."""
    from relmt.export.aoti import compile_graph

    example, dims = loop_examples(model)
    with body_constants():
        return compile_graph(LoopGraph(model).eval(), example, dims, path, configs)
