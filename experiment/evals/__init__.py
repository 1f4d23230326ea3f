"""Scoring a run's checkpoint: a registry of evaluation kinds (kinds.py: `evaluate_kinds` opens the
run and restores its checkpoint once for every kind asked), one module per kind (perplexity,
passkey, attention: its scoring and its registry entry `KIND`), and what they share (common.py:
the run opened for scoring, the checkpoint loaded, record headers). Nothing here imports training."""
from experiment.evals.attention import evaluate_attention
from experiment.evals.kinds import Request, evaluate_kinds
from experiment.evals.passkey import PasskeySpec, evaluate_passkey
from experiment.evals.perplexity import evaluate

__all__ = ["PasskeySpec", "Request", "evaluate", "evaluate_attention", "evaluate_kinds", "evaluate_passkey"]
