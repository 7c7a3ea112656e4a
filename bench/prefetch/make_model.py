"""Writes a model JSON with N blocks cut from a model JSON's costs.

The bundled GPT has 8 blocks (the costed Llama 4), too few for 16- and 32-rank interleaved
schedules; this keeps the regions before the first checkpointable one (embedding) and the
non-checkpointable ones after it (head), with all their fields (FLOPs, bytes, and the
measured times and selective costs when the input model has them), and repeats that first
checkpointable region, the block, N times (``blocks.0`` -> ``blocks.0 .. blocks.N-1``).
Usage: make_model.py IN.json N OUT.json
"""

import json
import sys


def main(src: str, blocks: int, dst: str) -> None:
    with open(src, encoding="utf-8") as f:
        model = json.load(f)
    regions = model["regions"]
    first = next(i for i, r in enumerate(regions) if r.get("checkpointable", True))
    block = regions[first]
    prefix = block["name"].rsplit(".", 1)[0]
    tail = [r for r in regions[first:] if not r.get("checkpointable", True)]
    model["regions"] = (regions[:first] + [dict(block, name=f"{prefix}.{i}") for i in range(blocks)] + tail)
    model["name"] = f"{model['name']}-{blocks}"
    with open(dst, "w", encoding="utf-8") as f:
        json.dump(model, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
