import subprocess
import sys

from sdq.cli import main


def test_help_lists_commands(capsys):
    assert main([]) == 2
    out = capsys.readouterr().out
    assert "usage: sdq" in out


def test_python_dash_m_matches_console_script():
    cmd = [sys.executable, "-m", "sdq", "--version"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0
    assert proc.stdout.startswith("sdq ")


def test_error_messages_are_one_printable_line():
    from sdq.errors import GGUFError

    msg = str(GGUFError("f.gguf: tensor blk.0\nattn\x00 has 9 dimensions (1..4)"))
    assert msg == "f.gguf: tensor blk.0\\nattn\\x00 has 9 dimensions (1..4)"
