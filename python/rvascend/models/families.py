"""The model families this engine serves, one entry each: what a loader, the config
reader and the random-weight writer ask of a family, so none of them branches on its
name. A dense family that differs from Llama only in these switches is one entry
here (and its tests); a family with layer kinds of its own (Qwen3.5) also names them
with `hybrid`, which picks models/qwen3_5.py and its GGUF names (gguf_qwen35.py).
"""

from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class Family:
    architecture: str            # config.json's architectures[0]
    gguf_architecture: str       # a GGUF file's general.architecture
    attention_bias: bool = False  # q/k/v biases whatever config.json says (Qwen2 has no such key)
    qk_norm: bool = False        # an RMSNorm over each query and key head before RoPE
    # llama.cpp's converter reorders a Llama file's q/k rows for its rotary kernel; the
    # loader puts them back in the checkpoint's order.
    gguf_rotary_rows_permuted: bool = False
    hybrid: bool = False         # Gated DeltaNet and gated attention layers (models/qwen3_5.py)
    # How its chat templates write a tool call when --tool-call-parser names none
    # (server/tool_calls.py): Qwen2.5's <tool_call> JSON or Llama 3's bare JSON object.
    tool_call_parser: str = "qwen25"
    # The image-text checkpoints of the family, served as their text model
    # (models/config.py reads their text_config; the vision tower is not loaded).
    multimodal_architecture: Optional[str] = None


FAMILIES = (
    Family("LlamaForCausalLM", "llama", gguf_rotary_rows_permuted=True, tool_call_parser="llama3"),
    Family("Qwen2ForCausalLM", "qwen2", attention_bias=True),
    Family("Qwen3ForCausalLM", "qwen3", qk_norm=True),
    Family("Qwen3_5ForCausalLM", "qwen35", qk_norm=True, hybrid=True,
           multimodal_architecture="Qwen3_5ForConditionalGeneration"),
)
_BY_ARCHITECTURE = {f.architecture: f for f in FAMILIES}
_BY_GGUF = {f.gguf_architecture: f for f in FAMILIES}


def family_of(architecture: str) -> Family:
    """The family of a config.json architecture name; a name no family has is refused."""
    try:
        return _BY_ARCHITECTURE[architecture]
    except KeyError:
        raise ValueError(f"unsupported architecture {architecture!r}; supported: "
                         f"{', '.join(sorted(_BY_ARCHITECTURE))}") from None


def family_of_gguf(gguf_architecture: str) -> Optional[Family]:
    """The family of a GGUF file's general.architecture (None: not one this engine serves)."""
    return _BY_GGUF.get(gguf_architecture)
