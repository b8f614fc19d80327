"""The whole search in one compiled call for engine=aoti (issue 76 §1): relmt.export.graphs.LoopGraph compiled by
AOTInductor with the loop body's weights as constants.

torch.export passes the weights a while_loop's body multiplies by into the body as operands, and inductor lowers the
body as a graph of its own whose inputs they are. A GEMM by an input is ATen's `addmm` on the plain weight, where a
graph's constant weights get oneDNN's prepacked products and, at a few rows, inductor's own GEMM template (which
search_small.pt2 runs, and which takes only a constant weight: torch/_inductor/utils.py, use_cpp_gemm_template).
Compiled so, the loop ran at 0.64-0.77x a call per step (docs/results/engines/search_loop.md).

`body_constants()`, around the compile, lowers each body input that the parent graph passes from one of its frozen
constants as that constant itself, and lets the body's graph register constants in the parent's table (the C++
wrapper inlines the body into the parent's code, and AOTInductor stores the parent's constants): the body's GEMMs
then get what the per-step graph's get, the template's prepacked weights at a few rows. The body input stays
declared (the wrapper binds the loop's operands to the body's inputs by position) and goes unused. Where this torch's
inductor lacks what it changes, the compile goes on without it: the loop is then slower, not different.
"""

from __future__ import annotations

import contextlib

import torch

SHARED = ("constants", "allocated_constant_name", "constant_reprs", "named_buffers", "named_parameters")


@contextlib.contextmanager
def body_constants():
    """Inside it, an AOTInductor compile lowers a while_loop body's inputs that are the parent graph's frozen
    constants as those constants (the module's docstring)."""
    try:
        from torch._inductor import ir
        from torch._inductor.graph import SubgraphLowering
    except ImportError:
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
