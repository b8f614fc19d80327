#!/usr/bin/env python
"""Terminology constraints on Multi30k test2016 (issue 60): how many constraints the constrained search meets, what
they do to BLEU (with the paired bootstrap), and what they cost in time at beam 4.

The constraints are built the way the terminology literature builds them (e.g. Hu et al. 2019, Post & Vilar 2018):
for each sentence, one or two reference words or phrases that the unconstrained output misses, drawn by a seeded
generator (--seed): the reference's words (letters in them, not in the unconstrained output) are the candidates;
each drawn word becomes a two-word phrase with the next reference word half the time, when that word is missing
too. Sentences whose output misses no reference word get no constraint.

A constraint is met when it appears in the output from a word's start, as the search guarantees (it matches
pieces, so the last word may go on: "Katze" in "Katzen"); the page also counts those met as whole words. Times
are the median of --repeats runs of the whole test set (and of its sentences with two constraints), each mode
timed in turn (relmt.bench.time_interleaved), with the threads given (--threads): run it on a quiet machine.

    python scripts/bench/constraints.py --checkpoint runs/decoding/m30k_rel_s1/checkpoints/best.pt \\
        [--data ../shared/data/multi30k]   # the default is this project's machines
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from relmt.bench import command_line, hardware, markdown_table, time_interleaved, write_json
from relmt.data.sources import read_lines
from relmt.decode.translator import Translator
from relmt.evaluate.metrics import paired_bootstrap, sacrebleu_score

WORD = re.compile(r"\w", re.UNICODE)


def draw_constraints(refs: list[str], outputs: list[str], seed: int, known: Callable[[str], bool] = lambda w: True,
                     ) -> list[list[str]]:
    """One or two reference words or two-word phrases per sentence that its output misses (see the docstring);
    `known(word)`: whether the model's vocabulary holds it (a word it cannot spell is never drawn)."""
    rng = random.Random(seed)
    out = []
    for ref, hyp in zip(refs, outputs):
        words, have = ref.split(), set(hyp.split())
        missing = [i for i, w in enumerate(words) if WORD.search(w) and w not in have and known(w)]
        picked: list[str] = []
        for i in sorted(rng.sample(missing, min(len(missing), rng.choice((1, 2))))):
            phrase = words[i]
            if rng.random() < 0.5 and i + 1 < len(words) and i + 1 in missing:
                phrase += " " + words[i + 1]
            if all(phrase not in p and p not in phrase for p in picked):
                picked.append(phrase)
        out.append(picked)
    return out


