"""Which engine build failures stop a worker for good (one line), and which keep the launcher's back-off."""

from __future__ import annotations

import pydantic
import pytest
import torch

from worker.engine.build_errors import never_builds, one_line


class _Config(pydantic.BaseModel):
    chunked_prefill: bool

    @pydantic.model_validator(mode="after")
    def _align(self):
        assert self.chunked_prefill, "Chunked prefill is required for mamba cache mode 'align'."
        return self


def _validation_error() -> pydantic.ValidationError:
    with pytest.raises(pydantic.ValidationError) as caught:
        _Config(chunked_prefill=False)
    return caught.value


def test_vllms_config_validation_never_builds_and_reads_as_one_line(tmp_path):
    reason = never_builds(_validation_error(), str(tmp_path))
    assert reason is not None and "\n" not in reason
    assert "Chunked prefill is required for mamba cache mode 'align'" in reason
    unsupported = ValueError("Model architectures ['NopeForCausalLM'] are not supported for now.\nSupported: ...")
    assert never_builds(unsupported, str(tmp_path)) == ("ValueError: Model architectures ['NopeForCausalLM'] "
                                                         "are not supported for now.")
    assert never_builds(TypeError("unexpected keyword argument 'enable_foo'"), str(tmp_path)) is not None


def test_a_missing_model_folder_never_builds_whatever_the_error(tmp_path):
    reason = never_builds(OSError("Incorrect path_or_model_id"), str(tmp_path / "gone"))
    assert reason == f"the model folder {tmp_path / 'gone'} does not exist on this node"


def test_memory_and_engine_process_failures_keep_the_back_off(tmp_path):
    assert never_builds(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), str(tmp_path)) is None
    assert never_builds(RuntimeError("Engine core initialization failed. See root cause above."), str(tmp_path)) is None
    assert never_builds(ValueError("No available memory for the cache blocks."), str(tmp_path)) is None
    assert never_builds(OSError("We couldn't connect to 'https://huggingface.co'"), "Qwen/Qwen3.6-27B") is None


def test_one_line_is_the_first_line_clipped():
    assert one_line(RuntimeError("\n  first\nsecond")) == "first"
    assert len(one_line(ValueError("x" * 1000))) == 400
