"""README.md and docs/*.md name only what exists, and docs/schemes.md's table is the registry's.

What `problems(root)` checks, in README.md and every docs/*.md of the repository at `root`:

1. Links: every relative Markdown link `[text](target)` (not http:, https:, mailto:) points at a file
   or folder that exists, relative to the page that holds it; a `#anchor` into a Markdown page must be
   one of that page's headings (GitHub's slug: lower case, punctuation dropped, spaces as '-').
2. Paths: a token that looks like a repository path must exist. Looks like one: in prose, inline code
   and code blocks, a token with a '/' whose first part is a top-level folder of the repository
   (`ROOTS`); in inline code and code blocks also a token without a '/' ending in .py, .md, .sh or
   .json, which must then be at the root or be the name of a file the framework writes into a run or
   report folder (`WRITTEN`). What follows ':' or '[' after a file name is an argument, not the path
   (`configs/demo.py:rope`, `configs/passkey.py[:scheme]`). Outputs are not checked, since they begin
   with no ROOT (runs/..., /tmp/..., ~/..., exported/, WORKDIR/...), nor placeholders: a part in
   capitals (WORKDIR, RUN, DIR, NAME, ...), or a token holding `<`, `*`, `...`, `{` or `$`.
   A code block laid out as a tree (a line whose first word is `folder/` opens that folder for the
   lines indented deeper and for the rest of its own line) is read file by file: there a token with a
   '/' or a file extension (`TREE_EXTENSIONS`) must exist relative to the open folder or the root.
3. Entry points: every command (a line of a code block, continued lines joined, split at &&, ;, |;
   or an inline code span) that runs `python X.py`, `python -m pkg.mod`, `bash X.sh`, or begins with
   `X.py`, names a file or module that exists (`python -m` of pip, venv and pytest excepted).
4. Flags: every `--flag` after such an entry point is defined in the repository's Python
   (`DEFINE_*("name"`, `define_numbers("name"`, an evaluation kind's `EvalKind("name"` or
   `Option("name"`, or a literal "--name": argparse), or is absl's own (`ABSL_FLAGS`), a
   `--config.KEY=VALUE` override, or absl's `--noNAME` of a defined one; after
   `python -m experiment.harness` lm_eval's own flags (`LM_EVAL_FLAGS`: that command is lm_eval's);
   after `bash X.sh` the flag must appear in X.sh. Flags on pip and pytest commands are theirs.

The checker only reads files (no JAX, no subprocess). The last tests show that it reports what is
missing: a path removed from a small repository, an unknown flag, a module that is not there.
"""
from __future__ import annotations

import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
ROOTS = ("configs", "posenc", "models", "corpora", "experiment", "benchmarks", "results", "tests", "docs", ".ci")
EXTENSIONS = (".py", ".md", ".sh", ".json")
TREE_EXTENSIONS = EXTENSIONS + (".cc", ".txt", ".toml", ".csv")
WRITTEN = {"config.json", "tokenizer.json", "init_from.json", "tokenizer_config.json", "special_tokens_map.json",
           "rows.json", "all_schemes.json", "timings.json", "ppl_vs_length.md", "passkey.md", "ppl_by_band.md",
           "ruler.md", "needles.md", "model.safetensors"}
EXTERNAL_MODULES = ("pip", "venv", "pytest")
ABSL_FLAGS = {"help", "helpfull", "helpshort", "helpxml", "flagfile", "undefok"}
LM_EVAL_FLAGS = {"model", "model_args", "tasks", "include_path", "output_path", "metadata", "limit",
                 "apply_chat_template", "batch_size", "device", "num_fewshot", "log_samples"}
SOURCE_FOLDERS = ("benchmarks", "configs", "corpora", "experiment", "models", "posenc", "results")
_DEFINITION = re.compile(r"""(?:DEFINE_\w+|define_numbers|EvalKind|Option)\(\s*["']([\w-]+)["']|["']--([A-Za-z][\w-]*)["']""")
_PATHLIKE = re.compile(r"^[\w.\-]*\w[\w.\-]*(/[\w.\-]+)*/?$")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
_PYTHON = re.compile(r"python(3(\.\d+)?)?")


