"""A translation request, from bytes to checked sentences and decoding settings.

Every refusal is an ApiError: an HTTP status, a message and the field at fault (a dotted path such
as `options.beam` or `text[2]`), answered as {"error": ..., "field": ...}:
- a body over max_body_bytes, more than max_lines sentences or one over max_line_chars: 413;
- a body that is not UTF-8: 400 (the byte offset is named);
- malformed JSON, a wrong type, an unknown field or option, a NUL or a lone surrogate in a sentence,
  an empty list, options that relmt-translate would refuse: 422.
An empty (or blank) sentence is accepted and translates to "" with no score, as in relmt-translate,
so that output i always belongs to input i; an empty list asks for nothing and is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

from relmt.cli.common import closest
from relmt.config import DecodeConfig
from relmt.errors import UserError
from relmt.serve.args import ServeArgs


class ApiError(Exception):
    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.field = status, message, field

    def body(self) -> dict:
        return {"error": self.message, "field": self.field}


class Options(BaseModel):
    """The decoding options a request may set (relmt-translate's keys of the same names); the rest of
    the checkpoint's decode config, the source and output length caps included, is the server's."""

    model_config = ConfigDict(extra="forbid")
    beam: StrictInt | None = None
    nbest: StrictInt | None = None
    lenpen: StrictFloat | StrictInt | None = None
    length_norm: Literal["gnmt", "power"] | None = None
    eos_candidates: Literal["t2t", "fairseq"] | None = None
    sampling: StrictBool | None = None
    topk: StrictInt | None = None
    topp: StrictFloat | StrictInt | None = None
    temperature: StrictFloat | StrictInt | None = None
    seed: StrictInt | None = None


class TranslateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: StrictStr | list[StrictStr]
    options: Options | None = None


@dataclass
class TranslateRequest:
    sentences: list[str]
    decode: DecodeConfig


def field_name(loc: tuple) -> str:
    """pydantic's location ('options', 'beam') or ('text', 'list[str]', 2) as options.beam, text[2]."""
    name = ""
    for part in loc:
        if isinstance(part, int):
            name += f"[{part}]"
        elif part in ("str", "list[str]") or "[" in str(part) or part.startswith(("function-", "literal")):
            continue  # the branch of a union pydantic tried, not a field
        else:
            name += f".{part}" if name else str(part)
    return name or "body"


def validation_error(e: ValidationError) -> ApiError:
    errors = e.errors()
    # a union reports each branch; a list of strings is the more telling one for text=[..., 3]
    first = next((x for x in errors if "list[str]" in x["loc"]), errors[0])
    name = field_name(first["loc"])
    if name == "text" and first["type"] in ("list_type", "string_type"):  # neither branch of the union
        return ApiError(422, "text: must be a string or a list of strings", name)
    if first["type"] == "string_type":
        return ApiError(422, f"{name}: must be a string", name)
    if first["type"] == "extra_forbidden":  # an unknown field or option: the nearest known one, as the CLI does
        model = Options if name.startswith("options.") else TranslateBody
        word = str(first["loc"][-1])
        what = "option" if model is Options else "field"
        known = list(model.model_fields)
        return ApiError(422, f"{name}: no such {what}{closest(word, known)}; the {what}s are {', '.join(known)}",
                        name)
    return ApiError(422, f"{name}: {first['msg']}", name)


def parse_body(raw: bytes, args: ServeArgs, default: DecodeConfig) -> TranslateRequest:
    """The checked request in `raw` (at most max_body_bytes, read by the caller), or an ApiError."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the body is not valid UTF-8 (byte {e.start}: {e.reason})") from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:  # ValueError: also an integer of over 4300 digits
        where = f" at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
        reason = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply" \
            if isinstance(e, RecursionError) else str(e)
        raise ApiError(422, f"the body is not valid JSON ({reason}{where}); send "
                       '{"text": "a sentence"} or {"text": ["one", "two"], "options": {"beam": 4}}') from None
    try:
        body = TranslateBody.model_validate(data)
    except ValidationError as e:
        raise validation_error(e) from None
    sentences = [body.text] if isinstance(body.text, str) else body.text
    check_sentences(sentences, isinstance(body.text, str), args)
    options = body.options.model_dump(exclude_none=True) if body.options else {}
    return TranslateRequest(sentences, request_decode(options, args, default))


def check_sentences(sentences: list[str], single: bool, args: ServeArgs) -> None:
    if not sentences:
        raise ApiError(422, "text: an empty list asks for nothing; give at least one sentence", "text")
    if len(sentences) > args.max_lines:
        raise ApiError(413, f"text: {len(sentences)} sentences, more than max_lines={args.max_lines} per request; "
                       "split them over several requests", "text")
    for i, s in enumerate(sentences):
        name = "text" if single else f"text[{i}]"
        if len(s) > args.max_line_chars:
            raise ApiError(413, f"{name}: {len(s)} characters, more than max_line_chars={args.max_line_chars}", name)
        if "\0" in s:
            raise ApiError(422, f"{name}: NUL character at {s.index(chr(0))}; text must be without NUL", name)
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as e:  # JSON can spell a lone surrogate (\ud800), which is no character
            raise ApiError(422, f"{name}: lone surrogate at character {e.start}; not valid Unicode", name) from None
        if "\n" in s:
            raise ApiError(422, f"{name}: a line break inside a sentence; send each line as its own list item", name)


def request_decode(options: dict, args: ServeArgs, default: DecodeConfig) -> DecodeConfig:
    """The server's decode config with a request's options, checked as relmt-translate checks its
    overrides (relmt.cli.translate.decode_with_overrides), and beam capped by max_beam."""
    from relmt.cli.translate import decode_with_overrides

    if options.get("beam", 1) > args.max_beam:
        raise ApiError(422, f"options.beam={options['beam']}: more than max_beam={args.max_beam}", "options.beam")
    try:
        decode = decode_with_overrides(default, options)
    except UserError as e:
        key = str(e).partition("=")[0]
        key = key if key in Options.model_fields else next(iter(options), "")
        raise ApiError(422, f"options.{e}", f"options.{key}" if key else "options") from None
    if decode.beam > args.max_beam:  # the checkpoint's own beam, with nbest asked for
        raise ApiError(422, f"beam={decode.beam}: more than max_beam={args.max_beam}", "options.beam")
    return decode
