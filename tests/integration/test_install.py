# test_install.py - after scripts/bootstrap, `conch` is on PATH as every README example says:
# scripts/link-conch (which bootstrap runs after its build) links PREFIX/bin/conch to
# build/conch and the man page, and leaves alone a conch installed otherwise.
import os
import subprocess
from pathlib import Path

from conftest import CONCH_BIN, REPO

LINK = REPO / "scripts" / "link-conch"


def test_bootstrap_puts_conch_on_path(tmp_path):
    assert "scripts/link-conch" in (REPO / "scripts" / "bootstrap").read_text()
    prefix = tmp_path / "prefix"
    env = dict(os.environ, CONCH_PREFIX=str(prefix))
    p = subprocess.run([str(LINK)], capture_output=True, env=env, timeout=60)
    assert p.returncode == 0, p
    conch = prefix / "bin" / "conch"
    assert conch.is_symlink() and conch.resolve() == (REPO / "build" / "conch").resolve()
    for page in ("conch.1", "conch-serve.1"):
        assert (prefix / "share" / "man" / "man1" / page).resolve() == REPO / "man" / page
    # found by name on PATH, as the README's examples run it
    env["PATH"] = f"{prefix / 'bin'}:/usr/bin:/bin"
    p = subprocess.run(["conch", "--version"], capture_output=True, env=env, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith(b"conch "), p
    # idempotent
    p = subprocess.run([str(LINK)], capture_output=True, env=env, timeout=60)
    assert p.returncode == 0 and conch.is_symlink(), p


def test_a_conch_installed_otherwise_is_left_alone(tmp_path):
    prefix = tmp_path / "prefix"
    (prefix / "bin").mkdir(parents=True)
    mine = prefix / "bin" / "conch"
    mine.write_text("#!/bin/sh\necho mine\n")
    p = subprocess.run([str(LINK)], capture_output=True, timeout=60,
                       env=dict(os.environ, CONCH_PREFIX=str(prefix)))
    assert p.returncode == 0 and b"left alone" in p.stderr, p
    assert not mine.is_symlink() and mine.read_text().endswith("mine\n")


def test_readme_says_so_in_its_first_lines():
    head = "\n".join((REPO / "README.md").read_text().splitlines()[:30])
    assert "/usr/local/bin/conch" in head
