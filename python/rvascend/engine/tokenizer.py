"""Tokenizer of a checkpoint directory: tokenizer.json through the `tokenizers`
library (or, where it cannot be installed, the pure-Python byte-level BPE of
bpe_tokenizer.py), the chat template from tokenizer_config.json through Jinja2.
A GGUF file's tokenizer is rebuilt as the same two files (models/gguf_tokenizer.py)."""

from __future__ import annotations

import json
import os
from typing import Any, Optional

import jinja2
from absl import logging


class Tokenizer:
    def __init__(self, model_path: str) -> None:
        from rvascend.models import gguf_checkpoint

        config: dict[str, Any] = {}
        if gguf_checkpoint.is_gguf(model_path):
            spec, config = gguf_checkpoint.GgufCheckpoint(model_path).tokenizer_files()
            self._tok = _load_tokenizer_json(json.dumps(spec), model_path)
        else:
            path = os.path.join(model_path, "tokenizer.json")
            if not os.path.exists(path):
                raise FileNotFoundError(f"{model_path} has no tokenizer.json")
            with open(path, encoding="utf-8") as f:
                self._tok = _load_tokenizer_json(f.read(), path)
            config_path = os.path.join(model_path, "tokenizer_config.json")
            if os.path.exists(config_path):
                with open(config_path, encoding="utf-8") as f:
                    config = json.load(f)
        self.chat_template: Optional[str] = config.get("chat_template")
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        self.eos_token_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        self.vocab_size = self._tok.get_vocab_size()
        # Every token covers at most this many UTF-8 bytes of text, so a prompt
        # longer than context * this cannot fit and is refused before tokenizing.
        self.max_token_bytes = max(len(t.encode("utf-8")) for t in self._tok.get_vocab(with_added_tokens=True))
        self._token_text: dict[int, str] = {}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def token_text(self, token: int) -> str:
        """One token's text on its own (logprobs), special tokens included."""
        text = self._token_text.get(token)
        if text is None:
            text = self._token_text[token] = self._tok.decode([token], skip_special_tokens=False)
        return text

    def apply_chat_template(self, messages: list[dict[str, Any]],
                            template_kwargs: Optional[dict[str, Any]] = None) -> str:
        """The prompt text for a chat, ending with the assistant's turn opened."""
        if self.chat_template:
            env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
            variables = {"add_generation_prompt": True, **(template_kwargs or {})}
            variables.update(messages=messages, bos_token=self.bos_token or "", eos_token=self.eos_token or "")
            return env.from_string(self.chat_template).render(**variables)
        # Checkpoints without a template: a plain transcript.
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def _load_tokenizer_json(text: str, source: str):
    try:
        from tokenizers import Tokenizer as HfTokenizer
    except ImportError:
        # No riscv64 wheel of `tokenizers` exists; the pure-Python reader serves there.
        from rvascend.engine.bpe_tokenizer import BpeTokenizer
        logging.info("tokenizers is not installed: using the pure-Python byte-level BPE for %s", source)
        return BpeTokenizer(json.loads(text))
    return HfTokenizer.from_str(text)


def _token_text(token: Any) -> Optional[str]:
    if isinstance(token, dict):
        return token.get("content")
    return token
