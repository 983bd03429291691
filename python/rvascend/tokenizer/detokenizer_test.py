"""Incremental detokenization gives exactly the text of decoding everything at once."""

from __future__ import annotations

import os
import random
import sys

import pytest

from rvascend.models.random_model import ensure_random_model
from rvascend.tokenizer.detokenizer import IncrementalDetokenizer
from rvascend.tokenizer.tokenizer import Tokenizer


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


class _CountingDecoder:
    """Wraps a tokenizer and records how many ids each decode call was given."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer, self.longest = tokenizer, 0

    def decode(self, ids, skip_special_tokens=True):
        self.longest = max(self.longest, len(ids))
        return self.tokenizer.decode(ids, skip_special_tokens)


def test_a_run_of_invalid_bytes_keeps_the_window_short(tokenizer):
    """A lone continuation byte sampled every step (a client's logit_bias can force it):
    the window must not grow with the output, and the text is the whole decode's."""
    from tokenizers import Tokenizer as HfTokenizer  # the byte alphabet's token of 0x80
    from rvascend.tokenizer.bpe_tokenizer import byte_to_unicode
    vocab = HfTokenizer.from_file(os.path.join(ensure_random_model(), "tokenizer.json"))
    cont = vocab.token_to_id(byte_to_unicode()[0x80])
    lead = vocab.token_to_id(byte_to_unicode()[0xF0])
    emoji = tokenizer.encode("🙂", add_special_tokens=False)
    ids = [cont] * 3000 + [lead] + emoji + [cont] * 5 + tokenizer.encode(" ok", add_special_tokens=False)
    counting = _CountingDecoder(tokenizer)
    detok = IncrementalDetokenizer(counting, [])
    pieces = [detok.add(t) for t in ids] + [detok.flush()]
    assert "".join(pieces) == tokenizer.decode(ids)
    assert counting.longest <= 80, counting.longest  # 3k+ before the cap
    assert sum(p.count("\ufffd") for p in pieces[:3000]) >= 2990  # handed out as they come, not at the end


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
