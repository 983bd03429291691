"""Request schemas of the OpenAI-compatible endpoints (the fields this server honours).

Unknown fields are ignored, as OpenAI-compatible servers do; known fields are
type-checked strictly, so `"max_tokens": "ten"` is a 400, not a guess.
"""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Optional[StrictStr] = None
    max_tokens: Optional[StrictInt] = None
    temperature: Union[StrictFloat, StrictInt] = 1.0
    top_p: Union[StrictFloat, StrictInt] = 1.0
    stop: Optional[Union[StrictStr, list[StrictStr]]] = None
    seed: Optional[StrictInt] = None
    stream: StrictBool = False
    ignore_eos: StrictBool = False

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(_Request):
    prompt: Union[StrictStr, list[StrictInt]]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: StrictStr


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[StrictInt] = None
