"""``portable-guided generate`` in-process (the session's model is reused)."""

from __future__ import annotations

import json

import pytest

from portable_guided.cli import main

pytestmark = [pytest.mark.model, pytest.mark.xgrammar, pytest.mark.torch]


def test_bundled_example_prints_valid_json(torch_runner, capsys):
    import jsonschema

    from portable_guided.cli.generate import EXAMPLE_SCHEMA

    code = main(["generate", "--no-progress", "--max-tokens", "96", "--compact"])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.strip().splitlines()
    assert lines[0].startswith("[0] valid (json,")
    with open(EXAMPLE_SCHEMA) as f:
        jsonschema.validate(json.loads(lines[1]), json.load(f))
    assert "1 outputs, 1 valid" in lines[-1] and "tok/s" in lines[-1]


def test_regex_batch(torch_runner, capsys):
    code = main(["generate", "--no-progress", "--regex", "[0-9]{3}-[0-9]{4}",
                 "--prompt", "Give me a phone number.", "--batch", "2", "--max-tokens", "16",
                 "--temperature", "0.8", "--seed", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("valid (regex") == 2


@pytest.mark.paddle
def test_choice_on_the_paddle_runner(capsys):
    pytest.importorskip("paddle")
    code = main(["generate", "--no-progress", "--choice", "yes,no", "--prompt", "Is fire hot?",
                 "--framework", "paddle", "--max-tokens", "4"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.splitlines()[1] in ("yes", "no")


def test_bad_choice_is_rejected(capsys):
    assert main(["generate", "--choice", ",", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--choice needs at least one alternative" in err and "Traceback" not in err
