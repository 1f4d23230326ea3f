"""The optimizer: gradient clipping, then AdamW or NAG, with fairseq's warm-up + cosine schedule."""
from __future__ import annotations

import jax
import optax

from experiment.config import OPTIMIZERS, ConfigError, TrainConfig


def lr_schedule(train_cfg: TrainConfig) -> optax.Schedule:
    """Linear warm-up from train.warmup_init_lr to train.lr, then cosine to lr * min_lr_ratio at
    train.steps (fairseq's `cosine` scheduler with one period, as in Press et al.)."""
    return optax.warmup_cosine_decay_schedule(
        init_value=train_cfg.warmup_init_lr, peak_value=train_cfg.lr,
        warmup_steps=train_cfg.warmup_steps, decay_steps=max(train_cfg.steps, train_cfg.warmup_steps + 1),
        end_value=train_cfg.lr * train_cfg.min_lr_ratio)


def make_optimizer(train_cfg: TrainConfig) -> optax.GradientTransformation:
    """Gradient clipping, then AdamW (decay on matrices only) or NAG (SGD with Nesterov momentum)."""
    schedule = lr_schedule(train_cfg)
    name = train_cfg.optimizer
    if name == "adamw":
        decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
        opt = optax.adamw(schedule, b1=train_cfg.b1, b2=train_cfg.b2,
                          weight_decay=train_cfg.weight_decay, mask=decay_mask)
    elif name == "nag":
        opt = optax.sgd(schedule, momentum=train_cfg.momentum, nesterov=True)
    else:
        raise ConfigError(f"unknown train.optimizer {name!r}; valid: {', '.join(OPTIMIZERS)}")
    return optax.chain(optax.clip_by_global_norm(train_cfg.grad_clip), opt)


def lr_at(train_cfg: TrainConfig, step: int) -> float:
    return float(lr_schedule(train_cfg)(step))
