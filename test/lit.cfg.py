# lit configuration for hp-recompute: FileCheck tests of the dialect, the
# passes and the tools. Run through `ninja check-hpr-lit` (or scripts/check.sh).
import os

import lit.formats

config.name = "hp-recompute"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".test"]
config.excludes = ["inputs", "Inputs", "unittests", "python", "lit.cfg.py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.hpr_obj_root, "test")

config.environment["PATH"] = os.pathsep.join(
    [config.hpr_tools_dir, config.llvm_tools_dir, config.environment.get("PATH", "")]
)
config.environment["PYTHONPATH"] = os.path.join(config.hpr_src_root, "python")

# Under ASan (-DHPR_SANITIZE=ON) the plugin cannot load into Debian's
# uninstrumented mlir-opt-19 (the ASan runtime must come first); tests that
# need that say `UNSUPPORTED: asan`.
if config.hpr_sanitized:
    config.available_features.add("asan")

# The LibTorch the TorchScript importer links (the venv wheel's, or Debian's):
# what a TorchScript file saved by torch 2.x imports to depends on it.
_torch_major = config.hpr_torch_version.split(".")[0]
config.available_features.add(
    "libtorch-2" if _torch_major.isdigit() and int(_torch_major) >= 2 else "libtorch-1")

config.substitutions.append(("%hpr_plugin", config.hpr_plugin))
config.substitutions.append(("%crashing_importer", config.hpr_crashing_importer))
config.substitutions.append(("%mlir-opt", os.path.join(config.llvm_tools_dir, "mlir-opt")))
config.substitutions.append(("%python", config.python_executable))
config.substitutions.append(("%inputs", os.path.join(config.test_source_root, "inputs")))
config.substitutions.append(("%examples", os.path.join(config.hpr_src_root, "examples")))