def pages(root: pathlib.Path) -> list[pathlib.Path]:
    return [p for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))] if p.is_file()]


def defined_flags(root: pathlib.Path) -> set[str]:
    sources = [*root.glob("*.py")] + [p for folder in SOURCE_FOLDERS for p in (root / folder).rglob("*.py")]
    found = set()
    for path in sources:
        for match in _DEFINITION.finditer(path.read_text(errors="replace")):
            found.add(match.group(1) or match.group(2))
    return found


def slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def split_page(text: str) -> tuple[list[list[str]], str]:
    """(the fenced code blocks, each a list of lines; the rest of the page, code blocks blanked)."""
    blocks, prose, current = [], [], None
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append(current)
                current = None
            prose.append("")
        elif current is not None:
            current.append(line)
            prose.append("")
        else:
            prose.append(line)
    return blocks, "\n".join(prose)


def is_placeholder(token: str) -> bool:
    if any(mark in token for mark in ("<", ">", "*", "...", "{", "$")):
        return True
    stems = [part.split(".")[0] for part in token.strip("/").split("/")]
    return any(len(stem) >= 2 and re.fullmatch(r"[A-Z0-9_]+", stem) and not stem.isdigit() and stem != "README"
               for stem in stems)


def tokens_of(text: str) -> list[str]:
    out = []
    for raw in re.split(r"[\s,;()\[\]{}'\"`=|]+", text):
        token = raw.split(":")[0].rstrip(".")
        if token and _PATHLIKE.match(token) and not is_placeholder(raw):
            out.append(token)
    return out


def missing_path(root: pathlib.Path, token: str, folder: pathlib.Path | None, code: bool) -> bool:
    """Whether `token` looks like a repository path (rule 2) that does not exist."""
    if folder is not None and ("/" in token or token.endswith(TREE_EXTENSIONS)):
        return not ((folder / token).exists() or (root / token).exists() or token in WRITTEN)
    if "/" in token:
        return token.split("/")[0] in ROOTS and not (root / token).exists()
    if code and token.endswith(EXTENSIONS) and re.match(r"\w", token):
        return not ((root / token).exists() or token in WRITTEN)
    return False


def tree_lines(root: pathlib.Path, block: list[str]):
    """Each piece of a code block's lines with the folder it is read in (None outside a tree): a line
    opening a folder gives its first word in the folder around it, the rest of the line in its own."""
    stack: list[tuple[int, pathlib.Path]] = []
    for line in block:
        words = line.split()
        if not words:
            continue
        indent = len(line) - len(line.lstrip(" "))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if words[0].endswith("/") and _PATHLIKE.match(words[0]) and not is_placeholder(words[0]):
            yield words[0], (stack[-1][1] if stack else None)
            stack.append((indent, (stack[-1][1] if stack else root) / words[0]))
            line = line.strip()[len(words[0]):]
        yield line, (stack[-1][1] if stack else None)


def commands(block: list[str]) -> list[str]:
    """The block's logical lines (continuations joined, comments dropped), split into commands."""
    joined, out = "", []
    for line in block + [""]:
        if line.rstrip().endswith("\\"):
            joined += line.rstrip()[:-1] + " "
            continue
        joined += line
        text = re.split(r"(?:^|\s)#", joined, maxsplit=1)[0]
        out += [part for part in re.split(r"&&|\|\||;|\|", text) if part.strip()]
        joined = ""
    return out


