"""Synthetic models: configs, determinism, the cache, the files' contents, and routing structure."""

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from sdq.errors import ParamsError, SdqError
from sdq.synth import build as synth
from sdq.synth.build import PRESETS, SynthConfig, build_model, resolve_config, synth_weights
from sdq.synth.weights import TOKEN_CLASSES, routing_preview, routing_stats, token_classes

# A small custom model for cache tests: one layer, tied embeddings (the vocabulary dominates).
SMALL = SynthConfig(
    name="small",
    n_embd=64,
    n_layer=1,
    n_expert=4,
    n_expert_used=2,
    expert_ffn=64,
    n_head=2,
    n_head_kv=1,
    head_dim=32,
    tied_embeddings=True,
)


@pytest.fixture
def private_cache(tmp_path, monkeypatch, qwen2_vocab):
    """A fresh SDQ_CACHE_DIR that shares the already fetched vocabulary."""
    root = tmp_path / "cache"
    root.mkdir()
    (root / "vocab").symlink_to(qwen2_vocab.parent, target_is_directory=True)
    monkeypatch.setenv("SDQ_CACHE_DIR", str(root))
    return root


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- configs ---------------------------------------------------------------------------------


def test_presets_are_valid_and_k_quant_ready():
    for cfg in PRESETS.values():
        assert cfg.validate() is cfg
        assert cfg.k_quant_ready, cfg.name


def test_mini_has_seed_like_expert_segments():
    from sdq.format.quants import row_bytes

    mini = PRESETS["mini"]
    gate = mini.expert_ffn * row_bytes(Q.Q4_K, mini.n_embd)
    assert gate == 589_824  # seed 000 §2: one Q4_K gate/up segment of an expert
    assert gate >= 256 * 1024
    # over 1 GB even at 4.5 bits per weight: routed experts plus token_embd and output
    n_weights = mini.n_layer * mini.n_expert * 3 * mini.expert_ffn * mini.n_embd
    n_weights += 2 * 151_936 * mini.n_embd
    assert n_weights * 4.5 / 8 > 1e9


@pytest.mark.parametrize(
    "change, message",
    [
        ({"n_expert_used": 9}, "experts used 9 > experts 8"),
        ({"n_head_kv": 3}, "n_head 4 is not a multiple of n_head_kv 3"),
        ({"n_embd": 100}, "n_embd = 100 must be a multiple of 32"),
        ({"route_rank": 65}, "route_rank 65 must be in"),
        ({"n_layer": 0}, "n_layer = 0 must be >= 1"),
    ],
)
def test_bad_configs_are_one_line_params_errors(change, message):
    with pytest.raises(ParamsError, match=message):
        resolve_config("tiny", **change)


def test_overrides_rename_the_config_and_unknown_names_fail():
    cfg = resolve_config("tiny", n_layer=3)
    assert (cfg.name, cfg.n_layer) == ("tiny-custom", 3)
    assert resolve_config("tiny", n_layer=2) is PRESETS["tiny"]
    with pytest.raises(ParamsError, match="unknown synthetic preset 'huge'"):
        resolve_config("huge")
    with pytest.raises(ParamsError, match="unknown qtype 'Q3_X'"):
        synth.model_path("tiny", "Q3_X")


def test_cache_name_depends_on_every_input():
    names = {
        synth.model_path("tiny", "Q4_K_M", 0),
        synth.model_path("tiny", "Q4_K_M", 1),
        synth.model_path("tiny", "Q8_0", 0),
        synth.model_path(resolve_config("tiny", zipf=0.1), "Q4_K_M", 0),
    }
    assert len(names) == 4
    assert synth.model_path("tiny", "q4_k_m", 0) == synth.model_path(PRESETS["tiny"], "Q4_K_M", 0)


# --- weights ---------------------------------------------------------------------------------


def test_weights_do_not_depend_on_draw_order():
    w = synth_weights(PRESETS["tiny"], 0)
    whole = w.embedding_rows(0, 200)
    assert np.array_equal(w.embedding_rows(37, 150), whole[37:150])
    ids = np.array([199, 3, 64, 3])
    assert np.array_equal(w.embedding_rows_for(ids), whole[ids])
    again = synth_weights(PRESETS["tiny"], 0)
    assert np.array_equal(again.router(1), w.router(1))
    assert not np.array_equal(synth_weights(PRESETS["tiny"], 1).router(1), w.router(1))


def test_values_are_float16_exact_and_sane():
    w = synth_weights(PRESETS["tiny"], 0)
    emb = w.embedding_rows(0, 4096)
    assert np.array_equal(emb, emb.astype(np.float16).astype(np.float32))
    rms = np.sqrt(np.mean(emb**2, axis=1))
    assert 0.8 < np.median(rms) < 1.2
    for part in ("gate", "up", "down"):
        chunk = w.expert(0, part, 0)
        assert np.isfinite(chunk).all() and 0 < np.abs(chunk).max() < 10


