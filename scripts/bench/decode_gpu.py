#!/usr/bin/env python
"""Decoding on a GPU (issue 76 §4): relmt's beam search with one Python step per token, the path relmt-translate,
validation and relmt-serve take, against the whole search in one compiled call (relmt.export.graphs.LoopGraph:
the search step inside torch's while_loop, exported and compiled by AOTInductor for the device). On a GPU a step of
beam 4 for one sentence is microseconds of kernels behind a host round-trip per operator, which is what the loop
takes away. Run it alone on the machine (scripts/gpu/call.sh 3, the GPU call's decode phase).

    python scripts/bench/decode_gpu.py --device cuda --out decode.json --md decode.md

A --size preset model (configs/model; base: the paper's), --positions, randomly initialised (seed 0) over a
--vocab of ids, float32; --sentences random sources of 10 to 30 ids; beam 4, length penalty 0.6 (gnmt), every
hypothesis forced to --length tokens (bench_peers' regime, so that both searches take the same steps). Each
system decodes the sentences one at a time and in batches of --batch, interleaved over --repeats rounds; the best
round counts. The encoder runs eagerly in both. The JSON is written after the per-step rows and again after the
loop's, so a run cut off while the loop compiles keeps the first. A loop that fails to export, compile or run is
written down with its error, and the per-step rows stand (the device lane's rehearsal, which cannot compile, takes
that path: scripts/gpu/rehearse.sh).

CTranslate2 is not in this comparison on the lent GPU: its 4.x wheel loads libcublas.so.12 (`strings` on
libctranslate2.so), the GPU image ships CUDA 13's, and the 43 MB wheel does not fit the call's 64 MiB carry beside
relmt's own wheels.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from relmt.bench import best_per_call, command_line, hardware, markdown_table, page_head, write_json  # noqa: E402
from relmt.config import PosKind, compose  # noqa: E402
from relmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID  # noqa: E402
from relmt.decode.beam import beam_search, finished_hypotheses  # noqa: E402
from relmt.export.aoti import compile_graph  # noqa: E402
from relmt.export.graphs import LOOP_STATE, EncoderGraph, LoopGraph, loop_examples, loop_start  # noqa: E402
from relmt.model.transformer import build_model  # noqa: E402

BEAM, LENPEN = 4, 0.6


def build(size: str, positions: str, vocab: int, device: torch.device):
    cfg = compose([f"model={size}", f"model.positions={PosKind(positions).value}"]).model
    torch.manual_seed(0)
    return build_model(cfg, vocab, PAD_ID).to(device).eval()


def make_sources(n: int, vocab: int, device: torch.device) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        length = int(torch.randint(10, 31, (1,), generator=g))
        ids = torch.randint(4, vocab, (length,), generator=g).tolist()
        out.append(torch.tensor([ids + [EOS_ID]], device=device))
    return out


def batches(sources: list[torch.Tensor], size: int) -> list[torch.Tensor]:
    """The sources in padded batches of `size` rows."""
    out = []
    for i in range(0, len(sources), size):
        rows = sources[i:i + size]
        width = max(r.shape[1] for r in rows)
        batch = torch.full((len(rows), width), PAD_ID, device=rows[0].device)
        for j, r in enumerate(rows):
            batch[j, :r.shape[1]] = r[0]
        out.append(batch)
    return out


def step_search(model, src: torch.Tensor, length: int) -> list:
    """relmt's search, one Python step per token (relmt.decode.beam.beam_search)."""
    return beam_search(model, src, BEAM, BOS_ID, EOS_ID, lenpen=LENPEN, max_len_a=0.0, max_len_b=length,
                       min_len=length, nbest=1)


def loop_inputs(model, src: torch.Tensor, length: int) -> tuple:
    """LoopGraph's inputs for a batch: the eager encoder's output and empty buffers of `length` slots."""
    keep, cross_k, cross_v = EncoderGraph(model)(src)
    limit = torch.full((src.shape[0],), length, device=src.device)
    return loop_start(keep, cross_k, cross_v, BEAM, length, limit, PAD_ID, length, LENPEN, False, True, False)


def compile_loop(model, device: torch.device, path: Path) -> float:
    """LoopGraph exported and compiled by AOTInductor for `device` (as engine=aoti compiles); its seconds."""
    example, dims = loop_examples(model)
    return compile_graph(LoopGraph(model).eval(), tuple(x.to(device) for x in example), dims, path)


def loop_search(model, run, src: torch.Tensor, length: int) -> list:
    out = dict(zip(LOOP_STATE, run(*loop_inputs(model, src, length))))
    return [hyps[:1] for hyps in finished_hypotheses(out["pool_scores"], out["pool_tokens"][:, :, :int(out["t"])],
                                                     (EOS_ID, PAD_ID))]


def agreement(mine: list, theirs: list) -> tuple[int, float]:
    """How many sentences' best hypotheses have the same tokens, and the largest score difference among those."""
    same, diff = 0, 0.0
    for a, b in zip(mine, theirs):
        if a and b and a[0].tokens == b[0].tokens:
            same += 1
            diff = max(diff, abs(a[0].score - b[0].score))
    return same, diff


