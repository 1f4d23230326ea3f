"""Training-free context-extension methods of a RoPE model, by name: the eval-time options each sets
at an evaluation length, given the length the model was trained at (its window, L).

    eval_extrapolate.py --workdir W --methods direct,yarn,self_extend --lengths 8192,16384

evaluates the run once per method (and per set of options: a method whose factor follows the length
gets its own at each), every record carrying the method's name (`method`) so that report.py draws one
curve per method rather than one per option value. A name with `+logn` adds log-n scaling (the
`logn` wrapper around the run's scheme, posenc.name=logn) to the method: `yarn+logn`.

The settings are those of results/training_free/ (the survey's experiment), for L_valid = k L:
factors follow k (PI 1/k, NTK-aware alpha k, YaRN and Llama 3 scale k, Self-Extend group 2k);
windowed methods keep windows in proportion to L at every length (ReRoPE L/2; Self-Extend a
neighbour window of L/4; Dual Chunk Attention chunks of 3L/4 with a local window of L/16; LM-Infinite
10 sink tokens and a window of L; dynamic NTK its factor 2; dynamic YaRN its scale from each row's
length, the paper's training-free form). Where a method changes nothing (a factor
of 1 at k <= 1, dynamic NTK and LM-Infinite within the window, ReRoPE up to L/2, DCA up to one chunk)
it sets nothing: the model as trained, whose evaluation --methods then scores once for all of them
(experiment/evals/kinds.py). Nothing here imports JAX.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

LOGN = "+logn"


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _rope(**options) -> dict[str, str]:
    return {f"posenc.rope.{key}": value if isinstance(value, str) else _number(value) for key, value in options.items()}


def _window(L: int) -> int:
    return L


@dataclasses.dataclass(frozen=True)
class Method:
    """A method: how tables name it, what it cites, its options at L_valid = k L (`options(k, L)`), and
    the length up to which it changes nothing (`acts_beyond(L)`: a factor of 1 within the window, a
    window of its own that the whole sequence fits in), where it sets nothing: the model as trained."""
    label: str
    citation: str
    options: Callable[[float, int], dict[str, str]]
    acts_beyond: Callable[[int], int] = _window

    def at(self, eval_length: int, train_length: int) -> dict[str, str]:
        if eval_length <= self.acts_beyond(train_length):
            return {}
        return self.options(eval_length / train_length, train_length)


METHODS: dict[str, Method] = {
    "direct": Method("direct", "RoPE as trained", lambda k, L: {}),
    "pi": Method("PI", "Chen et al. 2023", lambda k, L: _rope(pi_factor=1 / k)),
    "ntk": Method("NTK-aware", "bloc97 2023", lambda k, L: _rope(ntk_alpha=k)),
    "dynamic_ntk": Method("dynamic NTK", "emozilla 2023", lambda k, L: _rope(dynamic_ntk="true", dynamic_ntk_factor=2)),
    "yarn": Method("YaRN", "Peng et al. 2024", lambda k, L: _rope(yarn_scale=k)),
    "dynamic_yarn": Method("dynamic YaRN", "Peng et al. 2024", lambda k, L: _rope(yarn_dynamic="true")),
    "llama3": Method("Llama 3", "Meta 2024", lambda k, L: _rope(llama3_factor=k)),
    "rerope": Method("ReRoPE", "Su 2023", lambda k, L: _rope(rerope_window=L // 2), acts_beyond=lambda L: L // 2),
    "self_extend": Method("Self-Extend", "Jin et al. 2024",
                          lambda k, L: _rope(self_extend_window=L // 4, self_extend_group=math.ceil(2 * k))),
    "dca": Method("DCA", "An et al. 2024", lambda k, L: _rope(dca_chunk_size=3 * L // 4, dca_local_window=L // 16),
                  acts_beyond=lambda L: 3 * L // 4),
    "lm_infinite": Method("LM-Infinite", "Han et al. 2024", lambda k, L: {"model.attention_sinks": "10"}),
}


def parse(names: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The method names of a comma-separated list (or a sequence), checked: each a name of METHODS,
    optionally with `+logn`; a ValueError names the unknown one and the valid ones."""
    items = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    for name in items:
        if name.removesuffix(LOGN) not in METHODS:
            raise ValueError(f"--methods: unknown method {name!r}; valid: {', '.join(METHODS)} (each also with "
                             f"{LOGN}: log-n scaling on top)")
    if not items:
        raise ValueError(f"--methods: give at least one of {', '.join(METHODS)}")
    return tuple(dict.fromkeys(items))


def label(name: str) -> str:
    """How tables and legends name a method: 'YaRN', 'YaRN + log-n'."""
    base = METHODS[name.removesuffix(LOGN)].label
    return f"{base} + log-n" if name.endswith(LOGN) else base


def options(name: str, eval_length: int, train_length: int) -> dict[str, str]:
    """The `--set` options of method `name` at `eval_length` for a model trained at `train_length`."""
    method = METHODS[name.removesuffix(LOGN)]
    extra = {"posenc.name": "logn"} if name.endswith(LOGN) else {}
    return {**method.at(eval_length, train_length), **extra}


def check_run(names: tuple[str, ...], schemes: list[str], run: str) -> None:
    """Refuse, in one line, methods that change RoPE's rotation on a run whose schemes (`schemes`,
    outermost first) do not include RoPE: its options would be refused as options the user never gave."""
    if "rope" in schemes:
        return
    rope = [n for n in names if any(key.startswith("posenc.rope.") for key in options(n, 2, 1))]
    if rope:
        others = [n for n in METHODS if n not in rope and not any(
            key.startswith("posenc.rope.") for key in options(n, 2, 1))]
        raise ValueError(f"--methods {','.join(rope)}: {' and '.join(label(n) for n in rope)} change RoPE's rotation, "
                         f"and {run} was trained with {' -> '.join(schemes)}, not RoPE: give a run trained with "
                         f"posenc.name=rope (or an imported Llama-family checkpoint); on this run only "
                         f"{', '.join(others)} apply")


def plan(names: tuple[str, ...], lengths: tuple[int, ...], train_length: int,
         base: dict[str, str] | None = None) -> list[tuple[str, dict[str, str], tuple[int, ...]]]:
    """[(method, overrides, lengths)]: for each method, its lengths grouped by the options it sets
    there (one evaluation each), with the `base` overrides (the command's --set); a --set of an option
    the method sets to another value is refused."""
    out = []
    for name in names:
        groups: dict[tuple, list[int]] = {}
        for length in lengths:
            own = options(name, length, train_length)
            clash = sorted(key for key in own if key in (base or {}) and str(base[key]) != own[key])
            if clash:  # the method's value would silently replace the one the user gave
                raise ValueError(f"--set {clash[0]}={base[clash[0]]}: --methods {name} sets {clash[0]} itself "
                                 f"({own[clash[0]]} at L={length}); drop the --set, or evaluate without the method")
            overrides = {**(base or {}), **own}
            groups.setdefault(tuple(sorted(overrides.items())), []).append(length)
        out += [(name, dict(key), tuple(group)) for key, group in groups.items()]
    return out
