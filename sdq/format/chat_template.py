"""Chat messages -> prompt text, by the GGUF file's own chat template (`tokenizer.chat_template`).

The template is Jinja, as the model's authors wrote it; it is rendered in jinja2's immutable
sandbox (no attribute access to Python internals, no mutation of the values passed in), with the
variables and helpers such templates expect: `messages`, `add_generation_prompt`, `bos_token`,
`eos_token`, `raise_exception(text)`, `strftime_now(format)` and a `tojson` filter that keeps
non-ASCII text. Control tokens the template writes (`<|im_start|>`) are turned into their ids by
`prompt_ids`, which also puts the BOS token first when the file asks for one
(`tokenizer.ggml.add_bos_token`) and the template did not write it.

A message is {"role": str, "content": str}; content may also be a list of {"type": "text",
"text": str} parts, joined. A file without a template has no chat format: `ChatTemplate.of`
returns None and callers fall back to raw text.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from functools import cached_property

from sdq.errors import ParamsError, TokenizerError

TEMPLATE_KEY = "tokenizer.chat_template"
ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class ChatTemplate:
    """The chat template of one model file, compiled once."""

    source: str  # the Jinja text
    bos_token: str  # text of the BOS token ("" if the vocabulary has none)
    eos_token: str
    where: str  # the model file, for error messages

    @classmethod
    def of(cls, metadata: dict, tokenizer, where: str = "model") -> ChatTemplate | None:
        """The file's template, or None when it has none. `tokenizer` gives the special tokens'
        text (sdq.format.tokenizer.Tokenizer)."""
        text = metadata.get(TEMPLATE_KEY)
        if text is None or (isinstance(text, str) and not text.strip()):
            return None
        if not isinstance(text, str):
            raise TokenizerError(f"{where}: {TEMPLATE_KEY} is a {type(text).__name__}, not text")

        def token(i):
            return tokenizer.tokens[i] if i is not None else ""

        # compiled at the first render: a broken template fails chat use only, not raw text
        return cls(text, token(tokenizer.bos_id), token(tokenizer.eos_id), where)

    @cached_property
    def _compiled(self):
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            return env.from_string(self.source)
        except jinja2.TemplateError as exc:
            raise TokenizerError(f"{self.where}: {TEMPLATE_KEY} does not compile: {exc}") from None

    def render(self, messages, add_generation_prompt: bool = True) -> str:
        """The prompt text for `messages` (checked first); with `add_generation_prompt` it ends
        where the assistant's reply begins."""
        checked = check_messages(messages)
        compiled = self._compiled  # a template that does not compile says so, first
        try:
            return compiled.render(
                messages=checked,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except _TemplateRefused as exc:
            raise ParamsError(f"the chat template refuses these messages: {exc}") from None
        except Exception as exc:  # the template is the file's code: what it raises is the file's
            raise TokenizerError(
                f"{self.where}: {TEMPLATE_KEY} failed to render: {type(exc).__name__}: {exc}"
            ) from None


def check_messages(messages) -> list[dict[str, str]]:
    """`messages` as a list of {"role", "content"} dicts of text; ParamsError naming the first
    message that is not one."""
    if not isinstance(messages, list | tuple) or not messages:
        raise ParamsError("messages must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ParamsError(f"message {i} is a {type(m).__name__}, not an object")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise ParamsError(f"message {i}: role {role!r} is not one of {', '.join(ROLES)}")
        out.append({"role": role, "content": _text(content, i)})
    return out


def _text(content, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise ParamsError(f"message {i}: content must be text (or a list of text parts)")


def prompt_ids(tokenizer, text: str) -> list[int]:
    """Token ids of a rendered chat prompt: control tokens written in it become their ids, and
    the BOS token comes first when the file asks for it and the template did not write it."""
    ids = tokenizer.encode(text, add_bos=False, special=True)
    bos = tokenizer.bos_id
    if tokenizer.add_bos and bos is not None and (not ids or ids[0] != bos):
        ids = [bos, *ids]
    return ids


class _TemplateRefused(Exception):
    """The template called raise_exception: it does not accept these messages."""


def _raise_exception(message):
    raise _TemplateRefused(str(message))


def _strftime_now(fmt):
    return datetime.datetime.now().strftime(str(fmt))


def _tojson(value, indent=None, ensure_ascii=False, **_):
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)
