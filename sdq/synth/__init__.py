"""Synthetic qwen3moe GGUF models for tests and the lab, quantized by llama.cpp.

    build.py    presets (tiny, mini, custom), SynthConfig, the GGUF writer, the model cache
    weights.py  deterministic weights whose router keeps token- and context-dependent routing
    vocab.py    the real Qwen2 vocabulary (llama.cpp's ggml-vocab-qwen2.gguf)

May import: sdq.format and the base modules (sdq.errors, sdq.dirs, sdq.files).
"""
