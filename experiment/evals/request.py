"""One request of several evaluation kinds (eval_extrapolate.py: any of perplexity, passkey,
attention), checked as a whole before any of them runs: a bad passkey depth or --set value is
refused before the perplexity evaluation, not after it."""
from __future__ import annotations

import dataclasses
import pathlib

from experiment.evals.common import apply_overrides, eval_spec
from experiment.evals.passkey import PasskeySpec, checked_spec
from experiment.store.run import RunDir

KINDS = ("perplexity", "passkey", "attention")


@dataclasses.dataclass(frozen=True)
class Request:
    """What to evaluate; every field left None comes from the run's config.eval."""
    kinds: tuple[str, ...]
    lengths: tuple[int, ...] | None = None
    stride: int | None = None
    split: str | None = None
    max_tokens: int | None = None
    overrides: dict = dataclasses.field(default_factory=dict)
    passkey: PasskeySpec = PasskeySpec()
    attention_windows: int = 8


def check_request(workdir: str | pathlib.Path, request: Request) -> None:
    """Raise unless every kind of `request` can start: the run and its checkpoint, the lengths,
    stride, split and token limit, the overrides, the passkey task (its depths, digits, and
    lengths long enough for it). A length the scheme cannot encode is reported by each kind."""
    unknown = [k for k in request.kinds if k not in KINDS]
    if unknown or not request.kinds:
        raise ValueError(f"evaluation kinds are {', '.join(KINDS)}; got {list(request.kinds) or 'none'}")
    run = RunDir(workdir)
    run.require_checkpoint()
    config = run.load_config()
    spec = eval_spec(config, request.lengths, request.stride, request.split, request.max_tokens, request.overrides)
    apply_overrides(config, spec.overrides)
    if "passkey" in request.kinds:
        checked_spec(run, config, list(spec.lengths), request.passkey, spec.overrides)
    if "attention" in request.kinds and request.attention_windows < 1:
        raise ValueError(f"--attention_windows must be >= 1, got {request.attention_windows}")
