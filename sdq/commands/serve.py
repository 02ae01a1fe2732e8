"""`sdq serve -m MODEL [run flags] --host 127.0.0.1 --port N`: an OpenAI-compatible HTTP server.

Endpoints (one model, the file's name without `.gguf` as its id):

    GET  /v1/models             the model
    POST /v1/chat/completions   messages in the model's chat template -> the assistant's reply
    POST /v1/completions        a prompt (text, or token ids) -> its continuation
    GET  /health                {"status": "ok"} once the model is loaded

`"stream": true` sends the reply as server-sent events (`data: {chunk}` lines, then
`data: [DONE]`); `stream_options.include_usage` adds a last chunk with the usage. Usage counts
the prompt's tokens and the generated ones (a stop token that ended the reply included).
`max_tokens` (or `max_completion_tokens`) defaults to the server's `-n`; `temperature`,
`top_p`, `seed` and `top_k` (an extension) default to the server's flags. `n` must be 1 and
`stop` sequences are not supported.

One generation runs at a time, in the main thread (where the engine's threads were set up):
requests wait in a queue in the order they arrived, at most `--max-queue` of them (default 16)
behind the running one; one more is refused at once with 503 (code `queue_full`, and a
`Retry-After` header) rather than left waiting without bound. A request whose client
disconnects is cancelled: a queued one never starts (and frees its place), a running one stops
between two tokens. Every request is stateless: it starts from an empty KV cache, so the same
request gets the same answer. SIGINT and SIGTERM stop the server, in the foreground or started
in the background by a shell (which would otherwise leave SIGINT ignored).

Errors are OpenAI-style JSON, `{"error": {"message", "type", "param", "code"}}`: 400 for a
malformed request (missing or mistyped fields, out-of-range sampling values, a prompt longer
than the context: code `context_length_exceeded`), 404 for another model's name, 411 for a
POST that does not state its length and 413 for a body over 4 MiB (`MAX_BODY_BYTES`: a full
context of text is far less), 503 for a full queue, 500 for a failure while generating (a read
error, say).

The memory plan counts the process with the server's libraries loaded; request and response
buffers come out of the reserve (`--reserve-mb`).
"""

import argparse
import queue
import sys

from sdq.commands.run_flags import add_run_arguments, checked_settings
from sdq.errors import ParamsError, SdqError

MAX_BODY_BYTES = 4 << 20  # a request body over this is refused (413) before it is read


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", required=True, help="GGUF model file")
    add_run_arguments(p, helps={"n_predict": "tokens to generate when max_tokens is not given"})
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument(
        "--port", type=int, default=8080, help="port to listen on (0: any free port; printed)"
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=16,
        help="requests that may wait behind the running one; more are refused with 503",
    )


def run(args) -> int:
    import signal
    import socket
    import threading

    from sdq.run.runtime import Model
    from sdq.run.settings import RunSettings

    settings = checked_settings(RunSettings.from_args(args))
    if not 0 <= args.port <= 65535:
        raise ParamsError(f"--port {args.port} must be in 0..65535")
    if not 0 <= args.max_queue <= 4096:
        raise ParamsError(f"--max-queue {args.max_queue} must be in 0..4096")
    try:
        import fastapi  # noqa: F401  (loaded before the memory plan measures the process)
        import uvicorn
    except ImportError as exc:
        raise SdqError(f"sdq serve needs fastapi and uvicorn ({exc})") from None
    try:
        sock = socket.create_server((args.host, args.port))
    except (OSError, OverflowError) as exc:
        raise ParamsError(f"cannot listen on {args.host}:{args.port} ({exc})") from None
    with sock, Model(settings) as model:
        jobs: queue.Queue[Job] = queue.Queue()
        app = build_app(model, jobs, args.max_queue)
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        signal.signal(signal.SIGTERM, _interrupt)
        signal.signal(signal.SIGINT, _interrupt)  # also where a shell started us ignoring it
        thread.start()
        host, port = sock.getsockname()[:2]
        print(
            f"sdq serve: {model_id(model)} on http://{host}:{port}/v1 (one request at a time)",
            file=sys.stderr,
            flush=True,
        )
        try:
            while thread.is_alive():
                try:
                    job = jobs.get(timeout=0.2)
                except queue.Empty:
                    continue
                job.run(model)
        except KeyboardInterrupt:
            print("sdq serve: stopping", file=sys.stderr)
        finally:
            server.should_exit = True
            thread.join(10)
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def model_id(model) -> str:
    from pathlib import Path

    name = Path(model.settings.model).name
    return name[: -len(".gguf")] if name.endswith(".gguf") else name


# --- one request's generation, run by the main thread ------------------------------------------


