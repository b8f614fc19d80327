"""The toy language pair: a synthetic parallel corpus generated from a seed (the default corpus).

Source (`src`): English-like SVO with 317 words; verbs are past tense and never inflect, so the
number and class of a subject show on the subject alone. Grammar (`parse` is its parser):

    S  -> C ((COORD | SUB) C)*            COORD: and but or so; SUB: because although while ...
    C  -> NP ADV? (VI | VT NP | VS that C)
    NP -> NAME | DET ADJ* NOUN (PREP NP | that ADV? (VI | VT NP | VS that C))?

COORD and SUB join top-level clauses only, an NP has at most one modifier (PP or relative
clause), and adverbs precede their verb, so every sentence has one parse. Determiners agree in
number with the noun (a/every + sg, some/two + pl, the/my + either). Nouns have sg and pl words
(dog/dogs) and a class: I = people, animals, NAMEs; II = things, places.

Target (`tgt`): each source word has one fixed target word (`LEXICON`, CVCV pseudo-words, plural
noun = singular + "n"), plus 6 particles: `ga` after the subject NP, `wo` after the object NP, and
after every verb an agreement particle for the class and number of its subject's head noun: ze
(I sg), zen (I pl), xo (II sg), xon (II pl). Order:
1. NP -> DET NOUN ADJ_n .. ADJ_1 MOD (the big red dog -> the dog red big); prepositions become
   postpositions (near NP -> NP near), so nested PPs close with their postpositions reversed.
2. Main clauses (the first, and those after COORD) are verb-second: S ga ADV V AGR O wo.
   Subordinate ones (after SUB, after a VS verb's "that", relative clauses) are verb-final, the
   verb moving over the whole object: S ga O wo ADV V AGR. A VS verb's "that C" always comes
   last (extraposed, as in German). A relative clause lacks a subject and agrees with its noun.
3. So AGR needs the subject's head noun, which PPs, relative clauses and adverbs separate from
   the verb, often with other nouns in between (the dog near the houses ...) that do not count.
Example: the old dogs near alice said that the cat quickly saw bob ->
    (the dogs old) (alice near) ga said zen that (the cat) ga (bob) wo quickly saw ze
where each word stands for its target word. "the dog saw the cat" and "the cat saw the dog" have
one bag of words and different translations; the corpus holds many such role-swapped twins.

Gold word alignment (`alignment`, `gold_alignment`): links (i, j) from source word i to target
word j, 0-based, whitespace-split words. Every source word yields exactly one target word, its
LEXICON entry, so the sure links S map the source words one to one onto the target's non-particle
words. A particle translates no source word and has no sure link, only possible links (Och & Ney
2003: P includes S; a possible link is never required, and proposing one is not an error):
`ga`/`wo` to the words of the NP they close, its determiner, adjectives and noun (a name: itself),
not its PP or relative clause, which are phrases of their own; an agreement particle to its verb,
whose inflection it is (the noun it agrees with may be far away). Example:
    the dog saw the cat -> baba ponu ga bire ze baba visa wo (the dog ga saw ze the cat wo)
    S = 0-0 1-1 2-3 3-5 4-6;  P = S + 0-2 1-2 2-4 3-7 4-7
`write_text` writes each split as {split}.src and {split}.tgt (one sentence a line), {split}.align
(S) and {split}.align_possible (all of P, S included), one line per pair, in Pharaoh format:
"i-j" links separated by spaces, sorted (the format fast_align writes; relmt/evaluate/alignment.py
scores hypotheses against these files).

Splits: train/valid/test have 1..L source words, test_long L+1..2L from the same grammar (with
likelier recursion and an equal quota per length). No evaluation sentence is in train or occurs
twice across the evaluation splits; train may repeat a few short sentences.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from pathlib import Path

SPLITS = ("train", "valid", "test", "test_long")

DET_ANY = "the my your his her our their no".split()
DET_SG = "a this every each one another".split()
DET_PL = "some these those many few two three several".split()
NOUN_I = ("dog cat bird horse cow goat pig duck frog bear lion tiger rabbit snake king queen farmer "
          "teacher doctor baker sailor singer student pilot girl boy friend monkey donkey parrot").split()
NOUN_II = ("house tree river stone book table chair door window garden road bridge tower ship boat car "
           "cup lamp bell hill lake field forest castle village letter apple flower cloud shoe").split()
NAMES = ("alice bob carol dave emma frank grace henry irene jack kate leo mary nick olga paul rose sam "
         "tina victor").split()
ADJ = ("big small old young red blue green black white brown happy sad tall short quiet loud fast slow "
       "warm cold soft hard bright dark rich poor clever lazy brave shy kind angry strong weak clean dirty "
       "heavy round tiny wild").split()
VI = ("slept ran walked laughed cried smiled waited jumped danced sang arrived fell swam shouted rested "
      "sat stood moved stayed played worked vanished slipped coughed yawned").split()
VT = ("saw chased found followed helped liked loved hated kissed pushed pulled carried watched visited "
      "called painted cleaned touched kicked washed opened closed bought sold built broke stole caught "
      "held ate drew met greeted admired ignored").split()
VS = "said thought knew believed hoped feared claimed noticed dreamed heard".split()  # take "that C"
ADV = ("quickly slowly often never always sometimes rarely suddenly quietly loudly happily sadly gladly "
       "finally already surely barely gently proudly calmly").split()
PREP = "near behind under above beside inside outside below beyond without with around".split()
SUB = "because although while when if before after until".split()  # open a verb-final clause
COORD = "and but or so".split()  # open a main (verb-second) clause
THAT = "that"
PLURAL = {n: n + "s" for n in NOUN_I + NOUN_II}
NOM, ACC = "ga", "wo"
AGR = {("I", False): "ze", ("I", True): "zen", ("II", False): "xo", ("II", True): "xon"}

CATEGORY: dict[str, str] = {}
for _cat, _words in [("det", DET_ANY + DET_SG + DET_PL), ("noun", NOUN_I + NOUN_II + list(PLURAL.values())),
                     ("name", NAMES), ("adj", ADJ), ("vi", VI), ("vt", VT), ("vs", VS), ("adv", ADV),
                     ("prep", PREP), ("sub", SUB), ("coord", COORD), ("that", [THAT])]:
    CATEGORY.update(dict.fromkeys(_words, _cat))  # tests check that no word is in two categories
# class and number of every word that can head a subject
NOUN_FEATURES = {**{n: ("I", False) for n in NOUN_I + NAMES}, **{n: ("II", False) for n in NOUN_II},
                 **{PLURAL[n]: ("I", True) for n in NOUN_I}, **{PLURAL[n]: ("II", True) for n in NOUN_II}}


def _make_lexicon() -> dict[str, str]:
    """Source word -> target word. Arithmetic rather than an RNG, so it is the same on every Python."""
    syllables = [c + v for c in "bdklmnprstv" for v in "aeiou"]  # 55 syllables, 3025 CVCV words
    m, j, lex = len(syllables), 0, {}
    for w in [w for w, cat in CATEGORY.items() if cat != "noun" or w in PLURAL]:  # plurals: below
        while True:  # walk the CVCV words with a stride coprime to m*m: a fixed, scrambled order
            k, j = j * 1009 % (m * m), j + 1
            a, b = k % m, (k // m + 17 * (k % m)) % m  # still a bijection; both syllables vary
            cand = syllables[a] + syllables[b]
            if cand not in CATEGORY:
                break
        lex[w] = cand
    lex.update({pl: lex[sg] + "n" for sg, pl in PLURAL.items()})
    return lex


LEXICON = _make_lexicon()


@dataclass(frozen=True)
class NP:
    """A name (no det), or DET ADJ* NOUN with at most one modifier: a PP or a relative clause."""

    noun: str
    det: str | None = None
    adjs: tuple[str, ...] = ()
    mod: PP | Clause | None = None  # a relative clause is a Clause with subj=None


@dataclass(frozen=True)
class PP:
    prep: str
    np: NP


@dataclass(frozen=True)
class Clause:
    subj: NP | None  # None: the gap of a relative clause
    verb: str
    obj: NP | None = None  # VT verbs
    comp: Clause | None = None  # VS verbs: that + comp
    adv: str | None = None


@dataclass(frozen=True)
class Sentence:
    first: Clause
    rest: tuple[tuple[str, Clause], ...] = ()  # (COORD or SUB word, clause)


def _src_np(np: NP) -> list[str]:
    out = ([np.det] if np.det else []) + list(np.adjs) + [np.noun]
    if isinstance(np.mod, PP):
        out += [np.mod.prep] + _src_np(np.mod.np)
    elif isinstance(np.mod, Clause):
        out += [THAT] + _src_clause(np.mod)
    return out


def _src_clause(c: Clause) -> list[str]:
    out = (_src_np(c.subj) if c.subj else []) + ([c.adv] if c.adv else []) + [c.verb]
    out += _src_np(c.obj) if c.obj else []
    return out + ([THAT] + _src_clause(c.comp) if c.comp else [])


def source(s: Sentence) -> str:
    """The source sentence of a structure."""
    return " ".join(_src_clause(s.first) + [w for j, c in s.rest for w in [j] + _src_clause(c)])


Link = tuple[int, int]  # (source word index, target word index), 0-based

# A target word: (word, the source index it translates, None for a particle, the source indices
# a particle may be linked to).
_Tok = tuple[str, int | None, tuple[int, ...]]


def _word(w: str, i: int) -> _Tok:
    return LEXICON[w], i, ()


def _core(np: NP, o: int) -> tuple[int, ...]:
    """Source indices of an NP's own words (det, adjectives, noun) when it starts at index o."""
    return tuple(range(o, o + (len(np.adjs) + 2 if np.det else 1)))


