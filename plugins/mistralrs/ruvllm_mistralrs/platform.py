"""Which mistral.rs build is installed, and what it can do here.

mistral.rs ships one Python module, ``mistralrs``, in several wheels: ``mistralrs`` (CPU),
``mistralrs-mkl`` (CPU with Intel MKL), ``mistralrs-accelerate`` (CPU with Apple Accelerate),
``mistralrs-cuda`` and ``mistralrs-metal``. They are drop-in alternatives; the distribution name
is how we tell which accelerator the module was built for, without importing it.
"""

from __future__ import annotations

from importlib import metadata

import attrs

#: distribution -> device the build runs on.
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
    def paged_attention(self) -> bool:
        return self.device in PAGED_DEVICES

    @property
    def paged_attention_absent_reason(self) -> str:
        return (f"mistral.rs implements PagedAttention for CUDA and Metal only; the installed build "
                f"({self.distribution} {self.version}) runs on {self.device}. Install mistralrs-cuda "
                f"or mistralrs-metal on a machine with that accelerator to use it")


def installed_build() -> Build | None:
    """The installed mistral.rs wheel (accelerated builds first), or None."""
    for dist, device in BUILDS.items():
        try:
            return Build(dist, metadata.version(dist), device)
        except metadata.PackageNotFoundError:
            continue
    return None
