"""The generation loop: greedy continuation, stop at EOS, overflow, figures and profile."""

import numpy as np
import pytest
from engine_support import Dims, write_model

from sdq.errors import SdqError
from sdq.format.model import open_model
from sdq.format.tokenizer import Tokenizer
from sdq.run.engine import Engine, ResidentExperts
from sdq.run.generate import GenerateSettings, generate
from sdq.run.sampler import SamplerSettings
from sdq.run.workspace import Workspace

PROMPT = [int(t) for t in np.random.default_rng(3).integers(0, 290, 11)]
FIGURES = (
    "decode_tok_s prefill_tok_s ttft_ms hit_rate prefetch_hit_rate prefetch_accuracy "
    "reads_avoided ssd_mb_per_token prefetch_mb_per_token expert_io_ms_per_token "
    "expert_compute_ms_per_token total_ms_per_token peak_rss_mb swap_mb"
).split()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = write_model(tmp_path_factory.mktemp("g") / "m.gguf", Dims(n_layer=2), seed=4)
    model = open_model(path)
    tok = Tokenizer.from_metadata(model.metadata)
    return model, tok


def engine_for(model, n_ctx=64, n_ubatch=4):
    ws = Workspace.allocate(model.spec, n_ctx, n_ubatch)
    return Engine(model, ResidentExperts(model), ws, n_ctx, n_ubatch)


def greedy_by_hand(model, n):
    engine = engine_for(model, n_ubatch=32)
    logits = engine.forward(PROMPT, "last")
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = engine.forward(out[-1:], "last")
    return out


def test_greedy_generation_is_the_argmax_chain(setup):
    model, tok = setup
    want = greedy_by_hand(model, 12)
    settings = GenerateSettings(n_predict=12, sampler=SamplerSettings(temp=0.0), stop_at_eos=False)
    texts = []
    g = generate(engine_for(model), tok, PROMPT, settings, on_text=texts.append)
    assert g.generated_ids == want
    assert g.text == "".join(texts) == tok.decode(want)
    f = g.figures
    assert f["n_prompt"] == len(PROMPT) and f["n_generated"] == 12 and f["n_decode"] == 11
    assert all(name in f for name in FIGURES)
    assert f["hit_rate"] == 1.0 and f["ssd_mb_per_token"] == 0.0 and f["prefetch_hit_rate"] == 0
    assert np.isnan(f["reads_avoided"])  # resident experts have no byte counters
    assert f["decode_tok_s"] > 0 and f["prefill_tok_s"] > 0 and f["peak_rss_mb"] > 0
    assert len(g.token_ms) == 11
    decode = g.profile["decode"]
    cats = ("attention", "router", "expert_compute", "io_wait", "barrier", "other")
    parts = sum(decode[c] for c in cats)
    assert parts == pytest.approx(decode["total"], rel=1e-6)


def test_stops_at_eos(setup, tmp_path):
    model, _ = setup
    want = greedy_by_hand(model, 6)
    eos = want[3]
    stop_at = want.index(eos)  # first occurrence
    path = write_model(tmp_path / "eos.gguf", Dims(n_layer=2, eos_id=eos), seed=4)
    model2 = open_model(path)
    tok2 = Tokenizer.from_metadata(model2.metadata)
    settings = GenerateSettings(n_predict=20, sampler=SamplerSettings(temp=0.0))
    g = generate(engine_for(model2), tok2, PROMPT, settings)
    assert g.generated_ids == want[: stop_at + 1]
    assert g.text == tok2.decode(want[:stop_at])  # the stop token is not printed


def test_context_overflow_is_reported_before_running(setup):
    model, tok = setup
    settings = GenerateSettings(n_predict=60)
    with pytest.raises(SdqError, match=r"prompt 11 tokens \+ -n 60 needs 70 KV positions > .* 64"):
        generate(engine_for(model), tok, PROMPT, settings)
    with pytest.raises(SdqError, match="prompt is empty"):
        generate(engine_for(model), tok, [], settings)


def test_peak_rss_is_the_process_own_not_its_launchers():
    """ru_maxrss of a fork + exec child starts at its parent's high-water mark; VmHWM does not."""
    import subprocess
    import sys

    from sdq.proc import memory_figures

    ballast = np.ones(400 * 2**20, np.uint8)  # this process's RSS peak grows by 400 MiB
    code = "from sdq.proc import memory_figures; print(memory_figures()['peak_rss_mb'])"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert float(child.stdout) < 300 < memory_figures()["peak_rss_mb"]
    del ballast
