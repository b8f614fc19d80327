"""Translation quality of hypotheses against references: pure functions of text, no model.

The figures, each labelled:
- sacreBLEU: detokenized text, tokenizer 13a, with its signature (the standard; Post 2018);
- chrF, with its signature;
- paper-comparable tokenized BLEU: Moses-tokenize hypothesis and reference (sacremoses), split
  hyphenated compounds (`X-Y` -> `X ##AT##-##AT## Y`, as tensor2tensor's get_ende_bleu.sh and
  fairseq's compound_split_bleu.sh do), then BLEU on those tokens (`tokenize='none'`). This is
  how the EN-DE figures of Shaw et al. and its peers are usually computed; it is not sacreBLEU;
- lowercased tokenized BLEU, the Multi30k literature's figure;
- BLEU by source length in words, which is how relmt shows length generalisation (the clipped
  relative positions of Shaw §3.2);
- a paired bootstrap test of two systems (Koehn 2004): two-sided p and the interval of the difference.
`score` and `report` are the engine of `relmt-score`.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacremoses import MosesTokenizer
from sacremoses.corpus import NonbreakingPrefixes

from relmt.errors import UserError

DEFAULT_BUCKETS = (10, 20, 30, 40, 60)  # upper edges: 1-10, 11-20, 21-30, 31-40, 41-60, 61+
_COMPOUND = re.compile(r"(\S)-(\S)")
_MOSES_LANGS = frozenset(NonbreakingPrefixes().available_langs.values())


def moses_lang(code: str) -> str:
    """`code` if Moses has nonbreaking prefixes for it, else "en" (what Moses' tokenizer.perl falls
    back to). The toy corpus's "tgt", or a file suffix such as "txt", thus tokenizes as English."""
    return code if code in _MOSES_LANGS else "en"


def moses_label(code: str) -> str:
    """How a tokenized BLEU's label names its Moses tokenization: "de" for a language Moses knows, else the
    target's own code with the English rules used for it ("tgt, English rules": the toy corpus's target is
    no English, and a label of "en" said it was)."""
    if code in _MOSES_LANGS:
        return code
    return f"{code}, English rules" if code else "English rules"


