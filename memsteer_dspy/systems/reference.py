"""The paper's reference rows as memory designs: RAG (dense) k = 20 / 50 and Hybrid (BM25 +
dense, reciprocal rank fusion) k = 5 / 20 / 50 (paper, Table 2, after RHELM's leaderboard).

**What k means here.** In the reference rows k is the number of retrieved units handed to the
answerer. A row is therefore ``retrieve.top_k = k`` over record units (one unit per history
record, as Base-BM25 stores them) with a context budget large enough that all k units fit
(:data:`K_BUDGET`, the schema's ceiling): R@10 does not depend on the budget, and delivered recall
is the recall of the k retrieved records. With ``budget="fixed"`` the same rows keep the 4,000-token
budget every MemSteer design is held to, which makes them comparable with Base-BM25 and the
optimized designs at equal context; ``experiments/systems.py --budget`` chooses.

Every row uses the packaged MiniLM embedder (offline) and the default BM25; all five share one
store and one dense index per history (the index cache builds it once).
"""

from __future__ import annotations

from typing import Literal

from memsteer_dspy.memory.design import DEFAULT_CONTEXT_BUDGET, MemoryDesign

#: A context budget that never binds for k <= 50 record units (the schema's largest).
K_BUDGET = 1_000_000
RAG_KS = (20, 50)
HYBRID_KS = (5, 20, 50)
Budget = Literal["k", "fixed"]


def _row(name: str, index: str, k: int, budget: Budget) -> MemoryDesign:
    tokens = K_BUDGET if budget == "k" else DEFAULT_CONTEXT_BUDGET
    suffix = "" if budget == "k" else f"@{tokens}"
    return MemoryDesign.from_dict(
        {
            "name": f"{name}-k{k}{suffix}",
            "retrieve": {"index": index, "top_k": k, "pool": max(50, k)},
            "context": {"budget_tokens": tokens},
        }
    )


def rag(k: int, budget: Budget = "k") -> MemoryDesign:
    """RAG: dense retrieval (MiniLM), the top k records delivered."""
    return _row("rag", "dense", k, budget)


def hybrid(k: int, budget: Budget = "k") -> MemoryDesign:
    """Hybrid: BM25 and MiniLM fused by reciprocal rank fusion (k = 60), the top k delivered."""
    return _row("hybrid", "hybrid", k, budget)


def reference_rows(budget: Budget = "k") -> list[MemoryDesign]:
    """RAG k = 20, 50 and Hybrid k = 5, 20, 50, in the paper's order."""
    return [*(rag(k, budget) for k in RAG_KS), *(hybrid(k, budget) for k in HYBRID_KS)]
