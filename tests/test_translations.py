"""What translators ask of a decoder (issue 60) through the Translator API and relmt-translate: constraints,
a forced prefix, per-token scores that sum to the hypothesis's score, Pharaoh word alignments, and the
engines that cannot do one saying which can."""

from __future__ import annotations

import re

import pytest

from relmt.cli.common import guarded
from relmt.cli.translate import _translate
from relmt.decode.alignment import word_links, word_of_pieces
from relmt.decode.beam import length_penalty
from relmt.decode.translator import Translator
from relmt.errors import UserError
from tests.test_translate import SENTENCES, ckpt  # noqa: F401  (the module's trained checkpoint)

PHARAOH = re.compile(r"^(\d+-\d+( \d+-\d+)*)?$")
SHORT = {"beam": 4, "max_len_b": 8}


@pytest.fixture(scope="module")
def translator(ckpt):  # noqa: F811
    return Translator.from_checkpoint(ckpt)


def test_token_scores_sum_to_the_hypothesis_score(translator):
    cfg = translator.decode
    for hyps in translator.translations(SENTENCES, token_scores=True, nbest=2, **SHORT):
        for t in hyps:
            assert len(t.token_scores) in (len(t.pieces), len(t.pieces) + 1)  # EOS's, unless cut at the limit
            assert all(x <= 0 for x in t.token_scores)
            lp = length_penalty(len(t.token_scores), cfg.lenpen, cfg.length_norm)
            assert sum(t.token_scores) == pytest.approx(t.score * lp, abs=1e-4)


def test_alignments_are_pharaoh_links_between_words_in_range(translator):
    for src, hyps in zip(SENTENCES, translator.translations(SENTENCES, alignments=True, **SHORT)):
        t = hyps[0]
        assert PHARAOH.match(t.alignment), t.alignment
        links = [tuple(map(int, x.split("-"))) for x in t.alignment.split()]
        assert all(i < len(src.split()) and j < len(t.text.split()) for i, j in links)
        assert {j for _, j in links} == set(range(len(t.text.split())))  # every target word links somewhere


def test_word_links_merge_pieces_into_words():
    assert word_of_pieces(["\u2581the", "\u2581do", "g", "\u2581sat"]) == [0, 1, 1, 2]
    attention = [[0.1, 0.8, 0.05, 0.05], [0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.7, 0.1], [0.0, 0.0, 0.0, 1.0]]
    import numpy as np

    links = word_links(np.array(attention), ["\u2581a", "\u2581b", "c"], ["\u2581x", "y", "\u2581z"])
    assert links == [(0, 0), (1, 0), (1, 1)]  # EOS's row and column are left out


def test_target_words_are_those_of_the_returned_text(translator):
    """Issue 69 defect 6: sentencepiece writes <unk> as " \u2047 " (a word of its own) and a lone "\u2581" as a
    space, so counting word starts among the pieces named words the text does not have."""
    import numpy as np

    from relmt.decode.alignment import words_of_text

    sp = translator.tokenizer.sp
    ids = [*sp.encode("the caf"), sp.unk_id(), *sp.encode("s"), *sp.encode("dog")]
    text = sp.decode(ids)  # "the caf \u2047 s dog": five words, where the pieces start four
    words = words_of_text(ids, sp.decode)
    pieces = [sp.id_to_piece(i) for i in ids]
    assert words[-1] == len(text.split()) - 1 > word_of_pieces(pieces)[-1]
    links = word_links(np.eye(len(ids) + 1, 2), ["\u2581a", "\u2581b"], pieces, words)
    assert {j for _, j in links} == set(range(len(text.split())))
    # a lone "\u2581" (a piece of the toy models' vocabularies, not this one's) writes no word: it links nothing
    fake = ["\u2581the", "\u2581dog", "\u2581"]
    assert words_of_text([0, 1, 2], lambda ids: "".join(fake[i] for i in ids).replace("\u2581", " ").strip()) == [
        0, 1, None]


def test_a_prefix_begins_every_output_and_constraints_appear(translator):
    plain = translator.translations(SENTENCES, **SHORT)
    word = plain[0][0].text.split()[0]
    forced = translator.translations(SENTENCES, prefixes=["", word, "", "", ""], **SHORT)
    assert forced[1][0].text.split()[0] == word  # sentence 1 begins with sentence 0's first word
    phrase = plain[3][0].text.split()[-1]
    for ordered in (False, True):
        got = translator.translations(SENTENCES, constraints=[[], [phrase], [phrase, word], [], []], ordered=ordered,
                                      **SHORT)
        assert phrase in got[1][0].text.split() and got[1][0].unmet == 0
        assert {phrase, word} <= set(got[2][0].text.split())
        if ordered:
            words = got[2][0].text.split()
            assert words.index(phrase) < len(words) - 1 - words[::-1].index(word)
        assert [h[0].text for i, h in enumerate(got) if i in (0, 3, 4)] == [plain[i][0].text for i in (0, 3, 4)]


