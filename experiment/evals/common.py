"""What every evaluation kind shares: what to evaluate (`EvalSpec`), eval-time overrides, the run
opened for scoring, its newest readable checkpoint loaded once (`Scoring`), windows per batch, the
positions of sampled-position schemes, and the header every record carries.

Adding an evaluation kind is three files (docs/architecture.md: Layout): its record kind in
experiment/store/records.py, its module here (score, build records, `Scoring.write`, and its
registry entry `KIND`: experiment/evals/kinds.py) and its module in experiment/report/.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import pathlib
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

import posenc
from experiment import config as config_lib
from experiment.config import Config
from experiment.model import abstract_model
from experiment.runtime import sharding
from experiment.store import checkpoints
from experiment.store.run import RunDir, opened
from models.attention.choice import tile_width

log = logging.getLogger(__name__)

POSITION_BINS = 64  # per-position values are stored in at most this many bins
MAX_LOGITS_BYTES = 1 << 30
MAX_SCORES_BYTES = 1 << 30
EVAL_POSITIONS_STREAM = 7  # folded into the run's seed for evaluation-time position draws
EVAL_OVERRIDABLE = ("posenc.", "model.attention")
# Records this process has written, by kind and run: what a Ctrl-C line reports, whichever method or
# length of a command (eval_extrapolate.py --methods a,b,c) it stops in.
WRITTEN: dict[tuple[str, str], list[str]] = {}


# --- what to evaluate -----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class EvalSpec:
    lengths: tuple[int, ...]
    stride: int          # 0: nonoverlapping
    split: str
    max_tokens: int      # 0: the whole split
    overrides: dict      # eval-time options {"posenc.rope.yarn_scale": "4"}


def eval_spec(config: Config, lengths=None, stride=None, split=None, max_tokens=None, overrides=None) -> EvalSpec:
    """What to evaluate, from the run's `config.eval` with any argument given taking its place;
    checked. Training, sweeps and eval_extrapolate.py all read it here."""
    ev = config.eval
    spec = EvalSpec(lengths=tuple(int(x) for x in (lengths or ev.lengths)),
                    stride=int(ev.stride if stride is None else stride),
                    split=split or ev.split,
                    max_tokens=int(ev.max_tokens if max_tokens is None else max_tokens),
                    overrides=dict(parse_overrides(ev.overrides) if overrides is None else overrides))
    if not spec.lengths or any(length < 1 for length in spec.lengths):
        raise ValueError(f"evaluation lengths must be positive, got {list(spec.lengths)}; set --lengths "
                         f"(or --config.eval.lengths / eval.length_multipliers)")
    if spec.stride < 0 or spec.stride > min(spec.lengths):
        raise ValueError(f"stride {spec.stride} must be between 0 (nonoverlapping) and the shortest "
                         f"evaluation length {min(spec.lengths)}; pass --stride (or --config.eval.stride)")
    if spec.max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0 (0 = the whole split), got {spec.max_tokens}; "
                         f"pass --max_tokens (or --config.eval.max_tokens)")
    return spec


def parse_overrides(text: str) -> dict[str, str]:
    """'posenc.rope.yarn_scale=4,model.attention=blockwise' -> {key: value} (config.eval.overrides).
    A comma starts a new item only before KEY=, so a value may be a list: 'posenc.rope.x=1,2,y=3'."""
    items = [item.strip() for item in re.split(r",(?=\s*[\w.]+=)", str(text or "")) if item.strip()]
    bad = [item for item in items if "=" not in item]
    if bad:
        raise ValueError(f"an evaluation override takes KEY=VALUE, got {bad[0]!r}")
    return dict(item.split("=", 1) for item in items)


def apply_overrides(config, overrides: dict[str, str]) -> Config:
    """The config with eval-time knobs set (scheme options that change no parameters, the attention
    path), typed like the values they replace. An option of a scheme the run does not use is refused.
    `posenc.name` may name a wrapper (logn, randomized): the run's scheme is then evaluated inside it
    (`posenc.wrapped`; log-n scaling on a run trained with plain RoPE), the wrapper's options and the
    inner scheme's settable as usual."""
    config = config_lib.typed(config)
    as_dict = ml_collections.ConfigDict(config.to_dict())
    trained = posenc.used_schemes(as_dict.posenc)
    overrides = dict(overrides)
    if "posenc.name" in overrides:  # first: the options below may belong to the wrapper
        as_dict.posenc = posenc.wrapped(as_dict.posenc, overrides.pop("posenc.name"))
    for dotted, raw in overrides.items():
        if not dotted.startswith(EVAL_OVERRIDABLE):
            raise ValueError(f"--set {dotted}: only posenc.<scheme>.<option>, posenc.name=<wrapper> and "
                             f"model.attention* can change at evaluation (anything else needs a new training run)")
        posenc.check_option_key(as_dict.posenc, dotted)
        parents, leaf = dotted.split(".")[:-1], dotted.split(".")[-1]
        if parents[:1] == ["posenc"] and len(parents) == 2 and leaf not in as_dict.posenc.get(parents[1], {}):
            defaults = posenc.default_config(parents[1])  # a run saved before the scheme option existed
            if parents[1] not in as_dict.posenc:
                as_dict.posenc[parents[1]] = defaults[parents[1]].to_dict()
            as_dict.posenc[parents[1]][leaf] = defaults[parents[1]][leaf]
        config_lib.set_typed(as_dict, dotted, raw)
    inner = posenc.used_schemes(as_dict.posenc)
    if inner[len(inner) - len(trained):] != trained:
        raise ValueError(f"--set: the run was trained with {' -> '.join(trained)}; evaluation may wrap it "
                         f"(posenc.name=<wrapper>) but not change it (got {' -> '.join(inner)})")
    config = config_lib.typed(as_dict)
    config_lib.check_domains(config)  # --set posenc.rope.yarn_scale=0.5 is refused by name, as in training
    return config


