"""The numerical check of a fused attention kernel on the device, before a run uses it.

CI runs the Pallas kernel in Pallas' interpreter and lowers it to Triton IR; what only a GPU shows
(PTX compilation, the shared memory a tile size needs, bfloat16 products, races between programs
writing partial sums) it cannot see, and a kernel that compiles but computes something else would
train and publish a model without a sign. So wherever a fused kernel would run compiled (`auto`
picking the Pallas kernel; `model.attention=pallas`, or `fused` on a GPU, given explicitly: the rows
of models/attention/paths.py whose `checked` says so, asked in models/attention/choice.py), it first
runs forward and backward on small random inputs of the run's heads, head dimension, dtype and
scheme, on the device, and is compared with XLA's paths (any row of the table can be checked so):

  reference  dense attention in float32 at the highest matmul precision, on the same inputs (already
             rounded to the dtype, so that rounding is no error)
  XLA        XLA's paths that train the scheme (dense; triangular, what `auto` runs otherwise at
             training lengths) in the run's dtype
  kernel     the kernel in the run's dtype, with the launch configuration it would run with

Each output (the attention output, dQ, dK, dV, and the gradient of every learned parameter of the
scheme) is compared by its largest error over its largest value, max |x - ref| / max |ref| (for a
parameter, over the largest of all the parameters' gradients: `compare`). The kernel passes where
every such error is finite and at most XLA_FACTOR x the larger of XLA's paths' errors, kept within
[FLOOR, CAP] of the dtype (`bounds`): as exact as the paths the framework already trains with, give
or take, and nowhere wrong. (Both matter: in bfloat16, where dS = P (dP - rowsum(dO O)) is taken with
the rounded output O, as flash attention and the triangular path do, the gradient of a parameter the
softmax is invariant to is off by ~1e-2 of the parameters' gradients; dense attention's is not.) The inputs:
2 sequences of 2.5 tiles + 1 token (diagonal, off-diagonal and padded tiles), one at positions
0, 1, ..., one from 3 with a jump of 5 tiles halfway (far tiles of relative biases, T5's constant
buckets). A run that trains with attention dropout also checks the kernel with dropout
("pallas+dropout"): against dense attention under the kernel's own mask (`masked_dense`; the
kernel draws its mask from a hash, so no other path draws the same one). The scheme is rebuilt from
its options with fresh parameters (`concrete`), so the check runs from inside a model's trace too.

Verdicts are cached per (device kind, scheme and its options, heads, head dimension, dtype, launch
configuration, jax version): in memory, and on disk in `kernel_checks/` inside JAX's compilation
cache folder where one is set (the entry points set it: experiment/runtime/accelerator.py), so a
check costs once per machine. A mismatch is cached on disk too (it is deterministic); a failure to
compile or run only in memory, so that the next process tries again.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import posenc
from models.attention.dense import NEG_INF, Dropout, tile_logits
from models.attention.pallas import Launch
from models.attention.pallas_kernels import keep_mask
from models.attention.paths import PATHS, Call, Shape
from posenc import Scheme

FLOOR = {"float32": 1e-3, "bfloat16": 1e-2, "float16": 2e-3}  # the tolerance where XLA's own error is ~0
CAP = {"float32": 1e-2, "bfloat16": 1e-1, "float16": 2e-2}  # and where XLA's paths are far off too
XLA_FACTOR = 3.0
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


def compare(got: dict, want: dict) -> dict[str, float]:
    """Each output's `normalized_error` against the reference `want`. A parameter's gradient is
    scaled by the largest over all the parameters' gradients: one the softmax is invariant to (FIRE's
    output bias, added to every logit of a row) has a true gradient of ~0, and its own largest value
    would be rounding noise."""
    params = [n for n in want if n.startswith("d[")]
    scale = max((float(np.max(np.abs(want[n]))) for n in params), default=0.0)
    return {n: normalized_error(got[n], want[n], max(scale, float(np.max(np.abs(want[n])))) if n in params else None)
            for n in want}


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


def check_inputs(scheme: Scheme, dtype, block: int, seed: int = 0):
    """q, k, v (2 x T x H x K in `dtype`), positions (2 x T) and the output's cotangent (float32)."""
    t, h, d = 2 * block + block // 2 + 1, scheme.dims.num_heads, scheme.dims.head_dim
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.standard_normal((2, t, h, d)), dtype) for _ in range(3))
    index = np.arange(t)
    pos = jnp.asarray(np.stack([index, 3 + index + (index >= t // 2) * 5 * block]), jnp.int32)
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


def kernel_function(path: str, launch: Launch | None):
    """The attention function of a checked path (its row's `run`), as `dense_attention` is called
    minus the mask."""
    row, dropping = _row(path)

    def attend(q, k, v, q_pos, k_pos, scheme):
        # the dropout key made where it is traced (not in a trace this check may run in)
        dropout = Dropout(DROPOUT_RATE, jax.random.key(DROPOUT_SEED)) if dropping else Dropout()
        return row.run(q, k, v, Call(q_pos, k_pos, scheme, dropout, launch=launch))
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
    shape = Shape(scheme.name, q.shape[1])

    def attend(row):
        return lambda q, k, v, qp, kp, s: row.run(q, k, v, Call(qp, kp, s))
    return {name: attend(row) for name, row in PATHS.items()
            if row.baseline and row.accepts(scheme.traits, shape) is None}


def masked_dense(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme: Scheme) -> jax.Array:
    """Causal dense attention whose probabilities are dropped where the kernel drops them (its mask,
    pallas_kernels.keep_mask, drawn from DROPOUT_SEED at DROPOUT_RATE) and rescaled by 1 / (1 - rate)."""
    b, t, h, _ = q_BxTxHxK.shape
    q_BxTxHxK, k_BxTxHxK = scheme.rotate(q_BxTxHxK, k_BxTxHxK, q_pos_BxT, k_pos_BxT)
    logits = jnp.where(np.tri(t, dtype=bool), tile_logits(q_BxTxHxK, k_BxTxHxK, q_pos_BxT, k_pos_BxT, scheme), NEG_INF)
    seed, index = jax.random.bits(jax.random.key(DROPOUT_SEED), (1,), jnp.uint32)[0], jnp.arange(t)
    keep = jax.vmap(lambda row: jax.vmap(lambda head: keep_mask(
        seed, row, head, h, index[:, None], index[None, :], DROPOUT_RATE))(jnp.arange(h)))(jnp.arange(b))
    probs = jnp.where(keep, jax.nn.softmax(logits, axis=-1) / (1.0 - DROPOUT_RATE), 0.0)
    return jnp.einsum("bhts,bshk->bthk", probs.astype(v_BxTxHxK.dtype), v_BxTxHxK)


def baseline(scheme: Scheme, dtype, block: int, dropout: bool = False):
    """(a concrete copy of the scheme, the inputs, the reference's outputs, the largest error of
    XLA's paths per output) for a check with tiles of `block` rows (with `dropout`: under the
    kernel's dropout mask); kept for the process, as a search checks several launches per tile."""
    key = json.dumps([posenc_block(scheme), dataclasses.asdict(scheme.dims), dtype, block, dropout], default=str)
    if key not in _BASELINES:
        with jax.ensure_compile_time_eval():  # concrete values, even inside a model's trace
            scheme = concrete(scheme)
            inputs = check_inputs(scheme, dtype, block)
            wide = [x.astype(jnp.float32) for x in inputs[:3]]
        q, k, v, pos, cotangent = inputs
        paths = xla_paths(scheme, q, pos, dropout)
        with jax.default_matmul_precision("highest"):
            reference = outputs(paths["dense"], scheme, *wide, pos, cotangent)
        xla = [compare(outputs(attend, scheme, q, k, v, pos, cotangent), reference) for attend in paths.values()]
        _BASELINES[key] = (scheme, inputs, reference, {name: max(e[name] for e in xla) for name in reference})
    return _BASELINES[key]


def bounds(xla_errors: dict, dtype: str) -> dict:
    """Each output's tolerance: XLA_FACTOR x XLA's own error, within [FLOOR, CAP] of the dtype."""
    floor, cap = FLOOR.get(dtype, FLOOR["float32"]), CAP.get(dtype, CAP["float32"])
    return {name: min(cap, max(floor, XLA_FACTOR * error)) for name, error in xla_errors.items()}


def check(path: str, scheme: Scheme, dtype, launch: Launch | None = None) -> Verdict:
    """Run the check now (no cache): the kernel of `path` against the float32 reference, next to
    XLA's paths, on this device."""
    dtype = jnp.dtype(dtype).name
    subject = describe(path, scheme, dtype, launch)
    scheme, (q, k, v, pos, cotangent), reference, xla_errors = baseline(
        scheme, dtype, launch.block if launch else 64, dropout=path.endswith("+dropout"))
    try:
        got = outputs(kernel_function(path, launch), scheme, q, k, v, pos, cotangent)
    except Exception as e:  # noqa: BLE001 - any failure to lower, compile or run: the kernel is not used
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        return Verdict(False, "error", f"{subject} does not run: {type(e).__name__}: {first}", subject=subject)
    errors, tolerances = compare(got, reference), bounds(xla_errors, dtype)
    wrong = [name for name in reference if not errors[name] <= tolerances[name]]
    if not wrong:
        return Verdict(True, "passed", "", errors, xla_errors, tolerances, subject)
    worst = max(wrong, key=lambda name: errors[name] / tolerances[name])
    reason = (f"{subject} failed its numerical check: {', '.join(wrong)} wrong ({worst}: error "
              f"{errors[worst]:.2g} against XLA's {xla_errors[worst]:.2g}, tolerance {tolerances[worst]:.2g})")
    return Verdict(False, "mismatch", reason, errors, xla_errors, tolerances, subject)


# ---- the cache ---------------------------------------------------------------------------------------

_VERDICTS: dict[str, Verdict] = {}


def cache_folder() -> pathlib.Path | None:
    """`kernel_checks/` in JAX's compilation cache folder, or None where none is set (or it is remote)."""
    folder = jax.config.jax_compilation_cache_dir
    if not folder or "://" in str(folder):
        return None
    return pathlib.Path(folder) / "kernel_checks"


def cache_key(kind: str, scheme: Scheme, dtype, launch: Launch | None, path: str = "pallas") -> str:
    """A file name for one (device kind, scheme with its options, heads, head dimension, dtype,
    launch configuration, jax version): readable, with a hash of what is not."""
    device = jax.devices()[0].device_kind
    exact = json.dumps([posenc_block(scheme), dataclasses.asdict(launch) if launch else None, jax.__version__,
                        device], sort_keys=True, default=str)
    config = f"-b{launch.block}w{launch.num_warps}s{launch.num_stages}" if launch is not None else ""
    interp = "-interpreted" if launch is not None and launch.interpret else ""
    slug = "".join(c if c.isalnum() else "_" for c in device.lower())
    return (f"{kind}-{path}-{slug}-{scheme.name}-h{scheme.dims.num_heads}-d{scheme.dims.head_dim}-"
            f"{jnp.dtype(dtype).name}{config}{interp}-{hashlib.sha1(exact.encode()).hexdigest()[:10]}")


def read_cached(key: str) -> dict | None:
    folder = cache_folder()
    file = folder / f"{key}.json" if folder else None
    if file is None or not file.exists():
        return None
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError):  # a damaged file: check again
        return None


def write_cached(key: str, payload: dict) -> None:
    """One JSON file per key, written to a temporary name and renamed (processes may race)."""
    folder = cache_folder()
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as f:
        json.dump(payload, f, indent=1)
    os.replace(f.name, folder / f"{key}.json")


def verified(path: str, scheme: Scheme, dtype, launch: Launch | None = None) -> Verdict:
    """`check`, once per key (see the module docstring) in this process and on this machine."""
    key = cache_key("check", scheme, dtype, launch, path)
    if key not in _VERDICTS:
        saved = read_cached(key)
        if saved is not None:
            _VERDICTS[key] = Verdict(**saved)
        else:
            verdict = check(path, scheme, dtype, launch)
            _VERDICTS[key] = verdict
            if verdict.status in ("passed", "mismatch"):
                write_cached(key, dataclasses.asdict(verdict))
    return _VERDICTS[key]
