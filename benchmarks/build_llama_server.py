"""Build llama.cpp's own ``llama-server``, the serving peer users actually pick, from the llama.cpp
source that the installed llama-cpp-python was built from (its sdist's ``vendor/llama.cpp``).

Same kernels as the llamacpp backend (the same cmake options for this CPU,
``ruvllm_llamacpp.native_build.build_for``: AMX left out on the AMX kind), so a comparison measures
the servers, not two llama.cpp builds. The binary is cached under
``~/.cache/ruvllm/peers/llama-server-<version>-<build key>/`` (or ``$RUVLLM_PEERS_DIR``); a second
run prints its path at once. About 17 minutes on 2 cores; never
part of ``make test``. Needs cmake, a C++ compiler and the package registry (``pip download``).

    .venv/bin/python benchmarks/build_llama_server.py          # prints the binary's path
    make peers                                                 # the same
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tarfile
from importlib.metadata import version
from pathlib import Path

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from ruvllm.hardware import cpu_info
from ruvllm_llamacpp.native_build import build_for, planned

#: cmake's build lines start with a percentage of the targets done.
_PERCENT = re.compile(r"^\[\s*(\d+)%\]")

#: Only the server, linked statically (the binary alone is kept): no tests, examples, web UI
#: download (no network here) or HTTPS.
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF", "-DBUILD_SHARED_LIBS=OFF",
)


def peers_dir() -> Path:
    return Path(os.environ.get("RUVLLM_PEERS_DIR", Path.home() / ".cache" / "ruvllm" / "peers"))


def binary_path(llama_cpp_python_version: str) -> Path:
    """Where the binary for this version, built for this CPU as the backend's library is, lives."""
    _, key = planned(llama_cpp_python_version)
    return peers_dir() / f"llama-server-{llama_cpp_python_version}-{key}" / "llama-server"


def fetch_source(pkg_version: str, into: Path) -> Path:
    """The sdist of this llama-cpp-python version, unpacked; returns its ``vendor/llama.cpp``."""
    source = into / f"llama_cpp_python-{pkg_version}" / "vendor" / "llama.cpp"
    if source.is_dir():
        return source
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--no-binary", ":all:", f"llama-cpp-python=={pkg_version}", "-d", str(into)],
                   check=True)
    archive = next(into.glob(f"llama_cpp_python-{pkg_version}.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return source


def build(source: Path, build_dir: Path, jobs: int) -> Path:
    """cmake configure + build of the ``llama-server`` target, with a progress bar."""
    options = build_for(cpu_info())
    subprocess.run(["cmake", "-S", str(source), "-B", str(build_dir), *CMAKE_FLAGS, *options.cmake_args],
                   check=True, stdout=subprocess.DEVNULL, env={**os.environ, **dict(options.env)})
    log_path = build_dir / "build.log"
    with Progress(TextColumn("building llama-server"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TimeElapsedColumn()) as progress, open(log_path, "w") as log:
        task = progress.add_task("build", total=100)
        proc = subprocess.Popen(["cmake", "--build", str(build_dir), "--target", "llama-server",
                                 "-j", str(jobs)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if m := _PERCENT.match(line):
                progress.update(task, completed=int(m.group(1)))
        if proc.wait() != 0:
            raise SystemExit(f"the llama-server build failed; see {log_path}")
    return build_dir / "bin" / "llama-server"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    pkg_version = version("llama-cpp-python")
    target = binary_path(pkg_version)
    if not target.exists():
        work = peers_dir() / "src"
        source = fetch_source(pkg_version, work)
        built = build(source, work / f"build-{target.parent.name}", args.jobs)
        target.parent.mkdir(parents=True, exist_ok=True)
        built.replace(target)
    print(target)


if __name__ == "__main__":
    main()
