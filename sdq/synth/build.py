"""Synthetic qwen3moe and qwen35moe GGUF models that llama.cpp loads and runs: stand-ins for
real weights.

    from sdq.synth.build import build_model, SynthConfig, PRESETS
    path = build_model("tiny", qtype="Q4_K_M", seed=0)

A model is written with `gguf.GGUFWriter` (F16, or F32 when asked for F32; norms and routers
always F32, as llama.cpp's converter keeps them), with the real Qwen2 tokenizer (`sdq.synth.vocab`),
and then, for Q8_0 / Q4_K_M / Q4_0 ..., quantized by llama.cpp's own quantizer
(`llama_cpp.llama_model_quantize`), so the quantized files have exactly the tensor types and
layouts llama.cpp produces for real models. The weights and the routing construction are in
`sdq.synth.weights`.

Presets: `tiny` for tests: every matrix row length a multiple of 256, so llama.cpp never falls
back to a 32-block type and Q4_K_M holds Q4_K, Q5_K and Q6_K tensors (plus Q8_0 attn_k/attn_v,
llama.cpp's choice for 8-expert models); about 62 MB in Q4_K_M, mostly the 151,936-token
vocabulary's embedding and output matrices. `mini` for `make reproduce`: seed-like expert
segments (n_embd 2048, expert FFN 512, so one Q4_K gate/up segment is 589,824 B), 64 experts,
top-8, 8 layers; about 1.5 GB in Q4_K_M. qwen35moe (`arch`, sdq.synth.qwen35): `tiny35` for tests
(66 MB in Q4_K_M), `seed` shaped like Qwen3.6-35B-A3B (n_embd 2048, 256 experts top-8, expert
FFN 512, one shared expert, delta-net blocks with 16 key / 32 value heads of 128, full attention
with 16 query / 2 KV heads of 256) at depth 4: 3 delta-net blocks and 1 full-attention block.
llama with experts (Mixtral) and granitemoe (sdq.synth.llama_moe), tiny's shapes: `tiny-mixtral`
(8 experts top-2), `tiny-mixtral-legacy` (the same file split into one tensor per expert),
`tiny-granitemoe` (16 experts top-4, tied embeddings, granite scales).

Files are cached under `<cache>/models/` (`sdq.dirs`) by a content hash of (config, qtype,
seed, SYNTH_FORMAT_VERSION, vocabulary hash, llama-cpp-python version). A model is written to a
temporary name in that folder and renamed only when complete, so a file with the final name is
always finished; leftovers of interrupted builds are ignored and removed once their process is
gone. Concurrent builds of one model wait for each other (file lock).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from sdq.dirs import cache_subdir
from sdq.errors import ParamsError, SdqError
from sdq.synth.config import (  # noqa: F401  (re-exported: sdq.synth.build is the entry point)
    _VOCAB_CACHE,
    ARCH,
    ARCHES,
    K_QUANT_BLOCK,
    LLAMA_MOE_ARCHES,
    LLAMA_MOE_FIELDS,
    QTYPES,
    QWEN35_FIELDS,
    ROUTERS,
    STANDARD_MOE_ARCHES,
    SYNTH_FORMAT_VERSION,
    SynthConfig,
    _n_vocab,
    _vocab,
)

PRESETS: dict[str, SynthConfig] = {
    "tiny": SynthConfig(name="tiny"),
    "mini": SynthConfig(
        name="mini",
        n_embd=2048,
        n_layer=8,
        n_expert=64,
        n_expert_used=8,
        expert_ffn=512,
        n_head=32,
        n_head_kv=4,
        head_dim=128,
        route_rank=16,
    ),
    # qwen35moe: head counts that are not powers of two (12 query / 3 KV heads, delta-net 3 key
    # / 6 value heads) with every matrix row a multiple of 256, so Q4_K_M needs no fallback
    # types; 3 delta-net blocks and 1 full-attention block
    "tiny35": SynthConfig(
        name="tiny35",
        arch="qwen35moe",
        n_layer=4,
        n_head=12,
        n_head_kv=3,
        head_dim=64,
        rope_dim=32,
        rope_sections=(6, 5, 5, 0),
        ssm_state=128,
        ssm_k_heads=3,
        ssm_v_heads=6,
        shared_ffn=256,
        route_rank=8,
    ),
    # shaped like Qwen3.6-35B-A3B at depth 4 (3 delta-net blocks, 1 full-attention block); its
    # Q4_K_M has the seed's expert segments: gate/up Q4_K (589,824 B), down Q5_K (720,896 B).
    # Routing: the calibrated router (seed-random: the random one)
    "seed": SynthConfig(
        name="seed",
        arch="qwen35moe",
        n_embd=2048,
        n_layer=4,
        n_expert=256,
        n_expert_used=8,
        expert_ffn=512,
        n_head=16,
        n_head_kv=2,
        head_dim=256,
        route_rank=16,
        tensor_types=(("ffn_down_exps", "Q5_K"),),
        **ROUTERS["calibrated"],
    ),
    # the seed's model at its full depth, 40 blocks (30 delta-net, 10 full attention): 10,240
    # routed experts, 19.5 GB of them written directly as random Q4_K / Q5_K blocks
    # (sdq.synth.direct_experts) rather than quantized from floats
    "seed-full": SynthConfig(
        name="seed-full",
        arch="qwen35moe",
        n_embd=2048,
        n_layer=40,
        n_expert=256,
        n_expert_used=8,
        expert_ffn=512,
        n_head=16,
        n_head_kv=2,
        head_dim=256,
        route_rank=16,
        tensor_types=(("ffn_down_exps", "Q5_K"),),
        direct_experts=True,
        **ROUTERS["calibrated"],
    ),
    # qwen2moe: q/k/v biases, a shared expert (FFN 512) beside 16 routed experts top-4, no
    # renormalised top-K weights; H * Dh = n_embd (llama.cpp's attn_q and attn_output shapes)
    "tiny-qwen2moe": SynthConfig(
        name="tiny-qwen2moe",
        arch="qwen2moe",
        n_layer=3,
        n_expert=16,
        n_expert_used=4,
        shared_ffn=512,
    ),
    # olmoe: RMS norms over the whole q and k projections, 16 experts top-4, no GQA (llama.cpp
    # makes its k norm [n_embd])
    "tiny-olmoe": SynthConfig(
        name="tiny-olmoe",
        arch="olmoe",
        n_layer=3,
        n_expert=16,
        n_expert_used=4,
        n_head_kv=4,
    ),
    # llama with experts (Mixtral): 8 experts top-2, normal RoPE, no Q/K norms
    "tiny-mixtral": SynthConfig(name="tiny-mixtral", arch="llama"),
    # the same model with one tensor per expert and part, as early Mixtral GGUF files
    "tiny-mixtral-legacy": SynthConfig(
        name="tiny-mixtral-legacy", arch="llama", legacy_experts=True
    ),
    # granitemoe: 16 experts top-4, tied embeddings, every granite scale away from 1
    "tiny-granitemoe": SynthConfig(
        name="tiny-granitemoe",
        arch="granitemoe",
        n_expert=16,
        n_expert_used=4,
        tied_embeddings=True,
        embedding_scale=2.0,
        residual_scale=0.5,
        attention_scale=0.09,
        logit_scale=2.0,
        logit_std=6.0,
    ),
}


# presets defined beside their architecture's writer
from sdq.synth import deepseek2, glm4moe, gpt_oss  # noqa: E402

for _family in (deepseek2, glm4moe, gpt_oss):
    PRESETS.update(_family.PRESETS)


def resolve_config(
    config: str | SynthConfig, router: str | None = None, **overrides
) -> SynthConfig:
    """A preset name or a config, with a named router (ROUTERS) and field overrides. The name
    becomes `<preset>-<router>` when only the router changes, else `<preset>-custom`."""
    if isinstance(config, str):
        if config not in PRESETS:
            raise ParamsError(f"unknown synthetic preset {config!r} (known: {', '.join(PRESETS)})")
        config = PRESETS[config]
    if router is not None:
        if router not in ROUTERS:
            raise ParamsError(f"unknown router {router!r} (known: {', '.join(ROUTERS)})")
        knobs = {k: v for k, v in ROUTERS[router].items() if getattr(config, k) != v}
        if knobs and not config.name.endswith("custom"):
            knobs["name"] = f"{config.name}-{router}"
        config = dataclasses.replace(config, **knobs)
    changes = {k: v for k, v in overrides.items() if v is not None and getattr(config, k) != v}
    if changes:
        name = changes.pop("name", None) or (
            config.name if config.name.endswith("custom") else f"{config.name}-custom"
        )
        config = dataclasses.replace(config, name=name, **changes)
    return config.validate()


def _check_qtype(qtype: str) -> str:
    q = qtype.upper()
    if q not in QTYPES:
        raise ParamsError(f"unknown qtype {qtype!r} (known: {', '.join(QTYPES)})")
    return q


def _llama_cpp():
    """The llama_cpp module; a missing one is an error, never a silent skip."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise SdqError(
            f"quantizing needs llama.cpp's quantizer, and llama-cpp-python is not installed "
            f"({exc}): pip install 'sdq[reference]' (make setup builds it), or --qtype F16/F32"
        ) from None
    return llama_cpp


