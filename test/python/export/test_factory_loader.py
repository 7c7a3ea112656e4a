"""pytest: the shared ``FILE.py:FACTORY`` loader, through the exporter and the runner.

A model file that uses ``from __future__ import annotations`` with ``@dataclass`` needs
its module in ``sys.modules`` while it runs, and a file that edits ``sys.path`` while it
is imported must not make the loader drop somebody else's entry.
"""

import os
import sys

import pytest
import torch.nn as nn

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

from hp_recompute import export as hexport  # noqa: E402
from hp_recompute.factory import call_factory  # noqa: E402
from hp_recompute.runner.model import PipelineModel, load_model  # noqa: E402
from hp_recompute.plan import RunError  # noqa: E402

MARKER = "/hpr-test-entry-added-by-the-model-file"

DATACLASS_MODEL = f'''
from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from hp_recompute.runner import PipelineModel, Region

sys.path.insert(0, {MARKER!r})  # a model file that edits sys.path while it is imported


@dataclass
class Config:
    width: int = WIDTH
    depth: int = 2
    names: list[str] = field(default_factory=lambda: ["a", "b"])


def build():
    cfg = Config()
    return nn.Sequential(*[nn.Linear(cfg.width, cfg.width) for _ in range(cfg.depth)])


def build_pipeline():
    cfg = Config()
    m = build()
    regions = [Region(f"l{{i}}", (lambda i: lambda x, b: m[i](x))(i), [f"{{i}}.weight", f"{{i}}.bias"])
               for i in range(cfg.depth)]
    return PipelineModel("dataclass", m, regions, lambda g: torch.randn(2, cfg.width, generator=g),
                         lambda b: m(b).sum())


def config():
    return Config()
'''


def _write(folder, width: int, name: str = "model.py") -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(DATACLASS_MODEL.replace("WIDTH", str(width)))
    return str(path)


@pytest.fixture
def clean_path():
    """Restores sys.path and drops the loaded model modules after each test."""
    saved = list(sys.path)
    before = set(sys.modules)
    yield
    sys.path[:] = saved
    for name in set(sys.modules) - before:
        if name.startswith("_hpr_factory_"):
            del sys.modules[name]


def _assert_path_restored(folder) -> None:
    assert str(folder) not in sys.path
    assert sys.path[0] == MARKER  # the model file's own entry is left alone
    sys.path.remove(MARKER)


def test_exporter_loads_a_dataclass_config_model(tmp_path, clean_path):
    path = _write(tmp_path / "a", 6)
    model = hexport.load_factory(path + ":build")
    assert isinstance(model, nn.Sequential) and model[0].in_features == 6
    _assert_path_restored(tmp_path / "a")


def test_runner_loads_a_dataclass_config_model(tmp_path, clean_path):
    path = _write(tmp_path / "a", 5)
    model = load_model(path + ":build_pipeline")
    assert isinstance(model, PipelineModel) and model.name == "dataclass"
    assert [r.name for r in model.regions] == ["l0", "l1"]
    _assert_path_restored(tmp_path / "a")


def test_bad_factories_of_a_dataclass_model_fail_with_each_tools_error(tmp_path, clean_path):
    path = _write(tmp_path / "a", 4)
    with pytest.raises(hexport.ExportError, match=r"^hp_recompute: --module: config\(\) returned Config, "
                                                  r"expected an nn.Module$"):
        hexport.load_factory(path + ":config")
    sys.path.remove(MARKER)
    with pytest.raises(RunError, match=r"^hp_recompute.run: --model: no pipeline adapter for Config; "):
        load_model(path + ":config")
    sys.path.remove(MARKER)
    with pytest.raises(RunError, match=f"^hp_recompute.run: --model: '{path}' has no callable 'nope'$"):
        load_model(path + ":nope")
    _assert_path_restored(tmp_path / "a")


def test_two_files_of_one_name_stay_separate_modules(tmp_path, clean_path):
    """examples/*/model.py all share a file name; each class must resolve to its own module."""
    first = call_factory(_write(tmp_path / "a", 3) + ":config", "test", ValueError)
    second = call_factory(_write(tmp_path / "b", 7) + ":config", "test", ValueError)
    assert (first.width, second.width) == (3, 7)
    assert type(first).__module__ != type(second).__module__
    assert sys.modules[type(first).__module__].__file__ == str(tmp_path / "a" / "model.py")
    assert sys.modules[type(second).__module__].__file__ == str(tmp_path / "b" / "model.py")


def test_a_model_file_that_raises_leaves_no_module_and_no_path_entry(tmp_path, clean_path):
    (tmp_path / "broken.py").write_text("raise ValueError('broken on import')\n")
    before = set(sys.modules)
    with pytest.raises(RunError, match=f"^hp_recompute.run: --model: importing '{tmp_path}/broken.py' raised "
                                       f"ValueError: broken on import \\(at {tmp_path}/broken.py:1\\)$"):
        load_model(f"{tmp_path}/broken.py:build")
    assert set(sys.modules) == before
    assert str(tmp_path) not in sys.path


def test_an_error_raised_from_the_users_says_both_and_where_the_users_was(tmp_path, clean_path):
    """torch's stages wrap a block's exception (``RuntimeError("[Stage 0] failed to run
    forward:\\n...") from e``): the located line keeps the wrapper's first line and the
    user's exception with its file and line (before: the wrapper's first line alone)."""
    from hp_recompute.factory import raised_at

    (tmp_path / "block.py").write_text("def forward(x):\n    raise ValueError(f'bad input {x}')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import block as user_block
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("block", None)
    try:
        try:
            user_block.forward(3)
        except ValueError as e:
            raise RuntimeError("[Stage 0] failed to run forward:\nargs: ('Tensor(...)',)") from e
    except RuntimeError as wrapped:
        assert raised_at(wrapped) == (f"RuntimeError: [Stage 0] failed to run forward: ValueError: bad input 3 "
                                      f"(at {tmp_path}/block.py:2)")
