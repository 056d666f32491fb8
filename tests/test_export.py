"""`memsteer export --to mstar|memevolve`: the files, run against stand-ins of M*'s and
MemEvolve's modules with the same names and fields, and every record and QA item round-trips."""

import importlib
import json
import shutil
import sys
import textwrap

import pytest
from script_helpers import argv
from typer.testing import CliRunner

from memsteer_dspy.cli import app
from memsteer_dspy.export import record_raw_text
from memsteer_dspy.loaders import load_history
from memsteer_dspy.records import QAItem

runner = CliRunner()

RECORDS = [
    {
        "id": "chat-1:1",
        "kind": "conversation_turn",
        "text": "User: My sister Ines moves to Porto in June.",
        "timestamp": "2024-03-02T09:15:00",
        "author": "Maya",
        "thread_id": "chat-1",
        "position": 1,
    },
    {
        "id": "mail-7",
        "kind": "email",
        "text": "The kayak rental is booked for Saturday at Lagos harbour.",
        "timestamp": "2024-03-05T08:00:00",
        "author": "Ana",
        "metadata": {"subject": "Kayak booking"},
    },
    {
        "id": "doc-2:Budget",
        "kind": "document_section",
        "text": "Budget: the trip costs 900 EUR in total.",
        "metadata": {"heading": "Budget"},
    },
]
TRAIN = [
    QAItem(
        id="g1",
        question="Where does Ines move in June?",
        answer="Porto",
        answer_type="entity",
        evidence_ids=["chat-1:1"],
        span_ids=["chat-1:1#1"],
        question_type="single-hop",
        source="generated",
    ),
    QAItem(
        id="g2",
        question="How much does the trip cost in total?",
        answer="900 EUR",
        answer_type="number",
        evidence_ids=["doc-2:Budget"],
        question_type="single-hop",
        source="generated",
    ),
]
VAL = [
    QAItem(
        id="g3",
        question="Where is the kayak rental booked?",
        answer="Lagos harbour",
        evidence_ids=["mail-7"],
        question_date="2024-03-06",
        question_type="temporal",
        source="generated",
    ),
]


@pytest.fixture
def setup(tmp_path):
    hist = tmp_path / "history.jsonl"
    hist.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    sup = tmp_path / "sup"
    sup.mkdir()
    (sup / "train.jsonl").write_text("".join(q.model_dump_json() + "\n" for q in TRAIN))
    (sup / "val.jsonl").write_text("".join(q.model_dump_json() + "\n" for q in VAL))
    return hist, sup


