"""PEP 517 build backend for the leased client, standard library only.

The distribution is the one module leased.py. Building it needs nothing
from a package index, so `pip install` works offline with build
isolation. It writes a pure-Python wheel (the module, METADATA, WHEEL and
RECORD) and an sdist of this directory's files.
"""

import base64
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
MODULES = ["leased.py"]
SDIST_FILES = ["pyproject.toml", "leased_build.py", "README.md",
               "leased.py", "test_leased.py"]


def _project():
    """name, version, summary, requires-python, read from pyproject.toml
    (tomllib is 3.11+, and only four flat strings are needed)."""
    with open(os.path.join(HERE, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    section = text.split("[project]", 1)[1].split("\n[", 1)[0]

    def field(name):
        m = re.search(r'^%s\s*=\s*"([^"]*)"' % name, section, re.M)
        return m.group(1) if m else None

    return {"name": field("name"), "version": field("version"),
            "summary": field("description"),
            "requires_python": field("requires-python")}


def _metadata(p):
    lines = ["Metadata-Version: 2.1", "Name: %s" % p["name"],
             "Version: %s" % p["version"]]
    if p["summary"]:
        lines.append("Summary: %s" % p["summary"])
    if p["requires_python"]:
        lines.append("Requires-Python: %s" % p["requires_python"])
    lines.append("License: MIT")
    lines.append("Description-Content-Type: text/markdown")
    readme = os.path.join(HERE, "README.md")
    body = ""
    if os.path.exists(readme):
        with open(readme, encoding="utf-8") as f:
            body = f.read()
    return ("\n".join(lines) + "\n\n" + body).encode("utf-8")


def _wheel_name(p):
    return "%s-%s-py3-none-any.whl" % (p["name"], p["version"])


def _dist_info(p):
    return "%s-%s.dist-info" % (p["name"], p["version"])


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest())
    return "%s,sha256=%s,%d" % (arcname, digest.rstrip(b"=").decode(),
                                len(data))


def _write_wheel(wheel_directory, files):
    """FILES: [(arcname, bytes)] without the dist-info; adds it."""
    p = _project()
    info = _dist_info(p)
    files = list(files) + [
        (info + "/METADATA", _metadata(p)),
        (info + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: leased_build\n"
                          b"Root-Is-Purelib: true\nTag: py3-none-any\n"),
    ]
    record = [_record_line(name, data) for name, data in files]
    record.append(info + "/RECORD,,")
    files.append((info + "/RECORD", ("\n".join(record) + "\n").encode()))
    name = _wheel_name(p)
    # A fixed date keeps the wheel reproducible (zip cannot store 1970).
    stamp = (1980, 1, 1, 0, 0, 0)
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w",
                         zipfile.ZIP_DEFLATED) as z:
        for arcname, data in files:
            zi = zipfile.ZipInfo(arcname, stamp)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    return name


def _read(name):
    with open(os.path.join(HERE, name), "rb") as f:
        return f.read()


# --- PEP 517 ---------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory,
                                     config_settings=None):
    p = _project()
    info = os.path.join(metadata_directory, _dist_info(p))
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "wb") as f:
        f.write(_metadata(p))
    return _dist_info(p)


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None,
                metadata_directory=None):
    return _write_wheel(wheel_directory,
                        [(m, _read(m)) for m in MODULES])


def build_editable(wheel_directory, config_settings=None,
                   metadata_directory=None):
    # PEP 660: a .pth file puts this directory on sys.path.
    return _write_wheel(wheel_directory,
                        [("leased_editable.pth", (HERE + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    p = _project()
    base = "%s-%s" % (p["name"], p["version"])
    name = base + ".tar.gz"
    pkg_info = _metadata(p)
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz",
                      format=tarfile.PAX_FORMAT) as tar:
        members = [(f, _read(f)) for f in SDIST_FILES
                   if os.path.exists(os.path.join(HERE, f))]
        members.append(("PKG-INFO", pkg_info))
        for arcname, data in members:
            ti = tarfile.TarInfo("%s/%s" % (base, arcname))
            ti.size = len(data)
            ti.mode = 0o644
            ti.mtime = int(time.time())
            tar.addfile(ti, io.BytesIO(data))
    return name
