"""Writes a damaged or altered copy of a torch.export archive for lit tests.

usage: pt2_variant.py IN.pt2 OUT MODE
  truncate    the first half of the file
  corrupt     one byte of the serialized program flipped (its CRC then fails)
  schema      the program's schema_version.major set to 99
  symbolic    the first tensor's first size made symbolic, with no hint
  noprogram   the archive without its models/*.json entries
Standard library only (zipfile, json): no torch needed.
"""

import json
import sys
import zipfile


def program_name(names):
    return next(n for n in names if n.endswith("/models/model.json"))


def rewrite(src, dst, edit):
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = edit(info.filename, zin.read(info.filename))
            if data is not None:
                zout.writestr(info, data)


def main(src, dst, mode):
    if mode == "truncate":
        data = open(src, "rb").read()
        open(dst, "wb").write(data[: len(data) // 2])
    elif mode == "corrupt":
        data = bytearray(open(src, "rb").read())
        with zipfile.ZipFile(src) as z:
            info = z.getinfo(program_name(z.namelist()))
        # Local header: 30 bytes + name + extra, then the (stored) data.
        start = info.header_offset + 30 + len(info.filename.encode()) + \
            int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")
        data[start + info.file_size // 2] ^= 0x01
        open(dst, "wb").write(bytes(data))
    elif mode in ("schema", "symbolic"):
        def edit(name, data):
            if not name.endswith("/models/model.json"):
                return data
            program = json.loads(data)
            if mode == "schema":
                program["schema_version"]["major"] = 99
            else:
                values = program["graph_module"]["graph"]["tensor_values"]
                first = next(iter(values.values()))
                first["sizes"][0] = {"as_expr": {"expr_str": "s0", "hint": None}}
            return json.dumps(program).encode()
        rewrite(src, dst, edit)
    elif mode == "noprogram":
        rewrite(src, dst, lambda name, data: None if "/models/" in name else data)
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(*sys.argv[1:])