class Job:
    """One request: its prompt and sampling, a cancel flag, and the queue its events go to
    (("error", status, body), ("start", n_prompt), ("text", piece), ("done", finish, n_gen))."""

    def __init__(self, prompt, n: int, sampling: dict, loop, stream: bool):
        import asyncio
        import threading

        self.prompt, self.n, self.sampling, self.stream = prompt, n, sampling, stream
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancel = threading.Event()

    def post(self, *item) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, item)

    def run(self, model) -> None:
        """Generate (in the calling thread) and post the events; stop when cancelled."""
        if self.cancel.is_set():
            return
        try:
            ids = model.encode_prompt(self.prompt)
            need = len(ids) + self.n - 1
            if need > model.settings.n_ctx:
                self.post(
                    "error",
                    400,
                    error_body(
                        f"prompt {len(ids)} tokens + max_tokens {self.n} needs {need} KV "
                        f"positions > context length {model.settings.n_ctx}",
                        code="context_length_exceeded",
                        param="messages" if isinstance(self.prompt, list) else "prompt",
                    ),
                )
                return
            events = model.generate(ids, self.n, stream=True, **self.sampling)
        except SdqError as exc:
            status = 400 if isinstance(exc, ParamsError) else 500
            self.post("error", status, error_body(str(exc)))
            return
        except Exception as exc:  # a bug: the request fails, the server goes on
            self.post("error", 500, error_body(f"{type(exc).__name__}: {exc}", kind="server_error"))
            return
        self.post("start", len(ids))
        generated = []
        try:
            for event in events:
                if event.id is not None:
                    generated.append(event.id)
                if event.text:
                    self.post("text", event.text)
                if self.cancel.is_set():
                    break
        except SdqError as exc:
            self.post("error", 500, error_body(str(exc), kind="server_error"))
            return
        except Exception as exc:  # a bug: this request fails, the server goes on
            self.post("error", 500, error_body(f"{type(exc).__name__}: {exc}", "server_error"))
            return
        finally:
            events.close()
        stops = model.tokenizer.stop_ids if model.settings.stop_at_eos else frozenset()
        finish = "stop" if generated and generated[-1] in stops else "length"
        self.post("done", finish, len(generated))


