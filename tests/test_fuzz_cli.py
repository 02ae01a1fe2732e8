"""Every command fuzzed: argument lists built from each parser's own actions, with hostile values
(wrong types, negatives, huge numbers, NaN/inf, missing files, directories, empty strings, bytes
that are not UTF-8). Pass: exit 0, or exit 2 with exactly one line on stderr; never a traceback,
never a half-written file left behind.

Most cases run in-process through `sdq.cli.main`. Where an accepted argument list would start
the command's long work (generating, reading the device, building a model, a sweep, llama.cpp
runs), that entry point is replaced by one that stops the run: reaching it means every flag was
accepted, which passes. Validation happens before those points, so it is all exercised.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdq.cli import build_parser, main

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
TRACE = TRACES / "mixtral-8x7b" / "gsm8k_2_routing.jsonl"


class Accepted(BaseException):
    """Raised where the command's long work would start: its arguments were all accepted."""


def _stop(*args, **kwargs):
    raise Accepted


# where each command's long work starts (looked up at call time by the commands)
WORK = (
    "sdq.run.generate.generate",
    "sdq.run.generate.generation_steps",
    "sdq.paging.reads.ExpertReader",
    "sdq.measure.probe.run_probe",
    "sdq.measure.resident.LlamaRunner",
    "sdq.measure.peers.warm_file",
    "sdq.measure.peers.private_copy",
    "sdq.measure.peers.run_one",
    "sdq.synth.build.build_model",
    "sdq.measure.experiments.api.run_suite",
)


@contextlib.contextmanager
def work_stopped(headroom: int = 3 * 2**30):
    """The long work replaced by `_stop`, and the data segment capped at `headroom` bytes above
    what it is now: an input that makes sdq allocate without bound fails here, in this process,
    not on the machine."""
    status = Path("/proc/self/status").read_text()
    data_kb = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("VmData:")))
    old = resource.getrlimit(resource.RLIMIT_DATA)
    cap = data_kb * 1024 + headroom
    if old[1] != resource.RLIM_INFINITY:
        cap = min(cap, old[1])
    with contextlib.ExitStack() as stack:
        for target in WORK:
            stack.enter_context(mock.patch(target, _stop))
        resource.setrlimit(resource.RLIMIT_DATA, (cap, old[1]))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_DATA, old)


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_model):
    """Paths the fuzzer hands out: the tiny model, a trace, a directory, an empty file, a file
    of random bytes, a file that is not UTF-8, a missing path, a folder for outputs."""
    root = tmp_path_factory.mktemp("fuzz-cli")
    # copies: a hostile --route-log, --out or --profile-out may name an input
    shutil.copyfile(tiny_model, root / "model.gguf")
    shutil.copyfile(TRACE, root / "trace.jsonl")
    (root / "empty").write_bytes(b"")
    (root / "noise.gguf").write_bytes(os.urandom(4096))
    (root / "latin1.txt").write_bytes("caf\xe9 \xff\xfe".encode("latin-1"))
    (root / "out").mkdir()
    os.mkfifo(root / "fifo")  # no writer: opening it for reading would wait forever
    (root / "scratch").mkdir()
    return {
        "model": str(root / "model.gguf"),
        "trace": str(root / "trace.jsonl"),
        "dir": str(root / "scratch"),
        "empty": str(root / "empty"),
        "noise": str(root / "noise.gguf"),
        "latin1": str(root / "latin1.txt"),
        "missing": str(root / "absent" / "x.gguf"),
        "fifo": str(root / "fifo"),
        "out": str(root / "out"),
        "root": root,
    }


