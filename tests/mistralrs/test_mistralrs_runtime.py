"""Capabilities come from where mistral.rs runs the model, not from the wheel's name.

The regression: a ``mistralrs-cuda`` wheel reported ``paged_attention=True`` and ``device="cuda"``
from its distribution name, while mistral.rs (``Device::cuda_if_available``) ran the model on the
CPU, where it has no PagedAttention. Here the installed CPU module stands in for a CUDA wheel on a
machine without a GPU: it is exactly that situation (same module, CPU placement), named "cuda".
"""

from __future__ import annotations

import os

import pytest
from ruvllm.errors import BackendUnavailable
from ruvllm.options import parse_options
from ruvllm_mistralrs import MistralRsBackend
from ruvllm_mistralrs.options import MistralRsOptions
from ruvllm_mistralrs.platform import Build, installed_build
from ruvllm_mistralrs.runtime import captured_stdout, parse_load_log, placement_notes

# Lines as mistral.rs 0.9.5 prints them on this CPU (colours included) ...
CPU_LOG = (
    "\x1b[2m2026-11-23T13:23:04.774595Z\x1b[0m \x1b[32m INFO\x1b[0m \x1b[2mmistralrs_quant::utils::log\x1b[0m"
    "\x1b[2m:\x1b[0m Loading model according to the following repeating layer mappings:\n"
    "\x1b[2m2026-11-23T13:23:04.774621Z\x1b[0m \x1b[32m INFO\x1b[0m \x1b[2mmistralrs_quant::utils::log\x1b[0m"
    "\x1b[2m:\x1b[0m Layers 0-29: cpu (24 GB)\n"
    "INFO mistralrs_core::kv_cache: Using f16 KV cache on CPU (set MISTRALRS_CPU_KV_F32=1 for f32).\n"
)
# ... and as a published CUDA start-up log of mistral.rs words them.
CUDA_LOG = (
    "INFO mistralrs_quant::utils::log: Layers 0-47: cuda[0] (79 GB)\n"
    "INFO mistralrs_core::paged_attention: Using PagedAttention with block size 32 and 513 GPU blocks: "
    "available context length is 16384 tokens\n"
    "INFO mistralrs_core::scheduler: Configured PagedAttention scheduler max_num_seqs=8 "
    "max_num_batched_tokens=8192\n"
)


def test_cpu_placement_is_read_from_the_load_log():
    placement = parse_load_log(CPU_LOG)
    assert placement is not None
    assert placement.devices == ("cpu",) and placement.device == "cpu"
    assert placement.paged_attention is False
    assert placement.evidence == ("Layers 0-29: cpu (24 GB)",)
    notes = placement_notes(placement, "cuda")
    assert any("no PagedAttention kernels for the CPU" in n and "cuda build" in n for n in notes)


def test_cuda_placement_with_paged_attention():
    placement = parse_load_log(CUDA_LOG)
    assert placement is not None
    assert placement.device == "cuda" and placement.paged_attention is True
    assert not any(n.startswith("paged_attention:") for n in placement_notes(placement, "cuda"))


def test_gpu_placement_without_the_scheduler_line_claims_no_paged_attention():
    placement = parse_load_log(CUDA_LOG.splitlines()[0])
    assert placement is not None and placement.device == "cuda" and placement.paged_attention is False
    assert any("did not configure" in n for n in placement_notes(placement, "cuda"))


def test_mixed_mapping_is_reported_as_both_devices():
    placement = parse_load_log("Layers 0-19: cuda[0] (8 GB)\nLayers 20-31: cpu (64 GB)\n")
    assert placement is not None and placement.device == "cuda+cpu"
    assert any("split between a GPU and the CPU" in n for n in placement_notes(placement, "cuda"))


def test_no_placement_in_the_log_claims_nothing():
    assert parse_load_log("INFO mistralrs_core: mistral.rs version: 0.9.5\n") is None
    (note,) = placement_notes(None, "cuda")
    assert "not confirmed" in note and "not claimed" in note


def test_captured_stdout_reads_the_fd_and_gives_it_back(capfd):
    with captured_stdout() as log:
        os.write(1, b"Layers 0-1: cpu (1 GB)\n")  # as Rust writes it: to fd 1, not sys.stdout
    assert log.lines == ["Layers 0-1: cpu (1 GB)"]
    assert capfd.readouterr().out == "Layers 0-1: cpu (1 GB)\n"


@pytest.fixture(scope="module")
def cuda_named(embedded):
    """The installed module loaded as if it were the mistralrs-cuda wheel (on this GPU-less machine
    that wheel runs its model on the CPU exactly like this)."""
    fake = Build("mistralrs-cuda", installed_build().version, "cuda")
    backend = MistralRsBackend(embedded, parse_options(MistralRsOptions, "mistralrs", {"threads": 1}), fake)
    yield backend
    backend.close()


def test_a_cuda_wheel_running_on_the_cpu_reports_the_cpu(cuda_named):
    caps = cuda_named.capabilities()
    assert cuda_named.placement is not None and cuda_named.placement.devices == ("cpu",)
    assert caps.device == "cpu"
    assert caps.paged_attention is False
    assert any(n.startswith("device: cpu, from mistral.rs's load log") for n in caps.notes)
    assert any(n.startswith("paged_attention: false: the model runs on cpu") for n in caps.notes)
    # It still generates: the placement check did not get in the way of the load.
    assert cuda_named.info.context_length > 0


def test_class_capabilities_never_claim_paged_attention_before_a_load():
    caps = MistralRsBackend.capabilities()
    assert caps.paged_attention is False
    assert any(n.startswith("paged_attention:") or "decided when a model loads" in n for n in caps.notes)


def test_paged_attention_demanded_where_mistral_rs_cannot_page_is_unavailable(embedded):
    """A GPU wheel on a machine whose device cannot page: mistral.rs refuses at Runner() (before
    reading weights) and the backend names the options."""
    fake = Build("mistralrs-cuda", installed_build().version, "cuda")
    opts = parse_options(MistralRsOptions, "mistralrs", {"threads": 1, "paged_attention": True})
    with pytest.raises(BackendUnavailable, match="paged attention is unavailable on this device"):
        MistralRsBackend(embedded, opts, fake)
