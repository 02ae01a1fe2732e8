"""Synthetic qwen3moe and qwen35moe GGUF models for tests and the lab, quantized by llama.cpp.

    build.py    presets (tiny, mini, tiny35, seed, custom), SynthConfig, the GGUF writer, the
                model cache
    qwen35.py   what a qwen35moe model adds: delta-net and gated-attention blocks, shared expert
    glm4moe.py  glm4moe (GLM-4.5 layout): its config, presets, tensors and keys
    weights.py  deterministic weights whose router keeps token- and context-dependent routing
    vocab.py    the real Qwen2 vocabulary (llama.cpp's ggml-vocab-qwen2.gguf)

May import: sdq.format and the base modules (sdq.errors, sdq.dirs, sdq.files).
"""
