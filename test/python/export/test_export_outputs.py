"""The exporter's outputs follow NOTE [ Output files ] (output_files.py), and a model that
raises or exits is one located error line.

Device nodes are made with ``os.mknod`` in the test's folder, never the real /dev/null.
"""

import os
import stat
import subprocess

import pytest

from cli_processes import run_module

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
MLP = os.path.join(ROOT, "examples", "mlp", "model.py")


def _export(*argv: str) -> subprocess.CompletedProcess:
    proc = run_module("hp_recompute.export", argv)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def _device(tmp_path, name: str, minor: int) -> str:
    path = os.path.join(str(tmp_path), name)
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
    except PermissionError:
        pytest.skip("os.mknod needs root (CAP_MKNOD)")
    return path


def test_ir_onto_a_character_device_keeps_the_device(tmp_path):
    null = _device(tmp_path, "null", 3)
    proc = _export("--module", MLP + ":build", "--input-shape", "8x32", "-o", str(tmp_path / "m.pt"),
                   "--ir", null, "--model-json", null)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISCHR(os.stat(null).st_mode)
    assert sorted(os.listdir(tmp_path)) == ["m.json", "m.pt", "null"]


def test_a_full_device_fails_the_export_and_writes_nothing(tmp_path):
    full = _device(tmp_path, "full", 7)
    proc = _export("--module", MLP + ":build", "--input-shape", "8x32", "-o", str(tmp_path / "m.pt"),
                   "--model-json", full)
    assert proc.returncode == 1
    assert proc.stderr == f"hp_recompute: --model-json {full}: cannot write: No space left on device\n"
    assert sorted(os.listdir(tmp_path)) == ["full"], "-o and the sidecar are not renamed into place"


@pytest.mark.parametrize("flag", ["--ir", "--model-json"])
def test_an_output_onto_the_module_file_is_refused(tmp_path, flag):
    module = tmp_path / "model.py"
    module.write_text(open(MLP).read())
    before = module.read_bytes()
    proc = _export("--module", f"{module}:build", "--input-shape", "8x32", "-o", str(tmp_path / "m.pt"),
                   flag, str(module))
    assert proc.returncode == 2
    assert f"hp_recompute: {flag} {module} is the same file as the input --module {module}" in proc.stderr
    assert module.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["model.py"]


def test_two_outputs_that_are_one_file_are_a_usage_error(tmp_path):
    proc = _export("--module", MLP + ":build", "--input-shape", "8x32", "-o", str(tmp_path / "m.pt"),
                   "--model-json", str(tmp_path / "m.json"))
    assert proc.returncode == 2
    assert (f"hp_recompute: --model-json {tmp_path}/m.json is the same file as the sidecar {tmp_path}/m.json"
            in proc.stderr)
    assert os.listdir(tmp_path) == []


def test_an_empty_output_path_is_a_usage_error(tmp_path):
    proc = _export("--module", MLP + ":build", "--input-shape", "8x32", "-o", str(tmp_path / "m.pt"), "--ir", "")
    assert proc.returncode == 2
    assert "hp_recompute: --ir: an empty path; give a file, or - for stdout" in proc.stderr
    assert os.listdir(tmp_path) == []


FACTORIES = '''
import sys
import torch.nn as nn

def raises():
    raise ValueError("no weights for this size")

def exits():
    sys.exit(0)

class Exits(nn.Module):
    def forward(self, x):
        raise SystemExit(3)

def exits_in_forward():
    return Exits()
'''


@pytest.mark.parametrize("factory,message", [
    ("raises", "hp_recompute: --module: raises() in '{f}' raised ValueError: no weights for this size (at {f}:6)"),
    ("exits", "hp_recompute: --module: exits() in '{f}' raised SystemExit: 0 (at {f}:9)"),
    ("exits_in_forward", "hp_recompute: the model fails on inputs 8x32 float32 (--input-shape, --input-dtype): "
                         "SystemExit: 3 (at {f}:13)"),
])
def test_a_model_that_raises_or_exits_is_one_located_line(tmp_path, factory, message):
    module = tmp_path / "factories.py"
    module.write_text(FACTORIES)
    proc = _export("--module", f"{module}:{factory}", "--input-shape", "8x32", "-o", str(tmp_path / "m.pt"))
    assert proc.returncode == 1
    assert proc.stderr == message.format(f=module) + "\n"
    assert sorted(os.listdir(tmp_path)) == ["factories.py"]


def test_region_depth_out_of_range_is_a_usage_error(tmp_path):
    proc = _export("--module", MLP + ":build", "--input-shape", "8x32", "-o", str(tmp_path / "m.pt"),
                   "--region-depth", "-1")
    assert proc.returncode == 2
    assert "--region-depth must be in [1, 64], got -1" in proc.stderr