@pytest.fixture
def stand_in_path(tmp_path, monkeypatch):
    """A folder on sys.path for stand-in packages; their modules are dropped afterwards."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    before = set(sys.modules)
    yield root
    for name in set(sys.modules) - before:
        if name.split(".")[0] in ("mstar", "EvolveLab"):
            del sys.modules[name]
    importlib.invalidate_caches()


def write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def mstar_stand_in(root):
    """M*'s names and fields (mstar.datasets.register_dataset/load_dataset,
    mstar.evolution.types.DataItem/Dataset, mstar.evolution.evaluator scorers)."""
    write(root, "mstar/__init__.py", "")
    write(root, "mstar/evolution/__init__.py", "")
    write(
        root,
        "mstar/evolution/types.py",
        """
        from dataclasses import dataclass, field
        from typing import Any

        @dataclass
        class DataItem:
            raw_text: str
            question: str
            expected_answer: str
            metadata: dict = field(default_factory=dict)

        @dataclass
        class Dataset:
            train: list
            val: list
            test: list
            compare_fn: Any | None = None
            val_scorer: Any | None = None
            available_categories: list | None = None
            extra_scorers: dict = field(default_factory=dict)
            category_key: str | None = None
    """,
    )
    write(
        root,
        "mstar/evolution/evaluator.py",
        """
        class TokenF1Scorer: pass
        class ExactMatchScorer: pass
    """,
    )
    write(
        root,
        "mstar/datasets.py",
        """
        import inspect
        _CUSTOM_REGISTRY = {}

        def register_dataset(name):
            def decorator(fn):
                _CUSTOM_REGISTRY[name] = fn
                return fn
            return decorator

        def load_dataset(name, *, category=None, **kwargs):
            import mstar.benchmarks  # noqa: F401  (registers the loaders, as M* does)
            loader = _CUSTOM_REGISTRY[name]
            params = inspect.signature(loader).parameters
            return loader(category=category, **{k: v for k, v in kwargs.items() if k in params})
    """,
    )


def test_export_mstar_loader_runs_in_mstar_and_round_trips(setup, tmp_path, stand_in_path):
    hist, sup = setup
    out = tmp_path / "to-mstar"
    res = runner.invoke(
        app,
        [
            *argv("export --to mstar --format jsonl --path {}", hist),
            *argv("--user maya --supervision {} --out {} --json", sup, out),
        ],
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert (
        summary["records"] == 3
        and summary["qa_items"] == 3
        and summary["dataset"] == "memsteer_maya"
    )
    assert "--eval-train-ratio -1" in (out / "README.md").read_text()

    mstar_stand_in(stand_in_path)
    (stand_in_path / "mstar" / "benchmarks").mkdir(exist_ok=True)
    shutil.copy(
        out / "memsteer_maya.py", stand_in_path / "mstar" / "benchmarks" / "memsteer_maya.py"
    )
    write(
        stand_in_path,
        "mstar/benchmarks/__init__.py",
        "import mstar.benchmarks.memsteer_maya as memsteer_maya\n",
    )
    from mstar.datasets import load_dataset

    ds = load_dataset("memsteer_maya")
    history = load_history("jsonl", hist).history
    # one train item per record, in time order, with its timestamped text
    assert [d.metadata["record_id"] for d in ds.train] == [r.id for r in history]
    for d in ds.train:
        rec = history[d.metadata["record_id"]]
        assert d.raw_text == record_raw_text(rec) and rec.text in d.raw_text
        assert (d.question, d.expected_answer) == ("", "")
    assert ds.train[0].raw_text.startswith("[2024-03-02 09:15] (conversation_turn, from Maya)")
    assert ds.train[2].raw_text.startswith(
        '(document_section, "Budget")'
    )  # undated record: no date
    midnight = history["mail-7"].model_copy(
        update={"timestamp": history["mail-7"].timestamp.replace(hour=0)}
    )
    assert record_raw_text(midnight).startswith('[2024-03-05] (email, from Ana, "Kayak booking")')
    # one val item per QA item, with its category and evidence
    assert [
        (
            d.question,
            d.expected_answer,
            d.metadata["qa_category"],
            d.metadata["evidence_ids"],
            d.metadata["split"],
        )
        for d in ds.val
    ] == [
        (q.question, q.answer, q.question_type, q.evidence_ids, s)
        for q, s in [(TRAIN[0], "train"), (TRAIN[1], "train"), (VAL[0], "val")]
    ]
    assert (
        ds.val[0].metadata["span_ids"] == ["chat-1:1#1"]
        and ds.val[2].metadata["question_date"] == "2024-03-06"
    )
    assert ds.test == [] and ds.category_key == "qa_category" and set(ds.extra_scorers) == {"em"}
    assert ds.available_categories == ["single-hop", "temporal"]
    assert [d.question for d in load_dataset("memsteer_maya", category="temporal").val] == [
        VAL[0].question
    ]
    assert len(load_dataset("memsteer_maya", splits="val").val) == 1
    with pytest.raises(ValueError, match="unknown category 'nope'"):
        load_dataset("memsteer_maya", category="nope")
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    shutil.rmtree(out)
    assert len(load_dataset("memsteer_maya", data_dir=str(moved)).train) == 3


def memevolve_stand_in(root):
    """EvolveLab's names and fields (memory_types dataclasses and enums, BaseMemoryProvider)."""
    write(root, "EvolveLab/__init__.py", "")
    write(root, "EvolveLab/providers/__init__.py", "")
    write(
        root,
        "EvolveLab/memory_types.py",
        """
        from dataclasses import dataclass
        from enum import Enum
        from typing import Any, Dict, List, Optional

        class MemoryStatus(Enum):
            BEGIN = "begin"
            IN = "in"

        class MemoryType(Enum):
            AGENT_KB = "agent_kb"
            MEMSTEER_DESIGN = "memsteer_design"

        PROVIDER_MAPPING = {MemoryType.MEMSTEER_DESIGN: ("MemsteerDesignProvider", "memsteer_design_provider")}

        class MemoryItemType(Enum):
            TEXT = "text"
            API = "api"

        @dataclass
        class MemoryRequest:
            query: str
            context: str
            status: MemoryStatus
            additional_params: Optional[Dict[str, Any]] = None

        @dataclass
        class MemoryItem:
            id: str
            content: Any
            metadata: Dict[str, Any]
            score: Optional[float] = None
            type: MemoryItemType = MemoryItemType.TEXT

        @dataclass
        class MemoryResponse:
            memories: List[MemoryItem]
            memory_type: MemoryType
            total_count: int
            request_id: Optional[str] = None

        @dataclass
        class TrajectoryData:
            query: str
            trajectory: List[Dict[str, Any]]
            result: Optional[Any] = None
            metadata: Optional[Dict[str, Any]] = None
    """,
    )
    write(
        root,
        "EvolveLab/base_memory.py",
        """
        from abc import ABC, abstractmethod
        from .memory_types import MemoryRequest, MemoryResponse, TrajectoryData, MemoryType

        class BaseMemoryProvider(ABC):
            def __init__(self, memory_type: MemoryType, config=None):
                self.memory_type = memory_type
                self.config = config or {}

            @abstractmethod
            def provide_memory(self, request: MemoryRequest) -> MemoryResponse: ...

            @abstractmethod
            def take_in_memory(self, trajectory_data: TrajectoryData) -> tuple[bool, str]: ...

            @abstractmethod
            def initialize(self) -> bool: ...
    """,
    )


