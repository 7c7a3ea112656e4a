"""Checks a rendered --emit svg picture against the --emit trace of the same plan.

Usage: check_svg_png.py PLAN.svg PLAN.png TRACE.json

Every action of the trace that is at least 4 px wide must show, in the PNG, the colour
docs/cli.md gives its kind at the middle of its box; each lane must show idle colour
somewhere no action covers; each rank's activation curve must be drawn under its lane.
The SVG is read only for the layout it states (time origin, pixels per us, lane tops).
"""

import json
import re
import sys
import xml.etree.ElementTree as ET

from PIL import Image

# docs/cli.md, "--emit svg".
COLOURS = {"F": (0x4E, 0x79, 0xA7), "I": (0x59, 0xA1, 0x4F), "W": (0xED, 0xC9, 0x48),
           "B": (0xF2, 0x8E, 0x2B), "RECOMPUTE": (0xE1, 0x57, 0x59)}
IDLE = (0xEE, 0xEE, 0xEE)
CURVE = (0x7B, 0x32, 0x94)


def close(a, b, tolerance=12):
    return all(abs(x - y) <= tolerance for x, y in zip(a, b))


def main(svg_path, png_path, trace_path):
    root = ET.parse(svg_path).getroot()
    x0, ppu = float(root.get("data-x0")), float(root.get("data-px-per-us"))
    lanes = {int(g.get("data-rank")): (float(g.get("data-lane-top")), float(g.get("data-lane-height")))
             for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("data-rank") is not None}
    image = Image.open(png_path).convert("RGB")
    assert image.size == (int(float(root.get("width"))), int(float(root.get("height")))), image.size
    events = [e for e in json.load(open(trace_path))["traceEvents"] if e["ph"] == "X"]
    print(f"ranks {len(lanes)}")
    sampled = 0
    covered = {rank: [] for rank in lanes}
    for e in events:
        kind = re.fullmatch(r"\d+(F|I|W|B|RECOMPUTE)\d+", e["name"])
        left, right = x0 + e["ts"] * ppu, x0 + (e["ts"] + e["dur"]) * ppu
        covered[e["tid"]].append((left, right))
        if not kind or right - left < 4:
            continue
        top, _ = lanes[e["tid"]]
        pixel = image.getpixel((int((left + right) / 2), int(top + 4)))
        assert close(pixel, COLOURS[kind.group(1)]), (e, pixel)
        sampled += 1
    for rank, (top, height) in lanes.items():
        # The lane starts at t = 0 and ends at the step time (the plot's right edge).
        spans = [(x0, x0)] + sorted(covered[rank]) + [(image.size[0] - 20, image.size[0] - 20)]
        gaps = [(a[1], b[0]) for a, b in zip(spans, spans[1:]) if b[0] - a[1] >= 4]
        assert gaps, f"rank {rank} never idles"
        a, b = gaps[0]
        assert close(image.getpixel((int((a + b) / 2), int(top + 4))), IDLE)
        band = [image.getpixel((x, y)) for x in range(int(x0), image.size[0] - 20, 2)
                for y in range(int(top + height), int(top + height + 34))]
        assert sum(close(p, CURVE, 40) for p in band) > 50, f"rank {rank}: no activation curve"
    print(f"sampled {sampled} actions, all in their colour; idle and curve on every lane")


if __name__ == "__main__":
    main(*sys.argv[1:])
