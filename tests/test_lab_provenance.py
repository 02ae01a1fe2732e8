"""provenance.json records the code, packages, parameters, machine and date of a run."""

from __future__ import annotations

import json
import re

import numpy as np

from sdq.lab import provenance


def test_record_has_every_field(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    params = {"name": "smoke", "model": {"preset": "tiny", "qtype": "Q4_K_M", "seed": 0}}
    record = provenance.collect(params, "00_demo", tmp_path, model, extra={"duration_s": 1.5})
    path = provenance.write(tmp_path / "provenance.json", record)
    p = json.loads(path.read_text())

    assert p["notebook"] == "00_demo" and p["params"] == params and p["duration_s"] == 1.5
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", p["date_utc"])
    assert re.fullmatch(r"[0-9a-f]{40}", p["git"]["sha"])
    assert isinstance(p["git"]["dirty"], bool)
    assert p["packages"]["numpy"] == np.__version__
    assert p["packages"]["sdq"] and p["packages"]["python"]
    assert p["cpu"]["logical_cores"] >= 1 and p["cpu"]["usable_cores"] >= 1
    assert p["cpu"]["model"]
    assert p["ram"]["total_mb"] > 0
    assert p["model"]["file"] == "m.gguf" and p["model"]["bytes"] == 64
    for disk in (p["model"]["disk"], p["outputs_disk"]):
        assert disk["fstype"] and disk["mountpoint"] and disk["total_gb"] > 0
    assert p["kernel"]["system"] and p["kernel"]["release"]


def test_dirty_ignores_generated_outputs_and_docs(tmp_path):
    import subprocess

    from sdq.lab.provenance import git_state

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    for rel in ("outputs/t.md", "docs/t.md", "sdq/code.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("a\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    (tmp_path / "outputs/t.md").write_text("b\n")
    (tmp_path / "docs/t.md").write_text("b\n")
    assert git_state(tmp_path)["dirty"] is False
    (tmp_path / "sdq/code.py").write_text("b\n")
    assert git_state(tmp_path) | {"sha": None} == {"sha": None, "dirty": True, "changed_files": 1}
