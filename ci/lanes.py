"""Lane declarations: load and validate ``platforms/*.toml``, probe for hardware.

Standard library only, so the matrix runner works on a bare Python before any venv exists.
"""

from __future__ import annotations

import glob
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["Lane", "LaneError", "load_lane", "load_lanes", "probe_hardware"]

REPO_ROOT = Path(__file__).resolve().parent.parent
PLATFORMS_DIR = REPO_ROOT / "platforms"

# Allowed keys per table; anything else is a typo we want to hear about.
_SCHEMA: dict[str, set[str]] = {
    "": {"name", "summary", "needs_hardware", "install", "env", "tests", "probe", "github"},
    "install": {"constraints", "steps", "extras", "disk_gb", "one_wheel_at_a_time", "uninstall"},
    "tests": {"paths", "markers", "keywords", "timeout_minutes"},
    "probe": {"any_path", "any_command", "hint"},
    "github": {"runs_on", "free_disk"},
}


class LaneError(ValueError):
    """A platform file that does not follow the schema in ``platforms/README.md``."""


@dataclass(frozen=True)
class Lane:
    """One CI lane, as declared by ``platforms/<name>.toml``."""

    name: str
    summary: str
    needs_hardware: bool
    constraints: tuple[str, ...]
    steps: tuple[tuple[str, ...], ...]
    extras: tuple[str, ...]
    env: dict[str, str]
    test_paths: tuple[str, ...]
    markers: str
    keywords: str
    timeout_minutes: float
    runs_on: tuple[str, ...]
    probe_paths: tuple[str, ...] = ()
    probe_commands: tuple[tuple[str, ...], ...] = ()
    probe_hint: str = ""
    disk_gb: float = 0.0
    one_wheel_at_a_time: bool = False
    uninstall: tuple[str, ...] = ()
    free_disk: bool = False
    source: Path = field(default=Path(), compare=False)

    @property
    def venv(self) -> Path:
        """The lane's virtual environment, ``.venv-<name>/`` in the repository root."""
        return REPO_ROOT / f".venv-{self.name}"

    @property
    def self_hosted(self) -> bool:
        """Whether the lane needs a self-hosted GitHub runner."""
        return "self-hosted" in self.runs_on


def _bool(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise LaneError(f"{where} must be true or false, got {value!r}")
    return value


def _str_list(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise LaneError(f"{where} must be a list of strings, got {value!r}")
    return tuple(value)


def load_lane(path: Path) -> Lane:
    """Parse and validate one platform file; raises :class:`LaneError` naming the problem."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise LaneError(f"{path.name}: {exc}") from exc
    for table, allowed in _SCHEMA.items():
        section = data if table == "" else data.get(table, {})
        if not isinstance(section, dict):
            raise LaneError(f"{path.name}: [{table}] must be a table, got {section!r}")
        unknown = set(section) - allowed
        if unknown:
            raise LaneError(f"{path.name}: unknown key(s) {sorted(unknown)} in [{table or 'top'}]")
    for key in ("name", "summary", "needs_hardware", "install", "tests", "github"):
        if key not in data:
            raise LaneError(f"{path.name}: missing required key {key!r}")
    if data["name"] != path.stem:
        raise LaneError(f"{path.name}: name {data['name']!r} must equal the file name {path.stem!r}")
    if not isinstance(data["needs_hardware"], bool):
        raise LaneError(f"{path.name}: needs_hardware must be true or false, got {data['needs_hardware']!r}")
    install, tests, probe = data["install"], data["tests"], data.get("probe", {})
    if data["needs_hardware"] and not (probe.get("any_path") or probe.get("any_command")):
        raise LaneError(f"{path.name}: needs_hardware = true but [probe] has no any_path/any_command")
    env = data.get("env", {})
    if not all(isinstance(v, str) for v in env.values()):
        raise LaneError(f"{path.name}: [env] values must be strings, got {env!r}")
    steps = install.get("steps", [])
    if not isinstance(steps, list):
        raise LaneError(f"{path.name}: install.steps must be a list of lists, got {steps!r}")
    disk_gb = install.get("disk_gb", 0)
    if isinstance(disk_gb, bool) or not isinstance(disk_gb, (int, float)) or disk_gb < 0:
        raise LaneError(f"{path.name}: install.disk_gb must be a number >= 0, got {disk_gb!r}")
    one_wheel = install.get("one_wheel_at_a_time", False)
    if not isinstance(one_wheel, bool):
        raise LaneError(f"{path.name}: install.one_wheel_at_a_time must be true or false, got {one_wheel!r}")
    timeout = tests.get("timeout_minutes", 30)
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise LaneError(f"{path.name}: tests.timeout_minutes must be positive, got {timeout!r}")
    markers, keywords = tests.get("markers", ""), tests.get("keywords", "")
    if not isinstance(markers, str) or not isinstance(keywords, str):
        raise LaneError(f"{path.name}: tests.markers and tests.keywords must be strings, "
                        f"got {markers!r} and {keywords!r}")
    return Lane(
        name=data["name"],
        summary=str(data["summary"]),
        needs_hardware=data["needs_hardware"],
        constraints=_str_list(install.get("constraints", []), f"{path.name}: install.constraints"),
        steps=tuple(_str_list(s, f"{path.name}: install.steps item") for s in steps),
        extras=_str_list(install.get("extras", []), f"{path.name}: install.extras"),
        env=dict(env),
        test_paths=_str_list(tests.get("paths", ["tests"]), f"{path.name}: tests.paths"),
        markers=markers,
        keywords=keywords,
        timeout_minutes=float(timeout),
        runs_on=_str_list(data["github"].get("runs_on", []), f"{path.name}: github.runs_on"),
        free_disk=_bool(data["github"].get("free_disk", False), f"{path.name}: github.free_disk"),
        probe_paths=_str_list(probe.get("any_path", []), f"{path.name}: probe.any_path"),
        probe_commands=tuple(
            _str_list(c, f"{path.name}: probe.any_command item") for c in probe.get("any_command", [])
        ),
        probe_hint=str(probe.get("hint", "")),
        disk_gb=float(disk_gb),
        one_wheel_at_a_time=one_wheel,
        uninstall=_str_list(install.get("uninstall", []), f"{path.name}: install.uninstall"),
        source=path,
    )


def load_lanes(directory: Path = PLATFORMS_DIR) -> dict[str, Lane]:
    """Every lane declared in ``directory``, by name, in file-name order."""
    paths = sorted(directory.glob("*.toml"))
    if not paths:
        raise LaneError(f"no platform files (*.toml) in {directory}")
    return {lane.name: lane for lane in map(load_lane, paths)}


def probe_hardware(lane: Lane) -> tuple[bool, str]:
    """Whether this machine has the lane's hardware, and what was found or why not.

    A lane with ``needs_hardware = false`` always runs. Otherwise the device is present if one
    ``any_path`` glob matches or one ``any_command`` exits 0 within 20 seconds.
    """
    if not lane.needs_hardware:
        return True, "runs without the hardware"
    for pattern in lane.probe_paths:
        found = glob.glob(pattern)
        if found:
            return True, f"found {found[0]}"
    for command in lane.probe_commands:
        if shutil.which(command[0]) is None:
            continue
        try:
            done = subprocess.run(command, capture_output=True, timeout=20, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return True, f"`{' '.join(command)}` succeeded"
    return False, lane.probe_hint or f"no {lane.name} hardware found"
