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
        ("{{ 1 / 0 }}", TokenizerError, "failed to render: ZeroDivisionError: division by zero"),
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", TokenizerError, "RecursionError"),
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


# --- word for word, and the helpers the template sees ------------------------------------------


class _Vocab:
    """What ChatTemplate.of and prompt_ids read of a Tokenizer."""

    tokens = ["<s>", "</s>", "a", "b"]

    def __init__(self, bos_id=0, eos_id=1, add_bos=True):
        self.bos_id, self.eos_id, self.add_bos = bos_id, eos_id, add_bos

    def encode(self, text, add_bos, special):
        assert (add_bos, special) == (False, True)  # the template wrote what it wanted
        return [{"<s>": 0, "a": 2, "b": 3}[t] for t in text.split()]


@pytest.mark.parametrize(
    "messages, text",
    [
        ([], "messages must be a non-empty list of {role, content} objects"),
        ((), "messages must be a non-empty list of {role, content} objects"),
        ([{"role": "user", "content": "hi"}, ["user", "hi"]], "message 1 is a list, not an object"),
        (
            [{"role": "wizard", "content": "hi"}],
            "message 0: role 'wizard' is not one of system, user, assistant, tool",
        ),  # fmt: skip
        (
            [{"role": "user", "content": [{"type": "image", "text": "x"}]}],
            "message 0: content must be text (or a list of text parts)",
        ),  # fmt: skip
        (
            [{"role": "user", "content": [{"type": "text", "text": 3}]}],
            "message 0: content must be text (or a list of text parts)",
        ),  # fmt: skip
        (
            [{"role": "user", "content": ["hi"]}],
            "message 0: content must be text (or a list of text parts)",
        ),  # fmt: skip
    ],
)
def test_bad_messages_word_for_word(messages, text):
    with pytest.raises(ParamsError) as err:
        check_messages(messages)
    assert str(err.value) == text


def test_checked_messages_are_plain_dicts_in_order():
    messages = ({"role": "system", "content": "s", "name": "x"}, {"role": "tool", "content": []})
    assert check_messages(messages) == [
        {"role": "system", "content": "s"},
        {"role": "tool", "content": ""},
    ]


def test_template_of_a_file_word_for_word():
    vocab = _Vocab(bos_id=None, eos_id=1)
    t = ChatTemplate.of({"tokenizer.chat_template": "{{ bos_token }}|{{ eos_token }}"}, vocab, "f")
    assert (t.bos_token, t.eos_token, t.where) == ("", "</s>", "f")
    assert t.render([{"role": "user", "content": "x"}]) == "|</s>"
    assert ChatTemplate.of({"tokenizer.chat_template": "x"}, _Vocab()).where == "model"
    with pytest.raises(TokenizerError) as err:
        ChatTemplate.of({"tokenizer.chat_template": 3}, vocab, "f.gguf")
    assert str(err.value) == "f.gguf: tokenizer.chat_template is a int, not text"
    with pytest.raises(TokenizerError) as err:
        ChatTemplate.of({"tokenizer.chat_template": "{% for %}"}, vocab, "f.gguf").render(
            [{"role": "user", "content": "x"}]
        )
    assert str(err.value).startswith("f.gguf: tokenizer.chat_template does not compile: ")
    with pytest.raises(TokenizerError) as err:
        ChatTemplate.of({"tokenizer.chat_template": "{{ 'a' + 1 }}"}, vocab, "f.gguf").render(
            [{"role": "user", "content": "x"}]
        )
    assert str(err.value) == (
        "f.gguf: tokenizer.chat_template failed to render: TypeError: can only concatenate str "
        '(not "int") to str'
    )
    with pytest.raises(ParamsError) as err:
        ChatTemplate.of(
            {"tokenizer.chat_template": "{{ raise_exception('no tools') }}"}, vocab
        ).render([{"role": "user", "content": "x"}])
    assert str(err.value) == "the chat template refuses these messages: no tools"


def test_generation_prompt_flag_and_helpers_reach_the_template():
    source = (
        "{{ messages | tojson }}{% if add_generation_prompt %}>{% endif %}"
        "{{ {'k': [1, 2]} | tojson(indent=1) }}{{ strftime_now('%Y') | length }}"
    )
    t = ChatTemplate.of({"tokenizer.chat_template": source}, _Vocab())
    messages = [{"role": "user", "content": "é"}]
    with_prompt = t.render(messages)
    assert with_prompt == '[{"role": "user", "content": "é"}]>{\n "k": [\n  1,\n  2\n ]\n}4'
    assert t.render(messages, add_generation_prompt=False) == with_prompt.replace(">", "", 1)


def test_prompt_ids_add_bos_only_when_asked_and_missing():
    assert prompt_ids(_Vocab(), "a b") == [0, 2, 3]
    assert prompt_ids(_Vocab(), "<s> a") == [0, 2]
    assert prompt_ids(_Vocab(), "") == [0]
    assert prompt_ids(_Vocab(add_bos=False), "a") == [2]
    assert prompt_ids(_Vocab(bos_id=None), "a") == [2]
