"""The pure parts of the hand-run benchmarks (the benchmarks themselves are not run by CI)."""
import json
import os
import pathlib
import subprocess
import sys
import tarfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

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


def test_gpu_step_model_flops_of_a_small_decoder():
    from benchmarks.gpu_step import STANDARD_SHRUNK, model_flops_per_step
    # d = 64, 2 layers, FFN 256, vocabulary 512 (tied), L = 64, batch 8: 6 x (2 x (4 d^2 + 2 d f) + d V)
    # per token for the products, 6 x layers x d x (L + 1) for causal attention
    per_token = 6 * (2 * (4 * 64 * 64 + 2 * 64 * 256) + 64 * 512) + 6 * 2 * 64 * 65
    assert per_token == 836_352
    assert model_flops_per_step(STANDARD_SHRUNK, 64, 8) == 8 * 64 * per_token


def test_gpu_step_counts_adaptive_bands_by_the_tokens_in_them():
    from benchmarks.common import zipf_ids
    from benchmarks.gpu_step import band_shares, model_flops_per_step
    model = dict(vocab_size=30_000, num_layers=2, d_model=64, num_heads=4, mlp_dim=128,
                 adaptive_cutoffs=(2000, 10000), adaptive_factor=4)
    shares = (0.5, 0.3, 0.2)  # band dims 64, 16, 4; tail sizes 8,000 and 20,000
    input_side = 0.5 * 64 * 64 + 0.3 * 16 * 64 + 0.2 * 4 * 64
    tails = 0.3 * 16 * (64 + 8000) + 0.2 * 4 * (64 + 20000)
    extra = model_flops_per_step(model, 32, 2, shares) - model_flops_per_step(model, 32, 2)
    assert abs(extra - 6 * (input_side + tails) * 64) < 1e-6 * extra
    tokens = zipf_ids(30_000, (4, 256))
    measured = band_shares(tokens, (2000, 10000))
    assert abs(sum(measured) - 1) < 1e-9 and 0.6 < measured[0] < 0.9  # Zipf: the head holds most words
    assert band_shares([0, 1999, 2000, 9999, 10000, 29999], (2000, 10000)) == [1 / 3] * 3


def test_gpu_step_records_a_failing_runner_and_times_the_others():
    from benchmarks.common import interleaved_tokens_per_s

    def fails():
        raise RuntimeError("no compiler")
    errors = {}
    tps = interleaved_tokens_per_s({"good": lambda: 1, "bad": fails}, 100, 3, warmup=1, errors=errors)
    assert set(tps) == {"good"} and errors == {"bad": "RuntimeError: no compiler"}


def test_gpu_step_targets_and_file_name():
    from benchmarks.gpu_step import slug, targets
    row = lambda scheme, runner, tps, over=None, model="standard", mfu=None, dropout="off": dict(
        model=model, scheme=scheme, seq_len=512, runner=runner, tokens_per_s=tps, over_theirs_compiled=over,
        mfu=mfu, dropout=dropout)
    rows = [row("alibi", "ours auto", 100.0, 1.3), row("alibi", "theirs compiled", 77.0),
            row("t5", "ours auto", 80.0, 1.1), row("alibi", "ours auto", 1.0, model="paper", mfu=0.5, dropout="on")]
    met = {t["target"].split(":")[0]: t["met"] for t in targets(rows)}
    assert met["alibi L=512"] is True and met["t5 L=512"] is False and met["rope L=512"] is None
    assert met["L=512 ours auto"] is False  # t5 at 80% of alibi
    assert met["paper alibi with dropout"] is True
    assert slug("NVIDIA H100 80GB HBM3") == "nvidia_h100_80gb_hbm3"