def command_problems(root: pathlib.Path, command: str, flags: set[str], where: str, span: bool = False) -> list[str]:
    words = [w.strip("\"'`") for w in command.split()]
    words = [w for w in words if w]
    kind = name = None
    for i, word in enumerate(words):
        base = word.rsplit("/", 1)[-1]
        if _PYTHON.fullmatch(base):
            j = i + 1
            while j < len(words) and words[j].startswith("-") and words[j] != "-m":
                j += 1
            if j + 1 < len(words) and words[j] == "-m":
                kind, name, rest = "module", words[j + 1], words[j + 2:]
            elif j < len(words):
                kind, name, rest = "script", words[j], words[j + 1:]
            break
        if base in ("bash", "sh") and i + 1 < len(words):
            kind, name, rest = "shell", words[i + 1], words[i + 2:]
            break
        if base in ("pip", "pip3", "pytest"):
            return []
        if span and word.endswith(".py") and all("=" in w for w in words[:i]):
            kind, name, rest = "script", word, words[i + 1:]
            break
        if "=" not in word:
            return []
    if kind is None or is_placeholder(name):
        return []
    if kind == "module":
        if name.split(".")[0] in EXTERNAL_MODULES:
            return []
        path = root / name.replace(".", "/")
        if not (path.with_suffix(".py").is_file() or (path / "__main__.py").is_file() or (path / "__init__.py").is_file()):
            return [f"{where}: `python -m {name}`: no such module"]
    elif not (root / name).is_file():
        return [f"{where}: `{name}`: no such file"]
    found = []
    script_text = (root / name).read_text(errors="replace") if kind == "shell" else ""
    for word in rest:
        match = re.match(r"--([A-Za-z][\w.\-]*)", word)
        if not match:
            continue
        flag = match.group(1)
        if kind == "shell":
            ok = f"--{flag}" in script_text
        elif kind == "module" and name == "experiment.harness":
            ok = flag in LM_EVAL_FLAGS
        else:
            ok = (flag.startswith("config.") or flag in flags or flag in ABSL_FLAGS
                  or (flag.startswith("no") and flag[2:] in flags))
        if not ok:
            found.append(f"{where}: `--{flag}` after `{name}` is defined nowhere")
    return found


def page_problems(root: pathlib.Path, page: pathlib.Path, text: str, flags: set[str]) -> list[str]:
    where = page.relative_to(root).as_posix() if page.is_relative_to(root) else page.name
    found = []
    blocks, prose = split_page(text)
    headings = {}
    for target in _LINK.findall(prose):
        if re.match(r"(https?|mailto):", target):
            continue
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part) if path_part else page
        if not linked.exists():
            found.append(f"{where}: link to {target}: no such file")
        elif anchor and linked.suffix == ".md":
            if linked not in headings:
                headings[linked] = {slug(h) for h in re.findall(r"^#+\s+(.*)$", split_page(linked.read_text())[1], re.M)}
            if anchor not in headings[linked]:
                found.append(f"{where}: link to {target}: no such heading")
    spans = [m.group(2) for m in _SPAN.finditer(prose)]
    outside = _SPAN.sub(" ", prose)
    for token in tokens_of(outside):
        if missing_path(root, token, None, code=False):
            found.append(f"{where}: {token}: no such path")
    for span in spans:
        for token in tokens_of(span):
            if missing_path(root, token, None, code=True):
                found.append(f"{where}: `{token}`: no such path")
        found += command_problems(root, span.replace("\n", " "), flags, where, span=True)
    for block in blocks:
        for line, folder in tree_lines(root, block):
            for token in tokens_of(line):
                if missing_path(root, token, folder, code=True):
                    found.append(f"{where}: {token} (code block{f', in {folder.relative_to(root)}/' if folder else ''}): no such path")
        for command in commands(block):
            found += command_problems(root, command, flags, where)
    return found


def problems(root: pathlib.Path = REPO) -> list[str]:
    flags = defined_flags(root)
    return [p for page in pages(root) for p in page_problems(root, page, page.read_text(), flags)]


# --- the repository's own pages -------------------------------------------------------------------

def test_every_path_link_entry_point_and_flag_the_pages_name_exists():
    found = problems()
    assert not found, "README.md / docs/ name what does not exist:\n  " + "\n  ".join(found)


def test_readme_is_a_front_page_and_every_docs_page_is_small():
    assert len((REPO / "README.md").read_text().splitlines()) <= 200
    linked = set(re.findall(r"\(docs/([\w.-]+\.md)", (REPO / "README.md").read_text()))
    for page in sorted((REPO / "docs").glob("*.md")):
        assert len(page.read_text().splitlines()) < 400, page.name
        assert page.name in linked, f"README.md links to no docs/{page.name}"


def test_readme_keeps_the_command_ci_runs():
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci in (REPO / "README.md").read_text()


