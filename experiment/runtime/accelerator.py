"""What the run needs to know about its devices: the compilation cache, whether a compiled step
fits in device memory, peak memory, and model-FLOPs utilisation.

Compiled programs are cached on disk (JAX's persistent compilation cache), so a second training or
evaluation process with the same shapes compiles nothing: `LX_COMPILATION_CACHE=DIR` picks the
folder (default `~/.cache/lengthx/xla`, or JAX's own JAX_COMPILATION_CACHE_DIR when that is set),
`LX_COMPILATION_CACHE=off` switches it off.
"""
from __future__ import annotations

import os
import pathlib
import resource
import sys
from typing import Sequence

import jax

# Dense bf16 peak TFLOP/s per chip, from the vendors' data sheets; matched against device_kind, most
# specific first. LX_PEAK_TFLOPS overrides (for other devices, or a measured peak).
PEAK_BF16_TFLOPS = (
    ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.4), ("H200", 989.4), ("GH200", 989.4),
    ("B200", 2250.0), ("A100", 312.0), ("L40S", 362.0), ("L4", 121.0), ("A10G", 70.0), ("V100", 125.0),
    ("TPU v6", 918.0), ("TPU v5 lite", 197.0), ("TPU v5e", 197.0), ("TPU v5", 459.0), ("TPU v4", 275.0),
    ("TPU v3", 123.0),
)


def enable_compilation_cache() -> str | None:
    """Point JAX's persistent compilation cache at the configured folder and cache every program
    (the default skips those compiled in under a second). Returns the folder, or None when off."""
    choice = os.environ.get("LX_COMPILATION_CACHE", "")
    if choice.lower() in ("off", "0", "none"):
        return None
    folder = choice or os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(
        pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "lengthx" / "xla")
    pathlib.Path(folder).mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder


def peak_tflops(device: jax.Device | None = None) -> float | None:
    """The device's dense bf16 peak (LX_PEAK_TFLOPS wins), or None for an unknown device (CPU)."""
    if os.environ.get("LX_PEAK_TFLOPS"):
        return float(os.environ["LX_PEAK_TFLOPS"])
    kind = (device or jax.local_devices()[0]).device_kind
    for name, tflops in PEAK_BF16_TFLOPS:
        if name.lower() in kind.lower():
            return tflops
    return None


def device_memory_limit(device: jax.Device | None = None) -> int | None:
    """Bytes a program may use on the device, or None where the backend does not say (CPU)."""
    stats = (device or jax.local_devices()[0]).memory_stats()
    return int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


def peak_memory_gb() -> tuple[str, float]:
    """('peak_device_memory_gb', the largest peak over local devices) on accelerators;
    ('peak_host_memory_gb', the process's peak resident size) where devices do not report (CPU)."""
    peaks = [s.get("peak_bytes_in_use", 0) for s in (d.memory_stats() for d in jax.local_devices()) if s]
    if peaks:
        return "peak_device_memory_gb", max(peaks) / 1e9
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return "peak_host_memory_gb", kb * (1 if sys.platform == "darwin" else 1024) / 1e9


def program_bytes(compiled) -> int | None:
    """Device bytes a compiled program needs (arguments + outputs + temporaries - donated aliases),
    from XLA's memory analysis; None where the backend gives none."""
    try:
        m = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - some backends do not implement it
        return None
    if m is None:
        return None
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes)


def memory_options(*, micro_rows: int, micro_steps: int, seq_len: int, fsdp: int, devices: int) -> str:
    """What lowers the memory of a training step, in the words of the config."""
    tokens = micro_rows * seq_len
    options = [f"a smaller micro-batch (--config.train.device_batch_tokens={max(seq_len, tokens // 2)}; now "
               f"{tokens} tokens per device, {micro_steps} micro-step(s) per update; the update stays "
               f"train.batch_size)"]
    if devices > fsdp:
        options.append(f"sharding parameters and optimizer state (--config.mesh.fsdp={min(devices, fsdp * 2)})")
    return "use " + " or ".join(options)


def memory_advice(need: int | None, limit: int | None, **step: int) -> str | None:
    """None if the step fits (or the sizes are unknown); else what to change."""
    if need is None or limit is None or need <= limit:
        return None
    return (f"the training step needs {need / 2**30:.1f} GiB per device but the device has "
            f"{limit / 2**30:.1f} GiB; " + memory_options(**step))


def training_flops_per_token(model_cfg, seq_len: int, vocab_size: int,
                             band_shares: Sequence[float] | None = None) -> float:
    """Model FLOPs of one trained token (forward + backward = 3 x forward; no rematerialisation):
    the matrix products of every layer (q, k, v, output, MLP), attention's two products over the
    causal half of the window, and the output layer (the adaptive softmax's head only, since tail
    clusters are scored for the few tokens that fall in them).
    `band_shares` (adaptive models: the share of trained tokens in each band, head first) counts
    the adaptive parts by the work each token needs: the adaptive input's projection of its own
    band (dim_i x d; the table lookup is free), the softmax head (d x (c0 + clusters)) for every
    token, and tail cluster i's projection and word scores (d x dim_i + dim_i x band size) for the
    tokens whose target lies in it."""
    d, f, n = model_cfg.d_model, model_cfg.mlp_dim, model_cfg.num_layers
    per_layer = 2 * (4 * d * d + 2 * d * f) + 2 * 2 * d * (seq_len + 1) / 2
    cutoffs = tuple(model_cfg.adaptive_cutoffs)
    output = 2 * d * (cutoffs[0] + len(cutoffs) if cutoffs else vocab_size)
    if cutoffs and band_shares is not None:
        edges = (0, *cutoffs, vocab_size)
        dims = [d // model_cfg.adaptive_factor ** i for i in range(len(edges) - 1)]
        output += sum(share * 2 * dim * d for share, dim in zip(band_shares, dims))
        output += sum(share * 2 * dim * (d + hi - lo)
                      for share, dim, lo, hi in zip(band_shares[1:], dims[1:], edges[1:], edges[2:]))
    return 3.0 * (n * per_layer + output)