def test_hf_load_memory_writes_a_checkpoint_that_loads(tmp_path):
    """The synthetic Llama checkpoint (here tiny) has every tensor the loader asks for, in shards."""
    from benchmarks.hf_load_memory import LLAMA_3_2_1B, tensor_shapes, write_checkpoint
    from models.formats import hf
    config = {**LLAMA_3_2_1B, "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 96,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 300}
    total = write_checkpoint(tmp_path, config, shards=3)
    shapes = tensor_shapes(config)
    assert total == 2 * sum(int(np.prod(s)) for s in shapes.values())
    assert len({p.name for p in tmp_path.glob("model-*.safetensors")}) == 3
    model, _ = hf.load(tmp_path, dtype="bfloat16")
    leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
    assert sum(x.size for x in leaves) == total // 2 and all(x.dtype == jnp.bfloat16 for x in leaves)


def test_first_contact_tiny_compares_our_kernel_and_jaxs_with_the_reference(monkeypatch):
    """benchmarks.first_contact --tiny on CPU: our kernel and jax's own Pallas flash attention (both
    interpreted) within bfloat16 rounding of the float32 reference and of each other; cuDNN named
    as not here; jax's kernel says it takes no bias for alibi."""
    from benchmarks import first_contact
    monkeypatch.setitem(first_contact.TINY, "shapes", ((2, 64),))
    monkeypatch.setattr(first_contact, "enable_compilation_cache", lambda: None)  # this process's jax config kept
    monkeypatch.setenv("LX_LAUNCH_CANDIDATES", "0")
    rows = {(r["scheme"], r["path"]): r for r in first_contact.main(["--tiny", "--schemes", "nope,alibi"])}
    assert os.environ["LX_LAUNCH_CANDIDATES"] == "0"  # its one candidate only while it runs
    errors = {key: r["error"] for key, r in rows.items() if r["error"] is not None}
    assert set(errors) == {("nope", "ours (pallas)"), ("nope", "jax pallas mha"), ("alibi", "ours (pallas)")}
    assert all(0 < e < 1e-2 for e in errors.values())
    assert errors[("nope", "ours (pallas)")] == errors[("nope", "jax pallas mha")]  # the same rounding
    assert rows[("alibi", "cudnn")]["note"] == rows[("nope", "cudnn")]["note"] == "cuDNN is on NVIDIA GPUs only"
    assert rows[("alibi", "jax pallas mha")]["note"] == "takes no bias"
    ours = rows[("nope", "ours (pallas)")]
    assert ours["forward_tflop_per_s"] > 0 and ours["backward_tflop_per_s"] > 0  # timed apart


def test_kernel_cost_counts_the_per_logit_operations_of_the_lowered_kernels():
    """benchmarks.kernel_cost on nope's kernel (lowered for CUDA here): three kernels with the two or
    more products each, one exp per logit, and the dropout hash's integer work on top."""
    from benchmarks import kernel_cost
    asm = ('%1 = arith.mulf %a, %b : tensor<64x64xf32>\n%2 = tt.splat %c : f32 -> tensor<64x64xf32>\n'
           '%3 = tt.extern_elementwise %1 {symbol = "__nv_expf"} : (tensor<64x64xf32>) -> tensor<64x64xf32>\n'
           '%4 = arith.xori %x, %y : tensor<64x64xi32>\n%5 = arith.addf %s, %t : tensor<64xf32>')
    assert kernel_cost.tile_ops(asm, 64) == {"float": 1, "transcendental": 1, "int": 1}
    plain = [kernel_cost.tile_ops(m, 64) for m in kernel_cost.lowered_kernels("nope", 64, 64, dropout=False)]
    dropped = [kernel_cost.tile_ops(m, 64) for m in kernel_cost.lowered_kernels("nope", 64, 64, dropout=True)]
    assert len(plain) == len(dropped) == 3
    assert [c["dot"] for c in plain] == [2, 3, 4] and all(c["transcendental"] == 1 for c in plain)
    # the mask: 6 integer operations per logit (xor, multiply, shift, xor, multiply, compare; issue 46: was 10)
    assert all(d["int"] == p["int"] + 6 for p, d in zip(plain, dropped))


def test_throughput_times_each_schemes_logits_forward_and_backward():
    """benchmarks.throughput's `logits_ms_per_layer`: one layer's logits with every hook of the scheme
    (DAPE's transform: its MLP) differentiated, at a tiny shape."""
    from benchmarks.throughput import logits_seconds
    assert 0 < logits_seconds("dape", 16, 2, 1) < 5


# ---- benchmarks/gpu_first_run.sh: the first GPU run, its dry run on a CPU -----------------------------

GPU_RUN = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_first_run.sh"


def _gpu_run(out, *args, timeout=600):
    return subprocess.run(["bash", str(GPU_RUN), "--dry-run", "--out", str(out), *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHON": sys.executable})


def _archive(out) -> dict:
    """{name: bytes} of the run's archive (what comes back from the GPU machine)."""
    with tarfile.open(out / "gpu_first_run.tar.gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def _sections_passed(out, timeout, *args, sections) -> tuple[str, dict]:
    """(the summary, the archive's files) of a dry run with `args` that ended well, every one of `sections`
    with exit status 0."""
    result = _gpu_run(out, *args, timeout=timeout)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = (out / "summary.txt").read_text()
    for section in sections:
        assert f"\n{section}: rc=0 " in summary, summary
    return summary, _archive(out)


def test_gpu_first_run_dry_run_writes_a_summary_and_an_archive_as_each_section_ends(tmp_path):
    """The script's cheap part in CI (its env section; every section: the slow test below): the
    summary line per section, the archive of every file, the packages the image lacks unimportable,
    and the launch command it documents under the device tool's 2,000 characters."""
    result = _gpu_run(tmp_path, "--sections", "env")
    assert result.returncode == 0, result.stderr[-2000:]
    summary = (tmp_path / "summary.txt").read_text()
    assert summary.splitlines()[0].startswith("gpu_first_run ") and "\nenv: rc=0 " in summary
    env = json.loads(_archive(tmp_path)["out/env.json"])
    assert {"datasets", "gguf"} <= set(env["not_importable"]) and env["backend"] == "cpu"
    launch = next(line.strip("# ").strip() for line in GPU_RUN.read_text().splitlines()
                  if "bash .gpurun/benchmarks/gpu_first_run.sh" in line)
    assert len(launch) < 2000 and "--wheels .whl" in launch
    wrong = subprocess.run(["bash", str(GPU_RUN), "--nosuch"], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and "--dry-run" in wrong.stderr


@pytest.mark.slow  # ~5 minutes on 2 cores: every section of the GPU run on tiny shapes, kernels interpreted
def test_gpu_first_run_dry_run_runs_every_section(tmp_path):
    _, files = _sections_passed(tmp_path, 1800, sections=("env", "check", "contact", "auto", "train", "selfcheck"))
    assert {"out/env.json", "out/check_margins.json", "out/check_margins.md", "out/first_contact.json",
            "out/auto.json", "out/train.json", "out/selfcheck/selfcheck_cpu_short.json"} <= set(files)
    checks = json.loads(files["out/check_margins.json"])["checks"]
    assert [(c["path"], c["status"]) for c in checks] == [("pallas", "passed"), ("fused", "passed")]
    train = json.loads(files["out/train.json"])["rows"][0]
    assert train["tokens_per_s"] > 0 and 0 < train["mfu"] and "attention_used" in train
    auto = json.loads(files["out/auto.json"])["schemes"][0]
    assert auto["train"] and auto["eval 1024"] and "error" not in auto


@pytest.mark.slow  # ~1 minute on 2 cores: the second prepared GPU session (long inputs) on tiny shapes
def test_gpu_session_b_dry_run_evaluates_long_and_prefills_with_each_path(tmp_path):
    summary, files = _sections_passed(tmp_path, 1200, "--session", "b", sections=("env", "evallen", "prefill"))
    assert "sections=env,evallen,prefill budget=500s" in summary
    evallen = json.loads(files["out/evallen.json"])["rows"]
    assert [(r["scheme"], r["length"]) for r in evallen] == [("alibi", 128), ("alibi", 256)]
    assert all(r["tokens_per_s"] > 0 and r["compile_s"] > 0 and r["attention"] for r in evallen)
    prefill = json.loads(files["out/prefill.json"])["rows"]
    assert [r["attention"] for r in prefill] == ["auto", "blockwise"] and "blockwise" in prefill[1]["attention_used"]
    assert all(r["prefill_tokens_per_s"] > 0 and 0 < r["fraction_of_bound"] and r["decode_tokens_per_s"] > 0
               for r in prefill)


@pytest.mark.slow  # ~2 minutes on 2 cores: the tiny Llama fine-tuned with PI and YaRN, scored, reported
def test_gpu_session_c_dry_run_extends_a_tiny_model_end_to_end(tmp_path):
    _, files = _sections_passed(tmp_path, 1500, "--session", "c", sections=("env", "extend"))
    ruler = {m: json.loads(files[f"out/extend/records/{m}/ruler.json"]) for m in ("pi", "yarn")}
    assert all(len(r) == 1 and r[0]["count"] == 2 and r[0]["distances"] for r in ruler.values())
    tuned = json.loads(files["out/extend/records/pi/extrapolation.json"])
    assert sorted(r["eval_length"] for r in tuned) == [64, 256] and json.loads(
        files["out/extend/records/base/extrapolation.json"])
    assert "out/extend/report/ppl_vs_length.md" in files and "out/extend/report/ruler.md" in files
    assert files["out/extend/run_records/pi/eval/ruler.json"] == files["out/extend/records/pi/ruler.json"]


@pytest.mark.slow  # ~30 s on 2 cores: the tiny Llama imported, RULER asked with two methods, reported
def test_gpu_session_d_dry_run_asks_ruler_with_each_method_and_returns_the_records(tmp_path):
    summary, files = _sections_passed(tmp_path, 1200, "--session", "d", sections=("env", "ruler"))
    assert "sections=env,ruler budget=500s" in summary
    records = json.loads(files["out/ruler/records/ruler.json"])
    assert sorted(r["method"] for r in records) == ["self_extend", "yarn"]
    assert all(r["task"] == "niah_single_1" and r["count"] == 2 and r["eval_length"] == 512 for r in records)
    assert files["out/ruler/run_records/eval/ruler.json"] == files["out/ruler/records/ruler.json"]
    assert "out/ruler/report/ruler.md" in files


def test_gpu_sessions_are_named_and_sized(tmp_path):
    """`--session a|b|c|d` picks the sections and a 500 s budget (under the nine minutes of a fresh H100
    with its start); any other session is refused in one line."""
    wrong = subprocess.run(["bash", str(GPU_RUN), "--session", "e"], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and "a, b, c and d" in wrong.stderr
    result = _gpu_run(tmp_path, "--session", "a", "--sections", "env")  # the session's budget, sections as given
    assert result.returncode == 0 and "sections=env budget=500s" in (tmp_path / "summary.txt").read_text()


def test_gpu_long_counts_prefill_flops_of_smollm2s_shape():
    """2 x 134.5M matrix parameters a token (SmolLM2-135M's count without the embedding lookup, the tied
    head once) plus 2 x 30 x T^2 x 576 of causal attention."""
    from benchmarks.gpu_long import SMOLLM2, prefill_flops
    from models.config import ModelConfig
    cfg = ModelConfig(**SMOLLM2)
    per_token = 2 * (30 * (576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536) + 576 * 49152)
    assert prefill_flops(cfg, 1) == per_token + 2 * 30 * 576
    assert abs(per_token / 2 / 134.5e6 - 1) < 0.01


def test_prefill_profile_puts_xla_ops_in_the_right_category():
    from benchmarks.prefill_profile import category
    branch = "jit(prefill)/while/body/closed_call/while/body/closed_call/cond/branch_1_fun/"
    assert category("custom-call", "jit(prefill)/ffi_call", "custom-call.3") == "attention kernel (cpu_flash)"
    assert category("fusion", "", "ynn_fusion.72") == "attention products (QK, PV)"  # a tile's product: no op name
    assert category("fusion", "jit(prefill)/while/body/closed_call/dot_general", "ynn_fusion.242") == "weight products"
    assert category("fusion", branch + "exp", "subtract_exponential_fusion") == "softmax exp"
    assert category("fusion", branch + "reduce_max", "reduce_fusion.3") == "softmax max"
    assert category("fusion", branch + "squeeze", "copy_bitcast_fusion.1") == "attention layout copies"
    assert category("copy", "", "copy.13") == "attention layout copies"
    assert category("fusion", "jit(prefill)/add", "add_fusion.2") == "other (norms, rotation, residuals, cache)"


def test_generation_benchmark_counts_a_prefills_flops():
    from benchmarks.vs_transformers_generate import matmul_shapes, prefill_flops
    dims = {"layers": 30, "d_model": 576, "heads": 9, "kv_heads": 3, "head_dim": 64, "mlp_dim": 1536,
            "vocab": 49152, "gated": True}
    per_layer_weights = 576 * 960 + 576 * 576 + 3 * 576 * 1536  # qkv, output, gate / up / down
    flops = prefill_flops(dims, 16384)
    assert flops == 30 * (2 * per_layer_weights * 16384 + 2 * 16384 ** 2 * 576) + 2 * 576 * 49152
    assert 12.5e12 < flops < 13e12  # the "about 3.5 + 9.3 TFLOP" at 16k
    assert (4096, 576, 1536) in matmul_shapes(dims) and (2048, 2048, 2048) in matmul_shapes(dims)


def test_the_matmul_peak_is_the_best_of_queued_products_of_several_shapes():
    """Issue 68, item 1: 'MFU 0.43' rested on 10 single awaited products of one shape."""
    from benchmarks import common
    measured = common.queued_matmul_peak("float32", shapes=((64, 64, 64), (128, 32, 64)), queued=50, rounds=1)
    assert set(measured["per_shape"]) == {"64x64x64", "128x32x64"} and measured["queued"] == 50
    assert measured["best"] == max(measured["per_shape"].values()) > 0
    assert len(common.PEAK_SHAPES["accelerator"]) >= 3 and len(common.PEAK_SHAPES["cpu"]) >= 3


def test_compile_share_counts_the_programs_a_test_compiles(tmp_path):
    """benchmarks/compile_share.py, as a pytest plugin over a test file of two tests: the one that
    compiles a program is charged with it (and its compile seconds), the one that compiles nothing is not."""
    (tmp_path / "test_two.py").write_text(
        "import jax, jax.numpy as jnp\n"
        "def test_compiles():\n    assert jax.jit(lambda x: jnp.sin(x) * 3)(jnp.ones(5)).shape == (5,)\n"
        "def test_plain():\n    assert 1 + 1 == 2\n")
    out = tmp_path / "share.json"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "benchmarks.compile_share", "-p", "no:cacheprovider",
                           "--compile_share_json", str(out), "--rootdir", str(tmp_path), str(tmp_path / "test_two.py")],
                          cwd=pathlib.Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "LX_COMPILATION_CACHE": "off"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "compile share: 2 tests" in done.stdout
    tests = {k.split("::")[-1]: v for k, v in json.loads(out.read_text()).items()}
    assert tests["test_compiles"]["programs"] >= 1 and tests["test_compiles"]["compile"] > 0
    assert "programs" not in tests["test_plain"]
