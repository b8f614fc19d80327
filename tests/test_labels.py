"""relmt/model/labels.py: CUDA's sums per label, without scatter_add's atomics, equal scatter_add's, and the gather
whose gradient they give equals torch's gather in value and gradient (float64 on the CPU, the sums forced)."""

from __future__ import annotations

import pytest
import torch

from relmt.config import ModelConfig
from relmt.model import labels
from relmt.model.positions import relative_index
from relmt.model.transformer import build_model
from tests import test_incremental as inc

# (n, m, k, q_offset): a full pass, k past the length, k 1 and 0, a block of rows (chunked route), a
# decoder chunk after a prefix, one decoding step, and more rows than keys
SHAPES = [(7, 7, 3, 0), (5, 5, 9, 0), (6, 6, 1, 0), (4, 4, 0, 0), (3, 9, 2, 4), (4, 10, 3, 6), (1, 8, 3, 7),
          (6, 3, 2, 0)]


def scatter(x: torch.Tensor, index: torch.Tensor, k: int) -> torch.Tensor:
    return x.new_zeros(*x.shape[:-1], 2 * k + 1).scatter_add_(-1, index.expand_as(x), x)


@pytest.mark.parametrize("n,m,k,q_offset", SHAPES)
def test_sums_without_atomics_equal_scatter_add(n, m, k, q_offset):
    torch.manual_seed(n * 100 + m * 10 + k)
    x = torch.randn(2, 3, n, m, dtype=torch.float64)
    index = relative_index(n, m, k, q_offset)
    got = labels._sum_without_atomics(x, k, q_offset)
    torch.testing.assert_close(got, scatter(x, index, k), rtol=1e-12, atol=1e-12)
    # bf16 values are summed in float32 and rounded once: as close as one rounding of the exact sums
    low = labels._sum_without_atomics(x.bfloat16(), k, q_offset)
    exact = scatter(x.bfloat16().double(), index, k)
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.double(), exact, rtol=2 ** -8, atol=1e-6)


def scan_sums(x: torch.Tensor, k: int, q_offset: int) -> torch.Tensor:
    """The sums as CUDA took them until 2026-11-28: the band gathered, each tail from a prefix or suffix scan."""
    n, m = x.shape[-2:]
    if k == 0:
        return x.sum(-1, keepdim=True)
    lead = x.shape[:-1]
    i = torch.arange(q_offset, q_offset + n)[:, None]
    j = i + torch.arange(-k + 1, k)
    band = x.gather(-1, j.clamp(0, m - 1).expand(*lead, 2 * k - 1)).masked_fill((j < 0) | (j >= m), 0)
    last, first = i - k, i + k
    lower = x.cumsum(-1).gather(-1, last.clamp(0, m - 1).expand(*lead, 1)).masked_fill(last < 0, 0)
    upper = x.flip(-1).cumsum(-1).gather(-1, (m - 1 - first.clamp(0, m - 1)).expand(*lead, 1))
    return torch.cat((lower, band, upper.masked_fill(first > m - 1, 0)), dim=-1)


@pytest.mark.parametrize("n,m,k,q_offset", SHAPES)
def test_the_product_with_the_tail_masks_equals_the_scans_it_replaced(n, m, k, q_offset):
    """float64, a non-contiguous input too (a slice of a wider row, as a chunked block may hand it)."""
    torch.manual_seed(n * 7 + m + k)
    x = torch.randn(2, 3, n, m + 2, dtype=torch.float64)[..., 1:-1]
    torch.testing.assert_close(labels._sum_without_atomics(x, k, q_offset), scan_sums(x, k, q_offset),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n,m,k,q_offset", SHAPES)
def test_the_gather_sums_its_gradient_per_label_without_atomics(n, m, k, q_offset):
    torch.manual_seed(n + m + k)
    index = relative_index(n, m, k, q_offset)
    r = torch.randn(2, 3, n, 2 * k + 1, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 3, n, m, dtype=torch.float64)
    got = labels._GatherLabels.apply(r, index, k, q_offset)
    want = r.gather(-1, index.expand(2, 3, n, m))
    assert torch.equal(got, want)
    (g_got,) = torch.autograd.grad((got * w).sum(), r)
    (g_want,) = torch.autograd.grad((want * w).sum(), r)
    torch.testing.assert_close(g_got, g_want, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda t: labels._GatherLabels.apply(t, index, k, q_offset), (r,))


@pytest.mark.parametrize("mode", ["rel", "both", "rel-keys-only", "rel-values-only", "rel-shared-heads"])
def test_a_model_trains_and_decodes_alike_with_the_sums_of_either_device(mode, monkeypatch):
    """The whole model, float64: logits and every gradient with the atomic-free sums (CUDA's) equal those with
    scatter_add (the CPU's), and cached decoding with them equals the full pass."""
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, encoder_layers=2, decoder_layers=2, dropout=0.0,
                      attention_dropout=0.0, activation_dropout=0.0, **inc.MODES[mode])
    torch.manual_seed(0)
    net = build_model(cfg, inc.V, inc.PAD).double().train()
    src, tgt = inc.batch()
    results = []
    for forced in (False, True):
        monkeypatch.setattr(labels, "atomic_free", lambda t, forced=forced: forced)
        logits = net(src, tgt)
        results.append([logits, *torch.autograd.grad(logits.pow(2).mean(), list(net.parameters()))])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    net.eval()
    with torch.no_grad():
        memory, src_mask = net.encode(src)
        inc.run_steps(net, tgt, memory, src_mask, None, 0, tgt.shape[1])


