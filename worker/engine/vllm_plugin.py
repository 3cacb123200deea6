"""regen's vLLM plugin: Qwen3.5/3.6 (``Qwen3_5ForCausalLM``, ``Qwen3_5ForConditionalGeneration``) on an
install without torchvision (the CPU one: scripts/install.sh, docs/hybrid.md).

vLLM imports its Qwen3.5 module for the text-only architecture too, and that module imports Qwen3-VL's,
which imports ``smart_resize`` from transformers' torchvision-backed Qwen2-VL image processor: without
torchvision, "failed to be inspected ... No module named 'torchvision'", before a weight is read. A text
model never resizes an image, and transformers ships the same processor on PIL
(``image_processing_pil_qwen2_vl``, whose ``smart_resize`` is a copy of the torchvision module's): without
torchvision, transformers' own ``Qwen2VLImageProcessor`` already resolves to it ("falling back to
Qwen2VLImageProcessorPil"). This plugin makes the one module vLLM names directly resolve to it as well,
and only where torchvision cannot be imported: with torchvision (every CUDA install) it changes nothing.

vLLM runs a ``vllm.general_plugins`` entry point (pyproject.toml) in every process it starts: the
engine core, and the subprocess that inspects a model's architecture, which a worker's own imports
never reach.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys

log = logging.getLogger(__name__)

#: The module vLLM's qwen3_vl.py (and qwen2_vl.py) imports ``smart_resize`` from; it imports torchvision.
TORCHVISION_IMAGE_MODULE = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
#: Its PIL twin in transformers (5.x), the backend transformers falls back to without torchvision.
PIL_IMAGE_MODULE = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"


def register() -> None:
    """The plugin's entry point; vLLM may call it more than once in a process (it must stay idempotent)."""
    serve_pil_image_module_without_torchvision()


def serve_pil_image_module_without_torchvision() -> bool:
    """Resolve ``TORCHVISION_IMAGE_MODULE`` to ``PIL_IMAGE_MODULE`` where torchvision cannot be imported.

    Returns:
        Whether the PIL module now stands for the torchvision one (False: torchvision works, or this
        transformers has no PIL twin, in which case vLLM reports the missing torchvision as before).
    """
    current = sys.modules.get(TORCHVISION_IMAGE_MODULE)
    if current is not None:
        return current.__name__ == PIL_IMAGE_MODULE
    if _torchvision_loads():
        return False
    try:
        pil_module = importlib.import_module(PIL_IMAGE_MODULE)
    except ImportError:
        return False
    sys.modules[TORCHVISION_IMAGE_MODULE] = pil_module
    log.debug("no torchvision: %s stands for %s (text-only Qwen3.5 needs no image processor)",
              PIL_IMAGE_MODULE, TORCHVISION_IMAGE_MODULE)
    return True


def _torchvision_loads() -> bool:
    """Whether the torchvision-backed module imports; PyPI's torchvision against torch+cpu fails at import
    ("operator torchvision::nms does not exist", a RuntimeError), so on a CPU torch importing is the only
    true test. A CUDA or ROCm torch comes with vLLM's own torchvision: trusted, not imported in every process."""
    if importlib.util.find_spec("torchvision") is None:
        return False
    import torch

    if torch.version.cuda or getattr(torch.version, "hip", None):
        return True
    try:
        importlib.import_module(TORCHVISION_IMAGE_MODULE)
    except (ImportError, RuntimeError):
        return False
    return True
