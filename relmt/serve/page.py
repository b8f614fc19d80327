"""The one-page form at / (page.html beside this file: no external assets), and a Content-Security-
Policy that lets only its own inline script and style run."""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from importlib import resources


def _digest(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


@cache
def page() -> tuple[str, str]:
    """(the HTML, its Content-Security-Policy header)."""
    html = resources.files("relmt.serve").joinpath("page.html").read_text(encoding="utf-8")
    scripts = " ".join(_digest(s) for s in re.findall(r"<script>(.*?)</script>", html, re.S))
    styles = " ".join(_digest(s) for s in re.findall(r"<style>(.*?)</style>", html, re.S))
    csp = (f"default-src 'none'; script-src {scripts}; style-src {styles}; connect-src 'self'; "
           "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
    return html, csp