def _tgt_np(np: NP, o: int) -> list[_Tok]:
    """The target words of an NP whose first source word is at index o."""
    if np.det is None:
        return [_word(np.noun, o)]
    n = o + 1 + len(np.adjs)  # the noun
    out = [_word(np.det, o), _word(np.noun, n)] + [_word(a, o + 1 + k) for k, a in reversed(list(enumerate(np.adjs)))]
    if isinstance(np.mod, PP):
        out += _tgt_np(np.mod.np, n + 2) + [_word(np.mod.prep, n + 1)]
    elif isinstance(np.mod, Clause):
        out += [_word(THAT, n + 1)] + _tgt_clause(np.mod, n + 2, verb_final=True, head=np)
    return out


def _tgt_clause(c: Clause, o: int, verb_final: bool, head: NP | None = None) -> list[_Tok]:
    """The target words of a clause whose first source word is at index o. `head`: the noun a
    relative clause modifies, which its verb agrees with."""
    v = o + (len(_src_np(c.subj)) if c.subj else 0) + (c.adv is not None)  # the verb
    subj = _tgt_np(c.subj, o) + [(NOM, None, _core(c.subj, o))] if c.subj else []
    verb = ([_word(c.adv, v - 1)] if c.adv else []) + [_word(c.verb, v)]
    verb.append((AGR[NOUN_FEATURES[(c.subj or head).noun]], None, (v,)))
    obj = _tgt_np(c.obj, v + 1) + [(ACC, None, _core(c.obj, v + 1))] if c.obj else []
    t = v + 1 + (len(_src_np(c.obj)) if c.obj else 0)  # "that" of a complement
    comp = [_word(THAT, t)] + _tgt_clause(c.comp, t + 1, verb_final=True) if c.comp else []
    return subj + (obj + verb if verb_final else verb + obj) + comp


