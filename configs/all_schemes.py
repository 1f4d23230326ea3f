"""The table of every scheme (issue #23; results/all_schemes/): every registered scheme and the notable
options, trained alike (configs/passkey.py: the demo's model and data with the passkey mix) and evaluated
alike (perplexity and passkey retrieval at each of config.eval.lengths), then one table and heat map.

    python sweep.py --config configs/all_schemes.py --table --workdir runs/all_schemes --out results/all_schemes

`get_config` is what every row shares; `get_table` is the study, read by sweep.py --table
(experiment/pipeline/table.py): every registered scheme with its defaults (a wrapper around its
default base), then
- `logn` and `randomized` around alibi too: their default base, rope, does not extrapolate and alibi
  does, so the pair says what each wrapper adds to either kind of base;
- rope with p_rope = 0.75 (Barbero et al.'s setting), a training-time choice;
- the rope run with each training-free extension switched on at evaluation, its options set per
  evaluation length by a rule of experiment/pipeline/table.py (RULES): PI, NTK-aware, dynamic NTK,
  YaRN, Llama 3, ReRoPE, Self-Extend, Dual Chunk Attention and LM-Infinite's Lambda mask. LongRoPE is
  left out: its factors are searched per model, not set by a rule;
- `NOTES`: what an every-scheme row is, in words, where its form departs from its paper's (ssmax).
The committed result (600 steps per run): results/all_schemes/ (configs/studies/all_schemes.py).
"""
import ml_collections

from configs import passkey

# (name, citation, the rule in words, (rule, arguments)): rope's training-free extensions, on the rope run
EXTENSIONS = (
    ("PI", "Chen et al. 2023", "pi_factor = L / L_valid", ("inverse_ratio", "posenc.rope.pi_factor")),
    ("NTK-aware", "bloc97 2023", "ntk_alpha = L_valid / L", ("ratio", "posenc.rope.ntk_alpha")),
    ("dynamic NTK", "emozilla 2023", "dynamic_ntk with factor f = 2 at every length: alpha = 2 n / L - 1 for a "
     "window of n tokens (f = 1 would be NTK-aware's alpha = n / L, the row above)",
     ("fixed", {"posenc.rope.dynamic_ntk": "true", "posenc.rope.dynamic_ntk_factor": "2"})),
    ("YaRN", "Peng et al. 2023", "yarn_scale = L_valid / L", ("ratio", "posenc.rope.yarn_scale")),
    ("Llama 3", "Meta 2024", "llama3_factor = L_valid / L (low / high frequency factors 1 / 4)",
     ("ratio", "posenc.rope.llama3_factor")),
    ("ReRoPE", "Su 2023", "rerope_window = L / 2 at every length",
     ("fraction_of_length", {"posenc.rope.rerope_window": (1, 2)})),
    ("Self-Extend", "Jin et al. 2024", "self_extend_window W = L / 2, self_extend_group G = ceil((L_valid - W) "
     "/ (L - W)), the smallest G whose largest relative position W + (L_valid - W) / G is <= L "
     "(1, 3, 7, 15, 31 at 1, 2, 4, 8, 16 L)", ("self_extend",)),
    ("DCA", "An et al. 2024", "dca_chunk_size = 3 L / 4, dca_local_window = L / 16 at every length (ChunkLlama's "
     "chunk of 3/4 of the pretraining window)",
     ("fraction_of_length", {"posenc.rope.dca_chunk_size": (3, 4), "posenc.rope.dca_local_window": (1, 16)})),
    ("LM-Infinite", "Han et al. 2024", "model.attention_sinks = 10, attention_window = L (0) at every length; the "
     "sinks beyond the window seen from distance W = L, as the authors' convert_llama_model (limit_distance = the "
     "window; before issue 34 this project used L for any window: the same here)",
     ("fixed", {"model.attention_sinks": "10"})),
)

# What an every-scheme row is, in words, where its form departs from its paper's (issue 34)
NOTES = {"ssmax": "scales the query vector by s log n, as logn does, so a position-only bias (alibi, t5, kerple) "
                  "stays unscaled where the paper scales the whole logit, bias included (attention outputs differ by "
                  "up to 0.73 within 64 positions around alibi, 3.8 at 1,024; README's reference defaults); around "
                  "rope, this row's base, no bias: the paper's form"}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """What every row shares: configs/passkey.py (`arg`: its scheme; each row sets its own)."""
    return passkey.get_config(arg)


def get_table() -> dict:
    """The rows beyond every registered scheme: {name, run, scheme, settings (the training run's
    config keys), overrides ((rule, arguments) at evaluation), rule (in words), cite}; and `notes`,
    what an every-scheme row is in words where its form departs from its paper."""
    rows = [dict(name=f"{wrapper} [alibi]", run=f"{wrapper}_alibi", scheme=wrapper,
                 settings={f"posenc.{wrapper}.base": "alibi"}, rule=f"trained with posenc.{wrapper}.base = alibi")
            for wrapper in ("logn", "randomized")]
    rows.append(dict(name="rope p-RoPE 0.75", run="rope_p0.75", scheme="rope", settings={"posenc.rope.p_rope": "0.75"},
                     rule="trained with posenc.rope.p_rope = 0.75: the highest 75% of the frequencies rotate",
                     cite="p-RoPE: Barbero et al. 2025"))
    rows += [dict(name=f"rope + {name}", run="rope", scheme="rope", overrides=overrides, rule=rule,
                  cite=f"{name}: {cite}") for name, cite, rule, overrides in EXTENSIONS]
    return {"every_scheme": True, "rows": rows, "notes": NOTES}