def test_export_memevolve_provider_serves_the_design(setup, tmp_path, stand_in_path):
    hist, sup = setup
    out = tmp_path / "to-memevolve"
    res = runner.invoke(
        app,
        [
            *argv("export --to memevolve --format jsonl"),
            *argv("--path {} --supervision {} --out {}", hist, sup, out),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "exported 3 records and 3 QA items for memevolve" in res.output
    # the history and the QA items round-trip through records.jsonl and tasks.jsonl
    history = load_history("jsonl", hist).history
    again = load_history("jsonl", out / "records.jsonl").history

    def strip(r):  # the loader's file location aside, every field survives
        return r.model_copy(
            update={"metadata": {k: v for k, v in r.metadata.items() if k != "source"}}
        )

    assert [strip(r) for r in again.records] == [strip(r) for r in history.records]
    tasks = [json.loads(x) for x in (out / "tasks.jsonl").read_text().splitlines()]
    assert [
        (t["task_id"], t["Question"], t["Final answer"], t["Annotator Metadata"]["evidence_ids"])
        for t in tasks
    ] == [(q.id, q.question, q.answer, q.evidence_ids) for q in TRAIN + VAL]
    assert {t["file_name"] for t in tasks} == {""} and "MEMSTEER_DESIGN" in (
        out / "README.md"
    ).read_text()

    memevolve_stand_in(stand_in_path)
    shutil.copy(
        out / "memsteer_design_provider.py",
        stand_in_path / "EvolveLab/providers/memsteer_design_provider.py",
    )
    from EvolveLab.memory_types import MemoryRequest, MemoryStatus, MemoryType, TrajectoryData
    from EvolveLab.providers.memsteer_design_provider import MemsteerDesignProvider

    provider = MemsteerDesignProvider({})
    assert provider.initialize() is True
    for q in TRAIN + VAL:  # each question's evidence is served, its text in the memory content
        resp = provider.provide_memory(
            MemoryRequest(query=q.question, context="", status=MemoryStatus.BEGIN)
        )
        assert (
            resp.memory_type is MemoryType.MEMSTEER_DESIGN
            and resp.total_count == len(resp.memories) >= 1
        )
        top = resp.memories[0]
        assert (
            top.metadata["record_ids"] == q.evidence_ids
            and history[q.evidence_ids[0]].text in top.content
        )
        assert top.metadata["rank"] == 1 and top.score >= resp.memories[-1].score
    ok, what = provider.take_in_memory(
        TrajectoryData(
            query="Book a ferry to Tavira",
            trajectory=[{"action": "search", "obs": "Ferry leaves Olhao at 10:30"}],
            result="ferry booked for 10:30",
        )
    )
    assert ok and "memevolve-trajectory-1" in what
    resp = provider.provide_memory(
        MemoryRequest(
            query="When does the ferry to Tavira leave?", context="", status=MemoryStatus.IN
        )
    )
    assert resp.memories[0].metadata["record_ids"] == ["memevolve-trajectory-1"]
    assert "Ferry leaves Olhao at 10:30" in resp.memories[0].content


def test_export_errors_name_the_option(setup, tmp_path):
    hist, sup = setup

    def export(to, supervision):
        line = "export --to {} --format jsonl --path {} --supervision {} --out {}"
        return runner.invoke(app, argv(line, to, hist, supervision, tmp_path / "x"))

    res = export("letta", sup)
    assert res.exit_code != 0 and "choose one of mstar, memevolve" in res.output
    (tmp_path / "empty").mkdir()
    res = export("mstar", tmp_path / "empty")
    assert res.exit_code == 2 and "has no train.jsonl" in res.output
    # an --out inside an input folder is refused before anything is read or written
    res = export("mstar", tmp_path)
    assert res.exit_code == 2 and "lies inside this command's input" in res.output
    res = export("mstar", "official")
    assert res.exit_code == 2 and "no official QA items" in res.output
