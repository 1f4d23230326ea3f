"""The device check (models/attention/verify.py) judges fairly, in Pallas' interpreter on CPU: a
correct kernel in bfloat16 passes (errs at most 2.7x as much as XLA's paths on every output and their
rows, under a tolerance of 3x: verify.XLA_FACTOR; 2x inside the floor on the parameters' gradients),
with and without attention dropout, and each planted fault fails it: one key position off, the next
head's bias, a wrong T5 bucket beyond max_distance, dropout keys shared across rows (the kernel
vmapped over rows as training calls it), and (issue 68) the small ones a 10x tolerance let through:
a softmax scale or ALiBi slopes 2% off, a zeroed dK for the last key. A failure inside the check is a
verdict, never an exception; an edit to a checked source keys the verdicts anew."""
import dataclasses

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import posenc
from models.attention import pallas, paths, verdicts, verify
from models.attention.dense import Dropout
from models.attention.pallas import Launch

LAUNCH = Launch(block=8, interpret=True)  # 6 tiles + 5 tokens per check sequence: 53 tokens
BF16 = jnp.bfloat16


def _scheme(name: str, head_dim: int = 16, heads: int = 4, **options):
    dims = posenc.ModelDims(d_model=heads * head_dim, num_heads=heads, head_dim=head_dim, num_layers=1,
                            train_length=64)
    config = posenc.default_config(name)
    if options:
        config[name].update(options)
    return posenc.build(config, dims, rngs=nnx.Rngs(0))


def _t5():  # buckets to 32 positions: the check's positions reach ~95, so the last bucket is exercised
    return _scheme("t5", num_buckets=8, max_distance=32)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    pallas._flash_call.clear_cache()  # a fault planted below is traced anew, not taken from an earlier test
    monkeypatch.setattr(verify, "_BASELINES", {})
    monkeypatch.setattr(verdicts, "_VERDICTS", {})
    monkeypatch.setattr(verdicts, "cache_folder", lambda: None)


@pytest.mark.parametrize("name", ["t5", "kerple_log", "alibi", "fire"])
@pytest.mark.parametrize("path", ["pallas", "pallas+dropout"])
def test_a_correct_kernel_passes_in_bfloat16_erring_at_most_2_7_times_as_much_as_xla(name, path):
    scheme = _t5() if name == "t5" else _scheme(name)
    verdict = verify.check(path, scheme, BF16, LAUNCH)
    assert verdict.status == "passed", verdict.reason
    margins = verify.margins(verdict)
    assert {"out/row", "dv/row"} <= set(margins)
    assert any(n.startswith("d[") for n in margins) == (name != "alibi")  # the bias's parameters are compared
    outputs = {n: m for n, m in margins.items() if not n.startswith("d[")}
    # margin = tolerance / error = 3 x XLA's error / error where the floor does not rule: >= 1.1 is an
    # error of at most 2.7x XLA's (the worst correct ratio measured: 2.5x here, 1.9x on an H200)
    assert min(outputs.values()) >= 1.1, {n: (round(m, 2), verdict.errors[n]) for n, m in margins.items()}
    # a parameter's gradient: its floor (verify.PARAMETER_FLOOR) is 3x the ~1e-2 that bfloat16's rounded
    # output leaves in a correct kernel's, so 2x and more (FIRE with dropout: 2.1 under issue 46's mask)
    parameters = {n: m for n, m in margins.items() if n.startswith("d[")} or {"none": 2.0}
    assert min(parameters.values()) >= 2.0, {n: (round(m, 2), verdict.errors[n]) for n, m in margins.items()}


def _fails(path, scheme, *outputs):
    verdict = verify.check(path, scheme, BF16, LAUNCH)
    assert verdict.status == "mismatch", verdict
    wrong = [n for n in verdict.tolerances if verdict.errors[n] > verdict.tolerances[n]]
    assert any(n in wrong for n in outputs), (wrong, verdict.reason)
    return verdict


def _bias_fn_changed(monkeypatch, scheme, change):
    real = type(scheme).bias_fn
    monkeypatch.setattr(type(scheme), "bias_fn", lambda self: change(real(self)))


def test_a_kernel_reading_its_bias_one_key_position_off_fails(monkeypatch):
    real = pallas._Config.bias
    monkeypatch.setattr(pallas._Config, "bias", lambda self, leaves, refs, q_pos, k_pos:
                        real(self, leaves, refs, q_pos, k_pos - 1))
    _fails("pallas", _scheme("kerple_log"), "out", "out/row")


def test_a_kernel_using_the_next_heads_bias_fails(monkeypatch):
    scheme = _scheme("kerple_log")
    _bias_fn_changed(monkeypatch, scheme, lambda bias: dataclasses.replace(
        bias, per_head=jax.tree.map(lambda x: jnp.roll(x, -1, axis=0), bias.per_head)))
    _fails("pallas", scheme, "out", "out/row")


def test_a_wrong_t5_bucket_beyond_max_distance_fails(monkeypatch):
    scheme = _t5()
    far, last = scheme.options.max_distance, scheme.options.num_buckets - 1

    def wrong_far_bucket(bias):
        index = bias.index
        return dataclasses.replace(bias, index=lambda q, k: jnp.where(q - k >= far, last - 1, index(q, k)))
    _bias_fn_changed(monkeypatch, scheme, wrong_far_bucket)
    _fails("pallas", scheme, "out/row", "dv/row")


