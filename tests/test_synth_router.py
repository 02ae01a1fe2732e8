"""The synthetic routers: named router settings, the locality statistics they are measured by,
and the calibrated router keeping the seed's temporal locality on a small model's own decodes
(a change that destroys locality fails here)."""

import subprocess
import sys

import numpy as np
import pytest

from sdq.analysis.locality import TARGETS, hit_ceiling, locality, pin_coverage
from sdq.errors import ParamsError
from sdq.measure.routing import decode_locality
from sdq.synth.build import build_model, resolve_config

# the lab's router check on a narrow copy of the seed preset (notebook 02's `router_proxy`)
NARROW = {"n_embd": 512, "expert_ffn": 128, "n_head": 8, "head_dim": 128, "tensor_types": ()}
PROMPTS = [
    "Explain in three sentences how SSD, RAM and CPU caches form a memory hierarchy.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List five differences between Python and C for a new programmer.",
    "What is the capital of France, and why did it become the capital?",
]


def test_router_names_presets_and_refusals():
    assert resolve_config("seed").router == "calibrated"
    assert resolve_config("seed-full").router == "calibrated"
    assert resolve_config("tiny35").router == "random" and resolve_config("tiny").router == "random"
    random = resolve_config("seed", router="random")
    assert (random.name, random.router, random.context_ema) == ("seed-random", "random", 0.0)
    assert resolve_config("seed", router="calibrated").name == "seed"  # no change, same name
    assert resolve_config("seed", zipf=0.7).router == "custom"
    with pytest.raises(ParamsError, match="qwen35moe's delta-net blocks"):
        resolve_config("tiny", router="calibrated")
    with pytest.raises(ParamsError, match="unknown router 'trained'"):
        resolve_config("seed", router="trained")


def test_cli_refuses_a_calibrated_router_without_delta_net_blocks():
    run = subprocess.run(
        [sys.executable, "-m", "sdq", "synth", "--preset", "tiny-mixtral"]
        + ["--router", "calibrated"],
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "delta-net" in run.stderr


def test_locality_statistics_on_hand_made_routing():
    # one layer, E = 4, K = 1: tokens use experts 0 0 1 0 | 2 2 2 3
    a = np.array([0, 0, 1, 0], np.int32).reshape(4, 1, 1)  # [T, L, K]
    b = np.array([2, 2, 2, 3], np.int32).reshape(4, 1, 1)
    assert hit_ceiling(a) == pytest.approx(1 - 2 / 4)
    # pin of 1 pair (fraction 0.25 of 4) ranked on b: expert 2, which a never uses
    assert pin_coverage(a, [b], n_expert=4, fraction=0.25) == 0.0
    assert pin_coverage(b, [a], n_expert=4, fraction=0.25) == 0.0  # a's top: expert 0
    assert pin_coverage(a, [a], n_expert=4, fraction=0.25) == pytest.approx(3 / 4)
    rows = locality([a, b], n_expert=4)
    assert rows[0]["one_offs"] == pytest.approx(1 / 4)  # expert 1 once in the window
    assert rows[1]["u4_saving"] == pytest.approx(1 - 2 / 4)  # a 4-token batch reads {2, 3}
    with pytest.raises(ValueError, match="need >= 2"):
        locality([a], n_expert=4)


@pytest.mark.slow
def test_calibrated_router_keeps_the_seed_locality_and_random_does_not(llama_cpp):
    """One-off share and U(4) saving of 48-token greedy decodes, averaged over the prompt set,
    inside the seed's tolerance for the calibrated router; the random router on the same shape
    is outside, so the check can tell the two apart."""
    means = {}
    for router in ("calibrated", "random"):
        path = build_model(resolve_config("seed", router=router, **NARROW), "Q8_0", seed=0)
        rows = decode_locality(path, PROMPTS, tokens=49, threads=2)
        means[router] = {k: float(np.mean([r[k] for r in rows])) for k in TARGETS}
        path.unlink()
    for k in ("one_offs", "u4_saving"):
        assert TARGETS[k].holds(means["calibrated"][k]), (k, means)
        assert not TARGETS[k].holds(means["random"][k]), (k, means)
