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


def _parse(*argv: str):
    from sdq.cli import build_parser

    return build_parser().parse_args(list(argv))


def test_run_flags_become_run_settings_the_same_way_for_every_command(tmp_path):
    from sdq.paging.io_profile import IOProfile, write_io_profile
    from sdq.run.sampler import SamplerSettings
    from sdq.run.settings import RunSettings

    chat = RunSettings.from_args(
        _parse("chat", "-m", "m.gguf", "-c", "512", "-b", "32", "--ignore-eos", "--temp", "0")
    )
    assert (chat.model, chat.n_ctx, chat.n_ubatch, chat.n_predict) == ("m.gguf", 512, 32, 64)
    assert not chat.stop_at_eos and chat.sampler == SamplerSettings(temp=0.0)
    assert (chat.io_mode, chat.io_split, chat.cache_mode, chat.cache_policy) == (
        "parallel",
        1,
        "pagecache",
        "auto",
    )
    resident = RunSettings.from_args(_parse("bench", "resident", "m.gguf", "-t", "3"))
    assert (resident.n_predict, resident.threads, resident.n_ctx) == (32, 3, 1024)
    # peers' --io-profile is the probe bandwidth for the I/O ceiling, not sdq's I/O settings
    peers_flags = ("--tokens", "5", "--sdq-cache-policy", "lru", "--io-profile", "absent.json")
    peers = RunSettings.from_args(
        _parse("bench", "peers", "m.gguf", "--ram-cap-mb", "9", *peers_flags)
    )
    assert (peers.n_predict, peers.n_ctx, peers.reserve_mb) == (5, 512, 100.0)
    assert (peers.cache_mode, peers.cache_policy, peers.io_threads) == ("direct", "lru", None)

    profile = tmp_path / "io_profile.json"
    write_io_profile(
        profile, IOProfile(io_threads=6, io_split=2, cache_mode="direct", device={}, measured={})
    )
    filled = RunSettings.from_args(_parse("chat", "-m", "m", "--io-profile", str(profile)))
    assert (filled.io_threads, filled.io_split, filled.io_mode) == (6, 2, "split")
    given = RunSettings.from_args(
        _parse(
            "chat",
            "-m",
            "m",
            "--io-profile",
            str(profile),
            "--io-threads",
            "3",
            "--io-mode",
            "parallel",
        )
    )
    assert (given.io_threads, given.io_split, given.io_mode) == (3, 2, "parallel")


def test_cli_choices_are_the_implementations_lists():
    from sdq.cli import build_parser
    from sdq.paging.cache import POLICIES
    from sdq.paging.reads import CACHE_MODES, MODES

    def choices(parser, flag):
        sub = [a for a in parser._actions if flag in a.option_strings]
        return tuple(sub[0].choices)

    commands = build_parser()._subparsers._group_actions[0].choices
    bench = commands["bench"]._subparsers._group_actions[0].choices
    assert choices(commands["chat"], "--cache-mode") == CACHE_MODES
    assert choices(commands["chat"], "--io-mode") == MODES
    assert choices(commands["chat"], "--cache-policy") == POLICIES
    assert choices(commands["experiments"], "--cache-mode") == CACHE_MODES
    assert choices(bench["layer-miss"], "--cache-mode") == CACHE_MODES
    assert choices(bench["peers"], "--sdq-cache-mode") == CACHE_MODES
    assert choices(bench["peers"], "--sdq-cache-policy") == POLICIES
