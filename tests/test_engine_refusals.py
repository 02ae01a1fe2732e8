"""Models the engine cannot run, refused by `sdq chat` with one line on stderr and exit code 2.

Small hand-made GGUFs (tests/gguf_builders.py), complete enough for every earlier step of a run
(header, expert table, memory plan, dense tensors present), so that each refusal comes from the
check it is about: an architecture the engine does not run, fused gate_up expert tensors, an
expert quant type without a kernel. Each runs `python -m sdq chat` as a user would (a crash,
abort or traceback would show here as a signal or a second line).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from gguf_builders import Layout, Q, write_model


def _qk_norms(n_layer: int = 2, head_dim: int = 16) -> dict:
    """qwen3moe's per-head Q and K norms, which the builder does not write by itself."""
    return {
        f"blk.{i}.attn_{x}_norm.weight": ((head_dim,), Q.F32) for i in range(n_layer) for x in "qk"
    }


CASES = {
    "qwen3vlmoe_arch": (
        Layout(arch="qwen3vlmoe", extra_tensors=_qk_norms()),
        "architecture 'qwen3vlmoe' is not supported",
    ),
    "qwen3next_arch": (
        Layout(arch="qwen3next", extra_tensors=_qk_norms()),
        "architecture 'qwen3next' is not supported",
    ),
    "fused_gate_up": (
        Layout(fused_gate_up=True, extra_tensors=_qk_norms()),
        "fused gate_up expert tensors",
    ),
    "expert_iq4_xs": (
        Layout(
            n_embd=256,
            expert_ffn=256,
            expert_qtypes=(Q.Q4_K, Q.Q4_K, Q.IQ4_XS),
            extra_tensors=_qk_norms(),
        ),
        "tensor blk.0.ffn_down_exps.weight is IQ4_XS, which sdq cannot compute "
        "(2 tensors of type IQ4_XS; supported: BF16, F16, F32, MXFP4, Q4_0, Q4_K, Q5_K, Q6_K, "
        "Q8_0)",
    ),
    "expert_q2_k": (
        Layout(
            n_embd=256,
            expert_ffn=256,
            expert_qtypes=(Q.Q2_K, Q.Q2_K, Q.Q2_K),
            extra_tensors=_qk_norms(),
        ),
        "tensor blk.0.ffn_gate_exps.weight is Q2_K, which sdq cannot compute (6 tensors",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_chat_refuses_in_one_line(case, tmp_path):
    layout, expected = CASES[case]
    path, _ = write_model(tmp_path / f"{case}.gguf", layout)
    run = subprocess.run(
        [sys.executable, "-m", "sdq", "chat", "-m", str(path), "-p", "hello", "-n", "2"]
        + ["--ram-budget-mb", "2000"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2, run.stderr
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(f"sdq chat: error: {path}: ") and expected in lines[0], lines[0]
    assert run.stdout == ""


def test_a_resident_run_that_cannot_fit_is_refused_before_allocating(tiny_model):
    """--resident has no budget, but a context whose KV cache exceeds the machine's available
    memory is refused in one line naming the sizes, not ended by the allocator."""
    run = subprocess.run(
        [sys.executable, "-m", "sdq", "chat", "-m", str(tiny_model), "-p", "hello", "-n", "2"]
        + ["--resident", "-c", str(2**30)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2, run.stderr
    assert len(lines) == 1, run.stderr
    assert "--resident needs" in lines[0] and "MB are available" in lines[0], lines[0]
    assert f"-c {2**30}" in lines[0]
