"""Chat templates: the file's Jinja template rendered in a sandbox, checked against llama.cpp's
own chat formatting of the same template, and its errors one line each."""

from __future__ import annotations

import ctypes

import pytest

from sdq.errors import ParamsError, TokenizerError
from sdq.format.chat_template import ChatTemplate, check_messages, prompt_ids
from sdq.format.header import read_header
from sdq.format.tokenizer import Tokenizer

# llama.cpp's llama_chat_apply_template formats ChatML by its own rule, which adds no default
# system message: the conversations compared with it start with one.
CONVERSATIONS = [
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "héllo, wörld"}],
    [
        {"role": "system", "content": ""},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two\n"},
        {"role": "user", "content": "<b>three</b>"},
    ],
]


@pytest.fixture(scope="module")
def tiny_vocab(tiny_model):
    meta = read_header(tiny_model).metadata
    return meta, Tokenizer.from_metadata(meta, source="tiny")


def _llama_cpp_render(llama_cpp, template: str, messages, add_generation_prompt: bool) -> str:
    chat = (llama_cpp.llama_chat_message * len(messages))(
        *[
            llama_cpp.llama_chat_message(role=m["role"].encode(), content=m["content"].encode())
            for m in messages
        ]
    )
    buf = ctypes.create_string_buffer(1 << 16)
    n = llama_cpp.llama_chat_apply_template(
        template.encode(), chat, len(messages), add_generation_prompt, buf, len(buf)
    )
    assert 0 < n <= len(buf)
    return buf.raw[:n].decode()


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_synthetic_models_template_renders_as_llama_cpp_does(
    llama_cpp, tiny_vocab, messages, add_generation_prompt
):
    meta, tok = tiny_vocab
    template = ChatTemplate.of(meta, tok, "tiny")
    ours = template.render(messages, add_generation_prompt=add_generation_prompt)
    theirs = _llama_cpp_render(
        llama_cpp, meta["tokenizer.chat_template"], messages, add_generation_prompt
    )
    assert ours == theirs
    assert ours.endswith("<|im_start|>assistant\n") == add_generation_prompt


def test_template_adds_its_default_system_message(tiny_vocab):
    meta, tok = tiny_vocab
    text = ChatTemplate.of(meta, tok, "tiny").render([{"role": "user", "content": "hi"}])
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_prompt_ids_parse_control_tokens_and_follow_add_bos(tiny_vocab):
    meta, tok = tiny_vocab
    text = ChatTemplate.of(meta, tok, "tiny").render(CONVERSATIONS[0])
    ids = prompt_ids(tok, text)
    im_start = tok.tokens.index("<|im_start|>")
    assert ids[0] == im_start and ids.count(im_start) == 3  # system, user, assistant
    assert tok.decode(ids) == text
    assert not tok.add_bos  # the synthetic vocabulary: no BOS
    tok.add_bos = True
    try:
        with_bos = prompt_ids(tok, text)
        assert with_bos == [tok.bos_id, *ids]
        # a template that writes the BOS itself does not get a second one
        assert prompt_ids(tok, tok.tokens[tok.bos_id] + text) == with_bos
    finally:
        tok.add_bos = False


def test_bos_and_eos_variables_and_helpers(tiny_vocab):
    _, tok = tiny_vocab
    source = (
        "{{ bos_token }}{% for m in messages %}{{ m['content'] | tojson }}{% endfor %}"
        "{{ eos_token }}{% if strftime_now('%Y') | length != 4 %}bad{% endif %}"
    )
    template = ChatTemplate.of({"tokenizer.chat_template": source}, tok, "t")
    out = template.render([{"role": "user", "content": "é"}])
    eos = tok.tokens[tok.eos_id]
    assert out == f'{tok.tokens[tok.bos_id]}"é"{eos}'


def test_no_template_is_none(tiny_vocab):
    _, tok = tiny_vocab
    assert ChatTemplate.of({}, tok) is None
    assert ChatTemplate.of({"tokenizer.chat_template": "  "}, tok) is None


@pytest.mark.parametrize(
    "source, error, text",
    [
        ("{% for %}", TokenizerError, "does not compile"),
        ("{{ messages.__class__.__mro__ }}", TokenizerError, "failed to render"),
        ("{{ messages.append(1) }}", TokenizerError, "failed to render"),
        ("{{ raise_exception('roles must alternate') }}", ParamsError, "roles must alternate"),
    ],
)
def test_template_errors_are_one_line(tiny_vocab, source, error, text):
    _, tok = tiny_vocab
    with pytest.raises(error, match=text) as info:
        ChatTemplate.of({"tokenizer.chat_template": source}, tok, "t").render(CONVERSATIONS[0])
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "messages, text",
    [
        ([], "non-empty list"),
        ("hi", "non-empty list"),
        ([["user", "hi"]], "not an object"),
        ([{"role": "wizard", "content": "hi"}], "role 'wizard'"),
        ([{"role": "user"}], "content must be text"),
        ([{"role": "user", "content": 3}], "content must be text"),
    ],
)
def test_bad_messages_are_params_errors(messages, text):
    with pytest.raises(ParamsError, match=text):
        check_messages(messages)


def test_text_parts_are_joined():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert check_messages([{"role": "user", "content": parts}])[0]["content"] == "ab"
