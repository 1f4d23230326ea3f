"""The numerical check of a fused attention kernel on the device, before a run uses it.

CI runs the Pallas kernel in Pallas' interpreter and lowers it to Triton IR; what only a GPU shows
(PTX compilation, the shared memory a tile size needs, bfloat16 products, races between programs
writing partial sums) it cannot see, and a kernel that compiles but computes something else would
train and publish a model without a sign. So wherever a fused kernel would run compiled (`auto`
picking the Pallas kernel; `model.attention=pallas`, or `fused` on a GPU, given explicitly: the rows
of models/attention/paths.py whose `checked` says so, asked in models/attention/choice.py), it first
runs forward and backward on small random inputs of the run's heads, head dimension, dtype and
scheme, on the device, and is compared with XLA's paths (any row of the table can be checked so), at
a length its row accepts in training (`check_length`: the kernels' ragged one, or one less where the
row refuses odd lengths: cuDNN's backward pass):

  reference  dense attention in float32 at the highest matmul precision, on the same inputs (already
             rounded to the dtype, so that rounding is no error)
  XLA        XLA's paths that train the scheme (dense; triangular, what `auto` runs otherwise at
             training lengths) in the run's dtype
  kernel     the kernel in the run's dtype, with the launch configuration it would run with

Each output (the attention output, dQ, dK, dV, and the gradient of every learned parameter of the
scheme) is compared by its largest error over its largest value, max |x - ref| / max |ref| (for a
parameter, over the largest of all the parameters' gradients: `compare`), and out and dV also
row by row ("out/row", "dv/row": each (sequence, token, head) row's largest error over that row's largest
value, not below ROW_FLOOR of the whole's: `row_error`), so that an error confined to a few long rows
is not diluted by the largest value of the whole (row 0, which sees one key). The kernel passes where
every such error is finite and at most XLA_FACTOR x the larger of XLA's paths' errors, kept within
[FLOOR, CAP] of the dtype (`bounds`; a parameter's gradient not below PARAMETER_FLOOR): as exact as
the paths the framework already trains with, give or take, and nowhere wrong. (In bfloat16, where
dS = P (dP - rowsum(dO O)) is taken with the rounded output O, as flash attention and the triangular
path do, the gradient of a parameter the softmax is invariant to is off by ~1e-2 of the parameters'
gradients; dense attention's is not: hence PARAMETER_FLOOR, 3x that.) The inputs: 2 sequences of
CHECK_TILES tiles + half a tile + 1 token (diagonal, off-diagonal, far and padded tiles), one at
positions 0, 1, ..., one from 3 with a jump of 5 tiles halfway (far tiles of relative biases, T5's
constant buckets). The scheme is rebuilt from its options (`concrete`, so the check runs from inside a
model's trace too) with its parameters moved off their initialisation to magnitudes training gives
(`trained_like`: a lookup table such as T5's drawn from N(0, 1), where its initialisation's std of
0.02 would hide a wrong bucket; every other learned leaf moved by noise of std PARAMETER_NOISE).

A run that trains with attention dropout also checks the kernel with dropout ("pallas+dropout") as
training calls it (experiment/train/step.py): vmapped over the rows, each row with its own dropout key
(`row_keys`); against dense attention under the kernel's own mask for each row's key (`masked_dense`;
the kernel draws its mask from a hash, so no other path draws the same one). A kernel that gave every
row the same mask would fail it.

Verdicts are kept per machine (verdicts.py: `verified`, the cached form of `check`), so a check costs
once per machine; no failure inside the check ends the run.
"""
from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import posenc
from models.attention.dense import NEG_INF, Dropout, tile_logits
from models.attention.pallas import Launch
from models.attention.pallas_kernels import keep_mask
from models.attention.paths import PATHS, Call, CallSpec
from posenc import Scheme

