"""What the entry points share: the --config flag, flags whose values are checked against their
domains as they are parsed (`define_numbers`, posenc/domains.py), clean errors instead of deep
tracebacks, and Ctrl-C (experiment/runtime/interrupts.py) for the whole command."""
from __future__ import annotations

import ast
import contextlib
import errno
import importlib.util
import os
import re
import sys
from typing import Callable

import ml_collections
from absl import flags

import posenc
from corpora import DataError
from experiment import config as config_lib
from experiment.config import ConfigError
from experiment.runtime import interrupts
from experiment.runtime.start import start_runtime
from experiment.store.files import NoSpace, out_of_space
from posenc.domains import Domain


flags.DEFINE_string("coordinator_address", None, "several processes as one job: HOST:PORT of process 0 "
                    "(found automatically on TPU pods and under SLURM; experiment/runtime/distributed.py)")
flags.DEFINE_integer("num_processes", None, "several processes as one job: how many")
flags.DEFINE_integer("process_id", None, "several processes as one job: this one's index, 0 .. num_processes-1")


# Errors of the file system that are the user's to fix (a read-only or full disk), not the code's.
USER_OS_ERRORS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT)


def run_cleanly(fn: Callable[[], object], *, at_once: str | None = None, second: str | None = None) -> None:
    """Run `fn`; a known user error prints one line and exits 2 (LX_TRACEBACK=1 shows the traceback).
    Ctrl-C (or SIGTERM), at any moment, stops at the next safe point and exits 130 (143) with a line
    that says what is saved (experiment/runtime/interrupts.py); `at_once`: fn has no safe points and
    stopping it anywhere is harmless (it writes whole files, or a folder moved in at the end), so
    Ctrl-C stops it at once, and this line says what is left; `second`: what a second Ctrl-C (which
    stops at once) leaves, where the default (files as a kill leaves them) does not fit the command."""
    f = flags.FLAGS
    with interrupts.deferred(exit_on_second=True, **({"second": second} if second else {})):
        try:
            start_runtime(*((f.coordinator_address, f.num_processes, f.process_id) if f.is_parsed() else ()))
            interrupts.check("interrupted during start-up; nothing was written")
            with interrupts.immediate(at_once) if at_once else contextlib.nullcontext():
                fn()
            interrupts.check("interrupted as the command finished; everything it does was done and saved")
        except interrupts.Interrupted as e:  # Ctrl-C (rc 130) or SIGTERM (rc 143)
            _stop(interrupts.exit_code(), e.saved if e.saved.startswith("interrupted") else f"interrupted: {e.saved}")
        except KeyboardInterrupt:
            _stop(interrupts.exit_code(), "interrupted; what was written before is kept (every file is replaced whole)")
        except Exception as e:  # noqa: BLE001 - the user's errors are one line; the code's keep their traceback
            if os.environ.get("LX_TRACEBACK"):
                raise
            full = out_of_space(e)
            if full is not None:  # whatever library was writing
                _stop(2, f"error: {full if isinstance(full, NoSpace) else NoSpace(full.filename or 'a file')}")
            if isinstance(e, (ConfigError, DataError, posenc.LengthError, ValueError, FileNotFoundError, KeyError)):
                _stop(2, f"error: {e.args[0] if isinstance(e, KeyError) and e.args else e}")
            if isinstance(e, OSError) and e.errno in USER_OS_ERRORS:
                _stop(2, f"error: cannot write {e.filename or 'a file'} ({e.strerror})")
            raise


def _stop(code: int, message: str) -> None:
    print(message, file=sys.stderr)
    sys.stderr.flush()
    sys.exit(code)


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


class _DomainParser(flags.ArgumentParser):
    """A flag's value (or, with `sequence`, its comma-separated values) as numbers of `kind` in
    `domain` (posenc/domains.py): absl reports a bad one as `flag --NAME=VALUE: ...` before any work."""

    def __init__(self, kind: type, domain: Domain, example: str, sequence: bool):
        self.kind, self.domain, self.example, self.sequence = kind, domain, example, sequence

    def flag_type(self) -> str:
        return f"{'comma-separated ' if self.sequence else ''}{self.kind.__name__}"

    def parse(self, argument):
        if not isinstance(argument, str):
            return argument
        items = [a.strip() for a in argument.split(",") if a.strip()] if self.sequence else [argument.strip()]
        values = []
        for item in items:
            try:
                value = ast.literal_eval(item)
            except (ValueError, SyntaxError):
                value = None
            if isinstance(value, int) and not isinstance(value, bool) and self.kind is float:
                value = float(value)
            if not isinstance(value, self.kind) or isinstance(value, bool) or not self.domain.test(value, {}):
                what = "a whole number" if self.kind is int else "a number"
                raise ValueError(f"{item!r} is not {what} {self.domain.describe({})} (e.g. {self.example})")
            values.append(value)
        return values if self.sequence else values[0]


flags.disclaim_key_flags()  # flags defined below by define_numbers belong to the entry point that calls it (--help)


