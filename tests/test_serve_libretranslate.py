"""relmt-serve speaks LibreTranslate's API (relmt/serve/libretranslate.py) beside /v1/translate, on one server.

As in tests/test_serve.py (whose Server and helpers this module uses), the server is the real process on 127.0.0.1,
port=0, driven over loopback with httpx and with LibreTranslate's own client, libretranslatepy; every request loop is
bounded in count and time. The module's one server has an API key, a model of the pair en -> de, the limits of
test_serve.py and max_connections=1 (so that a slow request makes the next one meet the cap). Each LibreTranslate
answer is checked against what /v1/translate answers for the same lines.
"""

from __future__ import annotations

import html
import re
import urllib.error

import pytest

from relmt.config import DataConfig
from relmt.serve.markup import html_parts, joined, lines
from tests.test_serve import KEY, LIMITS, Server, httpx, in_threads, post
from tests.tiny_checkpoints import toy_tokenizer, write_checkpoint

LibreTranslateAPI = pytest.importorskip("libretranslatepy").LibreTranslateAPI
SENTENCES = ["the dog saw the cat", "alice said that bob arrived", "bob ran"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("lt")
    ck = write_checkpoint(d, "en_de.pt", toy_tokenizer(d), seed=7, eos_boost=1.0,  # outputs that differ
                          data=DataConfig(src="en", tgt="de"))
    s = Server(ck, d / "server.log", *LIMITS, "max_connections=1", key=KEY)
    s.anon = httpx.Client(base_url=s.url, timeout=30)  # no Authorization header: the key goes in the body
    yield s
    s.anon.close()
    s.stop()


def v1(server, text, **options) -> dict:
    r = post(server, {"text": text, **({"options": options} if options else {})})
    assert r.status_code == 200, r.text
    return r.json()


def lt(server, **body) -> httpx.Response:
    return server.anon.post("/translate", json={"api_key": KEY, **body})


def refused(r: httpx.Response, status: int, message: str) -> None:
    assert (r.status_code, r.json()) == (status, {"error": message}), r.text


def test_libretranslatepy_translates_detects_and_lists_as_the_server_does(server):
    client = LibreTranslateAPI(server.url, api_key=KEY)  # a form body, api_key in it
    best = v1(server, SENTENCES)["translations"]
    for sentence, translation in zip(SENTENCES, best):
        assert client.translate(sentence, "en", "de") == translation
    # a text of several lines: each line translated, line breaks (CRLF as LF, as LibreTranslate) and spaces kept
    assert client.translate(f"  {SENTENCES[0]}\r\n\n{SENTENCES[2]} ", "en", "de") == f"  {best[0]}\n\n{best[2]} "
    assert client.languages() == [{"code": "en", "name": "English", "targets": ["de"]},
                                  {"code": "de", "name": "German", "targets": []}]
    assert client.detect("whatever it says") == [{"confidence": 100.0, "language": "en"}]
    with pytest.raises(urllib.error.HTTPError) as e:
        client.translate("bob ran", "en", "fr")
    assert e.value.code == 400 and e.value.read() == b'{"error":"fr is not supported"}'


def test_a_list_of_texts_auto_and_alternatives_are_the_n_best(server):
    r = lt(server, q=SENTENCES, source="auto", target="de")
    assert r.status_code == 200, r.text
    assert r.json() == {"translatedText": v1(server, SENTENCES)["translations"],
                        "detectedLanguage": [{"confidence": 100.0, "language": "en"}] * len(SENTENCES)}
    nbest = v1(server, SENTENCES, beam=3, nbest=3)["nbest"]
    expected = []
    for hyps in nbest:  # LibreTranslate leaves out repeats, the best and ""
        texts = [h["translation"] for h in hyps]
        expected.append([t for i, t in enumerate(texts) if i and t not in texts[:i] and t])
    r = lt(server, q=SENTENCES, source="en", target="de", alternatives=2)
    assert r.json() == {"translatedText": [hyps[0]["translation"] for hyps in nbest], "alternatives": expected}
    one = lt(server, q=SENTENCES[0], source="en", target="de", alternatives="2").json()
    assert one == {"translatedText": nbest[0][0]["translation"], "alternatives": expected[0]}
    refused(lt(server, q="bob ran", source="en", target="de", alternatives=6), 400,
            "Invalid request: alternatives parameter must be <= 5")  # max_beam=6
    refused(lt(server, q="bob ran", source="en", target="de", alternatives="two"), 400,
            "Invalid request: alternatives parameter is not a number")


def test_html_keeps_its_markup_and_translates_its_text(server):
    q = ('<p class="x">the dog saw the cat</p>\n<p><b>bob ran</b><br/> &amp; alice said that bob arrived</p>'
         '<script>var a = "<b>bob</b>";</script><!-- a comment -->')
    t = v1(server, ["the dog saw the cat", "bob ran", "& alice said that bob arrived"])["translations"]
    e = [html.escape(x, quote=False) for x in t]
    r = lt(server, q=q, source="en", target="de", format="html")
    assert r.json() == {"translatedText": f'<p class="x">{e[0]}</p>\n<p><b>{e[1]}</b><br/> {e[2]}</p>'
                                          '<script>var a = "<b>bob</b>";</script><!-- a comment -->'}
    assert lt(server, q="<br/>", source="en", target="de", format="html").json() == {"translatedText": "<br/>"}
    refused(lt(server, q="bob ran", source="en", target="de", format="pdf"), 400, "pdf format is not supported")


def test_refusals_have_libretranslates_status_and_text(server):
    for missing in ("q", "source", "target"):
        body = {k: v for k, v in {"q": "bob ran", "source": "en", "target": "de"}.items() if k != missing}
        refused(lt(server, **body), 400, f"Invalid request: missing {missing} parameter")
    refused(lt(server, q="", source="en", target="de"), 400, "Invalid request: missing q parameter")
    refused(lt(server, q="bob ran", source="xx", target="de"), 400, "xx is not supported")
    refused(lt(server, q="bob ran", source="de", target="en"), 400,
            "English (en) is not available as a target language from German (de)")
    # the server's limits: max_line_chars=200 per text, max_lines=8 texts and lines
    refused(lt(server, q="a" * 201, source="en", target="de"), 400,
            "Invalid request: request (201) exceeds text limit (200)")
    refused(lt(server, q=["bob ran"] * 9, source="en", target="de"), 400,
            "Invalid request: request (9) exceeds text limit (8)")
    refused(lt(server, q=["bob ran\nbob ran"] * 5, source="en", target="de"), 400,
            "Invalid request: request (10) exceeds text limit (8)")
    refused(lt(server, q="bob\0ran", source="en", target="de"), 400,
            "q: NUL character at 3; text must be without NUL")
    refused(server.anon.post("/translate", content=b"[1]", headers={"Content-Type": "application/json"}), 400,
            "Invalid JSON format")
    big = lt(server, q="x" * 5000, source="en", target="de")  # max_body_bytes=4096: relmt's own text
    assert big.status_code == 400 and re.fullmatch(r"the body is \d+ bytes, more than max_body_bytes=4096",
                                                   big.json()["error"]), big.text
    assert server.client.get("/nowhere").json()["error"].endswith(
        "LibreTranslate's POST /translate, /detect, GET /languages and /frontend/settings)")


def test_the_key_is_the_bodys_api_key_or_the_bearer_header(server):
    form = {"q": "bob ran", "source": "en", "target": "de"}
    before = server.metric('relmt_serve_errors_total{kind="unauthorized"}')
    refused(server.anon.post("/translate", data=form), 400, "Please contact the server operator to get an API key")
    refused(server.anon.post("/translate", data={**form, "api_key": "wrong"}), 403, "Invalid API key")
    refused(server.anon.post("/translate", data=form, headers={"Authorization": "Bearer wrong"}), 403,
            "Invalid API key")
    refused(server.anon.post("/detect", data={"q": "bob ran"}), 400,
            "Please contact the server operator to get an API key")
    assert server.metric('relmt_serve_errors_total{kind="unauthorized"}') == before + 4
    best = v1(server, "bob ran")["translations"][0]
    assert server.client.post("/translate", data=form).json() == {"translatedText": best}  # the bearer header
    assert server.anon.post("/translate", data={**form, "api_key": KEY}).json() == {"translatedText": best}
    assert server.anon.post("/v1/translate", json={"text": "bob ran", "api_key": KEY}).status_code == 401
    assert server.anon.get("/languages").status_code == 200  # open, as in LibreTranslate
    assert server.anon.get("/frontend/settings").json() == {
        "charLimit": 200, "frontendTimeout": 500, "apiKeys": True, "keyRequired": True, "suggestions": False,
        "filesTranslation": False, "supportedFilesFormat": [],
        "language": {"source": {"code": "en", "name": "English"}, "target": {"code": "de", "name": "German"}}}
    refused(server.anon.post("/detect", data={"api_key": KEY}), 400, "Invalid request: missing q parameter")


def test_one_server_one_set_of_limits_and_metrics(server):
    ok = 'relmt_serve_requests_total{status="200"}'
    before = server.metric(ok)
    assert lt(server, q="bob ran", source="en", target="de").status_code == 200
    assert server.metric(ok) == before + 1
    # max_connections=1 counts both doors: a slow /v1/translate makes /translate wait
    slow, busy = in_threads([lambda: post(server, {"text": "RELMT_TEST_SLOW bob"}),
                             lambda: server.wait_metric("relmt_serve_requests_in_progress", 1) or
                             lt(server, q="bob ran", source="en", target="de")])
    assert slow.status_code == 200, slow.text
    refused(busy, 503, "max_connections=1 translation requests are in progress; retry later")
    assert busy.headers["retry-after"] == "1"
    failed = lt(server, q="RELMT_TEST_FAULT bob", source="en", target="de")
    assert failed.status_code == 500 and list(failed.json()) == ["error"]
    assert failed.json()["error"].startswith("Cannot translate text: ") and "RELMT_TEST_FAULT" in failed.text


def test_markup_parts_join_back_around_the_translations():
    sentences: list[str] = []
    parts = lines(" a b \n\n c", sentences)
    assert sentences == ["a b", "c"] and joined(parts, ["X", "Y"]) == " X \n\n Y"
    sentences = []
    parts = html_parts('<DIV id=1>x &lt; y<style>p {}</style> <i>z</i></div>', sentences)
    assert sentences == ["x < y", "z"]
    assert joined(parts, ["A & B", "C"], html=True) == '<DIV id=1>A &amp; B<style>p {}</style> <i>C</i></div>'
