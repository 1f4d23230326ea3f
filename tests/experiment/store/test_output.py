"""Folders written outside a run (experiment/store/output.py): a command writes only into a folder it
owns (new, empty, or marked as its own), and the folder then holds exactly what one call wrote."""
import json

import pytest

from experiment.store import output
from experiment.store.lock import WorkdirBusy
from experiment.store.run import RunError


def a_run(path):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"seed": 0}))
    (path / "checkpoints").mkdir()
    return path


def test_a_new_empty_or_own_folder_is_taken_and_anything_else_refused_naming_it(tmp_path):
    output.claim(tmp_path / "new", "export_hf.py")
    (tmp_path / "empty").mkdir()
    output.claim(tmp_path / "empty", "export_hf.py")
    with output.replacing(tmp_path / "own", "export_hf.py") as staging:
        (staging / "config.json").write_text("{}")
    output.claim(tmp_path / "own", "export_hf.py")  # written by the same command before: may be written again
    run = a_run(tmp_path / "run")
    with pytest.raises(RunError, match=rf"^--out {run} is a run folder, which only its own run writes; give a new "
                                       rf"or empty folder, e.g. --out {run}_hf$"):
        output.claim(run, "export_hf.py")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text("my own")
    with pytest.raises(RunError, match=rf"^--out {mine} holds files that export_hf.py did not write \(config.json\)"):
        output.claim(mine, "export_hf.py")
    with pytest.raises(RunError, match=rf"--out {tmp_path / 'own'} was written by export_hf.py, not report.py"):
        output.claim(tmp_path / "own", "report.py")
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunError, match="is a file"):
        output.claim(tmp_path / "file", "report.py")


def test_a_report_folder_of_an_earlier_version_is_recognised_by_its_files(tmp_path):
    (tmp_path / "report").mkdir()
    for name in ("ppl_vs_length.png", "ppl_vs_length.md", "passkey_heatmap_alibi.png"):
        (tmp_path / "report" / name).write_text("x")
    output.claim(tmp_path / "report", "report.py")
    with pytest.raises(RunError, match="did not write"):
        output.claim(tmp_path / "report", "export_hf.py")


def test_the_folder_holds_exactly_what_the_last_call_wrote_and_a_failed_call_changes_nothing(tmp_path):
    out = tmp_path / "out"
    with output.replacing(out, "report.py") as staging:
        (staging / "a.md").write_text("first")
        (staging / "passkey.md").write_text("first")
        assert not out.exists()  # nothing is seen before the swap
    with output.replacing(out, "report.py") as staging:
        (staging / "a.md").write_text("second")
    assert sorted(p.name for p in out.iterdir()) == [".written_by", "a.md"]
    with pytest.raises(ValueError, match="boom"):
        with output.replacing(out, "report.py") as staging:
            (staging / "a.md").write_text("third")
            raise ValueError("boom")
    assert (out / "a.md").read_text() == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging folder or lock left


def test_a_second_writer_at_the_same_time_is_refused_in_one_line(tmp_path):
    out = tmp_path / "out"
    with output.replacing(out, "report.py"):
        with pytest.raises(WorkdirBusy, match=rf"^--out {out} is in use by report.py \(pid \d+ .*\); wait for it to "
                                              rf"finish, or give another --out, e.g. --out {out}_report$"):
            with output.replacing(out, "report.py"):
                pass


def test_paths_written_aside_are_reported_where_they_end_up(tmp_path):
    staging, out = tmp_path / ".o.writing-1", tmp_path / "o"
    paths = {"png": str(staging / "a.png"), "list": [str(staging / "b.png")], "nested": {"md": staging / "c.md"}}
    assert output.moved(paths, staging, out) == {"png": str(out / "a.png"), "list": [str(out / "b.png")],
                                                 "nested": {"md": out / "c.md"}}