@pytest.fixture(autouse=True)
def private_cache(files, tmp_path_factory, monkeypatch):
    """The commands run against an empty sdq cache of their own (after the tiny model is built
    in the shared one): a fuzzed `synth --preset tiny --remove` deletes nothing of the session's,
    and no run writes an I/O profile where other tests look for one."""
    from sdq.dirs import cache_subdir

    shared = sorted(cache_subdir("models").glob("*.gguf"))
    monkeypatch.setenv("SDQ_CACHE_DIR", str(tmp_path_factory.mktemp("fuzz-cache")))
    yield
    monkeypatch.undo()
    assert [p for p in shared if not p.is_file()] == [], "a fuzzed command removed a cached model"


# chat runs in this process, whose resident set grows over a long test session (~800 MB seen):
# a budget with room for it and no reserve, but not so much that the arena the plan gives it
# (every MB left becomes slots) passes the fuzzer's data-segment cap
ROOMY_MB = "2000"


def base_args(f: dict) -> dict[tuple[str, ...], list[str]]:
    """A valid, cheap argument list per command (the fuzzer mutates one or two of its flags)."""
    m = f["model"]
    return {
        ("info",): [m],
        ("plan",): [m, "--ram-budget-mb", "4000", "-c", "64", "-t", "1"],
        ("chat",): [
            *("-m", m, "-p", "hi", "-n", "1", "-c", "64", "-t", "1"),
            *("--io-profile", "none", "--ram-budget-mb", ROOMY_MB, "--reserve-mb", "0"),
        ],
        ("probe",): [
            *("--file", m, "--size", "4k", "--threads", "1", "--reads", "1"),
            *("--split", "1", "--cache-mode", "dontneed"),
        ],
        ("routes", "simulate"): [f["trace"], "--slots", "8"],
        ("routes", "stats"): [f["trace"]],
        ("bench", "layer-miss"): [m, "--repeat", "1", "--misses", "1", "--io-threads", "1"],
        ("bench", "resident"): [m, "-n", "2", "-t", "1"],
        ("bench", "peers"): [m, "--ram-cap-mb", "500", "--tokens", "2", "--repeat", "1"],
        ("experiments",): ["--suite", "io", "--model", m, "--out", f["out"], "--no-progress"],
        ("synth",): ["--preset", "tiny", "--no-progress"],
    }


def subparser(path: tuple[str, ...]) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        parser = next(
            a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
        ).choices[name]
    return parser


def fuzzable(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    skip = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)
    return [a for a in parser._actions if not isinstance(a, skip)]


HUGE_INTS = [str(2**31), str(2**63), str(2**64 + 1), "9" * 40, str(-(2**63) - 1)]
BAD_NUMBERS = ["nan", "inf", "-inf", "1e309", "-0", "0x10", "1_000", " 7 ", "", "x", "1.5"]
SMALL_INTS = ["-1", "0", "1", "-2147483649"]


def values_for(action: argparse.Action, f: dict) -> list[str]:
    """Hostile values for one flag, from its declared type and choices."""
    texts = ["", "-", "--", "a\nb", "\udcff\udcfe", "\ud800", "é" * 3, ",", "1,,2", "0,-1"]
    paths = [f[k] for k in ("dir", "empty", "noise", "latin1", "missing", "model", "trace")]
    paths += [f["fifo"]]
    paths += ["/dev/null", "/dev/zero", "/proc/self/mem", "/", "\udcff.gguf"]
    if action.choices:
        return [*map(str, action.choices), *texts, "ALL"]
    if action.type is int:
        return HUGE_INTS + BAD_NUMBERS + SMALL_INTS + ["2", "64"]
    if action.type is not None and getattr(action.type, "__name__", "") == "finite_float":
        return HUGE_INTS + BAD_NUMBERS + SMALL_INTS + ["1e-320", "1e18", "0.5"]
    return paths + texts + HUGE_INTS + BAD_NUMBERS + SMALL_INTS


