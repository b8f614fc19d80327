"""relmt-serve takes what translators ask of a decoder (issue 60) per request: a target prefix, constraints
(ordered or not), word alignments and token scores.

As in tests/test_serve.py (whose checkpoint, server and helpers this module uses), the server is the real process
on 127.0.0.1, port=0, driven over loopback with httpx; every request loop is bounded in count and time. The
module's one server runs continuous batching (the default): plain requests, annotated or not, join the running
search, and those with a prefix or constraints are decoded batch by batch, counted in /metrics.
"""

from __future__ import annotations

import re

import pytest

from relmt.decode.beam import length_penalty
from tests.test_serve import ckpt, in_threads, post, server, still_serving  # noqa: F401
from tests.tiny_checkpoints import DECODE

PHARAOH = re.compile(r"^(\d+-\d+( \d+-\d+)*)?$")
SENTENCES = ["the dog saw the cat", "alice said that bob arrived", "", "bob ran"]
APART = 'relmt_serve_decoded_apart_total{{reason="{}"}}'


@pytest.fixture(scope="module")
def translator(ckpt):  # noqa: F811
    from relmt.decode.translator import Translator

    return Translator.from_checkpoint(ckpt)


def ok(server, body) -> dict:  # noqa: F811
    r = post(server, body)
    assert r.status_code == 200, r.text
    return r.json()


def check_token_scores(scores: list[float], score: float) -> None:
    """log p of each piece (and EOS's): their sum is the hypothesis's score times the search's length penalty."""
    assert scores and all(x <= 0 for x in scores)
    lp = length_penalty(len(scores), DECODE.lenpen, DECODE.length_norm)
    assert sum(scores) == pytest.approx(score * lp, abs=1e-4)


def test_constraints_appear_in_the_output_and_are_decoded_apart(server, translator):  # noqa: F811
    for order in ("unordered", "ordered"):
        before = server.metric(APART.format("constraints"))
        constraints = [["wo", "buko"], [], [], ["ga"]]
        body = ok(server, {"text": SENTENCES, "constraints": constraints, "constraints_order": order})
        assert server.metric(APART.format("constraints")) == before + 1
        texts = body["translations"]
        assert "wo" in texts[0] and "buko" in texts[0] and "ga" in texts[3]
        if order == "ordered":
            assert texts[0].find("wo") < texts[0].rfind("buko")
        assert body["unmet"] == [0, 0, None, 0]  # null for the empty sentence, as its score
        want = translator.translations(SENTENCES, constraints=constraints, ordered=order == "ordered")
        assert texts == [hs[0].text if hs else "" for hs in want]
        assert "alignments" not in body and "token_scores" not in body
    one = ok(server, {"text": "bob ran", "constraints": ["buko"], "options": {"nbest": 2}})
    assert "buko" in one["translations"][0] and one["unmet"] == [0]
    assert one["nbest"][0] and all(h["unmet"] == 0 and "buko" in h["translation"] for h in one["nbest"][0])


def test_a_prefix_begins_the_output_and_blank_ones_ask_for_nothing(server):  # noqa: F811
    plain = ok(server, {"text": SENTENCES})
    before = server.metric(APART.format("prefix"))
    body = ok(server, {"text": SENTENCES, "prefix": ["meta nura", "", "buko", ""]})
    assert server.metric(APART.format("prefix")) == before + 1
    assert body["translations"][0].startswith("meta nura")
    assert body["translations"][1:] == plain["translations"][1:]  # an empty sentence stays "", whatever its prefix
    assert body["scores"][2] is None and "unmet" not in body
    assert ok(server, {"text": "bob ran", "prefix": "ga"})["translations"][0].startswith("ga")
    blank = ok(server, {"text": SENTENCES, "prefix": [""] * 4, "constraints": [[]] * 4})
    assert blank["translations"] == plain["translations"]
    assert server.metric(APART.format("prefix")) == before + 2  # the blank ones joined the running search


