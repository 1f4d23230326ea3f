"""What the entry points share: the --config flag and clean errors instead of deep tracebacks."""
from __future__ import annotations

import logging
import os
import sys
from typing import Callable

import posenc
from corpora import DataError
from experiment.host_memory import keep_freed_host_memory
from experiment.training import ConfigError


def run_cleanly(fn: Callable[[], object]) -> None:
    """Run `fn`; a known user error prints one line and exits 2 (LX_TRACEBACK=1 shows the traceback)."""
    keep_freed_host_memory()  # before JAX starts its threads (experiment/host_memory.py)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    for noisy in ("absl", "orbax", "jax", "datasets", "fsspec"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
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


def _config_arg(argv: list[str]) -> str | None:
    for i, a in enumerate(argv):
        if a.startswith("--config="):
            return a.split("=", 1)[1]
        if a == "--config" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _unknown_override(argv: list[str]) -> str | None:
    """Name the first --config.a.b override whose key the config file does not define."""
    spec = _config_arg(argv)
    if not spec:
        return None
    import importlib.util
    path, _, arg = spec.partition(":")
    try:
        module_spec = importlib.util.spec_from_file_location("_config_for_check", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        config = module.get_config(arg) if arg else module.get_config()
    except Exception:
        return None
    for a in argv:
        if not a.startswith("--config."):
            continue
        dotted = a[len("--config."):].split("=", 1)[0]
        node, walked = config, []
        for part in dotted.split("."):
            keys = list(node.keys()) if hasattr(node, "keys") else []
            if part not in keys:
                where = ".".join(walked) or "the top level"
                return (f"unknown config key {dotted!r} (in {a}); valid keys at {where}: "
                        f"{', '.join(sorted(keys)) or 'none'}")
            node, walked = node[part], walked + [part]
    return None


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing with one-line errors (unknown config key, missing config file, bad value)."""
    from absl import flags
    spec = _config_arg(argv)
    if spec and not os.path.isfile(spec.partition(":")[0]):
        print(f"error: config file {spec.partition(':')[0]!r} not found (configs live in configs/, "
              f"e.g. --config configs/demo.py)", file=sys.stderr)
        sys.exit(2)
    try:
        return flags.FLAGS(argv)
    except Exception as e:  # noqa: BLE001 - every parsing error becomes one readable line
        if os.environ.get("LX_TRACEBACK"):
            raise
        message = _unknown_override(argv) or f"{type(e).__name__}: {e}"
        print(f"error: {message}\nusage: python {os.path.basename(argv[0])} --helpfull for every flag",
              file=sys.stderr)
        sys.exit(2)