def test_empty_constraints_and_prefixes_change_nothing(translator):
    plain = translator.translations(SENTENCES, nbest=3, **SHORT)
    same = translator.translations(SENTENCES, prefixes=[""] * len(SENTENCES), constraints=[[]] * len(SENTENCES),
                                   nbest=3, **SHORT)
    assert [[(t.text, t.score) for t in hs] for hs in same] == [[(t.text, t.score) for t in hs] for hs in plain]
    assert [h[0].text for h in plain] == translator.translate(SENTENCES, **SHORT)


def test_bad_requests_are_refused_by_name(translator):
    with pytest.raises(UserError, match="one list of target phrases per sentence"):
        translator.translations(SENTENCES, constraints=["a", "b", "c", "d", "e"])
    with pytest.raises(UserError, match="prefixes: 1 given for 5 sentences"):
        translator.translations(SENTENCES, prefixes=["x"])
    with pytest.raises(UserError, match="need beam search"):
        translator.translations(SENTENCES, prefixes=["x"] * 5, sampling=True, beam=2)
    with pytest.raises(UserError, match="constraint '€' of sentence 2: the model's vocabulary has no piece"):
        translator.translations(SENTENCES, constraints=[[], ["€"], [], [], []])
    # issue 69: a prefix the vocabulary cannot spell is refused, not forced as <unk>; constraints are bounded
    with pytest.raises(UserError, match="prefix 'caf€' of sentence 1: the model's vocabulary has no piece"):
        translator.translations(SENTENCES, prefixes=["caf€", "", "", "", ""])
    with pytest.raises(UserError, match="constraints of sentence 1: 17 phrases .* more than 16 phrases"):
        translator.translations(SENTENCES, constraints=[["the"] * 17, [], [], [], []])
    with pytest.raises(UserError, match="decode.alignment_layer=7: .*decoder layers"):
        translator.translations(SENTENCES, alignments=True, alignment_layer=7)


def test_ctranslate2_refuses_constraints_naming_the_engines_that_can(translator):
    stub = Translator(translator.model, translator.tokenizer, translator.decode, translator.device, ct2=object())
    with pytest.raises(UserError, match="constraints work on engine=torch, onnx and aoti"):
        stub.translations(SENTENCES[:1], constraints=[["x"]])


def test_relmt_translate_reads_fairseqs_constraints_and_appends_columns(ckpt, tmp_path, capsys):  # noqa: F811
    translator = Translator.from_checkpoint(ckpt)
    plain = translator.translate(SENTENCES, beam=4, max_len_b=8)
    phrase = plain[3].split()[-1]
    src = tmp_path / "in.txt"
    src.write_text(f"{SENTENCES[0]}\t{phrase}\n{SENTENCES[1]}\n")
    out = tmp_path / "out.txt"
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt}", f"input={src}", f"output={out}",
                                                    "constraints=unordered", "alignments=true", "token_scores=true",
                                                    "beam=4", "max_len_b=8", "progress=false"]) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 2
    text, links, scores = lines[0].split("\t")
    assert phrase in text.split() and PHARAOH.match(links) and all(float(x) <= 0 for x in scores.split())
    assert lines[1].split("\t")[0] == plain[1]
    prefix = tmp_path / "prefix.txt"
    prefix.write_text("only one line\n")
    src.write_text(f"{SENTENCES[0]}\n{SENTENCES[1]}\n")
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt}", f"input={src}", f"prefix={prefix}"]) == 2
    assert "has 2 lines but prefix=" in capsys.readouterr().err
    src.write_text("a source\t\n")
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt}", f"input={src}",
                                                    "constraints=ordered"]) == 2
    assert f"{src}:1: an empty constraint" in capsys.readouterr().err


