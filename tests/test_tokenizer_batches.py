"""Tokenizer.encode and decode give what one sentencepiece call on the whole list gives, whether the list is
short enough to go one sentence at a time (relmt.data.tokenizer.ONE_BY_ONE) or not."""

from __future__ import annotations

import pytest

from relmt.data import tokenizer as tok
from tests.tiny_checkpoints import toy_tokenizer


@pytest.mark.parametrize("n", [0, 1, 3, tok.ONE_BY_ONE, tok.ONE_BY_ONE + 1, 3 * tok.ONE_BY_ONE])
def test_short_and_long_lists_encode_and_decode_as_one_call(n, tmp_path):
    t = tok.Tokenizer(toy_tokenizer(tmp_path))
    texts = [("the small cat sees a dog " * (1 + i % 4)).strip() + ("" if i % 5 else " é") for i in range(n)]
    ids = t.encode(texts)
    assert ids == t.sp.encode(texts, out_type=int) and all(isinstance(x, int) for row in ids for x in row)
    assert t.decode(ids) == [t.sp.decode(row) for row in ids]
    if n:  # sentencepiece reads an empty list as one empty sentence (''); relmt's decode([]) is []
        assert t.decode(ids) == t.sp.decode(ids)
