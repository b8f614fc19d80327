"""The toy language pair (relmt/data/toy.py): determinism, splits, lexicon, and each phenomenon."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from relmt.data import toy
from relmt.data.toy import NP, PP, Clause, Sentence

REPO = Path(__file__).resolve().parents[1]
PARTICLES = {toy.NOM, toy.ACC, *toy.AGR.values()}


@pytest.fixture(scope="module")
def corpus() -> dict[str, list[tuple[str, str]]]:
    return toy.generate()  # the defaults: what `make train` uses


def t(source: str) -> str:
    """Translate a hand-written source sentence through its parse."""
    return toy.translate(toy.parse(source))


def test_same_seed_same_corpus_other_seed_other_corpus() -> None:
    kw = dict(n_train=300, n_valid=30, n_test=30, n_test_long=30, max_words=10)
    a = toy.generate(seed=7, **kw)
    assert a == toy.generate(seed=7, **kw)
    b = toy.generate(seed=8, **kw)
    for split in toy.SPLITS:
        assert a[split] != b[split]


def test_no_dependence_on_hash_randomisation() -> None:
    sizes = "seed=3, n_train=500, n_valid=50, n_test=50, n_test_long=50"
    code = ("import hashlib, json; from relmt.data import toy; "
            f"print(hashlib.sha256(json.dumps(toy.generate({sizes})).encode()).hexdigest())")
    digests = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        run = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        digests.add(run.stdout.strip())
    here = toy.generate(seed=3, n_train=500, n_valid=50, n_test=50, n_test_long=50)
    assert digests == {hashlib.sha256(json.dumps(here).encode()).hexdigest()}


def test_split_sizes_and_lengths(corpus: dict[str, list[tuple[str, str]]]) -> None:
    sizes = {s: len(p) for s, p in corpus.items()}
    assert sizes == {"train": 20000, "valid": 500, "test": 500, "test_long": 500}
    lengths = {s: [len(src.split()) for src, _ in p] for s, p in corpus.items()}
    for split in ("train", "valid", "test"):
        assert 1 <= min(lengths[split]) and max(lengths[split]) == 16
    assert min(lengths["test_long"]) == 17 and max(lengths["test_long"]) == 32
    mean = {s: sum(v) / len(v) for s, v in lengths.items()}
    assert 8 <= mean["train"] <= 10 and mean["test_long"] > 1.5 * mean["test"]
    # other sizes are honoured too
    small = toy.generate(seed=2, n_train=100, n_valid=7, n_test=0, n_test_long=9, max_words=6)
    assert [len(small[s]) for s in toy.SPLITS] == [100, 7, 0, 9]
    assert all(len(s.split()) <= 6 for s, _ in small["train"] + small["valid"])
    assert all(6 < len(s.split()) <= 12 for s, _ in small["test_long"])
    with pytest.raises(ValueError):
        toy.generate(max_words=1)


def test_evaluation_splits_are_new_and_unique(corpus: dict[str, list[tuple[str, str]]]) -> None:
    train = {src for src, _ in corpus["train"]}
    seen: set[str] = set()
    for split in ("valid", "test", "test_long"):
        sources = [src for src, _ in corpus[split]]
        assert not train & set(sources)
        assert len(set(sources)) == len(sources) and not seen & set(sources)
        seen |= set(sources)


def test_vocabularies() -> None:
    lists = [toy.DET_ANY, toy.DET_SG, toy.DET_PL, toy.NOUN_I, toy.NOUN_II, list(toy.PLURAL.values()),
             toy.NAMES, toy.ADJ, toy.VI, toy.VT, toy.VS, toy.ADV, toy.PREP, toy.SUB, toy.COORD, [toy.THAT]]
    assert len(toy.CATEGORY) == sum(map(len, lists)) == 317  # no word in two categories
    assert set(toy.LEXICON) == set(toy.CATEGORY)
    targets = list(toy.LEXICON.values()) + sorted(PARTICLES)
    assert len(set(targets)) == len(targets) == 323  # one target word per source word, and 6 particles
    assert not set(targets) & set(toy.CATEGORY)  # disjoint vocabularies
    assert all(w.isascii() and w.isalpha() and w.islower() for w in targets + list(toy.CATEGORY))
    assert toy.LEXICON["dogs"] == toy.LEXICON["dog"] + "n"


def test_target_is_the_mapped_source_words_plus_particles(corpus: dict[str, list[tuple[str, str]]]) -> None:
    for split, pairs in corpus.items():
        for src, tgt in pairs:
            words = Counter(tgt.split())
            for p in PARTICLES:
                del words[p]
            assert words == Counter(toy.LEXICON[w] for w in src.split()), (split, src, tgt)


def test_source_determines_target(corpus: dict[str, list[tuple[str, str]]]) -> None:
    # The grammar is unambiguous: parsing a generated source and translating gives back its target.
    for split, pairs in corpus.items():
        for src, tgt in pairs:
            s = toy.parse(src)
            assert toy.source(s) == src and toy.translate(s) == tgt, (split, src)


def test_structures_built_from_explicit_words() -> None:
    near_bob = PP("near", NP("bob"))
    s = Sentence(Clause(NP("dog", "the", ("big", "red")), "saw", obj=NP("cat", "a", mod=near_bob)))
    assert toy.source(s) == "the big red dog saw a cat near bob"
    # the dog red big ga saw ze a cat bob near wo
    assert toy.translate(s) == "baba ponu vobo piko ga bire ze sira visa belo nibo wo"
    assert toy.parse(toy.source(s)) == s
    with pytest.raises(ValueError):
        toy.parse("dog the saw")


def test_adjectives_follow_the_noun_in_reverse_and_prepositions_become_postpositions() -> None:
    assert t("the big red dog slept") == "baba ponu vobo piko ga mini ze"
    assert t("the old big red dogs ran") == "baba ponun vobo piko lare ga sero zen"
    # the dog (the house (the trees behind) near) ga slept ze: nested PPs close in reverse
    assert t("the dog near the house behind the trees slept") == (
        "baba ponu baba voru baba liven teku nibo ga mini ze")


def test_subordinate_clauses_are_verb_final() -> None:
    # after "because" the verb moves over the object; after "and" it does not
    assert t("alice saw the cat because the dog chased bob") == (
        "ride ga bire ze baba visa wo ranu baba ponu ga belo wo meti ze")
    assert t("alice saw the cat and the dog chased bob") == (
        "ride ga bire ze baba visa wo mika baba ponu ga meti ze belo wo")
    # complement clause: the verb (with its adverb) moves over an object NP with a PP: 6 target words
    assert t("bob said that the dog quickly chased the cat near the houses") == (
        "belo ga dito ze soba baba ponu ga baba visa baba vorun nibo wo pive meti ze")
    # relative clause: "that" O wo V AGR, agreeing with the noun it modifies (house: class II sg)
    assert t("the house that saw the dogs slept") == "baba voru soba baba ponun wo bire xo ga mini xo"


def test_agreement_follows_the_head_noun_of_the_subject() -> None:
    # dogs (I pl) -> zen, though "house" (II sg) stands right before the verb; and the other way round
    assert t("the dogs near the house quickly saw alice") == (
        "baba ponun baba voru nibo ga pive bire zen ride wo")
    assert t("the house near the dogs quickly saw alice") == (
        "baba voru baba ponun nibo ga pive bire xo ride wo")
    assert t("the houses that chased a cat slept") == "baba vorun soba sira visa wo meti xon ga mini xon"
    assert t("bob slept").endswith(" ze") and t("the cats slept").endswith(" zen")


def test_swapping_subject_and_object_changes_the_translation() -> None:
    a, b = "the dog saw the cat", "the cat saw the dog"
    assert sorted(a.split()) == sorted(b.split())
    assert t(a) == "baba ponu ga bire ze baba visa wo"
    assert t(b) == "baba visa ga bire ze baba ponu wo"
    # with different numbers even the bags of target words differ (the agreement particle)
    assert Counter(t("the dogs saw the cat").split()) != Counter(t("the cat saw the dogs").split())


def test_the_corpus_needs_word_order(corpus: dict[str, list[tuple[str, str]]]) -> None:
    # Distinct training sources with one bag of words: a bag-of-words encoder sees them as one input,
    # yet their targets differ, so it must get some of them wrong.
    by_bag: dict[tuple[str, ...], dict[str, str]] = defaultdict(dict)
    for src, tgt in corpus["train"]:
        by_bag[tuple(sorted(src.split()))][src] = tgt
    groups = [g for g in by_bag.values() if len(g) > 1]
    assert len(groups) >= 500
    assert all(len(set(g.values())) == len(g) for g in groups)
    assert sum(len({tuple(sorted(x.split())) for x in g.values()}) > 1 for g in groups) >= 200


def _features(s: Sentence) -> set[str]:
    """Which phenomena a sentence structure shows."""
    found: set[str] = set()

    def np(n: NP) -> None:
        if len(n.adjs) > 1:
            found.add("adjectives reversed")
        if isinstance(n.mod, PP):
            np(n.mod.np)
        elif isinstance(n.mod, Clause):
            clause(n.mod, verb_final=True)

    def clause(c: Clause, verb_final: bool) -> None:
        if verb_final and c.obj is not None:
            found.add("verb moves over an object")
        if c.subj is not None and c.subj.mod is not None:
            found.add("subject separated from its verb")
        for n in (c.subj, c.obj):
            if n is not None:
                np(n)
        if c.comp is not None:
            clause(c.comp, verb_final=True)

    clause(s.first, verb_final=False)
    for j, c in s.rest:
        clause(c, verb_final=j in toy.SUB)
    return found


def test_phenomena_are_frequent(corpus: dict[str, list[tuple[str, str]]]) -> None:
    train = corpus["train"][:4000]
    counts = Counter(f for src, _ in train for f in _features(toy.parse(src)))
    assert counts["adjectives reversed"] > 0.3 * len(train)
    assert counts["verb moves over an object"] > 0.12 * len(train)
    assert counts["subject separated from its verb"] > 0.15 * len(train)
