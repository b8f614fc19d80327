"""A translation request, from bytes to checked sentences and decoding settings.

Every refusal is an ApiError: an HTTP status, a message and the field at fault (a dotted path such
as `options.beam` or `text[2]`), answered as {"error": ..., "field": ...}:
- a body over max_body_bytes, more than max_lines sentences or one over max_line_chars: 413;
- a body that is not UTF-8: 400 (the byte offset is named);
- malformed JSON, a wrong type, an unknown field or option, a NUL or a lone surrogate in a sentence,
  an empty list, options that relmt-translate would refuse: 422;
- a prefix or constraints (issue 60) of the wrong shape (one per sentence: a string and a list of phrases for
  `"text": "..."`, lists of them for a list), an empty phrase, either with sampling, constraints on an
  engine=ctranslate2 server, a phrase the model's vocabulary cannot spell: 422, naming `prefix[i]` or
  `constraints[i][j]`; a prefix, or one sentence's phrases together, over max_line_chars: 413.
An empty (or blank) sentence is accepted and translates to "" with no score, as in relmt-translate,
so that output i always belongs to input i; an empty list asks for nothing and is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

from relmt.cli.common import closest
from relmt.config import DecodeConfig
from relmt.decode.constraints import MAX_PHRASES, MAX_PIECES, narrow_beam
from relmt.decode.search import cut_source
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
    prefix: StrictStr | list[StrictStr] | None = None  # what the output begins with: one per sentence
    constraints: list | None = None  # target phrases the output must contain: one list per sentence
    constraints_order: Literal["unordered", "ordered"] = "unordered"
    alignments: StrictBool = False  # Pharaoh source-target word links of each hypothesis
    token_scores: StrictBool = False  # log p of each output piece, then EOS's
    tgt_lang: StrictStr | None = None  # a multilingual model's (data.lang_tags) target language


@dataclass(frozen=True)
class Asks:
    """What a request asks beyond its decoding settings (issue 60; relmt.decode.translator.Translator.translations):
    prefixes[i] and constraints[i] for sentence i (None: none for any), and which annotations each hypothesis gets."""

    prefixes: list[str] | None = None
    constraints: list[list[str]] | None = None
    ordered: bool = False
    alignments: bool = False
    token_scores: bool = False

    @property
    def apart(self) -> str | None:
        """Why the running search cannot take the request ("constraints", "prefix"), or None: they change the beam
        search's steps, which the server's continuous batching runs plain."""
        return "constraints" if self.constraints else "prefix" if self.prefixes else None


@dataclass
class TranslateRequest:
    sentences: list[str]
    decode: DecodeConfig
    asks: Asks = field(default_factory=Asks)
    single: bool = False  # "text" was one string, not a list: its sentence is named `text`, not `text[0]`

    def warnings(self, ids: list[list[int]]) -> list[dict]:
        """What the decoding warns of, per sentence, given each sentence's source ids: a source cut to
        max_source_len, a beam too narrow for the sentence's constraint phrases (the warnings relmt-translate logs;
        the server's log has them per batch, the answer per request). Each {"sentence": i, "message": "text[i]:
        ..."}, in input order."""
        out = []
        for i, x in enumerate(ids):
            name = "text" if self.single else f"text[{i}]"
            phrases = len(self.asks.constraints[i]) if self.asks.constraints and self.sentences[i].strip() else 0
            for warning in (cut_source(len(x), self.decode.max_source_len),
                            None if self.decode.sampling else narrow_beam(self.decode.beam, phrases)):
                if warning:
                    out.append({"sentence": i, "message": f"{name}: {warning}"})
        return out


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
    if name in ("text", "prefix") and first["type"] in ("list_type", "string_type"):  # neither branch of the union
        return ApiError(422, f"{name}: must be a string or a list of strings", name)
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


def parse_body(raw: bytes, args: ServeArgs, default: DecodeConfig, tokenizer=None, tagged=None) -> TranslateRequest:
    """The checked request in `raw` (at most max_body_bytes, read by the caller), or an ApiError. `tokenizer`, the
    model's (relmt.data.tokenizer.Tokenizer), when given, checks that each constraint can be spelt; `tagged`, the
    model's Translator.tagged, when given, puts the target-language tag of `tgt_lang` on each sentence."""
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
    if tagged is not None:
        try:
            sentences = tagged(sentences, body.tgt_lang)
        except UserError as e:
            raise ApiError(422, f"tgt_lang: {e}", "tgt_lang") from None
    options = body.options.model_dump(exclude_none=True) if body.options else {}
    decode = request_decode(options, args, default)
    return TranslateRequest(sentences, decode, request_asks(body, len(sentences), args, decode, tokenizer),
                            isinstance(body.text, str))


def check_sentences(sentences: list[str], single: bool, args: ServeArgs) -> None:
    if not sentences:
        raise ApiError(422, "text: an empty list asks for nothing; give at least one sentence", "text")
    if len(sentences) > args.max_lines:
        raise ApiError(413, f"text: {len(sentences)} sentences, more than max_lines={args.max_lines} per request; "
                       "split them over several requests", "text")
    for i, s in enumerate(sentences):
        check_line(s, "text" if single else f"text[{i}]", args)


def check_line(s: str, name: str, args: ServeArgs) -> None:
    """A sentence, prefix or phrase: within max_line_chars (413), without NUL, lone surrogates or line breaks."""
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