def test_readme_scheme_count_is_the_tables():
    table = (REPO / "docs" / "schemes.md").read_text().split("<!-- schemes:start -->")[1].split("<!-- schemes:end -->")[0]
    rows = [line for line in table.strip().splitlines()[2:] if line.startswith("| `")]
    assert f"`posenc/`, {len(rows)} schemes" in (REPO / "README.md").read_text()


def test_readme_results_table_has_every_result_and_quotes_its_numbers():
    """One row per results/NAME/README.md, and every number a row gives is one its README gives."""
    readme = (REPO / "README.md").read_text()
    rows = dict(re.findall(r"^\| \[(\w+)\]\(results/\w+/README\.md\) \| (.*) \|$", readme, re.M))
    assert set(rows) == {p.parent.name for p in (REPO / "results").glob("*/README.md")}
    for name, row in rows.items():
        source = (REPO / "results" / name / "README.md").read_text()
        missing = [n for n in re.findall(r"[+-]?\d[\d,]*(?:\.\d+)?%?", row) if n not in source]
        assert not missing, f"README.md's row of {name} gives {missing}, which results/{name}/README.md does not"


def test_schemes_page_is_generated_from_the_registry():
    from posenc import catalogue  # builds each scheme abstractly (JAX): about a second
    text = (REPO / "docs" / "schemes.md").read_text()
    block = text.split(catalogue.START)[1].split(catalogue.END)[0].strip()
    assert block == catalogue.markdown_table(), "stale: run `python -m posenc.catalogue --write docs/schemes.md`"


# --- the checker reports what is missing -----------------------------------------------------------

def _repository(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "demo.py").write_text("def get_config(arg=None): ...\n")
    (tmp_path / "train.py").write_text('config_flags.DEFINE_config_file("config", None, "config file")\n'
                                       'flags.DEFINE_string("workdir", None, "run folder")\n')
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "usage.md").write_text("# Usage\n\n## Commands, in order\n\nSee `configs/demo.py:rope`.\n")
    (tmp_path / "README.md").write_text(
        "# x\n\n[usage](docs/usage.md#commands-in-order)\n\n```bash\n"
        "python train.py --config configs/demo.py --workdir runs/a --config.train.steps=3 --helpfull\n```\n")
    return tmp_path


def test_a_repository_whose_pages_name_what_exists_passes(tmp_path):
    assert problems(_repository(tmp_path)) == []


def test_removing_a_named_path_fails_the_check(tmp_path):
    root = _repository(tmp_path)
    (root / "configs" / "demo.py").unlink()
    found = problems(root)
    assert any("configs/demo.py" in p and "README.md" in p for p in found), found
    assert any("configs/demo.py" in p and "docs/usage.md" in p for p in found), found
    (root / "docs" / "usage.md").unlink()
    assert any("link to docs/usage.md" in p for p in problems(root))


def test_a_missing_entry_point_flag_heading_or_path_is_reported(tmp_path):
    root = _repository(tmp_path)
    page = root / "docs" / "x.md"
    cases = {
        "```bash\npython train.py --workdir runs/a --no_such_flag 3\n```": "`--no_such_flag` after `train.py`",
        "```bash\npython -m benchmarks.nothing_here\n```": "`python -m benchmarks.nothing_here`: no such module",
        "`python gone.py --workdir W`": "`gone.py`: no such file",
        "[usage](usage.md#no-such-heading)": "no such heading",
        "the table is in `models/no_such_module.py`": "models/no_such_module.py",
        "see experiment/gone/ for more": "experiment/gone/",
        "```\nconfigs/\n  demo.py  extend.py\n```": "extend.py (code block, in configs/)",
    }
    for text, expected in cases.items():
        page.write_text(text + "\n")
        found = page_problems(root, page, page.read_text(), defined_flags(root))
        assert any(expected in p for p in found), (text, found)
    page.write_text("`runs/demo/report/` `WORKDIR/eval/` `results/NAME/seed0` `python -m pytest -q -n 2 -m slow`\n"
                    "```bash\npip install -q -e '.[test]' --no-deps\n```\n")
    assert page_problems(root, page, page.read_text(), defined_flags(root)) == []
