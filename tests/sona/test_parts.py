"""SONA's parts on their own: the trajectory store, EWC++, MicroLoRA stacking/truncation and
the pattern bank (pure logic, no model run)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ruvllm.errors import InvalidRequest
from ruvllm.types import Trajectory
from ruvllm_candle_like.config import ModelConfig
from ruvllm_sona.ewc import EwcPlusPlus
from ruvllm_sona.micro_lora import MicroLora, combine, truncate
from ruvllm_sona.patterns import Pattern, PatternBank, kmeans
from ruvllm_sona.store import TrajectoryStore


def traj(rid: str) -> Trajectory:
    return Trajectory(request_id=rid, prompt_ids=(1, 2, 3), output_ids=(4, 5))


def test_store_records_feedback_and_evicts_oldest():
    store = TrajectoryStore(capacity=2)
    for rid in ("a", "b", "c"):
        store.record(traj(rid))
    assert "a" not in store and len(store) == 2
    assert not store.feedback("a", 1.0)  # evicted: unknown
    assert store.feedback("b", -0.5)
    assert [r.trajectory.request_id for r in store.pending_feedback()] == ["b"]
    for bad in (1.5, -2, float("nan"), "1", True):
        with pytest.raises(InvalidRequest) as err:
            store.feedback("c", bad)
        assert err.value.field == "score"


def test_ewc_penalty_is_zero_at_anchor_and_weighs_by_fisher():
    p = torch.zeros(3, requires_grad=True)
    ewc = EwcPlusPlus([p], strength=2.0, decay=0.5)
    assert ewc.penalty().item() == 0.0
    ewc.observe([torch.tensor([1.0, 0.0, 0.0])])
    ewc.observe([torch.tensor([1.0, 0.0, 2.0])])  # online blend: F = 0.5 * [1,0,0]^2 + 0.5 * [1,0,2]^2
    assert torch.allclose(ewc.fisher[0], torch.tensor([1.0, 0.0, 2.0]))
    with torch.no_grad():
        p.copy_(torch.tensor([1.0, 1.0, 0.0]))
    # penalty = 0.5 * strength * sum F (p - anchor)^2 = 0.5 * 2 * (1*1 + 0*1 + 2*0) = 1
    assert ewc.penalty().item() == pytest.approx(1.0)
    # A consolidation restarts the parameters: the anchor moves to their start, the Fisher stays.
    q = torch.full((3,), 5.0, requires_grad=True)
    ewc.rebase([q])
    assert ewc.penalty().item() == 0.0
    with torch.no_grad():
        q.add_(torch.tensor([0.0, 3.0, 1.0]))
    assert ewc.penalty().item() == pytest.approx(2.0)  # 0.5 * 2 * (0*0 + 0*9 + 2*1)
    with pytest.raises(ValueError):
        ewc.rebase([torch.zeros(4)])


def test_stacked_pairs_sum_exactly_and_truncation_keeps_the_dominant_part():
    g = torch.Generator().manual_seed(0)
    one = {(0, "q_proj"): (torch.randn(2, 8, generator=g), torch.randn(6, 2, generator=g))}
    two = {(0, "q_proj"): (torch.randn(3, 8, generator=g), torch.randn(6, 3, generator=g))}
    a, b = combine([one, two])[(0, "q_proj")]
    full = one[(0, "q_proj")][1] @ one[(0, "q_proj")][0] + two[(0, "q_proj")][1] @ two[(0, "q_proj")][0]
    assert torch.allclose(b @ a, full, atol=1e-5)
    ta, tb = truncate({(0, "q_proj"): (a, b)}, 5)[(0, "q_proj")]
    assert torch.allclose(tb @ ta, full, atol=1e-4)  # rank 5 holds a rank-5 sum exactly
    ra, rb = truncate({(0, "q_proj"): (a, b)}, 1)[(0, "q_proj")]
    err1 = torch.linalg.matrix_norm(full - rb @ ra)
    s = torch.linalg.svdvals(full)
    assert float(err1) == pytest.approx(float(s[1:].square().sum().sqrt()), rel=1e-3)  # Eckart-Young


def test_micro_lora_adapts_only_the_last_layers_asked():
    cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=4,
                      num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=64,
                      tie_word_embeddings=True)
    last = MicroLora(cfg, rank=2, alpha=4.0, targets=("q_proj", "v_proj"), layers=1)
    assert set(last.a) == {(3, "q_proj"), (3, "v_proj")}
    assert {layer for layer, _ in MicroLora(cfg, rank=2, alpha=4.0, targets=("q_proj",)).a} == {0, 1, 2, 3}


def test_pattern_bank_routes_to_the_nearest_similar_pattern():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal([5, 0, 0], 0.3, (20, 3)), rng.normal([0, 5, 0], 0.3, (20, 3))])
    centroids, assign = kmeans(x, 2)
    assert len(set(assign[:20])) == 1 and len(set(assign[20:])) == 1 and assign[0] != assign[20]
    bank = PatternBank(threshold=0.9)
    assert bank.replace([Pattern(centroid=c, adapter=f"a{j}", size=20, mean_score=1.0)
                         for j, c in enumerate(centroids)]) == set()
    first = bank.route(np.array([4.0, 0.2, 0.0]))
    second = bank.route(np.array([0.1, 3.0, 0.0]))
    assert {first, second} == {"a0", "a1"}
    assert bank.route(np.array([0.0, 0.0, 1.0])) is None  # nothing similar enough: base model
    assert bank.replace([Pattern(centroid=centroids[0], adapter="b", size=1, mean_score=1.0)]) == {"a0", "a1"}
    assert bank.route(centroids[0] * 5) == "b" and bank.route(centroids[1] * 5) is None