@pytest.mark.gpu
def test_on_cuda_the_sums_go_without_atomics_and_equal_scatter_add():
    torch.manual_seed(0)
    x = torch.randn(4, 8, 33, 33, device="cuda")
    index = relative_index(33, 33, 16, 0, torch.device("cuda"))
    assert labels.atomic_free(x)
    torch.testing.assert_close(labels.sum_labels(x, index, 16, 0), scatter(x, index, 16), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["rel", "rel-shared-heads"])
def test_a_cuda_step_takes_no_scan(mode, monkeypatch):
    """Forward and backward of a rel model with CUDA's sums: no cumsum (a scan over (B, H, n, m): 113 ms of the
    H200's 471 ms step) and no flip; the tails are a bmm. (The band's gather still has scatter_add as its
    gradient: one key per address, so no atomic waits on another.)"""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        seen: set = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    monkeypatch.setattr(labels, "atomic_free", lambda t: True)
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1, dropout=0.0,
                      attention_dropout=0.0, activation_dropout=0.0, **inc.MODES[mode])
    net = build_model(cfg, inc.V, inc.PAD).train()
    src, tgt = inc.batch()
    with Ops() as ops:
        net(src, tgt).pow(2).mean().backward()
    assert "bmm" in ops.seen and not ops.seen & {"cumsum", "flip"}, " ".join(sorted(ops.seen))


def test_bench_label_sums_runs_and_checks_each_variant(tmp_path, monkeypatch):
    """scripts/bench/bench_label_sums.py (the GPU call's labels phase) on a small shape: every variant equals
    scatter_add in float64 before it is timed, and the JSON names each."""
    import json
    import sys

    from tests.scripts_import import load_script

    bench = load_script("bench_label_sums")
    monkeypatch.setattr(bench, "SHAPES", {"small": (2, 2, 12, 12)})
    monkeypatch.setattr(sys, "argv", ["bench_label_sums.py", "--device", "cpu", "--shapes", "small", "--k", "3",
                                      "--repeats", "1", "--out", str(tmp_path / "s.json")])
    bench.main()
    rows = json.loads((tmp_path / "s.json").read_text())["rows"]
    assert [r["variant"] for r in rows] == ["product", "masked", "scans", "scatter_add"]


@pytest.mark.parametrize("autocast", [False, True])
def test_on_cuda_the_tails_accumulate_in_float32_whatever_autocast_says(autocast):
    """Under the device lane, bf16 values (a training step's, under bf16 autocast or not): every matrix product of
    the sums writes float32 (the accumulation cuBLAS's reduced-precision flag cannot move to bf16), and the sums
    are the float64 sums of the same bf16 values rounded once. Long rows (m = 1024, tails of ~1,000 keys) make a
    bf16 accumulation miss by far more than one rounding."""
    from tests.fake_cuda import fake_cuda, on_cpu

    n, m, k = 6, 1024, 4
    torch.manual_seed(0)
    x = torch.rand(2, 3, n, m).bfloat16()  # positive: a tail's sum grows to ~500, where a bf16 step is 2 or 4
    index = relative_index(n, m, k, 0)
    products = []
    with fake_cuda() as lane:
        lane.on_op = lambda func, args, kwargs, out: (
            products.append((str(func), out.dtype)) if func.overloadpacket in (torch.ops.aten.bmm,
                                                                              torch.ops.aten.mm) else None)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            got = on_cpu(labels.sum_labels(x.cuda(), index.cuda(), k, 0))
    assert products and all(dtype == torch.float32 for _, dtype in products), products
    exact = scatter(x.double(), index, k)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), exact, rtol=2 ** -8, atol=1e-6)


@pytest.mark.gpu
def test_on_cuda_bf16_tails_are_summed_in_float32_with_reduced_precision_reductions_allowed():
    """The flag that lets cuBLAS reduce bf16 products partly in bf16 is on (its default): the sums still equal the
    float64 sums of the same values within one bf16 rounding. (The flag is set and restored by hand: cuBLAS's
    settings module is no plain object, and monkeypatch's undo deleted the attribute; the rehearsal found it.)"""
    matmul = torch.backends.cuda.matmul
    old, matmul.allow_bf16_reduced_precision_reduction = matmul.allow_bf16_reduced_precision_reduction, True
    try:
        torch.manual_seed(0)
        n, m, k = 64, 4096, 16
        x = torch.rand(8, 8, n, m, device="cuda").bfloat16()
        index = relative_index(n, m, k, 0, torch.device("cuda"))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            got = labels.sum_labels(x, index, k, 0)
    finally:
        matmul.allow_bf16_reduced_precision_reduction = old
    exact = scatter(x.double(), index, k)
    torch.testing.assert_close(got.double(), exact, rtol=2 ** -8, atol=1e-6)
