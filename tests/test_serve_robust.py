"""relmt-serve against clients that stall, leave or come from another origin, and its error shapes.

As in tests/test_serve.py (whose Server, pages and browser helpers this module uses), the server is the real
process on 127.0.0.1, port=0, driven over loopback with httpx, raw sockets and headless chromium; every loop is
bounded in count and time. The module's server has an API key, max_connections=2, a short request_timeout_s,
and cors_origins naming one other loopback origin (a PageHost).
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.parse

import pytest

from tests.test_serve import KEY, PageHost, Server, browser_out, chromium, fetch_page, httpx, post
from tests.tiny_checkpoints import toy_tokenizer, write_checkpoint

REQUEST_TIMEOUT_S = 2
STALLED_HEAD = b"POST /v1/translate HTTP/1.1\r\nHost: x\r\n"


@pytest.fixture(scope="module")
def page_host():
    host = PageHost()
    yield host
    host.close()


@pytest.fixture(scope="module")
def robust(tmp_path_factory, page_host):
    directory = tmp_path_factory.mktemp("serve_robust")
    ckpt = write_checkpoint(directory, "tiny.pt", toy_tokenizer(directory), seed=1)
    s = Server(ckpt, directory / "server.log", "max_connections=2", f"request_timeout_s={REQUEST_TIMEOUT_S}",
               f"cors_origins={page_host.origin}", key=KEY)
    yield s
    s.stop()


@pytest.fixture
def anon(robust):
    """A client without the key."""
    with httpx.Client(base_url=robust.url, timeout=10) as client:
        yield client


def connect(server: Server) -> socket.socket:
    host, port = urllib.parse.urlsplit(server.url).netloc.split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.settimeout(5)
    return sock


def is_open(sock: socket.socket) -> bool:
    """Whether the server has not closed `sock` (nothing to read and no end of stream)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:  # reset
        return False
    finally:
        sock.settimeout(5)


def read_to_end(sock: socket.socket, timeout: float) -> bytes:
    """Everything the server sends until it closes the connection (socket.timeout if it does not)."""
    sock.settimeout(timeout)
    data = b""
    for _ in range(1000):
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data


def keyed_head(length: int) -> bytes:
    return (b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (KEY.encode(), length))


# --- clients that stall -------------------------------------------------------------------------------

def test_stalled_request_heads_do_not_block_health_and_are_closed_at_the_deadline(robust, anon):
    """Twice max_connections clients without the key send a request head that never ends (or nothing, or a
    byte at a time): /health, /ready and a translation still answer while they hang, and the server closes
    each of them request_timeout_s after it connected."""
    socks = [connect(robust) for _ in range(4)]
    opened = time.monotonic()
    try:
        for sock in socks[:3]:
            sock.sendall(STALLED_HEAD)  # socks[3] sends nothing at all; socks[2] goes on a byte at a time
        assert anon.get("/health").status_code == 200
        assert anon.get("/ready").status_code == 200
        r = post(robust, {"text": "the dog saw the cat"})
        assert r.status_code == 200, r.text
        assert all(is_open(sock) for sock in socks), "closed before the deadline: nothing was tested"
        closed: dict[int, float] = {}
        while len(closed) < len(socks) and time.monotonic() < opened + REQUEST_TIMEOUT_S + 5:
            for i, sock in enumerate(socks):
                if i not in closed and not is_open(sock):
                    closed[i] = time.monotonic() - opened
            if 2 not in closed:
                try:
                    socks[2].send(b"a")  # a header name that never ends: data does not extend the deadline
                except OSError:
                    pass
            time.sleep(0.1)
    finally:
        for sock in socks:
            sock.close()
    assert sorted(closed) == [0, 1, 2, 3], f"still open {REQUEST_TIMEOUT_S + 5} s on: {closed}"
    assert all(REQUEST_TIMEOUT_S - 0.2 <= t for t in closed.values()), closed
    assert robust.metric('relmt_serve_errors_total{kind="request_timeout"}') >= 3  # the three that began one
    r = post(robust, {"text": "the dog saw the cat"})
    assert r.status_code == 200, r.text


def test_a_body_that_stalls_gets_408_and_its_connection_closed(robust):
    before = robust.metric('relmt_serve_errors_total{kind="request_timeout"}')
    with connect(robust) as sock:
        sock.sendall(keyed_head(100) + b'{"text": ')  # 9 of the 100 bytes promised
        start = time.monotonic()
        answer = read_to_end(sock, REQUEST_TIMEOUT_S + 5)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert time.monotonic() - start >= REQUEST_TIMEOUT_S - 0.2
    body = json.loads(answer.partition(b"\r\n\r\n")[2])
    assert body["field"] is None and f"request_timeout_s={REQUEST_TIMEOUT_S}" in body["error"], body
    assert robust.metric('relmt_serve_errors_total{kind="request_timeout"}') == before + 1
    assert post(robust, {"text": "bob ran"}).status_code == 200


