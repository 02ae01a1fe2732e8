"""Which engine and which dense-weight reader run a model: gpt-oss has its own
(sdq.run.gpt_oss); every other architecture sdq runs uses sdq.run.engine."""

from __future__ import annotations

from sdq.run.engine import DenseWeights, Engine
from sdq.run.gpt_oss import ARCH as GPT_OSS
from sdq.run.gpt_oss import GptOssEngine, GptOssWeights
from sdq.run.workspace import Workspace


def load_weights(model) -> DenseWeights:
    """Every dense tensor of the model, read into anonymous memory (DenseWeights.load)."""
    if model.spec.arch == GPT_OSS:
        return GptOssWeights.load(model)
    return DenseWeights.load(model)


def make_engine(model, experts, workspace: Workspace, n_ctx: int, n_ubatch: int, weights=None):
    """The engine for the model's architecture."""
    cls = GptOssEngine if model.spec.arch == GPT_OSS else Engine
    return cls(model, experts, workspace, n_ctx, n_ubatch, weights=weights)
