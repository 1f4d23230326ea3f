"""Which attention path runs: the policy over the table of paths (paths.py), the one place that
decides.

`model.attention` names a path of `paths.PATHS` or leaves the choice to `auto`, which takes, in
`AUTO_ORDER`, the first path whose row accepts the call and that it wants there: the Pallas kernel
on GPU, once the kernel has passed its numerical check on the device (verify.py, with the launch
configuration tuning.py chose; a failure is printed in one line and XLA's paths are kept) and where
its forward and backward pass beats the XLA path auto would take instead at the call's shape
(`kernel_wins`: tuning.race, timed once per device and workload, cached; a loss said in one line); else
blockwise for long sequences (`is_long`); else triangular unless the scheme's bias does work per key
(`bias_work_per_key`, which row tiles would repeat); else dense. An explicit path is asked the same
(its row's refusal is raised), and one whose row says it is `checked` here (`pallas` compiled on GPU,
`fused` on GPU: cuDNN) runs the device check first and is refused where its kernel fails it, unless
`model.attention_check` is off (for benchmarking). The decoder (`Attention.__call__`: `choose`,
`launch`), the evaluation batch policy (`tile_width`) and training on several devices
(`runs_per_device`) all ask here. The training step traces its loss inside `training_calls`, so that a
call knows it is differentiated and how many rows it serves (one call, or vmapped per row): the
kernel's launch search and its race against XLA's path run at that workload (`workload`: forward
and backward with training's dropout there; the forward alone for evaluation).

`tile_width` and `runs_per_device` take a model config as a `ModelConfig` or as a config section
(ConfigDict / dict, where a run saved before an option existed lacks it: ModelConfig's default applies).
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from models.attention import cpu_flash, pallas, tuning, verdicts, verify
from models.attention.agreement import agreed
from models.attention.paths import PATHS, CallSpec
from models.config import ModelConfig
from posenc import Scheme

AUTO_ORDER = ("pallas", "cpu_flash", "blockwise", "triangular", "dense")  # auto's preference, best first; dense takes all
_DEFAULTS = ModelConfig()


def _no() -> bool:
    return False


def is_long(length: int, block: int) -> bool:
    """Sequences this long are evaluated tile by tile (attention) and chunk by chunk (the MLP)."""
    return length > 2 * block


def attention_path(kind: str, block: int, scheme: Scheme | type[Scheme], spec: CallSpec,
                   kernel: Callable[[], bool] = _no, cpu_kernel: Callable[[], bool] = _no) -> str:
    """The attention path for one call (`spec`: its length, head size, dtype, dropout, mask): `kind`
    (an explicit model.attention, returned as it is) or `auto`'s choice: the first of AUTO_ORDER
    whose row accepts the call and that auto wants: the Pallas kernel where `kernel()` (usable on
    this device and faster), the CPU's kernel for long sequences where `cpu_kernel()` (a forward
    pass on one CPU device, the kernel built), blockwise for long sequences (`is_long`), triangular
    where the scheme's bias does no per-key work, dense. None accepting: the last one's refusal
    (ValueError)."""
    if kind != "auto":
        return kind
    traits = scheme.traits
    wanted = {"pallas": kernel, "cpu_flash": lambda: is_long(spec.length, block) and cpu_kernel(),
              "blockwise": lambda: is_long(spec.length, block),
              "triangular": lambda: not traits.bias_work_per_key, "dense": lambda: True}
    for name in AUTO_ORDER:
        if PATHS[name].accepts(traits, spec) is None and wanted[name]():
            return name
    raise ValueError(PATHS[AUTO_ORDER[-1]].accepts(traits, spec))


@dataclasses.dataclass(frozen=True)
class _Training:
    rows: int
    per_row: bool


_TRAINING: contextvars.ContextVar[_Training | None] = contextvars.ContextVar("training_calls", default=None)


@contextlib.contextmanager
def training_calls(rows: int, per_row: bool = False):
    """The attention calls traced inside are a training step's: differentiated, serving `rows` rows,
    one call for them all or (`per_row`) each call one row under a vmap (experiment/train/step.py)."""
    token = _TRAINING.set(_Training(rows, per_row))
    try:
        yield
    finally:
        _TRAINING.reset(token)


def workload(cfg: Any, positions_BxT: jax.Array, dropping: bool) -> tuning.Workload:
    """How this call runs: inside `training_calls` the training step's rows, forward and backward,
    with `model.attention_dropout` where `dropping`; elsewhere an evaluation, forward only, on the
    call's own rows."""
    training = _TRAINING.get()
    rate = float(_setting(cfg, "attention_dropout")) if dropping else 0.0
    if training is None:
        return tuning.Workload(positions_BxT.shape[0], positions_BxT.shape[1], training=False, dropout=rate)
    return tuning.Workload(training.rows, positions_BxT.shape[1], True, rate, training.per_row)


