"""The pure-Python byte-level BPE gives the ids and text `tokenizers` gives."""

from __future__ import annotations

import json
import os
import random
import sys
import time

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from rvascend.tokenizer.bpe_tokenizer import BpeTokenizer, _merge, UnsupportedTokenizer, byte_to_unicode
from rvascend.models.random_model import ensure_random_model
from rvascend.tokenizer.tokenizer import Tokenizer as EngineTokenizer

CORPUS = [
    "plain ASCII text, with punctuation! 12345 and don't we'll THEY'RE", "accents: café, naïve, Ångström, Ωμέγα",
    "CJK: 中文字符和日本語のテキスト、한국어", "emoji: 🙂🚀👩‍💻 and flags 🇫🇷", "code: def f(x):\n    return x ** 2  # square\n",
    "whitespace   runs\t\t\n\n  end  ", "<|begin_of_text|>special<|eot_id|> in the middle", " leading space",
    "numbers 3.14159 1,000,000 and 2026-11-30", "",
]
# Qwen2/3's split pattern (their tokenizer.json's Split pre-tokenizer).
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


def _qwen_style(path: str) -> str:
    """A small tokenizer built like Qwen's and Llama 3's: Split regex, then ByteLevel without its regex."""
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 20 + [open(__file__, encoding="utf-8").read()], trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    out = os.path.join(path, "tokenizer.json")
    tok.save(out)
    return out


@pytest.fixture(scope="module", params=["default", "qwen_style"])
def pair(request, tmp_path_factory):
    if request.param == "default":
        path = os.path.join(ensure_random_model(), "tokenizer.json")
    else:
        path = _qwen_style(str(tmp_path_factory.mktemp("qwen")))
    return Tokenizer.from_file(path), BpeTokenizer.from_file(path)


@pytest.mark.parametrize("text", CORPUS)
@pytest.mark.parametrize("special", [True, False])
def test_same_ids_as_tokenizers(pair, text, special):
    ref, ours = pair
    assert ours.encode(text, special).ids == ref.encode(text, add_special_tokens=special).ids


@pytest.mark.parametrize("text", CORPUS)
def test_same_text_back(pair, text):
    ref, ours = pair
    ids = ref.encode(text).ids
    for skip in (True, False):
        assert ours.decode(ids, skip) == ref.decode(ids, skip_special_tokens=skip)


def test_vocabulary_and_speed(pair):
    ref, ours = pair
    assert ours.get_vocab_size() == ref.get_vocab_size()
    assert ours.token_to_id("<|im_end|>") == ref.token_to_id("<|im_end|>")
    text = open(__file__, encoding="utf-8").read() * 20
    ours._cache.clear()
    start = time.perf_counter()
    n = len(ours.encode(text).ids)
    rate = n / (time.perf_counter() - start)
    print(f"pure-Python BPE: {rate:,.0f} tokens/s ({n} tokens of repeated text; the word cache fills as it goes)")
    assert rate > 20_000  # a 4k-token prompt in well under a second, even with a cold cache


def _reference_merge(word, ranks):
    """The textbook loop: rescan for the lowest-ranked pair after every merge."""
    symbols = list(word)
    while len(symbols) > 1:
        best, at = None, -1
        for i in range(len(symbols) - 1):
            rank = ranks.get((symbols[i], symbols[i + 1]))
            if rank is not None and (best is None or rank < best):
                best, at = rank, i
        if best is None:
            break
        symbols[at:at + 2] = [symbols[at] + symbols[at + 1]]
    return symbols


def test_heap_merge_equals_the_rescanning_loop():
    rng = random.Random(7)
    for trial in range(300):
        alphabet = "abc"[:rng.randint(1, 3)]
        merges, vocab = [], set(alphabet)
        for _ in range(rng.randint(0, 12)):
            left, right = rng.choice(sorted(vocab)), rng.choice(sorted(vocab))
            if (left, right) not in merges:
                merges.append((left, right))
                vocab.add(left + right)
        ranks = {pair: i for i, pair in enumerate(merges)}
        word = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        assert _merge(word, ranks) == _reference_merge(word, ranks), (word, merges)


