"""Dual Chunk Attention as `rope` options (dca_chunk_size, dca_local_window) against a transcription of
the position tables of HKUNLP/ChunkLlama's `chunkllama_attn_replace.py` (prefill), written out here in
numpy; its tiles, its attention paths, the decoder properties, and its refusals."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc
from tests.posenc.helpers import CFG, build_rope, logits_through_hooks, numpy_rope, qk, rope_model, tokens


def chunk_llama_reference(q_TxHxK, k_TxHxK, inv_freq, chunk_size, local_window, mscale=1.0):
    """ChunkLlama's prefill logits (positions 0 .. T-1) before the softmax, H x T x T (NaN where a
    query does not see a key). Chunks of c = chunk_size - local_window: keys rotated at their index
    mod c; each query chunk's queries at q_t (= index mod c) against its own chunk, at qc_t =
    min(index mod c + c, chunk_size) against the chunk before, and at qc_t[c - 1] against all the
    chunks before that; the three flash calls' results merged by their log-sum-exps are one
    softmax over these blocks."""
    t, _, d = q_TxHxK.shape
    c = chunk_size - local_window
    q_t = np.arange(c)
    qc_t = np.minimum(np.arange(c) + c, chunk_size)
    index_mod = np.arange(t) % c
    rope = lambda x, positions: numpy_rope(x, positions, inv_freq, mscale)
    k_rot = rope(k_TxHxK, np.arange(t) % c)
    q_intra, q_succ = rope(q_TxHxK, q_t[index_mod]), rope(q_TxHxK, qc_t[index_mod])
    q_inter = rope(q_TxHxK, np.full(t, qc_t[c - 1]))
    dot = lambda q, k: np.einsum("thk,shk->hts", q, k) / math.sqrt(d)
    logits = np.full((q_TxHxK.shape[1], t, t), np.nan)
    for begin in range(0, t, c):
        rows = slice(begin, min(begin + c, t))
        causal = np.tril(np.ones((rows.stop - begin,) * 2, bool))
        logits[:, rows, begin:rows.stop] = np.where(causal, dot(q_intra[rows], k_rot[begin:rows.stop]), np.nan)
        if begin >= c:
            logits[:, rows, begin - c:begin] = dot(q_succ[rows], k_rot[begin - c:begin])
        if begin >= 2 * c:
            logits[:, rows, :begin - c] = dot(q_inter[rows], k_rot[:begin - c])
    return logits


@pytest.mark.parametrize("size,window,options", [(8, 2, dict()), (6, 0, dict(fraction=0.5)),
                                                 (10, 3, dict(pi_factor=0.5, yarn_scale=2.0))])
def test_dca_logits_equal_the_authors(size, window, options):
    t = 31  # five chunks and a part
    scheme = build_rope(dca_chunk_size=size, dca_local_window=window, **options)
    q, k = qk(t, t)
    pos = jnp.arange(t)[None]
    got = np.asarray(logits_through_hooks(scheme, q, k, pos))[0]
    original = scheme.original_length
    inv_freq = np.asarray(posenc.scaled_inverse_frequencies(scheme.options, scheme.rotary_dim, original))
    expected = chunk_llama_reference(np.asarray(q[0]), np.asarray(k[0]), inv_freq, size, window,
                                     posenc.rope_mscale(scheme.options, original))
    seen = ~np.isnan(expected[0])
    assert (seen == np.tril(np.ones((t, t), bool))).all()
    np.testing.assert_allclose(got[:, seen], expected[:, seen], rtol=1e-4, atol=2e-5)
    chunk = np.arange(t) // (size - window)
    same_chunk = seen & (chunk[:, None] == chunk[None, :])
    plain = np.asarray(logits_through_hooks(build_rope(**options), q, k, pos))[0]
    np.testing.assert_array_equal(got[:, same_chunk], plain[:, same_chunk])  # intra-chunk: RoPE's own
    assert not np.allclose(got[:, seen & ~same_chunk], plain[:, seen & ~same_chunk], atol=1e-3)


@pytest.mark.slow  # five forward passes of a decoder with DCA's bias; the cheap part is in test_rope_scaling's VARIANTS
def test_dca_model_is_causal_prefix_consistent_equal_blockwise_and_adds_no_parameters():
    options = dict(dca_chunk_size=8, dca_local_window=2)  # chunks of 6: 6 of them in 34 positions
    lm = rope_model(**options)
    x = tokens(34)
    full = lm(x)
    changed = x.at[:, 20:].set((x[:, 20:] + 5) % CFG.vocab_size)
    np.testing.assert_allclose(lm(changed)[:, :20], full[:, :20], atol=1e-5, rtol=1e-5)  # causal
    np.testing.assert_allclose(lm(x[:, :21]), full[:, :21], atol=1e-5, rtol=1e-5)  # prefix-consistent
    # blockwise in tiles of 16 positions: every (query tile, key tile) gets its block of the bias
    np.testing.assert_allclose(rope_model("blockwise", **options)(x), full, atol=1e-5, rtol=1e-5)
    plain = rope_model()(x)
    assert not np.allclose(full, plain, atol=1e-4)
    np.testing.assert_allclose(full[:, :6], plain[:, :6], atol=1e-5, rtol=1e-5)  # one chunk: plain RoPE
    shapes = lambda m: jax.tree.map(jnp.shape, nnx.state(m, nnx.Param))
    assert shapes(lm) == shapes(rope_model())


@pytest.mark.parametrize("options, match", [
    (dict(dca_chunk_size=-1), "dca_chunk_size"),
    (dict(dca_chunk_size=8, dca_local_window=8), "dca_local_window"),
    (dict(dca_chunk_size=8, dca_local_window=-1), "dca_local_window"),
    (dict(dca_chunk_size=8, self_extend_window=4), "self_extend_window"),
    (dict(dca_chunk_size=8, rerope_window=4), "rerope_window"),
    (dict(dca_chunk_size=8, dynamic_ntk=True), "dynamic_ntk")])
def test_dca_undefined_combinations_are_refused(options, match):
    with pytest.raises(ValueError, match=match):
        build_rope(**options)
