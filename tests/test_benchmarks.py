"""The pure parts of the hand-run benchmarks (the benchmarks themselves are not run by CI)."""
from benchmarks.step_profile import torch_category, xla_category


def test_step_profile_puts_xla_ops_in_the_right_category():
    grad = "jit(train_step)/transpose(jvp())/"
    assert xla_category("ynn_fusion.81", "f32[2048,256]{1,0}", grad + "dot_general", 8, 8) == "dense products"
    assert xla_category("dot.57", "f32[256,1024]{1,0}", grad + "transpose", 8, 8) == "dense products"
    assert xla_category("ynn_fusion.60", "f32[8,8,64,192]{3,2,1,0}", grad + "reduce_sum", 8, 8) == "attention"
    assert xla_category("copy_bitcast_fusion.2", "f32[1024,2048]{1,0}", grad + "add_any", 8, 8) == "layout copies"
    assert xla_category("bitcast_pad_fusion.5", "f32[8,256,3,8,32]{4,3,2,1,0}", grad + "pad", 8, 8) == "layout copies"
    assert xla_category("copy_rsqrt_fusion.8", "f32[2048]{0}", "jit(train_step)/jvp()/rsqrt", 8, 8) == "other"
    assert xla_category("multiply_add_fusion.3", "f32[256]{0}", "jit(train_step)/add", 8, 8) == "optimizer"


def test_step_profile_puts_aten_ops_in_the_right_category():
    assert torch_category("aten::mm", [[2048, 256], [256, 1024]], 8, 8) == "dense products"
    assert torch_category("aten::copy_", [[8, 8, 256, 256], [8, 8, 256, 256], []], 8, 8) == "attention"
    assert torch_category("aten::bmm", [[64, 256, 32], [64, 32, 256]], 8, 8) == "attention"
    assert torch_category("aten::copy_", [[8, 256, 8, 32], [8, 256, 8, 32], []], 8, 8) == "layout copies"
    assert torch_category("aten::native_layer_norm_backward", [[8, 256, 256]], 8, 8) == "other"
    assert torch_category("aten::_foreach_mul_", [[], []], 8, 8) == "optimizer"
