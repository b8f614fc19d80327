"""Who may bind and who may call: loopback by default; any other address needs an API key.

The key comes from the environment (RELMT_SERVE_API_KEY), never from the command line, where `ps`
would show it. When it is set, every route but /health, /ready, the page at / and LibreTranslate's /languages and
/frontend/settings needs `Authorization: Bearer <key>`, compared in constant time (hmac.compare_digest);
LibreTranslate's /translate and /detect take it as that header or as the body's api_key
(relmt/serve/libretranslate.py)."""

from __future__ import annotations

import hmac
import ipaddress
import os

from relmt.errors import UserError

KEY_ENV = "RELMT_SERVE_API_KEY"
MIN_KEY_CHARS = 16
# no secret there; the page asks for the key itself; LibreTranslate's two are open in LibreTranslate too
OPEN_PATHS = frozenset({"/health", "/ready", "/", "/languages", "/frontend/settings"})
BODY_KEY_PATHS = frozenset({"/translate", "/detect"})  # the key checked by the route: header or body's api_key


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name other than localhost may resolve anywhere
        return False


def api_key(host: str, environ: dict[str, str] | None = None) -> str | None:
    """The API key to require (None: none), or a UserError when `host` is not loopback and no key is
    set, or the key is too short to be a secret."""
    key = (os.environ if environ is None else environ).get(KEY_ENV, "")
    if key and len(key) < MIN_KEY_CHARS:
        raise UserError(f"{KEY_ENV} holds {len(key)} characters: use at least {MIN_KEY_CHARS}, e.g. "
                        "python -c 'import secrets; print(secrets.token_urlsafe(32))'")
    if not key and not is_loopback(host):
        raise UserError(f"host={host} is not a loopback address: set {KEY_ENV} (at least {MIN_KEY_CHARS} "
                        "characters; clients send it as 'Authorization: Bearer <key>'), or serve on host=127.0.0.1")
    return key or None


def authorized(header: str | None, key: str) -> bool:
    """Whether an Authorization header carries the bearer token `key` (constant-time comparison)."""
    scheme, _, token = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())
