"""The tokenizer a GGUF file describes in its `tokenizer.ggml.*` metadata, written as
the `tokenizer.json` + `tokenizer_config.json` pair every other checkpoint has, so the
one Tokenizer class (with `tokenizers`, or the pure-Python BPE on a board) serves both.

Only byte-level BPE vocabularies (`tokenizer.ggml.model == "gpt2"`: GPT-2, Llama 3,
Qwen 2/3, SmolLM) are supported; SentencePiece and the others are refused by name.
Text is split before BPE the way llama.cpp splits it for the file's pre-tokenizer type
(`tokenizer.ggml.pre`), which is the way the vocabulary's merges were learned.
"""

from __future__ import annotations

from typing import Any, Optional

from absl import logging

from rvascend.models.gguf_file import typed

# GPT-2's word split; also what the ByteLevel pre-tokenizer applies with use_regex.
_GPT2 = None  # ByteLevel(use_regex=True) carries it
# Llama 3 (tiktoken cl100k-style) and Qwen 2 splits: contractions, words with one
# leading non-letter, digit groups, punctuation runs, newlines, spaces.
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen3.5's: Qwen2's with combining marks (\p{M}) kept inside words.
_QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
           r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_EACH_DIGIT = r"\p{N}"

# tokenizer.ggml.pre -> regexes applied one after the other before the byte mapping
# (None: GPT-2's split inside ByteLevel). The names are llama.cpp's.
PRE_TOKENIZER_SPLITS: dict[str, tuple[Optional[str], ...]] = {
    "gpt-2": (_GPT2,),
    "llama3": (_LLAMA3,), "llama-v3": (_LLAMA3,), "llama-bpe": (_LLAMA3,), "smaug-bpe": (_LLAMA3,),
    "qwen2": (_QWEN2,), "deepseek-r1-qwen": (_QWEN2,), "qwen35": (_QWEN35,),
    # SmolLM (and StarCoder-family vocabularies): every digit on its own, then GPT-2's split.
    "smollm": (_EACH_DIGIT, _GPT2), "starcoder": (_EACH_DIGIT, _GPT2), "refact": (_EACH_DIGIT, _GPT2),
}

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
_CONTROL, _USER_DEFINED = 3, 4

# Pre-tokenizer types for which llama.cpp matches whole words against the
# vocabulary before applying merges (ignore_merges) and adds BOS unless the file's
# tokenizer.ggml.add_bos_token says otherwise (its llama-vocab.cpp).
_LLAMA3_DEFAULTS = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral"})


class UnsupportedGgufTokenizer(ValueError):
    """The file's tokenizer is one this engine cannot rebuild."""


def tokenizer_files(meta: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tokenizer.json, tokenizer_config.json) contents from GGUF metadata (key -> value)."""
    kind = typed(meta, "tokenizer.ggml.model", "string")
    if kind != "gpt2":
        raise UnsupportedGgufTokenizer(
            f"tokenizer model {kind!r} is not supported (only 'gpt2', byte-level BPE: GPT-2, Llama 3, "
            "Qwen 2/3, SmolLM); SentencePiece vocabularies ('llama') are not")
    tokens = typed(meta, "tokenizer.ggml.tokens", "list of strings")
    if not tokens:
        raise UnsupportedGgufTokenizer("tokenizer.ggml.tokens is missing or not a list of strings")
    merges = typed(meta, "tokenizer.ggml.merges", "list of strings")
    if not merges or not all(" " in m for m in merges):
        raise UnsupportedGgufTokenizer("a byte-level BPE vocabulary without valid tokenizer.ggml.merges "
                                       "(a list of 'left right' strings)")
    types = typed(meta, "tokenizer.ggml.token_type", "integer array")
    types = [1] * len(tokens) if types is None else types.tolist()
    if len(types) != len(tokens):
        raise UnsupportedGgufTokenizer(f"tokenizer.ggml.token_type does not give one type for each of the "
                                       f"{len(tokens)} tokens")

    vocab: dict[str, int] = {}
    added = []
    for i, (token, kind_of) in enumerate(zip(tokens, types)):
        vocab.setdefault(token, i)
        if kind_of in (_CONTROL, _USER_DEFINED):
            added.append({"id": i, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": kind_of == _CONTROL})

    pre = typed(meta, "tokenizer.ggml.pre", "string", "(none)")

    def token_of(key: str) -> Optional[str]:
        i = typed(meta, f"tokenizer.ggml.{key}", "integer")
        if i is None:
            return None
        if not 0 <= i < len(tokens):
            raise UnsupportedGgufTokenizer(f"tokenizer.ggml.{key} = {i!r} is not a token of the "
                                           f"{len(tokens)}-token vocabulary")
        return tokens[i]

    bos, eos = token_of("bos_token_id"), token_of("eos_token_id")
    llama3 = pre in _LLAMA3_DEFAULTS
    add_bos = typed(meta, "tokenizer.ggml.add_bos_token", "boolean", llama3) and bos is not None
    add_eos = typed(meta, "tokenizer.ggml.add_eos_token", "boolean", False) and eos is not None
    tokenizer_json = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": _pre_tokenizer_steps(pre)},
        "post_processor": _post_processor(meta, bos if add_bos else None, eos if add_eos else None),
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": llama3,
                  "vocab": vocab, "merges": list(merges)},
    }
    config = {"bos_token": bos, "eos_token": eos, "pad_token": token_of("padding_token_id"),
              "add_bos_token": add_bos, "add_eos_token": add_eos}
    template = typed(meta, "tokenizer.chat_template", "string")
    if template:
        config["chat_template"] = template
    return tokenizer_json, config


def _pre_tokenizer_steps(pre: str) -> list[dict[str, Any]]:
    """The splits of GGUF pre-tokenizer type `pre` (GPT-2's where it is not known), then bytes."""
    splits = PRE_TOKENIZER_SPLITS.get(pre)
    if splits is None:
        logging.warning("GGUF pre-tokenizer type %r is not known here: splitting text as GPT-2 does, "
                        "which may tokenize some text differently from llama.cpp", pre)
        splits = (_GPT2,)
    steps: list[dict[str, Any]] = [{"type": "Split", "pattern": {"Regex": s}, "behavior": "Isolated",
                                    "invert": False} for s in splits if s is not None]
    steps.append({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": _GPT2 in splits})
    return steps


def _post_processor(meta: dict[str, Any], bos: Optional[str], eos: Optional[str]) -> Optional[dict[str, Any]]:
    """The template adding `bos` before and `eos` after a text (None: the one not added)."""
    if bos is None and eos is None:
        return None

    def special(token: str, key: str) -> dict[str, Any]:
        return {"id": token, "ids": [meta[f"tokenizer.ggml.{key}"]], "tokens": [token]}
    head = [{"SpecialToken": {"id": bos, "type_id": 0}}] if bos is not None else []
    tail = [{"SpecialToken": {"id": eos, "type_id": 0}}] if eos is not None else []
    specials = {}
    if bos is not None:
        specials[bos] = special(bos, "bos_token_id")
    if eos is not None:
        specials[eos] = special(eos, "eos_token_id")
    return {"type": "TemplateProcessing",
            "single": head + [{"Sequence": {"id": "A", "type_id": 0}}] + tail,
            "pair": head + [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}] + tail,
            "special_tokens": specials}


def end_of_generation_ids(meta: dict[str, Any]) -> list[int]:
    """Token ids that end a generation: EOS, and EOT/EOM where the file names them."""
    ids = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        i = typed(meta, f"tokenizer.ggml.{key}", "integer")
        if i is not None and i not in ids:
            ids.append(int(i))
    return ids