def test_token_classes_follow_the_text_of_tokens():
    toks = ["Ġthe", "ĠThe", "ing", "123", ".", "Ġ=", "_id", "ĠĠ", "ä½ł", "Ð¿", "âĢ", "<|im_start|>"]
    types = [1] * 11 + [3]
    got = [TOKEN_CLASSES[c] for c in token_classes(toks, types)]
    assert got == [
        "space_word",
        "space_capword",
        "word_piece",
        "number",
        "symbol",
        "symbol",
        "code",
        "whitespace",
        "cjk",
        "other_script",
        "bytes",
        "control",
    ]


def test_routing_is_token_dependent_skewed_and_reused(qwen2_test_vectors):
    """NumPy estimate on the embedding + context path, over llama.cpp's tokenizer test texts."""
    ids = [i for _, t in qwen2_test_vectors for i in t]
    for preset in ("tiny", "mini"):
        cfg = PRESETS[preset]
        w = synth_weights(cfg, 0)
        choices = routing_preview(w, ids)  # [T, L, K]
        stats = routing_stats(choices, cfg.n_expert)
        # experts are reused by neighbouring tokens well above chance ...
        assert stats["prev_overlap"] > 1.3 * stats["uniform_prev_overlap"], (preset, stats)
        assert stats["lru_hit_rate_half"] > 0.6, (preset, stats)
        assert stats["top_quarter_share"] > 0.35, (preset, stats)
        # ... but choice still depends on the token: many distinct expert sets, every expert used
        sets = {tuple(sorted(row)) for row in choices[:, 0].tolist()}
        assert len(sets) >= min(20, len(ids) // 10), preset
        assert (np.bincount(choices.ravel(), minlength=cfg.n_expert) > 0).all(), preset
        # uniform random routing, for contrast, has no such reuse
        rng = np.random.default_rng(0)
        uniform = np.stack(
            [
                np.stack([rng.permutation(cfg.n_expert)[: cfg.n_expert_used] for _ in ids])
                for _ in range(cfg.n_layer)
            ],
            axis=1,
        )
        base = routing_stats(uniform, cfg.n_expert)
        assert stats["lru_hit_rate_half"] > base["lru_hit_rate_half"] + 0.1, (preset, stats, base)


# --- building and the cache ----------------------------------------------------------------


def test_same_seed_same_bytes_other_seed_other_bytes(private_cache, llama_cpp):
    a = build_model(SMALL, "F16", seed=3)
    digest = _sha(a)
    a.unlink()
    assert _sha(build_model(SMALL, "F16", seed=3)) == digest
    assert _sha(build_model(SMALL, "F16", seed=4)) != digest
    # llama.cpp's quantizer is deterministic too: from the cached F16 or from a fresh source
    q = build_model(SMALL, "Q8_0", seed=3)
    digest = _sha(q)
    q.unlink()
    synth.model_path(SMALL, "F16", 3).unlink()
    assert _sha(build_model(SMALL, "Q8_0", seed=3)) == digest


def test_finished_file_is_reused_and_stale_temps_are_ignored(private_cache, monkeypatch):
    final = synth.model_path(SMALL, "F32", 0)
    dead_pid = 2**22 + 12345  # above the default pid_max: no such process
    stale = final.with_name(f".{final.name}.{dead_pid}.tmp")
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_bytes(b"GGUF half written")
    path = build_model(SMALL, "F32", 0)
    assert path == final and path.stat().st_size > 151_936 * 64 * 4
    assert not stale.exists()
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]

    def no_rebuild(*args, **kwargs):
        raise AssertionError("a finished model was built again")

    monkeypatch.setattr(synth, "_build", no_rebuild)
    assert build_model(SMALL, "F32", 0) == final


