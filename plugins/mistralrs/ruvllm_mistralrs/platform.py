"""Which mistral.rs build is installed, and which accelerator it was compiled for.

mistral.rs ships one Python module, ``mistralrs``, in several wheels: ``mistralrs`` (CPU),
``mistralrs-mkl`` (CPU with Intel MKL), ``mistralrs-accelerate`` (CPU with Apple Accelerate),
``mistralrs-cuda`` and ``mistralrs-metal``. They are drop-in alternatives; the distribution name
is how we tell which accelerator the module was built for, without importing it.

That is the build's *target*, not the device a model runs on: a CUDA build falls back to the CPU
on a machine without a usable GPU. What a loaded model actually runs on (and whether
PagedAttention is in use) is read from mistral.rs at load time, in :mod:`ruvllm_mistralrs.runtime`.
The build only answers what is certain without a load: a CPU-only wheel has no PagedAttention.
"""

from __future__ import annotations

from importlib import metadata

import attrs

#: distribution -> device the build targets (what it runs on is decided at load).
BUILDS = {
    "mistralrs-cuda": "cuda",
    "mistralrs-metal": "metal",
    "mistralrs-mkl": "cpu",
    "mistralrs-accelerate": "cpu",
    "mistralrs": "cpu",
}
#: mistral.rs implements PagedAttention with CUDA and Metal kernels only.
PAGED_DEVICES = ("cuda", "metal")


@attrs.frozen
class Build:
    distribution: str
    version: str
    device: str

    @property
    def paged_kernels(self) -> bool:
        """Whether this build contains PagedAttention kernels at all (necessary, not sufficient:
        a loaded model uses them only on a GPU placement; see ruvllm_mistralrs.runtime)."""
        return self.device in PAGED_DEVICES

    @property
    def paged_attention_absent_reason(self) -> str:
        return (f"mistral.rs implements PagedAttention for CUDA and Metal only; the installed build "
                f"({self.distribution} {self.version}) is built for {self.device} only. Install "
                f"mistralrs-cuda or mistralrs-metal on a machine with that accelerator to use it")


def installed_build() -> Build | None:
    """The installed mistral.rs wheel (accelerated builds first), or None."""
    for dist, device in BUILDS.items():
        try:
            return Build(dist, metadata.version(dist), device)
        except metadata.PackageNotFoundError:
            continue
    return None