def report(args, payload: dict) -> None:
    if args.out:
        write_json(args.out, payload)
    table = markdown_table(payload["rows"], [("system", "search"), ("regime", "regime"),
                                             ("sent_s", "sentences/s"), ("ms_per_step", "ms per step"),
                                             ("over_per_step", "÷ per step")])
    loop = payload.get("loop", {})
    eager = (f"Run eagerly on the device first (two sentences), the loop's best hypotheses equal the per-step "
             f"search's for {loop['eager_same']} of 2. " if "eager_same" in loop else "")
    if "error" in loop:
        said = f"The loop did not run: {loop['stage']} failed: `{loop['error']}`."
    elif loop:
        said = (f"The loop compiled in {loop['compile_s']:.0f} s; its best hypotheses equal the per-step search's for "
                f"{loop['same']} of {loop['sentences']} sentences (largest score difference among those "
                f"{loop['max_score_difference']:.2g}).")
    else:
        said = "The loop had not run when this page was written."
    said = eager + said
    print(table, said, sep="\n\n")
    if args.md:
        hw = payload["hardware"]
        args.md.write_text(
            page_head("Decoding on a GPU: a Python step per token against the whole search in one call (issue 76 §4)",
                      hw, payload["command"]) +
            f"- model: {args.size} {args.positions}, random initialisation, vocabulary {args.vocab}, float32, on "
            f"{hw.get('gpu', args.device)}; {args.sentences} random sources of 10 to 30 ids; beam {BEAM}, every "
            f"hypothesis forced to {args.length} tokens; best of {args.repeats} interleaved rounds\n\n"
            f"{table}\n\n{said}\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", default="base")
    ap.add_argument("--positions", default="rel")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--sentences", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--eager-check", action="store_true",
                    help="run the loop eagerly on the device first, on two sentences (the device lane's check: it "
                    "cannot compile; on a GPU, torch's eager while_loop traces the step with Dynamo, seconds of the "
                    "call)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    device = torch.device(args.device)
    model = build(args.size, args.positions, args.vocab, device)
    sources = make_sources(args.sentences, args.vocab, device)
    batched = batches(sources, args.batch)
    payload = {"command": command_line(), "hardware": hardware(device), "device": str(device), "size": args.size,
               "positions": args.positions, "vocab": args.vocab, "sentences": args.sentences, "batch": args.batch,
               "length": args.length, "beam": BEAM, "rows": []}
    regimes = {"one at a time": sources, f"{args.batch} per batch": batched}
    # every sentence takes --length steps: one call per step per sentence, or per batch
    row_steps = {"one at a time": args.sentences * args.length, f"{args.batch} per batch": len(batched) * args.length}

    def rows(system: str, times: dict[str, float]) -> list[dict]:
        out = []
        for regime, seconds in times.items():
            base = next((r for r in payload["rows"] if r["system"] == "per step" and r["regime"] == regime), None)
            out.append({"system": system, "regime": regime, "sent_s": args.sentences / seconds,
                        "ms_per_step": 1e3 * seconds / row_steps[regime],
                        "over_per_step": (args.sentences / seconds) / base["sent_s"] if base else 1.0})
        return out

    with torch.no_grad():
        per_step = best_per_call({r: (lambda xs=xs: [step_search(model, x, args.length) for x in xs])
                                  for r, xs in regimes.items()}, args.repeats, device=device)
        payload["rows"] += rows("per step", per_step)
        report(args, payload)
        stage = "run eagerly"
        try:
            payload["loop"] = {}
            if args.eager_check:  # the loop's inputs and body on the device, eagerly (the lane checks this much)
                eager = [h for x in sources[:2] for h in loop_search(model, LoopGraph(model).eval(), x, args.length)]
                payload["loop"]["eager_same"] = agreement(eager, [h for x in sources[:2]
                                                                  for h in step_search(model, x, args.length)])[0]
            stage = "export and compile"
            with tempfile.TemporaryDirectory(prefix="decode-gpu-") as tmp:
                path = Path(tmp) / "loop.pt2"
                seconds = compile_loop(model, device, path)
                stage = "load and run"
                run = torch._inductor.aoti_load_package(str(path))
                mine = [h for x in sources for h in loop_search(model, run, x, args.length)]
                theirs = [h for x in sources for h in step_search(model, x, args.length)]
                same, diff = agreement(mine, theirs)
                payload["loop"] |= {"compile_s": seconds, "same": same, "sentences": args.sentences,
                                   "max_score_difference": diff}
                loop = best_per_call({r: (lambda xs=xs: [loop_search(model, run, x, args.length) for x in xs])
                                      for r, xs in regimes.items()}, args.repeats, device=device)
                payload["rows"] += rows("loop (one call)", loop)
        except Exception as e:  # written down: the per-step rows stand
            traceback.print_exc()
            error = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"
            payload["loop"] = payload.get("loop", {}) | {"stage": stage, "error": error}
        report(args, payload)


if __name__ == "__main__":
    main()
