"""A loaded model for programs: generate from text or chat messages, stream, keep a conversation.

`Model` owns one Session (the plan, the pager, the engine) for as long as it is open and runs one
generation at a time on it:

    model.generate("text" | messages, n=..., stream=False)  -> Completion
    model.generate(..., stream=True)                        -> iterator of TokenEvent
    model.chat(system=...).send("text")                     -> Completion (multi-turn)
    model.stats()                                           -> the last run's figures

`generate` is stateless: every call starts from an empty KV cache, so equal requests give equal
answers. A `Chat` keeps its conversation in the KV cache between turns: a turn feeds only the
tokens after what the cache already holds (the end of the previous reply, the template's turn
markers and the new message). When the cache holds something else (another generation ran in
between, or the template rendered the earlier turns differently), the whole conversation is fed
again. Stopping a stream early (closing the iterator) stops between two tokens.

Messages are rendered with the file's chat template (sdq.format.chat_template); a file without
one has no chat format: its messages' texts are joined as they are (`Model.chat_template` is
None then).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

from sdq.errors import ParamsError
from sdq.run.settings import RunSettings


@dataclass(frozen=True)
class TokenEvent:
    """One step of a streamed generation: a generated token and the text it completes ("" while
    a UTF-8 character is incomplete, and for a stop token). `id` is None for text held back
    until the end."""

    id: int | None
    text: str


@dataclass(frozen=True)
class Completion:
    text: str  # the generated text (stop tokens left out)
    prompt_ids: list[int]  # the tokens fed for this request (a chat turn: only the new ones)
    generated_ids: list[int]  # the stop token included, when one ended the reply
    finish_reason: str  # "stop": a stop token ended it; "length": n tokens were generated

    @property
    def n_prompt(self) -> int:
        return len(self.prompt_ids)

    @property
    def n_generated(self) -> int:
        return len(self.generated_ids)


SAMPLING = ("temp", "top_k", "top_p", "seed")


class Model:
    """A GGUF model opened for generation under its RunSettings; close it (or use `with`)."""

    def __init__(self, settings: RunSettings):
        from sdq.format.chat_template import ChatTemplate
        from sdq.run.session import Session

        self.session = Session(settings)
        self.settings = settings
        tok = self.tokenizer = self.session.tokenizer  # sdq.format.tokenizer.Tokenizer
        try:
            self.chat_template = ChatTemplate.of(
                self.session.model.metadata, tok, where=str(settings.model)
            )
        except BaseException:
            self.session.close(completed=False)
            raise
        self._last = None  # sdq.run.generate.Generation of the last finished run
        self._busy = False
        self._owner = None  # the Chat whose conversation the KV cache holds
        self._fed_text = ""  # the text of the tokens in the KV cache (for the owner Chat)

    # -- use -----------------------------------------------------------------------------------

    def prompt_text(self, messages) -> str:
        """The prompt `messages` make: the chat template's rendering with the assistant's turn
        opened, or (no template) the messages' texts joined."""
        from sdq.format.chat_template import check_messages

        if self.chat_template is None:
            return "".join(m["content"] for m in check_messages(messages))
        return self.chat_template.render(messages, add_generation_prompt=True)

    def encode_prompt(self, prompt) -> list[int]:
        """Token ids for `prompt`: text (control tokens written in it parsed, BOS per the
        file), a list of chat messages, or a list of token ids (taken as they are)."""
        from sdq.format.chat_template import prompt_ids

        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, list | tuple) and prompt and all(type(t) is int for t in prompt):
            n_vocab = self.tokenizer.n_vocab
            if not all(0 <= t < n_vocab for t in prompt):
                raise ParamsError(f"a prompt token id is outside 0..{n_vocab - 1}")
            return list(prompt)
        return prompt_ids(self.tokenizer, self.prompt_text(prompt))

    def generate(self, prompt, n: int | None = None, *, stream: bool = False, **sampling):
        """Generate up to `n` tokens (default: the settings' n_predict) after `prompt` (text,
        chat messages or token ids), from an empty KV cache. `sampling`: temp, top_k, top_p,
        seed for this call. stream=False: a Completion; stream=True: an iterator of TokenEvent."""
        ids = self.encode_prompt(prompt)
        events = self._run(ids, n, sampling, keep_cache=False, owner=None, fed_text="")
        return events if stream else self._complete(ids, events)

    def chat(self, system: str | None = None) -> Chat:
        """A new conversation (with a system message when `system` is given)."""
        return Chat(self, system)

    @property
    def last_generation(self):
        """The last finished run (sdq.run.generate.Generation), or None."""
        return self._last

    def stats(self) -> dict:
        """The last finished run's figures, as `sdq chat --json` reports them (DESIGN names,
        plan and pager figures, and `token_ms`: each decode step's wall time)."""
        g = self._last
        if g is None:
            raise ParamsError("no finished generation yet: stats() follows a generate()")
        return {**self.session.figures(g), "token_ms": [round(ms, 3) for ms in g.token_ms]}

    def close(self, completed: bool = True) -> None:
        """Release the pager's reads, the arena and the engine's threads (a route log is kept
        only if the run `completed`)."""
        if self.session is not None:
            self.session.close(completed=completed)
            self.session = None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(completed=exc_type is None)

    # -- one run ---------------------------------------------------------------------------------

    def _generate_settings(self, n, sampling: dict):
        from sdq.run.generate import GenerateSettings

        unknown = sorted(set(sampling) - set(SAMPLING))
        if unknown:
            raise ParamsError(f"unknown sampling setting {unknown[0]!r} (known: {SAMPLING})")
        s = self.settings
        n = s.n_predict if n is None else n
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ParamsError(f"n {n!r} must be an integer >= 1")
        for key, value in sampling.items():
            kind = float if key in ("temp", "top_p") else int
            if isinstance(value, bool) or not isinstance(value, int | kind):
                raise ParamsError(f"{key} {value!r} must be a {kind.__name__}")
        sampler = dataclasses.replace(s.sampler, **sampling)
        return GenerateSettings(n_predict=n, sampler=sampler, stop_at_eos=s.stop_at_eos)

    def _run(self, ids, n, sampling, *, keep_cache, owner, fed_text) -> Iterator[TokenEvent]:
        """Checks now, then a generator of the run's events; when the run ends, finished or
        stopped, the KV cache's owner and text are recorded."""
        from sdq.run.generate import generation_steps

        if self.session is None:
            raise ParamsError("the model is closed")
        if self._busy:
            raise ParamsError("a generation is still running on this model (one at a time)")
        gs = self._generate_settings(n, sampling)
        s = self.session
        steps = generation_steps(s.engine, s.tokenizer, ids, gs, keep_cache=keep_cache)
        self._busy, self._owner, self._last = True, None, None
        try:
            first = next(steps)  # the prompt is checked and prefilled here
        except BaseException:
            self._busy = False
            raise
        return _primed(self._events(steps, first, ids, owner, fed_text))

    def _events(self, steps, first, ids, owner, fed_text) -> Iterator[TokenEvent]:
        generated: list[int] = []
        step = first
        try:
            yield None  # primed: from here on, dropping the iterator runs the finally below
            while True:
                tok, piece = step
                if tok is not None:
                    generated.append(tok)
                yield TokenEvent(tok, piece)
                try:
                    step = next(steps)
                except StopIteration as done:
                    self._last = done.value
                    break
        finally:
            steps.close()
            self._busy = False
            tok = self.tokenizer
            # the KV cache holds the fed tokens and every generated token but the last
            fed = tok.decode_bytes(ids) + tok.decode_bytes(generated[:-1])
            self._owner = owner
            self._fed_text = fed_text + fed.decode("utf-8", "replace")

    def _complete(self, ids: list[int], events: Iterator[TokenEvent]) -> Completion:
        """Run a stream to its end: the Completion of prompt `ids`."""
        events = list(events)
        generated = [e.id for e in events if e.id is not None]
        stops = self.tokenizer.stop_ids if self.settings.stop_at_eos else frozenset()
        reason = "stop" if generated and generated[-1] in stops else "length"
        return Completion("".join(e.text for e in events), list(ids), generated, reason)