# --- the checkpoint, loaded once for scoring ---------------------------------------------------

@dataclasses.dataclass
class Scoring:
    """A run's newest readable checkpoint, loaded for scoring, with what every evaluation needs."""
    run: RunDir
    config: Config       # eval-time overrides applied
    overrides: dict
    tokenizer: object
    graphdef: nnx.GraphDef
    params: nnx.State    # whole on every device
    step: int
    mesh: jax.sharding.Mesh
    lengths: list[int]   # the lengths the scheme can encode
    method: str | None = None  # the training-free method evaluated (experiment/evals/methods.py), if one

    def model(self):
        return nnx.merge(self.graphdef, self.params)

    def header(self) -> dict:
        """The fields every record of this checkpoint carries (experiment/store/records.py)."""
        return {"scheme": self.config.posenc.name, "train_length": int(self.config.train.seq_len),
                "step": self.step, "data": data_name(self.config.data), "tokenizer": self.tokenizer.kind,
                **({"overrides": self.overrides} if self.overrides else {}),
                **({"method": self.method} if self.method else {})}

    def with_overrides(self, base: Config, lengths, overrides: dict, *, skip_impossible: bool = False,
                       what: str = "eval") -> "Scoring":
        """The same checkpoint under other eval-time `overrides` of the run's config `base`: its
        parameters reused where the model they build has the same parameter tree (every eval-time
        option but a wrapper with parameters), else restored again (load_checkpoint)."""
        config = apply_overrides(base, overrides)
        model = abstract_model(config, self.tokenizer.vocab_size)
        graphdef, abstract_params = nnx.split(model)
        same = jax.tree.structure(abstract_params) == jax.tree.structure(self.params) and all(
            a.shape == b.shape for a, b in zip(jax.tree.leaves(abstract_params), jax.tree.leaves(self.params)))
        if not same:
            return load_checkpoint(self.run, base, lengths, overrides, skip_impossible=skip_impossible, what=what)
        kept = _encodable(model.scheme, lengths, skip_impossible, what)
        return dataclasses.replace(self, config=config, overrides=dict(overrides), graphdef=graphdef, lengths=kept,
                                   method=None)

    def rows_per_batch(self, length: int, batch_tokens: int, at_most: int | None = None) -> int:
        """Windows per batch at `length`: `eval_batch_size`, at most `at_most`, rounded up to whole
        rows per device (every batch one shape)."""
        cfg = self.config
        rows = eval_batch_size(length, self.tokenizer.vocab_size, cfg.model.num_heads, batch_tokens,
                               tile_width(cfg.model, posenc.get(cfg.posenc.name), length))
        rows = min(rows, at_most) if at_most else rows
        return -(-rows // self.mesh.size) * self.mesh.size

    def write(self, kind: str, records: list[dict]) -> None:
        """Merge records of `kind` into the run's file (the writing process only)."""
        if self.run.writer and records:
            self.run.add_records(kind, records)
            WRITTEN.setdefault((kind, str(self.run.path)), []).extend(
                f"{r.get('method') or self.method or 'as trained'} L={r.get('eval_length', '?')}" for r in records)

    def interrupted(self, kind: str, done: list[int], length: int) -> str:
        """What a Ctrl-C while scoring `length` leaves: the records this command wrote (of this method's
        lengths `done`, and of the methods before it)."""
        path = self.run.records_path(kind)
        written = WRITTEN.get((kind, str(self.run.path)), [])
        if written:
            shown = ", ".join(written[:6]) + (f" and {len(written) - 6} more" if len(written) > 6 else "")
            kept = f"the {len(written)} {kind} record(s) this command wrote ({shown}) are kept in {path}"
        elif done:
            kept = f"the records of L={', '.join(map(str, done))} are in {path}"
        else:
            kept = f"no {kind} record of this evaluation was written"
        return f"interrupted while scoring {kind} at L={length}; {kept}: the same command evaluates again"


@contextlib.contextmanager
def opened_for_scoring(workdir: str | pathlib.Path | RunDir, purpose: str):
    """(run, config): the run opened for `purpose` (held by the writing process), with a checkpoint."""
    run = workdir if isinstance(workdir, RunDir) else RunDir(workdir)
    run.require_checkpoint()
    with opened(run, purpose):
        yield run, run.load_config()


def _encodable(scheme, lengths, skip_impossible: bool, what: str) -> list[int]:
    """The lengths the scheme can encode; another raises its LengthError, or is dropped with a warning
    when `skip_impossible`."""
    kept = []
    for length in lengths:
        try:
            scheme.check_length(length)
            kept.append(int(length))
        except posenc.LengthError as e:
            if not skip_impossible:
                raise
            log.warning("skipping %s length %d: %s", what, length, e)
    return kept


def load_checkpoint(run: RunDir, config: Config, lengths, overrides: dict, *, skip_impossible: bool = False,
                    what: str = "eval") -> Scoring:
    """The newest readable checkpoint with `overrides` applied, parameters on every device (whatever
    mesh.fsdp stored them as in training: scoring has no optimizer state and needs them whole).
    Lengths the scheme cannot encode raise its LengthError, or are dropped with a warning when
    `skip_impossible`."""
    config = apply_overrides(config, overrides)
    tokenizer = run.tokenizer(config.data, write=False)
    model = abstract_model(config, tokenizer.vocab_size)
    kept = _encodable(model.scheme, lengths, skip_impossible, what)
    mesh = sharding.mesh_from_config(config)
    graphdef, abstract_params = nnx.split(model)
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P())),
                          abstract_params)
    try:
        params, _, meta = checkpoints.restore(run, params)
    except ValueError as e:
        if not overrides:
            raise
        raise ValueError(f"the checkpoint does not fit the model with {overrides}: an overridden option changes "
                         f"the parameters, so it cannot change at evaluation ({str(e).splitlines()[0][:200]})") from e
    return Scoring(run, config, dict(overrides), tokenizer, graphdef, params, int(meta["step"]), mesh, kept)