def test_alignments_and_token_scores_annotate_the_running_searchs_output(server, translator):  # noqa: F811
    apart = [server.metric(APART.format(r)) for r in ("constraints", "prefix")]
    plain = ok(server, {"text": SENTENCES, "options": {"nbest": 2}})
    body = ok(server, {"text": SENTENCES, "alignments": True, "token_scores": True, "options": {"nbest": 2}})
    assert [server.metric(APART.format(r)) for r in ("constraints", "prefix")] == apart  # not decoded apart
    assert body["translations"] == plain["translations"] and body["scores"] == plain["scores"]
    assert body["alignments"][2] is None and body["token_scores"][2] is None and "unmet" not in body
    want = translator.translations(SENTENCES, alignments=True, token_scores=True, nbest=2)
    for src, text, links, scores, score, nbest, w in zip(SENTENCES, body["translations"], body["alignments"],
                                                         body["token_scores"], body["scores"], body["nbest"], want):
        if not src:
            continue
        assert PHARAOH.match(links), links
        assert all(i < len(src.split()) and j < max(1, len(text.split()))
                   for i, j in (map(int, x.split("-")) for x in links.split()))
        check_token_scores(scores, score)
        assert [h["alignment"] for h in nbest] == [t.alignment for t in w]
        for h, t in zip(nbest, w):
            check_token_scores(h["token_scores"], h["score"])
            assert h["token_scores"] == pytest.approx(t.token_scores, abs=1e-4)


def test_annotated_constrained_and_plain_requests_at_once(server):  # noqa: F811
    """The three kinds queued together: the plain and the annotated ones share the running search, the constrained
    one waits for it to end; each gets its own answer."""
    bodies = [{"text": ["bob ran", "the dog saw the cat"]},
              {"text": ["bob ran", "the dog saw the cat"], "token_scores": True},
              {"text": ["bob ran", "the dog saw the cat"], "constraints": [["buko"], []], "alignments": True}]
    plain, scored, constrained = [r.json() for r in in_threads([lambda b=b: post(server, b) for b in bodies])]
    assert scored["translations"] == plain["translations"] and "alignments" not in scored
    for scores, score in zip(scored["token_scores"], scored["scores"]):
        check_token_scores(scores, score)
    assert "buko" in constrained["translations"][0] and constrained["unmet"] == [0, 0]
    assert all(PHARAOH.match(a) for a in constrained["alignments"]) and "token_scores" not in constrained


BAD = [  # (id, body, status, the field the answer names)
    ("prefix wrong type", {"text": "a", "prefix": 3}, 422, "prefix"),
    ("prefix list for one sentence", {"text": "a", "prefix": ["x"]}, 422, "prefix"),
    ("prefix string for a list", {"text": ["a", "b"], "prefix": "x"}, 422, "prefix"),
    ("prefix count", {"text": ["a", "b"], "prefix": ["x"]}, 422, "prefix"),
    ("prefix item wrong type", {"text": ["a", "b"], "prefix": ["x", 3]}, 422, "prefix[1]"),
    ("prefix nul", {"text": ["a"], "prefix": ["x\0"]}, 422, "prefix[0]"),
    ("prefix too long", {"text": "a", "prefix": "x" * 201}, 413, "prefix"),
    ("constraints a string", {"text": "a", "constraints": "buko"}, 422, "constraints"),
    ("constraints nested for one sentence", {"text": "a", "constraints": [["buko"]]}, 422, "constraints[0]"),
    ("constraints flat for a list", {"text": ["a", "b"], "constraints": ["buko", "ga"]}, 422, "constraints"),
    ("constraints count", {"text": ["a", "b"], "constraints": [["buko"]]}, 422, "constraints"),
    ("constraint wrong type", {"text": ["a"], "constraints": [[3]]}, 422, "constraints[0][0]"),
    ("constraint empty", {"text": ["a", "b"], "constraints": [["buko"], [" "]]}, 422, "constraints[1][0]"),
    ("constraint the vocabulary cannot spell", {"text": ["a", "b"], "constraints": [[], ["buko", "\u20ac"]]}, 422,
     "constraints[1][1]"),
    ("constraints too long", {"text": ["a"], "constraints": [["buko " * 30, "ga " * 30]]}, 413, "constraints[0]"),
    # issue 69 defect 3: a request's constraints are bounded as its size is (each phrase raises the search's cost)
    ("phrases over 16 a sentence", {"text": "a", "constraints": ["ga"] * 17}, 413, "constraints"),
    ("pieces over 64 a sentence", {"text": ["a"], "constraints": [["a " * 70]]}, 413, "constraints[0]"),
    ("phrases over max_request_phrases", {"text": ["a"] * 5, "constraints": [["ga"] * 16] * 5}, 413, "constraints"),
    # defect 7: a prefix is refused as a constraint is, not forced as <unk>
    ("prefix the vocabulary cannot spell", {"text": "a", "prefix": "caf\u20ac"}, 422, "prefix"),
    ("constraints_order unknown", {"text": "a", "constraints_order": "sometimes"}, 422, "constraints_order"),
    ("alignments not a bool", {"text": "a", "alignments": "yes"}, 422, "alignments"),
    ("token_scores as int", {"text": "a", "token_scores": 1}, 422, "token_scores"),
    ("constraints with sampling", {"text": "a", "constraints": ["buko"], "options": {"sampling": True, "beam": 2}},
     422, "constraints"),
    ("prefix with sampling", {"text": "a", "prefix": "ga", "options": {"sampling": True}}, 422, "prefix"),
    ("misspelt field", {"text": "a", "constraint": ["buko"]}, 422, "constraint"),
]