def mutated(draw, path: tuple[str, ...], f: dict) -> list[str]:
    """The base list of `path` with one or two flags given hostile values, a positional
    replaced or dropped, or an unknown flag added."""
    parser = subparser(path)
    args = list(base_args(f)[path])
    actions = fuzzable(parser)
    for _ in range(draw(st.integers(1, 2))):
        action = draw(st.sampled_from(actions))
        if not action.option_strings:  # positional: the first base item
            how = draw(st.sampled_from(["replace", "drop"]))
            value = draw(st.sampled_from(values_for(action, f)))
            args = ([value] if how == "replace" else []) + args[1:]
            continue
        flag = draw(st.sampled_from(action.option_strings))
        if action.nargs == 0:
            args.append(flag)
        elif action.nargs == "?" and draw(st.booleans()):
            args.append(flag)
        else:
            value = draw(st.sampled_from(values_for(action, f)))
            args += [flag, value] if draw(st.booleans()) else [f"{flag}={value}"]
    if draw(st.integers(0, 9)) == 0:
        args.append(draw(st.sampled_from(["--bogus", "-Z", "extra"])))
    return [*path, *args]


def leftovers(f: dict) -> list[Path]:
    """Temporary or partial files left where the commands write."""
    return [p for p in f["root"].rglob("*") if p.name.startswith(".") or p.suffix == ".tmp"]