PICKED: dict[int, str] = {}  # sequence length -> the path `choose` last gave calls of that length


def picked() -> str:
    """The paths chosen so far in this process, by length ('triangular at 512 tokens'; '' for none),
    for the records of what ran (training's metrics.jsonl)."""
    return ", ".join(f"{kind} at {length} tokens" for length, kind in sorted(PICKED.items()))


def lambda_masked(model_cfg: Any) -> bool:
    """Whether LM-Infinite's Lambda mask is on (`model.attention_sinks` or `attention_window` set;
    models/attention/lambda_mask.py)."""
    return bool(_setting(model_cfg, "attention_sinks") or _setting(model_cfg, "attention_window"))


def choose(cfg: Any, scheme: Scheme, positions_BxT: jax.Array, dtype, *, dropping: bool) -> str:
    """The path of one `Attention` call on `positions_BxT` (self-attention, compute dtype `dtype`,
    attention dropout where `dropping`): `attention_path`, with the Pallas kernel's usability here
    decided at trace time (its check, search and race run then, once, at this call's `workload`). An
    explicit path whose row refuses the call raises its refusal, and so does one checked on this
    device whose kernel fails the check here (`model.attention_check`)."""
    work = workload(cfg, positions_BxT, dropping)
    spec = CallSpec.of(scheme, positions_BxT.shape[1], dtype, dropping=dropping, masked=lambda_masked(cfg),
                       training=work.training, sinks=bool(_setting(cfg, "attention_sinks")))

    def kernel_here() -> bool:  # usable here (checked), and faster than what auto runs otherwise at this workload
        if not kernel_usable(scheme, dtype, work):
            return False
        rival = attention_path(cfg.attention, cfg.attention_block, scheme, spec)
        return kernel_wins(scheme, dtype, work, rival, cfg.attention_block)

    def kernel() -> bool:  # process 0's answer on every process of a job: they trace one program
        return agreed(kernel_here)

    def cpu_kernel() -> bool:  # an evaluation's forward pass on one CPU device, the kernel built
        return agreed(lambda: not work.training and cpu_flash.usable())
    kind = attention_path(cfg.attention, cfg.attention_block, scheme, spec, kernel=kernel, cpu_kernel=cpu_kernel)
    PICKED[spec.length] = kind
    if cfg.attention != "auto":
        PATHS[kind].refuse(scheme.traits, spec)
        if checked_here(kind) and _setting(cfg, "attention_check"):
            verdict = verify.Verdict(**agreed(lambda: dataclasses.asdict(device_verdict(kind, scheme, dtype, work))))
            if not verdict.ok:
                raise ValueError(f"model.attention={kind}: {verdict.reason}. Use model.attention=auto (XLA's "
                                 f"paths where the kernel fails) or dense; model.attention_check=False runs it "
                                 f"unchecked (for benchmarking only)")
    return kind


def checked_here(kind: str) -> bool:
    """Whether `kind` runs a kernel here that the device check guards (its row's `checked`: the
    Pallas kernel where it is compiled (GPU), and `fused` on GPU (cuDNN); elsewhere both are XLA's or
    the interpreter's)."""
    return PATHS[kind].checked()


def device_verdict(kind: str, scheme: Scheme, dtype, work: tuning.Workload = tuning.DEFAULT_WORK) -> verify.Verdict:
    """The device check's verdict on the kernel of `kind` for this scheme and dtype (a tuned path: on
    the launch the device search chose for `work`, with attention dropout where it has some), cached."""
    if PATHS[kind].tuned:
        return tuning.kernel_verdict(scheme, dtype, work)
    return verdicts.verified(kind, scheme, dtype)


def launch(kind: str, scheme: Scheme, dtype, cfg: Any = None, positions_BxT: jax.Array | None = None,
           dropping: bool = False) -> pallas.Launch | None:
    """The launch configuration of a tuned path on this device for this call's `workload`
    (tuning.device_launch; without `positions_BxT`: tuning.DEFAULT_WORK), else None."""
    if not PATHS[kind].tuned:
        return None
    work = tuning.DEFAULT_WORK if positions_BxT is None else workload(cfg, positions_BxT, dropping)
    return verdicts.launch_of(agreed(lambda: dataclasses.asdict(tuning.device_launch(scheme, dtype, work))))


