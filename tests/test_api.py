"""The Python API (`sdq.load`) on the tiny Q4_K_M model: the same tokens as `sdq chat`'s
generation, streaming, stats, multi-turn chat on a kept KV cache, and one-line setting errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import sdq
from sdq.errors import ParamsError
from sdq.run.generate import GenerateSettings, generate
from sdq.run.sampler import SamplerSettings

# resident: the test process is too large for a memory plan to mean much (a paged load runs
# in its own process below)
SETTINGS = {"resident": True, "n_ctx": 256, "n_ubatch": 16, "threads": 2, "temp": 0.0}
PROMPT = "The pager reads experts from the disk when"


@pytest.fixture(scope="module")
def model(tiny_model):
    with sdq.load(tiny_model, **SETTINGS) as m:
        yield m


def test_generate_gives_the_engines_greedy_tokens(model):
    out = model.generate(PROMPT, n=10)
    ids = model.tokenizer.encode(PROMPT)
    s = model.session
    settings = GenerateSettings(n_predict=10, sampler=SamplerSettings(temp=0.0))
    ref = generate(s.engine, s.tokenizer, ids, settings)
    assert out.prompt_ids == ids and out.generated_ids == ref.generated_ids
    assert out.text == ref.text and out.finish_reason in ("stop", "length")
    assert model.generate(PROMPT, n=10) == out  # stateless: the same request, the same answer


def test_stream_yields_the_same_tokens_and_text(model):
    whole = model.generate(PROMPT, n=8)
    events = list(model.generate(PROMPT, n=8, stream=True))
    assert [e.id for e in events if e.id is not None] == whole.generated_ids
    assert "".join(e.text for e in events) == whole.text


def test_stats_are_chat_json_figures(model):
    model.generate(PROMPT, n=6)
    stats = model.stats()
    for name in ("decode_tok_s", "prefill_tok_s", "ttft_ms", "hit_rate", "slots", "token_ms"):
        assert name in stats
    assert stats["n_prompt"] == len(model.tokenizer.encode(PROMPT))
    assert len(stats["token_ms"]) == stats["n_decode"] <= 5


def test_stream_stopped_early_frees_the_model(model):
    events = model.generate(PROMPT, n=20, stream=True)
    first = next(events)
    assert first.id is not None
    events.close()  # stops between two tokens
    assert model.generate(PROMPT, n=2).n_generated >= 1


def test_chat_feeds_only_the_new_turn(model):
    chat = model.chat(system="Be terse.")
    first = chat.send("Hello", n=4)
    n_past = model.session.engine.n_past
    assert n_past == first.n_prompt + first.n_generated - 1
    second = chat.send("And then?", n=4)
    # fed: the first reply's last token (if it was no stop token, its text), the end of that
    # turn, and the new one; the cache kept everything before
    rendered = model.prompt_text(chat.messages[:-1])
    held = model.tokenizer.decode(first.prompt_ids + first.generated_ids[:-1])
    assert rendered.startswith(held)
    assert second.prompt_ids == model.tokenizer.encode(rendered[len(held) :], add_bos=False)
    assert second.n_prompt < len(model.encode_prompt(chat.messages[:-1])) - n_past + 8
    assert [m["role"] for m in chat.messages] == ["system", "user", "assistant"] * 1 + [
        "user",
        "assistant",
    ]
    assert chat.messages[-1]["content"] == second.text


def test_another_generation_between_turns_refeeds_the_conversation(model):
    chat = model.chat()
    chat.send("Hi", n=3)
    model.generate(PROMPT, n=2)
    again = chat.send("Again", n=3)
    assert again.prompt_ids == model.encode_prompt(chat.messages[:-1])


@pytest.mark.parametrize(
    "kwargs, text",
    [
        ({"temperature": 1.0}, "unknown setting 'temperature'"),
        ({"n_ctx": "512"}, "n_ctx='512' must be int"),
        ({"resident": 1}, "resident=1 must be bool"),
        ({"n_ubatch": True}, "n_ubatch=True must be int"),
        ({"n_ctx": 0}, "-c 0 must be >= 1"),
        ({"top_p": 2.0}, "--top-p 2.0 must be in"),
    ],
)
def test_bad_settings_are_one_line_params_errors(tiny_model, kwargs, text):
    with pytest.raises(ParamsError, match=text) as info:
        sdq.load(tiny_model, **kwargs)
    assert "\n" not in str(info.value)


def test_bad_calls_are_params_errors(model):
    with pytest.raises(ParamsError, match="unknown sampling setting"):
        model.generate(PROMPT, n=2, temperature=0.5)
    with pytest.raises(ParamsError, match="n 0 must be"):
        model.generate(PROMPT, n=0)
    with pytest.raises(ParamsError, match="role"):
        model.generate([{"role": "robot", "content": "x"}], n=2)


def test_closed_model_refuses(tiny_model):
    with sdq.load(tiny_model, **SETTINGS) as m:
        m.generate("x", n=1)
    assert m.session is None
    with pytest.raises(ParamsError, match="closed"):
        m.generate("x", n=1)


def test_paged_load_in_a_fresh_process(tiny_model, model):
    code = (
        "import sdq, sys, json\n"
        f"with sdq.load(sys.argv[1], ram_budget_mb=2000, max_slots=5, n_ctx=256, temp=0.0) as m:\n"
        f"    out = m.generate({PROMPT!r}, n=6)\n"
        "    print(json.dumps([out.generated_ids, m.stats()['slots']]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tiny_model)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    ids, slots = json.loads(proc.stdout)
    assert slots == 5 and ids == model.generate(PROMPT, n=6).generated_ids


def test_import_sdq_is_light():
    code = "import sys, sdq; print(sorted({'numba', 'numpy', 'jinja2'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_without_a_template_messages_are_raw_text(model):
    template, model.chat_template = model.chat_template, None
    try:
        chat = model.chat(system="A. ")
        first = chat.send("B", n=2)
        assert first.prompt_ids == model.tokenizer.encode("A. B")
    finally:
        model.chat_template = template


def _cnv(tiny_model, *extra):
    cmd = [sys.executable, "-m", "sdq", "chat", "-m", str(tiny_model), "-cnv", "--temp", "0"]
    cmd += ["--resident", "-t", "2", *extra]
    return subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_interactive_chat_reads_turns_until_exit(tiny_model, model):
    proc = _cnv(tiny_model, "-n", "4", "-c", "256", "--system", "Be brief.")
    out, err = proc.communicate("Hello\nAnd then?\n/exit\nnever read\n", timeout=120)
    assert proc.returncode == 0, err
    chat = model.chat(system="Be brief.")
    replies = [chat.send("Hello", n=4).text, chat.send("And then?", n=4).text]
    assert out == f"> {replies[0]}\n> {replies[1]}\n> "
    eof = _cnv(tiny_model, "-n", "2", "-c", "256", "-p", "Hello")
    out, err = eof.communicate("", timeout=120)  # the prompt is the first turn; EOF quits
    assert eof.returncode == 0 and out.startswith(model.chat().send("Hello", n=2).text), err


def test_ctrl_c_stops_the_reply_not_the_program(tiny_model):
    """A reply of 2000 tokens (~25 s here) is interrupted after its first characters; the
    program then reads the next line and quits on /exit within seconds."""
    import os
    import select
    import signal
    import time

    proc = _cnv(tiny_model, "-n", "2000", "-c", "2100", "--ignore-eos")
    proc.stdin.write("Talk\n")
    proc.stdin.flush()
    deadline = time.monotonic() + 60
    seen = b""
    while len(seen) < 6:  # "> " and some of the reply
        assert time.monotonic() < deadline and proc.poll() is None
        if select.select([proc.stdout], [], [], 0.1)[0]:
            seen += os.read(proc.stdout.fileno(), 4096)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.stdin.write("/exit\n")
    proc.stdin.flush()
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    assert time.monotonic() - t0 < 8.0


def test_interactive_chat_prints_no_json(tiny_model, capsys):
    from sdq.cli import main

    assert main(["chat", "-m", str(tiny_model), "-cnv", "--json"]) == 2
    assert "-cnv is interactive" in capsys.readouterr().err