def test_dropout_keys_shared_across_rows_fail(monkeypatch):
    """The kernel given the same dropout key in every row (vmapped as training calls it): every row
    draws the same mask, where training gives each row its own."""
    row = paths.PATHS["pallas"]

    def shared_key(q, k, v, call):
        return row.run(q, k, v, dataclasses.replace(call, dropout=Dropout(call.dropout.rate, jax.random.key(0))))
    monkeypatch.setitem(paths.PATHS, "pallas", dataclasses.replace(row, run=shared_key))
    _fails("pallas+dropout", _scheme("alibi"), "out", "out/row", "dv", "dv/row")


def test_a_failure_inside_the_check_is_a_verdict_not_a_crash(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the reference ran out of memory")
    monkeypatch.setattr(verify, "baseline", broken)
    verdict = verdicts.verified("pallas", _scheme("alibi"), BF16, LAUNCH)
    assert verdict.status == "error" and "could not run its reference: RuntimeError" in verdict.reason
    monkeypatch.setattr(verdicts, "_VERDICTS", {})
    monkeypatch.setattr(verify, "check", broken)
    verdict = verdicts.verified("pallas", _scheme("alibi"), BF16, LAUNCH)
    assert verdict.status == "error" and "failed: RuntimeError: the reference ran out" in verdict.reason


def test_an_edit_to_a_checked_source_keys_the_verdict_anew(monkeypatch):
    scheme = _scheme("kerple_log")
    key = verdicts.cache_key("check", scheme, BF16, LAUNCH)
    assert verdicts.cache_key("check", scheme, BF16, LAUNCH) == key
    real = verdicts._file_digest.__wrapped__
    for edited in ("pallas_kernels.py", "kerple.py", "verify.py", "launches.py", "call.py"):
        monkeypatch.setattr(verdicts, "_file_digest", lambda f, edited=edited: real(f) + ("x" if f.endswith(edited)
                                                                                         else ""))
        assert verdicts.cache_key("check", scheme, BF16, LAUNCH) != key, edited


def test_a_launch_search_that_fails_is_a_verdict_not_a_crash(monkeypatch):
    from models.attention import tuning
    monkeypatch.setattr(tuning, "_TUNED", {})
    monkeypatch.setattr(tuning, "search", lambda *args: (_ for _ in ()).throw(OSError("no space left")))
    verdict = tuning.kernel_verdict(_scheme("alibi"), BF16)
    assert verdict.status == "error" and "launch search" in verdict.reason
    assert "OSError: no space left" in verdict.reason


def test_fused_names_its_implementation_cudnn_on_gpu_and_its_row_refuses_what_cudnn_cannot_take(monkeypatch):
    from models.attention import fused
    called = []
    monkeypatch.setattr(jax.nn, "dot_product_attention", lambda *a, implementation=None, **k: called.append(
        implementation) or a[0])
    q, pos = jnp.zeros((1, 8, 4, 16), BF16), jnp.arange(8)[None]
    fused.fused_attention(q, q, q, pos, pos, _scheme("alibi"))
    assert called == ["xla"]  # XLA's composite, named, on CPU
    row, traits = paths.PATHS["fused"], _scheme("alibi").traits
    spec = paths.CallSpec("alibi", 417, 16, "float32", training=True)
    assert row.accepts(traits, spec) is None  # XLA's composite takes any of these
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    fused.fused_attention(q, q, q, pos, pos, _scheme("alibi"))
    assert called == ["xla", "cudnn"]
    assert "takes float16 or bfloat16, not float32 " in row.accepts(traits, spec)  # cuDNN's limits, up front
    bf16 = dataclasses.replace(spec, dtype="bfloat16")
    assert "even sequence lengths only, not 417; use model.attention=auto" in row.accepts(traits, bf16)
    assert row.accepts(traits, dataclasses.replace(bf16, training=False)) is None  # its forward takes odd lengths
    assert row.accepts(traits, dataclasses.replace(bf16, length=416)) is None
    assert "multiples of 8 up to 128, not 256" in row.accepts(traits, dataclasses.replace(bf16, length=416,
                                                                                           head_dim=256))


# ---- issue 68, item 2: small faults that a tolerance of 10x XLA's error let through -----------------

@pytest.mark.slow  # ~15 s in the interpreter; the ALiBi case below stands for these in the default run
def test_a_softmax_scale_two_percent_off_fails(monkeypatch):
    from models.attention import pallas_kernels
    real = pallas_kernels._logits
    monkeypatch.setattr(pallas_kernels, "_logits", lambda cfg, q, k, q_pos, k_pos, leaves, tile, scale:
                        real(cfg, q, k, q_pos, k_pos, leaves, tile, scale * 1.02))
    _fails("pallas", _scheme("rope"), "out", "out/row", "dq", "dk")


def test_alibi_slopes_two_percent_off_fail(monkeypatch):
    scheme = _scheme("alibi")
    _bias_fn_changed(monkeypatch, scheme, lambda bias: dataclasses.replace(
        bias, per_head=jax.tree.map(lambda x: x * 1.02, bias.per_head)))
    _fails("pallas", scheme, "out", "out/row", "dq", "dk")


@pytest.mark.slow
def test_a_zeroed_key_gradient_for_the_last_key_fails(monkeypatch):
    """RoPE: dK of the last key (one query attends to it) set to 0; over the whole dK it is a small part."""
    row = paths.PATHS["pallas"]

    @jax.custom_vjp
    def last_key_dk_zeroed(k):
        return k

    def forward(k):
        return k, None

    def backward(_, dk):
        return (dk.at[:, -1].set(0),)
    last_key_dk_zeroed.defvjp(forward, backward)

    def run(q, k, v, call):
        return row.run(q, last_key_dk_zeroed(k), v, call)
    monkeypatch.setitem(paths.PATHS, "pallas", dataclasses.replace(row, run=run))
    _fails("pallas", _scheme("rope"), "dk", "dk/row")
