"""Whether a generation's caches fit, checked before they are allocated: a cache is sized up front for
the prompt plus every new token, so `max_new_tokens=10_000_000` would otherwise take gigabytes (and
minutes) before failing, or swap the machine to a halt."""
from __future__ import annotations

import jax


def size(n: int) -> str:
    """Bytes as GB, or MB below 0.1 GB."""
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB"


def available_bytes(device: jax.Device | None = None) -> int | None:
    """Memory free for new arrays on `device` (default: JAX's first): an accelerator's free device
    memory, the host's MemAvailable for the CPU; None where neither can be read."""
    device = device or jax.devices()[0]
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        if "bytes_limit" in stats:
            return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_fits(cache_bytes: int, rows: int, slots: int, available: int | None = None) -> None:
    """ValueError where caches of `cache_bytes` exceed the memory free (`available`, else measured)."""
    available = available_bytes() if available is None else available
    if available is not None and cache_bytes > available:
        raise ValueError(f"the key / value caches of {rows} row(s) x {slots:,} tokens need {size(cache_bytes)}, "
                         f"more than the {size(available)} free; lower max_new_tokens (the cache holds the "
                         f"prompt and every new token)")
