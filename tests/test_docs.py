"""The documentation cannot rot: what it names exists.

Every ``crowdmix`` command line in a code block of README.md or docs/*.md parses with the
real command-line parser; every repository path it names in backticks exists; every link
to a local file resolves; every daemon setting has a row in the configuration reference;
the README stays a front page. ``scripts/check`` also builds the site with ``mkdocs build
--strict``, which fails on a broken link or anchor between pages.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from crowdmix.cli import build_parser
from tests.doc_pages import crowdmix_commands

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]
# A path in backticks that starts with one of the repository's folders
_PATH = re.compile(
    r"`((?:client|shuffler|aggregator|core|protos|crowdmix|tests|bench|deploy|docs|examples|"
    r"scripts|sdk)/[\w./-]*)`"
)
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_crowdmix_command_parses(page: Path) -> None:
    parser = build_parser()
    for argv in crowdmix_commands(page.read_text()):
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{page.name}: crowdmix {' '.join(argv)} does not parse")
        assert getattr(args, "func", None) is not None, argv


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_named_path_exists(page: Path) -> None:
    missing = []
    for path in _PATH.findall(page.read_text()):
        if any(ch in path for ch in "*<>") or path.endswith("..."):
            continue
        if not (ROOT / path.rstrip("/")).exists():
            missing.append(path)
    assert missing == [], f"{page.name} names files that do not exist"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_local_link_resolves(page: Path) -> None:
    broken = [
        link
        for link in _LINK.findall(page.read_text())
        if "://" not in link and not (page.parent / link).exists()
    ]
    assert broken == [], f"{page.name} links to files that do not exist"


def test_the_configuration_reference_has_every_setting() -> None:
    from crowdmix.aggregator.daemon.settings import AggregatorSettings
    from crowdmix.shuffler.config import ShufflerSettings

    reference = (ROOT / "docs" / "operating.md").read_text()
    settings = [f.name for f in dataclasses.fields(ShufflerSettings)]
    settings += [f.name for f in dataclasses.fields(AggregatorSettings)]
    missing = sorted({s for s in settings if f"`{s}`" not in reference})
    assert missing == [], "settings without a row in docs/operating.md"


def test_the_readme_is_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150
    assert not re.search(r"\bissue \d+", "\n".join(lines), flags=re.I)


# Module docstrings say what the module is for in at most this many lines; rationale,
# history and long derivations live in docs/design.md ("Notes by component").
MAX_MODULE_DOC_LINES = 15


def _module_docs() -> dict[str, str]:
    docs = {}
    for folder in ("client", "core", "shuffler", "aggregator", "crowdmix"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT)
            prefixes = [ROOT.joinpath(*rel.parts[:i]) for i in range(1, len(rel.parts) + 1)]
            if any(p.is_symlink() for p in prefixes) or "_pb2" in path.name:
                continue  # crowdmix/<component> are symlinks to the real folders
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
            docs[rel.as_posix()] = doc or ""
    return docs


def test_module_docstrings_are_short() -> None:
    docs = _module_docs()
    long = {name for name, doc in docs.items() if len(doc.splitlines()) > MAX_MODULE_DOC_LINES}
    assert sorted(long) == [], "module docstrings over 15 lines"
    assert len(docs) > 100  # the walk found the modules
