"""What a synthetic model is: its architecture, shapes and quantization (SynthConfig), the
quantizer types sdq.synth.build accepts, and the vocabulary every synthetic model uses. The
writers of each architecture (sdq.synth.qwen35, llama_moe, standard_moe, glm4moe, deepseek2,
gpt_oss) build on this module; sdq.synth.build assembles the presets and writes the files."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sdq.errors import ParamsError

SYNTH_FORMAT_VERSION = 2  # bump whenever the bytes of a model change
ARCH = "qwen3moe"
ARCHES = (ARCH, "qwen35moe", "llama", "granitemoe", "qwen2moe", "olmoe", "glm4moe", "deepseek2")
ARCHES += ("gpt-oss",)  # sdq.synth.gpt_oss
STANDARD_MOE_ARCHES = ("qwen2moe", "olmoe")  # sdq.synth.standard_moe
LLAMA_MOE_ARCHES = ("llama", "granitemoe")  # sdq.synth.llama_moe
K_QUANT_BLOCK = 256

# Named routers: the routing knobs of SynthConfig each one sets (`resolve_config(..., router=)`,
# `sdq synth --router`). `random` routes each token mostly by itself: a full-attention block adds
# a little of the context's mean, so a 48-token decode has little temporal locality.
# `calibrated` (qwen35moe) makes the delta-net blocks carry a moving average of the routing
# coordinates (less their vocabulary mean) and weights that context more than the token, so
# routing drifts slowly as a trained model's does, with a stronger per-layer popularity skew.
# Its values come from notebook 02's calibration search against the seed's routing statistics
# (sdq.analysis.locality.TARGETS).
ROUTERS = {
    "random": {"context_mix": 0.15, "context_ema": 0.0, "zipf": 0.5},
    "calibrated": {"context_mix": 2.5, "context_ema": 0.15, "zipf": 1.25},
}

# qtype name -> llama_ftype number (llama.h); F32 and F16 are written directly.
QTYPES = {
    "F32": 0,
    "F16": 1,
    "Q4_0": 2,
    "Q8_0": 7,
    "Q4_K_S": 14,
    "Q4_K_M": 15,
    "Q5_K_M": 17,
    "Q6_K": 18,
    "MXFP4_MOE": 38,  # experts MXFP4, other matrices Q8_0 (gpt-oss)
}


@dataclass(frozen=True)
class SynthConfig:
    """Dimensions of a synthetic qwen3moe model and the knobs of its routing construction."""

    name: str = "custom"
    n_embd: int = 256
    n_layer: int = 2
    n_expert: int = 8
    n_expert_used: int = 2
    expert_ffn: int = 256
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_ctx_train: int = 4096
    tied_embeddings: bool = False
    rope_base: float = 1_000_000.0
    rms_eps: float = 1e-6
    # routing construction (sdq.synth.weights)
    route_rank: int = 8  # r: dimensions of the routing subspace
    token_subgroups: int = 4  # hash subgroups per token class
    route_std: float = 2.0  # spread of the token-dependent router logits
    zipf: float = 0.5  # expert popularity bias: -zipf * ln(rank)
    router_noise: float = 1.0  # spread of the full-rank (per-token noise) router logits
    context_mix: float = 0.15  # gain of the attention context term inside the routing subspace
    # qwen35moe: rate of the moving average of the routing subspace its delta-net blocks carry
    # (sdq.synth.qwen35); 0: Gaussian delta-net blocks that carry none. Left out of params()
    # when 0, so the models made before it keep their names
    context_ema: float = 0.0
    attn_noise: float = 0.5  # full-rank part of V and O
    moe_gain: float = 1.0  # scale of expert down projections
    logit_std: float = 3.0  # spread of the output logits
    # qwen35moe only (sdq.synth.qwen35); left out of params() for qwen3moe, whose cached
    # models keep their names
    arch: str = ARCH
    full_attention_interval: int = 4  # every 4th block full attention, the others delta-net
    ssm_conv_kernel: int = 4
    ssm_state: int = 128  # delta-net key and value head dim
    ssm_k_heads: int = 16
    ssm_v_heads: int = 32
    shared_ffn: int = 512
    rope_dim: int = 64  # rotated dims of each head (partial rotary)
    rope_sections: tuple[int, int, int, int] = (11, 11, 10, 0)
    # llama.cpp quantizer overrides: (regular expression on tensor names, GGML type name);
    # left out of params() when empty
    tensor_types: tuple[tuple[str, str], ...] = ()
    # routed experts written directly as random quantized blocks (sdq.synth.direct_experts)
    # instead of drawn as floats and quantized; left out of params() when False
    direct_experts: bool = False
    # llama / granitemoe only (sdq.synth.llama_moe); left out of params() for the others
    legacy_experts: bool = False  # one 2-D tensor per expert and part (early Mixtral files)
    embedding_scale: float = 1.0  # granitemoe's scales
    residual_scale: float = 1.0
    attention_scale: float = 0.125
    logit_scale: float = 1.0

    @property
    def router(self) -> str:
        """The named router (ROUTERS) whose knobs this config has, or "custom"."""
        for name, knobs in ROUTERS.items():
            if all(getattr(self, k) == v for k, v in knobs.items()):
                return name
        return "custom"

    def validate(self) -> SynthConfig:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise ParamsError(f"synthetic model {self.name!r}: {what}")

        for field in ("n_embd", "n_layer", "n_expert", "n_expert_used", "expert_ffn", "n_head"):
            need(getattr(self, field) >= 1, f"{field} = {getattr(self, field)} must be >= 1")
        need(self.n_head_kv >= 1, f"n_head_kv = {self.n_head_kv} must be >= 1")
        need(
            self.n_expert_used <= self.n_expert,
            f"experts used {self.n_expert_used} > experts {self.n_expert}",
        )
        need(
            self.n_head % self.n_head_kv == 0,
            f"n_head {self.n_head} is not a multiple of n_head_kv {self.n_head_kv}",
        )
        need(self.head_dim % 2 == 0, f"head_dim {self.head_dim} must be even (RoPE)")
        for field in ("n_embd", "expert_ffn"):
            value = getattr(self, field)
            need(value % 32 == 0, f"{field} = {value} must be a multiple of 32 (quant blocks)")
        need(
            (self.n_head * self.head_dim) % 32 == 0,
            f"n_head * head_dim = {self.n_head * self.head_dim} must be a multiple of 32",
        )
        need(
            1 <= self.route_rank <= min(self.head_dim, self.n_embd - 1),
            f"route_rank {self.route_rank} must be in 1..min(head_dim, n_embd - 1)",
        )
        need(self.token_subgroups >= 1, f"token_subgroups {self.token_subgroups} must be >= 1")
        need(self.arch in ARCHES, f"arch {self.arch!r} is not one of {', '.join(ARCHES)}")
        need(
            not self.context_ema or self.arch == "qwen35moe",
            f"context_ema (the calibrated router) needs qwen35moe's delta-net blocks; "
            f"{self.arch} has only the random router",
        )
        from gguf.constants import GGMLQuantizationType

        for pattern, type_name in self.tensor_types:
            need(
                type_name in GGMLQuantizationType.__members__,
                f"tensor type override {pattern!r}: unknown type {type_name!r}",
            )
        if self.arch in LLAMA_MOE_ARCHES:
            need(
                not self.legacy_experts or self.arch == "llama",
                "legacy_experts (one tensor per expert) is a llama (Mixtral) layout",
            )
            for field in ("embedding_scale", "residual_scale", "attention_scale", "logit_scale"):
                need(getattr(self, field) > 0, f"{field} = {getattr(self, field)} must be > 0")
        if self.arch == "qwen35moe":
            need(
                self.ssm_v_heads % self.ssm_k_heads == 0,
                f"ssm_v_heads {self.ssm_v_heads} is not a multiple of ssm_k_heads "
                f"{self.ssm_k_heads}",
            )
            need(self.ssm_state % 32 == 0, f"ssm_state {self.ssm_state} must be a multiple of 32")
            need(
                self.shared_ffn % 32 == 0, f"shared_ffn {self.shared_ffn} must be a multiple of 32"
            )
            need(self.full_attention_interval >= 1, "full_attention_interval must be >= 1")
            need(0.0 <= self.context_ema < 1.0, f"context_ema {self.context_ema} must be in [0, 1)")
            need(
                not self.context_ema or self.route_rank < self.ssm_state,
                f"route_rank {self.route_rank} must be < ssm_state {self.ssm_state}",
            )
            need(self.ssm_conv_kernel >= 1, "ssm_conv_kernel must be >= 1")
            need(
                self.rope_dim % 2 == 0 and 2 <= self.rope_dim <= self.head_dim,
                f"rope_dim {self.rope_dim} must be even and in 2..head_dim",
            )
            need(
                len(self.rope_sections) == 4 and 2 * sum(self.rope_sections) <= self.rope_dim,
                f"rope_sections {self.rope_sections}: 4 sections summing to <= rope_dim / 2",
            )
        if self.arch in STANDARD_MOE_ARCHES:
            from sdq.synth.standard_moe import problems

            for problem in problems(self):
                need(False, problem)
        return self

    @property
    def k_quant_ready(self) -> bool:
        """True when every matrix row length is a multiple of 256 (no K-quant fallbacks)."""
        rows = (self.n_embd, self.expert_ffn, self.n_head * self.head_dim)
        return all(r % K_QUANT_BLOCK == 0 for r in rows)

    def params(self) -> dict:
        """Fields as a JSON-able dict (stored in the file and hashed for the cache name)."""
        out = dataclasses.asdict(self)
        if self.arch == ARCH:
            for name in QWEN35_FIELDS:
                del out[name]
        if self.arch not in LLAMA_MOE_ARCHES:
            for name in LLAMA_MOE_FIELDS:
                del out[name]
        if self.arch in STANDARD_MOE_ARCHES:
            from sdq.synth.standard_moe import CONFIG_FIELDS

            for name in QWEN35_FIELDS:
                if name not in CONFIG_FIELDS[self.arch]:
                    del out[name]
        elif self.arch in LLAMA_MOE_ARCHES:
            for name in QWEN35_FIELDS[1:]:
                del out[name]
        if not self.tensor_types:
            del out["tensor_types"]
        if not self.direct_experts:
            del out["direct_experts"]
        if not self.context_ema:
            del out["context_ema"]
        return out


QWEN35_FIELDS = (
    "arch",
    "full_attention_interval",
    "ssm_conv_kernel",
    "ssm_state",
    "ssm_k_heads",
    "ssm_v_heads",
    "shared_ffn",
    "rope_dim",
    "rope_sections",
)


LLAMA_MOE_FIELDS = (
    "legacy_experts",
    "embedding_scale",
    "residual_scale",
    "attention_scale",
    "logit_scale",
)


_VOCAB_CACHE: dict[str, object] = {}


def _vocab():
    if "v" not in _VOCAB_CACHE:
        from sdq.synth.vocab import load_qwen2_vocab

        _VOCAB_CACHE["v"] = load_qwen2_vocab()
    return _VOCAB_CACHE["v"]


def _n_vocab() -> int:
    return _vocab().n_vocab