def _tgt_sentence(s: Sentence) -> list[_Tok]:
    out, o = _tgt_clause(s.first, 0, verb_final=False), len(_src_clause(s.first))
    for j, c in s.rest:
        out += [_word(j, o)] + _tgt_clause(c, o + 1, verb_final=j in SUB)
        o += 1 + len(_src_clause(c))
    return out


def translate(s: Sentence) -> str:
    """The target sentence of a structure (see the module docstring for the rules)."""
    return " ".join(w for w, _, _ in _tgt_sentence(s))


def alignment(s: Sentence) -> tuple[list[Link], list[Link]]:
    """The gold alignment of `source(s)` and `translate(s)`: (sure, possible) links (source index,
    target index), each sorted; possible includes sure (see the module docstring)."""
    sure, possible = [], []
    for j, (_, i, may) in enumerate(_tgt_sentence(s)):
        if i is not None:
            sure.append((i, j))
        possible += [(k, j) for k in may]
    return sorted(sure), sorted(sure + possible)


def gold_alignment(src: str, tgt: str | None = None) -> tuple[list[Link], list[Link]]:
    """`alignment` of a toy source sentence, through its one parse. With `tgt`, check first that
    it is the sentence's translation (ValueError if not), as it is for every generated pair."""
    s = parse(src)
    if tgt is not None and translate(s) != tgt:
        raise ValueError(f"{tgt!r} is not the toy translation of {src!r}")
    return alignment(s)


