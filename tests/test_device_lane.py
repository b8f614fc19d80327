"""The device lane (tests/fake_cuda.py): relmt's CUDA paths run on the CPU as if on a GPU, and each must neither
mix a CPU tensor into a CUDA op nor give other results than the CPU. Every search (beam, greedy, sampling,
n-best, constraints, prefix, an ensemble with its annotations, reference scores, continuous batching as
relmt-serve drives it), training with validation (both losses, both batch orders), init_from onto a new
vocabulary, averaging and resume. The lane's own rules are pinned first: it must catch what a GPU catches.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import pytest
import torch

from relmt.config import DecodeConfig
from relmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from relmt.decode import continuous
from relmt.decode.translator import Translator
from relmt.train import loop as loop_module
from tests import tiny_checkpoints as tiny
from tests.fake_cuda import LaneTensor, fake_cuda, on_cpu
from tests.test_train import tiny_config, train_records

SENTENCES = ["the dog saw the cat", "a small red bird sang", "alice said that bob arrived", "bob ran"]


# ---- the lane itself: what a GPU refuses, it refuses --------------------------------------------------------

def test_the_lane_says_cuda_and_keeps_the_values():
    with fake_cuda():
        x = torch.arange(6.0).view(2, 3).to("cuda")
        y = torch.ones(3, device=x.device)
        z = x * y + torch.tensor(1.0)  # a 0-d CPU tensor in a pointwise op: CUDA takes it as a scalar
        assert isinstance(z, LaneTensor) and z.device == torch.device("cuda", 0) and z.is_cuda
        assert z.sum().item() == 21.0
        assert type(z.cpu()) is torch.Tensor and z.cpu().tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
        assert x[torch.tensor([1])].tolist() == [[3.0, 4.0, 5.0]]  # CPU indices: CUDA moves them


@pytest.mark.parametrize("op", ["mask", "add", "gather", "cat", "matmul"])
def test_the_lane_refuses_a_cpu_operand_as_cuda_does(op):
    with fake_cuda():
        x = torch.zeros(4, 3, device="cuda")
        cpu = torch.zeros(4, 3)
        run = {"mask": lambda: x.masked_fill_(torch.as_tensor(True), 1.0),  # beam.py's bug of 2026-11-28
               "add": lambda: x + cpu, "gather": lambda: x.gather(1, torch.zeros(4, 1, dtype=torch.long)),
               "cat": lambda: torch.cat((x, cpu)), "matmul": lambda: x @ cpu.T}[op]
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            run()


def test_the_lane_trains_under_cuda_autocast_in_bf16():
    with fake_cuda():
        layer = torch.nn.Linear(4, 4).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = layer(torch.randn(2, 4, device="cuda"))
            loss = out.float().log_softmax(-1).sum()
        loss.backward()
        assert out.dtype == torch.bfloat16 and layer.weight.grad.dtype == torch.float32
        assert layer.weight.grad.is_cuda


def test_the_lane_counts_host_reads():
    with fake_cuda() as lane:
        x = torch.arange(5, device="cuda")
        x.sum().item()
        x[x > 2].tolist()
        x.cpu()
        x.repeat_interleave(2)  # no read: the output's size is known
        x.repeat_interleave(torch.full_like(x, 2), output_size=10)
        x.repeat_interleave(torch.full_like(x, 2))
        (x * 2).argmax()
    assert [s.op for s in lane.syncs] == ["aten._local_scalar_dense.default", "aten.index.Tensor", "tolist",
                                          "aten._to_copy.default", "aten.repeat_interleave.Tensor"]


# ---- decoding ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    d = tmp_path_factory.mktemp("lane")
    spm = tiny.toy_tokenizer(d)
    return [tiny.write_checkpoint(d, f"m{seed}.pt", spm, seed) for seed in (1, 2)]


def same(cpu, lane) -> None:
    """The same tokens and texts; floats (scores) to float32 rounding: CUDA takes its own attention route."""
    if isinstance(cpu, float):
        assert lane == pytest.approx(cpu, rel=1e-5, abs=1e-5)
    elif isinstance(cpu, (list, tuple)):
        assert type(lane) is type(cpu) and len(lane) == len(cpu), (lane, cpu)
        for a, b in zip(cpu, lane):
            same(a, b)
    elif isinstance(cpu, dict):
        assert lane.keys() == cpu.keys()
        for key in cpu:
            same(cpu[key], lane[key])
    else:
        assert lane == cpu


def both(paths, run, **kwargs):
    """run(translator) on the CPU and on the lane, in float32."""
    cpu = run(Translator.from_checkpoints(paths, device="cpu", precision="fp32", **kwargs))
    with fake_cuda():
        translator = Translator.from_checkpoints(paths, device="cuda", precision="fp32", **kwargs)
        assert translator.device.type == "cuda" and next(translator.model.parameters()).is_cuda
        lane = run(translator)
    same(cpu, lane)
    return cpu, lane


SEARCHES = {
    "beam": dict(beam=3),
    "greedy": dict(beam=1),
    "nbest": dict(beam=3, nbest=3),
    "fairseq-eos": dict(beam=2, eos_candidates="fairseq", min_len=2),
    "sampling": dict(beam=1, sampling=True, topk=5, topp=0.9, temperature=0.8, seed=3),
    "sampled-nbest": dict(beam=3, nbest=3, sampling=True, seed=4),
}


@pytest.mark.parametrize("search", list(SEARCHES))
@pytest.mark.parametrize("models", [1, 2], ids=["model", "ensemble"])
def test_every_search_runs_on_cuda_as_on_the_cpu(checkpoints, search, models):
    both(checkpoints[:models], lambda t: t.translate_nbest(SENTENCES, **SEARCHES[search]))


@pytest.mark.parametrize("models", [1, 2], ids=["model", "ensemble"])
@pytest.mark.parametrize("ordered", [False, True])
def test_prefixes_constraints_alignments_and_scores_on_cuda(checkpoints, models, ordered):
    def run(t):
        out = t.translations(SENTENCES, prefixes=["the", "", "bob", ""], constraints=[["cat"], [], ["dog", "bird"], []],
                             ordered=ordered, alignments=True, token_scores=True, beam=2, nbest=2)
        return [[(x.text, x.pieces, x.alignment, x.unmet, x.score, x.token_scores) for x in hs] for hs in out]
    both(checkpoints[:models], run)


def test_reference_scores_on_cuda(checkpoints):
    both(checkpoints[:1], lambda t: [s.logprob for s in t.score(SENTENCES, SENTENCES[::-1])])


def test_bf16_decoding_runs_on_cuda(checkpoints):
    """precision=auto on CUDA is bf16 autocast: the search runs (its outputs may differ from float32's)."""
    with fake_cuda():
        t = Translator.from_checkpoint(checkpoints[0], device="cuda")
        assert t.autocast_dtype == torch.bfloat16
        out = t.translations(SENTENCES, prefixes=["the", "", "", ""], constraints=[[], ["cat"], [], []],
                             alignments=True, token_scores=True)
    assert len(out) == len(SENTENCES)


def test_continuous_batching_on_cuda_as_relmt_serve_drives_it(checkpoints):
    """Sentences join a running search at steps 0, 1 and 3 (relmt/decode/continuous.py, as serve/stream.py
    steps it); each gets what the CPU gives it."""
    cfg = DecodeConfig(beam=3, nbest=2, max_len_a=1.0, max_len_b=6)

    def run(t):
        tok = t.tokenizer
        ids = tok.encode(SENTENCES)
        pad, bos, eos = PAD_ID, BOS_ID, EOS_ID
        schedule = {0: [0], 1: [1, 2], 3: [3]}
        run, out, step = None, {}, 0
        while len(out) < len(SENTENCES):
            if step in schedule:
                rows = [ids[i] + [eos] for i in schedule[step]]
                src = torch.full((len(rows), max(map(len, rows))), pad, device=t.device)
                for r, x in enumerate(rows):
                    src[r, : len(x)] = torch.tensor(x, device=t.device)
                new = continuous.start(t.model, src, schedule[step], cfg, bos)
                run = continuous.join(run, new, pad)
            if run is not None:
                run, finished = continuous.advance(t.model, run, cfg, bos, eos)
                out.update(finished)
            step += 1
        return {k: [(h.tokens, h.score) for h in v] for k, v in sorted(out.items())}
    both(checkpoints[:1], run)


def test_on_cpu_unwraps():
    with fake_cuda():
        x = torch.ones(2, device="cuda")
        assert type(on_cpu(x)) is torch.Tensor


# ---- training ----------------------------------------------------------------------------------------------

SMALL = ("data.toy.n_valid=6", "data.toy.n_test=4", "data.toy.n_test_long=4")  # decoding on the lane is slow


def lane_config(root, run, *overrides):
    return tiny_config(root, run, *SMALL, *overrides)


def lane_train(cfg):
    with fake_cuda() as lane:
        metrics = loop_module.train(cfg)
    return metrics, lane


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("lane_train")


# the two losses and the two batch orders, each met once; validation decodes (BLEU) at every eval
RUNS = {"whole-source": ("train.output_loss=whole", "train.batch_by=source"),
        "chunked-longest": ("train.output_loss=chunked", "train.batch_by=longest")}


NO_DROPOUT = ("model.dropout=0", "model.attention_dropout=0", "model.activation_dropout=0")  # CUDA draws its own


@pytest.mark.parametrize("run", list(RUNS))
def test_training_with_validation_on_cuda_as_on_the_cpu(root, run):
    """relmt-train on CUDA in float32: every update's loss is the CPU's to float32 rounding (the CPU trains its
    linear maps through oneDNN, CUDA through cuBLAS's stand-in), validation decodes, the last checkpoints are
    averaged and the test sets decoded from the average."""
    settings = (*RUNS[run], "train.precision=fp32", "train.average_last=2", "train.test_checkpoint=averaged",
                *NO_DROPOUT)
    cpu = loop_module.train(lane_config(root, f"{run}-cpu", *settings, "train.device=cpu"))
    lane, seen = lane_train(lane_config(root, f"{run}-lane", *settings, "train.device=cuda"))
    assert lane["status"] == cpu["status"] == "completed" and seen.syncs  # it ran on the lane
    a, b = train_records(root / f"{run}-cpu"), train_records(root / f"{run}-lane")
    assert sorted(a) == sorted(b) == list(range(1, 7))
    for step in a:
        assert b[step]["loss"] == pytest.approx(a[step]["loss"], rel=1e-4), step
    assert (root / f"{run}-lane/checkpoints/averaged.pt").is_file()
    valid = train_records(root / f"{run}-lane", "valid")
    assert sorted(valid) == [3, 6] and all("bleu" in r for r in valid.values())


def test_bf16_training_and_an_exact_resume_on_cuda(root):
    """precision=auto on CUDA trains in bf16; a run stopped at update 4 and resumed equals the uninterrupted run
    at every update (RNG, data position and optimizer restored onto the device), dropout on."""
    common = ("train.device=cuda", "train.save_every=4", "train.eval_every=4", "model.dropout=0.1",
              "train.valid_bleu=false")
    lane_train(lane_config(root, "full", *common, "train.max_steps=8"))
    lane_train(lane_config(root, "split", *common, "train.max_steps=4"))
    lane_train(lane_config(root, "split", *common, "train.max_steps=8", "train.resume=true"))
    a, b = train_records(root / "full"), train_records(root / "split")
    assert sorted(a) == sorted(b) == list(range(1, 9))
    assert [a[s]["loss"] for s in a] == [b[s]["loss"] for s in a]


def test_init_from_onto_a_new_vocabulary_on_cuda(root):
    """A checkpoint trained with one vocabulary seeds a CUDA run with another (relmt/train/init.py)."""
    loop_module.train(lane_config(root, "source", "train.max_steps=2", "train.valid_bleu=false",
                                  "train.device=cpu"))
    metrics, _ = lane_train(lane_config(root, "tuned", "train.max_steps=1", "train.valid_bleu=false",
                                        "train.device=cuda", f"train.init_from={root / 'source/checkpoints/last.pt'}",
                                        "data.vocab_size=60"))
    assert metrics["status"] == "completed" and metrics["init_from"]["vocabulary"]["rows"] == 60


@dataclass
class Update:
    """What one update of a training run on the lane did, from the start of its train_step to the next one's: the
    batch's transfer, forward, loss, backward, gradient scaling and clipping, the optimizer's step."""

    reads: list  # the host reads (the lane's Syncs)
    ops: collections.Counter  # aten op (its overload packet's name, "clone") -> calls on the lane


_UPDATES: dict[str, list[Update]] = {}


def lane_updates(root, loss: str) -> list[Update]:
    """Updates 1 to 3 of a tiny run on the lane in bf16 (precision=auto on CUDA): two micro-batches each, none
    logging, validating or saving (train.output_loss=`loss`). Run once per process and loss: the host reads here,
    the copies in tests/test_gpu_costs.py."""
    if loss in _UPDATES:
        return _UPDATES[loss]
    starts: list[int] = []
    spans: list[collections.Counter] = []
    real = loop_module.train_step

    def train_step(*args, **kwargs):
        starts.append(len(lane.syncs))
        spans.append(collections.Counter())
        return real(*args, **kwargs)

    def on_op(func, args, kwargs, out):
        if spans:
            spans[-1][str(func.overloadpacket).removeprefix("aten.")] += 1

    cfg = lane_config(root, f"updates-{loss}", "train.device=cuda", "train.max_steps=4", "train.update_freq=2",
                      "train.log_every=100", "train.eval_every=100", "train.save_every=100",
                      f"train.output_loss={loss}", "train.valid_bleu=false")
    with pytest.MonkeyPatch.context() as mp, fake_cuda() as lane:
        mp.setattr(loop_module, "train_step", train_step)
        lane.on_op = on_op
        loop_module.train(cfg)
    _UPDATES[loss] = [Update(lane.syncs[a:b], ops) for a, b, ops in zip(starts, starts[1:], spans)]
    return _UPDATES[loss]


@pytest.mark.parametrize("loss", ["whole", "chunked"])
def test_an_update_reads_the_device_once(root, loss):
    """Each host read stalls a GPU. Between the starts of two updates that neither log, validate nor save, relmt
    reads the device once (the ceiling `device_reads_per_update` in scripts/gpu/ceilings.json): the losses and the
    gradient norm together, for the skip of a NaN/inf update (two micro-batches here; the token counts are taken on
    the host)."""
    from tests.test_gpu_costs import ceiling

    updates = lane_updates(root, loss)
    assert len(updates) == 3
    assert all(len(u.reads) <= ceiling("device_reads_per_update") for u in updates), [u.reads for u in updates]


def test_the_roofline_estimate_traces_cuda_steps_with_shapes_alone():
    """scripts/gpu/roofline.py: a base bf16 step under the lane with meta data (no values), each op's FLOPs and
    bytes; rel's sums per label take the product, not scans, and cost more than abs."""
    from tests.scripts_import import load_script

    roof = load_script("roofline")
    abs_ops, rel_ops = (roof.step_ops(p, 16, 12, 10, 1000, 4) for p in ("abs", "rel"))
    names = {o["op"] for o in rel_ops}
    assert "bmm" in names and "cumsum" not in names
    a, r = (roof.roofline(ops, 790e12, 4.3e12) for ops in (abs_ops, rel_ops))
    assert 0 < a["ms"] < r["ms"] and r["flops"] > a["flops"] > 0
    assert any(o["op"] == "sdpa_fused_fwd" for o in abs_ops)  # fused attention counted as one kernel
