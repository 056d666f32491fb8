"""A tuned memory design as a MemEvolve memory provider, and the supervision as MemEvolve tasks.

MemEvolve (bingreeky/MemEvolve; its EvolveLab provider interface read at the fork
bionicbutterfly13/MemEvolve commit bd8ac0dc, ``Flash-Searcher-main/EvolveLab/``) runs agents
with a pluggable memory provider: a ``BaseMemoryProvider`` subclass with ``initialize() -> bool``,
``provide_memory(MemoryRequest(query, context, status, additional_params)) ->
MemoryResponse(memories=[MemoryItem(id, content, metadata, score, type)], memory_type,
total_count, request_id)`` and ``take_in_memory(TrajectoryData(query, trajectory, result,
metadata)) -> (bool, str)``; providers are found through ``MemoryType`` and ``PROVIDER_MAPPING``
in ``EvolveLab/memory_types.py`` and configured in ``EvolveLab/config.py``.

:func:`export_memevolve` writes

* ``memsteer_design_provider.py`` — ``MemsteerDesignProvider``: builds
  ``MemorySystem.from_design(design, history)`` (memsteer-dspy must be installed in MemEvolve's
  environment); ``provide_memory`` returns the units the design delivers within its context
  budget, best first, one ``MemoryItem`` each (id = unit id, content = the unit's text as the design
  formats it, metadata = its record ids and rank, score = retrieval score); ``take_in_memory`` adds
  the trajectory as a ``note`` record and rebuilds the memory, so the tournament's online
  evolution still works;
* ``design.json`` and ``records.jsonl`` (the history, native JSONL) the provider loads;
* ``tasks.jsonl`` — the supervision in GAIA's ``metadata.jsonl`` shape (``task_id``,
  ``Question``, ``Level``, ``Final answer``, ``file_name``, ``Annotator Metadata``), the task-file
  shape of MemEvolve's GAIA runner (``--infile``), with the evidence ids and QA category kept;
* ``README.md`` — the lines to add to ``memory_types.py`` and ``config.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

from memsteer_dspy.errors import InputError
from memsteer_dspy.export.common import (
    ExportItem,
    check_export_folder,
    jsonl,
    unresolved_evidence,
    write_atomic,
)
from memsteer_dspy.memory.design import MemoryDesign
from memsteer_dspy.records import History

MEMEVOLVE_COMMIT = "bd8ac0dce74fa4d27f339b6b2d1da154d2225ddd"  # bionicbutterfly13/MemEvolve (fork)

PROVIDER_SOURCE = '''"""MemSteer memory design as a MemEvolve (EvolveLab) memory provider.

