"""What one self-check run measures (`Plan`, from selfcheck.py's flags: `make_plan`), with each
flag's domain, so that a bad value is refused naming the flag (experiment/selfcheck/check.py runs it)."""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax

from experiment.runtime.accelerator import device_memory_limit
from posenc.domains import at_least


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one run measures. `model`: ModelConfig options of the timed decoder (its heads and head
    dimension also shape the attention inputs); `step_tokens`: tokens per timed step (rows =
    step_tokens // length, at least 1); `memory_limit`: bytes a compiled program may plan."""
    mode: str
    schemes: tuple
    lengths: tuple
    dtype: str
    model: dict
    step_tokens: int
    repeats: int
    interpreter_max_length: int
    timed_max_length: int  # longer sequences: errors only (0: time every length)
    memory_limit: int
    minutes: float = 10.0  # no cell is started that would end past this (0: every cell)

    @property
    def head_dim(self) -> int:
        return self.model["d_model"] // self.model["num_heads"]


LENGTHS = at_least(1)  # selfcheck.py --lengths, each
MEMORY_GB = at_least(0, note="0 = the default: 90% of the device, a quarter of the available memory on CPU")
MINUTES = at_least(0, note="0 = no limit: every cell")


def _lengths(lengths: str | Sequence[int]) -> tuple[int, ...]:
    """--lengths as whole numbers >= 1 (comma-separated text, or a sequence); a ValueError names the flag."""
    items = [x.strip() for x in lengths.split(",") if x.strip()] if isinstance(lengths, str) else list(lengths)
    out = []
    for item in items:
        try:
            value = int(item) if isinstance(item, str) else item
        except ValueError:
            value = None
        if not isinstance(value, int) or isinstance(value, bool) or not LENGTHS.test(value, {}):
            raise ValueError(f"flag --lengths={lengths if isinstance(lengths, str) else ','.join(map(str, lengths))}: "
                             f"{str(item)!r} is not a whole number {LENGTHS.describe({})} (e.g. --lengths=512,4096)")
        out.append(value)
    return tuple(out)


SHAPES = {  # selfcheck.py --shape: the attention heads of the timed decoder, and the lengths measured
    "small": {},  # the full plan's own: 4 heads of 64
    "paper": dict(model=dict(num_layers=2, d_model=1024, num_heads=8, mlp_dim=4096, vocab_size=256),
                  lengths=(512, 4096, 16384)),  # the ALiBi paper's 8 heads of 128, L = 512 and evaluation
}


def make_plan(short: bool = False, schemes: str = "", lengths: str | Sequence[int] = "", dtype: str = "",
              memory_gb: float = 0.0, shape: str = "small", minutes: float = 10.0) -> Plan:
    """The full plan (up to 16k tokens; 16,384 tokens per timed step on an accelerator; on a CPU
    4,096, fewer repeats, and no timing beyond 4,096 tokens, where one training step takes minutes)
    or the short one (tiny, for CI's machine), with any of its lists or settings replaced. A length
    or memory limit outside its domain is a ValueError naming selfcheck.py's flag (a negative
    limit would skip every row and report a pass)."""
    if not MEMORY_GB.test(memory_gb, {}):
        raise ValueError(f"flag --memory_gb={memory_gb:g}: must be {MEMORY_GB.describe({})} (e.g. --memory_gb=8)")
    if not MINUTES.test(minutes, {}):
        raise ValueError(f"flag --minutes={minutes:g}: must be {MINUTES.describe({})} (e.g. --minutes=30)")
    lengths = _lengths(lengths)
    accelerator = jax.default_backend() in ("gpu", "tpu")
    if short:
        base = dict(mode="short", schemes=("alibi", "t5"), lengths=(24, 40), repeats=1, step_tokens=96,
                    interpreter_max_length=64, timed_max_length=0,
                    model=dict(num_layers=1, d_model=32, num_heads=2, mlp_dim=64, vocab_size=64, attention_block=16))
    else:
        base = dict(mode="full", schemes=("alibi", "rope", "t5", "kerple_log", "fire", "logn"),
                    lengths=(512, 1000, 4096, 16384), repeats=3 if accelerator else 2,
                    step_tokens=16384 if accelerator else 4096, interpreter_max_length=1024,
                    timed_max_length=0 if accelerator else 4096,
                    model=dict(num_layers=2, d_model=256, num_heads=4, mlp_dim=1024, vocab_size=256))
    if shape not in SHAPES:
        raise ValueError(f"flag --shape={shape}: one of {', '.join(SHAPES)}")
    if not short:
        base.update(SHAPES[shape])
    return Plan(schemes=tuple(schemes.split(",")) if schemes else base["schemes"],
                lengths=lengths or base["lengths"],
                dtype=dtype or ("bfloat16" if accelerator else "float32"),
                memory_limit=int(memory_gb * 2**30) if memory_gb else default_memory_limit(), minutes=float(minutes),
                **{k: v for k, v in base.items() if k not in ("schemes", "lengths")})


def default_memory_limit() -> int:
    """90% of the device's memory; on CPU a quarter of the memory available now (the machine may be
    shared, and a process takes more than the program XLA plans)."""
    limit = device_memory_limit()
    if limit:
        return int(limit * 0.9)
    try:
        with open("/proc/meminfo") as f:
            available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable"))
    except (OSError, StopIteration):
        available = 8 * 2**30
    return available // 4
