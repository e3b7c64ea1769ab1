# conch_build.py - the PEP 517 build backend of conch-client, in the tree and with no
# dependencies: `pip install clients/python` then needs no setuptools, no wheel package and
# no network (pip's build isolation installs nothing), in a plain venv and with any python3
# (Debian's, pyenv's, a distribution's). It builds the pure-Python wheel, the sdist and an
# editable wheel from the [project] table of pyproject.toml.
"""A minimal PEP 517 backend for conch-client (pure Python, one package)."""
import base64
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "conch_client"
# What the sdist carries besides the package: enough to build the wheel again.
SDIST_FILES = ["pyproject.toml", "conch_build.py", "README.md"]


def _project():
    """name, version, description, requires-python and classifiers of pyproject.toml's
    [project] (read without tomllib, which Python < 3.11 lacks)."""
    with open(os.path.join(HERE, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    table = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S).group(1)

    def value(key):
        m = re.search(rf'^{re.escape(key)}\s*=\s*"([^"]*)"', table, re.M)
        return m.group(1) if m else None

    m = re.search(r"^classifiers\s*=\s*\[(.*?)\]", table, re.M | re.S)
    classifiers = re.findall(r'"([^"]+)"', m.group(1)) if m else []
    return {"name": value("name"), "version": value("version"),
            "summary": value("description") or "", "requires_python": value("requires-python"),
            "classifiers": classifiers}


def _dist_name(p):
    return re.sub(r"[-_.]+", "_", p["name"]).lower()


def _metadata(p):
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}",
             f"Summary: {p['summary']}"]
    if p["requires_python"]:
        lines.append(f"Requires-Python: {p['requires_python']}")
    lines += [f"Classifier: {c}" for c in p["classifiers"]]
    readme = os.path.join(HERE, "README.md")
    body = ""
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as f:
            body = f.read()
    return ("\n".join(lines) + "\n\n" + body).encode("utf-8")


def _package_files():
    """(archive path, bytes) of the package's .py files and py.typed, sorted."""
    out = []
    root = os.path.join(HERE, PACKAGE)
    for name in sorted(os.listdir(root)):
        if name.endswith(".py") or name == "py.typed":
            with open(os.path.join(root, name), "rb") as f:
                out.append((f"{PACKAGE}/{name}", f.read()))
    return out


def _write_wheel(wheel_directory, files):
    p = _project()
    dist = f"{_dist_name(p)}-{p['version']}"
    info = f"{dist}.dist-info"
    files = list(files) + [
        (f"{info}/METADATA", _metadata(p)),
        (f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: conch_build\n"
                          b"Root-Is-Purelib: true\nTag: py3-none-any\n"),
        (f"{info}/top_level.txt", f"{PACKAGE}\n".encode()),
    ]
    record = []
    for path, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode()))
    name = f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            zi = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    return name


# ---- PEP 517 / PEP 660 hooks ----------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, _package_files())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # A .pth line puts this directory on sys.path: the package is imported from the tree.
    return _write_wheel(wheel_directory, [(f"_{PACKAGE}_editable.pth", (HERE + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    p = _project()
    dist = f"{_dist_name(p)}-{p['version']}"
    name = f"{dist}.tar.gz"
    members = [(f"{dist}/PKG-INFO", _metadata(p))]
    for rel in SDIST_FILES:
        with open(os.path.join(HERE, rel), "rb") as f:
            members.append((f"{dist}/{rel}", f.read()))
    members += [(f"{dist}/{path}", data) for path, data in _package_files()]
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        for path, data in members:
            ti = tarfile.TarInfo(path)
            ti.size, ti.mode, ti.mtime = len(data), 0o644, int(time.time())
            t.addfile(ti, io.BytesIO(data))
    return name