def content_hash(config: SynthConfig, qtype: str, seed: int) -> str:
    """Hex digest naming a model: everything that determines its bytes."""
    from sdq.synth.vocab import LLAMA_CPP_PYTHON_VERSION, QWEN2_FILES, QWEN2_VOCAB

    key = {
        "format": SYNTH_FORMAT_VERSION,
        "config": config.params(),
        "qtype": _check_qtype(qtype),
        "seed": int(seed),
        "vocab_sha256": QWEN2_FILES[QWEN2_VOCAB],
        # the quantizer's output can change between llama.cpp releases
        "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION if qtype not in ("F32", "F16") else None,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def model_path(config: str | SynthConfig, qtype: str = "Q4_K_M", seed: int = 0) -> Path:
    """Where the cached model for these parameters lives (whether built or not)."""
    cfg = resolve_config(config)
    q = _check_qtype(qtype)
    digest = content_hash(cfg, q, seed)[:12]
    return cache_subdir("models") / f"sdq-synth-{cfg.name}-{q}-seed{seed}-{digest}.gguf"


def build_model(
    config: str | SynthConfig = "tiny",
    qtype: str = "Q4_K_M",
    seed: int = 0,
    *,
    out: str | os.PathLike | None = None,
    progress: bool = False,
    nthread: int = 0,
) -> Path:
    """Build (or reuse) a synthetic model; returns the path of a finished .gguf file.

    With `out`, the cached file is also copied (hard-linked where possible) to that path.
    """
    cfg = resolve_config(config)
    q = _check_qtype(qtype)
    seed = int(seed)
    if seed < 0:
        raise ParamsError(f"seed {seed} must be >= 0")
    final = model_path(cfg, q, seed)
    if not final.is_file():
        with open(final.with_name(f".{final.name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not final.is_file():  # another process may have finished it meanwhile
                _remove_stale_temps(final)
                _build(cfg, q, seed, final, progress=progress, nthread=nthread)
    if out is not None:
        return _place_copy(final, Path(out))
    return final


def _build(cfg: SynthConfig, q: str, seed: int, final: Path, *, progress: bool, nthread: int):
    pid = os.getpid()
    tmp = final.with_name(f".{final.name}.{pid}.tmp")
    source = final.with_name(f".{final.name}.{pid}.src.tmp")
    try:
        if cfg.legacy_experts:
            from sdq.synth import llama_moe

            merged = build_model(llama_moe.merged_config(cfg), q, seed, nthread=nthread)
            llama_moe.split_experts(merged, tmp)
        elif cfg.direct_experts:
            _build_direct(cfg, q, seed, tmp, source, progress=progress, nthread=nthread)
        elif q in ("F32", "F16"):
            write_gguf(cfg, seed, tmp, dtype=q, progress=progress, threads=nthread)
        else:
            _llama_cpp()  # fail before spending minutes on the F16 source
            cached_f16 = model_path(cfg, "F16", seed)
            if cached_f16.is_file():  # the F16 model is exactly the quantizer's input
                quantize(cached_f16, tmp, q, progress=progress, nthread=nthread, cfg=cfg)
            else:
                write_gguf(cfg, seed, source, dtype="F16", progress=progress, threads=nthread)
                quantize(source, tmp, q, progress=progress, nthread=nthread, cfg=cfg)
                source.unlink()
        os.replace(tmp, final)
    finally:
        for path in (tmp, source):
            path.unlink(missing_ok=True)


def _build_direct(cfg, q: str, seed: int, tmp: Path, source: Path, *, progress, nthread) -> None:
    """A model whose routed experts are written as quantized blocks (sdq.synth.direct_experts):
    the F16 source holds one expert per routed tensor (so llama.cpp's quantizer sees every
    tensor name it would in the full file and picks the same types for the dense ones), the
    quantizer makes the dense file, and the experts are drawn into the final file after it."""
    from sdq.synth import direct_experts

    for part in direct_experts.PARTS:  # refuse an unsupported type before minutes of work
        direct_experts.expert_bytes(cfg, direct_experts.expert_type(cfg, q, part), part)
    dense = tmp.with_name(tmp.name[: -len(".tmp")] + ".dense.tmp")
    try:
        write_gguf(cfg, seed, source, dtype="F16", progress=progress, threads=nthread)
        quantize(source, dense, q, progress=progress, nthread=nthread, cfg=cfg)
        source.unlink()
        direct_experts.assemble(cfg, seed, q, dense, tmp, progress=progress)
    finally:
        dense.unlink(missing_ok=True)


def _remove_stale_temps(final: Path) -> None:
    """Delete temporary files of this model left by processes that no longer run."""
    for path in final.parent.glob(f".{final.name}.*.tmp"):
        try:
            pid = int(path.name[len(final.name) + 2 :].split(".")[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _alive(pid):
            path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _place_copy(src: Path, dst: Path) -> Path:
    if dst.is_dir():
        dst = dst / src.name
    if dst.exists() and dst.samefile(src):
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    try:
        try:
            os.link(src, tmp)
        except OSError:
            import shutil

            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return dst


# --- writing --------------------------------------------------------------------------------


def tensor_plan(cfg: SynthConfig, dtype: str) -> list[tuple[str, tuple[int, ...], type]]:
    """(name, NumPy shape, dtype) of every tensor, in file order."""
    D, F, E, V = cfg.n_embd, cfg.expert_ffn, cfg.n_expert, _n_vocab()
    H, Hkv, Dh = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    big = np.float16 if dtype == "F16" else np.float32
    plan = [("token_embd.weight", (V, D), big)]
    if cfg.arch == "qwen35moe":
        from sdq.synth import qwen35

        for i in range(cfg.n_layer):
            plan += qwen35.block_plan(cfg, i, big)
    if cfg.arch in LLAMA_MOE_ARCHES:
        from sdq.synth import llama_moe

        for i in range(cfg.n_layer):
            plan += llama_moe.block_plan(cfg, i, big)
    if cfg.arch in STANDARD_MOE_ARCHES:
        from sdq.synth import standard_moe

        for i in range(cfg.n_layer):
            plan += standard_moe.block_plan(cfg, i, big)
    if cfg.arch == "deepseek2":
        from sdq.synth import deepseek2

        for i in range(cfg.n_layer):
            plan += deepseek2.block_plan(cfg, i, big)
    if cfg.arch == "gpt-oss":
        from sdq.synth import gpt_oss

        for i in range(cfg.n_layer):
            plan += gpt_oss.block_plan(cfg, i, big)
    if cfg.arch == "glm4moe":
        from sdq.synth import glm4moe

        for i in range(cfg.n_layer + cfg.n_nextn):  # the decoder blocks, then the MTP blocks
            plan += glm4moe.block_plan(cfg, i, big)
    for i in range(cfg.n_layer if cfg.arch == ARCH else 0):
        b = f"blk.{i}."
        plan += [
            (b + "attn_norm.weight", (D,), np.float32),
            (b + "attn_q.weight", (H * Dh, D), big),
            (b + "attn_k.weight", (Hkv * Dh, D), big),
            (b + "attn_v.weight", (Hkv * Dh, D), big),
            (b + "attn_output.weight", (D, H * Dh), big),
            (b + "attn_q_norm.weight", (Dh,), np.float32),
            (b + "attn_k_norm.weight", (Dh,), np.float32),
            (b + "ffn_norm.weight", (D,), np.float32),
            (b + "ffn_gate_inp.weight", (E, D), np.float32),
            (b + "ffn_gate_exps.weight", (E, F, D), big),
            (b + "ffn_up_exps.weight", (E, F, D), big),
            (b + "ffn_down_exps.weight", (E, D, F), big),
        ]
    plan.append(("output_norm.weight", (D,), np.float32))
    if not cfg.tied_embeddings:
        plan.append(("output.weight", (V, D), big))
    if cfg.direct_experts:  # one placeholder expert each: sdq.synth.direct_experts writes them
        from sdq.synth.direct_experts import is_routed_expert

        plan = [(n, (1, *s[1:]) if is_routed_expert(n) else s, d) for n, s, d in plan]
    return plan


def synth_weights(cfg: SynthConfig, seed: int):
    """The weight generator for (config, seed): also used by tests and routing previews."""
    from sdq.synth.weights import SynthWeights

    if "classes" not in _VOCAB_CACHE:
        _VOCAB_CACHE["classes"] = _token_classes(_vocab())
    return SynthWeights(cfg, int(seed), _VOCAB_CACHE["classes"])


def _token_classes(vocab) -> np.ndarray:
    """[V] token classes, computed once per vocabulary and kept beside it in the cache."""
    from sdq.synth.vocab import vocab_dir
    from sdq.synth.weights import CLASSES_VERSION, token_classes

    path = vocab_dir() / f"token-classes-{vocab.sha256[:12]}-v{CLASSES_VERSION}.npy"
    if path.is_file():
        classes = np.load(path)
        if classes.shape == (vocab.n_vocab,):
            return classes
    classes = token_classes(vocab.tokens, vocab.token_types)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            np.save(f, classes)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return classes


def write_gguf(
    cfg: SynthConfig, seed: int, path: Path, *, dtype="F16", progress=False, threads: int = 0
) -> None:
    """Write the model in F16 or F32 (norms and routers always F32) to `path`."""
    import gguf
    from tqdm import tqdm

    vocab = _vocab()
    w = synth_weights(cfg, seed)
    _ = w.basis, w.subgroup, w.centroids  # shared structure, made before the threads start
    writer = gguf.GGUFWriter(str(path), cfg.arch)
    _add_metadata(writer, cfg, seed, vocab, dtype)
    plan = tensor_plan(cfg, dtype)
    for name, shape, dt in plan:
        nbytes = int(np.prod(shape)) * np.dtype(dt).itemsize
        writer.add_tensor_info(name, shape, np.dtype(dt), nbytes)
    writer.write_header_to_file(Path(path))
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    total = sum(int(np.prod(s)) * np.dtype(d).itemsize for _, s, d in plan)
    label = f"{cfg.name} {dtype}"
    bar = tqdm(total=total, unit="B", unit_scale=True, desc=label, disable=not progress)
    with bar, ThreadPoolExecutor(max(1, threads or os.cpu_count() or 1)) as pool:
        for name, shape, dt in plan:
            arr = _make_tensor(w, name, shape, dt, pool)
            writer.write_tensor_data(arr)
            bar.update(arr.nbytes)
    writer.close()


def _make_tensor(w, name: str, shape: tuple[int, ...], dt, pool) -> np.ndarray:
    out = np.empty(shape, dt)  # filled in parallel slices: the draws release the GIL
    module = cfg_arch_module(w.cfg)
    if module is not None:
        values = module.make_tensor(w, name, shape)
        if values is not None:
            out[...] = values
            return out
    if name in ("token_embd.weight", "output.weight"):
        rows = w.embedding_rows if name == "token_embd.weight" else w.output_rows
        step = 8192

        def fill_rows(r0: int) -> None:
            out[r0 : r0 + step] = rows(r0, min(r0 + step, shape[0]))

        list(pool.map(fill_rows, range(0, shape[0], step)))
        return out
    if name.endswith("norm.weight"):
        out[...] = 1.0
        return out
    layer = int(name.split(".")[1])
    kind = name.split(".")[2]
    if kind == "ffn_gate_inp":
        out[...] = w.router(layer)
    elif kind.startswith("attn_"):
        out[...] = w.attention(layer)[kind]
    else:  # ffn_{gate,up,down}_exps, one expert per task
        part = kind[len("ffn_") : -len("_exps")]

        def fill_expert(e: int) -> None:
            out[e] = w.expert(layer, part, e)

        list(pool.map(fill_expert, range(shape[0])))
    return out


def cfg_arch_module(cfg):
    """The module with an architecture's own tensors and keys (None for qwen3moe)."""
    if cfg.arch == "deepseek2":
        from sdq.synth import deepseek2

        return deepseek2
    if cfg.arch == "qwen35moe":
        from sdq.synth import qwen35

        return qwen35
    if cfg.arch in LLAMA_MOE_ARCHES:
        from sdq.synth import llama_moe

        return llama_moe
    if cfg.arch in STANDARD_MOE_ARCHES:
        from sdq.synth import standard_moe

        return standard_moe
    if cfg.arch == "glm4moe":
        from sdq.synth import glm4moe

        return glm4moe
    if cfg.arch == "gpt-oss":
        from sdq.synth import gpt_oss

        return gpt_oss
    return None


def _add_metadata(writer, cfg: SynthConfig, seed: int, vocab, dtype: str) -> None:
    writer.add_name(f"sdq synthetic {cfg.name}")
    writer.add_file_type(QTYPES[dtype])
    writer.add_context_length(cfg.n_ctx_train)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_block_count(cfg.n_layer + getattr(cfg, "n_nextn", 0))  # MTP blocks (glm4moe)
    # llama and granitemoe size their expert tensors by feed_forward_length
    ffn = cfg.expert_ffn if cfg.arch in LLAMA_MOE_ARCHES else cfg.expert_ffn * cfg.n_expert_used
    if cfg.arch in STANDARD_MOE_ARCHES:
        from sdq.synth import standard_moe

        ffn = standard_moe.feed_forward_length(cfg)
    if cfg.arch == "glm4moe":  # the dense blocks' FFN
        ffn = cfg.dense_ffn
    writer.add_feed_forward_length(ffn)
    if cfg.arch != "olmoe":  # olmoe files size their experts by feed_forward_length only
        writer.add_expert_feed_forward_length(cfg.expert_ffn)
    writer.add_head_count(cfg.n_head)
    writer.add_head_count_kv(cfg.n_head_kv)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    partial_rope = cfg.arch in ("qwen35moe", "glm4moe")
    writer.add_rope_dimension_count(cfg.rope_dim if partial_rope else cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope_base)
    writer.add_layer_norm_rms_eps(cfg.rms_eps)
    writer.add_expert_count(cfg.n_expert)
    writer.add_expert_used_count(cfg.n_expert_used)
    module = cfg_arch_module(cfg)
    if module is not None:
        module.add_metadata(writer, cfg)
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(vocab.bos_id)
    writer.add_eos_token_id(vocab.eos_id)
    writer.add_pad_token_id(vocab.pad_id)
    writer.add_add_bos_token(False)
    if vocab.chat_template:
        writer.add_chat_template(vocab.chat_template)
    # provenance: survives quantization (llama.cpp copies all metadata)
    writer.add_uint32("sdq.synth.format_version", SYNTH_FORMAT_VERSION)
    writer.add_uint64("sdq.synth.seed", seed)
    writer.add_string("sdq.synth.config", json.dumps(cfg.params(), sort_keys=True))
    writer.add_string("sdq.synth.vocab_sha256", vocab.sha256)


# --- quantizing -----------------------------------------------------------------------------


def quantize(
    src: Path,
    dst: Path,
    qtype: str,
    *,
    progress: bool = False,
    nthread: int = 0,
    cfg: SynthConfig | None = None,
):
    """Quantize a F16/F32 GGUF with llama.cpp's quantizer (`llama_model_quantize`), with the
    config's per-tensor type overrides (`tensor_types`) if any."""
    llama_cpp = _llama_cpp()
    from gguf.constants import GGMLQuantizationType
    from tqdm import tqdm

    q = _check_qtype(qtype)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = QTYPES[q]
    params.nthread = nthread if nthread > 0 else (os.cpu_count() or 1)
    overrides = cfg.tensor_types if cfg is not None else ()
    if overrides:  # a C array ended by a null pattern; kept alive until the call returns
        entries = (llama_cpp.llama_model_tensor_override * (len(overrides) + 1))()
        patterns = [p.encode() for p, _ in overrides]
        for entry, pattern, (_, type_name) in zip(entries, patterns, overrides, strict=False):
            entry.pattern = pattern
            entry.type = GGMLQuantizationType[type_name].value
        params.tt_overrides = entries
    result: dict[str, int] = {}

    def work() -> None:
        with _quiet_llama_log(llama_cpp):
            result["rc"] = llama_cpp.llama_model_quantize(
                str(src).encode(), str(dst).encode(), params
            )

    thread = threading.Thread(target=work, name="llama-quantize", daemon=True)  # Ctrl-C exits
    thread.start()
    # The quantizer is one C call; show its progress as the bytes it has written so far.
    with tqdm(unit="B", unit_scale=True, desc=f"quantize {q}", disable=not progress) as bar:
        while thread.is_alive():
            thread.join(0.5)
            size = dst.stat().st_size if dst.exists() else 0
            bar.update(size - bar.n)
    if result.get("rc") != 0:
        raise SdqError(f"llama.cpp could not quantize {src.name} to {q} (code {result.get('rc')})")


class _quiet_llama_log:
    """Only errors from llama.cpp's log while quantizing (it prints a line per tensor)."""

    def __init__(self, llama_cpp):
        from llama_cpp import _logger

        self.logger = _logger.logger

    def __enter__(self):
        self.level = self.logger.level
        self.logger.setLevel(logging.ERROR)
        return self

    def __exit__(self, *exc):
        self.logger.setLevel(self.level)
        return False