def holds(output: str, phrase: str, whole: bool = False) -> bool:
    """Whether the output holds the phrase from a word's start (as its pieces, the search's guarantee: the last
    word may go on, "Katze" in "Katzen"), or with `whole`, as whole words."""
    end = r"(?!\S)" if whole else ""
    return re.search(r"(?<!\S)" + re.escape(phrase) + end, output) is not None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--data", type=Path, default=Path("../shared/data/multi30k"))
    ap.add_argument("--split", default="test", help="test2016 is `test` in Multi30k's files")
    ap.add_argument("--src", default="en")
    ap.add_argument("--tgt", default="de")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=0, help="only the first N sentences (0: all)")
    ap.add_argument("--out", type=Path, default=Path("docs/results/decoding/constraints.json"))
    ap.add_argument("--md", type=Path, default=Path("docs/results/decoding/constraints.md"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    sources = read_lines(args.data / f"{args.split}.{args.src}")
    refs = read_lines(args.data / f"{args.split}.{args.tgt}")
    if args.limit:
        sources, refs = sources[:args.limit], refs[:args.limit]
    translator = Translator.from_checkpoint(args.checkpoint, device="cpu")
    decode = {"beam": args.beam, "nbest": 1}
    plain = [hs[0].text if hs else "" for hs in translator.translations(sources, **decode)]
    unk = translator.tokenizer.sp.unk_id()
    constraints = draw_constraints(refs, plain, args.seed, lambda w: unk not in translator.tokenizer.encode([w])[0])
    forced = translator.translations(sources, constraints=constraints, **decode)
    outputs = [hs[0].text if hs else "" for hs in forced]
    phrases = [(o, p) for o, cs in zip(outputs, constraints) for p in cs]
    met = sum(holds(o, p) for o, p in phrases)
    whole = sum(holds(o, p, whole=True) for o, p in phrases)
    search_met = sum(1 for hs, cs in zip(forced, constraints) if cs and hs and hs[0].unmet == 0)
    test = paired_bootstrap(plain, outputs, refs)
    two = [i for i, c in enumerate(constraints) if len(c) == 2]
    sub_src, sub_cons = [sources[i] for i in two], [constraints[i] for i in two]
    times = time_interleaved({
        "all, unconstrained": lambda: translator.translations(sources, **decode),
        "all, constrained": lambda: translator.translations(sources, constraints=constraints, **decode),
        "two constraints, unconstrained": lambda: translator.translations(sub_src, **decode),
        "two constraints, constrained": lambda: translator.translations(sub_src, constraints=sub_cons, **decode),
    }, torch.device("cpu"), warmup=1, repeats=args.repeats)
    per = {k: v / (len(sources) if k.startswith("all") else max(len(two), 1)) for k, v in times.items()}
    rows = [{"sentences": label, "n": n, "plain_ms": 1e3 * per[f"{key}, unconstrained"],
             "constrained_ms": 1e3 * per[f"{key}, constrained"],
             "ratio": per[f"{key}, constrained"] / per[f"{key}, unconstrained"]}
            for label, n, key in (("all", len(sources), "all"), ("with two constraints", len(two), "two constraints"))]
    info = {"command": command_line(), "hardware": hardware(), "checkpoint": str(args.checkpoint),
            "data": str(args.data), "split": args.split, "beam": args.beam, "seed": args.seed,
            "sentences": len(sources), "sentences_constrained": sum(bool(c) for c in constraints),
            "constraints": len(phrases), "constraints_met": met, "share_met": met / max(len(phrases), 1),
            "constraints_met_as_whole_words": whole,
            "hypotheses_holding_all_by_search": search_met,
            "bleu_unconstrained": sacrebleu_score(plain, refs)["score"],
            "bleu_constrained": sacrebleu_score(outputs, refs)["score"], "paired_bootstrap": test,
            "times": rows, "examples": [{"source": sources[i], "constraints": constraints[i], "unconstrained": plain[i],
                                         "constrained": outputs[i], "reference": refs[i]} for i in two[:3]]}
    write_json(args.out, info)
    hw = info["hardware"]
    table = markdown_table(rows, [("sentences", "sentences"), ("n", "n"), ("plain_ms", "unconstrained ms/sentence"),
                                  ("constrained_ms", "constrained ms/sentence"),
                                  ("ratio", "constrained ÷ unconstrained")])
    text = "\n\n".join([
        "# Terminology constraints on Multi30k test2016",
        f"Made by `{info['command']}` on {hw['date']} ({hw['cpu']}, {args.threads} threads, git {hw['git']}); "
        f"checkpoint: `{Path(args.checkpoint).as_posix()}` (`scripts/reproduce/queues/decoding.txt`: the committed "
        f"Multi30k recipe, rel, seed 1). Beam {args.beam}.",
        __doc__.split("\n\n")[1], __doc__.split("\n\n")[2],
        f"- Sentences: {len(sources)}, of which {info['sentences_constrained']} got constraints "
        f"({len(phrases)} constraints; {len(two)} sentences with two).\n"
        f"- Constraints met in the constrained output: {met} of {len(phrases)} ({100 * info['share_met']:.1f}%), "
        f"{whole} of them as whole words (not the start of a longer word); "
        f"the search's own count: {search_met} of {info['sentences_constrained']} outputs hold all theirs.\n"
        f"- sacreBLEU: {info['bleu_unconstrained']:.2f} unconstrained, {info['bleu_constrained']:.2f} constrained: "
        f"{test['difference']:+.2f}, 95% interval [{test['low']:+.2f}, {test['high']:+.2f}], p = "
        f"{test['p_value']:.3f} (paired bootstrap, 1000 resamples).",
        "Time per sentence, whole test set and its sentences with two constraints (median of "
        f"{args.repeats}):", table]) + "\n"
    args.md.parent.mkdir(parents=True, exist_ok=True)
    args.md.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
