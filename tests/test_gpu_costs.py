"""GPU costs that `make test` measures on the CPU, each held to a committed ceiling (scripts/gpu/ceilings.json;
issue 73 §2): a change that would make a GPU slower fails here, on a machine without one (a GPU is lent rarely).
Every check runs relmt's CUDA code paths under the device lane (tests/fake_cuda.py) and counts what a GPU would do.

- `roofline_rel_over_abs`: a base bf16 training step's roofline time with relative positions over the absolute
  ones' (scripts/gpu/roofline.py at its default shape and peaks, BASE_STEP and PEAKS), and no scan op in rel's
  step. Guards against the memory traffic of Shaw's terms growing, e.g. the label sums' tails taken by cumsum
  scans again (relmt/model/labels.py: 113 ms of rel's 471 ms step on an H200 until 2026-11-28). A roofline counts
  a scan's bytes but not its serial depth (the scans put rel / abs at 1.2506 here, barely over the ceiling), so
  the scan ops are also refused by name. The full default shape is traced, with shapes alone, in about 3 s.
- `device_reads_per_update`: the host reads (`lane.syncs`) between the starts of two training updates, each a
  stall of the GPU. The check is tests/test_device_lane.py::test_an_update_reads_the_device_once (both losses),
  which reads its ceiling from the same file; guards against an `.item()`, a `bool()` of a tensor or a
  data-dependent shape sneaking into the training loop.
- `copies_per_update` and `copies_per_decoding_step`: the ops that copy tensor data (`COPIES`, below) in one
  update of a tiny bf16 run (both losses; tests/test_device_lane.py's `lane_updates`, from the start of one
  train_step to the next: the batch's transfer, forward, loss, backward, clipping, Adam) and in one step of
  relmt's cached beam search in bf16 (from the start of one `decode_step` to the next: the decoder step, beam_step,
  the cache's reordering; the steps after the first, none of which finishes a sentence). Guards against an extra
  clone, cast, `contiguous()` or cache copy in the loops a GPU runs thousands of times. Counted as the lane runs
  the ops: scaled_dot_product_attention there is torch's math decomposition, whose copies count (a constant per
  call; a GPU runs one fused kernel). The lane's autocast casts a weight at every use; CUDA's casts it once per
  autocast region and keeps it. In training the two agree (a forward is one region and uses each weight once),
  but a whole search is one region, so CUDA casts each weight once per search, and a decoding step's casts of
  weights are not counted.
- `nn_tensors_in_chunked_route`: tensors whose last two dimensions reach the (n, n) of self-attention, in one
  forward and backward of a rel model on the chunked route (relmt/model/chunked.py) at a length of five blocks.
  Guards the route's one promise, no (B, H, n, m) tensor alive (forward, the checkpointed recomputation, or
  backward), whose loss is an out-of-memory on a GPU, not a failed test elsewhere.

What counts as a copy (`COPIES`): an op whose output is its inputs' elements, unchanged or only cast, moved to new
memory: copy_, clone (which contiguous() and a reshape of a non-contiguous tensor run as), _to_copy (.to(): a
device transfer or a cast, autocast's included), cat, stack, the reads at indices (index_select, gather,
advanced indexing, embedding, take) and writes at indices (index_put_, index_copy_, masked_scatter), repeat,
flip, roll, constant_pad_nd, and the gradients of views that autograd writes into zeros (slice_backward,
select_backward, the *_scatter ops). Elementwise selections (where, masked_fill), fills and reductions are not.

The ceilings: the counts are today's (copies, reads; 0 tensors of (n, n)), the roofline's is 1.25 (1.17 today).
A check fails above its ceiling. A ceiling is raised only with a reason: in the same change, write in its "why" in
scripts/gpu/ceilings.json what costs more and what that buys, with the date and the command that measured it
(`python -m tests.test_gpu_costs` prints today's values); lower it when a change saves.
"""

from __future__ import annotations

import collections
import json
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from relmt.data.tokenizer import PAD_ID
from relmt.decode.translator import Translator
from relmt.model import chunked, routes
from relmt.model.transformer import Transformer, build_model
from relmt.train.loss import label_smoothed_nll
from tests import tiny_checkpoints as tiny
from tests.fake_cuda import fake_cuda
from tests.scripts_import import load_script
from tests.test_device_lane import lane_updates

CEILINGS = Path(__file__).parents[1] / "scripts" / "gpu" / "ceilings.json"

