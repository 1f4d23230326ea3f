"""What the entry points share: the --config flag and clean errors instead of deep tracebacks."""
from __future__ import annotations

import ast
import os
import sys
from typing import Callable

import ml_collections
from absl import flags

import posenc
from corpora import DataError
from experiment.config import ConfigError
from experiment.runtime.start import start_runtime


flags.DEFINE_string("coordinator_address", None, "several processes as one job: HOST:PORT of process 0 "
                    "(found automatically on TPU pods and under SLURM; experiment/runtime/distributed.py)")
flags.DEFINE_integer("num_processes", None, "several processes as one job: how many")
flags.DEFINE_integer("process_id", None, "several processes as one job: this one's index, 0 .. num_processes-1")


def run_cleanly(fn: Callable[[], object]) -> None:
    """Run `fn`; a known user error prints one line and exits 2 (LX_TRACEBACK=1 shows the traceback)."""
    f = flags.FLAGS
    try:
        start_runtime(*((f.coordinator_address, f.num_processes, f.process_id) if f.is_parsed() else ()))
        fn()
    except (ConfigError, DataError, posenc.LengthError, ValueError, FileNotFoundError, KeyError) as e:
        if os.environ.get("LX_TRACEBACK"):
            raise
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"error: {msg}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted; checkpoint saved where training was running: rerun the same command to resume",
              file=sys.stderr)
        sys.exit(130)


def overrides_from_flags(values: list[str]) -> dict[str, str]:
    """`--set KEY=VALUE` flags (eval_extrapolate.py, export_hf.py) as {KEY: VALUE}."""
    bad = [v for v in values if "=" not in v]
    if bad:
        raise ValueError(f"--set takes KEY=VALUE, got {bad[0]!r}")
    return dict(v.split("=", 1) for v in values)


def check_scheme_options(argv: list[str], posenc_blocks: list) -> None:
    """Every --config.posenc.<scheme>.<option> in `argv` must act on one of the runs (a `posenc`
    block each): an option of a scheme no run uses would be recorded in config.json and ignored."""
    for a in argv:
        if not a.startswith("--config.posenc.") or a.startswith("--config.posenc.name"):
            continue
        dotted = a[len("--config."):].split("=", 1)[0]
        errors = []
        for block in posenc_blocks:
            try:
                posenc.check_option_key(block, dotted)
                break
            except ValueError as e:
                errors.append(str(e))
        else:
            raise ValueError(errors[0])


def _last_line(message: str) -> str:
    """A message that embeds a traceback (ml_collections wraps errors of get_config so) -> its last line."""
    if "Traceback (most recent call last)" not in message:
        return message
    return [line for line in message.splitlines() if line.strip()][-1]