FLOOR = {"float32": 1e-3, "bfloat16": 1e-2, "float16": 2e-3}  # the tolerance where XLA's own error is ~0
CAP = {"float32": 1e-2, "bfloat16": 1e-1, "float16": 2e-2}  # and where XLA's paths are far off too
# A correct kernel errs at most ~1.9x as much as XLA's paths on an H200 (benchmarks/results/gpu_first_run_h200,
# issue 68) and up to 2.5x in Pallas' interpreter on CPU (ALiBi with dropout, dK; 1.0-1.4x without dropout):
# 3x passes every correct kernel measured (flash-attention's own tests allow 2x), where 10x let a softmax
# scale or ALiBi slopes 2% off and a zeroed dK of the last key through (tests/models/attention/test_verify_faults.py).
XLA_FACTOR = 3.0
PARAMETER_FLOOR = {"float32": 1e-3, "bfloat16": 3e-2, "float16": 6e-3}  # rounded-O delta's ~1e-2 in bf16, 3x
ROW_FLOOR = 0.05  # a row's error is over its own largest value, or this fraction of the whole's if larger
ROW_CAP = 3.0  # a row's tolerance may reach this x CAP (a row's error is over its own, smaller largest value)
CHECK_TILES = 6  # tiles per check sequence (plus half a tile and a token), as at L = 512 and tiles of 64
PARAMETER_NOISE = 0.5  # std of the noise that moves each learned leaf off its initialisation (`trained_like`)
DROPOUT_RATE, DROPOUT_SEED = 0.25, 7  # the attention dropout of the check of the kernel's dropout


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The outcome of one check. `status`: passed | mismatch (an output beyond its tolerance) |
    error (did not compile or run) | refused (a shape the kernel cannot take; never run)."""
    ok: bool
    status: str
    reason: str = ""   # one line, where not ok
    errors: dict = dataclasses.field(default_factory=dict)      # output -> the kernel's error
    xla_errors: dict = dataclasses.field(default_factory=dict)  # output -> the larger of XLA's paths' errors
    tolerances: dict = dataclasses.field(default_factory=dict)  # output -> the bound it passed or failed
    subject: str = ""  # what was checked, in words

    @classmethod
    def refused(cls, reason: str) -> "Verdict":
        return cls(False, "refused", reason)


def normalized_error(got: np.ndarray, want: np.ndarray, scale: float | None = None) -> float:
    """max |got - want| / max |want| (or / `scale`); inf where `got` is not finite."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if not np.all(np.isfinite(got)):
        return float("inf")
    scale = float(np.max(np.abs(want))) if scale is None else scale
    return float(np.max(np.abs(got - want)) / max(scale, 1e-30))


