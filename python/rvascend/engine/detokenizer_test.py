"""Incremental detokenization gives exactly the text of decoding everything at once."""

from __future__ import annotations

import sys
import random

import pytest

from rvascend.engine.random_model import ensure_random_model
from rvascend.engine.detokenizer import IncrementalDetokenizer
from rvascend.engine.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(ensure_random_model())


CORPUS = ["plain ASCII text, with punctuation!", "accents: café, naïve, Ångström", "CJK: 中文字符和日本語",
          "emoji: 🙂🚀👩‍💻", "code: def f(x):\n    return x ** 2\n", "whitespace   runs\t\t\n\n  end"]


@pytest.mark.parametrize("text", CORPUS)
def test_incremental_text_equals_whole_decode(tokenizer, text):
    prompt = tokenizer.encode("prompt before ")
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, prompt)
    pieces = [detok.add(t) for t in ids] + [detok.flush()]
    whole = tokenizer.decode(prompt + ids)[len(tokenizer.decode(prompt)):]
    assert "".join(pieces) == whole


def test_random_ids_including_split_characters(tokenizer):
    rng = random.Random(0)
    for _ in range(20):
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randrange(1, 200))]
        detok = IncrementalDetokenizer(tokenizer, [])
        pieces = [detok.add(t) for t in ids] + [detok.flush()]
        text = "".join(pieces)
        assert text == tokenizer.decode(ids)
        assert all("\ufffd" not in p for p in pieces[:-1] if p) or "\ufffd" in tokenizer.decode(ids)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
