"""``portable-guided doctor`` checks every implementation here and reports it."""

import importlib.util
import json

import pytest

from portable_guided.cli import main
from portable_guided.cli.doctor import run_checks
from tests.support import frameworks


def test_every_implementation_passes_its_self_check():
    checks = run_checks(batch=2, vocab=1_000)
    assert {c.framework for c in checks} == set(frameworks())
    failed = [(c.framework, c.device, c.forced, c.detail) for c in checks if not c.ok]
    assert failed == []
    cpu = [c for c in checks if c.device == "cpu" and c.forced is None]
    assert {c.platform for c in cpu} == {"cpu"}


def test_command_prints_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "doctor.json"
    assert main(["doctor", "--batch", "2", "--vocab", "640", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "implementations match the reference" in text
    report = json.loads(out.read_text())
    assert report["packages"]["numpy"]
    assert all(c["ok"] for c in report["checks"])
    assert f"cpu kernel: {report['cpu_kernel']}" in text


def test_cpu_kernel_line_names_the_kernel_in_use(monkeypatch):
    from portable_guided.kernels import compiled

    monkeypatch.setenv(compiled.KERNEL_ENV_VAR, "numpy")
    assert compiled.describe() == "NumPy (PORTABLE_GUIDED_CPU_KERNEL=numpy)"
    monkeypatch.delenv(compiled.KERNEL_ENV_VAR)
    if importlib.util.find_spec("portable_guided.kernels._cpu_mask") is None:
        assert compiled.describe().startswith("NumPy (the compiled kernel was not built")
        return
    pytest.importorskip("torch")  # loads its OpenMP runtime (libgomp on Linux wheels)
    assert compiled.describe().startswith("compiled (joins the ")
