"""Copies a TorchScript archive with its file format version record set to N.

usage: set_torchscript_version.py IN.pt OUT.pt N   (standard library only)
"""

import sys
import zipfile

src, dst, version = sys.argv[1:]
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
    for info in zin.infolist():
        data = zin.read(info.filename)
        if info.filename.split("/", 1)[1] in ("version", ".data/version"):
            data = f"{version}\n".encode()
        zout.writestr(info, data)