COPIES = frozenset("""copy_ copy clone _to_copy cat stack index_select gather index _unsafe_index take embedding
index_put index_put_ _index_put_impl_ _unsafe_index_put index_copy index_copy_ masked_scatter masked_scatter_
repeat flip roll constant_pad_nd narrow_copy slice_backward select_backward slice_scatter select_scatter
diagonal_scatter as_strided_scatter _foreach_copy_""".split())
SCANS = frozenset("cumsum cumsum_ cumprod cumprod_ cummax cummin _cummax_helper _cummin_helper logcumsumexp "
                  "_logcumsumexp".split())
LOSSES = ("whole", "chunked")


def ceiling(name: str, part: str | None = None) -> float:
    """The committed ceiling `name` (of its `part`: a loss, for copies_per_update)."""
    value = json.loads(CEILINGS.read_text())[name]["ceiling"]
    return value if part is None else value[part]


def copies(ops: collections.Counter) -> collections.Counter:
    """Of aten op -> calls, the copies (`COPIES`)."""
    return collections.Counter({op: n for op, n in ops.items() if op in COPIES})


# ---- the measurements (also `python -m tests.test_gpu_costs`) ------------------------------------------------

def roofline_ratio() -> tuple[float, set[str]]:
    """rel / abs of scripts/gpu/roofline.py's base bf16 step at its default peaks, and the op names of rel's."""
    roof = load_script("roofline")
    ms, names = {}, set()
    for positions in ("abs", "rel"):
        ops = roof.step_ops(positions, **roof.BASE_STEP)
        ms[positions] = roof.roofline(ops, roof.PEAKS["tflops"] * 1e12, roof.PEAKS["tbps"] * 1e12)["ms"]
        if positions == "rel":
            names = {o["op"] for o in ops}
    return ms["rel"] / ms["abs"], names


def copies_per_update(root: Path, loss: str) -> list[collections.Counter]:
    """Each update's copies in tests/test_device_lane.py's tiny bf16 run on the lane."""
    return [copies(u.ops) for u in lane_updates(root, loss)]


DECODE_STEPS = 8  # min_len = the step limit: no sentence finishes before the last step


