"""Chat text: render messages with the model's chat template and mark the assistant tokens.

Detection of a conversation scores only what the assistant wrote. ``render_chat`` is a pure
function of the tokenizer and the messages: it renders the whole conversation once, finds each
assistant message's content in the rendered text (in order, by character offsets) and marks the
tokens that lie wholly inside one. The role headers, end-of-turn tokens, user and system text
stay in the token ids as context, and are never scored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

ROLES = ("system", "user", "assistant", "developer", "tool")
THINK = re.compile(r"<think>.*?(</think>|$)\s*", re.DOTALL)  # an unclosed block runs to the end


@dataclass(frozen=True)
class Chat:
    """One conversation to score: its messages and how to read them.

    Attributes:
        messages: ``[{"role": ..., "content": ...}, ...]``, as for ``tokenizer.apply_chat_template``.
        drop_system: leave system (and developer) messages out of the rendered context.
        drop_reasoning: strip ``<think>...</think>`` blocks from assistant messages before rendering.
    """

    messages: list[dict] = field(default_factory=list)
    drop_system: bool = False
    drop_reasoning: bool = False

    def __post_init__(self) -> None:
        check_messages(self.messages)


@dataclass
class ChatTokens:
    """A rendered conversation: ``ids`` (T,) and ``mask`` (T,), True on assistant-content tokens."""

    ids: list[int]
    mask: list[bool]
    text: str
    offsets: list[tuple[int, int]]


def check_messages(messages: list[dict]) -> None:
    """Raise ValueError unless ``messages`` is a list of {role, content} with string fields."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {role, content} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} needs string fields 'role' and 'content'")
        if m["role"] not in ROLES:
            raise ValueError(f"message {i} has role {m['role']!r}; expected one of {', '.join(ROLES)}")


def clean_messages(messages: list[dict], *, drop_system: bool = False, drop_reasoning: bool = False) -> list[dict]:
    """The messages as they are rendered: system text dropped and reasoning stripped when asked."""
    check_messages(messages)
    kept = []
    for m in messages:
        if drop_system and m["role"] in ("system", "developer"):
            continue
        content = m["content"]
        if drop_reasoning and m["role"] == "assistant":
            content = THINK.sub("", content)
        kept.append({"role": m["role"], "content": content})
    return kept


def render_chat(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict],
    *,
    drop_system: bool = False,
    drop_reasoning: bool = False,
) -> ChatTokens:
    """Token ids of the rendered conversation, and a mask of the assistant-content tokens.

    The text is the chat template's output tokenised without further special tokens (as
    ``apply_chat_template(tokenize=True)`` does). A token is masked when its characters lie
    wholly inside an assistant message's content; a token that straddles the header and the
    content is left out. Raises ValueError when the tokenizer has no chat template or the
    template changes an assistant message so that its content cannot be found.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this tokenizer has no chat template; score plain text, or set tokenizer.chat_template")
    kept = clean_messages(messages, drop_system=drop_system, drop_reasoning=drop_reasoning)
    text = tokenizer.apply_chat_template(kept, tokenize=False, add_generation_prompt=False)
    spans, cursor = [], 0
    for m in kept:
        if not m["content"]:
            continue
        at = text.find(m["content"], cursor)
        if at < 0:
            if m["role"] == "assistant":
                raise ValueError("the chat template changed an assistant message; its content is not in the rendering")
            continue
        cursor = at + len(m["content"])
        if m["role"] == "assistant":
            spans.append((at, cursor))
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    mask = [b > a and any(lo <= a and b <= hi for lo, hi in spans) for a, b in offsets]
    return ChatTokens(ids=list(enc.input_ids), mask=mask, text=text, offsets=offsets)
