"""Scoring a run's checkpoint: one module per evaluation kind (perplexity, passkey, attention), and
what they share (common.py: the run opened for scoring, the checkpoint loaded once, record
headers). Nothing here imports training."""
from experiment.evals.attention import evaluate_attention
from experiment.evals.passkey import PasskeySpec, evaluate_passkey
from experiment.evals.perplexity import evaluate

__all__ = ["PasskeySpec", "evaluate", "evaluate_attention", "evaluate_passkey"]
