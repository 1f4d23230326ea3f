"""Training: the loop (loop.py), the jitted update (step.py), the optimizer (optimizer.py), what is
reported while it runs (metrics.py), and starting from another run's parameters (init_from.py)."""
from experiment.train.loop import init_state, is_trained, train

__all__ = ["init_state", "is_trained", "train"]
