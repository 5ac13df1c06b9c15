"""Mutation proof: the conformance suite kills every bug of ``llamacpp_mutants.py``.

Each mutant is the REAL llama.cpp backend (``ruvllm_llamacpp``) with one bug injected. Each test
here runs the suite on one mutant (``--ruvllm-backend llamacpp_mutants:ClassName``), selecting
only the test(s) expected to kill it, and asserts they FAIL, by name. Mutants that need the same
child arguments run in one child pytest, each under its own backend id with its own model. The
test id names the mutant and its killer; the terminal summary (conftest.py) prints the mutation
score. That the same tests pass on the unmutated backend is proven by
``test_installed_backends.py::test_suite_passes[llamacpp]``.

The children run llama.cpp on one thread: on a shared 2-core machine OpenMP's spinning threads
crawl when the other core is busy (tests/llamacpp/conftest.py), and the numbers do not depend on
it. docs/conformance.md ("Mutation proof") has the same table in prose.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
pytest.importorskip("ruvllm_llamacpp", reason="the ruvllm-llamacpp plugin is not installed")

import llamacpp_mutants  # needs the plugin, checked above
from conformance_helpers import SuiteRun

DOCS = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"


@attrs.frozen
class Mutation:
    number: int
    mutant: type
    #: The suite tests that must fail on it: "Class::test" or "Class::test[param]".
    killers: tuple[str, ...]
    #: Extra child arguments (backend options that make the killer cheaper).
    extra: tuple[str, ...] = ()

    @property
    def backend(self) -> str:
        return self.mutant.name

    @property
    def id(self) -> str:
        short = self.backend.removeprefix("llamacpp-")
        tests = "+".join(k.split("::")[1] for k in self.killers)
        return f"{self.number:02d}-{short}-killed-by-{tests}"

    def key(self, killer: str) -> str:
        """The child's outcome key: the backend id comes first in the parameter brackets."""
        name, _, param = killer.partition("[")
        return f"{name}[{self.backend}-{param}" if param else f"{name}[{self.backend}]"

    def selection(self) -> list[str]:
        """``-k`` terms naming exactly the killers' test ids on this mutant."""
        return [self.key(killer).split("::")[1] for killer in self.killers]


M = llamacpp_mutants
MUTATIONS = (
    Mutation(1, M.KeptKvLlamaCppBackend, ("TestKvReset::test_alternating_prompts_repeat_exactly",)),
    Mutation(2, M.PositionsContinueLlamaCppBackend,
             ("TestKvReset::test_logprobs_unchanged_by_earlier_requests",)),
    Mutation(3, M.FirstTokenPrefixLlamaCppBackend,
             ("TestKvReset::test_prompts_sharing_a_prefix_stay_isolated",)),
    Mutation(4, M.StopsOneShortLlamaCppBackend, ("TestOutputs::test_max_tokens_gives_exact_length",)),
    Mutation(5, M.PerTokenStopLlamaCppBackend, ("TestOutputs::test_stop_string_truncates[inside-text]",)),
    Mutation(6, M.EosBannedLlamaCppBackend, ("TestOutputs::test_eos_finishes_with_stop",)),
    Mutation(7, M.FixedSeedLlamaCppBackend, ("TestDeterminism::test_different_seed_changes_output",)),
    Mutation(8, M.DropsHeldBackLlamaCppBackend,
             ("TestOutputs::test_max_tokens_releases_held_back_stop_prefix",)),
    Mutation(9, M.TemperatureIgnoredLlamaCppBackend, ("TestDeterminism::test_temperature_changes_output",)),
    # A 512-token context: the mutant fills it before llama.cpp refuses, which at the default
    # 4096 costs most of a minute of prefill.
    Mutation(10, M.OverlongLeavesKvLlamaCppBackend,
             ("TestBadInput::test_over_long_prompt_sent_to_the_backend_leaves_no_state",),
             ("--ruvllm-option", "n_ctx=512")),
    # test_isolation_under_concurrency kills it too (test_suite_catches_leaks.py); this is cheaper.
    Mutation(11, M.StaleKvLlamaCppBackend, ("TestEngine::test_slot_reuse_keeps_each_request_its_rows",)),
    Mutation(12, M.SlotOrderRowsLlamaCppBackend,
             ("TestEngine::test_slot_reuse_keeps_each_request_its_rows",)),
    Mutation(13, M.SlidingWindowLlamaCppBackend,
             ("TestKvPool::test_prompt_near_the_context_is_answered_from_all_of_it",),
             # Past one 512-token prefill chunk: the window then drops the first chunk's KV.
             ("--ruvllm-max-context", "1024")),
    Mutation(14, M.OverclaimedPoolLlamaCppBackend,
             ("TestKvPool::test_demand_beyond_the_pool_completes_every_request",)),
    Mutation(15, M.MinTokensIgnoredLlamaCppBackend, ("TestOutputs::test_min_tokens_keeps_the_end_out",)),
    Mutation(16, M.KeepsRejectedDraftsLlamaCppBackend,
             ("TestEngine::test_a_predicted_output_is_verified_not_trusted",)),
)


def test_every_mutant_has_a_killer_and_a_docs_row() -> None:
    assert [m.mutant for m in MUTATIONS] == list(llamacpp_mutants.MUTANTS)
    assert len({m.backend for m in MUTATIONS}) == len(MUTATIONS)
    docs = DOCS.read_text()
    missing = [m.mutant.__name__ for m in MUTATIONS if f"`{m.mutant.__name__}`" not in docs]
    assert not missing, f"docs/conformance.md's mutation table lacks {missing}"


@pytest.fixture(scope="module")
def shared_runs() -> dict[tuple[str, ...], SuiteRun]:
    """Child runs by their extra arguments: the mutants that need the same arguments share one
    child pytest, each on its own backend id (a child's start-up, about 5 s, paid once)."""
    return {}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.id for m in MUTATIONS])
def test_suite_kills_mutant(suite_runner, shared_runs, mutation: Mutation) -> None:
    run = shared_runs.get(mutation.extra)
    if run is None:
        peers = [m for m in MUTATIONS if m.extra == mutation.extra]
        backends = [arg for m in peers
                    for arg in ("--ruvllm-backend", f"llamacpp_mutants:{m.mutant.__name__}")]
        selection = " or ".join(term for m in peers for term in m.selection())
        run = shared_runs[mutation.extra] = suite_runner(
            *backends, "--ruvllm-option", "n_threads=1", *mutation.extra, "-k", selection, toys=False)
    outcomes = {k: o.outcome for k, o in run.outcomes.items() if f"[{mutation.backend}" in k}
    for killer in mutation.killers:
        key = mutation.key(killer)
        # "failed", not "error": an error would be the model failing to load, not a kill.
        assert outcomes.get(key) == "failed", (
            f"mutant {mutation.number} ({mutation.mutant.__name__}) SURVIVED {key}: {outcomes}",
            run.tail(),
        )
    assert run.result.ret == pytest.ExitCode.TESTS_FAILED, run.tail()