class Chat:
    """A conversation whose earlier turns stay in the model's KV cache."""

    def __init__(self, model: Model, system: str | None = None):
        self.model = model
        self.messages: list[dict[str, str]] = []
        if system is not None:
            self.messages.append({"role": "system", "content": system})

    def send(self, text: str, n: int | None = None, *, stream: bool = False, **sampling):
        """Add the user's `text`, generate the reply (a Completion, or with stream=True an
        iterator of TokenEvent), and add the reply to the conversation (a stopped stream adds
        what was generated before it stopped)."""
        if not isinstance(text, str):
            raise ParamsError(f"a chat message is text, not {type(text).__name__}")
        m = self.model
        turn = [*self.messages, {"role": "user", "content": text}]
        rendered = m.prompt_text(turn)
        held = m._fed_text if m._owner is self else ""
        if held and len(rendered) > len(held) and rendered.startswith(held):
            ids = m.tokenizer.encode(rendered[len(held) :], add_bos=False)
            events = m._run(ids, n, sampling, keep_cache=True, owner=self, fed_text=held)
        else:
            ids = m.encode_prompt(turn)
            events = m._run(ids, n, sampling, keep_cache=False, owner=self, fed_text="")
        self.messages = turn
        events = _primed(self._recorded(events))
        return events if stream else m._complete(ids, events)

    def _recorded(self, events: Iterator[TokenEvent]) -> Iterator[TokenEvent]:
        pieces = []
        try:
            yield None  # primed (see _primed)
            for e in events:
                pieces.append(e.text)
                yield e
        finally:
            events.close()
            self.messages.append({"role": "assistant", "content": "".join(pieces)})


def _primed(gen):
    """`gen` advanced past its first `yield None`, inside its try block: an iterator dropped
    unread still runs its cleanup (CPython closes it when the last reference goes)."""
    next(gen)
    return gen
