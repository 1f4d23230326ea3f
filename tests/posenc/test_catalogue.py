"""The README's scheme table is the registry's."""


def test_readme_scheme_table_is_generated_from_the_registry():
    from posenc import catalogue
    from tests.conftest import REPO
    readme = (REPO / "README.md").read_text()
    block = readme.split(catalogue.START)[1].split(catalogue.END)[0].strip()
    assert block == catalogue.markdown_table(), "run: python -m posenc.catalogue --write README.md"
