"""`sdq info` shows the anatomy of any GGUF (a dense model, an architecture sdq does not know)
and says in a plain line whether sdq can run it; only the commands that run a model refuse it,
in one line with exit code 2."""

from __future__ import annotations

import json

import pytest
from gguf_builders import Layout, write_model

from sdq.cli import main


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("any")
    dense, _ = write_model(d / "dense.gguf", Layout(arch="llama", n_expert=0))
    unknown, _ = write_model(d / "mamba.gguf", Layout(arch="mamba9"))  # with routed experts
    return {"dense": dense, "unknown": unknown}


def info_json(capsys, path) -> dict:
    assert main(["info", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_dense_model_anatomy_and_why_it_cannot_run(capsys, files):
    info = info_json(capsys, files["dense"])
    assert info["routed_expert_bytes"] == 0 and info["dense_bytes"] == info["total_bytes"] > 0
    assert sum(t["bytes"] for t in info["tensor_types"].values()) == info["total_bytes"]
    assert "no routed experts" in info["cannot_run"]
    assert main(["info", str(files["dense"])]) == 0
    out = capsys.readouterr().out
    assert "tensors by type" in out and "F16" in out
    assert out.splitlines()[-1].startswith("run      sdq cannot run it: it has no routed experts")


def test_unknown_architecture_gets_the_headers_anatomy(capsys, files):
    info = info_json(capsys, files["unknown"])
    assert info["spec"] == {"arch": "mamba9", "n_layer": 2}
    assert info["routed_expert_bytes"] > 0
    assert info["dense_bytes"] + info["routed_expert_bytes"] == info["total_bytes"]
    assert info["tensor_classes"]["routed_experts"]["count"] == 2 * 3  # 2 layers x gate/up/down
    assert "does not know architecture 'mamba9'" in info["cannot_run"]
    assert main(["info", str(files["unknown"])]) == 0
    out = capsys.readouterr().out
    assert "routed experts (paged)" in out and "sdq cannot run it" in out.splitlines()[-1]


def test_a_runnable_model_says_so(capsys, tiny_model):
    assert main(["info", str(tiny_model)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "run      sdq can run it"


@pytest.mark.parametrize("which", ["dense", "unknown"])
@pytest.mark.parametrize(
    "command", [["chat", "-n", "1", "-p", "x", "-m"], ["plan"], ["serve", "--port", "0", "-m"]]
)
def test_commands_that_run_a_model_refuse_in_one_line(capsys, files, which, command):
    rc = main([*command, str(files[which])])
    captured = capsys.readouterr()
    assert rc == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"sdq {command[0]}: error: "), captured.err
    assert ("no routed experts" if which == "dense" else "architecture 'mamba9'") in lines[0]
