"""Causal self-attention that calls the positional scheme's hooks, in five implementations (dense,
triangular, blockwise, fused, pallas); choice.py decides which one runs, statistics.py measures
where attention looks. NEG_INF and the hooks' tile logits are in tiles.py (re-exported by dense.py),
for every path; stickbreaking.py holds the stick-breaking weights and lambda_mask.py LM-Infinite's
Lambda mask, which the dense and blockwise paths apply."""
from models.attention.blockwise import blockwise_attention, needs_whole_rows
from models.attention.choice import attention_path, choose, is_long, runs_per_device, tile_width
from models.attention.dense import NEG_INF, Dropout, dense_attention, fused_attention, tile_logits
from models.attention.lambda_mask import LambdaMask, lambda_dense_attention
from models.attention.pallas import pallas_attention
from models.attention.statistics import attention_statistics, layer_statistics, qk_statistics
from models.attention.triangular import triangular_attention

__all__ = ["NEG_INF", "Dropout", "LambdaMask", "attention_path", "attention_statistics", "blockwise_attention",
           "choose", "dense_attention", "fused_attention", "is_long", "lambda_dense_attention", "layer_statistics",
           "needs_whole_rows", "pallas_attention", "qk_statistics", "runs_per_device", "tile_logits", "tile_width",
           "triangular_attention"]
