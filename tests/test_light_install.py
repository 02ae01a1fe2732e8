"""Without llama-cpp-python (the `reference` extra) sdq still chats; the commands that need
llama.cpp say so in one line with exit code 2. The module is hidden from a child process by
`sys.modules["llama_cpp"] = None`, which makes every import of it fail."""

from __future__ import annotations

import subprocess
import sys

import pytest

HIDE = (
    "import sys; sys.modules['llama_cpp'] = None; from sdq.cli import main; "
    "raise SystemExit(main(sys.argv[1:]))"
)


def sdq_without_llama_cpp(*args, cwd=None):
    cmd = [sys.executable, "-c", HIDE, *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=300)


def test_chat_runs_without_llama_cpp(tiny_model):
    proc = sdq_without_llama_cpp(
        "chat", "-m", tiny_model, "-p", "Hello", "-n", "4", "--temp", "0", "--resident"
    )
    assert proc.returncode == 0, proc.stderr
    assert "decode_tok_s" in proc.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("synth", "--preset", "tiny", "--qtype", "Q8_0", "--seed", "987654", "--out", "x.gguf"),
        ("bench", "resident", "{model}", "-n", "2"),
        ("bench", "peers", "{model}", "--ram-cap-mb", "2000"),
    ],
)
def test_commands_that_need_llama_cpp_say_so(tiny_model, tmp_path, args):
    args = [a.format(model=tiny_model) for a in args]
    proc = sdq_without_llama_cpp(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"sdq {args[0]}: error: "), proc.stderr
    assert "llama-cpp-python is not installed" in lines[0] and "sdq[reference]" in lines[0]
    assert list(tmp_path.iterdir()) == []  # nothing half-built
