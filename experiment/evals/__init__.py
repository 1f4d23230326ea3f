"""Scoring a run's checkpoint: a registry of evaluation kinds (kinds.py: `evaluate_kinds` opens the
run and restores its checkpoint once for every kind asked), one module per kind (perplexity,
passkey, attention: its scoring and its registry entry `KIND`), what they share (common.py: the run
opened for scoring, the checkpoint loaded, record headers), and the training-free methods by name
(methods.py). Nothing here imports training. The names below are imported from their modules on
first use, so that importing one module of the package (methods.py, JAX-free) loads no other."""
from posenc.lazy import lazy_attributes

_LAZY = {"evaluate_attention": "experiment.evals.attention", "Request": "experiment.evals.kinds",
         "evaluate_kinds": "experiment.evals.kinds", "PasskeySpec": "experiment.evals.passkey",
         "evaluate_passkey": "experiment.evals.passkey", "evaluate": "experiment.evals.perplexity"}

__all__ = ["PasskeySpec", "Request", "evaluate", "evaluate_attention", "evaluate_kinds", "evaluate_passkey"]

__getattr__ = lazy_attributes(__name__, _LAZY)