def copies_per_decoding_step(directory: Path) -> list[collections.Counter]:
    """The copies of decoding steps 1 .. DECODE_STEPS - 2 of a cached beam search (beam 4, four sentences, a
    tiny checkpoint, bf16 as precision=auto takes on CUDA) on the lane; a weight's autocast cast is left out
    (CUDA's autocast keeps it for the whole search: the module's docstring)."""
    path = tiny.write_checkpoint(directory, "costs.pt", tiny.toy_tokenizer(directory), 1)
    spans: list[collections.Counter] = []
    real = Transformer.decode_step

    def decode_step(self, *args, **kwargs):
        spans.append(collections.Counter())
        return real(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp, fake_cuda() as lane:
        translator = Translator.from_checkpoint(path, device="cuda")
        assert translator.autocast_dtype == torch.bfloat16
        weights = {id(p.inner) for p in translator.model.parameters()}

        def on_op(func, args, kwargs, out):
            name = str(func.overloadpacket).removeprefix("aten.")
            if spans and name in COPIES and not (name == "_to_copy" and args and id(args[0]) in weights):
                spans[-1][name] += 1

        mp.setattr(Transformer, "decode_step", decode_step)
        lane.on_op = on_op
        translator.translate_nbest(tiny.SENTENCES[:4], beam=4, nbest=1, min_len=DECODE_STEPS, max_len_a=0.0,
                                   max_len_b=DECODE_STEPS)
    assert len(spans) == DECODE_STEPS, len(spans)  # one search, every step taken
    return spans[1:-1]


NN_LENGTH = 80  # source and target tokens: more than d_ff (64) and the vocabulary (60), so only attention's
# logits reach (n, n) in their last two dimensions; five blocks of 16 rows


def nn_tensors_in_chunked_route() -> tuple[list[tuple[str, tuple]], int, bool]:
    """The op outputs of one forward and backward of a tiny rel model (attention dropout on) on the chunked
    route, shapes alone on the lane, whose last two dimensions are at least (n, n); the route's block rows; and
    whether blocks of those rows ran. In bf16 under CUDA's autocast, as training runs (the lane answers CUDA's
    autocast state for torch.utils.checkpoint's recomputation). Cross-attention runs as the fused kernel a GPU
    runs (scripts/gpu/roofline.py's stand-in for scaled_dot_product_attention): on the lane its math decomposition
    would hold the (B, H, n, m) weights."""
    roof = load_script("roofline")
    n, vocab = NN_LENGTH, 60
    cfg = tiny.model_config(attention_dropout=0.1)
    src, tgt = torch.full((2, n), 5), torch.full((2, n + 1), 5)
    seen: list[tuple[str, tuple]] = []

    def on_op(func, args, kwargs, out):
        seen.extend((str(func), tuple(t.shape)) for t in torch.utils._pytree.tree_flatten(out)[0]
                    if isinstance(t, torch.Tensor))

    with pytest.MonkeyPatch.context() as mp, fake_cuda(data="meta") as lane, routes.use_route("chunked"):
        mp.setattr(chunked, "BLOCK_BYTES", 1)  # the smallest block: 16 rows
        mp.setattr(F, "scaled_dot_product_attention", roof.sdpa)
        rows = chunked.block_rows(2, cfg.n_heads, n, n, 2)
        model = build_model(cfg, vocab, PAD_ID).to("meta").cuda().train()
        src, tgt = src.cuda(), tgt.cuda()
        lane.on_op = on_op
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(src, tgt[:, :-1])
        loss, _ = label_smoothed_nll(logits, tgt[:, 1:], 0.1)
        loss.backward()
    blocks = any(len(s) >= 2 and s[-2:] == (rows, n) for _, s in seen)
    return [(f, s) for f, s in seen if len(s) >= 3 and s[-2] >= n and s[-1] >= n], rows, blocks


# ---- the checks ----------------------------------------------------------------------------------------------

def test_rel_over_abs_in_the_roofline_of_a_base_bf16_step():
    """rel / abs at roofline.py's default base step (900 sentences of 45 tokens, traced with shapes alone in
    about 3 s) within its ceiling, and no scan in rel's step."""
    ratio, names = roofline_ratio()
    assert not names & SCANS, f"rel's step runs {sorted(names & SCANS)}: the scans labels.py dropped?"
    assert ratio <= ceiling("roofline_rel_over_abs"), (
        f"rel / abs = {ratio:.3f} > {ceiling('roofline_rel_over_abs')} (scripts/gpu/ceilings.json): "
        "`python scripts/gpu/roofline.py --positions abs rel` lists the costliest ops")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("gpu_costs")


@pytest.mark.parametrize("loss", LOSSES)
def test_copies_per_training_update(root, loss):
    updates = copies_per_update(root, loss)
    assert len(updates) == 3
    worst = max(updates, key=lambda c: sum(c.values()))
    assert sum(worst.values()) <= ceiling("copies_per_update", loss), (
        f"{sum(worst.values())} copies in an update (train.output_loss={loss}) > "
        f"{ceiling('copies_per_update', loss)}: {dict(sorted(worst.items()))}")


def test_copies_per_decoding_step(tmp_path):
    steps = copies_per_decoding_step(tmp_path)
    worst = max(steps, key=lambda c: sum(c.values()))
    assert sum(worst.values()) <= ceiling("copies_per_decoding_step"), (
        f"{sum(worst.values())} copies in a decoding step > {ceiling('copies_per_decoding_step')}: "
        f"{dict(sorted(worst.items()))}")


def test_no_n_by_n_tensor_on_the_chunked_route():
    found, rows, blocks = nn_tensors_in_chunked_route()
    assert len(found) <= ceiling("nn_tensors_in_chunked_route"), (
        f"{len(found)} tensors of (n, n) or more (n = {NN_LENGTH}, blocks of {rows} rows) on the chunked route, "
        f"the first: {found[:3]}")
    assert rows < NN_LENGTH and blocks  # the route ran in blocks


def main() -> None:
    """Today's values, for scripts/gpu/ceilings.json."""
    with tempfile.TemporaryDirectory() as d:
        ratio, names = roofline_ratio()
        out = {"roofline_rel_over_abs": round(ratio, 4), "scans_in_rel": sorted(names & SCANS)}
        out["device_reads_per_update"] = {loss: max(len(u.reads) for u in lane_updates(Path(d), loss))
                                          for loss in LOSSES}
        out["copies_per_update"] = {loss: dict(sorted(max(copies_per_update(Path(d), loss),
                                                          key=lambda c: sum(c.values())).items()))
                                    for loss in LOSSES}
        step = max(copies_per_decoding_step(Path(d)), key=lambda c: sum(c.values()))
        out["copies_per_decoding_step"] = dict(sorted(step.items()))
        out["nn_tensors_in_chunked_route"] = len(nn_tensors_in_chunked_route()[0])
    out["copies_per_update"] = {loss: {"total": sum(c.values()), **c} for loss, c in out["copies_per_update"].items()}
    out["copies_per_decoding_step"] = {"total": sum(out["copies_per_decoding_step"].values()),
                                       **out["copies_per_decoding_step"]}
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
