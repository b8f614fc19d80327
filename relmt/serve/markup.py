"""A text cut into what is translated and what is kept, for LibreTranslate's POST /translate
(relmt/serve/libretranslate.py). Its parts are kept strings and indices into a list of sentences, joined back in
order once the sentences are translated.

Plain text: each line that is not blank is a sentence; the whitespace around it and blank lines are kept.
HTML (format=html): each text node's lines likewise. Tags with their attributes, comments, declarations and the
content of <script> and <style> are kept as written (end tags lower-cased, as html.parser reports them). A text
node's entities are read as characters (`&amp;` is translated as `&`), and its translation is escaped back.
"""

from __future__ import annotations

from html import escape
from html.parser import HTMLParser

Part = str | int  # a kept string, or the index of a sentence whose translation goes there
RAW = frozenset({"script", "style"})  # their content is code, not text


def lines(text: str, sentences: list[str]) -> list[Part]:
    """The parts of a plain text, appending its sentences (its non-blank lines, stripped) to `sentences`."""
    parts: list[Part] = []
    for n, line in enumerate(text.split("\n")):
        if n:
            parts.append("\n")
        core = line.strip()
        if not core:
            parts.append(line)
            continue
        lead = len(line) - len(line.lstrip())
        parts += [line[:lead], len(sentences), line[lead + len(core):]]
        sentences.append(core)
    return parts


class TextNodes(HTMLParser):
    def __init__(self, sentences: list[str]) -> None:
        super().__init__(convert_charrefs=True)
        self.sentences, self.parts, self.data, self.raw = sentences, [], "", False

    def keep(self, markup: str) -> None:
        if self.data:  # html.parser may report one text node in pieces ("a ", "<", " b")
            self.parts += [self.data] if self.raw else lines(self.data, self.sentences)
            self.data = ""
        self.parts.append(markup)

    def handle_data(self, data: str) -> None:
        self.data += data

    def handle_starttag(self, tag: str, attrs) -> None:
        self.keep(self.get_starttag_text())
        self.raw = tag in RAW

    def handle_startendtag(self, tag: str, attrs) -> None:
        self.keep(self.get_starttag_text())

    def handle_endtag(self, tag: str) -> None:
        self.keep(f"</{tag}>")
        self.raw = False

    def handle_comment(self, data: str) -> None:
        self.keep(f"<!--{data}-->")

    def handle_decl(self, decl: str) -> None:
        self.keep(f"<!{decl}>")

    def handle_pi(self, data: str) -> None:
        self.keep(f"<?{data}>")

    def unknown_decl(self, data: str) -> None:
        self.keep(f"<![{data}]>")


def html_parts(text: str, sentences: list[str]) -> list[Part]:
    """The parts of an HTML fragment, appending its sentences to `sentences`."""
    parser = TextNodes(sentences)
    parser.feed(text)
    parser.close()
    parser.keep("")
    return parser.parts


def joined(parts: list[Part], translations: list[str], html: bool = False) -> str:
    """The text again, each sentence replaced by its translation (escaped as HTML text when `html`)."""
    return "".join(p if isinstance(p, str) else escape(translations[p], quote=False) if html else translations[p]
                   for p in parts)