Exported by `memsteer export --to memevolve`. Needs memsteer-dspy installed in this environment.
Config keys: design_path, records_path (default: beside this file's export folder), cache_dir
(index cache; default none), answer_lm (unused: MemEvolve's agent answers).
"""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path
from typing import Any

from EvolveLab.base_memory import BaseMemoryProvider
from EvolveLab.memory_types import (
    MemoryItem,
    MemoryItemType,
    MemoryRequest,
    MemoryResponse,
    MemoryType,
    TrajectoryData,
)

EXPORT_DIR = Path(__EXPORT_DIR__)


class MemsteerDesignProvider(BaseMemoryProvider):
    """Serves the units a MemSteer MemoryDesign delivers for the query, best first."""

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__(memory_type=MemoryType.MEMSTEER_DESIGN, config=config or {})
        self._lock = threading.Lock()
        self._records: list = []
        self._system = None
        self._design = None
        self._taken = 0

    def initialize(self) -> bool:
        from memsteer_dspy.loaders.jsonl import load_jsonl
        from memsteer_dspy.memory import MemoryDesign

        design_path = Path(self.config.get("design_path") or EXPORT_DIR / "design.json")
        records_path = Path(self.config.get("records_path") or EXPORT_DIR / "records.jsonl")
        self._design = MemoryDesign.load(design_path)
        self._records = list(load_jsonl(records_path).history.records)
        self._rebuild()
        return True

    def _rebuild(self) -> None:
        from memsteer_dspy.memory import MemorySystem
        from memsteer_dspy.records import History

        history = History("memevolve", self._records)
        self._system = MemorySystem.from_design(self._design, history, cache_dir=self.config.get("cache_dir"))

    def provide_memory(self, request: MemoryRequest) -> MemoryResponse:
        with self._lock:
            if self._system is None:
                self.initialize()
            system = self._system
        pred = system.retriever(request.query)
        built = system.context_builder(pred.indices, pred.cutoff_day)
        delivered = set(built.delivered_unit_ids)
        memories = []
        for rank, (unit_id, text, record_ids, score) in enumerate(
            zip(pred.unit_ids, pred.passages, pred.record_ids, pred.scores, strict=True), start=1
        ):
            if unit_id in delivered:
                memories.append(MemoryItem(
                    id=unit_id, content=text, score=float(score), type=MemoryItemType.TEXT,
                    metadata={"source": "memsteer", "record_ids": list(record_ids), "rank": rank,
                              "design": self._design.name, "design_key": self._design.key()},
                ))
        return MemoryResponse(memories=memories, memory_type=self.memory_type, total_count=len(memories),
                              request_id=str(uuid.uuid4()))

    def take_in_memory(self, trajectory_data: TrajectoryData) -> tuple[bool, str]:
        from memsteer_dspy.records import Record

        steps = trajectory_data.trajectory or []
        lines = [f"Task: {trajectory_data.query}"]
        lines += [json.dumps(s, ensure_ascii=False, default=str) if not isinstance(s, str) else s for s in steps]
        if trajectory_data.result is not None:
            lines.append(f"Result: {trajectory_data.result}")
        with self._lock:
            if self._system is None:
                self.initialize()
            self._taken += 1
            rid = f"memevolve-trajectory-{self._taken}"
            while any(r.id == rid for r in self._records):
                self._taken += 1
                rid = f"memevolve-trajectory-{self._taken}"
            self._records.append(Record(id=rid, kind="note", text="\\n".join(lines),
                                        metadata=dict(trajectory_data.metadata or {})))
            self._rebuild()
            return True, f"stored trajectory as record {rid}; memory holds {len(self._records)} records"
'''

README_TEMPLATE = """# MemSteer design `{design}` as a MemEvolve memory provider

Exported by `memsteer export --to memevolve` from user `{user}`: the design `{design}`
({design_key}) over {n_records} records, and {n_qa} QA items as tasks. The provider follows
EvolveLab's interface as read at {commit_ref}.

1. Install memsteer-dspy in MemEvolve's environment (`pip install memsteer-dspy`, or this checkout).
2. Copy `memsteer_design_provider.py` into `Flash-Searcher-main/EvolveLab/providers/`.
3. In `EvolveLab/memory_types.py` add to `MemoryType` and `PROVIDER_MAPPING`:

       MEMSTEER_DESIGN = "memsteer_design"
       MemoryType.MEMSTEER_DESIGN: ("MemsteerDesignProvider", "memsteer_design_provider"),

4. In `EvolveLab/config.py`, under `"providers"`:

       MemoryType.MEMSTEER_DESIGN: {{"design_path": "{out}/design.json",
                                     "records_path": "{out}/records.jsonl", "cache_dir": None}},

5. Run it like any provider, on the supervision as tasks (GAIA `metadata.jsonl` shape):

       python run_flash_searcher_mm_gaia.py --infile {out}/tasks.jsonl \\
           --outfile memsteer_output/results.jsonl --memory_provider memsteer_design --sample_num {n_qa}

   or make it the tournament's starting system: `python evolve_cli.py auto-evolve ... --provider memsteer_design`.
"""


def export_memevolve(
    history: History, design: MemoryDesign, items: list[ExportItem], out: str | Path
) -> dict:
    """Write the MemEvolve provider, its data and the tasks into ``out``; returns a summary."""
    out = Path(out).resolve()
    check_export_folder(out)
    if not items:
        raise InputError(
            "no QA items to export",
            field="--supervision",
            hint="pass a folder `memsteer generate` wrote, or --supervision official",
        )
    records = [r.model_dump(mode="json") for r in history.records]
    tasks = [
        {
            "task_id": e.item.id,
            "Question": e.item.question,
            "Level": 1,
            "Final answer": e.item.answer,
            "file_name": "",
            "Annotator Metadata": {
                "evidence_ids": list(e.item.evidence_ids),
                "span_ids": list(e.item.span_ids),
                "qa_category": e.category,
                "answer_type": str(e.item.answer_type),
                "split": e.split,
                "source": "memsteer",
            },
        }
        for e in items
    ]
    write_atomic(out / "records.jsonl", jsonl(records))
    write_atomic(out / "design.json", design.to_json() + "\n")
    write_atomic(out / "tasks.jsonl", jsonl(tasks))
    write_atomic(
        out / "memsteer_design_provider.py",
        PROVIDER_SOURCE.replace("__EXPORT_DIR__", repr(str(out))),
    )
    write_atomic(
        out / "README.md",
        README_TEMPLATE.format(
            design=design.name,
            design_key=design.key(),
            user=history.user_id,
            n_records=len(records),
            n_qa=len(tasks),
            out=out,
            commit_ref=f"bionicbutterfly13/MemEvolve@{MEMEVOLVE_COMMIT[:8]}",
        ),
    )
    summary = {
        "to": "memevolve",
        "provider": str(out / "memsteer_design_provider.py"),
        "design": design.name,
        "records": len(records),
        "qa_items": len(tasks),
        "out": str(out),
        "follows": f"bionicbutterfly13/MemEvolve@{MEMEVOLVE_COMMIT} (fork of bingreeky/MemEvolve)",
        "unresolved_evidence": unresolved_evidence(history, items),
    }
    write_atomic(out / "export.json", json.dumps(summary, indent=2) + "\n")
    return summary
