"""`sdq serve` with the official `openai` client: a server subprocess on 127.0.0.1 (a free port
it picks and prints) with the tiny Q4_K_M model; its replies are those `sdq.load(...).generate`
gives greedily. Its load behaviour too: queueing and the queue limit, disconnects, bodies too
large or of no stated length, memory over 100 requests, and stopping on SIGINT (started as a
shell starts a background job, with SIGINT ignored) and on SIGTERM."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

import sdq

N_CTX = 2100


def _ignore_sigint():
    """What a non-interactive shell does to a job it starts in the background (`sdq serve &`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _start(tiny_model, *flags):
    """A server process, its model id and address, once /health answers."""
    cmd = [sys.executable, "-m", "sdq", "serve", "-m", str(tiny_model), "--port", "0"]
    cmd += ["--ram-budget-mb", "3000", "-c", str(N_CTX), "--temp", "0", "-t", "2", "-n", "8"]
    proc = subprocess.Popen(
        [*cmd, *flags], stderr=subprocess.PIPE, text=True, preexec_fn=_ignore_sigint
    )
    line = proc.stderr.readline()  # the server's one line: model id and address
    found = re.search(r"sdq serve: (\S+) on (http://127\.0\.0\.1:\d+/v1)", line)
    if not found:
        proc.kill()
        raise AssertionError(f"no address in {line!r} (exit {proc.wait()})")
    name, url = found.groups()
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(url.removesuffix("/v1") + "/health", timeout=1).raise_for_status()
            return proc, name, url
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError("the server never answered /health") from None
            time.sleep(0.1)


def _stop(proc, sig) -> None:
    """Stop with `sig`: the server must say so and exit 0 within 30 s."""
    proc.send_signal(sig)
    try:
        rc = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"still running 30 s after {sig!r}") from None
    rest = proc.stderr.read()
    assert rc == 0, rest
    assert "sdq serve: stopping" in rest


@pytest.fixture(scope="module")
def server(tiny_model):
    """Started with SIGINT ignored, as `sdq serve ... &` from a script is; stopped by SIGINT."""
    proc, name, url = _start(tiny_model)
    try:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
        yield name, url, client, proc
    finally:
        _stop(proc, signal.SIGINT)


@pytest.fixture(scope="module")
def local(tiny_model):
    with sdq.load(tiny_model, resident=True, n_ctx=256, temp=0.0, threads=2) as m:
        yield m


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]


def test_models_lists_the_one_model(server):
    name, _, client, _ = server
    assert [m.id for m in client.models.list().data] == [name]


def test_chat_completion_is_the_greedy_generation_with_usage(server, local):
    name, _, client, _ = server
    reply = client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=12)
    ours = local.generate(MESSAGES, n=12)
    assert reply.choices[0].message.content == ours.text
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason == ours.finish_reason
    assert reply.usage.prompt_tokens == ours.n_prompt == len(local.encode_prompt(MESSAGES))
    assert reply.usage.completion_tokens == ours.n_generated
    assert reply.usage.total_tokens == ours.n_prompt + ours.n_generated


def test_streamed_chat_is_the_same_text(server, local):
    name, _, client, _ = server
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
    name, _, client, _ = server
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
    name, url, client, _ = server
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
    name, _, client, _ = server
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
    name, url, _, _ = server
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


def test_out_of_range_sampling_is_400(server):
    name, url, _, _ = server
    base = {"model": name, "prompt": "x", "max_tokens": 2}
    for field, value in (
        ("temperature", 2.5), ("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.5),
        ("max_tokens", 0), ("n", 2), ("stop", ["\\n"]),
    ):  # fmt: skip
        r = httpx.post(url + "/completions", json={**base, field: value}, timeout=30)
        assert r.status_code == 400, (field, value, r.text)
        assert field in r.json()["error"]["message"], r.text


def _raw_post(url: str, headers: str, body: bytes = b"") -> tuple[int, dict]:
    """Status and JSON body of a POST sent byte by byte (what httpx would not send)."""
    host, port = re.match(r"http://([\d.]+):(\d+)/v1", url).groups()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\n\r\n"
        )
        sock.sendall(head.encode() + body)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    status = int(reply.split(b" ", 2)[1])
    return status, json.loads(reply.split(b"\r\n\r\n", 1)[1])


def test_bodies_too_large_or_of_no_stated_length_are_refused_unread(server):
    from sdq.commands.serve import MAX_BODY_BYTES

    _, url, _, _ = server
    status, body = _raw_post(url, f"Content-Length: {MAX_BODY_BYTES + 1}\r\n")  # none sent
    assert status == 413
    assert body["error"]["message"] == (
        f"request body {MAX_BODY_BYTES + 1:,} bytes > the limit {MAX_BODY_BYTES:,}"
    )
    chunked = b"2\r\n{}\r\n0\r\n\r\n"
    status, body = _raw_post(url, "Transfer-Encoding: chunked\r\n", chunked)
    assert status == 411 and body["error"]["message"] == "a request body must state its length"
    status, body = _raw_post(url, "Content-Length: 2\r\nContent-Type: application/json\r\n", b"{}")
    assert status == 400  # within the limit: read, and judged on its content


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:")) / 1024


def test_memory_stays_bounded_over_100_requests(server):
    """After 10 requests to warm up, 100 more (chat and completion, streamed and not) grow the
    server's RSS by less than 16 MiB."""
    name, _, client, proc = server

    def ask(i: int) -> None:
        if i % 2:
            client.completions.create(
                model=name, prompt=f"Ask {i}", max_tokens=2, stream=i % 4 == 1
            )
        else:
            messages = [{"role": "user", "content": f"Ask {i}"}]
            client.chat.completions.create(model=name, messages=messages, max_tokens=2)

    for i in range(10):
        ask(i)
    before = _rss_mb(proc.pid)
    for i in range(100):
        ask(i)
    grown = _rss_mb(proc.pid) - before
    assert grown < 16, f"RSS grew {grown:.1f} MiB over 100 requests"


def test_a_full_queue_refuses_at_once_and_sigterm_stops_the_server(tiny_model):
    """--max-queue 1: one request runs (a long stream), one waits, the next gets 503 at once;
    when the stream's client goes, the waiting one is answered. SIGTERM then stops it."""
    proc, name, url = _start(tiny_model, "--max-queue", "1")
    try:
        long = {"model": name, "prompt": "Long", "max_tokens": 2000, "stream": True}
        short = {"model": name, "prompt": "x", "max_tokens": 2}
        waited = {}

        def wait_in_line():
            waited["reply"] = httpx.post(url + "/completions", json=short, timeout=60)

        with httpx.stream("POST", url + "/completions", json=long, timeout=60) as running:
            lines = running.iter_lines()
            assert next(ln for ln in lines if ln.startswith("data: {"))  # it runs
            waiting = threading.Thread(target=wait_in_line)
            waiting.start()
            time.sleep(1.0)  # the second request is in the queue
            t0 = time.monotonic()
            refused = httpx.post(url + "/completions", json=short, timeout=60)
            assert time.monotonic() - t0 < 2.0
        waiting.join(60)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        error = refused.json()["error"]
        assert error["code"] == "queue_full" and "--max-queue 1" in error["message"]
        assert waited["reply"].status_code == 200, waited["reply"].text
    finally:
        _stop(proc, signal.SIGTERM)
