"""The Pallas kernel's launch configuration per device and workload, chosen by a small search the
first time it is met, and the race that tells `auto` whether the kernel beats XLA's path there.

A `Workload` says how the calls run: rows x length, training (forward and backward: the gradients
of q, k, v and the scheme's parameters) or evaluation (forward only), the attention-dropout rate,
and whether vmapped per row (training with per-row dropout keys, experiment/train/step.py: each call
sees one row) or as one call. models/attention/choice.py makes it from the call and from the training
step's `training_calls`.

The search (`search`): the forward kernel's candidates (launches.forward_candidates) timed on the
forward pass alone, the fastest kept; then, in training, the backward kernels' candidates
(launches.backward_candidates) timed forward and backward with that forward; from the fastest down,
the first configuration that passes the device check (verify.py) is chosen. It runs at the
workload's shape (`Workload.searched`: the rows cut to SEARCH_TOKENS tokens, the length rounded up to
a power of 2, so that an evaluation at many lengths searches once per octave); with one candidate of
each (LX_LAUNCH_CANDIDATES=1) nothing is timed. Each timing repeats the pass inside one compiled loop
(`loop_seconds`), so that dispatch does not decide. The race (`race`): the kernel with the searched
launch against the XLA path `auto` would take instead, at the workload's own shape (rows cut to
RACE_TOKENS tokens). Searches and races are kept per machine like the check's verdicts (verdicts.py).
"""
from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.attention import launches, pallas, verdicts, verify
from models.attention.dense import Dropout
from models.attention.pallas import Launch
from models.attention.paths import PATHS, Call
from models.attention.verify import Verdict
from posenc import Scheme

SEARCH_TOKENS = 65536  # a search times at most this many tokens per pass (rows x length)
RACE_TOKENS = 65536  # and so does a race
LOOP_SECONDS = 0.05  # each timing repeats the pass inside one compiled loop for at least this long


