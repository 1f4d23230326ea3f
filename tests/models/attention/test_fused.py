"""The fused path on a GPU (cuDNN through jax.nn.dot_product_attention), without a GPU: the device
check runs it at lengths that jax's own cuDNN validation accepts in training, and its row refuses
exactly the lengths that validation refuses. Issue 46: the check ran at 417 tokens, which jax's
cuDNN backward pass refuses with or without a bias, so `fused` was refused on every GPU. Jax's
validation is run as on a GPU: its trace with a cuDNN version given (there is none on CPU)."""
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import posenc
from models.attention import fused, paths, verify


def _scheme(name: str):
    dims = posenc.ModelDims(d_model=8 * 128, num_heads=8, head_dim=128, num_layers=1, train_length=512)
    return posenc.build(posenc.default_config(name), dims, rngs=nnx.Rngs(0))


@pytest.fixture
def cudnn(monkeypatch):
    """The fused path as on a GPU: cuDNN's implementation named, jax's cuDNN version check answered."""
    from jax._src.cudnn import fused_attention_stablehlo
    monkeypatch.setattr(fused, "implementation", lambda: "cudnn")
    monkeypatch.setattr(fused_attention_stablehlo, "check_cudnn_version", lambda: 91000)


def _traced_in_training(scheme, length: int) -> None:
    """The fused path's forward and backward, traced (jax's cuDNN checks run at trace time)."""
    q = jax.ShapeDtypeStruct((2, length, 8, 128), jnp.bfloat16)
    pos = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (2, length))
    loss = lambda q: paths.PATHS["fused"].run(q, q, q, paths.Call(pos, pos, scheme)).astype(jnp.float32).sum()
    jax.make_jaxpr(jax.grad(loss))(q)


@pytest.mark.parametrize("name", ["rope", "alibi"])  # without a bias and with one
def test_the_device_check_runs_fused_at_a_length_jaxs_cudnn_validation_accepts(cudnn, name):
    scheme = _scheme(name)
    length = verify.check_length("fused", scheme, jnp.bfloat16, 64)
    assert length == 416 and verify.check_length("pallas", scheme, jnp.bfloat16, 64) == 417  # pallas: ragged
    _traced_in_training(scheme, length)  # jax's own validation passes
    with pytest.raises(NotImplementedError, match="Unsupported sequence length Q 417, KV 417"):
        _traced_in_training(scheme, 417)  # what the check ran at before, refused by jax itself
    spec = paths.CallSpec.of(scheme, 417, jnp.bfloat16, training=True)
    assert "even sequence lengths only, not 417" in paths.PATHS["fused"].accepts(scheme.traits, spec)  # so: up front


def test_jaxs_cudnn_forward_takes_odd_lengths_and_so_does_the_row(cudnn):
    scheme = _scheme("alibi")
    q = jax.ShapeDtypeStruct((1, 417, 8, 128), jnp.bfloat16)
    pos = jnp.arange(417, dtype=jnp.int32)[None]
    jax.make_jaxpr(lambda q: paths.PATHS["fused"].run(q, q, q, paths.Call(pos, pos, scheme)))(q)
    assert paths.PATHS["fused"].accepts(scheme.traits, paths.CallSpec.of(scheme, 417, jnp.bfloat16)) is None
