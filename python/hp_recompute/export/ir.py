"""Write a traced module as TorchScript IR text that ``torch::jit::parseIR`` reads.

Why: ``parseIR`` cannot read module (class) types, so the inlined graph of a
traced module is rewritten: every parameter/buffer ``prim::GetAttr`` becomes a
graph input named ``%self.<module path>.<attr>`` with its full tensor type, and
module-typed ``GetAttr`` lines disappear. Each node keeps its ``, scope:
__module.a/__module.a.b`` suffix, which the C++ importer strips before parsing
and uses as the node's module call stack (docs/models.md, "IR text").
"""

from __future__ import annotations

import re
from typing import Dict, List

import torch

__all__ = ["module_to_ir"]

_GETATTR = re.compile(
    r'^\s*%(?P<out>[\w.]+) : (?P<type>\S+) = prim::GetAttr\[name="(?P<attr>\w+)"\]'
    r'\(%(?P<parent>[\w.]+)\)')
_HEADER = re.compile(r"^graph\((?P<args>.*?)\):\s*$", re.S)


def _tensor_type(t: torch.Tensor) -> str:
    """IR type text of a tensor, e.g. ``Float(8, 4, strides=[4, 1], requires_grad=1, device=cpu)``."""
    kind = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half",
            torch.bfloat16: "BFloat16", torch.int64: "Long", torch.int32: "Int",
            torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
            torch.bool: "Bool"}[t.dtype]
    sizes = ", ".join(str(s) for s in t.shape)
    strides = ", ".join(str(s) for s in t.stride())
    sep = ", " if sizes else ""
    return (f"{kind}({sizes}{sep}strides=[{strides}], requires_grad={int(t.requires_grad)}, "
            f"device=cpu)")


def module_to_ir(traced: torch.jit.ScriptModule, model: torch.nn.Module) -> str:
    """Returns the IR text of ``traced.forward`` with parameters lifted to inputs.

    ``model`` is the eager module ``traced`` came from; its tensors give the
    lifted inputs their types.
    """
    text = str(traced.inlined_graph)
    header_end = text.index("):\n") + 3
    header, body = text[:header_end], text[header_end:]
    args = _HEADER.match(header.strip() + "\n")
    if args is None:
        raise RuntimeError("hp_recompute: unexpected graph header: " + header[:200])
    inputs = [a.strip() for a in args.group("args").split(",\n")]
    self_name = inputs[0].split(" : ")[0].lstrip("%")
    paths: Dict[str, str] = {self_name: ""}
    state = dict(model.named_parameters())
    state.update(dict(model.named_buffers()))
    lifted: List[str] = []
    lines: List[str] = []
    renames: Dict[str, str] = {}
    for line in body.splitlines():
        m = _GETATTR.match(line)
        if m is None:
            lines.append(line)
            continue
        parent = paths[m.group("parent")]
        path = f"{parent}.{m.group('attr')}" if parent else m.group("attr")
        if m.group("type").startswith("__torch__."):
            paths[m.group("out")] = path
            continue
        if path not in state:
            raise RuntimeError(f"hp_recompute: attribute '{path}' is neither a "
                               "parameter nor a buffer; cannot lift it to an input")
        name = "self." + path
        if name not in [x.split(" : ")[0].lstrip("%") for x in lifted]:
            lifted.append(f"%{name} : {_tensor_type(state[path])}")
        renames[m.group("out")] = name
    out = "\n".join(lines)
    # Rename uses of the dropped GetAttr values (longest names first).
    for old in sorted(renames, key=len, reverse=True):
        out = re.sub(r"%" + re.escape(old) + r"(?![\w.])", "%" + renames[old], out)
    all_inputs = inputs[1:] + lifted
    return "graph(" + ",\n      ".join(all_inputs) + "):\n" + out + "\n"
