"""Shared fixtures: synthetic models and the Qwen2 vocabulary, built once and cached.

Models come from `sdq.synth.build.build_model` and live in the sdq cache ($SDQ_CACHE_DIR or
~/.cache/sdq), named by a content hash, so later sessions reuse them. Nothing here skips: if
llama-cpp-python (needed to quantize and as the reference) is missing, the fixtures fail with
a message saying so.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def llama_cpp():
    """The llama_cpp module (llama-cpp-python); a missing install fails the test loudly."""
    try:
        import llama_cpp as module
    except ImportError as exc:
        pytest.fail(f"llama-cpp-python is required for this test and is not installed: {exc}")
    return module


def _build(preset: str, qtype: str, seed: int = 0) -> Path:
    from sdq.synth.build import build_model

    return build_model(preset, qtype=qtype, seed=seed)


@pytest.fixture(scope="session")
def tiny_model_f16() -> Path:
    """The tiny synthetic qwen3moe model in F16, seed 0 (also the quantizer's input below)."""
    return _build("tiny", "F16")


@pytest.fixture(scope="session")
def tiny_model(llama_cpp, tiny_model_f16) -> Path:
    """The tiny model in Q4_K_M (Q4_K, Q5_K, Q6_K, Q8_0 tensors), seed 0."""
    return _build("tiny", "Q4_K_M")


@pytest.fixture(scope="session")
def tiny_model_q8(llama_cpp, tiny_model_f16) -> Path:
    """The same weights in Q8_0."""
    return _build("tiny", "Q8_0")


@pytest.fixture(scope="session")
def tiny_model_f32(llama_cpp) -> Path:
    """The same weights in F32 (norms and routers are F32 in every variant)."""
    return _build("tiny", "F32")


@pytest.fixture(scope="session")
def qwen2_vocab() -> Path:
    """llama.cpp's ggml-vocab-qwen2.gguf (tokenizer only, no tensors)."""
    from sdq.synth.vocab import qwen2_vocab_path

    return qwen2_vocab_path()


@pytest.fixture(scope="session")
def qwen2_test_vectors() -> list[tuple[str, list[int]]]:
    """llama.cpp's Qwen2 tokenizer test cases: (text, expected token ids)."""
    from sdq.synth.vocab import qwen2_vocab_test_vectors, read_test_vectors

    return read_test_vectors(*qwen2_vocab_test_vectors())