def split_compounds(text: str) -> str:
    """`X-Y` -> `X ##AT##-##AT## Y`, left to right without overlaps, like perl's s{(\\S)-(\\S)}{...}g."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", text)


def sacrebleu_score(hyps: list[str], refs: list[str]) -> dict:
    """sacreBLEU (13a tokenization, cased) of detokenized hypotheses against one reference each:
    {"score", "signature", "text"} ("text" is sacreBLEU's one-line summary)."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    bleu = BLEU()
    b = bleu.corpus_score(hyps, [refs])
    return {"score": b.score, "signature": str(bleu.get_signature()), "text": str(b)}


def chrf_score(hyps: list[str], refs: list[str]) -> dict:
    """chrF (Popovic 2015) with sacreBLEU's defaults, and its signature."""
    chrf = CHRF()
    return {"score": chrf.corpus_score(hyps, [refs]).score, "signature": str(chrf.get_signature())}


def moses_prep(lang: str, compound_split: bool = True, lowercase: bool = False) -> Callable[[str], str]:
    """One line as `tokenized_bleu` scores it: Moses tokens, compounds split, lowercased, as asked; score the
    prepared lines with BLEU(tokenize="none", force=True)."""
    moses = MosesTokenizer(lang=moses_lang(lang))

    def prep(s: str) -> str:
        s = moses.tokenize(s, return_str=True, escape=False)
        s = split_compounds(s) if compound_split else s
        return s.lower() if lowercase else s
    return prep


def tokenized_bleu(hyps: list[str], refs: list[str], lang: str, compound_split: bool = True,
                   lowercase: bool = False, n_bootstrap: int = 1) -> dict:
    """BLEU on Moses tokens (`tokenize='none'`), as papers computed it before sacreBLEU.

    The default is the paper-comparable EN-DE figure: Moses tokenization + compound splitting
    (tensor2tensor's get_ende_bleu.sh). `lowercase=True, compound_split=False` is the lowercased
    tokenized BLEU that most Multi30k papers print (multi-bleu.perl on lowercased Moses tokens). A
    language Moses does not know tokenizes by the English rules (`moses_lang`); the label names the target
    and the rules (`moses_label`), never calling it English.
    `n_bootstrap` > 1 adds sacreBLEU's 95% bootstrap interval over the test sentences as sacreBLEU
    prints it, "μ = mean ± ci": the resamples' mean and the half-width of their 2.5-97.5 percentile
    range (its resampling seed is sacreBLEU's fixed default)."""
    prep = moses_prep(lang, compound_split, lowercase)
    # force: the input is tokenized on purpose, so sacreBLEU's "forgot to detokenize?" warning (on 100
    # lines ending in " .", i.e. on every real test set here) does not apply; the signature is the same.
    bleu = BLEU(tokenize="none", force=True)
    score = bleu.corpus_score([prep(h) for h in hyps], [[prep(r) for r in refs]], n_bootstrap=n_bootstrap)
    how = [f"Moses ({moses_label(lang)})"] + ["compound splitting"] * compound_split + ["lowercased"] * lowercase
    out = {"score": score.score, "signature": str(bleu.get_signature()),
           "label": f"{'lowercased ' if lowercase else ''}tokenized BLEU: {' + '.join(how)}, tokenize=none "
                    "(not sacreBLEU)"}
    if n_bootstrap > 1:
        out["mean"], out["ci"] = score._mean, score._ci  # where sacreBLEU keeps them (Score.estimate_ci)
    return out


def lowercased_bleu(hyps: list[str], refs: list[str], lang: str) -> dict:
    """The Multi30k literature's metric: lowercased Moses tokens, no compound splitting."""
    return tokenized_bleu(hyps, refs, lang, compound_split=False, lowercase=True)


def bucket_label(lo: int, hi: int | None) -> str:
    return f"{lo + 1}+" if hi is None else f"{lo + 1}-{hi}"


def bucketed_bleu(hyps: list[str], refs: list[str], srcs: list[str], edges: tuple[int, ...] = DEFAULT_BUCKETS,
                  ) -> list[dict]:
    """sacreBLEU per source-length bucket (words, split on whitespace); empty buckets are listed
    with 0 sentences. An empty source falls into the first bucket."""
    bounds = [(lo, hi) for lo, hi in zip((0, *edges), edges)] + [(edges[-1], None)]
    rows = []
    for lo, hi in bounds:
        members = [i for i, s in enumerate(srcs) if (len(s.split()) > lo or lo == 0) and
                   (hi is None or len(s.split()) <= hi)]
        row = {"bucket": bucket_label(lo, hi), "sentences": len(members), "bleu": None}
        if members:
            row["bleu"] = sacrebleu_score([hyps[i] for i in members], [refs[i] for i in members])["score"]
        rows.append(row)
    return rows


def percentile_test(diffs: np.ndarray, alpha: float) -> tuple[float, float, float]:
    """The two-sided percentile test of N sorted bootstrap differences diffs (N,), 0 < alpha < 1:
    p = min(1, 2 t / N) for the t resamples on the rarer side of 0, and the (1 - alpha) interval
    (low, high), the (k+1)-th smallest and largest difference.

    k is the largest rarer-side count whose p, the same float expression, is below alpha, so both
    come from one integer count and p < alpha exactly when low > 0 or high < 0: t <= k holds for
    the lower side exactly when diffs[k] > 0. (k = ceil(alpha N / 2) - 1 broke this under
    rounding: 0.07 * 200 / 2 is 7.000000000000001, so k was 7 while p(7) = 0.07 is not below 0.07.)"""
    n = len(diffs)

    def p_of(rarer: int) -> float:
        return min(1.0, 2 * rarer / n)

    k = sum(p_of(t) < alpha for t in range(n + 1)) - 1  # p_of grows with t; k < n / 2 as alpha < 1
    rarer = min(int(np.sum(diffs <= 0)), int(np.sum(diffs >= 0)))
    return p_of(rarer), float(diffs[k]), float(diffs[-k - 1])


def paired_bootstrap(baseline_hyps: list[str], system_hyps: list[str], refs: list[str], metric: str = "bleu",
                     n_samples: int = 1000, seed: int = 12345, alpha: float = 0.05) -> dict:
    """Is `system` better or worse than `baseline` by more than chance? Paired bootstrap resampling
    (Koehn 2004): both systems are scored by sacreBLEU on the same `n_samples` resamples of the
    sentences, giving n_samples differences d* = system − baseline.

    Returns the two scores, their difference, the (1 − alpha) percentile interval of the difference
    ("low", "high") and the two-sided percentile p-value: twice the share of resamples on the rarer
    side of 0, so 1.0 for systems that never differ. The interval is read at the same order
    statistics the p-value counts, so p < alpha exactly when the interval excludes 0
    (`percentile_test`). (sacreBLEU's --paired-bs p never exceeds about 0.5: it is not two-sided.)
    metric: "bleu" (13a) or "chrf"; 0 < alpha < 1."""
    if not len(baseline_hyps) == len(system_hyps) == len(refs):
        raise ValueError(f"{len(baseline_hyps)} baseline and {len(system_hyps)} system hypotheses but "
                         f"{len(refs)} references: all three must be line-aligned")
    if not refs:
        raise ValueError("no sentences to resample")
    if not 0 < alpha < 1 or n_samples < 1:
        raise ValueError(f"alpha={alpha}, n_samples={n_samples}: need 0 < alpha < 1 and n_samples >= 1")
    metrics = {"bleu": (BLEU, "BLEU"), "chrf": (CHRF, "chrF2")}
    if metric not in metrics:
        raise ValueError(f"metric={metric}: must be one of {', '.join(metrics)}")
    scorer, name = metrics[metric][0](), metrics[metric][1]
    base, system = (np.array(scorer._extract_corpus_statistics(h, [refs]), dtype=np.int64)
                    for h in (baseline_hyps, system_hyps))
    # counts[b, i]: how often resample b draws sentence i; sentence statistics add up over a corpus
    counts = np.random.default_rng(seed).multinomial(len(refs), np.full(len(refs), 1 / len(refs)), size=n_samples)

    def score(stats: np.ndarray) -> float:
        return scorer._compute_score_from_stats(stats.tolist()).score

    observed = (score(base.sum(0)), score(system.sum(0)))
    diffs = np.sort([score(s) - score(b) for b, s in zip(counts @ base, counts @ system)])
    p_value, low, high = percentile_test(diffs, alpha)
    return {"metric": name, "baseline": observed[0], "system": observed[1],
            "difference": observed[1] - observed[0], "low": low, "high": high, "alpha": alpha,
            "p_value": p_value, "n_samples": n_samples, "seed": seed,
            "signature": f"{scorer.get_signature()}|paired-bootstrap:{n_samples}|seed:{seed}"}


def multi_seed_bootstrap(baseline_runs: list[list[str]], system_runs: list[list[str]], refs: list[str],
                         n_samples: int = 1000, seed: int = 12345, alpha: float = 0.05, scorer: BLEU | None = None
                         ) -> dict:
    """Is `system` better or worse than `baseline` when each was trained with several seeds? The statistic is
    the difference of the systems' mean sacreBLEU over their seeds; its bootstrap distribution counts both
    sources of variance that a comparison of trained systems has (Clark et al. 2011, "Better Hypothesis
    Testing for Statistical Machine Translation: Controlling for Optimizer Instability"): each of `n_samples`
    resamples draws the test sentences with replacement, one draw shared by every run (paired, as in
    `paired_bootstrap`), and, for each system on its own, its seeds with replacement. The interval and the
    two-sided p come from one count of the resampled differences (`percentile_test`), as the per-pair test's.

    baseline_runs, system_runs: one list of hypotheses per seed, each line-aligned with `refs`; the systems
    need not have as many seeds, nor the same ones. scorer: sacreBLEU's BLEU() unless given (BLEU(tokenize="none",
    force=True) on `moses_prep`'d lines scores as `tokenized_bleu`). Returns both means, their difference, the
    (1 − alpha) interval, p, each mean's own (1 − alpha) percentile interval ("intervals"), and the seeds counted."""
    runs = [*baseline_runs, *system_runs]
    if not baseline_runs or not system_runs:
        raise ValueError("each system needs at least one seed's hypotheses")
    if not refs or any(len(h) != len(refs) for h in runs):
        raise ValueError(f"every run needs one hypothesis per reference ({len(refs)}), got "
                         f"{[len(h) for h in runs]}")
    scorer, n_base = scorer or BLEU(), len(baseline_runs)
    stats = np.stack([np.array(scorer._extract_corpus_statistics(h, [refs]), dtype=np.int64) for h in runs])
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(len(refs), np.full(len(refs), 1 / len(refs)), size=n_samples)  # (B, N)

    def bleu(sums: np.ndarray) -> float:
        return scorer._compute_score_from_stats(sums.tolist()).score

    observed = np.array([bleu(s.sum(0)) for s in stats])  # (R,) each run's BLEU on the test set
    resampled = np.array([[bleu(row) for row in counts @ s] for s in stats]).T  # (B, R)
    seeds_b = rng.integers(0, n_base, size=(n_samples, n_base))  # each system's seeds, drawn with replacement
    seeds_s = n_base + rng.integers(0, len(system_runs), size=(n_samples, len(system_runs)))
    means = [np.take_along_axis(resampled, drawn, 1).mean(1) for drawn in (seeds_b, seeds_s)]  # (B,) each
    diffs = np.sort(means[1] - means[0])
    p_value, low, high = percentile_test(diffs, alpha)
    base_mean, system_mean = float(observed[:n_base].mean()), float(observed[n_base:].mean())
    intervals = {side: np.quantile(m, [alpha / 2, 1 - alpha / 2]).tolist() for side, m in zip(("baseline", "system"),
                                                                                               means)}
    return {"baseline": base_mean, "system": system_mean, "difference": system_mean - base_mean, "low": low,
            "high": high, "alpha": alpha, "p_value": p_value, "n_samples": n_samples, "seed": seed,
            "seeds": (n_base, len(system_runs)), "runs": observed.tolist(), "intervals": intervals}


def score(hyps: list[str], refs: list[str], srcs: list[str] | None = None, lang: str = "en",
          buckets: tuple[int, ...] = DEFAULT_BUCKETS, names: tuple[str, str, str] = ("hyp", "ref", "src")) -> dict:
    """Every figure above but the paired test as one JSON-able dict. `names` name the inputs in
    error messages.

    Hypotheses that are all empty score 0 (a system that output nothing). References that are all
    empty are an error: BLEU and chrF have nothing to count against, and sacreBLEU would report a
    meaningless 0 (or, for no lines at all, fail)."""
    if len(hyps) != len(refs):
        raise UserError(f"{names[0]} has {len(hyps)} lines but {names[1]} has {len(refs)}: "
                        "hypotheses and references must be line-aligned")
    if not refs:
        raise UserError(f"hyp={names[0]} and ref={names[1]} are empty: nothing to score")
    if not any(r.strip() for r in refs):
        raise UserError(f"ref={names[1]}: all {len(refs)} lines are empty: no reference words to score against")
    if srcs is not None and len(srcs) != len(refs):
        raise UserError(f"{names[2]} has {len(srcs)} lines but {names[1]} has {len(refs)}")
    if list(buckets) != sorted(set(buckets)) or not buckets or buckets[0] < 1:
        raise UserError(f"buckets={list(buckets)}: give increasing upper edges >= 1, e.g. [10,20,30,40,60]")
    result = {"sentences": len(hyps), "sacrebleu": sacrebleu_score(hyps, refs), "chrf": chrf_score(hyps, refs),
              "tokenized_bleu": tokenized_bleu(hyps, refs, lang),
              "lowercased_bleu": lowercased_bleu(hyps, refs, lang)}
    if srcs is not None:
        result["by_source_length"] = bucketed_bleu(hyps, refs, srcs, tuple(buckets))
    return result


def report(result: dict) -> str:
    """A short human-readable summary of `score`'s result."""
    lines = [f"sentences: {result['sentences']}",
             f"sacreBLEU {result['sacrebleu']['score']:.2f}  ({result['sacrebleu']['signature']})",
             f"chrF      {result['chrf']['score']:.2f}  ({result['chrf']['signature']})",
             f"{result['tokenized_bleu']['score']:.2f}  {result['tokenized_bleu']['label']}",
             f"{result['lowercased_bleu']['score']:.2f}  {result['lowercased_bleu']['label']}"]
    if "by_source_length" in result:
        lines.append("BLEU by source length (words): " + ", ".join(
            f"{r['bucket']}: {'-' if r['bleu'] is None else format(r['bleu'], '.2f')} (n={r['sentences']})"
            for r in result["by_source_length"]))
    return "\n".join(lines)