def test_a_users_file_beside_an_earlier_output_stays_and_only_the_commands_files_are_replaced(tmp_path):
    """Issue 45, item 1: a notes.txt in a report.py --out folder (a NOTES.md in an export) was gone after
    the same command ran again: the folder was swapped in whole."""
    out = tmp_path / "out"
    with output.replacing(out, "report.py") as staging:
        (staging / "a.md").write_text("first")
        (staging / "old.png").write_text("first")
    (out / "notes.txt").write_text("mine")
    (out / "mine").mkdir()
    (out / "mine" / "draft.md").write_text("mine too")
    with output.replacing(out, "report.py") as staging:
        (staging / "a.md").write_text("second")
    assert sorted(p.name for p in out.iterdir()) == [".written_by", "a.md", "mine", "notes.txt"]
    assert (out / "a.md").read_text() == "second" and (out / "notes.txt").read_text() == "mine"
    assert (out / "mine" / "draft.md").read_text() == "mine too"
    assert (out / output.MARKER).read_text().splitlines() == ["report.py", "a.md"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_users_file_named_as_an_output_refuses_the_write_naming_it_and_changes_nothing(tmp_path):
    out = tmp_path / "out"
    with output.replacing(out, "report.py") as staging:
        (staging / "a.md").write_text("first")
    (out / "passkey.md").write_text("mine")
    with pytest.raises(RunError, match=rf"^{out / 'passkey.md'} is not a file report.py wrote, and it writes one of "
                                       rf"that name; move it away"):
        with output.replacing(out, "report.py") as staging:
            (staging / "a.md").write_text("second")
            (staging / "passkey.md").write_text("second")
    assert (out / "a.md").read_text() == "first" and (out / "passkey.md").read_text() == "mine"


def test_a_marker_that_names_only_the_command_replaces_its_known_files_and_keeps_the_rest(tmp_path):
    """A folder an earlier version marked (the marker's one line): its outputs are known by name."""
    out = tmp_path / "hf"
    out.mkdir()
    (out / output.MARKER).write_text("export_hf.py\n")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "NOTES.md"):
        (out / name).write_text("old")
    with output.replacing(out, "export_hf.py") as staging:
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            (staging / name).write_text("new")
    assert sorted(p.name for p in out.iterdir()) == [".written_by", "NOTES.md", "config.json", "model.safetensors",
                                                     "tokenizer.json"]
    assert (out / "NOTES.md").read_text() == "old" and (out / "config.json").read_text() == "new"


def test_a_full_device_while_the_output_is_written_aside_names_the_file_where_it_goes(tmp_path, monkeypatch):
    """Issue 45, item 9: `no space left on device: a file` (the library's error had no file name)."""
    import errno
    import shutil
    from experiment.store import files
    out = tmp_path / "out"
    with pytest.raises(files.NoSpace, match=rf"^no space left on device: {out / 'b.png'}$"):
        with output.replacing(out, "report.py") as staging:
            (staging / "a.md").write_text("written")
            (staging / "b.png").write_text("half")
            raise OSError(errno.ENOSPC, "No space left on device")  # what a library's write raises
    monkeypatch.setattr(files.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(files.NoSpace, match=rf"^no space left on device: {out / 'c.md'} \(1 MB needed\)$"):
        with output.replacing(out, "report.py") as staging:
            files.write_atomically(staging / "c.md", "x" * 5000)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == []


def test_an_out_in_a_folder_that_cannot_be_written_names_the_flag_not_a_workdir(tmp_path, monkeypatch):
    """Issue 67, case 10: export_hf.py and report.py with --out in a read-only folder were told to "use
    --workdir NEW", which neither command has."""
    from experiment.convert import gguf as gguf_export
    from experiment.store import lock, output
    from tests.helpers import read_only_below
    read_only_below(monkeypatch, tmp_path)
    for command in ("report.py", "export_hf.py"):
        with pytest.raises(lock.NotWritable) as refused:
            with output.replacing(tmp_path / "out", command):
                pass
        assert str(refused.value) == (f"cannot write in {tmp_path} (Read-only file system): {command} writes --out "
                                      f"{tmp_path / 'out'} there; give a --out in a folder you can write")
    monkeypatch.setattr(gguf_export.os, "access", lambda path, mode: False)
    with pytest.raises(RunError, match=rf"^--gguf {tmp_path / 'm.gguf'}: cannot write in {tmp_path} \(read-only, or "
                                       rf"no permission\); give a --gguf in a folder you can write$"):
        gguf_export.export_gguf(tmp_path / "no_run", tmp_path / "m.gguf")
