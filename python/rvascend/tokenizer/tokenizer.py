"""Tokenizer of a checkpoint directory: tokenizer.json through the `tokenizers`
library (or, where it cannot be installed, the pure-Python byte-level BPE of
bpe_tokenizer.py), the chat template from tokenizer_config.json, rendered sandboxed
(chat_template.py). A GGUF file's tokenizer is rebuilt as the same two files (models/gguf_tokenizer.py)."""

from __future__ import annotations

import json
import os
import re
from typing import Any, Optional

from absl import logging

from rvascend.tokenizer.bpe_tokenizer import byte_level_bytes
from rvascend.tokenizer.chat_template import ChatTemplate

# The special tokens transformers hands a chat template (its SPECIAL_TOKENS_ATTRIBUTES).
_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class Tokenizer:
    def __init__(self, model_path: str) -> None:
        from rvascend.models import gguf_checkpoint

        config: dict[str, Any] = {}
        if gguf_checkpoint.is_gguf(model_path):
            spec, config = gguf_checkpoint.GgufCheckpoint(model_path).tokenizer_files()
            self.tokenizer_json = json.dumps(spec)
            self._tok = _load_tokenizer_json(self.tokenizer_json, model_path)
        else:
            path = os.path.join(model_path, "tokenizer.json")
            if not os.path.exists(path):
                raise FileNotFoundError(f"{model_path} has no tokenizer.json")
            with open(path, encoding="utf-8") as f:
                # Kept: the grammar engine (engine/grammar.py) builds its own tokenizer from it.
                self.tokenizer_json = f.read()
            self._tok = _load_tokenizer_json(self.tokenizer_json, path)
            config_path = os.path.join(model_path, "tokenizer_config.json")
            if os.path.exists(config_path):
                with open(config_path, encoding="utf-8") as f:
                    config = json.load(f)
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        source = config.get("chat_template")
        if isinstance(source, list):  # several named templates: the default one serves chat
            source = next((t.get("template") for t in source if t.get("name") == "default"), None)
        specials = {name: _token_text(config.get(name)) for name in _SPECIAL_TOKENS}
        self.chat_template: Optional[ChatTemplate] = ChatTemplate(source, specials) if source else None
        self.eos_token_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        self.vocab_size = self._tok.get_vocab_size()
        # Every token covers at most this many UTF-8 bytes of text, so a prompt
        # longer than context * this cannot fit and is refused before tokenizing.
        self.max_token_bytes = max(len(t.encode("utf-8")) for t in self.vocabulary())
        self._token_bytes: dict[int, bytes] = {}

    def vocabulary(self) -> dict[str, int]:
        """Every token's text and id, added tokens included."""
        return self._tok.get_vocab(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token: int) -> bytes:
        """The bytes one token stands for. A byte-level token can hold part of a
        character, which decoding alone turns into U+FFFD."""
        data = self._token_bytes.get(token)
        if data is None:
            text = self._tok.decode([token], skip_special_tokens=False)
            data = text.encode("utf-8")
            if "\ufffd" in text:
                data = _piece_bytes(self._tok.id_to_token(token)) or data
            self._token_bytes[token] = data
        return data

    def token_text(self, token: int) -> str:
        """One token's text on its own (logprobs), special tokens included. A token
        that is not whole UTF-8 is named by its bytes, "bytes:\\xe2\\x80" as OpenAI's
        API names them, so that two such tokens never share a name."""
        data = self.token_bytes(token)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in data)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            continue_final_message: bool = False,
                            template_kwargs: Optional[dict[str, Any]] = None) -> str:
        """The prompt text for a chat: ending with the assistant's turn opened
        (add_generation_prompt), or inside the last message (continue_final_message).
        ChatTemplateError when the template refuses or fails."""
        if self.chat_template is not None:
            return self.chat_template.render(messages, add_generation_prompt, continue_final_message,
                                             template_kwargs)
        # Checkpoints without a template: a plain transcript.
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        if continue_final_message:
            return text[:-1]
        return text + ("assistant:" if add_generation_prompt else "")


def _load_tokenizer_json(text: str, source: str):
    try:
        from tokenizers import Tokenizer as HfTokenizer
    except ImportError:
        # No riscv64 wheel of `tokenizers` exists; the pure-Python reader serves there.
        from rvascend.tokenizer.bpe_tokenizer import BpeTokenizer
        logging.info("tokenizers is not installed: using the pure-Python byte-level BPE for %s", source)
        make = lambda: BpeTokenizer(json.loads(text))  # noqa: E731
    else:
        make = lambda: HfTokenizer.from_str(text)  # noqa: E731
    try:
        return make()
    except Exception as e:  # noqa: BLE001 - `tokenizers` raises a bare Exception on a bad vocabulary
        raise ValueError(f"{source}: the tokenizer is invalid: {e}") from None


def _piece_bytes(piece: Optional[str]) -> Optional[bytes]:
    """A vocabulary entry's bytes: a byte-fallback token (<0xE2>) or a byte-level BPE token."""
    if piece is None:
        return None
    match = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)
    if match:
        return bytes([int(match.group(1), 16)])
    return byte_level_bytes(piece)


def _token_text(token: Any) -> Optional[str]:
    if isinstance(token, dict):
        return token.get("content")
    return token