def test_a_huge_single_word_is_linear(pair):
    """A run of letters as long as a prompt may be (500 KB): one pre-tokenized word.
    Rescanning after each merge took 2.2 s for 8k letters and hours for this."""
    ref, ours = pair
    rng = random.Random(0)
    word = "".join(rng.choice("etaoinshrdlu") for _ in range(500_000))
    start = time.perf_counter()
    ids = ours.encode(word, add_special_tokens=False).ids
    took = time.perf_counter() - start
    print(f"500 KB single word: {took:.2f} s, {len(ids)} tokens")
    assert ids == ref.encode(word, add_special_tokens=False).ids
    assert took < 10  # 2 s on an idle host; the quadratic loop never finishes
    assert len(ours._cache) < 1000 or word not in ours._cache


def test_single_word_added_tokens_look_only_at_their_neighbours(tmp_path):
    """`single_word` added tokens once ran a regex over all the text before each match
    (80k characters: 4.3 s); the boundary is the neighbouring character."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS * 5, trainer=trainer)
    tok.add_tokens([AddedToken("<w>", single_word=True), AddedToken("<l>", lstrip=True, rstrip=True)])
    path = str(tmp_path / "tokenizer.json")
    tok.save(path)
    ours = BpeTokenizer.from_file(path)
    for text in ["a<w>b <w> c<w> <w>d", "x  <l>  y<l><l>   ", "<w>", " <w>", "é<w>", "1<w>!"]:
        assert ours.encode(text).ids == tok.encode(text).ids, text
    text = ("ab<w>" * 16_000) + " <w> " + ("  <l>  " * 2_000)
    start = time.perf_counter()
    ids = ours.encode(text).ids
    took = time.perf_counter() - start
    assert ids == tok.encode(text).ids
    assert took < 5, took  # 0.07 s on the host; the review measured 4.3 s for 80k characters (quadratic)


def test_same_pieces_as_tokenizers(pair):
    ref, ours = pair
    assert all(ours.id_to_token(i) == ref.id_to_token(i) for i in range(ref.get_vocab_size()))


def test_a_token_holding_part_of_a_character_is_named_by_its_bytes():
    # "–" is e2 80 93: the byte-level alphabet's tokens for e2 and 80 each decode to U+FFFD
    # alone, so log-probabilities that named tokens by their text gave both one name.
    model = ensure_random_model()
    tok = EngineTokenizer(model)
    vocab = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    ids = [vocab.token_to_id(byte_to_unicode()[b]) for b in (0xE2, 0x80)]
    assert [tok.decode([i]) for i in ids] == ["\ufffd", "\ufffd"]
    assert [tok.token_bytes(i) for i in ids] == [b"\xe2", b"\x80"]
    assert [tok.token_text(i) for i in ids] == ["bytes:\\xe2", "bytes:\\x80"]
    whole = tok.encode("a – b", add_special_tokens=False)
    assert b"".join(tok.token_bytes(i) for i in whole) == "a – b".encode()
    assert [tok.token_text(i) for i in tok.encode("plain", add_special_tokens=False)] == \
        [tok.decode([i]) for i in tok.encode("plain", add_special_tokens=False)]


def test_unsupported_formats_are_refused_by_name(tmp_path):
    spec = json.loads(Tokenizer(models.WordPiece({"[UNK]": 0}, unk_token="[UNK]")).to_str())
    with pytest.raises(UnsupportedTokenizer, match="WordPiece"):
        BpeTokenizer(spec)
    spec = json.loads(open(os.path.join(ensure_random_model(), "tokenizer.json")).read())
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁"}
    with pytest.raises(UnsupportedTokenizer, match="Metaspace"):
        BpeTokenizer(spec)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))