def parse(text: str) -> Sentence:
    """The one parse of a source sentence (the grammar is LL(1)). Determiner agreement is not checked."""
    toks, i = text.split(), 0

    def cat() -> str | None:
        return CATEGORY.get(toks[i]) if i < len(toks) else None

    def take(*cats: str) -> str:
        nonlocal i
        if cat() not in cats:
            raise ValueError(f"expected {'/'.join(cats)} at word {i} of {text!r}")
        i += 1
        return toks[i - 1]

    def np() -> NP:
        if cat() == "name":
            return NP(take("name"))
        det, adjs = take("det"), []
        while cat() == "adj":
            adjs.append(take("adj"))
        noun, mod = take("noun"), None
        if cat() == "prep":
            mod = PP(take("prep"), np())
        elif cat() == "that":
            take("that")
            mod = clause(None)
        return NP(noun, det, tuple(adjs), mod)

    def clause(subj: NP | None) -> Clause:
        adv = take("adv") if cat() == "adv" else None
        verb = take("vi", "vt", "vs")
        obj = np() if CATEGORY[verb] == "vt" else None
        if CATEGORY[verb] != "vs":
            return Clause(subj, verb, obj, adv=adv)
        take("that")
        return Clause(subj, verb, comp=clause(np()), adv=adv)

    first, rest = clause(np()), []
    while i < len(toks):
        rest.append((take("coord", "sub"), clause(np())))
    return Sentence(first, tuple(rest))


def _pick(rng: random.Random, seq: list[str]) -> str:
    # Only random() is guaranteed to give the same sequence on every Python version; choice() is not.
    return seq[int(rng.random() * len(seq))]


# Branching probabilities. `boost` multiplies the recursive ones (test_long); they also shrink with
# depth, and MAX_DEPTH bounds the nesting, so a sentence stays finite for any boost.
P_NAME, P_PLURAL, P_ADJ, P_ADV, P_VT = 0.1, 0.4, 0.5, 0.25, 0.7
P_PP, P_REL, P_VS, P_JOIN = 0.2, 0.12, 0.12, 0.25
MAX_DEPTH, MAX_JOINS = 5, 4
P_SWAP = 0.1  # a sentence whose first clause has an object is followed by its role swap


def _np(rng: random.Random, boost: float, depth: int) -> NP:
    if rng.random() < P_NAME:
        return NP(_pick(rng, NAMES))
    plural = rng.random() < P_PLURAL
    stem = _pick(rng, NOUN_I + NOUN_II)
    det = _pick(rng, DET_ANY + (DET_PL if plural else DET_SG))
    adjs: list[str] = []
    while len(adjs) < 3 and rng.random() < P_ADJ:
        adjs.append(_pick(rng, [a for a in ADJ if a not in adjs]))
    r, decay = rng.random(), boost * 0.7 ** depth
    mod: PP | Clause | None = None
    if depth < MAX_DEPTH and r < P_PP * decay:
        mod = PP(_pick(rng, PREP), _np(rng, boost, depth + 1))
    elif depth < MAX_DEPTH and r < (P_PP + P_REL) * decay:
        mod = _clause(rng, boost, depth + 1, relative=True)
    return NP(PLURAL[stem] if plural else stem, det, tuple(adjs), mod)


def _clause(rng: random.Random, boost: float, depth: int, relative: bool = False) -> Clause:
    subj = None if relative else _np(rng, boost, depth)
    adv = _pick(rng, ADV) if rng.random() < P_ADV else None
    r = rng.random()
    if depth < MAX_DEPTH and r < P_VS * boost * 0.7 ** depth:
        return Clause(subj, _pick(rng, VS), comp=_clause(rng, boost, depth + 1), adv=adv)
    if r < 1 - P_VT:
        return Clause(subj, _pick(rng, VI), adv=adv)
    return Clause(subj, _pick(rng, VT), obj=_np(rng, boost, depth + 1), adv=adv)