def test_relmt_translate_names_the_input_line_of_a_refused_constraint_or_prefix(ckpt, tmp_path, capsys):  # noqa: F811
    """Issue 74 §3: relmt-translate decodes its input in chunks of buffer_lines, and a refusal of one sentence's
    constraints or prefix names its input line, not its place in the chunk ("sentence 1" for line 5)."""
    src, prefix = tmp_path / "in.txt", tmp_path / "prefix.txt"
    common = [f"checkpoint={ckpt}", f"input={src}", "buffer_lines=2", "beam=2", "max_len_b=4", "progress=false"]
    bad = {"caf\u20ac": "constraint 'caf\u20ac' of {src} line 5: the model's vocabulary has no piece",
           "\t".join(["the"] * 17): "constraints of {src} line 5: 17 phrases of "}
    for phrases, message in bad.items():
        src.write_text("".join(f"{s}\n" for s in SENTENCES[:4]) + f"{SENTENCES[4]}\t{phrases}\n")
        assert guarded("relmt-translate", _translate, [*common, "constraints=unordered"]) == 2
        err = capsys.readouterr().err
        assert message.format(src=src) in err and "sentence 1" not in err, err
    src.write_text("".join(f"{s}\n" for s in SENTENCES))
    prefix.write_text("\n\n\ncaf\u20ac\n\n")
    assert guarded("relmt-translate", _translate, [*common, f"prefix={prefix}"]) == 2
    err = capsys.readouterr().err
    assert f"prefix 'caf\u20ac' of {src} line 4: the model's vocabulary has no piece" in err and \
        "sentence 2" not in err, err
    # the API's sentences are no input lines: there sentence i + 1 of the call is named, as before
    translator = Translator.from_checkpoint(ckpt)
    with pytest.raises(UserError, match="constraint 'caf\u20ac' of sentence 2: "):
        translator.translations(SENTENCES[:2], constraints=[[], ["caf\u20ac"]])


def test_an_ensemble_annotates_with_its_mixed_distribution_and_averaged_attention(tmp_path):
    """Two models of different depths: token scores sum to the ensemble's score, alignments read each model's
    layer (from the top) averaged, and a prefix and constraints hold."""
    from tests.tiny_checkpoints import model_config, toy_tokenizer, write_checkpoint

    spm = toy_tokenizer(tmp_path)
    cks = [write_checkpoint(tmp_path / f"m{i}", "model.pt", spm, seed=i, model=model_config(decoder_layers=1 + i))
           for i in (1, 2)]
    ensemble = Translator.from_checkpoints(cks)
    got = ensemble.translations(SENTENCES[:3], prefixes=["the", "", ""], constraints=[[], ["cat"], []],
                                alignments=True, token_scores=True, nbest=2, beam=4)
    cfg = ensemble.decode
    for hyps in got:
        for t in hyps:
            lp = length_penalty(len(t.token_scores), cfg.lenpen, cfg.length_norm)
            assert sum(t.token_scores) == pytest.approx(t.score * lp, abs=1e-4)
            assert PHARAOH.match(t.alignment)
    assert all(t.text.startswith("the") for t in got[0]) and all("cat" in t.text for t in got[1])
    with pytest.raises(UserError, match="alignment_layer=-3: .*2 decoder layers"):
        ensemble.translations(SENTENCES[:1], alignments=True, alignment_layer=-3)


def test_a_new_users_stumbles_are_said(ckpt, tmp_path, capsys, caplog):  # noqa: F811
    """Issue 69 §2: TABs read as text without constraints= are warned about; constraints with a beam no wider than
    the phrases are warned about; constraints=yes names YAML's boolean; max_sentences is an argument; --help lists
    the translator's options."""
    import logging

    src = tmp_path / "in.txt"
    src.write_text(f"{SENTENCES[0]}\tthe\n")
    out = tmp_path / "out.txt"
    common = [f"checkpoint={ckpt}", f"input={src}", f"output={out}", "max_len_b=4", "progress=false"]
    with caplog.at_level(logging.WARNING):
        assert guarded("relmt-translate", _translate, [*common, "max_sentences=1"]) == 0
        assert "line 1 holds a TAB: without constraints=ordered|unordered" in caplog.text
        caplog.clear()
        assert guarded("relmt-translate", _translate, [*common, "constraints=unordered", "beam=1"]) == 0
        assert "constraints with beam=1" in caplog.text
    assert guarded("relmt-translate", _translate, [*common, "constraints=yes"]) == 2
    assert "constraints=true (YAML reads yes/no" in capsys.readouterr().err
    assert guarded("relmt-translate", _translate, ["--help"]) == 0
    usage = capsys.readouterr().out
    for key in ("constraints=", "prefix=", "alignments=", "token_scores=", "alignment_layer=", "tgt_lang=",
                "compile=", "quantization=", "progress=", "max_sentences="):
        assert key in usage, key
