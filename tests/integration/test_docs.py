# test_docs.py - the diagrams of README.md and docs/ARCHITECTURE.md: each docs/diagrams/*.svg
# is what graphviz draws from the .dot source beside it (docs/diagrams/render redraws them),
# and each is shown by the docs.
import shutil
import subprocess

import pytest

from conftest import REPO

DIAGRAMS = REPO / "docs" / "diagrams"
SOURCES = sorted(DIAGRAMS.glob("*.dot"))


def test_there_are_diagrams():
    assert {p.stem for p in SOURCES} >= {"processes", "layers", "command"}, SOURCES


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.name)
def test_diagram_is_drawn_from_its_source(src):
    dot = shutil.which("dot")
    assert dot, "graphviz's dot is missing: scripts/bootstrap installs it (Debian package graphviz)"
    drawn = subprocess.run([dot, "-Tsvg", str(src)], capture_output=True, timeout=60)
    assert drawn.returncode == 0, drawn.stderr.decode()
    svg = src.with_suffix(".svg")
    assert svg.exists(), f"{svg.name} is missing: run docs/diagrams/render"
    assert drawn.stdout == svg.read_bytes(), f"{svg.name} is not drawn from {src.name}: run docs/diagrams/render"


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.name)
def test_diagram_is_shown_by_the_docs(src):
    docs = (REPO / "README.md").read_text() + (REPO / "docs" / "ARCHITECTURE.md").read_text()
    assert f"diagrams/{src.stem}.svg" in docs, f"{src.stem}.svg is shown nowhere"
