"""Chat prompts: a model's own Jinja template (as HF transformers renders it) or a built-in format.

A GGUF carries its chat template as ``tokenizer.chat_template``. Rendering it the way transformers does
(sandboxed Jinja, ``trim_blocks``/``lstrip_blocks``, ``raise_exception``, ``tojson``) reproduces the
prompts the model was tuned on, e.g. Qwen2.5's default system prompt. The built-in formats serve
tokenizers without a template (HF directories, caches written before templates were kept).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["ChatTemplateError", "render_builtin", "render_chat_template"]


class ChatTemplateError(ValueError):
    """A conversation the template refuses, or a template that cannot be rendered."""


def render_chat_template(template: str, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool,
                         **specials: str | None) -> str:
    """Renders a Jinja chat template like transformers' ``apply_chat_template`` (no tools, no documents).

    Args:
      template: the Jinja source.
      messages: ``{"role": ..., "content": ...}`` dicts, passed to the template unchanged.
      add_generation_prompt: end with the opening of the assistant's turn.
      **specials: template variables such as ``bos_token`` and ``eos_token``.

    Raises:
      ChatTemplateError: the template calls ``raise_exception`` or fails to render.
    """
    import jinja2

    try:
        compiled = _compile(template)
        return compiled.render(messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
                               **{k: v for k, v in specials.items() if v is not None})
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"the model's chat template failed: {e}") from None


@functools.lru_cache(maxsize=8)
def _compile(template: str):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise ChatTemplateError(f"the model's chat template refuses this conversation: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)


def render_builtin(chat_format: str, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str:
    """Gemma's or ChatML's format, without BOS.

    Gemma follows its official template: turns ``<start_of_turn>{role}\\n{content}<end_of_turn>\\n``, roles
    alternating "user" / "model" ("assistant" accepted), contents stripped, and a leading system message
    prepended (plus a blank line) to the first user turn. ChatML writes ``<|im_start|>{role}\\n{content}<|im_end|>\\n``,
    without a default system prompt.

    Raises:
      ChatTemplateError: an ill-formed conversation.
    """
    roles = [m.get("role") for m in messages]
    if chat_format == "chatml":
        body = "".join(f"<|im_start|>{m['role']}\n{_content(m)}<|im_end|>\n" for m in messages)
        return body + ("<|im_start|>assistant\n" if add_generation_prompt else "")
    prefix = ""
    if roles[:1] == ["system"]:
        if len(messages) < 2:
            raise ChatTemplateError("Gemma has no system turn: a system message must precede a user message")
        prefix, messages, roles = _content(messages[0]) + "\n\n", messages[1:], roles[1:]
    turns = []
    for n, (role, message) in enumerate(zip(roles, messages, strict=True)):
        expected = ("user",) if n % 2 == 0 else ("model", "assistant")
        if role not in expected:
            raise ChatTemplateError(f"message {n} has role {role!r}, expected {' or '.join(expected)}: "
                                    "Gemma wants an optional system message, then alternating user/model")
        text = (prefix if n == 0 else "") + _content(message, strip=True)
        turns.append(f"<start_of_turn>{expected[0]}\n{text}<end_of_turn>\n")
    return "".join(turns) + ("<start_of_turn>model\n" if add_generation_prompt else "")


def _content(message: Mapping[str, Any], strip: bool = False) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content.strip() if strip else content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(p["text"].strip() if strip else p["text"] for p in content)  # Gemma trims each part
    raise ChatTemplateError(f"unsupported message content {content!r}: expected a string or text parts")
