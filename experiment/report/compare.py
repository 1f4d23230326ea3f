"""A report against a committed one (report.py --compare_with DIR; study.py configs/studies/NAME.py --check): the
numbers of their markdown tables cell by cell, where both have the cell (same table heading, row and
column header, so the same run label and checkpoint step): a re-run of one scheme is compared on that
scheme's columns. Perplexity cells (ppl_vs_length.md) differ relatively, passkey accuracies
(passkey.md) absolutely; a cell whose printed text is the same differs by 0. Only reports measured
alike are compared: where the samples per cell (examples per passkey cell, tokens scored per
perplexity cell) or a passkey run's checkpoint step differ, the comparison is refused, saying what
differs. A --compare_with folder that is missing or holds neither table is refused before the
report is written (`check_folder`).
"""
from __future__ import annotations

import dataclasses
import pathlib
import re

FILES = {"ppl_vs_length.md": "relative", "passkey.md": "absolute"}  # the tables compared, and how
NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?|inf|nan")
SAMPLES = re.compile(r"^(Examples per \(length, depth\) cell|\w+ scored per cell): ([^;]*?)(?: per seed)?\.?(?:;|$)")
RUN_STEP = re.compile(r"(.+): accuracy by length and depth \(step ([\d, ]+)\)")  # passkey.md's per-run tables


def check_folder(committed_dir: str | pathlib.Path) -> None:
    """--compare_with names a folder holding at least one of the tables of FILES (ValueError, one
    line naming it, otherwise): checked before the report is written."""
    folder = pathlib.Path(committed_dir)
    what = ("does not exist" if not folder.exists() else "is a file, not a folder" if not folder.is_dir()
            else f"holds neither {' nor '.join(FILES)}" if not any((folder / n).is_file() for n in FILES) else "")
    if what:
        raise ValueError(f"--compare_with {committed_dir} {what}; give a committed result's folder holding "
                         f"{' or '.join(FILES)} (results/NAME/seed0), or an earlier report.py --out")


@dataclasses.dataclass(frozen=True)
class Difference:
    """One cell in both reports: where it is, its two printed texts and how far apart they are
    (relative or absolute, as FILES says for its file)."""
    file: str
    table: str
    row: str
    column: str
    committed: str
    new: str
    difference: float

    @property
    def kind(self) -> str:
        return FILES[self.file]

    def describe(self) -> str:
        amount = f"{self.difference:.2%}" if self.kind == "relative" else f"{self.difference:.2f}"
        return (f"{amount} ({self.file}, {self.table}, {self.column} at {self.row}: {self.committed} committed, "
                f"{self.new} now)")


def cells(markdown: str) -> dict[tuple[str, str, str], str]:
    """{(table heading, row's first cell, column header): the cell's text} of every markdown table
    under a '### ' heading (the report's tables)."""
    out, heading, header = {}, "", None
    for line in markdown.splitlines():
        if line.startswith("### "):
            heading, header = line[4:].strip(), None
        elif line.startswith("|") and heading:
            row = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = row
            elif not all(set(c) <= set("-:") for c in row):
                out.update({(heading, row[0], column): cell for column, cell in zip(header[1:], row[1:]) if cell})
        else:
            header = None if not line.startswith("|") else header
    return out


def _number(text: str) -> float | None:
    """The first number of a cell ('4.69', '4.69*', '4.69 ± 0.02 (3)', '0.85 [0.62, 0.95]')."""
    found = NUMBER.search(text.replace(",", ""))
    return float(found.group()) if found else None


def _difference(committed: str, new: str, kind: str) -> float:
    if committed == new:
        return 0.0
    a, b = _number(committed), _number(new)
    if a is None or b is None:
        return float("inf")
    if kind == "absolute":
        return abs(a - b)
    return abs(a - b) / abs(a) if a else float("inf")


def protocol(markdown: str) -> dict[str, str]:
    """{what: value} of the lines that say how a report's numbers were measured: the samples per cell
    under each table heading, and each passkey run's checkpoint step (its mean table's columns do not
    show it)."""
    out, heading = {}, ""
    for line in markdown.splitlines():
        if line.startswith("### "):
            heading = line[4:].strip()
            run = RUN_STEP.fullmatch(heading)
            if run:
                out[f"the checkpoint step of {run.group(1)}"] = run.group(2)
        found = SAMPLES.match(line)
        if found and heading:
            out[f"{found.group(1).lower()} under '{heading}'"] = found.group(2).strip()
    return out


def _refuse_other_protocol(name: str, committed: str, new: str, committed_dir) -> None:
    """Refuse (ValueError naming what differs) where the new report of `name` was measured otherwise:
    another checkpoint step for a run, or samples per cell the committed tables do not list (a
    re-run of some of the runs lists a part of them)."""
    old, now = protocol(committed), protocol(new)
    for what in old.keys() & now.keys():
        differ = old[what] != now[what] if what.startswith("the checkpoint step") else \
            not set(now[what].split(", ")) <= set(old[what].split(", "))
        if differ:
            raise ValueError(f"--compare_with {committed_dir}: {name} was measured otherwise ({what}: {old[what]} "
                             f"committed, {now[what]} now); results are compared only under the same protocol: "
                             f"evaluate as the committed result was")


def compare(committed_dir: str | pathlib.Path, new_dir: str | pathlib.Path) -> list[Difference]:
    """Every cell of the tables of FILES that both folders have, largest difference first within each
    file; a report measured otherwise than the committed one is refused (`_refuse_other_protocol`)."""
    out = []
    for name, kind in FILES.items():
        old_path, new_path = pathlib.Path(committed_dir) / name, pathlib.Path(new_dir) / name
        if not (old_path.exists() and new_path.exists()):
            continue
        _refuse_other_protocol(name, old_path.read_text(), new_path.read_text(), committed_dir)
        old, new = cells(old_path.read_text()), cells(new_path.read_text())
        out += sorted((Difference(name, *key, old[key], new[key], _difference(old[key], new[key], kind))
                       for key in old if key in new), key=lambda d: -d.difference)
    return out


def summary(differences: list[Difference], committed_dir: str | pathlib.Path,
            tolerance: float = 0.0) -> tuple[str, bool]:
    """(the lines report.py prints, whether every cell agrees within `tolerance`: relative for
    perplexities, absolute for accuracies; 0: the same printed digits). No common cell is an error
    naming what to give."""
    if not differences:
        folder = pathlib.Path(committed_dir)
        root = pathlib.Path(__file__).resolve().parents[2]
        script = next((f"python study.py configs/studies/{p.name}.py" for p in (folder, folder.parent)
                       if (root / "configs" / "studies" / f"{p.name}.py").is_file() and p.parent.name == "results"),
                      None)
        raise ValueError(f"--compare_with {committed_dir}: no cell of its tables ({', '.join(FILES)}) is in this "
                         f"report; give runs of that result (same scheme, training length and checkpoint step, so "
                         f"that the column headers match)" + (f", e.g. {script} --check" if script else ""))
    lines, ok = [], True
    for name, kind in FILES.items():
        found = [d for d in differences if d.file == name]
        if found:
            beyond = [d for d in found if d.difference > tolerance]
            ok = ok and not beyond
            what = "relative" if kind == "relative" else "absolute"
            lines.append(f"{name}: {len(found)} cells compared with {committed_dir}, {len(beyond)} differ by more than "
                         f"{tolerance:g} ({what}); largest difference {found[0].describe()}")
    return "\n".join(lines), ok