@pytest.mark.parametrize("body,status,field", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_fields_get_a_clear_4xx_naming_them(server, body, status, field):  # noqa: F811
    r = post(server, body)
    assert r.status_code == status, r.text
    assert r.json()["field"] == field, r.json()
    still_serving(server)


def test_a_beam_too_narrow_for_a_sentence_s_constraints_is_warned_of_in_the_answer(server):  # noqa: F811
    """The warning relmt-translate logs reached the server's log only (issue 74 §4): the answer's `warnings` names
    each sentence it is about, and an answer with nothing to warn of has none."""
    body = ok(server, {"text": ["the dog saw the cat", "bob ran", ""], "constraints": [["wo", "buko"], ["ga"], []],
                       "options": {"beam": 2}})
    assert body["warnings"] == [{"sentence": 0, "message": "text[0]: constraints with beam=2: a beam narrower than "
                                 "its sentence's phrases + 1 (3) has no room beside the banks that make progress, "
                                 "and output tends to place the phrases at once; use beam=4 or more"}]
    assert len(body["translations"]) == 3 and body["unmet"][2] is None
    one = ok(server, {"text": "bob ran", "constraints": ["buko", "ga"], "options": {"beam": 2, "nbest": 2}})
    assert [w["sentence"] for w in one["warnings"]] == [0]
    assert one["warnings"][0]["message"].startswith("text: constraints with beam=2: a beam narrower")
    assert "warnings" not in ok(server, {"text": ["bob ran"], "constraints": [["buko", "ga"]], "options": {"beam": 3}})
    assert "warnings" not in ok(server, {"text": ["bob ran"]})


def test_a_source_cut_to_max_source_len_is_warned_of_per_sentence():
    from relmt.config import DecodeConfig
    from relmt.serve.requests import TranslateRequest

    req = TranslateRequest(["a b c d", "x", ""], DecodeConfig(max_source_len=3))
    assert req.warnings([[5, 6, 7, 8], [9], []]) == [
        {"sentence": 0, "message": "text[0]: the source has 4 tokens, more than max_source_len=3; decoding only its "
                                   "first 3"}]
    assert TranslateRequest(["a"], DecodeConfig(max_source_len=0), single=True).warnings([[5] * 2000]) == []


def test_a_ctranslate2_server_refuses_constraints_and_takes_a_prefix():
    from relmt.config import DecodeConfig
    from relmt.serve.args import ServeArgs
    from relmt.serve.requests import ApiError, parse_body

    args = ServeArgs(engine="ctranslate2")
    with pytest.raises(ApiError, match="engine=ctranslate2, which has no lexically constrained search") as e:
        parse_body(b'{"text": ["a"], "constraints": [["buko"]]}', args, DecodeConfig())
    assert (e.value.status, e.value.field) == (422, "constraints")
    req = parse_body(b'{"text": ["a", "b"], "prefix": ["ga", ""], "constraints": [[], []]}', args, DecodeConfig())
    assert req.asks.prefixes == ["ga", ""] and req.asks.constraints is None and req.asks.apart == "prefix"


def test_a_ctranslate2_server_decodes_with_ctranslate2_not_the_torch_model_beside_it():
    """Its Translator keeps the torch model (for alignments and token scores), which continuous batching would
    otherwise have taken for the model to search with."""
    from relmt.config import ModelConfig
    from relmt.model.transformer import build_model
    from tests.test_serve import scheduler

    b = scheduler(continuous=True)
    b.translator.model = build_model(ModelConfig(d_model=16, n_heads=2, d_ff=32, encoder_layers=1,
                                                 decoder_layers=1), 20, 0)
    b.translator.ct2 = None
    assert b.streams()
    b.translator.ct2 = object()  # a Ct2Model
    assert not b.streams()
