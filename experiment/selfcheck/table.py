"""The self-check's result as text (experiment/selfcheck/check.py measures it): one line per row while it
runs, and the markdown file a user reads, commits or attaches to a report."""
from __future__ import annotations

COLUMNS = ("scheme", "length", "path", "auto picks", "forward error", "gradient error", "train tokens/s",
           "eval tokens/s", "train MB", "eval MB", "status")


def slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text.lower()).strip("_")


def one_line(row: dict) -> str:
    """A row as the command prints it while it runs."""
    errors = (f"fwd {row['forward_error']:.1e} grad {row['gradient_error']:.1e}" if "forward_error" in row else "")
    speed = (f"train {row['train_tokens_per_s']:,.0f} tok/s eval {row['eval_tokens_per_s']:,.0f} tok/s"
             if "train_tokens_per_s" in row else "")
    return "  ".join(x for x in (f"{row['scheme']:>11} {row['length']:>6} {row['path']:>10}", row["status"], errors,
                                 speed, f"auto: {row['auto']}" if row["auto"] else "", row["note"]) if x)


def _megabytes(mb: float) -> str:
    return f"{mb:,.0f}" if mb >= 100 else f"{mb:.2g}"


def _cells(row: dict) -> list[str]:
    number = lambda key, fmt: (fmt(row[key]) if callable(fmt) else fmt.format(row[key])) if row.get(key) is not None else "-"
    status = f"**{row['status']}**" if row["status"] == "WRONG" else row["status"]
    return [f"`{row['scheme']}`", f"{row['length']:,}", row["path"], row["auto"] or "-",
            number("forward_error", "{:.1e}"), number("gradient_error", "{:.1e}"),
            number("train_tokens_per_s", "{:,.0f}"), number("eval_tokens_per_s", "{:,.0f}"),
            number("train_mb", _megabytes), number("eval_mb", _megabytes), status]


def markdown(result: dict) -> str:
    """The table with what it measured, how, and the outcome; notes (why a row was skipped, n/a or
    refused; the Pallas launch) below it."""
    plan = result["plan"]
    model = plan["model"]
    if result["passed"]:
        verdict = "**PASS**: every path the framework would use is within tolerance"
    elif result["wrong"]:
        verdict = (f"**FAIL**: {result['wrong']} row(s) WRONG: a path the framework would use computes something "
                   f"else on this machine")
    else:
        verdict = "**FAIL**: nothing was checked (every row skipped, n/a or not run: see the notes)"
    lines = [
        f"# Self-check: {result['device']} ({result['backend']}, {result['devices']} device(s))", "",
        f"`python selfcheck.py{' --short' if plan['mode'] == 'short' else ''}`, {result['date']}, jax "
        f"{result['jax']}, {plan['dtype']}, {result['seconds'] / 60:.0f} min. {verdict}.", "",
        f"Errors: the attention function on one sequence of random q, k, v ({model['num_heads']} heads of "
        f"{model['d_model'] // model['num_heads']}) against dense attention in float32 at the highest matmul "
        f"precision; max |error| / max |reference|, the gradient's the largest over dQ, dK, dV and the scheme's "
        f"parameters. WRONG: above {result['xla_factor']:g} x the largest error of XLA's own paths (dense, "
        f"triangular, blockwise) at that length, kept within [{result['floor']:g}, {result['cap']:g}], as the "
        f"device check judges a kernel (models/attention/verify.py). Throughput: a decoder of {model['num_layers']} "
        f"layer(s), d = {model['d_model']}, FFN {model['mlp_dim']}, vocabulary {model['vocab_size']}, "
        f"`model.attention=<path>`, {plan['step_tokens']:,} tokens per step (AdamW), median of "
        f"{plan['repeats']}; MB: what XLA plans for the compiled program (arguments, outputs, temporaries). "
        f"`auto picks`: the path `model.attention=auto` takes at that length.", "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" if c in ("scheme", "path", "auto picks", "status") else "---:" for c in COLUMNS) + "|",
    ]
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in result["rows"]]
    notes = sorted({(row["path"], row["status"], row["note"]) for row in result["rows"] if row["note"]})
    if notes:
        lines += ["", "Notes:"]
        lines += [f"- {path} ({status}): {note}" for path, status, note in notes]
    return "\n".join(lines) + "\n"