def row_error(got: np.ndarray, want: np.ndarray) -> float:
    """The largest over rows (every index but the last) of max |got - want| over the row / max |want|
    over the row, that scale not below ROW_FLOOR x max |want| over the whole; inf where not finite."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if not np.all(np.isfinite(got)):
        return float("inf")
    scale = np.maximum(np.max(np.abs(want), axis=-1), ROW_FLOOR * max(float(np.max(np.abs(want))), 1e-30))
    return float(np.max(np.max(np.abs(got - want), axis=-1) / scale))


# The outputs also compared row by row ("out/row", "dv/row"). Not dQ and dK: each row sums dS terms of
# both signs (over keys, over queries), so in bfloat16 a correct kernel's rows err by up to ~0.2 of
# their own largest value (benchmarks/check_margins.py), as XLA's do: noise, not a signal.
ROWS = ("out", "dv")


def compare(got: dict, want: dict) -> dict[str, float]:
    """Each output's `normalized_error` against the reference `want`, and for ROWS also its
    `row_error` (as "<name>/row"). A parameter's gradient is scaled by the largest over all the
    parameters' gradients: one the softmax is invariant to (FIRE's output bias, added to every logit
    of a row) has a true gradient of ~0, and its own largest value would be rounding noise."""
    params = [n for n in want if n.startswith("d[")]
    scale = max((float(np.max(np.abs(want[n]))) for n in params), default=0.0)
    out = {n: normalized_error(got[n], want[n], max(scale, float(np.max(np.abs(want[n])))) if n in params else None)
           for n in want}
    out.update({f"{n}/row": row_error(got[n], want[n]) for n in ROWS if n in want})
    return out


def posenc_block(scheme: Scheme) -> dict:
    """The `posenc` config block that builds `scheme` (a wrapper's inner schemes included)."""
    block, current = {"name": scheme.name}, scheme
    while current is not None:
        block[current.name] = dataclasses.asdict(current.options)
        current = getattr(current, "inner", None)
    return block


def concrete(scheme: Scheme) -> Scheme:
    """A copy of `scheme` with concrete parameters, built from its options (those of a model being
    traced are tracers); call it under jax.ensure_compile_time_eval inside a trace."""
    return posenc.build(posenc_block(scheme), scheme.dims, rngs=nnx.Rngs(0))


def trained_like(scheme: Scheme, seed: int = 1) -> Scheme:
    """`scheme` with its learned parameters moved off their initialisation to magnitudes training
    gives: a leaf named `table` (a lookup table: T5's buckets) drawn from N(0, 1), every other leaf
    plus noise of std PARAMETER_NOISE (unconstrained leaves: KERPLE's softplus inputs, FIRE's MLP).
    In place; returns it."""
    rng = np.random.default_rng(seed)

    def move(path, value):
        noise = rng.standard_normal(np.shape(value)).astype(np.float32)
        table = any(getattr(k, "key", getattr(k, "name", None)) == "table" for k in path)
        return jnp.asarray(noise if table else np.asarray(value, np.float32) + PARAMETER_NOISE * noise, value.dtype)
    nnx.update(scheme, jax.tree_util.tree_map_with_path(move, nnx.state(scheme, nnx.Param)))
    return scheme


def check_length(path: str, scheme: Scheme, dtype, block: int) -> int:
    """The length `path` is checked at: CHECK_TILES tiles of `block` + half a tile + 1 token (diagonal,
    off-diagonal, far and padded tiles), or one token less where its row refuses that length in
    training (cuDNN: odd lengths), so that each path is checked at a length it must support."""
    ragged = CHECK_TILES * block + block // 2 + 1
    row, dropping = _row(path)
    for length in (ragged, ragged - 1):
        if row.accepts(scheme.traits, CallSpec.of(scheme, length, dtype, dropping=dropping, training=True)) is None:
            return length
    return ragged  # refused either way: `check` says why


def check_inputs(scheme: Scheme, dtype, length: int, seed: int = 0):
    """q, k, v (2 x T x H x K in `dtype`), positions (2 x T) and the output's cotangent (float32)."""
    t, h, d = length, scheme.dims.num_heads, scheme.dims.head_dim
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.standard_normal((2, t, h, d)), dtype) for _ in range(3))
    index = np.arange(t)
    pos = jnp.asarray(np.stack([index, 3 + index + (index >= t // 2) * 5 * (t // (CHECK_TILES + 1))]), jnp.int32)
    return q, k, v, pos, jnp.asarray(rng.standard_normal((2, t, h, d)), jnp.float32)


def outputs(attend, scheme: Scheme, q, k, v, pos, cotangent, admit=None) -> dict[str, np.ndarray]:
    """The attention output and the gradients of sum(output * cotangent) with respect to q, k, v and
    the scheme's parameters (named d<parameter path>), as float32 numpy arrays. `admit(compiled)`,
    where given, may refuse the compiled program before it runs (by raising: too large)."""
    graphdef, params, rest = nnx.split(scheme, nnx.Param, ...)

    def loss(params, q, k, v):
        out = attend(q, k, v, pos, pos, nnx.merge(graphdef, params, rest))
        return (out.astype(jnp.float32) * cotangent).sum(), out
    # compiled ahead of time and called: this runs now even inside another function's trace
    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))
    compiled = step.lower(params, q, k, v).compile()
    if admit is not None:
        admit(compiled)
    (_, out), grads = compiled(params, q, k, v)
    named = {"out": out, "dq": grads[1], "dk": grads[2], "dv": grads[3]}
    for path, g in jax.tree_util.tree_leaves_with_path(grads[0]):
        named["d" + jax.tree_util.keystr(path)] = g
    return {name: np.asarray(x).astype(np.float32) for name, x in named.items()}


def _row(path: str):
    """(the row of PATHS, whether with attention dropout) of a checked path: a name of PATHS, or
    name+dropout (a kernel that draws its mask as pallas_kernels.keep_mask does: `masked_dense`)."""
    name, _, variant = path.partition("+")
    if name not in PATHS or variant not in ("", "dropout"):
        raise ValueError(f"no check for attention path {path!r}; checked: a path of {', '.join(PATHS)}, "
                         f"or one of them +dropout")
    return PATHS[name], variant == "dropout"


def row_keys(rows: int) -> jax.Array:
    """Each row's dropout key, as the training step makes them (experiment/train/step.py: the step's
    key folded with the row's index); made where it is traced (not in a trace the check may run in)."""
    return jax.vmap(lambda r: jax.random.fold_in(jax.random.key(DROPOUT_SEED), r))(jnp.arange(rows))


def kernel_function(path: str, launch: Launch | None):
    """The attention function of a checked path (its row's `run`), as `dense_attention` is called
    minus the mask; with dropout as training calls it: vmapped over the rows, a dropout key per row."""
    row, dropping = _row(path)

    def attend(q, k, v, q_pos, k_pos, scheme):
        if not dropping:
            return row.run(q, k, v, Call(q_pos, k_pos, scheme, Dropout(), launch=launch))

        def one(q, k, v, q_pos, k_pos, key):
            call = Call(q_pos[None], k_pos[None], scheme, Dropout(DROPOUT_RATE, key), launch=launch)
            return row.run(q[None], k[None], v[None], call)[0]
        return jax.vmap(one)(q, k, v, q_pos, k_pos, row_keys(q.shape[0]))
    return attend


def describe(path: str, scheme: Scheme, dtype, launch: Launch | None) -> str:
    row, dropping = _row(path)
    what = row.label + (" with attention dropout" if dropping else "")
    config = f", {launch.label}" if row.tuned and launch is not None else ""
    return (f"{what} for {scheme.name!r} ({scheme.dims.num_heads} heads of {scheme.dims.head_dim}, "
            f"{jnp.dtype(dtype).name}{config}) on {jax.devices()[0].device_kind}")


_BASELINES: dict = {}


def xla_paths(scheme: Scheme, q, pos, dropout: bool) -> dict:
    """XLA's paths the framework trains `scheme` with (the rows marked `baseline`: dense, and
    triangular where its row accepts the scheme, always where a fused kernel's does), as
    `dense_attention` is called without its mask; with `dropout`, dense attention under the kernel's
    own dropout mask (`masked_dense`)."""
    if dropout:
        return {"dense": masked_dense}
    spec = CallSpec.of(scheme, q.shape[1], q.dtype, training=True)

    def attend(row):
        return lambda q, k, v, qp, kp, s: row.run(q, k, v, Call(qp, kp, s))
    return {name: attend(row) for name, row in PATHS.items()
            if row.baseline and row.accepts(scheme.traits, spec) is None}


def masked_dense(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme: Scheme) -> jax.Array:
    """Causal dense attention whose probabilities are dropped where the kernel drops them (its mask,
    pallas_kernels.keep_mask, drawn at DROPOUT_RATE from each row's key, `row_keys`, the row being
    sequence 0 of its own call) and rescaled by 1 / (1 - rate)."""
    b, t, h, _ = q_BxTxHxK.shape
    q_BxTxHxK, k_BxTxHxK = scheme.rotate(q_BxTxHxK, k_BxTxHxK, q_pos_BxT, k_pos_BxT)
    logits = jnp.where(np.tri(t, dtype=bool), tile_logits(q_BxTxHxK, k_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme), NEG_INF)
    seeds, index = jax.vmap(lambda key: jax.random.bits(key, (1,), jnp.uint32)[0])(row_keys(b)), jnp.arange(t)
    keep = jax.vmap(lambda seed: jax.vmap(lambda head: keep_mask(
        seed, 0, head, h, index[:, None], index[None, :], DROPOUT_RATE))(jnp.arange(h)))(seeds)
    probs = jnp.where(keep, jax.nn.softmax(logits, axis=-1) / (1.0 - DROPOUT_RATE), 0.0)
    return jnp.einsum("bhts,bshk->bthk", probs.astype(v_BxTxHxK.dtype), v_BxTxHxK)


def baseline(scheme: Scheme, dtype, length: int, dropout: bool = False):
    """(a concrete copy of the scheme, the inputs, the reference's outputs, the largest error of
    XLA's paths per output) for a check at `length` tokens (with `dropout`: under the kernel's
    dropout mask); kept for the process, as a search checks several launches."""
    key = json.dumps([posenc_block(scheme), dataclasses.asdict(scheme.dims), dtype, length, dropout], default=str)
    if key not in _BASELINES:
        with jax.ensure_compile_time_eval():  # concrete values, even inside a model's trace
            scheme = trained_like(concrete(scheme))
            inputs = check_inputs(scheme, dtype, length)
            wide = [x.astype(jnp.float32) for x in inputs[:3]]
        q, k, v, pos, cotangent = inputs
        paths = xla_paths(scheme, q, pos, dropout)
        with jax.default_matmul_precision("highest"):
            reference = outputs(paths["dense"], scheme, *wide, pos, cotangent)
        xla = [compare(outputs(attend, scheme, q, k, v, pos, cotangent), reference) for attend in paths.values()]
        _BASELINES[key] = (scheme, inputs, reference, {name: max(e[name] for e in xla) for name in xla[0]})
    return _BASELINES[key]


def bounds(xla_errors: dict, dtype: str) -> dict:
    """Each output's tolerance: XLA_FACTOR x XLA's own error, within [FLOOR, CAP] of the dtype (a
    parameter's gradient, "d[...]", not below PARAMETER_FLOOR; a row-by-row error, ".../row", up to
    ROW_CAP x CAP)."""
    cap = CAP.get(dtype, CAP["float32"])
    floors = {False: FLOOR.get(dtype, FLOOR["float32"]), True: PARAMETER_FLOOR.get(dtype, PARAMETER_FLOOR["float32"])}
    return {name: min(cap * (ROW_CAP if name.endswith("/row") else 1.0),
                      max(floors[name.startswith("d[")], XLA_FACTOR * error)) for name, error in xla_errors.items()}


def margins(verdict: "Verdict") -> dict[str, float]:
    """{output: tolerance / error} of a checked verdict (how far inside its bound each output is; below
    1: failed; inf: no error at all)."""
    return {name: (verdict.tolerances[name] / error if error else float("inf"))
            for name, error in verdict.errors.items() if name in verdict.tolerances}


def first_line(e: BaseException) -> str:
    """'Type: the first line of its message' (at most 300 characters)."""
    first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
    return f"{type(e).__name__}: {first}"


def check(path: str, scheme: Scheme, dtype, launch: Launch | None = None) -> Verdict:
    """Run the check now (no cache): the kernel of `path` against the float32 reference, next to
    XLA's paths, on this device."""
    dtype = jnp.dtype(dtype).name
    subject = describe(path, scheme, dtype, launch)
    length = check_length(path, scheme, dtype, max(launch.tiles) if launch else 64)
    row, dropping = _row(path)
    refusal = row.accepts(scheme.traits, CallSpec.of(scheme, length, dtype, dropping=dropping, training=True))
    if refusal:
        return Verdict.refused(refusal)
    try:
        scheme, (q, k, v, pos, cotangent), reference, xla_errors = baseline(scheme, dtype, length, dropout=dropping)
    except Exception as e:  # noqa: BLE001 - the check's own reference failed: no verdict on the kernel
        return Verdict(False, "error", f"the check of {subject} could not run its reference: {first_line(e)}",
                       subject=subject)
    try:
        got = outputs(kernel_function(path, launch), scheme, q, k, v, pos, cotangent)
    except Exception as e:  # noqa: BLE001 - any failure to lower, compile or run: the kernel is not used
        return Verdict(False, "error", f"{subject} does not run: {first_line(e)}", subject=subject)
    errors, tolerances = compare(got, reference), bounds(xla_errors, dtype)
    wrong = [name for name in tolerances if not errors[name] <= tolerances[name]]
    if not wrong:
        return Verdict(True, "passed", "", errors, xla_errors, tolerances, subject)
    worst = max(wrong, key=lambda name: errors[name] / tolerances[name])
    reason = (f"{subject} failed its numerical check: {', '.join(wrong)} wrong ({worst}: error "
              f"{errors[worst]:.2g} against XLA's {xla_errors[worst]:.2g}, tolerance {tolerances[worst]:.2g})")
    return Verdict(False, "mismatch", reason, errors, xla_errors, tolerances, subject)
