"""Memory designs d = (store, retrieve, context) and the memory systems built from them.

* :class:`MemoryDesign` — the design as data (JSON, with a schema a proposer LM reads);
  :meth:`MemoryDesign.base_bm25` is the paper's Base-BM25.
* :class:`MemorySystem` — ``MemorySystem.from_design(design, history, cache_dir=..., lms=...)``:
  store → retriever → context builder → fixed answerer, a ``dspy.Module`` whose predictions carry
  a :class:`MemoryTrace`.
* :func:`lookup_record` — is a record stored, and retrievable (for failure diagnosis).
"""

from memsteer_dspy.memory.design import (
    DEFAULT_CONTEXT_BUDGET,
    AnswerSpec,
    BM25Params,
    ContextSpec,
    DenseParams,
    MemoryDesign,
    RetrieveSpec,
    StoreSpec,
    design_json_schema,
)
from memsteer_dspy.memory.lookup import RecordLookup, lookup_record
from memsteer_dspy.memory.store import MemoryStore, MemoryUnit, UnitPart
from memsteer_dspy.memory.system import MemorySystem, MemoryTrace

__all__ = [
    "DEFAULT_CONTEXT_BUDGET",
    "AnswerSpec",
    "BM25Params",
    "ContextSpec",
    "DenseParams",
    "MemoryDesign",
    "MemoryStore",
    "MemorySystem",
    "MemoryTrace",
    "MemoryUnit",
    "RecordLookup",
    "RetrieveSpec",
    "StoreSpec",
    "UnitPart",
    "design_json_schema",
    "lookup_record",
]
