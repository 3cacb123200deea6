"""regen's vLLM plugin: Qwen3.5's module imports without torchvision, through transformers' PIL image module."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

# In a fresh interpreter: the plugin changes sys.modules, which must not leak into other tests.
WITHOUT_TORCHVISION = """
import sys
sys.modules["torchvision"] = None  # what an install without torchvision sees: ImportError on import
from worker.engine.vllm_plugin import (PIL_IMAGE_MODULE, TORCHVISION_IMAGE_MODULE,
                                       serve_pil_image_module_without_torchvision)
assert serve_pil_image_module_without_torchvision() is True
assert serve_pil_image_module_without_torchvision() is True  # vLLM may load plugins twice
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize
assert smart_resize.__module__ == PIL_IMAGE_MODULE
assert smart_resize(280, 280) == (280, 280)
print("ok")
"""


def test_qwen_vl_image_module_is_transformers_pil_one_without_torchvision():
    out = subprocess.run([sys.executable, "-c", WITHOUT_TORCHVISION], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_plugin_is_registered_where_vllm_looks_for_general_plugins():
    plugins = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="vllm.general_plugins")}
    assert plugins.get("regen_text_only_qwen3_5") == "worker.engine.vllm_plugin:register", (
        f"{plugins}: reinstall regen (pip install -e .) so its entry points are current")