@dataclasses.dataclass(frozen=True)
class Workload:
    """How the attention calls of a run go: `rows` x `length` tokens, differentiated (`training`) or
    not, with attention dropout at `dropout` (0: none), vmapped `per_row` or one call."""
    rows: int
    length: int
    training: bool = True
    dropout: float = 0.0
    per_row: bool = False

    def _cut(self, length: int, tokens: int) -> "Workload":
        return dataclasses.replace(self, length=length, rows=max(1, min(self.rows, tokens // max(length, 1))))

    def raced(self) -> "Workload":
        """The shape a race times: the length as it is, the rows cut to RACE_TOKENS tokens (both paths
        scale alike with rows), at least one."""
        return self._cut(self.length, RACE_TOKENS)

    def searched(self) -> "Workload":
        """The shape a search times: the length rounded up to a power of 2, the rows cut to SEARCH_TOKENS."""
        return self._cut(1 << max(0, self.length - 1).bit_length(), SEARCH_TOKENS)

    @property
    def slug(self) -> str:
        kind = "train" if self.training else "eval"
        return (f"{kind}{f'-drop{self.dropout:g}' if self.dropout else ''}{'-perrow' if self.per_row else ''}"
                f"-r{self.rows}-L{self.length}")


DEFAULT_WORK = Workload(2, 1024)  # where a caller names none (a training pass of 2 x 1,024 tokens)


@dataclasses.dataclass(frozen=True)
class Tuned:
    """A search's outcome: the launch to use (None: none compiled), the check's verdict on it, the
    time of every candidate timed (ms) or the error that dropped it, and the faster configurations
    that failed the check, with why."""
    launch: Launch | None
    verdict: Verdict
    timings: dict = dataclasses.field(default_factory=dict)
    rejected: dict = dataclasses.field(default_factory=dict)


def loop_seconds(step, args, min_seconds: float = LOOP_SECONDS, max_repeats: int = 1000) -> float:
    """Seconds per call of `step(*args)` (a pytree of arrays out), timed as repeats inside one compiled
    loop (no dispatch between them), enough of them to last `min_seconds`. Each repeat's inputs are
    moved by the loop's carry (by ~1e-30: the same values) and every output is summed into it, so
    that XLA can neither hoist the call out of the loop nor drop any of its work."""
    def many(n, args):
        def body(i, carry):
            moved = jax.tree.map(lambda x: x + (carry * 1e-30).astype(x.dtype)
                                 if jnp.issubdtype(x.dtype, jnp.floating) else x, args)
            return carry + sum(jnp.sum(leaf.astype(jnp.float32)) for leaf in jax.tree.leaves(step(*moved)))
        return jax.lax.fori_loop(0, n, body, jnp.float32(0))
    compiled = jax.jit(many).lower(np.int32(1), args).compile()
    jax.block_until_ready(compiled(np.int32(1), args))
    start = time.perf_counter()
    jax.block_until_ready(compiled(np.int32(1), args))
    once = max(time.perf_counter() - start, 1e-7)
    repeats = int(min(max_repeats, max(1, -(-min_seconds // once))))
    start = time.perf_counter()
    jax.block_until_ready(compiled(np.int32(repeats), args))
    return (time.perf_counter() - start) / repeats


def call_seconds(path: str, scheme: Scheme, dtype, work: Workload, launch: Launch | None = None,
                 block: int | None = None, forward_only: bool = False) -> float:
    """Seconds of the attention calls of `work` through `path` of PATHS (in training the forward and
    backward pass, `forward_only` the forward alone), on random q, k, v in `dtype`, `loop_seconds`
    (raises if it does not compile)."""
    rows, length = work.rows, work.length
    with jax.ensure_compile_time_eval():
        scheme = verify.concrete(scheme)
        x = jnp.asarray(np.random.default_rng(0).standard_normal(
            (rows, length, scheme.dims.num_heads, scheme.dims.head_dim)), dtype)
    pos = np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length))  # concrete, even inside a trace
    graphdef, params, rest = nnx.split(scheme, nnx.Param, ...)
    row, options = PATHS[path], dict(launch=launch, **({"block": block} if block else {}))

    def attend(params, q, k, v):
        merged = nnx.merge(graphdef, params, rest)

        def one(q, k, v, pos, key):
            drop = Dropout(work.dropout, key) if work.dropout else Dropout()
            return row.run(q, k, v, Call(pos, pos, merged, drop, **options))
        keys = jax.vmap(lambda r: jax.random.fold_in(jax.random.key(0), r))(jnp.arange(rows))
        if work.per_row:
            return jax.vmap(lambda q, k, v, p, key: one(q[None], k[None], v[None], p[None], key)[0])(q, k, v, pos, keys)
        return one(q, k, v, pos, keys[0])
    if work.training and not forward_only:
        step = jax.grad(lambda p, q, k, v: attend(p, q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2, 3))
    else:
        step = attend
    return loop_seconds(step, (params, x, x, x))


def _timer(scheme: Scheme, dtype, work: Workload, launch: Launch, forward_only: bool) -> float:
    return call_seconds("pallas", scheme, dtype, work, launch, forward_only=forward_only)


def search(scheme: Scheme, dtype, work: Workload, timer=None) -> Tuned:
    """The forward candidates timed alone (`timer(scheme, dtype, work, launch, forward_only)` ->
    seconds, default `call_seconds` of the kernel), then in training the backward candidates with
    the fastest forward; the configurations checked fastest first, the first that passes chosen.
    None passing: the fastest, with its failing verdict (used only where the check is off)."""
    timer, limit, timings, rejected = timer or _timer, launches.shared_memory_limit(), {}, {}
    forwards = launches.forward_candidates(scheme.dims.head_dim, dtype, limit)
    backwards = launches.backward_candidates(scheme.dims.head_dim, dtype, limit)
    shape = work.searched()

    def fastest(options: list[Launch], label, forward_only: bool) -> list[Launch]:
        if len(options) < 2:
            return options
        seconds = {}
        for launch in options:
            try:
                seconds[launch] = timer(scheme, dtype, shape, launch, forward_only)
                timings[label(launch)] = round(seconds[launch] * 1e3, 4)
            except Exception as e:  # noqa: BLE001 - a candidate that does not compile (shared memory, registers)
                timings[label(launch)] = verify.first_line(e)[:200]
        return sorted(seconds, key=seconds.get)

    first_backward = backwards[0] if backwards else None
    forward_order = fastest([f.with_backward(first_backward) for f in forwards],
                            lambda x: f"forward {x.tiles_label}", True)
    backward_order = backwards
    if work.training and forward_order:
        backward_order = [x.bwd for x in fastest([forward_order[0].with_backward(b) for b in backwards],
                                                 lambda x: f"backward {x.bwd.tiles_label}", False)]
    if not forward_order or not backward_order:
        subject = verify.describe("pallas", scheme, dtype, None)
        return Tuned(None, Verdict(False, "error", f"{subject}: no launch configuration compiles ({timings})",
                                   subject=subject), timings)
    order = ([forward_order[0].with_backward(b) for b in backward_order]
             + [f.with_backward(backward_order[0]) for f in forward_order[1:]])
    failed = None
    for launch in order:
        verdict = verdicts.verified("pallas", scheme, dtype, launch)
        if verdict.ok:
            return Tuned(launch, verdict, timings, rejected)
        rejected[launch.label] = verdict.reason
        failed = failed or (launch, verdict)
    return Tuned(failed[0], failed[1], timings, rejected)


_TUNED: dict[str, Tuned] = {}


def tuned(scheme: Scheme, dtype, work: Workload = DEFAULT_WORK) -> Tuned:
    """The search's outcome for this device, scheme, head dimension, dtype and workload (its searched
    shape), once per machine."""
    key = f"{verdicts.cache_key('search', scheme, dtype, None)}-{work.searched().slug}-n{launches.width()}"
    if key not in _TUNED:
        saved = verdicts.read_cached(key)
        if saved is not None:
            launch = verdicts.launch_of(saved["launch"])
            _TUNED[key] = Tuned(launch, verdicts.verified("pallas", scheme, dtype, launch), saved["timings"],
                                saved["rejected"])
        else:
            result = search(scheme, dtype, work)
            _TUNED[key] = result
            if result.verdict.status in ("passed", "mismatch"):
                verdicts.write_cached(key, {"launch": dataclasses.asdict(result.launch), "timings": result.timings,
                                            "rejected": result.rejected})
    return _TUNED[key]


def kernel_verdict(scheme: Scheme, dtype, work: Workload = DEFAULT_WORK) -> Verdict:
    """Whether the compiled kernel may run `scheme` here: refused for a shape it cannot take, else
    the check's verdict on the launch the search chose for `work` (with attention dropout there, the
    check of its dropout too); a search that fails is an "error" verdict (XLA's paths are used)."""
    why = launches.refusal(scheme.dims.head_dim, dtype, launches.shared_memory_limit())
    if why:
        return Verdict.refused(why)
    try:
        result = tuned(scheme, dtype, work)
    except Exception as e:  # noqa: BLE001 - a search that fails is no kernel, never the end of the run
        subject = verify.describe("pallas", scheme, dtype, None)
        return Verdict(False, "error", f"the launch search for {subject} failed: {verify.first_line(e)}",
                       subject=subject)
    if work.dropout and result.verdict.ok:
        return verdicts.verified("pallas+dropout", scheme, dtype, result.launch)
    return result.verdict


def device_launch(scheme: Scheme, dtype, work: Workload = DEFAULT_WORK) -> Launch:
    """The launch `pallas_attention` uses for `work`: on GPU the search's choice (the first candidates
    where there is none: then it fails to compile, or is refused, with its reason), elsewhere Pallas'
    interpreter."""
    if pallas.interpreted():
        return Launch()
    limit = launches.shared_memory_limit()
    fallback = launches.default(scheme.dims.head_dim, dtype, limit) or Launch(interpret=False)
    if launches.refusal(scheme.dims.head_dim, dtype, limit):
        return fallback
    return tuned(scheme, dtype, work).launch or fallback


# ---- the kernel against XLA's paths, at the shape that runs ------------------------------------------

_RACES: dict[str, dict] = {}


def race(scheme: Scheme, dtype, work: Workload, rival: str, block: int | None = None) -> dict:
    """{"kernel_ms", "rival_ms", "workload", "rival", "launch"}: the calls of `work` (`Workload.raced`)
    through the kernel (with the launch the search chose for `work`) and through XLA's path `rival`
    (what `auto` runs without the kernel), once per key (device, scheme, dtype, sources, workload,
    rival) in this process and on this machine. A rival that does not run: the kernel wins."""
    shape = work.raced()
    launch = device_launch(scheme, dtype, work)
    key = f"{verdicts.cache_key('race', scheme, dtype, launch)}-{rival}-{shape.slug}"
    if key not in _RACES:
        saved = verdicts.read_cached(key)
        if saved is None:
            kernel = call_seconds("pallas", scheme, dtype, shape, launch)
            try:
                other = call_seconds(rival, scheme, dtype, shape, block=block)
            except Exception:  # noqa: BLE001 - e.g. out of memory at this length: the kernel runs
                other = float("inf")
            saved = {"kernel_ms": kernel * 1e3, "rival_ms": other * 1e3, "workload": dataclasses.asdict(shape),
                     "rival": rival, "launch": launch.label}
            verdicts.write_cached(key, saved)
        _RACES[key] = saved
    return _RACES[key]
