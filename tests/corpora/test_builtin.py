"""The built-in corpus (Python's documentation): real English, disjoint splits."""
import pytest

from corpora import load_lines


def test_builtin_corpus_is_real_english_with_disjoint_splits():
    splits = {s: load_lines({"source": "builtin", "name": "python_docs"}, s) for s in ("train", "valid", "test")}
    text = {s: "\n".join(lines) for s, lines in splits.items()}
    assert len(text["train"]) > 500_000 and len(text["valid"]) > 20_000 and len(text["test"]) > 20_000
    words = text["train"].split()
    assert words.count("the") > 1000 and words.count("is") > 500
    assert text["valid"][:2000] not in text["train"]


def test_the_documents_are_read_once_and_kept_in_a_file_that_the_sources_name(tmp_path, monkeypatch):
    """A second process reads the cache file (no module parsed), which holds what reading gives; a damaged
    file is read again and replaced; another Python (or other sources) names another file; off: none."""
    import ast
    from corpora import builtin
    monkeypatch.setenv("LX_CORPUS_CACHE", str(tmp_path))
    builtin.python_docs_documents.cache_clear()
    try:
        read = builtin.python_docs_documents()
        (kept,) = tmp_path.glob("python_docs-*.json")
        builtin.python_docs_documents.cache_clear()
        with monkeypatch.context() as m:
            m.setattr(ast, "parse", lambda *_, **__: pytest.fail("a module was parsed"))
            assert builtin.python_docs_documents() == read  # from the file
        kept.write_text('[["topic:if", "half')  # damaged (e.g. cut short by a full disk)
        builtin.python_docs_documents.cache_clear()
        assert builtin.python_docs_documents() == read and kept.read_text().startswith('[["topic:')
        assert read == builtin._read_documents(sorted(builtin.pathlib.Path(
            builtin.sysconfig.get_paths()["stdlib"]).glob("*.py")))
        monkeypatch.setattr(builtin.sys, "version", builtin.sys.version + " (another build)")
        assert builtin._cache_file([]) != kept and builtin._cache_file([]).parent == tmp_path
        monkeypatch.setenv("LX_CORPUS_CACHE", "off")
        assert builtin._cache_file([]) is None
        assert [p.name for p in tmp_path.iterdir()] == [kept.name]  # no temporary file left
    finally:
        builtin.python_docs_documents.cache_clear()
