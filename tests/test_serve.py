"""`sdq serve` with the official `openai` client: a server subprocess on 127.0.0.1 (a free port
it picks and prints) with the tiny Q4_K_M model; its replies are those `sdq.load(...).generate`
gives greedily."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

import sdq

N_CTX = 2100


def _default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(scope="module")
def server(tiny_model):
    cmd = [sys.executable, "-m", "sdq", "serve", "-m", str(tiny_model), "--port", "0"]
    cmd += ["--ram-budget-mb", "3000", "-c", str(N_CTX), "--temp", "0", "-t", "2", "-n", "8"]
    # a shell may start background jobs (and so this test run) with SIGINT ignored, which the
    # server would inherit: it stops on SIGINT as started from a terminal
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
    try:
        line = proc.stderr.readline()  # the server's one line: model id and address
        found = re.search(r"sdq serve: (\S+) on (http://127\.0\.0\.1:\d+/v1)", line)
        assert found, f"no address in {line!r} (exit {proc.poll()})"
        name, url = found.groups()
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url.removesuffix("/v1") + "/health", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the server never answered /health"
                time.sleep(0.1)
        yield name, url, client
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        rest = proc.stderr.read()
        assert rc == 0, rest


@pytest.fixture(scope="module")
def local(tiny_model):
    with sdq.load(tiny_model, resident=True, n_ctx=256, temp=0.0, threads=2) as m:
        yield m


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]


def test_models_lists_the_one_model(server):
    name, _, client = server
    assert [m.id for m in client.models.list().data] == [name]


def test_chat_completion_is_the_greedy_generation_with_usage(server, local):
    name, _, client = server
    reply = client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=12)
    ours = local.generate(MESSAGES, n=12)
    assert reply.choices[0].message.content == ours.text
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason == ours.finish_reason
    assert reply.usage.prompt_tokens == ours.n_prompt == len(local.encode_prompt(MESSAGES))
    assert reply.usage.completion_tokens == ours.n_generated
    assert reply.usage.total_tokens == ours.n_prompt + ours.n_generated


def test_streamed_chat_is_the_same_text(server, local):
    name, _, client = server
    stream = client.chat.completions.create(
        model=name,
        messages=MESSAGES,
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    ours = local.generate(MESSAGES, n=12)
    assert text == ours.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == ours.finish_reason
    assert chunks[-1].usage.completion_tokens == ours.n_generated
    assert chunks[-1].usage.prompt_tokens == ours.n_prompt


def test_completion_and_default_max_tokens(server, local):
    name, _, client = server
    prompt = "The expert cache holds"
    reply = client.completions.create(model=name, prompt=prompt, max_tokens=10)
    ours = local.generate(prompt, n=10)
    assert reply.choices[0].text == ours.text
    assert reply.usage.prompt_tokens == ours.n_prompt
    assert reply.usage.completion_tokens == ours.n_generated
    by_default = client.completions.create(model=name, prompt=prompt)  # the server's -n 8
    assert by_default.choices[0].text == local.generate(prompt, n=8).text
    streamed = client.completions.create(model=name, prompt=prompt, max_tokens=10, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == ours.text


def test_bad_requests_are_4xx_json(server):
    name, url, client = server
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model=name, messages=[])
    with pytest.raises(openai.BadRequestError, match="role"):
        client.chat.completions.create(model=name, messages=[{"role": "robot", "content": "x"}])
    with pytest.raises(openai.NotFoundError, match="not served here") as info:
        client.chat.completions.create(model="gpt-4", messages=MESSAGES)
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="context length") as info:
        client.completions.create(model=name, prompt="Hi", max_tokens=N_CTX + 1)
    assert info.value.code == "context_length_exceeded"
    for body in (json.dumps({"model": name}), "{not json", '{"model": 1, "messages": "x"}'):
        r = httpx.post(url + "/chat/completions", content=body, timeout=30)
        assert r.status_code == 400, r.text
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = httpx.post(url + "/completions", json={"model": name, "prompt": "x", "max_tokens": "many"})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]


def test_requests_are_queued_and_answered_alike(server, local):
    name, _, client = server
    answers = [None] * 3

    def ask(i):
        answers[i] = client.completions.create(model=name, prompt="Queue", max_tokens=6)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    expected = local.generate("Queue", n=6).text
    assert [a.choices[0].text for a in answers] == [expected] * 3


def test_a_disconnected_client_stops_its_generation(server):
    """A stream asked for 2000 tokens is dropped after two chunks: the next request is answered
    at once, not after the 2000 tokens (~10 s here)."""
    name, url, _ = server
    body = {"model": name, "prompt": "Long", "max_tokens": 2000, "stream": True}
    with httpx.stream("POST", url + "/completions", json=body, timeout=60) as r:
        got = []
        for line in r.iter_lines():
            if line.startswith("data: {"):
                got.append(json.loads(line.removeprefix("data: ")))
            if len(got) == 2:
                break
    t0 = time.monotonic()
    r = httpx.post(
        url + "/completions", json={"model": name, "prompt": "x", "max_tokens": 2}, timeout=60
    )
    assert r.status_code == 200 and len(got) == 2
    assert time.monotonic() - t0 < 4.0