def sample(rng: random.Random, boost: float = 1.0) -> Sentence:
    """One random sentence structure; boost > 1 makes recursion likelier (longer sentences)."""
    first, rest = _clause(rng, boost, 0), []
    while len(rest) < MAX_JOINS and rng.random() < min(0.9, P_JOIN * boost):
        rest.append((_pick(rng, COORD if rng.random() < 0.5 else SUB), _clause(rng, boost, 0)))
    return Sentence(first, tuple(rest))


def _draw(rng: random.Random, n: int, lo: int, hi: int, boost: float, taken: set[str] | None,
          per_length: bool) -> list[tuple[str, str]]:
    """n pairs with lo..hi source words, by rejection. taken: sources to avoid, and to add to
    (None: repeats allowed). per_length: an equal quota for every length in lo..hi."""
    quota = {k: n // (hi - lo + 1) + (k - lo < n % (hi - lo + 1)) for k in range(lo, hi + 1)}
    out: list[tuple[str, str]] = []
    for _ in range(100 * n + 10000):
        if len(out) == n:
            break
        s = sample(rng, boost)
        twins, c = [s], s.first
        # Role-swapped twins put pairs with one bag of words and different targets in every split.
        if c.obj is not None and c.obj != c.subj and rng.random() < P_SWAP:
            twins.append(Sentence(replace(c, subj=c.obj, obj=c.subj), s.rest))
        for t in twins:
            src = source(t)
            k = src.count(" ") + 1
            if (len(out) == n or not lo <= k <= hi or (per_length and not quota[k])
                    or (taken is not None and src in taken)):
                continue
            quota[k] -= 1
            if taken is not None:
                taken.add(src)
            out.append((src, translate(t)))
    if len(out) < n:
        raise ValueError(f"found only {len(out)} of {n} new sentences of {lo}..{hi} words; "
                         "ask for fewer or raise max_words")
    return out


def generate(seed: int = 1, n_train: int = 20000, n_valid: int = 500, n_test: int = 500,
             n_test_long: int = 500, max_words: int = 16) -> dict[str, list[tuple[str, str]]]:
    """Return {split: [(source_sentence, target_sentence), ...]} for the four splits."""
    if max_words < 2:
        raise ValueError(f"max_words must be >= 2 (the shortest sentence has 2 words), got {max_words}")
    # One stream per split (string seeds hash with sha512, not hash()): the evaluation splits do
    # not change when n_train does, except for the sentences that now collide with train.
    rngs = {s: random.Random(f"relmt-toy:{seed}:{s}") for s in SPLITS}
    train = _draw(rngs["train"], n_train, 1, max_words, 1.0, None, per_length=False)
    taken = {src for src, _ in train}  # grows as each evaluation split is drawn
    out = {"train": train, **{split: _draw(rngs[split], n, 1, max_words, 1.0, taken, per_length=False)
                              for split, n in (("valid", n_valid), ("test", n_test))}}
    # Longer sentences need likelier recursion; this boost keeps rejection cheap for L from 2 to ~50.
    boost = min(2.0, max(1.0, max_words / 8))
    out["test_long"] = _draw(rngs["test_long"], n_test_long, max_words + 1, 2 * max_words, boost, taken,
                             per_length=True)
    return out


def pharaoh(links: list[Link]) -> str:
    """Links as one Pharaoh line: "i-j" sorted and separated by spaces (relmt/evaluate/alignment.py reads it)."""
    return " ".join(f"{i}-{j}" for i, j in sorted(links))


def write_text(splits: dict[str, list[tuple[str, str]]], out: Path) -> None:
    """Write every split into folder `out` (made if missing) as {split}.src, {split}.tgt,
    {split}.align and {split}.align_possible: line k of each is pair k (see the module docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    for split, pairs in splits.items():
        links = [gold_alignment(src, tgt) for src, tgt in pairs]
        files = {"src": [src for src, _ in pairs], "tgt": [tgt for _, tgt in pairs],
                 "align": [pharaoh(sure) for sure, _ in links],
                 "align_possible": [pharaoh(possible) for _, possible in links]}
        for suffix, lines in files.items():
            (out / f"{split}.{suffix}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
