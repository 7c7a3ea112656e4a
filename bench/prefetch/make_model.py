"""Writes a model JSON with N transformer blocks cut from the bundled GPT's costs.

The bundled GPT has 8 blocks, too few for 16- and 32-rank interleaved schedules; this
keeps its embedding, block and head regions (FLOPs, saved/input/param bytes, and the
measured times when the input model has them) and repeats the block N times.
Usage: make_model.py IN.json N OUT.json
"""

import json
import sys


def main(src: str, blocks: int, dst: str) -> None:
    model = json.load(open(src))
    regions = model["regions"]
    block = next(r for r in regions if r["name"] == "blocks.0")
    head, tail = regions[0], regions[-1]
    model["regions"] = [head] + [dict(block, name=f"blocks.{i}") for i in range(blocks)] + [tail]
    model["name"] = f"{model['name']}-{blocks}"
    json.dump(model, open(dst, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
