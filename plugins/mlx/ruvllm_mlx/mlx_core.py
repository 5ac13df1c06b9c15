"""The one door to ``mlx.core`` in this plugin: MLX's CPU matmul is set up before it opens.

The optimized ``sgemm_`` must be interposed before the process's first ``import mlx.core``
(see :mod:`ruvllm_mlx.cpu_blas`), and only by a process that runs MLX: doing it at package
import made every ``ruvllm serve`` on another backend map torch's CPU library (~50 MB resident)
because plugin discovery imports every plugin. Modules and tests import ``mx`` from here.
"""

from ruvllm_mlx.cpu_blas import preload

preload()

import mlx.core as mx  # noqa: E402  (after the interposition, on purpose)

__all__ = ["mx"]