def request_asks(body: TranslateBody, n: int, args: ServeArgs, decode: DecodeConfig, tokenizer=None) -> Asks:
    """The prefix and constraints of each of the n sentences, checked (one per sentence, in the shape of `text`),
    and the annotations asked for. A prefix or constraints need beam search, and constraints an engine that has a
    constrained search (not ctranslate2) and words the vocabulary can spell, as Translator.hypotheses says; here
    they are refused before they are queued, so that one request cannot fail the batch it would join."""
    single = isinstance(body.text, str)
    prefixes = constraints = None
    if body.prefix is not None:
        one = isinstance(body.prefix, str)
        prefixes = [body.prefix] if one else body.prefix
        problem = ("\"text\" is one sentence: give its prefix as a string" if single and not one
                   else "\"text\" is a list: give a list of prefixes" if not single and one
                   else f"{len(prefixes)} prefixes for {n} sentences" if len(prefixes) != n else "")
        if problem:
            raise ApiError(422, f"prefix: {problem}, one per sentence (\"\" for none)", "prefix")
        for i, p in enumerate(prefixes):
            check_line(p, "prefix" if single else f"prefix[{i}]", args)
    if body.constraints is not None:
        constraints = [body.constraints] if single else body.constraints
        if not single and (len(constraints) != n or not all(isinstance(c, list) for c in constraints)):
            raise ApiError(422, f"constraints: give one list of target phrases per sentence ({n}), e.g. "
                           '[["Katze"], []] for two sentences', "constraints")
        for i, phrases in enumerate(constraints):
            where = "constraints" if single else f"constraints[{i}]"
            for j, phrase in enumerate(phrases):
                name = f"{where}[{j}]"
                if not isinstance(phrase, str):
                    nested = single and isinstance(phrase, list)
                    shape = ("; \"text\" is one sentence, so \"constraints\" is a list of strings, e.g. "
                             "[\"Katze\"] (a list of lists goes with a list of texts)" if nested else "")
                    raise ApiError(422, f"{name}: must be a string (a target word or phrase){shape}", name)
                if not phrase.strip():
                    raise ApiError(422, f"{name}: an empty phrase; give the target words the output must contain",
                                   name)
                check_line(phrase, name, args)
            if sum(map(len, phrases)) > args.max_line_chars:  # each phrase raises the output length limit
                raise ApiError(413, f"{where}: {sum(map(len, phrases))} characters in all, more than "
                               f"max_line_chars={args.max_line_chars}", where)
    # a blank prefix and no phrases ask for nothing: such a request is decoded as a plain one
    prefixes = prefixes if prefixes and any(p.strip() for p in prefixes) else None
    constraints = constraints if constraints and any(constraints) else None
    for key, given in (("prefix", prefixes), ("constraints", constraints)):
        if decode.sampling and given:
            raise ApiError(422, f"{key}: a target prefix and constraints need beam search, not sampling "
                           "(options.sampling=false)", key)
    if args.engine == "ctranslate2" and constraints:
        raise ApiError(422, "constraints: this server runs engine=ctranslate2, which has no lexically constrained "
                       "search; constraints work on engine=torch, onnx and aoti", "constraints")
    if constraints:  # each phrase raises the step limit and the constrained step's cost: bounded as the size is
        for i, phrases in enumerate(constraints):
            where = "constraints" if single else f"constraints[{i}]"
            if len(phrases) > MAX_PHRASES:
                raise ApiError(413, f"{where}: {len(phrases)} phrases, more than {MAX_PHRASES} a sentence", where)
        total = sum(map(len, constraints))
        if total > args.max_request_phrases:
            raise ApiError(413, f"constraints: {total} phrases in the request, more than max_request_phrases="
                           f"{args.max_request_phrases}", "constraints")
    if tokenizer is not None and constraints:
        named = [(f"constraints[{j}]" if single else f"constraints[{i}][{j}]", phrase)
                 for i, phrases in enumerate(constraints) for j, phrase in enumerate(phrases)]
        unk = tokenizer.sp.unk_id()
        encoded = tokenizer.encode([phrase for _, phrase in named])
        for (name, phrase), ids in zip(named, encoded):
            if unk in ids:
                raise ApiError(422, f"{name}: {phrase!r}: the model's vocabulary has no piece for part of it "
                               "(sentencepiece gives <unk>), so no output can hold it", name)
        done = iter(encoded)
        for i, phrases in enumerate(constraints):
            pieces = sum(len(next(done)) for _ in phrases)
            if pieces > MAX_PIECES:
                where = "constraints" if single else f"constraints[{i}]"
                raise ApiError(413, f"{where}: {pieces} pieces in all, more than {MAX_PIECES} a sentence", where)
    if tokenizer is not None and prefixes:
        unk = tokenizer.sp.unk_id()
        for i, (p, ids) in enumerate(zip(prefixes, tokenizer.encode(list(prefixes)))):
            name = "prefix" if single else f"prefix[{i}]"
            if unk in ids:
                raise ApiError(422, f"{name}: {p!r}: the model's vocabulary has no piece for part of it "
                               "(sentencepiece gives <unk>), so the output would begin with \u2047", name)
    return Asks(prefixes, constraints, constraints is not None and body.constraints_order == "ordered",
                body.alignments, body.token_scores)


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