def test_translations_past_max_connections_get_503_while_health_answers(robust, anon):
    """max_connections counts translation requests in progress: past it a translation gets 503 + Retry-After,
    and the health routes (which it does not count) still answer."""
    answers: list = [None, None]

    def send(i: int, text: str) -> None:
        answers[i] = post(robust, {"text": text})

    slow = threading.Thread(target=send, args=(0, "RELMT_TEST_SLOW the dog"))  # the decoder is busy 2 s
    slow.start()
    robust.wait_metric("relmt_serve_requests_in_progress", 1)
    queued = threading.Thread(target=send, args=(1, "bob ran"))
    queued.start()
    robust.wait_metric("relmt_serve_requests_in_progress", 2)
    over = post(robust, {"text": "one too many"})
    assert anon.get("/health").status_code == 200 and anon.get("/ready").status_code == 200
    assert robust.client.get("/metrics").status_code == 200
    slow.join(30)
    queued.join(30)
    assert over.status_code == 503 and over.headers["retry-after"] == "1", over.text
    assert over.json() == {"error": "max_connections=2 translation requests are in progress; retry later",
                           "field": None}
    assert [a.status_code for a in answers] == [200, 200], answers
    assert robust.metric('relmt_serve_errors_total{kind="max_connections"}') == 1


# --- a client that leaves in the middle of its body -------------------------------------------------------

def test_a_client_that_leaves_inside_its_body_is_counted_without_a_traceback(robust):
    before = robust.metric('relmt_serve_errors_total{kind="client_left"}')
    with connect(robust) as sock:
        sock.sendall(keyed_head(1000) + b'{"text": "')  # 10 of the 1000 bytes promised, then gone
    robust.wait_metric('relmt_serve_errors_total{kind="client_left"}', before + 1, timeout=5)
    assert post(robust, {"text": "bob ran"}).status_code == 200
    log = robust.text()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]


# --- CORS ---------------------------------------------------------------------------------------------------

@pytest.mark.skipif(chromium() is None, reason="no chromium on PATH (.ci/run installs Debian's chromium)")
def test_a_page_of_an_allowed_origin_translates_in_a_headless_browser(robust, page_host, tmp_path):
    """A page on cors_origins' origin calls POST /v1/translate with the key (a preflight, which the key check
    lets through) and shows the translation; the same page on another origin gets an error."""
    sentence = "the dog saw the cat"
    expected = post(robust, {"text": sentence}).json()["translations"][0]
    page_host.pages["/call.html"] = fetch_page(robust.url, sentence, key=KEY)
    assert browser_out(f"{page_host.origin}/call.html", tmp_path / "allowed") == f"translation: {expected}"
    other = PageHost()
    try:
        other.pages["/call.html"] = fetch_page(robust.url, sentence, key=KEY)
        out = browser_out(f"{other.origin}/call.html", tmp_path / "other")
    finally:
        other.close()
    assert out.startswith("error: TypeError"), out


def test_a_preflight_needs_no_key_and_allows_the_authorization_header(robust, page_host, anon):
    preflight = {"Origin": page_host.origin, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    r = anon.options("/v1/translate", headers=preflight)
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == page_host.origin
    assert {"authorization", "content-type"} <= {h.strip().lower() for h in
                                                 r.headers["access-control-allow-headers"].split(",")}
    assert "access-control-allow-credentials" not in r.headers
    refused = anon.post("/v1/translate", json={"text": "bob ran"}, headers={"Origin": page_host.origin})
    assert refused.status_code == 401  # the key is still needed, and the page may read why
    assert refused.headers["access-control-allow-origin"] == page_host.origin
    other = anon.options("/v1/translate", headers={**preflight, "Origin": "http://127.0.0.1:1"})
    assert "access-control-allow-origin" not in other.headers


# --- errors are {"error", "field"} --------------------------------------------------------------------------

def test_unknown_routes_and_methods_answer_error_and_field(robust):
    missing = robust.client.get("/v2/translate")
    assert missing.status_code == 404
    assert missing.json() == {"error": "no such route: GET /v2/translate (the routes: POST /v1/translate, "
                                       "GET /health, /ready, /metrics and /; LibreTranslate's POST /translate, "
                                       "/detect, GET /languages and /frontend/settings)", "field": None}
    wrong = robust.client.get("/v1/translate")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert wrong.json() == {"error": "GET /v1/translate: method not allowed (allowed: POST)", "field": None}
    assert robust.client.delete("/health").json()["field"] is None


@pytest.mark.parametrize("raw,field,message", [
    (b'{"text": 5}', "text", "text: must be a string or a list of strings"),
    (b'{"text": {"a": "b"}}', "text", "text: must be a string or a list of strings"),
    (b'{"text": ["a", 3]}', "text[1]", "text[1]: must be a string"),
    (b'{"text": "a", "options": {"bem": 2}}', "options.bem",
     "options.bem: no such option (did you mean beam?); the options are beam, nbest, lenpen, length_norm, "
     "eos_candidates, sampling, topk, topp, temperature, seed"),
    (b'{"text": "a", "txt": "b"}', "txt", "txt: no such field (did you mean text?); the fields are text, options, "
     "prefix, constraints, constraints_order, alignments, token_scores, tgt_lang"),
], ids=["number", "object", "item", "option typo", "field typo"])
def test_a_wrong_type_or_a_typo_is_said_plainly(robust, raw, field, message):
    r = robust.client.post("/v1/translate", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and r.json() == {"error": message, "field": field}, r.text
