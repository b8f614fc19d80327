#!/usr/bin/env python
"""Which decoder layer's cross-attention aligns words best (issue 60): AER (Och & Ney 2003) of the word alignments
relmt reads from each decoder layer (relmt.decode.alignment: each target piece to the source piece its heads'
average attention weighs most, merged into words), against the toy corpus's gold alignments (relmt/data/toy.py
knows which source word yields each target word; its particles have possible links only).

The alignments are of the reference translations, force-decoded (relmt.decode.reference.score_references with
attention_layer), so that they align the gold's own target words. The layer with the lowest AER on valid becomes
decode.alignment_layer's default; the table gives each layer's AER, precision and recall on valid and test.

    python scripts/bench/alignments.py --checkpoint runs/decoding/toy_rel_s1/checkpoints/best.pt \\
        --out docs/results/decoding/alignments.json --md docs/results/decoding/alignments.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from relmt import checkpoint
from relmt.bench import command_line, hardware, markdown_table, write_json
from relmt.config import from_dict
from relmt.data import toy
from relmt.decode.alignment import word_links
from relmt.decode.reference import score_references
from relmt.decode.translator import Translator
from relmt.evaluate.alignment import aer


def layer_aer(translator: Translator, pairs: list[tuple[str, str]], layer: int) -> dict:
    """AER of decoder layer `layer`'s alignments of the reference translations of `pairs` against the gold."""
    sp, cfg = translator.tokenizer.sp, translator.decode
    src = translator.tokenizer.encode([s for s, _ in pairs])
    tgt = translator.tokenizer.encode([t for _, t in pairs])
    notes = score_references(translator.scorer, src, tgt, cfg.max_source_len, cfg.max_source_tokens,
                             translator.device, translator.autocast_dtype, attention_layer=layer)
    hyps = [word_links(n.attention, [sp.id_to_piece(i) for i in s], [sp.id_to_piece(i) for i in t])
            for n, s, t in zip(notes, src, tgt)]
    gold = [toy.gold_alignment(s, t) for s, t in pairs]
    return aer(hyps, [g[0] for g in gold], [g[1] for g in gold])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--checkpoint", required=True, help="a model trained on the toy corpus (data=toy)")
    ap.add_argument("--out", type=Path, default=Path("docs/results/decoding/alignments.json"))
    ap.add_argument("--md", type=Path, default=Path("docs/results/decoding/alignments.md"))
    args = ap.parse_args(argv)
    translator = Translator.from_checkpoint(args.checkpoint, device="cpu")
    t = from_dict(checkpoint.load(checkpoint.resolve(args.checkpoint))["config"]).data.toy
    splits = toy.generate(seed=t.seed, n_train=t.n_train, n_valid=t.n_valid, n_test=t.n_test,
                          n_test_long=t.n_test_long, max_words=t.max_words)  # the corpus it was trained on
    layers = len(translator.scorer.decoder_layers)
    rows = []
    for layer in range(layers):
        row = {"layer": layer}
        for split in ("valid", "test"):
            r = layer_aer(translator, splits[split], layer)
            row.update({f"{split}_aer": r["aer"], f"{split}_precision": r["precision"], f"{split}_recall": r["recall"]})
        rows.append(row)
        print(row, file=sys.stderr)
    best = min(rows, key=lambda r: r["valid_aer"])
    info = {"command": command_line(), "hardware": hardware(), "checkpoint": str(args.checkpoint),
            "sentences": {s: len(splits[s]) for s in ("valid", "test")}, "rows": rows, "best_layer": best["layer"],
            "best_layer_from_top": best["layer"] - layers}
    write_json(args.out, info)
    table = markdown_table(rows, [("layer", "decoder layer"), ("valid_aer", "valid AER"),
                                  ("valid_precision", "valid precision"), ("valid_recall", "valid recall"),
                                  ("test_aer", "test AER"), ("test_precision", "test precision"),
                                  ("test_recall", "test recall")])
    hw = info["hardware"]
    text = (f"# Word alignments from cross-attention, layer by layer (toy corpus)\n\n"
            f"Made by `{info['command']}` on {hw['date']} ({hw['cpu']}, git {hw['git']}).\n\n"
            f"{__doc__.split(chr(10) + chr(10))[1]}\n\n{table}\n\n"
            f"Lowest valid AER: decoder layer {best['layer']} (counting from 0; {best['layer'] - layers} from the "
            f"top), test AER {best['test_aer']:.3f}.\n")
    args.md.parent.mkdir(parents=True, exist_ok=True)
    args.md.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
