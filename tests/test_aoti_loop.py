"""relmt/export/aoti_loop.py's body_constants (issue 76 §1): a compiled while_loop's body multiplies by the parent
graph's frozen weights as constants, so inductor's GEMM template with prepacked weights runs its products, not
ATen's addmm and mm of weights passed in as operands, and the loop gives the eager module's result."""

from __future__ import annotations

import zipfile

import pytest
import torch


class Loop(torch.nn.Module):
    """Two linear maps in a while_loop's body, one of them by a weight the body also reads otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32, bias=False)

    def forward(self, x, n):
        from torch._higher_order_ops.while_loop import while_loop

        def body(x, i):
            return torch.tanh(self.b(self.a(x))) + self.b.weight.sum(0), i + 1

        return while_loop(lambda x, i: i < n, body, (x, torch.zeros((), dtype=torch.long)))[0]


def code_of(path) -> str:
    with zipfile.ZipFile(path) as package:
        return "".join(package.read(f).decode(errors="ignore") for f in package.namelist() if f.endswith(".cpp"))


@pytest.mark.parametrize("constants", [False, True])
def test_the_loop_body_multiplies_by_constant_weights(constants, tmp_path):
    from torch._inductor.graph import SubgraphLowering

    from relmt.export.aoti import SMALL_CONFIGS, compile_graph, flat_call
    from relmt.export.aoti_loop import body_constants

    torch.manual_seed(0)
    model, x, n = Loop().eval(), torch.randn(4, 32), torch.tensor(3)
    before = SubgraphLowering.__init__, SubgraphLowering.placeholder
    with torch.no_grad():
        if constants:
            with body_constants():
                compile_graph(model, (x, n), None, tmp_path / "loop.pt2", SMALL_CONFIGS)
        else:
            compile_graph(model, (x, n), None, tmp_path / "loop.pt2", SMALL_CONFIGS)
    assert (SubgraphLowering.__init__, SubgraphLowering.placeholder) == before
    code = code_of(tmp_path / "loop.pt2")
    aten = code.count("aoti_torch_cpu_addmm_out(") + code.count("aoti_torch_cpu_mm_out(")
    # without the constants both products are ATen's calls; with them, inductor's template (no ATen GEMM)
    assert aten == (0 if constants else 2)
    with torch.no_grad():
        assert torch.allclose(flat_call(tmp_path / "loop.pt2")(x, n)[0], model(x, n), atol=1e-5)
