"""The training-free methods of results/training_free/ and their settings per evaluation length, the
evaluation of a run under each (with and without log-n), and the tables of the README; steps of the
study configs/studies/training_free.py.

    python -m experiment.study.training_free evaluate WORKDIR [--direct_only]
    python -m experiment.study.training_free tables ROOT --out results/training_free

`evaluate` scores perplexity (the whole validation split) and passkey retrieval (5 depths x 20 keys)
at L ... 16L through the same library calls as eval_extrapolate.py (`--set` = `overrides`), in one
process, skipping what the run's records already hold: every method below, or with --direct_only
the run's own options (a fine-tune's, or the plain base's), each with and without log-n. `tables` reads the records back from the runs
under ROOT (base, imported, pi, yarn, plain) and writes ppl.md, passkey.md and the records' copies.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import shutil

from experiment.evals import PasskeySpec, evaluate, evaluate_passkey
from experiment.evals import methods as training_free
from experiment.store.run import RunDir

MULTIPLES = (1, 2, 4, 8, 16)
LOGN = {"posenc.name": "logn"}


def settings(method: str, k: int, train_length: int) -> dict[str, str]:
    """The --set options of `method` (its label in the tables) at L_valid = k L: the library's
    (experiment/evals/methods.py; k = 1: none for a method that only rescales, its factor would be 1)."""
    return training_free.options(BY_LABEL[method], k * train_length, train_length)


BY_LABEL = {method.label: name for name, method in training_free.METHODS.items()}
METHODS = ("direct", "PI", "NTK-aware", "dynamic NTK", "YaRN", "Llama 3", "ReRoPE", "Self-Extend", "DCA")
PASSKEY = PasskeySpec(depths=(0.0, 0.25, 0.5, 0.75, 1.0), per_cell=20, seed=1234, digits=None)


def _key(overrides: dict) -> str:
    return json.dumps(overrides, sort_keys=True)


def _done(run: RunDir, kind: str) -> set[tuple[int, str]]:
    step = run.latest_step()
    return {(int(r["eval_length"]), _key(r.get("overrides", {}))) for r in run.records(kind) if r.get("step") == step}


def base_length(run: RunDir) -> int:
    """L: the training length of the base (a fine-tune's rope.original_length, set by configs/extend.py)."""
    config = run.load_config()
    return int(config.posenc.rope.original_length or config.train.seq_len)


def plan(run: RunDir, direct_only: bool) -> dict[str, list[int]]:
    """{override set (JSON): lengths} for every method (or the run's own options only) x log-n."""
    train_length = base_length(run)
    lengths: dict[str, list[int]] = {}
    for method in ("direct",) if direct_only else METHODS:
        for k in MULTIPLES:
            for logn in (False, True):
                overrides = {**settings(method, k, train_length), **(LOGN if logn else {})}
                lengths.setdefault(_key(overrides), []).append(k * train_length)
    return {key: sorted(set(v)) for key, v in lengths.items()}


def evaluate_run(workdir: str, direct_only: bool) -> None:
    run = RunDir(workdir)
    for key, lengths in plan(run, direct_only).items():
        overrides = json.loads(key)
        todo = [n for n in lengths if (n, key) not in _done(run, "perplexity")]
        if todo:
            evaluate(workdir, todo, overrides=overrides)
        todo = [n for n in lengths if (n, key) not in _done(run, "passkey")]
        if todo:
            evaluate_passkey(workdir, todo, PASSKEY, overrides=overrides)


# --- tables ------------------------------------------------------------------------------------

RUNS = {"base": "base (trained here)", "imported": "base, exported and re-imported", "pi": "PI fine-tune",
        "yarn": "YaRN fine-tune", "plain": "plain RoPE fine-tune"}


def _values(run: RunDir) -> tuple[dict, dict]:
    """({(length, overrides key): ppl}, {(length, overrides key): mean passkey accuracy over depths})."""
    ppl = {(int(r["eval_length"]), _key(r.get("overrides", {}))): r for r in run.records("perplexity")
           if r.get("step") == run.latest_step() and not r.get("max_tokens") and r["stride"] == r["eval_length"]}
    cells: dict[tuple, list[float]] = {}
    for r in run.records("passkey"):
        if r.get("step") == run.latest_step():
            cells.setdefault((int(r["eval_length"]), _key(r.get("overrides", {}))), []).append(r["accuracy"])
    return ppl, {key: sum(v) / len(v) for key, v in cells.items()}


def _table(rows: list[int], columns: list[str], cell) -> list[str]:
    lines = ["| L_valid | " + " | ".join(columns) + " |", "|---:|" + "---:|" * len(columns)]
    for length in rows:
        lines.append(f"| {length} | " + " | ".join(cell(length, c) for c in columns) + " |")
    return lines


def _fmt(value, digits=2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def method_tables(run: RunDir, what: str) -> list[str]:
    """Perplexity or passkey accuracy by method and length, without and with log-n."""
    train_length = base_length(run)
    ppl, passkey = _values(run)
    lengths = [k * train_length for k in MULTIPLES]
    out = []
    for logn in (False, True):
        def cell(length, method):
            key = _key({**settings(method, length // train_length, train_length), **(LOGN if logn else {})})
            if what == "ppl":
                return _fmt(ppl[(length, key)]["ppl"] if (length, key) in ppl else None)
            return _fmt(passkey.get((length, key)))
        out += [f"**{'with' if logn else 'without'} log-n**", ""] + _table(lengths, list(METHODS), cell) + [""]
    return out


def fine_tune_tables(root: pathlib.Path, names: list[str], what: str) -> list[str]:
    runs = {name: RunDir(root / name) for name in names}
    values = {name: _values(run) for name, run in runs.items()}
    lengths = [k * base_length(runs[names[0]]) for k in MULTIPLES]
    columns = [f"{RUNS[name]}{suffix}" for name in names for suffix in ("", ", log-n")]

    def cell(length, column):
        name = next(n for n in names if column.startswith(RUNS[n]))
        key = _key(LOGN if column.endswith("log-n") else {})
        ppl, passkey = values[name]
        if what == "ppl":
            return _fmt(ppl[(length, key)]["ppl"] if (length, key) in ppl else None)
        return _fmt(passkey.get((length, key)))
    return _table(lengths, columns, cell)


def round_trip(root: pathlib.Path) -> str:
    """How the re-imported run's evaluation compares with the original's (direct, +- log-n)."""
    (ppl_a, key_a), (ppl_b, key_b) = _values(RunDir(root / "base")), _values(RunDir(root / "imported"))
    shared = sorted(set(ppl_a) & set(ppl_b))
    nll = max(abs(ppl_a[k]["nll"] - ppl_b[k]["nll"]) for k in shared)
    passkey = max(abs(key_a[k] - key_b[k]) for k in sorted(set(key_a) & set(key_b)))
    return (f"{len(shared)} perplexity records in both runs: largest |nll difference| {nll:.3g}; "
            f"largest passkey accuracy difference {passkey:.3g}")


def write_tables(root: str, out: str) -> None:
    root, out = pathlib.Path(root), pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    imported = RunDir(root / "imported")
    tunes = ["imported"] + [n for n in ("pi", "yarn", "plain") if RunDir(root / n).exists()]
    ppl = (["# Byte perplexity on the built-in corpus's validation split (every token scored once)", "",
            "## The re-imported base, training-free methods", ""] + method_tables(imported, "ppl")
           + ["## Fine-tunes at 4L (100 steps) from the re-imported base", ""] + fine_tune_tables(root, tunes, "ppl")
           + ["", "## Round trip (trained here -> export_hf.py -> import_hf.py)", "", round_trip(root), ""])
    passkey = (["# Passkey retrieval: exact-match accuracy, mean over 5 depths x 20 keys", "",
                "## The re-imported base, training-free methods", ""] + method_tables(imported, "passkey")
               + ["## Fine-tunes at 4L (100 steps) from the re-imported base", ""]
               + fine_tune_tables(root, tunes, "passkey") + [""])
    (out / "ppl.md").write_text("\n".join(ppl))
    write_figure(root, out)
    (out / "passkey.md").write_text("\n".join(passkey))
    for name in RUNS:
        run = RunDir(root / name)
        if run.exists():
            (out / "records" / name).mkdir(parents=True, exist_ok=True)
            for kind in ("perplexity", "passkey"):
                if run.records_path(kind).exists():
                    shutil.copyfile(run.records_path(kind), out / "records" / name / run.records_path(kind).name)


# --- figure ------------------------------------------------------------------------------------

def method_curves(run: RunDir) -> dict[tuple[str, bool], tuple[list, list, list]]:
    """{(method, log-n): (lengths, ppl, passkey accuracy)} of a run evaluated with every method."""
    train_length = base_length(run)
    ppl, passkey = _values(run)
    curves = {}
    for method in METHODS:
        for logn in (False, True):
            points = []
            for k in MULTIPLES:
                key = (k * train_length, _key({**settings(method, k, train_length), **(LOGN if logn else {})}))
                if key in ppl:
                    points.append((key[0], ppl[key]["ppl"], passkey.get(key, float("nan"))))
            if points:
                curves[(method, logn)] = tuple(map(list, zip(*points)))
    return curves


def write_figure(root: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    """training_free.png: perplexity and passkey accuracy against length, a colour and marker per
    method (and per fine-tune), solid without log-n, dashed with it."""
    from experiment.report import plots
    imported = RunDir(root / "imported")
    curves = method_curves(imported)
    tunes = {RUNS[n]: _values(RunDir(root / n)) for n in ("pi", "yarn", "plain") if RunDir(root / n).exists()}
    train_length = base_length(imported)
    fig, axes = plots.panels(["ppl", "passkey"], width=10, height=4.2)
    series = {name: i for i, name in enumerate(list(METHODS) + list(tunes))}
    for (method, logn), (lengths, ppl, acc) in curves.items():
        kw = {**plots.style(series[method], int(logn)), "label": f"{method}{' + log-n' if logn else ''}"}
        axes["ppl"].plot(lengths, ppl, **kw)
        axes["passkey"].plot(lengths, acc, **kw)
    for name, (ppl, passkey) in tunes.items():
        for logn in (False, True):
            key = _key(LOGN if logn else {})
            lengths = sorted(n for (n, k) in ppl if k == key)
            kw = {**plots.style(series[name], int(logn)), "label": f"{name}{' + log-n' if logn else ''}"}
            axes["ppl"].plot(lengths, [ppl[(n, key)]["ppl"] for n in lengths], **kw)
            axes["passkey"].plot(lengths, [passkey.get((n, key), float("nan")) for n in lengths], **kw)
    axes["ppl"].set_title("The re-imported base with each training-free method, and the fine-tunes at 4L")
    axes["ppl"].set_ylabel("byte perplexity (log scale)")
    plots.format_ppl_axis(axes["ppl"])
    axes["passkey"].set_ylabel("passkey accuracy (exact match,\nmean over depths)")
    axes["passkey"].set_ylim(-0.03, 1.03)
    plots.format_linear_axis(axes["passkey"].yaxis)
    for ax in axes.values():
        plots.length_axes(ax, [train_length])
        ax.set_xlabel("evaluation length L_valid (bytes)")
    plots.legend_beside(axes["ppl"])
    return plots.save(fig, out / "training_free.png")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("evaluate")
    ev.add_argument("workdir")
    ev.add_argument("--direct_only", action="store_true")
    tables = sub.add_parser("tables")
    tables.add_argument("root")
    tables.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.command == "evaluate":
        evaluate_run(args.workdir, args.direct_only)
    else:
        write_tables(args.root, args.out)


if __name__ == "__main__":
    from experiment.runtime.start import start_runtime
    start_runtime()
    main()
