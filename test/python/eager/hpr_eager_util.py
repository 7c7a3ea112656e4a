"""Helpers shared by the eager tests: counted functions, a small block, grad comparisons."""

import gc
import os
from typing import Callable, Dict, List, Sequence

import torch
import torch.utils.checkpoint as torch_cp

DEVICE = os.environ.get("HPR_TEST_DEVICE", "cpu")
# torch >= 2.0 native checkpoint replays once per backward (graph task).
PER_GRAPH_TASK = hasattr(torch._C, "_current_graph_task_id")


def native_checkpoint(fn: Callable, *args, **kwargs):
    """The installed torch's non-reentrant checkpoint: the reference our checkpoint must equal."""
    return torch_cp.checkpoint(fn, *args, use_reentrant=False, **kwargs)


class Counted:
    """Wraps a function; ``calls`` counts entries, ``completions`` counts returns."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.calls = 0
        self.completions = 0
        self.__qualname__ = getattr(fn, "__qualname__", "counted")

    def __call__(self, *args, **kwargs):
        self.calls += 1
        out = self.fn(*args, **kwargs)
        self.completions += 1
        return out


class Block(torch.nn.Module):
    """Linear -> GELU -> dropout -> Linear with a residual; ``hidden`` is a tell-tale width."""

    def __init__(self, dim: int, hidden: int, p: float = 0.0):
        super().__init__()
        self.fc1 = torch.nn.Linear(dim, hidden)
        self.fc2 = torch.nn.Linear(hidden, dim)
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.fc1(x))
        h = torch.nn.functional.dropout(h, self.p, training=True)
        return x + torch.tanh(self.fc2(h))


def make_blocks(n: int, dim: int, hidden: int, device, p: float = 0.0, seed: int = 0) -> List[Block]:
    torch.manual_seed(seed)
    return [Block(dim, hidden, p).to(device) for _ in range(n)]


def checkpointed_chain(fns: Sequence[Callable], x: torch.Tensor):
    """``x`` as a leaf through ``hp_recompute.checkpoint`` of each of ``fns`` in turn, then
    ``pow(2).sum()``, under a handle collector. Returns (leaf, loss, handles); only the loss
    holds the graph."""
    import hp_recompute as hr

    leaf = x.clone().requires_grad_()
    with hr.recompute_handle_collector_ctx() as handles:
        h = leaf
        for fn in fns:
            h = hr.checkpoint(fn, h)
        loss = h.pow(2).sum()
    return leaf, loss, handles


def params_of(blocks: Sequence[torch.nn.Module]) -> List[torch.nn.Parameter]:
    return [p for b in blocks for p in b.parameters()]


def assert_bit_equal(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, i
        assert torch.equal(g, w), f"gradient {i} differs: max abs diff {(g - w).abs().max().item()}"


def live_tensors(pred: Callable[[torch.Tensor], bool]) -> int:
    """Python-visible live tensors matching ``pred`` (what a session would keep alive)."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if issubclass(type(o), torch.Tensor) and pred(o))


def count_saved(fn: Callable, *args) -> Dict[str, int]:
    """Run ``fn`` plainly and count what autograd saves, by shape string (independent of hp_recompute)."""
    counts: Dict[str, int] = {}

    def pack(t):
        key = str(tuple(t.shape))
        counts[key] = counts.get(key, 0) + 1
        return key  # never the tensor: a saved output holding itself would form a leak cycle

    def unpack(_):
        raise AssertionError("count_saved graphs are never backpropagated")

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        fn(*args)
    return counts