def error_body(message: str, kind="invalid_request_error", param=None, code=None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# --- the HTTP side (FastAPI, in uvicorn's thread) ----------------------------------------------


def build_app(model, jobs: queue.Queue, max_queue: int = 16):
    """The FastAPI app: requests become Jobs on `jobs`, which the main thread runs in order;
    at most `max_queue` wait (cancelled ones do not count)."""
    import asyncio
    import json
    import time
    import uuid
    from typing import Literal

    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from pydantic import BaseModel, ConfigDict, Field
    from starlette.exceptions import HTTPException

    name = model_id(model)
    s = model.settings

    class TextPart(BaseModel):
        type: Literal["text"]
        text: str

    class Message(BaseModel):
        role: Literal["system", "user", "assistant", "tool"]
        content: str | list[TextPart]

    class StreamOptions(BaseModel):
        include_usage: bool = False

    class Common(BaseModel):
        model_config = ConfigDict(extra="ignore")
        model: str
        max_tokens: int | None = Field(default=None, ge=1)
        temperature: float | None = Field(default=None, ge=0.0, le=2.0)
        top_p: float | None = Field(default=None, gt=0.0, le=1.0)
        top_k: int | None = None
        seed: int | None = None
        stream: bool = False
        stream_options: StreamOptions | None = None
        n: Literal[1] = 1
        stop: None = None

    class ChatRequest(Common):
        messages: list[Message] = Field(min_length=1)
        max_completion_tokens: int | None = Field(default=None, ge=1)

    class CompletionRequest(Common):
        prompt: str | list[str] | list[int] = Field(min_length=1)

    app = FastAPI(title="sdq", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ())[1:]) or None
        message = f"{where or 'body'}: {first.get('msg', 'invalid request')}"
        if first.get("type") == "json_invalid":
            where, message = None, "the request body is not valid JSON"
        return JSONResponse(error_body(message, param=where), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        return JSONResponse(error_body(str(exc.detail)), status_code=exc.status_code)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model_card()]}

    @app.get("/v1/models/{model_name}")
    async def one_model(model_name: str):
        if model_name != name:
            return _unknown_model(model_name)
        return _model_card()

    def _model_card():
        return {"id": name, "object": "model", "created": 0, "owned_by": "sdq"}

    def _unknown_model(asked: str):
        body = error_body(
            f"model {asked!r} is not served here (this server serves {name!r})",
            param="model",
            code="model_not_found",
        )
        return JSONResponse(body, status_code=404)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, request: Request):
        messages = [m.model_dump() for m in req.messages]
        n = req.max_completion_tokens or req.max_tokens or s.n_predict
        return await _serve(req, request, messages, n, "chat.completion", "chatcmpl")

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                body = error_body("one prompt per request", param="prompt")
                return JSONResponse(body, status_code=400)
            prompt = prompt[0]
        if isinstance(prompt, list) and not all(0 <= t < model.tokenizer.n_vocab for t in prompt):
            body = error_body(f"a token id outside 0..{model.tokenizer.n_vocab - 1}", "prompt")
            return JSONResponse(body, status_code=400)
        n = req.max_tokens or s.n_predict
        return await _serve(req, request, prompt, n, "text_completion", "cmpl")

    async def _serve(req, request: Request, prompt, n: int, kind: str, prefix: str):
        if req.model != name:
            return _unknown_model(req.model)
        sampling = {
            k: v
            for k, v in (
                ("temp", req.temperature),
                ("top_p", req.top_p),
                ("top_k", req.top_k),
                ("seed", req.seed),
            )
            if v is not None
        }
        with jobs.mutex:  # the main thread takes jobs off meanwhile
            waiting = sum(not j.cancel.is_set() for j in jobs.queue)
        if waiting >= max_queue:
            body = error_body(
                f"{waiting} requests already wait (--max-queue {max_queue}): try again later",
                kind="server_error",
                code="queue_full",
            )
            return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})
        job = Job(prompt, n, sampling, asyncio.get_running_loop(), req.stream)
        jobs.put(job)
        first = await _next(job, request)
        if first is None:  # the client went away while the request waited
            return JSONResponse(error_body("cancelled"), status_code=499)
        if first[0] == "error":
            return JSONResponse(first[2], status_code=first[1])
        n_prompt = first[1]
        head = {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time())}
        head["model"] = name
        chat = kind == "chat.completion"
        if req.stream:
            usage = bool(req.stream_options and req.stream_options.include_usage)
            chunks = _chunks(job, head, chat, n_prompt, usage)
            return StreamingResponse(chunks, media_type="text/event-stream")
        pieces = []
        while True:
            item = await _next(job, request)
            if item is None:
                return JSONResponse(error_body("cancelled"), status_code=499)
            if item[0] == "error":
                return JSONResponse(item[2], status_code=item[1])
            if item[0] == "text":
                pieces.append(item[1])
            elif item[0] == "done":
                break
        text = "".join(pieces)
        choice = {"index": 0, "finish_reason": item[1], "logprobs": None}
        choice.update(
            {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
        )
        return {**head, "choices": [choice], "usage": _usage(n_prompt, item[2])}

    async def _next(job: Job, request: Request):
        """The job's next event; None (and the job cancelled) once the client disconnects."""
        while True:
            try:
                return await asyncio.wait_for(job.events.get(), timeout=0.25)
            except TimeoutError:
                if await request.is_disconnected():
                    job.cancel.set()
                    return None

    async def _chunks(job: Job, head: dict, chat: bool, n_prompt: int, usage: bool):
        kind = head["object"] + (".chunk" if chat else "")

        def chunk(delta: str | None, finish=None, role=False) -> str:
            if chat:
                d = {"role": "assistant", "content": ""} if role else {}
                if delta:
                    d["content"] = delta
                choice = {"index": 0, "delta": d, "finish_reason": finish, "logprobs": None}
            else:
                choice = {"index": 0, "text": delta or "", "finish_reason": finish}
                choice["logprobs"] = None
            body = {**head, "object": kind, "choices": [choice]}
            return f"data: {json.dumps(body)}\n\n"

        try:
            if chat:
                yield chunk(None, role=True)
            while True:
                item = await job.events.get()
                if item[0] == "text":
                    yield chunk(item[1])
                elif item[0] == "error":
                    yield f"data: {json.dumps(item[2])}\n\n"
                    break
                else:
                    yield chunk(None, finish=item[1])
                    if usage:
                        body = {**head, "object": kind, "choices": []}
                        body["usage"] = _usage(n_prompt, item[2])
                        yield f"data: {json.dumps(body)}\n\n"
                    break
            yield "data: [DONE]\n\n"
        finally:  # the client disconnected (the task was cancelled) or the reply is complete
            job.cancel.set()

    return app


def _usage(n_prompt: int, n_generated: int) -> dict:
    return {
        "prompt_tokens": n_prompt,
        "completion_tokens": n_generated,
        "total_tokens": n_prompt + n_generated,
    }


class BodyLimit:
    """ASGI middleware: a POST must state its length (411 otherwise), at most `limit` bytes
    (413 otherwise); the HTTP server holds the body to what it stated."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        stated = dict(scope["headers"]).get(b"content-length")
        if stated is None or not stated.isdigit():
            return await _refuse(send, 411, "a request body must state its length")
        if int(stated) > self.limit:
            message = f"request body {int(stated):,} bytes > the limit {self.limit:,}"
            return await _refuse(send, 413, message)
        await self.app(scope, receive, send)


async def _refuse(send, status: int, message: str) -> None:
    import json

    body = json.dumps(error_body(message)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