# --- batches and positions -------------------------------------------------------------------

def eval_batch_size(length: int, vocab_size: int, num_heads: int, batch_tokens: int,
                    tile: int | None = None) -> int:
    """Windows per batch: `batch_tokens` tokens, fewer if the logits (B*L*V) or the attention scores
    would pass 1 GiB (B*H*L*L dense; B*H*L*tile blockwise, `tile` given); never fewer than one."""
    by_tokens = batch_tokens // length
    by_logits = MAX_LOGITS_BYTES // (4 * length * vocab_size)
    by_scores = MAX_SCORES_BYTES // (4 * num_heads * length * min(length, tile or length))
    return max(1, min(by_tokens, by_logits, by_scores))


def window_positions(scheme, config: Config, rows: jax.Array, length: int) -> jax.Array | None:
    """Positions for windows `rows` (their indices in the evaluation) where the scheme samples them
    at evaluation (randomized: each window its own draw from the run's seed, so a result does not
    depend on batching); None otherwise (0 .. T-1)."""
    if not scheme.traits.samples_positions:
        return None
    seed = jax.random.fold_in(jax.random.key(int(config.seed)), EVAL_POSITIONS_STREAM)

    def draw(row):
        return scheme.sample_positions(jnp.arange(length)[None], jax.random.fold_in(seed, row), training=False)[0]
    return jax.vmap(draw)(rows)


# --- record fields ---------------------------------------------------------------------------

def data_name(data) -> str:
    return data.name if data.source in ("builtin", "hf") else str(data.path)


def binned(values_sum: np.ndarray, counts: np.ndarray) -> list[list[float]]:
    """[[first position, last position, mean value], ...] in at most POSITION_BINS bins of
    geometrically growing width (the first positions one by one), for log-scale plots."""
    edges = np.unique(np.concatenate([[0], np.geomspace(1, len(values_sum), POSITION_BINS).round().astype(int)]))
    out = []
    for a, b in zip(edges[:-1], edges[1:]):
        c = counts[a:b].sum()
        if c > 0:
            out.append([int(a), int(b - 1), float(values_sum[a:b].sum() / c)])
    return out
