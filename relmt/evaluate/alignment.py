"""Word alignment quality: the alignment error rate (AER) of hypothesis links against gold links.

Alignments are in Pharaoh format, one sentence pair a line: space-separated "i-j" links from
source word i to target word j, 0-based, whitespace-split words ("0-0 1-2 2-1"; an empty line is
a pair with no links). fast_align and eflomal write it, and fairseq's --align-suffix files use it.

Gold alignments have sure links S and possible links P, with P including S (Och & Ney 2003 §4;
the toy corpus writes them to {split}.align and {split}.align_possible). Over a corpus, with A the
hypothesis links, every set summed over the sentences:

    precision = |A ∩ P| / |A|      recall = |A ∩ S| / |S|
    AER = 1 - (|A ∩ S| + |A ∩ P|) / (|A| + |S|)

Without P, P = S and AER = 1 - F1. S is added to any P given, so a file of the possible-only
links serves too. Precision of an empty hypothesis is 0 (its AER is 1).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

from relmt.errors import UserError

Link = tuple[int, int]  # (source word index, target word index), 0-based
_LINK = re.compile(r"(\d+)-(\d+)")


def parse_links(line: str, where: str = "alignment") -> set[Link]:
    """The links of one Pharaoh line; UserError naming `where` (e.g. "hyp.align line 3") if it is malformed."""
    links = set()
    for token in line.split():
        m = _LINK.fullmatch(token)
        if m is None:
            raise UserError(f"{where}: {token!r} is not a Pharaoh link i-j (0-based word indexes), in {line.strip()!r}")
        links.add((int(m[1]), int(m[2])))
    return links


def format_links(links: Collection[Link]) -> str:
    """One Pharaoh line: the links sorted (by source, then target index), "i-j" separated by spaces."""
    return " ".join(f"{i}-{j}" for i, j in sorted(links))


def _corpus(lines: Sequence[str | Collection[Link]], name: str) -> list[set[Link]]:
    """Each sentence's links: a Pharaoh line is parsed (errors name its 1-based line), links are taken as they are."""
    return [parse_links(x, f"{name} line {k}") if isinstance(x, str) else set(x) for k, x in enumerate(lines, 1)]


def aer(hypotheses: Sequence[str | Collection[Link]], sure: Sequence[str | Collection[Link]],
        possible: Sequence[str | Collection[Link]] | None = None,
        names: tuple[str, str, str] = ("hyp", "sure", "possible")) -> dict:
    """AER, precision and recall of a corpus of hypothesis alignments against the gold (Och & Ney 2003).

    Each argument has one item per sentence pair: a Pharaoh line or a collection of (i, j) links.
    `possible` (P) defaults to `sure` (S); S is added to it. `names` label the three inputs in errors.
    Returns {"aer", "precision", "recall"} (fractions in [0, 1]) and the link counts "hyp_links",
    "sure_links", "possible_links" (|A|, |S|, |P|) and "sentences".
    """
    if len(hypotheses) != len(sure):
        raise UserError(f"{names[0]} has {len(hypotheses)} lines but {names[1]} has {len(sure)}: "
                        "give one alignment per sentence pair in each")
    if possible is not None and len(possible) != len(sure):
        raise UserError(f"{names[2]} has {len(possible)} lines but {names[1]} has {len(sure)}")
    hyp, s = _corpus(hypotheses, names[0]), _corpus(sure, names[1])
    p = s if possible is None else [pk | sk for pk, sk in zip(_corpus(possible, names[2]), s)]
    n_a, n_s, n_p = (sum(map(len, x)) for x in (hyp, s, p))
    if n_s == 0:
        raise UserError(f"{names[1]} has no links in its {len(s)} lines: no gold alignment to score against")
    a_s = sum(len(a & sk) for a, sk in zip(hyp, s))
    a_p = sum(len(a & pk) for a, pk in zip(hyp, p))
    return {"aer": 1 - (a_s + a_p) / (n_a + n_s), "precision": a_p / n_a if n_a else 0.0, "recall": a_s / n_s,
            "hyp_links": n_a, "sure_links": n_s, "possible_links": n_p, "sentences": len(s)}
