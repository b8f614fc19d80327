"""Prepacked GEMMs inside a compiled while_loop (issue 76 §1), for scripts/bench/search_loop.py --packed: LoopGraph's
step multiplies by oneDNN's packed weights, as SearchGraph's compiled step does.

Inductor's freezing packs a linear map's weight for oneDNN only where the weight is a constant of the graph that
multiplies by it. torch.export passes a while_loop's weights into its body as operands, so the body's GEMMs stayed
ATen's `addmm` of plain weights (1.7-1.9x slower at a few rows in docs/results/engines/small_rows_gemm.md).
`packed_loop_weights()`, around an AOTInductor compile, does what freezing does for the body: each frozen float32
weight that the body uses in a linear map (`addmm(bias, x, W.T)`, `mm(x, W.T)`) is packed once in the parent graph
(`mkldnn._reorder_linear_weight`, a constant there) and passed to the body, which multiplies by it with
`mkldnn._linear_pointwise`; a weight the body also reads otherwise (the tied embedding) comes in twice, plain and
packed. Inductor lowers `_linear_pointwise` only for a constant weight (mkldnn_lowerings.py asserts it), so the
compile lowers it as the same extern kernel for an operand. Its pattern passes are off for the compile: their fused
kernels, built inside the body, fail the parent graph's fake-tensor update of the loop.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch.fx import GraphModule, Node

aten = torch.ops.aten
ROWS = 4  # the rows oneDNN's packed layout is chosen for: one sentence at beam 4


def linear_uses(p: Node) -> tuple[list[tuple[Node, Node]], bool]:
    """The (transpose, linear) node pairs through which the body's operand p is a linear map's weight, and whether
    it has other uses."""
    pairs, other = [], False
    for t in p.users:
        uses = []
        if t.op == "call_function" and t.target is aten.permute.default and list(t.args[1]) == [1, 0]:
            for lin in t.users:
                if lin.target is aten.addmm.default and lin.args[2] is t and not lin.kwargs:
                    uses.append((t, lin))
                elif lin.target is aten.mm.default and lin.args[1] is t:
                    uses.append((t, lin))
                else:
                    uses = []
                    break
        if uses:
            pairs += uses
        else:
            other = True
    return pairs, other


def pack_loop_weights(gm: GraphModule, rows: int = ROWS) -> int:
    """Pack the frozen weights that `gm`'s while_loops multiply by (see the module's docstring); their number."""
    mkldnn, packed = torch.ops.mkldnn, 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.higher_order.while_loop:
            continue
        cond_node, body_node, carried, extra = node.args
        body, cond = getattr(gm, body_node.target), getattr(gm, cond_node.target)
        body_in = [n for n in body.graph.nodes if n.op == "placeholder"][len(carried):]
        cond_in = [n for n in cond.graph.nodes if n.op == "placeholder"][len(carried):]
        operands = list(extra)
        for i, a in enumerate(extra):
            if not (isinstance(a, Node) and a.op == "get_attr"):
                continue
            value = functools.reduce(getattr, a.target.split("."), gm)
            if not (isinstance(value, torch.Tensor) and value.dim() == 2 and value.dtype == torch.float32):
                continue
            pairs, other = linear_uses(body_in[i])
            if not pairs:
                continue
            name = f"_loop_packed_{packed}"
            gm.register_buffer(name, mkldnn._reorder_linear_weight(value, rows))
            with gm.graph.inserting_before(node):
                pack = gm.graph.get_attr(name)
            pack.meta.update(a.meta)
            pack.meta["val"] = a.meta["val"].new_empty(value.shape)  # read as given: never copied to other strides
            if other:  # the plain weight stays for its other uses, and the packed one comes in beside it
                operands.append(pack)
                added = []
                for sub in (body, cond):
                    last = [n for n in sub.graph.nodes if n.op == "placeholder"][-1]
                    with sub.graph.inserting_after(last):
                        added.append(sub.graph.placeholder(f"{last.target}_packed"))
                    added[-1].meta["val"] = pack.meta["val"]
                weight = added[0]
            else:
                operands[i] = pack
                weight = body_in[i]
                weight.meta["val"] = cond_in[i].meta["val"] = pack.meta["val"]
            for _, lin in pairs:
                x, bias = (lin.args[1], lin.args[0]) if lin.target is aten.addmm.default else (lin.args[0], None)
                with body.graph.inserting_before(lin):
                    new = body.graph.call_function(mkldnn._linear_pointwise.default, (x, weight, bias, "none", [], ""))
                new.meta.update(lin.meta)
                lin.replace_all_uses_with(new)
                body.graph.erase_node(lin)
            for t in {t for t, _ in pairs}:
                if not t.users:
                    body.graph.erase_node(t)
            packed += 1
        node.args = (cond_node, body_node, carried, tuple(operands))
        body.recompile()
        cond.recompile()
    gm.graph.lint()
    gm.recompile()
    return packed


def linear_of_operand(x, w, b, attr, scalars, algorithm, layout=None):
    """Inductor's lowering of mkldnn._linear_pointwise (mkldnn_lowerings.py's linear_unary, its ATen choice) for a
    packed weight that is an operand, not a constant: the packed weight is passed as it is (oneDNN's layout)."""
    from torch._inductor import mkldnn_ir
    from torch._inductor.ir import FixedLayout, TensorBox
    from torch._inductor.lowering import view

    kernel = mkldnn_ir.LinearUnary
    size = x.get_size()
    if len(size) > 2:
        x = view(x, [-1, size[-1]])
    x, w = kernel.require_contiguous(kernel.realize_input(x)), kernel.realize_input(w)
    inputs, constant_args = [x, w], [attr, scalars if scalars else [-1], algorithm]
    if b is not None:
        inputs.append(kernel.require_contiguous(kernel.realize_input(b)))
    else:
        constant_args.insert(0, None)
    layout = FixedLayout(device=x.get_device(), dtype=x.get_dtype(), size=[*x.get_size()[:-1], w.get_size()[0]])
    out = TensorBox.create(mkldnn_ir._create_output_node(kernel(layout=layout, inputs=inputs,
                                                                constant_args=constant_args)))
    return view(out, (*size[:-1], out.get_size()[-1])) if len(size) > 2 else out


@contextlib.contextmanager
def packed_loop_weights():
    """Inside it, an AOTInductor compile with freezing packs its while_loops' weights (the module's docstring); the
    inductor configs to compile with."""
    import torch._inductor.freezing as freezing
    from torch._inductor.lowering import lowerings

    op = torch.ops.mkldnn._linear_pointwise.default
    passes, lowering = freezing.freezing_passes, lowerings[op]

    def with_loops(gm, example_inputs):
        passes(gm, example_inputs)
        if pack_loop_weights(gm):
            freezing.constant_fold(gm)

    freezing.freezing_passes, lowerings[op] = with_loops, linear_of_operand
    try:
        yield {"pattern_matcher": False}
    finally:
        freezing.freezing_passes, lowerings[op] = passes, lowering