_SAID: set = set()


def kernel_wins(scheme: Scheme, dtype, work: tuning.Workload, rival: str, block: int) -> bool:
    """Whether the (checked) kernel's calls of `work` are faster than XLA's path `rival` (what `auto`
    takes without it) on this device (tuning.race: timed once per device, scheme, dtype and
    workload, cached). Where it is not, or the race fails, said once, in one line, with both times."""
    try:
        result = tuning.race(scheme, dtype, work, rival, block)
    except Exception as e:  # noqa: BLE001 - a race that cannot run: XLA's path, said once
        line = (f"model.attention=auto: the Pallas kernel for {scheme.name!r} could not be timed "
                f"({verify.first_line(e)})")
        result = None
    else:
        shape = tuning.Workload(**result["workload"])
        what = "forward and backward" if shape.training else "forward"
        line = (f"model.attention=auto: the Pallas kernel for {scheme.name!r} takes {result['kernel_ms']:.3g} ms "
                f"against {rival}'s {result['rival_ms']:.3g} ms ({what}, {shape.rows} x {shape.length} tokens)")
    wins = result is not None and result["kernel_ms"] < result["rival_ms"]
    if not wins and line not in _SAID:
        _SAID.add(line)
        print(f"{line}; using {rival}")
    return wins


def kernel_usable(scheme: Scheme, dtype, work: tuning.Workload = tuning.DEFAULT_WORK) -> bool:
    """Whether `auto` may take the Pallas kernel (for a scheme its row accepts): compiled here (GPU),
    on one device or per device (inside `shard_map`, as training runs there: `runs_per_device`; the
    kernel has no partitioning rule, so XLA would gather a sharded batch onto every device), and
    passing its check on this device at the launch searched for `work` (with its attention dropout).
    A kernel that fails is said once, in one line."""
    if pallas.interpreted() or (jax.device_count() > 1 and not pallas.per_device()):
        return False
    verdict = tuning.kernel_verdict(scheme, dtype, work)
    if not verdict.ok and verdict.reason not in _SAID:
        _SAID.add(verdict.reason)
        print(f"model.attention=auto: {verdict.reason}; using XLA's attention paths")
    return verdict.ok


def _setting(model_cfg: Any, name: str):
    """One option of a ModelConfig or of a config section (ModelConfig's default where it lacks it)."""
    get = getattr(model_cfg, "get", None)
    return get(name, getattr(_DEFAULTS, name)) if get is not None else getattr(model_cfg, name)


def tile_width(model_cfg: Any, scheme_cls: Scheme | type[Scheme], length: int) -> int | None:
    """The key-tile width attention will use at this length (None: full rows), for the evaluation
    batch policy, before any model exists: `attention_path` without the device (so `auto`
    resolves to an XLA path here), then that row's `tile`."""
    block = _setting(model_cfg, "attention_block")
    head_dim = _setting(model_cfg, "head_dim") or _setting(model_cfg, "d_model") // _setting(model_cfg, "num_heads")
    spec = CallSpec(scheme_cls.name, length, head_dim, jnp.dtype(_setting(model_cfg, "dtype")).name)
    return PATHS[attention_path(_setting(model_cfg, "attention"), block, scheme_cls, spec)].tile(block)


def runs_per_device(model_cfg: Any, scheme: Scheme, devices: int) -> bool:
    """Whether training on `devices` devices runs its forward and backward pass per device
    (experiment/train/step.py, make_train_step's `per_device_mesh`): where a path XLA cannot
    partition (its row's `per_device`: the Pallas kernel, compiled on GPU) runs, explicitly
    (model.attention=pallas) or as `auto`'s choice (a scheme its row accepts, the kernel passing its
    check on this device, at a training call of one row of the training length)."""
    if devices < 2 or pallas.interpreted():
        return False
    kind = _setting(model_cfg, "attention")
    if kind != "auto":
        return PATHS[kind].per_device
    dtype = _setting(model_cfg, "dtype")  # the check runs here, before the step is traced
    rate = float(_setting(model_cfg, "attention_dropout"))
    length = scheme.dims.train_length
    spec = CallSpec.of(scheme, length, dtype, dropping=rate > 0, training=True)
    work = tuning.Workload(1, length, True, rate, per_row=True)
    return PATHS["pallas"].accepts(scheme.traits, spec) is None and tuning.kernel_verdict(scheme, dtype, work).ok
