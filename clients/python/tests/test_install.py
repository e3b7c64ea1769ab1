# test_install.py - the package installs with pip's ordinary command into fresh plain venvs,
# offline (no wheel package, no setuptools download: conch_build.py is the backend): from the
# source directory and from the packed sdist with Debian's python3, from the wheel with a
# python3 that is not Debian's (pyenv's, when the machine has one); each install then drives
# the real daemon from outside the source tree.
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import CONCH_BIN

SRC = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DEBIAN_PY = "/usr/bin/python3"

SMOKE = r"""
import os, sys, tempfile, conch_client
from conch_client import Sandbox
assert not conch_client.__file__.startswith(sys.argv[2]), conch_client.__file__
with Sandbox.create(conch_bin=sys.argv[1], state_dir=tempfile.mkdtemp()) as sb:
    r = sb.run("echo installed-$((40+2))")
    assert r.stdout == "installed-42\n", r.text
print("ok", conch_client.__file__)
"""


def other_python():
    """A python3 >= 3.9 that is not Debian's, or None."""
    found = []
    for p in glob.glob("/root/.pyenv/versions/3.*/bin/python3") + [shutil.which("python3") or ""]:
        m = re.search(r"/3\.(\d+)\.\d+/bin/python3$", p)
        if m and int(m.group(1)) >= 9 and os.path.realpath(p) != os.path.realpath(DEBIAN_PY):
            found.append((int(m.group(1)), p))
    return max(found)[1] if found else None


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """The sdist and the wheel, built by the package's own backend."""
    out = str(tmp_path_factory.mktemp("dist"))
    sys.path.insert(0, SRC)
    try:
        import conch_build
        return (os.path.join(out, conch_build.build_sdist(out)),
                os.path.join(out, conch_build.build_wheel(out)))
    finally:
        sys.path.remove(SRC)


def install_and_use(python, what, tmp_path, conch_bin):
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-index", what],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    r = subprocess.run([str(venv / "bin" / "python"), "-c", SMOKE, conch_bin, SRC],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("ok "), r.stdout + r.stderr


@pytest.mark.skipif(not os.access(DEBIAN_PY, os.X_OK), reason="no Debian python3")
def test_plain_venv_from_the_source_directory(tmp_path, conch_bin):
    install_and_use(DEBIAN_PY, SRC, tmp_path, conch_bin)


@pytest.mark.skipif(not os.access(DEBIAN_PY, os.X_OK), reason="no Debian python3")
def test_plain_venv_from_the_sdist(artifacts, tmp_path, conch_bin):
    install_and_use(DEBIAN_PY, artifacts[0], tmp_path, conch_bin)


def test_non_debian_python_from_the_wheel(artifacts, tmp_path, conch_bin):
    py = other_python()
    if not py:
        pytest.skip("no python3 other than Debian's on this machine (pyenv's is looked for)")
    install_and_use(py, artifacts[1], tmp_path, conch_bin)
