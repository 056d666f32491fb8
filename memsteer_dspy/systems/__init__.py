"""Systems a user would pick instead of a MemSteer design, measured the same way.

* :mod:`~memsteer_dspy.systems.reference` — the paper's reference rows as designs: RAG k = 20/50,
  Hybrid k = 5/20/50;
* :class:`OracleSystem` — gold evidence as the context (an upper bound);
* :class:`ExternalSystem` — the base of every third-party adapter (:mod:`.mempalace_adapter`,
  :mod:`.mem0_adapter`): the package ranks, the adapter maps its hits back to record ids, and
  evaluation scores R@k and delivered recall exactly as for a design.

Third-party packages are extras (``pip install 'memsteer-dspy[mempalace]'``, ``[mem0]``), imported
only inside their adapter.
"""

from memsteer_dspy.systems.base import ExternalSystem, Hit, SystemCard, record_store
from memsteer_dspy.systems.oracle import OracleSystem
from memsteer_dspy.systems.reference import hybrid, rag, reference_rows

__all__ = [
    "ExternalSystem",
    "Hit",
    "OracleSystem",
    "SystemCard",
    "hybrid",
    "rag",
    "record_store",
    "reference_rows",
]
