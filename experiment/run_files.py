"""What a run directory's own files must hold to be read (config.json, init_from.json, metrics.jsonl
lines); evaluation records are checked by experiment/records.py. Each check returns what is wrong
(None: nothing), and experiment/run.py refuses the file by name with the command that repairs it:
nothing reads a field it has not checked."""
from __future__ import annotations

import dataclasses
import json

from experiment import config as config_lib, records

_KIND = {bool: "true or false", int: "an integer", float: "a number", str: "a string", tuple: "a list"}


def config_problem(saved) -> str | None:
    """What makes a parsed config.json not a saved config (None: nothing found)."""
    if not isinstance(saved, dict):
        return f"it holds a JSON {records.json_type(saved)}, not an object"
    missing = [name for name in ("data", "model", "train", "posenc") if not isinstance(saved.get(name), dict)]
    if missing:
        return f"no {', '.join(missing)} section"
    if not isinstance(saved["posenc"].get("name"), str):
        return "posenc.name is not a scheme name"
    for name, cls in config_lib.SECTIONS.items():
        section = saved.get(name)
        for field in dataclasses.fields(cls) if isinstance(section, dict) else ():
            if field.default is dataclasses.MISSING:
                continue
            if field.name in section and not _same_type(section[field.name], field.default):
                return f"{name}.{field.name} = {section[field.name]!r} is not {_KIND.get(type(field.default), 'valid')}"
    return None


def _same_type(value, default) -> bool:
    """A saved value can stand where the default stands (an int for a float, a list for a tuple)."""
    if isinstance(default, bool) or default is None:
        return isinstance(value, bool) or default is None
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, tuple):
        return isinstance(value, (list, tuple))
    return isinstance(value, type(default))


def origin_problem(origin) -> str | None:
    if not isinstance(origin, dict):
        return f"it holds a JSON {records.json_type(origin)}, not an object"
    if not isinstance(origin.get("workdir"), str):
        return "no workdir"
    if not (isinstance(origin.get("step"), int) and not isinstance(origin.get("step"), bool)):
        return "no integer step"
    return None


def metrics_step(line: str) -> int | None:
    """The step of one metrics.jsonl line; None for a line that is not a JSON object with an integer step."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None