def test_interrupted_build_leaves_no_finished_file(private_cache, monkeypatch):
    real_write = synth.write_gguf

    def write_then_fail(cfg, seed, path, **kwargs):
        real_write(cfg, seed, path, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(synth, "write_gguf", write_then_fail)
    with pytest.raises(KeyboardInterrupt):
        build_model(SMALL, "F16", 0)
    final = synth.model_path(SMALL, "F16", 0)
    assert not final.exists()
    assert not [p for p in final.parent.iterdir() if p.name.endswith(".tmp")]
    monkeypatch.setattr(synth, "write_gguf", real_write)
    assert build_model(SMALL, "F16", 0) == final


def test_out_places_a_copy(private_cache, tmp_path):
    dest = tmp_path / "models" / "small.gguf"
    got = build_model(SMALL, "F16", 0, out=dest)
    assert got == dest and dest.read_bytes()[:4] == b"GGUF"
    assert os.path.samefile(dest, synth.model_path(SMALL, "F16", 0))


def test_missing_llama_cpp_is_an_error_not_a_skip(private_cache, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_llama(name, *args, **kwargs):
        if name == "llama_cpp":
            raise ImportError("No module named 'llama_cpp'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_llama)
    with pytest.raises(SdqError, match="llama-cpp-python is not installed"):
        build_model(SMALL, "Q8_0", 0)
    final = synth.model_path(SMALL, "Q8_0", 0)
    assert not [
        p
        for p in final.parent.iterdir()
        if p.name.startswith(f".{final.name}.") and p.name.endswith(".tmp")
    ]


def test_cli_prints_path_and_sizes(private_cache, capsys):
    import json

    from sdq.cli import main

    argv = ["synth", "--n-embd", "64", "--layers", "1", "--experts", "4", "--experts-used", "2"]
    argv += ["--expert-ffn", "64", "--heads", "2", "--kv-heads", "1", "--head-dim", "32"]
    argv += ["--tied", "--qtype", "F16", "--seed", "5", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert Path(out["path"]).is_file() and out["bytes"] == Path(out["path"]).stat().st_size
    assert out["config"]["n_layer"] == 1 and out["preset"] == "tiny-custom"
    assert out["expert_segment_bytes"] == {"gate": 64 * 64 * 2, "up": 64 * 64 * 2, "down": 8192}
    assert main(["synth", "--preset", "nope"]) == 2
    assert "unknown synthetic preset 'nope'" in capsys.readouterr().err


# --- the files llama.cpp reads ---------------------------------------------------------------


def test_q4_k_m_holds_k_quants_and_only_types_sdq_computes(tiny_model):
    from sdq.format.model import open_model
    from sdq.format.quants import SUPPORTED_COMPUTE

    m = open_model(tiny_model)
    types = {name: t.qtype for name, t in m.tensors.items()}
    assert Q.Q4_K in types.values() and Q.Q6_K in types.values()
    assert set(types.values()) <= SUPPORTED_COMPUTE
    assert types["blk.0.ffn_gate_exps.weight"] == Q.Q4_K
    assert types["blk.0.ffn_gate_inp.weight"] == Q.F32
    assert types["blk.0.attn_norm.weight"] == Q.F32


def test_spec_matches_the_config(tiny_model, tiny_model_q8, tiny_model_f32):
    from sdq.format.model import open_model

    cfg = PRESETS["tiny"]
    for path in (tiny_model, tiny_model_q8, tiny_model_f32):
        spec = open_model(path).spec
        assert spec.arch == "qwen3moe"
        got = (spec.n_layer, spec.n_embd, spec.n_head, spec.n_head_kv, spec.head_dim)
        assert got == (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim)
        assert (spec.n_expert, spec.n_expert_used, spec.expert_ffn) == (8, 2, 256)
        assert spec.n_vocab == 151_936 and not spec.tied_embeddings
        assert open_model(path).metadata["sdq.synth.seed"] == 0


def test_f32_file_holds_the_generated_weights(tiny_model_f32):
    from sdq.format.model import open_model

    m = open_model(tiny_model_f32)
    w = synth_weights(PRESETS["tiny"], 0)
    assert np.array_equal(m.tensor_data("token_embd.weight")[:100], w.embedding_rows(0, 100))
    assert np.array_equal(m.tensor_data("blk.1.ffn_gate_inp.weight"), w.router(1))
    down = m.tensor_data("blk.0.ffn_down_exps.weight")  # [E, D, F]
    assert np.array_equal(down[0], w.expert(0, "down", 0))
    assert np.array_equal(down[5], w.expert(0, "down", 5))


def _logits(path: Path, text: str) -> np.ndarray:
    from sdq.measure.llama_ref import open_llama  # refuses an AMX build (SIGILL here)

    llm = open_llama(path, n_ctx=64, n_ubatch=64, threads=2, logits_all=True)
    tokens = llm.tokenize(text.encode(), add_bos=False)
    llm.eval(tokens)
    logits = np.array(llm.scores[: len(tokens)], dtype=np.float64)  # [T, V]
    llm.close()
    return logits


PROMPT = "The quick brown fox jumps over the lazy dog, then 12 more foxes follow."


def test_llama_cpp_runs_every_variant_with_sane_logits(
    llama_cpp, tiny_model, tiny_model_q8, tiny_model_f32
):
    ref = _logits(tiny_model_f32, PROMPT)
    assert np.isfinite(ref).all()
    spread = ref.std(axis=1)
    assert (spread > 1.0).all() and (spread < 10).all(), spread
    # next-token distributions change with the input and are not one-hot
    greedy = ref.argmax(axis=1)
    assert len(set(greedy.tolist())) > len(greedy) // 2
    p_top = 1 / np.exp(ref - ref.max(axis=1, keepdims=True)).sum(axis=1)
    assert (p_top < 0.9).all(), p_top
    for path, min_corr in ((tiny_model_q8, 0.999), (tiny_model, 0.95)):
        got = _logits(path, PROMPT)
        assert got.shape == ref.shape and np.isfinite(got).all()
        corr = min(np.corrcoef(a, b)[0, 1] for a, b in zip(got, ref, strict=True))
        assert corr > min_corr, (path.name, corr)