def define_numbers(name: str, default, help_text: str, *, kind: type = int, domain: Domain, example: str,
                   sequence: bool = True, flag_values: flags.FlagValues | None = None) -> None:
    """An absl flag of numbers checked against `domain` as it is parsed (a list, comma-separated,
    unless `sequence` is False). `flag_values`: absl's global FLAGS unless given."""
    serializer = flags.CsvListSerializer(",") if sequence else flags.ArgumentSerializer()
    flags.DEFINE(_DomainParser(kind, domain, example, sequence), name, default, help_text, serializer=serializer,
                 flag_values=flags.FLAGS if flag_values is None else flag_values)


def _last_line(message: str) -> str:
    """A message that embeds a traceback (ml_collections wraps errors of get_config so) -> its last
    line, without the class name of an error whose message is written to be read alone."""
    if "Traceback (most recent call last)" not in message:
        return message
    last = [line for line in message.splitlines() if line.strip()][-1]
    return re.sub(r"^(?:[\w.]+\.)?(?:ConfigError|DataError|RunError|DomainError): ", "", last)


def _config_arg(argv: list[str]) -> str | None:
    for i, a in enumerate(argv):
        if a.startswith("--config="):
            return a.split("=", 1)[1]
        if a == "--config" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def config_file(spec: str):
    """The module of a --config file (`path[:arg]`), loaded from its path: what a config file gives
    beside get_config (a table's rows: configs/all_schemes.py's get_table, read by sweep.py --table)."""
    module_spec = importlib.util.spec_from_file_location("_config_file", spec.partition(":")[0])
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _load_config(argv: list[str]) -> ml_collections.ConfigDict | None:
    """The config that --config names (its get_config(arg)), or None where it cannot be loaded."""
    spec = _config_arg(argv)
    if not spec:
        return None
    arg = spec.partition(":")[2]
    try:
        module = config_file(spec)
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


def _checked_overrides(argv: list[str]) -> list[str]:
    """`argv` with each override of a number or true / false checked against the option's type, and
    each of a sequence of numbers (eval.lengths, ...) checked and written as a tuple literal: a bad
    value fails here, naming the key, not as a string deep in a run (its domain is checked with the
    whole config). ml_collections overrides tuples, never lists: a list-valued key is refused.
    A key given twice takes its last value, as every other key does (ml_collections would join the
    two tuples: --config.eval.lengths=64,128 --config.eval.lengths=256 gave 64, 128, 256)."""
    config = _load_config(argv) if any(a.startswith("--config.") for a in argv) else None
    if config is None:
        return argv
    _check_config_type(config, _config_arg(argv))  # before ml_collections tries the overrides on it
    out = list(argv)
    seen: dict[str, list[int]] = {}  # tuple key -> the argv indices of each of its overrides
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
        if isinstance(node, (bool, int, float)) and (eq or not isinstance(node, bool)):
            value = text if eq else argv[i + 1]
            try:  # the option's type, named (ml_collections would say "invalid literal for int()")
                config_lib.converted(node, value, f"--config.{key}={value}")
            except ValueError as e:
                raise _OverrideError(str(e)) from None
            continue
        if not isinstance(node, tuple) or not all(_is_number(v) for v in node):
            continue
        if eq:
            out[i] = f"--config.{key}={_number_tuple(key, text)}"
        else:
            out[i + 1] = _number_tuple(key, argv[i + 1])
        seen.setdefault(key, []).append(i)
    dropped = set()
    for indices in seen.values():
        for i in indices[:-1]:  # an override of a key given again later
            dropped.update((i, i + 1) if "=" not in argv[i] else (i,))  # (with its value, if given apart)
    return [a for j, a in enumerate(out) if j not in dropped]


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


def _check_config_type(config, spec: str | None) -> None:
    """What --config's get_config returned must be a ConfigDict (one line naming the file otherwise)."""
    if not isinstance(config, ml_collections.ConfigDict):
        where = f"{spec.partition(':')[0]}: get_config()" if spec else "the config"
        raise ConfigError(f"{where} returned a {type(config).__name__}; return an ml_collections.ConfigDict "
                          f"(start from experiment.config.defaults(scheme)), which --config.KEY=VALUE can override")


def _check_config_object(config, spec: str | None) -> None:
    """What --config's get_config returned must be a ConfigDict of the config's sections (one
    line naming the file otherwise, not a traceback from the first use of a missing section)."""
    where = f"{spec.partition(':')[0]}: get_config()" if spec else "the config"
    _check_config_type(config, spec)
    try:
        config_lib.typed(config)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


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
    flag_values = flags.FLAGS if flag_values is None else flag_values
    try:
        rest = flag_values(_checked_overrides(argv))
        if "config" in flag_values and flag_values["config"].value is not None:
            _check_config_object(flag_values["config"].value, spec)
        return rest
    except Exception as e:  # noqa: BLE001 - every parsing error becomes one readable line
        if os.environ.get("LX_TRACEBACK"):
            raise
        if isinstance(e, (_OverrideError, ConfigError)):
            message = str(e)
        elif isinstance(e, flags.IllegalFlagValueError):
            message = _last_line(str(e))
        else:
            message = _unknown_override(argv) or _last_line(f"{type(e).__name__}: {e}")
        print(f"error: {message}\nusage: python {os.path.basename(argv[0])} --helpfull for every flag",
              file=sys.stderr)
        sys.exit(2)