def snapshot(f: dict) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file the fuzzer hands out: no failed run may change one."""
    return {
        str(p): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in f["root"].rglob("*")
        if p.is_file()
    }


def check(argv: list[str], capsys, cwd: Path) -> None:
    try:
        with contextlib.chdir(cwd), work_stopped():  # relative names land in cwd
            rc = main(argv)
    except Accepted:
        capsys.readouterr()
        return
    except SystemExit as exc:  # argparse: --help or a usage error
        rc = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err, (argv, err)
    if rc == 1 and err.startswith(f"sdq {argv[0]}: out of memory: "):
        # --resident sizes its buffers without a plan: a MemoryError, still one line
        resident = "--resident" in argv or argv[:2] == ["bench", "resident"]
        assert resident and err.count("\n") == 1, (argv, err)
        return
    assert rc in (0, 2), (argv, rc, err)
    if rc == 2:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("sdq"), (argv, err)


COMMAND_PATHS = [
    ("info",),
    ("plan",),
    ("chat",),
    ("probe",),
    ("routes", "simulate"),
    ("routes", "stats"),
    ("bench", "layer-miss"),
    ("bench", "resident"),
    ("bench", "peers"),
    ("experiments",),
    ("synth",),
]


@pytest.mark.parametrize("path", COMMAND_PATHS, ids=" ".join)
def test_hostile_flags(path, files, capsys):
    @settings(
        max_examples=12,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def fuzz(data):
        argv = data.draw(st.composite(lambda draw: mutated(draw, path, files))())
        before = snapshot(files)
        check(argv, capsys, files["root"])
        assert not leftovers(files), (argv, leftovers(files))
        assert snapshot(files) == before, argv

    fuzz()


def test_base_argument_lists_are_accepted(files, capsys):
    """The fuzzer's starting points are valid: each reaches its command's work (or, for the
    cheap commands, finishes with exit 0)."""
    for path, args in base_args(files).items():
        try:
            with work_stopped():
                rc = main([*path, *args])
        except Accepted:
            rc = "accepted"
        out, err = capsys.readouterr()
        assert rc in (0, "accepted"), (path, err)


BUDGET = (
    "-n",
    "1",
    "-c",
    "64",
    "--ram-budget-mb",
    ROOMY_MB,
    "--reserve-mb",
    "0",
    "--io-profile",
    "none",
)


@pytest.mark.parametrize(
    "prompt",
    ["\udcff\udcfe", "ok \ud800 then", "a\x00b", "\u2028\ufeff\x1b[2J🙂"],
)
def test_prompts(prompt, files, capsys):
    """Lone surrogates (bytes of the command line that are not UTF-8) are a one-line error;
    NUL cannot come from a command line and is refused; other text is accepted."""
    try:
        with work_stopped():
            rc = main(["chat", "-m", files["model"], "-p", prompt, *BUDGET])
    except Accepted:
        rc = "accepted"
    err = capsys.readouterr().err
    if "\x00" in prompt or "\ud800" in prompt:  # no command line can hold these
        assert rc == 2 and err.count("\n") == 1 and "cannot come from a command line" in err
    elif any(0xDC80 <= ord(c) <= 0xDCFF for c in prompt):  # bytes that are not UTF-8
        assert rc == 2 and err.count("\n") == 1 and "the prompt is not UTF-8 text" in err
    else:
        assert rc == "accepted", err


def test_prompt_file_not_utf8(files, capsys):
    assert main(["chat", "-m", files["model"], "-f", files["latin1"]]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"sdq chat: error: -f {files['latin1']}: the prompt is not UTF-8 text "
        "(byte 0xe9 at character 3)\n"
    )


def test_usage_error_is_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["chat", "-m", "m.gguf", "-c", "nan"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == (
        "sdq chat: error: argument -c/--ctx-size: invalid int value: 'nan' (see sdq chat --help)\n"
    )


def test_an_unexpected_exception_is_one_line_exit_1(files, capsys):
    """A bug (not a user mistake) still prints one line, naming where it happened; pyo3's
    PanicException (a BaseException raised by `tokenizers`) too."""
    panic = type("PanicException", (BaseException,), {})
    for exc in (TypeError("boom\nsecond line"), panic("bad merge")):
        with mock.patch("sdq.format.model.open_model", side_effect=exc):
            assert main(["info", files["model"]]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("sdq info: internal error: ")
        assert type(exc).__name__ in err and "Traceback" not in err


def run_sdq(*argv: bytes | str, stdin=None) -> subprocess.CompletedProcess:
    args = [os.fsencode(a) if isinstance(a, str) else a for a in argv]
    return subprocess.run(
        [os.fsencode(sys.executable), b"-m", b"sdq", *args],
        capture_output=True,
        timeout=120,
        stdin=stdin,
    )


def test_processes(files, tmp_path):
    """As real processes: argument bytes that are not UTF-8, in a prompt and in a file name
    (printed back without failing), a usage error, a NaN budget."""
    m = files["model"]
    proc = run_sdq("chat", "-m", m, "-p", b"\xff\xfe hi", "-n", "1")
    assert proc.returncode == 2 and proc.stderr.count(b"\n") == 1, proc.stderr
    assert b"not UTF-8 text (byte 0xff at character 0)" in proc.stderr

    odd = tmp_path / os.fsdecode(b"model-\xff.gguf")
    os.link(m, odd)
    proc = run_sdq("info", os.fsencode(odd), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["path"] == str(odd)

    for argv in (("plan", m, "--ram-budget-mb", "nan"), ("routes", "stats", "--window", "x")):
        proc = run_sdq(*argv)
        assert proc.returncode == 2 and proc.stderr.count(b"\n") == 1, proc.stderr
        assert b"Traceback" not in proc.stderr


# ---- trace files: sdq.analysis.readers through `sdq routes`


def _engine_trace() -> str:
    lines = ['{"model": "m", "n_expert": 8, "top_k": 2}']
    for phase, positions in (("prefill", (0, 1)), ("decode", (2, 3, 4))):
        for pos in positions:
            for layer in (0, 1):
                e = [(pos + layer) % 8, (pos + 3) % 8 if (pos + 3) % 8 != (pos + layer) % 8 else 7]
                lines.append(
                    json.dumps(
                        {
                            "phase": phase,
                            "pos": pos,
                            "layer": layer,
                            "experts": e,
                            "weights": [0.6, 0.4],
                        }
                    )
                )
    return "\n".join(lines) + "\n"


def _granite_trace() -> str:
    prompt = {
        "prompt_len": 2,
        "prefill": [[[0, 1], [2, 3]], [[1, 2], [3, 0]]],
        "decode": [[[0, 3], [1, 2]], [[2, 0], [3, 1]]],
    }
    return json.dumps(
        {"model": "g", "num_layers": 2, "num_experts": 4, "top_k": 2, "prompts": {"p": prompt}}
    )


def _mixtral_trace() -> str:
    rows = [
        {
            "dataset": "d",
            "problem_id": 0,
            "layer": layer,
            "experts": [t % 8, (t + 1) % 8],
            "gating_probs": [0.7, 0.3],
            "token_idx": t,
        }
        for layer in (0, 1)
        for t in range(3)
    ]
    return "\n".join(json.dumps(r) for r in rows) + "\n"


def _deepseek_trace() -> str:
    rows = ["Layer ID,Batch Number,Token,Activated Expert IDs"]
    rows += [f'{layer},0,tok{t},"[{t}, {t + 1}, {t + 9}]"' for layer in (1, 2) for t in range(3)]
    return "\n".join(rows) + "\n"


TRACE_SEEDS = {
    "engine.jsonl": _engine_trace(),
    "granite.json": _granite_trace(),
    "mixtral.jsonl": _mixtral_trace(),
    "deepseek.csv": _deepseek_trace(),
}
NUMBER = re.compile(r"-?\d+(\.\d+)?")
HOSTILE_JSON = [
    "-1",
    str(2**62),
    str(2**64),
    "1e308",
    "-0",
    "NaN",
    "Infinity",
    "1.5",
    "true",
    "null",
    '"7"',
    "[]",
    "{}",
    "[1, 1]",
    str(2**31),
]


@pytest.mark.parametrize("name", sorted(TRACE_SEEDS))
def test_hostile_traces(name, tmp_path, capsys):
    seed = TRACE_SEEDS[name]
    path = tmp_path / name
    path.write_text(seed)
    for cmd in ("simulate", "stats"):
        assert main(["routes", cmd, str(path), "--json"]) == 0, capsys.readouterr().err
    capsys.readouterr()

    @settings(
        max_examples=20,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def fuzz(data):
        text = seed
        how = data.draw(st.sampled_from(["number", "number", "cut", "flip", "repeat"]))
        if how == "number":
            spots = list(NUMBER.finditer(text))
            m = spots[data.draw(st.integers(0, len(spots) - 1))]
            text = text[: m.start()] + data.draw(st.sampled_from(HOSTILE_JSON)) + text[m.end() :]
        elif how == "cut":
            text = text[: data.draw(st.integers(0, len(text) - 1))]
        elif how == "flip":
            i = data.draw(st.integers(0, len(text) - 1))
            text = (
                text[:i]
                + data.draw(st.sampled_from(['"', "{", "]", ",", "\x00", "\n"]))
                + text[i + 1 :]
            )
        else:
            lines = text.splitlines(keepends=True)
            i = data.draw(st.integers(0, len(lines) - 1))
            text = "".join(lines[: i + 1] + lines[i:])
        path.write_text(text)
        for cmd in ("simulate", "stats"):
            check(["routes", cmd, str(path)], capsys, tmp_path)

    fuzz()


def test_traces_that_are_not_text(tmp_path, capsys):
    for name, data in (("noise.jsonl", os.urandom(2048)), ("latin1.csv", b"Layer ID,\xff\xfe\n")):
        (tmp_path / name).write_bytes(data)
        check(["routes", "stats", str(tmp_path / name)], capsys, tmp_path)
    check(["routes", "stats", "/dev/zero"], capsys, tmp_path)


# ---- parameter files: sdq.lab.params.load_params and `sdq experiments --params`

REPO = Path(__file__).resolve().parents[1]
SCALAR = re.compile(r"(?<=: )[^\s#\[{][^#\n]*|(?<=- )[^\s#][^#\n]*|(?<=\[)[^\],\n]+")
HOSTILE_YAML = [
    ".nan",
    ".inf",
    "-.inf",
    "-1",
    "1e400",
    str(2**64),
    "0",
    "''",
    "[]",
    "{}",
    "null",
    "~",
    "yes",
    "!!binary aGk=",
    "!!python/object:os.system {}",
    "&a [*a]",
    "*nowhere",
    "[" * 200 + "]" * 200,
    '"\\ud800"',
    "2026-12-01",
    "!!set {a}",
    "'\x00'",
    "[1, [2]]",
]


def hostile_yaml(draw, seed: str) -> str:
    how = draw(st.sampled_from(["value", "value", "value", "cut", "line", "indent"]))
    if how == "value":
        spots = list(SCALAR.finditer(seed))
        m = spots[draw(st.integers(0, len(spots) - 1))]
        return seed[: m.start()] + draw(st.sampled_from(HOSTILE_YAML)) + seed[m.end() :]
    if how == "cut":
        return seed[: draw(st.integers(0, len(seed) - 1))]
    lines = seed.splitlines(keepends=True)
    i = draw(st.integers(0, len(lines) - 1))
    if how == "line":
        return "".join(
            lines[:i]
            + [
                draw(
                    st.sampled_from(
                        ["%YAML 9.9\n", "---\n", "...\n", "\t\n", "a: b: c\n", "? [x]\n"]
                    )
                )
            ]
            + lines[i:]
        )
    return "".join(lines[:i] + ["  " + lines[i]] + lines[i + 1 :])


def experiments_with_params(model, tmp_path, params) -> list[str]:
    """`sdq experiments` on the io suite with `params` as its parameter file."""
    out = str(tmp_path / "out")
    return ["experiments", "--suite", "io", "--model", str(model), "--out", out, "--params", params]


def test_hostile_parameter_files(tmp_path, capsys, tiny_model):
    from sdq.errors import ParamsError
    from sdq.lab.params import load_params

    seed = (REPO / "params" / "smoke.yaml").read_text()
    path = tmp_path / "fuzzed.yaml"

    @settings(
        max_examples=25,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def fuzz(data):
        text = data.draw(st.composite(lambda draw: hostile_yaml(draw, seed))())
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            load_params(path, root=REPO)
        except ParamsError as exc:
            assert "\n" not in str(exc)
        # the same file as the sweep's settings
        check(
            experiments_with_params(tiny_model, tmp_path, str(path)),
            capsys,
            tmp_path,
        )

    fuzz()


def test_parameter_files_that_are_not_yaml_text(tmp_path, capsys, tiny_model):
    from sdq.errors import ParamsError
    from sdq.lab.params import load_params

    for name, data in (
        ("noise.yaml", os.urandom(512)),
        ("latin1.yaml", b"model: caf\xe9\n"),
        ("list.yaml", b"- 1\n- 2\n"),
        ("empty.yaml", b""),
    ):
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(ParamsError) as exc:
            load_params(path, root=REPO)
        assert "\n" not in str(exc.value)
        check(
            experiments_with_params(tiny_model, tmp_path, str(path)),
            capsys,
            tmp_path,
        )
    for params in ("/dev/zero", str(tmp_path)):
        check(
            experiments_with_params(tiny_model, tmp_path, params),
            capsys,
            tmp_path,
        )


def test_a_failed_run_leaves_the_route_log_path_as_it_was(files, tmp_path, capsys):
    """The route log is written beside its path and renamed over it only when the run ends
    well: a run that dies (here: stopped at its first generation step) changes nothing."""
    log = tmp_path / "routes.jsonl"
    log.write_text("the previous log\n")
    argv = ["chat", "-m", files["model"], "-p", "hi", *BUDGET, "--route-log", str(log)]
    with pytest.raises(Accepted), work_stopped():
        main(argv)
    capsys.readouterr()
    assert log.read_text() == "the previous log\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["routes.jsonl"]