def _config_arg(argv: list[str]) -> str | None:
    for i, a in enumerate(argv):
        if a.startswith("--config="):
            return a.split("=", 1)[1]
        if a == "--config" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _load_config(argv: list[str]) -> ml_collections.ConfigDict | None:
    """The config that --config names (its get_config(arg)), or None where it cannot be loaded."""
    spec = _config_arg(argv)
    if not spec:
        return None
    import importlib.util
    path, _, arg = spec.partition(":")
    try:
        module_spec = importlib.util.spec_from_file_location("_config_for_check", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return module.get_config(arg) if arg else module.get_config()
    except Exception:
        return None


def _unknown_override(argv: list[str]) -> str | None:
    """Name the first --config.a.b override whose key the config file does not define."""
    config = _load_config(argv)
    if config is None:
        return None
    names = [a.split("=", 1)[1] for a in argv if a.startswith("--config.posenc.name=")]
    if names:
        config.posenc.name = names[-1]
    for a in argv:
        if not a.startswith("--config."):
            continue
        dotted = a[len("--config."):].split("=", 1)[0]
        try:
            posenc.check_option_key(config.posenc, dotted)
        except ValueError as e:
            return str(e)
        node, walked = config, []
        for part in dotted.split("."):
            keys = list(node.keys()) if hasattr(node, "keys") else []
            if part not in keys:
                where = ".".join(walked) or "the top level"
                return (f"unknown config key {dotted!r} (in {a}); valid keys at {where}: "
                        f"{', '.join(sorted(keys)) or 'none'}")
            node, walked = node[part], walked + [part]
    return None


class _OverrideError(ValueError):
    """A --config override ml_collections would refuse obscurely, or accept as values the run cannot use."""


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number_tuple(key: str, text: str) -> str:
    """`a,b`, `(a,b)`, `[a,b]` or `()` as the tuple literal ml_collections parses, ints kept ints."""
    inner = text.strip()
    if inner[:1] + inner[-1:] in ("()", "[]"):
        inner = inner[1:-1]
    values = []
    for item in filter(None, (s.strip() for s in inner.split(","))):
        try:
            value = ast.literal_eval(item)
        except (ValueError, SyntaxError):
            value = None
        if not _is_number(value):
            raise _OverrideError(f"--config.{key}={text}: {item!r} is not a number; give numbers separated "
                                 f"by commas (--config.{key}=1,2) or () for none")
        values.append(value)
    return repr(tuple(values))


def _tuple_overrides(argv: list[str]) -> list[str]:
    """`argv` with each override of a sequence of numbers in the config (eval.lengths, ...) checked and
    written as a tuple literal: a bad element fails here, naming the key, not as a string deep in a
    run. ml_collections overrides tuples, never lists: a list-valued key is refused, naming it."""
    config = _load_config(argv) if any(a.startswith("--config.") for a in argv) else None
    if config is None:
        return argv
    out = list(argv)
    for i, a in enumerate(argv):
        if not a.startswith("--config."):
            continue
        key, eq, text = a[len("--config."):].partition("=")
        if not eq and i + 1 == len(argv):
            continue
        node = config
        for part in key.split("."):
            node = node[part] if hasattr(node, "keys") and part in node.keys() else None
        if isinstance(node, list):
            raise _OverrideError(f"config key {key!r} holds a list, which --config.{key} cannot override: "
                                 f"make it a tuple in {_config_arg(argv).partition(':')[0]}")
        if not isinstance(node, tuple) or not all(_is_number(v) for v in node):
            continue
        if eq:
            out[i] = f"--config.{key}={_number_tuple(key, text)}"
        else:
            out[i + 1] = _number_tuple(key, argv[i + 1])
    return out


def _dotted(node, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(node.keys()):
        value = node[key]
        if hasattr(value, "keys"):
            out += _dotted(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}={value!r}")
    return out


def help_text(argv: list[str], flag_values: flags.FlagValues) -> str:
    """--help: what the entry point does, its flags, the config keys --config.KEY=VALUE can set (of
    the --config given, or configs/demo.py) and the registered positional schemes."""
    main_doc = (sys.modules["__main__"].__doc__ or "").strip()
    config = _load_config(argv) or _load_config(["--config=configs/demo.py"])
    parts = [main_doc, "flags:\n" + flag_values.main_module_help()]
    if config is not None and "config" in flag_values:
        keys = [k for k in _dotted(config) if not k.startswith("posenc.") or k.startswith("posenc.name")]
        parts.append("config keys (--config.KEY=VALUE; scheme options as --config.posenc.SCHEME.OPTION):\n  "
                     + "\n  ".join(keys))
    parts.append("positional schemes (--config.posenc.name or configs/demo.py:SCHEME):\n  "
                 + ", ".join(posenc.names()))
    return "\n\n".join(p for p in parts if p) + "\n"


def parse_flags(argv: list[str], flag_values: flags.FlagValues | None = None) -> list[str]:
    """absl flag parsing with one-line errors (unknown config key, missing config file, bad value).
    `flag_values`: absl's global FLAGS unless given (tests parse into their own)."""
    if any(a in ("--help", "-h", "--helpshort", "-?") for a in argv[1:]):
        print(help_text(argv, flags.FLAGS if flag_values is None else flag_values))
        sys.exit(0)
    spec = _config_arg(argv)
    if spec and not os.path.isfile(spec.partition(":")[0]):
        print(f"error: config file {spec.partition(':')[0]!r} not found (configs live in configs/, "
              f"e.g. --config configs/demo.py)", file=sys.stderr)
        sys.exit(2)
    try:
        return (flags.FLAGS if flag_values is None else flag_values)(_tuple_overrides(argv))
    except Exception as e:  # noqa: BLE001 - every parsing error becomes one readable line
        if os.environ.get("LX_TRACEBACK"):
            raise
        if isinstance(e, _OverrideError):
            message = str(e)
        else:
            message = _unknown_override(argv) or _last_line(f"{type(e).__name__}: {e}")
        print(f"error: {message}\nusage: python {os.path.basename(argv[0])} --helpfull for every flag",
              file=sys.stderr)
        sys.exit(2)
