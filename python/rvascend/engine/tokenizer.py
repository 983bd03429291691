"""Tokenizer of a checkpoint directory: tokenizer.json through the `tokenizers`
library, the chat template from tokenizer_config.json through Jinja2."""

from __future__ import annotations

import json
import os
from typing import Any, Optional

import jinja2


class Tokenizer:
    def __init__(self, model_path: str) -> None:
        path = os.path.join(model_path, "tokenizer.json")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{model_path} has no tokenizer.json")
        from tokenizers import Tokenizer as HfTokenizer  # the riscv64 image lacks it; imported on use
        self._tok = HfTokenizer.from_file(path)
        config: dict[str, Any] = {}
        config_path = os.path.join(model_path, "tokenizer_config.json")
        if os.path.exists(config_path):
            with open(config_path, encoding="utf-8") as f:
                config = json.load(f)
        self.chat_template: Optional[str] = config.get("chat_template")
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        self.eos_token_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        self.vocab_size = self._tok.get_vocab_size()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def apply_chat_template(self, messages: list[dict[str, Any]]) -> str:
        """The prompt text for a chat, ending with the assistant's turn opened."""
        if self.chat_template:
            env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
            return env.from_string(self.chat_template).render(
                messages=messages, add_generation_prompt=True, bos_token=self.bos_token or "",
                eos_token=self.eos_token or "")
        # Checkpoints without a template: a plain transcript.
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def _token_text(token: Any) -> Optional[str]:
    if isinstance(token, dict):
        return token.get("content")
    return token
