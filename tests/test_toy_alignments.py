"""Gold word alignments of the toy corpus (relmt/data/toy.py) and the AER metric (relmt/evaluate/alignment.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from relmt.data import toy
from relmt.errors import UserError
from relmt.evaluate.alignment import aer, format_links, parse_links

PARTICLES = {toy.NOM, toy.ACC, *toy.AGR.values()}
VERBS = {"vi", "vt", "vs"}


@pytest.fixture(scope="module")
def corpus() -> dict[str, list[tuple[str, str]]]:
    return toy.generate()  # the defaults: what `make train` uses and data/toy_text holds


def gold(source: str) -> tuple[str, str, str]:
    """(target, sure, possible-only) of a hand-written source sentence, the links as Pharaoh lines."""
    s = toy.parse(source)
    sure, possible = toy.alignment(s)
    return toy.translate(s), format_links(sure), format_links(set(possible) - set(sure))


def test_hand_derived_alignments() -> None:
    # the module docstring's example: the dog ga saw ze the cat wo
    assert gold("the dog saw the cat") == ("baba ponu ga bire ze baba visa wo", "0-0 1-1 2-3 3-5 4-6",
                                          "0-2 1-2 2-4 3-7 4-7")
    # its role-swapped twin: the same words, the subject and object links exchanged
    assert gold("the cat saw the dog") == ("baba visa ga bire ze baba ponu wo", "0-0 1-1 2-3 3-5 4-6",
                                          "0-2 1-2 2-4 3-7 4-7")
    # (the dogs old) (alice near) ga said zen that (the cat) ga (bob) wo quickly saw ze:
    # ga closes "the old dogs", not its PP; zen and ze belong to their verbs
    assert gold("the old dogs near alice said that the cat quickly saw bob") == (
        "baba ponun lare ride nibo ga dito zen soba baba visa ga belo wo pive bire ze",
        "0-0 1-2 2-1 3-4 4-3 5-6 6-8 7-9 8-10 9-14 10-15 11-12", "0-5 1-5 2-5 5-7 7-11 8-11 10-16 11-13")
    # a relative clause: (the house that (the dogs) wo saw xo) ga slept xo
    assert gold("the house that saw the dogs slept") == (
        "baba voru soba baba ponun wo bire xo ga mini xo", "0-0 1-1 2-2 3-6 4-3 5-4 6-9",
        "0-8 1-8 3-7 4-5 5-5 6-10")
    # a verb-final clause after "because": its words' source indexes count the first clause
    assert gold("alice saw the cat because the dog chased bob") == (
        "ride ga bire ze baba visa wo ranu baba ponu ga belo wo meti ze",
        "0-0 1-2 2-4 3-5 4-7 5-8 6-9 7-13 8-11", "0-1 1-3 2-6 3-6 5-10 6-10 7-14 8-12")


def test_the_text_is_unchanged(corpus: dict[str, list[tuple[str, str]]]) -> None:
    # The default corpus as it was before the alignments were added (sha256 of its JSON).
    digest = hashlib.sha256(json.dumps(corpus).encode()).hexdigest()
    assert digest == "bc925ccfa6f9c2e619c66a3c7ee5b2c6d1f8eedaa120fa196a0eed16dc4ede17"


def test_every_pair_is_aligned_word_for_word(corpus: dict[str, list[tuple[str, str]]]) -> None:
    for split, pairs in corpus.items():
        for src, tgt in pairs:
            s, t = src.split(), tgt.split()
            sure, possible = toy.gold_alignment(src, tgt)
            assert sure == sorted(set(sure)) and possible == sorted(set(possible)) and set(sure) <= set(possible)
            assert all(0 <= i < len(s) and 0 <= j < len(t) for i, j in possible), (split, src)
            # every source word and every non-particle target word has exactly one sure link: its LEXICON entry
            assert sorted(i for i, _ in sure) == list(range(len(s))), (split, src)
            assert sorted(j for _, j in sure) == [j for j, w in enumerate(t) if w not in PARTICLES], (split, src)
            assert all(toy.LEXICON[s[i]] == t[j] for i, j in sure), (split, src)
            # possible-only links come from particles: ga/wo to their NP's det, adjectives and noun,
            # an agreement particle to one verb
            extra: dict[int, list[int]] = {}
            for i, j in sorted(set(possible) - set(sure)):
                extra.setdefault(j, []).append(i)
            assert set(extra) == {j for j, w in enumerate(t) if w in PARTICLES}, (split, src)
            for j, sources in extra.items():
                cats = [toy.CATEGORY[s[i]] for i in sources]
                assert sources == list(range(sources[0], sources[-1] + 1)), (split, src)
                if t[j] in (toy.NOM, toy.ACC):
                    assert cats in (["name"], ["det", *["adj"] * (len(cats) - 2), "noun"]), (split, src, j)
                else:
                    assert len(cats) == 1 and cats[0] in VERBS, (split, src, j)


def test_gold_alignment_checks_the_target() -> None:
    with pytest.raises(ValueError, match="not the toy translation"):
        toy.gold_alignment("the dog saw the cat", "baba visa ga bire ze baba ponu wo")


def test_aer_of_the_gold_is_0_and_of_nothing_is_1(corpus: dict[str, list[tuple[str, str]]]) -> None:
    links = [toy.gold_alignment(src, tgt) for src, tgt in corpus["test"]]
    sure = [format_links(x) for x, _ in links]
    possible = [format_links(p) for _, p in links]
    for hyp in (sure, possible):  # proposing every possible link is no error either
        r = aer(hyp, sure, possible)
        assert r["aer"] == 0 and r["precision"] == 1 and r["recall"] == 1
    assert aer(sure, sure)["aer"] == 0
    r = aer([""] * len(sure), sure, possible)
    assert r["aer"] == 1 and r["precision"] == 0 and r["recall"] == 0 and r["hyp_links"] == 0
    assert r["sure_links"] == sum(len(s.split()) for s, _ in corpus["test"]) and r["sentences"] == 500


def test_aer_hand_computed() -> None:
    # S = {0-0, 1-1}, P = S + {1-2}, A = {0-0, 1-2, 2-2}: |A&S| = 1, |A&P| = 2, |A| = 3, |S| = 2
    r = aer(["0-0 1-2 2-2"], ["0-0 1-1"], ["0-0 1-1 1-2"])
    assert r["aer"] == pytest.approx(1 - 3 / 5) and r["precision"] == pytest.approx(2 / 3) and r["recall"] == 0.5
    assert aer(["2-2 1-2 0-0"], ["1-1 0-0"], ["1-2"]) == r  # any order; P given without S gets S added
    assert aer([{(0, 0), (1, 2), (2, 2)}], [[(0, 0), (1, 1)]], [[(1, 2)]]) == r  # links, not lines
    # without P, AER = 1 - F1
    assert aer(["0-0 1-2 2-2"], ["0-0 1-1"])["aer"] == pytest.approx(1 - 2 * 1 / (3 + 2))
    # summed over the corpus, not averaged over sentences: a second pair, S = {0-0}, nothing proposed
    r2 = aer(["0-0 1-2 2-2", ""], ["0-0 1-1", "0-0"], ["0-0 1-1 1-2", ""])
    assert r2["aer"] == pytest.approx(1 - 3 / 6) and r2["recall"] == pytest.approx(1 / 3)
    assert (r2["hyp_links"], r2["sure_links"], r2["possible_links"], r2["sentences"]) == (3, 3, 4, 2)


def test_pharaoh_lines() -> None:
    assert parse_links(" 0-0  12-3\t1-2 \n") == {(0, 0), (12, 3), (1, 2)} and parse_links("") == set()
    assert format_links({(12, 3), (0, 0), (1, 2), (1, 0)}) == "0-0 1-0 1-2 12-3" and format_links([]) == ""
    for bad in ("0-a", "1:2", "-1-2", "1-2-3", "1p2", "0 - 1"):
        with pytest.raises(UserError, match="hyp line 2"):
            aer(["0-0", f"0-0 {bad}"], ["0-0", "0-0"])
    with pytest.raises(UserError, match="sure line 1"):
        aer(["0-0"], ["x"])
    with pytest.raises(UserError, match="hyp has 1 lines but sure has 2"):
        aer(["0-0"], ["0-0", "1-1"])
    with pytest.raises(UserError, match="possible has 1 lines but sure has 2"):
        aer(["0-0", "1-1"], ["0-0", "1-1"], ["0-0"])
    with pytest.raises(UserError, match="gold.align has no links"):
        aer(["0-0", ""], ["", ""], names=("hyp.align", "gold.align", "gold.align_possible"))


def test_write_text_writes_line_aligned_alignments(tmp_path: Path) -> None:
    splits = toy.generate(seed=4, n_train=30, n_valid=5, n_test=6, n_test_long=7, max_words=8)
    toy.write_text(splits, tmp_path / "toy_text")
    for split, pairs in splits.items():
        read = {suffix: (tmp_path / "toy_text" / f"{split}.{suffix}").read_text(encoding="utf-8").split("\n")
                for suffix in ("src", "tgt", "align", "align_possible")}
        assert all(lines[-1] == "" and len(lines) == len(pairs) + 1 for lines in read.values())  # one line a pair
        assert read["src"][:-1] == [s for s, _ in pairs] and read["tgt"][:-1] == [t for _, t in pairs]
        for (src, tgt), sure, possible in zip(pairs, read["align"], read["align_possible"]):
            gold_sure, gold_possible = toy.gold_alignment(src, tgt)
            assert sure == format_links(gold_sure) and parse_links(sure) == set(gold_sure)
            assert possible == format_links(gold_possible)
        assert aer(read["align"][:-1], read["align"][:-1], read["align_possible"][:-1])["aer"] == 0
