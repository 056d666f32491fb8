"""What every experiment script shares: the config (LM per role, dataset, budgets) and its presets,
the RHELM data, the method's stages as resumable steps, a shared design over several personas,
result tables, per-item JSONL and MLflow.

The paper's studies (Section 4 and Appendices A/B) are each one script in this folder. A script is
a function of (config, preset, seed) that writes only into its ``--out`` folder:

=======================  ==========================================================================
``results.md``           the study's table(s), shaped like the paper's, with the settings and costs
                         (rewritten after every stage while the study runs, marked partial)
``results.json``         every number in the tables, machine-readable
``items.jsonl``          one line per (condition, persona, official test item): correct, QS, R@10,
                         prediction, reference, error
``log.txt``              progress lines (also printed to stderr)
``run.json``             the resolved config and the study's MLflow run id (a rerun resumes it)
``mlflow.db``            the MLflow store (``sqlite:///<out>/mlflow.db``): one study run with the
                         table numbers as metrics, and one run per MemSteer-Opt optimization (with
                         a nested run per candidate design), nested under the study run
``<stage folders>``      each stage's own outputs: ``memsteer generate``-style supervision folders,
                         MemSteer-Opt run folders, evaluation folders (``items.jsonl`` with traces)
``cache/``               stores and indexes, reused across designs and reruns
=======================  ==========================================================================

Every stage resumes where it stopped (supervision generation, optimization iterations and
evaluated items are all append-only on disk), so rerunning the same command after an interruption
continues the study and never pays for an LM call twice.

Presets size a study (the config's ``[budgets]`` and study tables override them key by key):

* ``tiny`` — a few items and one iteration: for the tests, with a scripted LM (seconds to minutes);
* ``small`` — the embedded LM on one RHELM persona, sized to finish in about 30 minutes on 2 cores;
* ``cpu`` — main.py's Table 2 on the embedded LM, spread over sessions on 2 cores: all ten
  personas with external sources, 15 iterations, 40 accepted supervision items per persona, the
  2,000-token context budget, tested on the official items neither optimization used (recall on
  every item, accuracy on a stratified sample of 150; see ``_protocol.py``);
* ``full`` — the paper's sizes: all ten personas, 20 iterations, 788 supervision items, the full
  official evaluation set and the 4,000-token context budget.

Several personas share one design (the paper's ten-user and six-user settings, Appendix B.4):
:func:`shared_optimizer` (a :class:`SharedEvaluator`) scores a candidate on the pooled questions of all of them, each persona's
questions answered from that persona's own memory.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import random
import sys
import threading
import time
import tomllib
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypedDict

import _state  # experiments/_state.py (the scripts put experiments/ on sys.path)
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from memsteer_dspy.errors import ConfigError, InputError, MemsteerError
from memsteer_dspy.evaluation import (
    EvaluationReport,
    EvaluationSummary,
    ItemResult,
    MetricSummary,
    evaluate_design,
    summarize_items,
)
from memsteer_dspy.loaders.base import Loaded
from memsteer_dspy.memory import MemoryDesign, MemorySystem
from memsteer_dspy.memory.answer import ANSWER_PROGRAM_VERSION
from memsteer_dspy.memory.lookup import RecordLookup
from memsteer_dspy.optimize.defaults import build_call_limit, resolve_defaults
from memsteer_dspy.optimize.loop import MemSteerOpt, OptimizeConfig, OptimizeResult, progress_line
from memsteer_dspy.optimize.objectives import Objective
from memsteer_dspy.optimize.search import HistoryEvaluator
from memsteer_dspy.optimize.splits import split_official
from memsteer_dspy.records import History, QAItem, Record
from memsteer_dspy.runfolder import (  # write_atomic: re-exported for the studies
    sigterm_raises,
    write_atomic,
)
from memsteer_dspy.tracking import Tracker, resolve_tracking_uri

PRESETS = ("tiny", "small", "cpu", "full")
STATE_EVERY_SECONDS = 600  # --state: how often a running study copies its paid work
Setting = Literal["without", "with"]
#: Column labels of the two RHELM settings (paper, Table 2).
SETTING_LABELS = {"without": "w/o", "with": "w/"}
#: RHELM question types and the paper's column abbreviations (Table 8).
QUESTION_TYPES = {
    "fact": "FC",
    "temporal": "TP",
    "aggregation": "AG",
    "hallucination": "HL",
    "misleading": "MI",
    "attachment": "EX",
    "mixed": "MX",
}
ALL_PERSONAS = (
    "David_R._Ellis David_Reyes Dr._Alastair_McEwan Dr._Elena_Markovic Dr._Elias_Romero"
    " Dr._Marcus_Ellison Elena_Morales Jonas_Richter Justice_Arvind_Prakash_Mehra Martin_Keller"
).split()
PERSONA_SEP = "/"


# --------------------------------------------------------------------------------------------
# the config and its presets
# --------------------------------------------------------------------------------------------


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DatasetConfig(_Table):
    """Which RHELM data a study runs on."""

    rhelm_root: Path | None = Field(
        None,
        description="The RHELM folder (default: $MEMSTEER_RHELM_ROOT or ../shared/benchmarks/rhelm).",
    )
    personas: list[str] | None = Field(
        None, description="Personas of the study (None: all ten). Several share one design."
    )
    settings: list[Setting] = Field(
        default_factory=lambda: ["without", "with"],
        description="main.py: RHELM without / with external sources (the other studies use 'with').",
    )
    eval_items: int | None = Field(
        None, ge=1, description="Official test items per persona, stratified by type (None: all)."
    )
    test_on: Literal["all", "unused"] = Field(
        "all",
        description="'all': the official items (eval_items per persona), training items "
        "included as in the paper; 'unused': the items the Official-QA split (40/20, "
        "seed) leaves out, answered on a stratified sample (accuracy_items, not eval_items); "
        "main.py also scores retrieval on every item.",
    )
    accuracy_items: int | None = Field(
        None, ge=1, description="test_on='unused': how many unused items are answered (None: all)."
    )
    seed: int = 0


class Budgets(_Table):
    """How much supervision, optimization and context a study spends."""

    supervision: int = Field(79, ge=2, description="Generated QA items wanted per persona.")
    max_candidates: int | None = Field(
        None, ge=1, description="Candidates tried per persona at most (None: 5 x supervision)."
    )
    train_fraction: float = Field(
        0.665, gt=0, lt=1, description="Generated items that go to training (the rest validate)."
    )
    official_train: int | None = Field(
        None,
        ge=1,
        description="Cap on Official-QA training items per persona (None: the 40% split).",
    )
    official_val: int | None = Field(
        None,
        ge=1,
        description="Cap on Official-QA validation items per persona (None: the 20% split).",
    )
    iterations: int = Field(20, ge=0, description="MemSteer-Opt iterations (the paper runs 20).")
    context_tokens: int = Field(
        4000, ge=64, description="The fixed context budget of every design (cl100k tokens)."
    )
    # The next three are None (False) by default: memsteer_dspy.optimize.defaults resolves them by
    # where the LMs run, as `memsteer optimize` does.
    feedback_tokens: int | None = Field(
        None,
        ge=200,
        description="Token budget of the proposer's feedback "
        "(None: 1,200 for an in-process proposer, else the paper's 3,000).",
    )
    objective: Objective | None = Field(
        None,
        description="MemSteer-Opt's objective (None: by the LMs, recall when the answerer runs "
        "in-process, which cannot carry accuracy, else the paper's accuracy).",
    )
    paper: bool = Field(
        False,
        description="MemSteer-Opt's options left unset take the paper's setting whatever LMs run "
        "(otherwise an in-process proposer gets the small-proposer setting).",
    )
    max_resamples: int = Field(
        3,
        ge=0,
        description="Re-samples of a duplicate design proposal (each is one proposer call).",
    )
    quality_items: int = Field(
        50, ge=1, description="Items the QA-quality judge scores per folder."
    )
    bundle_profile: Literal["auto", "small", "full"] = Field(
        "auto",
        description="Bundles for the generator: small (a 1.5B LM), full, or auto by planner LM.",
    )
    batch_size: int = Field(
        8, ge=1, description="Generation candidates run stage by stage together."
    )
    threads: int = Field(1, ge=1, description="Items (and candidates) run concurrently (API LMs).")


class MainStudy(_Table):
    """main.py: the supervision sources compared (Table 2)."""

    sources: list[Literal["official", "memsteer"]] = Field(
        default_factory=lambda: ["official", "memsteer"]
    )


class AblationStudy(_Table):
    """supervision_ablation.py: generation methods and checks (Tables 4 and 5)."""

    methods: list[Literal["naive", "direct", "joint", "memsteer", "ragas"]] = Field(
        default_factory=lambda: ["naive", "direct", "joint", "memsteer"],
        description='"ragas": Ragas-QA testset generation (the [ragas] extra) on the same seed '
        "records, with and without MemSteer's audit and blind read.",
    )
    steering: bool = Field(
        True,
        description="Score the LM-free design panel on each condition's items and the official "
        "QA (Kendall tau per persona: does the supervision rank designs as official QA does?).",
    )
    steering_panel: str | None = Field(
        None, description="A design-panel JSON for the steering stage (default: the package's)."
    )
    checks: list[bool] = Field(default_factory=lambda: [False, True])
    downstream: bool = Field(True, description="Optimize with each supervision and evaluate it.")


class FeedbackStudy(_Table):
    """feedback_ablation.py: the feedback modes (Figure 3)."""

    modes: list[Literal["random30", "random30+gold", "random30+diagnosis", "stratified"]] = Field(
        default_factory=lambda: ["random30", "random30+gold", "random30+diagnosis", "stratified"]
    )


class TransferStudy(_Table):
    """transfer.py: the six-user shared design and personal continuation (Table 3, Table 9a)."""

    source_train: list[str] = Field(
        default_factory=lambda: [
            "Jonas_Richter",
            "David_Reyes",
            "Dr._Elias_Romero",
            "Justice_Arvind_Prakash_Mehra",
        ]
    )
    source_val: list[str] = Field(default_factory=lambda: ["Elena_Morales", "Dr._Elena_Markovic"])
    held_out: list[str] = Field(
        default_factory=lambda: ["Dr._Alastair_McEwan", "Dr._Marcus_Ellison"],
        description="Evaluated with the frozen design only (Table 9a).",
    )
    targets: list[str] = Field(
        default_factory=lambda: ["Martin_Keller", "David_R._Ellis"],
        description="Held out, then continued with their own generated supervision (Table 3).",
    )
    source_supervision: Literal["memsteer", "official"] = "memsteer"
    target_supervision: int | None = Field(
        400,
        ge=2,
        description="Generated items per continuation target (None: budgets.supervision).",
    )


class BudgetStudy(_Table):
    """budget.py: training-question budgets (Figure 4)."""

    sizes: list[int] = Field(default_factory=lambda: [100, 200, 300, 400, 500])


class OptimizersStudy(_Table):
    """existing_optimizers.py: the supervision handed to DSPy's optimizers."""

    optimizers: list[Literal["gepa", "mipro"]] = Field(default_factory=lambda: ["gepa", "mipro"])
    sources: list[Literal["official", "memsteer"]] = Field(
        default_factory=lambda: ["official", "memsteer"]
    )
    auto: Literal["light", "medium", "heavy"] | None = "light"
    max_metric_calls: int | None = Field(None, ge=1, description="GEPA's budget instead of auto.")


PRESET_VALUES: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {
        "dataset": {"personas": ["Elena_Morales"], "eval_items": 6},
        "budgets": {
            "supervision": 4,
            "max_candidates": 8,
            "train_fraction": 0.6,
            "official_train": 3,
            "official_val": 2,
            "iterations": 1,
            "context_tokens": 800,
            "quality_items": 4,
            "bundle_profile": "small",
            "batch_size": 4,
        },
        "transfer": {
            "source_train": ["Elena_Morales"],
            "source_val": ["Jonas_Richter"],
            "held_out": [],
            "targets": ["Dr._Elena_Markovic"],
            "target_supervision": 4,
        },
        "budget": {"sizes": [2, 3]},
        "existing_optimizers": {"auto": None, "max_metric_calls": 12},
        # the package's steering panel has dense designs: a MiniLM index of the history
        "supervision_ablation": {"steering": False},
    },
    "small": {
        "dataset": {"personas": ["Elena_Morales"], "eval_items": 8},
        "budgets": {
            "supervision": 4,
            "max_candidates": 24,
            "train_fraction": 0.6,
            "official_train": 2,
            "official_val": 2,
            "iterations": 1,
            "context_tokens": 1000,
            "quality_items": 4,
            "bundle_profile": "small",
            "batch_size": 4,
            "max_resamples": 1,
        },
        "transfer": {
            "source_train": ["Elena_Morales"],
            "source_val": ["Elena_Morales"],
            "held_out": [],
            "targets": ["Jonas_Richter"],
            "target_supervision": 4,
        },
        "budget": {"sizes": [2, 3]},
        "existing_optimizers": {"optimizers": ["gepa"], "auto": None, "max_metric_calls": 12},
    },
    "cpu": {
        "dataset": {
            "personas": None,
            "settings": ["with"],
            "eval_items": None,
            "test_on": "unused",
            "accuracy_items": 150,
        },
        "budgets": {
            "supervision": 40,
            "max_candidates": 300,
            "train_fraction": 2 / 3,
            "iterations": 15,
            "context_tokens": 2000,
            "threads": 1,
        },
    },
    "full": {
        "dataset": {"personas": None, "eval_items": None},
        "budgets": {
            "supervision": 79,
            "train_fraction": 0.665,
            "iterations": 20,
            "context_tokens": 4000,
            "quality_items": 50,
            "threads": 8,
        },
    },
}

STUDY_TABLES = {
    "dataset": DatasetConfig,
    "budgets": Budgets,
    "main": MainStudy,
    "supervision_ablation": AblationStudy,
    "feedback_ablation": FeedbackStudy,
    "transfer": TransferStudy,
    "budget": BudgetStudy,
    "existing_optimizers": OptimizersStudy,
}


class ExperimentConfig(BaseModel):
    """A study's whole configuration: the preset, the config file its LMs come from, and every
    table (dataset, budgets, per-study options) after the file's values override the preset's."""

    model_config = ConfigDict(extra="forbid")

    preset: Literal["tiny", "small", "cpu", "full"] = "small"
    config_file: Path | None = None
    lm: str | None = Field(None, description="--lm: one LM for every role (overrides the file).")
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    budgets: Budgets = Field(default_factory=Budgets)
    main: MainStudy = Field(default_factory=MainStudy)
    supervision_ablation: AblationStudy = Field(default_factory=AblationStudy)
    feedback_ablation: FeedbackStudy = Field(default_factory=FeedbackStudy)
    transfer: TransferStudy = Field(default_factory=TransferStudy)
    budget: BudgetStudy = Field(default_factory=BudgetStudy)
    existing_optimizers: OptimizersStudy = Field(default_factory=OptimizersStudy)

    def rhelm_root(self) -> Path:
        from memsteer_dspy.loaders.rhelm import default_rhelm_root

        root = self.dataset.rhelm_root or default_rhelm_root()
        if root is None:
            raise InputError(
                "no RHELM data found",
                field="dataset.rhelm_root",
                hint="set rhelm_root under [dataset] in the config, or MEMSTEER_RHELM_ROOT, to the "
                "folder holding RHELM's data/ (a copy of github.com/microsoft/RHELM)",
            )
        return Path(root)

    def personas(self) -> list[str]:
        if self.dataset.personas:
            return list(self.dataset.personas)
        from memsteer_dspy.loaders.rhelm import list_personas

        return list_personas(self.rhelm_root())


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def load_config(
    path: str | Path | None,
    preset: str = "small",
    *,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    lm: str | None = None,
) -> ExperimentConfig:
    """Read a study config: the preset's values, then the TOML file's tables, then ``overrides``
    (e.g. ``{"dataset": {"personas": [...]}}`` from command-line flags).

    The file's ``[lm]`` table is read by :func:`memsteer_dspy.lm.load_lm_config` (role → LM); the
    other tables are ``[dataset]``, ``[budgets]`` and one per study (``[main]``,
    ``[supervision_ablation]``, ``[feedback_ablation]``, ``[transfer]``, ``[budget]``,
    ``[existing_optimizers]``). A relative ``rhelm_root`` is relative to the file.
    """
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    values: dict[str, Any] = {k: dict(v) for k, v in PRESET_VALUES[preset].items()}
    file = Path(path).expanduser() if path is not None else None
    if file is not None:
        if not file.is_file():
            raise ConfigError(
                f"{file}: config file not found (pass --config PATH to a TOML file; "
                "see experiments/configs/)"
            )
        try:
            data = tomllib.loads(file.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{file}: not valid TOML: {exc}") from None
        unknown = sorted(set(data) - set(STUDY_TABLES) - {"lm"})
        if unknown:
            raise ConfigError(
                f"{file}: unknown table(s) [{'], ['.join(unknown)}]; a study config has [lm] and "
                f"[{'], ['.join(STUDY_TABLES)}]"
            )
        for name in STUDY_TABLES:
            table = data.get(name, {})
            if not isinstance(table, Mapping):
                raise ConfigError(f"{file}: [{name}] must be a table")
            table = dict(table)
            if name == "dataset" and table.get("rhelm_root"):
                root = Path(str(table["rhelm_root"])).expanduser()
                table["rhelm_root"] = root if root.is_absolute() else (file.parent / root).resolve()
            values[name] = _merge(values.get(name, {}), table)
    for name, table in (overrides or {}).items():
        values[name] = _merge(
            values.get(name, {}), {k: v for k, v in table.items() if v is not None}
        )
    try:
        return ExperimentConfig(preset=preset, config_file=file, lm=lm, **values)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ConfigError(
            f"{file or 'preset ' + preset}: {where}: {err['msg']} (each table's keys are listed in "
            "experiments/README.md)"
        ) from None


# --------------------------------------------------------------------------------------------
# data helpers
# --------------------------------------------------------------------------------------------


def base_design(context_tokens: int) -> MemoryDesign:
    """The paper's Base-BM25 with the study's fixed context budget."""
    d = MemoryDesign.base_bm25()
    return d.model_copy(
        update={"context": d.context.model_copy(update={"budget_tokens": context_tokens})}
    )


def select_eval_items(items: Sequence[QAItem], n: int | None, seed: int) -> list[QAItem]:
    """The official test items of one persona: all of them, or ``n`` drawn round-robin over the
    question types (seeded), so every type is represented. Kept in the source order."""
    if n is None or n >= len(items):
        return list(items)
    groups: dict[str, list[QAItem]] = {}
    for q in sorted(items, key=lambda q: q.id):
        groups.setdefault(q.question_type or "unknown", []).append(q)
    rng = random.Random(f"eval-items:{seed}")
    for key in sorted(groups):
        rng.shuffle(groups[key])
    chosen: set[str] = set()
    while len(chosen) < n:
        for key in sorted(groups):
            if groups[key] and len(chosen) < n:
                chosen.add(groups[key].pop().id)
    return [q for q in items if q.id in chosen]


def with_persona(items: Iterable[QAItem], persona: str) -> list[QAItem]:
    """The items with ``metadata["persona"]`` set (generated items do not carry it)."""
    return [q.model_copy(update={"metadata": {**q.metadata, "persona": persona}}) for q in items]


def persona_of(item: QAItem) -> str:
    persona = item.metadata.get("persona")
    if not persona:
        raise InputError(
            "a QA item of a shared optimization has no persona",
            record=item.id,
            field="metadata.persona",
            hint="tag items with with_persona(items, persona)",
        )
    return str(persona)


def add_rhelm_args(ap: argparse.ArgumentParser) -> None:
    """``--rhelm-root`` and ``--cache-dir``, as the RHELM-only scripts take them."""
    ap.add_argument("--rhelm-root", type=Path, default=None)
    ap.add_argument("--cache-dir", type=Path, default=None)


def resolve_rhelm_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> Path:
    """The RHELM root (an argparse error naming the fix when there is none); fills in the
    default index cache folder."""
    from memsteer_dspy.loaders.rhelm import default_rhelm_root

    root = args.rhelm_root or default_rhelm_root()
    if root is None:
        ap.error("no RHELM data: pass --rhelm-root or set MEMSTEER_RHELM_ROOT")
    if args.cache_dir is None:
        from memsteer_dspy.cli.evaluate import default_cache_dir

        args.cache_dir = default_cache_dir()
    return root


def official_split(
    items: Sequence[QAItem], budgets: Budgets, seed: int
) -> tuple[list[QAItem], list[QAItem]]:
    """The Official-QA reference: 40% train / 20% validation per persona (Appendix A.3), capped
    per persona by ``budgets.official_train`` / ``official_val`` (small presets match the sizes of
    the generated supervision)."""
    train, val = split_official(list(items), seed=seed)
    out_t: list[QAItem] = []
    out_v: list[QAItem] = []
    for persona in sorted({persona_of(q) for q in [*train, *val]}):
        t = [q for q in train if persona_of(q) == persona]
        v = [q for q in val if persona_of(q) == persona]
        out_t += t[: budgets.official_train] if budgets.official_train else t
        out_v += v[: budgets.official_val] if budgets.official_val else v
    return out_t, out_v


def unused_items(items: Sequence[QAItem], budgets: Budgets, seed: int) -> list[QAItem]:
    """The persona-tagged official ``items`` that neither Official-QA's training nor its
    validation split uses (:func:`official_split`, same budgets and seed): the only official items
    no optimization selected on. In the items' order."""
    train, val = official_split(items, budgets, seed)
    used = {(persona_of(q), q.id) for q in [*train, *val]}
    return [q for q in items if (persona_of(q), q.id) not in used]


def _shares(sizes: Mapping[str, int], n: int) -> dict[str, int]:
    """``n`` split over groups in proportion to their sizes (largest remainders, ties by name)."""
    total = sum(sizes.values())
    exact = {k: n * v / total for k, v in sizes.items()}
    out = {k: math.floor(x) for k, x in exact.items()}
    for k in sorted(exact, key=lambda k: (out[k] - exact[k], k))[: n - sum(out.values())]:
        out[k] += 1
    return out


def accuracy_sample(items: Sequence[QAItem], n: int | None, seed: int) -> list[QAItem]:
    """``n`` of the persona-tagged ``items`` (all when ``n`` is None or not smaller), stratified:
    each question type gets its proportional share, and within a type each persona its own;
    drawn seeded, so every row is answered on the same items. In the items' order."""
    if n is None or n >= len(items):
        return list(items)
    strata: dict[str, dict[str, list[QAItem]]] = {}
    for q in sorted(items, key=lambda q: (persona_of(q), q.id)):
        strata.setdefault(q.question_type or "unknown", {}).setdefault(persona_of(q), []).append(q)
    rng = random.Random(f"accuracy-sample:{seed}")
    per_type = _shares({t: sum(map(len, g.values())) for t, g in strata.items()}, n)
    chosen: set[tuple[str, str]] = set()
    for t in sorted(strata):
        for p, k in sorted(_shares({p: len(g) for p, g in strata[t].items()}, per_type[t]).items()):
            chosen.update((p, q.id) for q in rng.sample(strata[t][p], k))
    return [q for q in items if (persona_of(q), q.id) in chosen]


def metric_name(text: str) -> str:
    """A name MLflow accepts for a metric (``random30+gold.accuracy`` → ``random30_gold.accuracy``)."""
    return "".join(c if c.isalnum() or c in "_-. :/" else "_" for c in text)


def safe_name(text: str) -> str:
    """A persona or label as a folder name."""
    return "".join(c if c.isalnum() or c in "._-+" else "_" for c in text)


# --------------------------------------------------------------------------------------------
# one design shared by several personas
# --------------------------------------------------------------------------------------------


def prefixed_history(persona: str, history: History) -> History:
    """``history`` with every record id (and reference, thread id) prefixed ``<persona>/``, so
    several personas' records can live in one pooled history without id clashes."""
    p = f"{persona}{PERSONA_SEP}"
    records = []
    for r in history.records:
        data = r.model_dump()
        data.update(
            id=p + r.id,
            references=[p + x for x in r.references],
            thread_id=p + r.thread_id if r.thread_id else None,
        )
        records.append(Record.model_validate(data))
    return History(f"{persona}", records, source=history.source)


class PersonaPool:
    """Several personas as one pooled history (ids prefixed ``<persona>/``) plus each persona's
    own prefixed history, and QA items mapped onto the prefixed ids."""

    def __init__(self, histories: Mapping[str, History]):
        if not histories:
            raise InputError("a shared design needs at least one persona", field="personas")
        self.parts = {p: prefixed_history(p, h) for p, h in sorted(histories.items())}
        self.history = History(
            "shared:" + "+".join(self.parts), [r for h in self.parts.values() for r in h.records]
        )

    def item(self, item: QAItem) -> QAItem:
        persona = persona_of(item)
        if persona not in self.parts:
            raise InputError(
                f"QA item of persona {persona!r}, which is not in the pool",
                record=item.id,
                hint=f"the pool holds {', '.join(self.parts)}",
            )
        p = f"{persona}{PERSONA_SEP}"
        return item.model_copy(
            update={
                "id": p + item.id,
                "evidence_ids": [p + x for x in item.evidence_ids],
                "span_ids": [p + x for x in item.span_ids],
                "metadata": {**item.metadata, "persona": persona},
            }
        )

    def items(self, items: Iterable[QAItem]) -> list[QAItem]:
        return [self.item(q) for q in items]


class PooledSystem:
    """What failure diagnosis needs of a memory system (history, design, record lookup), over the
    per-persona systems of one shared design; a record id's prefix says whose memory to ask."""

    def __init__(
        self, history: History, design: MemoryDesign, system_of: Callable[[str], MemorySystem]
    ):
        self.user_history = history
        self.design = design
        self._system_of = system_of

    def lookup(self, record_id: str, **kwargs: Any) -> RecordLookup:
        persona = record_id.split(PERSONA_SEP, 1)[0]
        if PERSONA_SEP not in record_id or record_id not in self.user_history:
            return RecordLookup(
                record_id=record_id, in_history=False, stored=False, retrievable=False
            )
        return self._system_of(persona).lookup(record_id, **kwargs)


def pooled_summary(
    items: list[ItemResult], metrics: str, design: MemoryDesign, user: str, fingerprint: str | None
) -> EvaluationSummary:
    """Means over the pooled items of several personas (the paper pools evaluation questions)."""
    by_type: dict[str, list[ItemResult]] = {}
    for r in items:
        by_type.setdefault(r.question_type or "unknown", []).append(r)
    return EvaluationSummary(
        **summarize_items(items, metrics).model_dump(),
        design_key=design.key(),
        design_name=design.name,
        metrics=metrics,
        protocol="as_of",
        user=user,
        history_fingerprint=fingerprint,
        by_type={t: summarize_items(rs, metrics) for t, rs in sorted(by_type.items())},
    )


class SharedEvaluator(HistoryEvaluator):
    """The MemSteer-Opt evaluator of one design shared by several personas (the paper's ten-user
    and six-user settings): a candidate is built over each persona's own history and scored on the
    pooled questions, each answered from its persona's memory; training failures are diagnosed
    against the memory of the persona they belong to (:class:`PooledSystem`). Everything else —
    feedback, proposals, the accept rule, search, resumption, MLflow — is MemSteer-Opt's own.

    Per-persona evaluation folders sit inside MemSteer-Opt's (``val/<persona>/items.jsonl``), with
    the pooled ``val/items.jsonl`` beside them.
    """

    def __init__(self, pool: PersonaPool, **kwargs: Any):
        super().__init__(pool.history, **kwargs)
        self.pool = pool
        self._persona_systems: dict[tuple[str, str, bool], MemorySystem] = {}

    def persona_system(self, design: MemoryDesign, persona: str) -> MemorySystem:
        key = (design.key(), persona, self.answering)
        if key not in self._persona_systems:
            lms = (
                {"answerer": self.lm("answerer")}
                if design.lm_uses(answering=self.answering)
                else {}
            )
            self._persona_systems[key] = MemorySystem.from_design(
                design,
                self.pool.parts[persona],
                cache_dir=self.cache_dir,
                lms=lms,
                threads=self.threads,
            )
            designs = list(dict.fromkeys(k[0] for k in self._persona_systems))
            for old in designs[:-2]:  # keep the current design's and one candidate's systems
                for k in [k for k in self._persona_systems if k[0] == old]:
                    del self._persona_systems[k]
        return self._persona_systems[key]

    def evaluate(self, design: MemoryDesign, items: list[QAItem], metrics: str, folder: Path):
        judge = self.lm("judge") if metrics == "all" else None
        groups: dict[str, list[QAItem]] = {}
        for q in items:
            groups.setdefault(persona_of(q), []).append(q)
        results: dict[str, ItemResult] = {}
        for persona, group in groups.items():
            system = self.persona_system(design, persona)
            how = {"protocol": self.protocol, "threads": self.threads}
            out_dir = Path(folder) / safe_name(persona)
            rep = evaluate_design(
                system, group, metrics=metrics, judge_lm=judge, out_dir=out_dir, **how
            )
            results.update({r.qa_id: r for r in rep.items})
        ordered = [results[q.id] for q in items]
        write_atomic(
            Path(folder) / "items.jsonl", "".join(r.model_dump_json() + "\n" for r in ordered)
        )
        history = self.pool.history
        summary = pooled_summary(ordered, metrics, design, history.user_id, history.fingerprint)
        system = PooledSystem(history, design, lambda p: self.persona_system(design, p))
        return system, EvaluationReport(summary=summary, items=ordered)


def shared_optimizer(
    histories: Mapping[str, History],
    train: list[QAItem],
    val: list[QAItem],
    out_dir: str | Path,
    *,
    test: list[QAItem] | None = None,
    **kwargs: Any,
) -> MemSteerOpt:
    """MemSteer-Opt with one design shared by several personas: the plain loop with a
    :class:`SharedEvaluator` (QA items are mapped onto the pooled, prefixed record ids)."""
    pool = PersonaPool(histories)
    opt = MemSteerOpt(
        pool.history,
        pool.items(train),
        pool.items(val),
        out_dir,
        test=pool.items(test or []),
        **kwargs,
    )
    c = opt.config
    opt.evaluator = SharedEvaluator(
        pool,
        lm=opt.lm,
        protocol=c.protocol,
        threads=c.threads,
        cache_dir=opt.cache_dir,
        answering=c.objective != "recall",
    )
    return opt


# --------------------------------------------------------------------------------------------
# outputs
# --------------------------------------------------------------------------------------------


def pct(v: float | None, digits: int = 1) -> str:
    """A fraction as a percentage (``–`` where not measured)."""
    return "–" if v is None else f"{100 * v:.{digits}f}"


def with_delta(v: float | None, base: float | None) -> str:
    """``26.4 ↑4.1`` — a percentage and its point change from ``base`` (the paper's arrows)."""
    if v is None:
        return "–"
    if base is None:
        return pct(v)
    d = 100 * (v - base)
    arrow = "↑" if d >= 0.05 else ("↓" if d <= -0.05 else "±")
    return f"{pct(v)} {arrow}{abs(d):.1f}"


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, left: int = 1) -> str:
    """A Markdown table; the first ``left`` columns are left-aligned, the rest right-aligned."""
    out = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" if i < left else "---:" for i in range(len(headers))) + "|",
    ]
    for row in rows:
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |")
    return "\n".join(out)


@dataclass
class Stage:
    """Cost of one stage of a study: LM calls and tokens (all roles) and wall time."""

    name: str
    calls: int = 0
    tokens: int = 0
    seconds: float = 0.0
    error: str | None = None

    def row(self) -> list[Any]:
        return [self.name, self.calls, f"{self.tokens:,}", f"{self.seconds:.0f}", self.error or ""]


def _ragas_usage(folder: Path) -> dict[str, int]:
    """The LM calls and tokens a Ragas run folder has booked so far (its ``usage.json``)."""
    path = folder / "usage.json"
    got = json.loads(path.read_text()) if path.is_file() else {}
    return {k: int(got.get(k, 0)) for k in ("lm_calls", "prompt_tokens", "completion_tokens")}


@dataclass
class Generated:
    """Supervision generated for one persona (or pooled): items and the run's summary."""

    train: list[QAItem]
    val: list[QAItem]
    summary: dict[str, Any] = field(default_factory=dict)
    folders: list[Path] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# the study runner
# --------------------------------------------------------------------------------------------


class StudyOptions(TypedDict, total=False):
    """The keyword options of :class:`Study`, which each study's ``run`` passes on to it."""

    lm_config: Any
    tracking: bool
    progress: bool
    state: Path | None


class Study:
    """One study's run: its LMs, data, stages, MLflow run and outputs (see the module docstring).

    ``lm_config`` replaces the LMs the config file names (tests pass scripted LMs through
    :meth:`memsteer_dspy.lm.LMConfig.set_lm`).
    """

    def __init__(
        self,
        name: str,
        cfg: ExperimentConfig,
        out: str | Path,
        *,
        lm_config: Any = None,
        tracking: bool = True,
        progress: bool = True,
        state: Path | None = None,
    ):
        from memsteer_dspy.lm import load_lm_config

        self.name = name
        self.cfg = cfg
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.lm = lm_config if lm_config is not None else load_lm_config(cfg.config_file, lm=cfg.lm)
        self.progress = progress
        self.state = state  # --state: saved after every checkpoint (experiments/_state.py)
        self._state_lock = threading.Lock()
        self._keeper: threading.Thread | None = None  # keep_state's thread
        self._stop_keeping = threading.Event()
        self.cache_dir = self.out / "cache"
        self.tracker = (
            Tracker(resolve_tracking_uri(self.out), f"memsteer-experiments/{name}")
            if tracking
            else Tracker.disabled()
        )
        self.stages: list[Stage] = []
        self.outside_calls = 0  # LM calls made by packages on their own clients (book_outside)
        self.outside_tokens = 0
        self.rows: list[dict[str, Any]] = []
        self._loaded: dict[tuple[str, bool], Loaded] = {}
        self._samples: dict[tuple[tuple[str, ...], bool], list[QAItem]] = {}
        self.started = time.perf_counter()
        self.run_id: str | None = None
        #: Called after every stage (scripts rewrite results.md with what is finished so far).
        self.on_stage: Callable[[], None] | None = None
        self._open_run()

    # -- run bookkeeping -------------------------------------------------------------------------
    def _open_run(self) -> None:
        path = self.out / "run.json"
        state: dict[str, Any] = {}
        if path.exists():
            try:
                state = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError:
                state = {}
        config = self.cfg.model_dump(mode="json")
        if state.get("config") and state["config"] != config:
            self.log(
                f"note: {path} was written with another config; the stages that changed start "
                "afresh, the others resume"
            )
        self.run_id = self.tracker.start_run(
            self.name,
            resume_run_id=state.get("mlflow_run_id"),
            tags={
                "memsteer.kind": "experiment",
                "memsteer.study": self.name,
                "memsteer.preset": self.cfg.preset,
            },
        )
        self.tracker.log_params(
            self.run_id,
            {
                "preset": self.cfg.preset,
                "lm": self.lm.describe(),
                "dataset": self.cfg.dataset.model_dump(mode="json"),
                "budgets": self.cfg.budgets.model_dump(mode="json"),
            },
        )
        state.update(
            study=self.name,
            config=config,
            lm=self.lm.describe(),
            mlflow_run_id=self.run_id,
            tracking_uri=self.tracker.uri if self.tracker.active else None,
        )
        state.setdefault("sessions", []).append(
            {"started": datetime.now(UTC).isoformat(timespec="seconds"), "wall_seconds": None}
        )
        self._state = state
        write_atomic(path, json.dumps(state, indent=2, ensure_ascii=False) + "\n")

    def log(self, message: str) -> None:
        line = f"[{datetime.now().strftime('%H:%M:%S')}] {self.name}: {message}"
        print(line, file=sys.stderr, flush=True)
        with open(self.out / "log.txt", "a", encoding="utf-8") as f:
            f.write(line + "\n")

    def _usage(self) -> tuple[int, int]:
        usage = self.lm.usage_by_role()
        return (
            sum(int(u.get("calls", 0)) for u in usage.values()) + self.outside_calls,
            sum(int(u.get("total_tokens", 0)) for u in usage.values()) + self.outside_tokens,
        )

    def book_outside(self, calls: int, tokens: int) -> None:
        """LM calls a package made outside the study's LMs (Ragas through its own client), booked
        to the stage that runs them."""
        self.outside_calls += int(calls)
        self.outside_tokens += int(tokens)

    @contextmanager
    def stage(self, name: str, *, fatal: bool = False) -> Iterator[Stage]:
        """Time a stage and book its LM calls and tokens. Unless ``fatal``, a stage that fails
        is recorded with its error (the traceback goes to ``log.txt``) and the study goes on;
        Ctrl-C always stops the study (rerun to resume)."""
        st = Stage(name)
        c0, t0 = self._usage()
        start = time.perf_counter()
        self.log(f"{name} ...")
        try:
            yield st
        except Exception as exc:  # one failed stage is recorded; the study goes on
            first = (str(exc).splitlines() or [""])[0]
            st.error = f"{type(exc).__name__}: {first[:300]}"
            self.log(f"{name} failed: {st.error}")
            with open(self.out / "log.txt", "a", encoding="utf-8") as f:
                f.write(traceback.format_exc())
            if fatal:
                raise
        except BaseException:  # Ctrl-C or SIGTERM: not "done"; the rerun resumes the stage
            st.error = "interrupted"
            self.log(f"{name} interrupted (rerun the same command to resume)")
            raise
        finally:
            c1, t1 = self._usage()
            st.calls, st.tokens = c1 - c0, t1 - t0
            st.seconds = round(time.perf_counter() - start, 1)
            self.stages.append(st)
            if self.on_stage is not None:
                try:
                    self.on_stage()
                except (
                    Exception
                ) as exc:  # a partial table that cannot be drawn yet waits for the next stage
                    self.log(f"(results.md not updated yet: {type(exc).__name__}: {exc})")
            if st.error is None:
                self.log(
                    f"{name} done ({st.calls} LM calls, {st.tokens:,} tokens, {st.seconds:.0f}s)"
                )

    # -- data ----------------------------------------------------------------------------------
    def load(self, persona: str, external: bool = True) -> Loaded:
        """One RHELM persona (``external=False``: conversations only), loaded once per study."""
        from memsteer_dspy.loaders.rhelm import load_rhelm

        key = (persona, external)
        if key not in self._loaded:
            self._loaded[key] = load_rhelm(self.cfg.rhelm_root(), persona, external=external)
        return self._loaded[key]

    def official(self, personas: Sequence[str], external: bool = True) -> list[QAItem]:
        """Every official QA item of ``personas``, tagged with its persona."""
        return [q for p in personas for q in with_persona(self.load(p, external).qa_items, p)]

    def accuracy_items(self, personas: Sequence[str], external: bool = True) -> list[QAItem]:
        """``test_on = "unused"``: the items every row is answered on — :func:`accuracy_sample`
        of the :func:`unused_items` of ``personas`` (persona-tagged; drawn once per study)."""
        key = (tuple(sorted(personas)), external)
        if key not in self._samples:
            d = self.cfg.dataset
            unused = unused_items(self.official(key[0], external), self.cfg.budgets, d.seed)
            self._samples[key] = accuracy_sample(unused, d.accuracy_items, d.seed)
        return self._samples[key]

    def test_items(
        self, persona: str, external: bool = True, personas: Sequence[str] | None = None
    ) -> list[QAItem]:
        """The persona's official QA items answered in this study: all or ``eval_items`` of them
        (``test_on = "all"``), or its share of the :meth:`accuracy_items` of ``personas`` (default
        the study's) under ``test_on = "unused"``."""
        loaded = self.load(persona, external)
        d = self.cfg.dataset
        if d.test_on == "unused":
            sample = self.accuracy_items(personas or self.cfg.personas(), external)
            ids = {q.id for q in sample if persona_of(q) == persona}
            return [q for q in loaded.qa_items if q.id in ids]
        return select_eval_items(loaded.qa_items, d.eval_items, d.seed)

    def eval_folder(
        self,
        setting: str,
        persona: str,
        design: MemoryDesign,
        items: Sequence[QAItem],
        metrics: str = "all",
    ) -> Path:
        """Where ``design``'s evaluation of ``items`` is kept: one folder per persona, design (its
        key holds the context budget), item set, metrics and the LMs that score them, so a rerun
        under other settings starts a new folder and never reuses these results. Answering under
        ``test_on = "all"`` keeps the earlier layout (``<design key>/``), whose evaluation key
        refuses other LMs and fewer items."""
        base = self.out / "eval" / setting / safe_name(persona)
        if metrics == "all" and self.cfg.dataset.test_on == "all":
            return base / design.key()
        roles = ["answerer", "judge"] if metrics == "all" else []
        if design.lm_uses(answering=False):
            roles = sorted({*roles, "answerer"})
        lms = {
            r: {k: v for k, v in self.lm.provenance()[r].items() if k != "source"} for r in roles
        }
        what = {"items": [q.id for q in items], "lms": lms}
        if metrics == "all":
            what["answer_program"] = ANSWER_PROGRAM_VERSION
        tag = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()
        return base / f"{design.key()}-{metrics}-{tag[:12]}"

    def base_design(self) -> MemoryDesign:
        return base_design(self.cfg.budgets.context_tokens)

    # -- stages --------------------------------------------------------------------------------
    def evaluate(
        self, design: MemoryDesign, history: History, items: list[QAItem], folder: Path
    ) -> EvaluationReport:
        """Answer and judge ``items`` under ``design`` (RHELM's as-of protocol); per-item results
        with traces in ``folder/items.jsonl`` (a rerun resumes)."""
        system = MemorySystem.from_design(
            design,
            history,
            cache_dir=self.cache_dir,
            lms={"answerer": self.lm.lm("answerer")},
            threads=self.cfg.budgets.threads,
        )
        return evaluate_design(
            system,
            items,
            metrics="all",
            judge_lm=self.lm.lm("judge"),
            protocol="as_of",
            threads=self.cfg.budgets.threads,
            out_dir=folder,
        )

    def test(
        self,
        design: MemoryDesign,
        personas: Sequence[str],
        *,
        external: bool = True,
        condition: str,
        setting: str = "with",
        rows: bool = True,
    ) -> dict[str, EvaluationReport]:
        """Answer and judge ``design`` on each persona's test items (:meth:`test_items`), from that
        persona's own history. Each (persona, design, items) is evaluated once per study
        (:meth:`eval_folder`), whichever condition asks; with ``rows``, rows go to ``items.jsonl``
        under ``condition``. A persona with no test item is left out."""
        reports = {}
        for persona in personas:
            items = self.test_items(persona, external, personas)
            if not items:
                continue
            rep = self.evaluate(
                design,
                self.load(persona, external).history,
                items,
                self.eval_folder(setting, persona, design, items),
            )
            reports[persona] = rep
            if rows:
                self.add_rows(rep.items, condition, setting, persona, design)
        return reports

    def add_rows(
        self,
        items: Iterable[ItemResult],
        condition: str,
        setting: str,
        persona: str,
        design: MemoryDesign,
        *,
        extra: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """One row of the per-item table for each evaluated item (``extra``: qa id -> more
        fields of its row)."""
        for r in items:
            self.rows.append(
                {
                    "study": self.name,
                    "condition": condition,
                    "setting": setting,
                    "persona": persona,
                    "design_key": design.key(),
                    "qa_id": r.qa_id,
                    "question_type": r.question_type,
                    "correct": r.correct,
                    "qs": r.qs,
                    "recall_at_10": r.recall_at_10,
                    "delivered_recall": r.delivered_recall,
                    "prediction": r.prediction,
                    "reference": r.reference,
                    "error": r.error,
                    **(extra or {}).get(r.qa_id, {}),
                }
            )

    def generation_config(
        self,
        history: History,
        *,
        method: str = "memsteer",
        checks: bool = True,
        n: int | None = None,
    ) -> Any:
        """The :class:`GenerationConfig` of :meth:`generate` for ``history`` (what ``memsteer
        generate`` runs for this study's LM and budgets)."""
        from memsteer_dspy.bundles import BundleConfig, small_lm_bundle_config
        from memsteer_dspy.supervision.program import GENERATION_ROLES
        from memsteer_dspy.supervision.run import GenerationConfig, small_lm_default_config

        b = self.cfg.budgets
        profile = b.bundle_profile
        if profile == "auto":
            profile = (
                "small" if self.lm.spec("planner").backend in ("local", "llamacpp") else "full"
            )
        n = n or b.supervision
        max_candidates = ceil_div(b.max_candidates * n, b.supervision) if b.max_candidates else None
        fields = {
            "n": n,
            "max_candidates": max_candidates,
            "seed": self.cfg.dataset.seed,
            "threads": b.threads,
            "batch_size": b.batch_size,
            "train_fraction": b.train_fraction,
            # length limits in the output schemas for in-process LMs, as `memsteer generate` sets
            "bounded": self.lm.in_process(*GENERATION_ROLES),
        }
        if profile == "small" and fields["bounded"] and method == "memsteer" and checks:
            # the pipeline `memsteer generate` and `memsteer demo` run on a small in-process LM
            return small_lm_default_config(history, **fields)
        bundle = small_lm_bundle_config() if profile == "small" else BundleConfig()
        return GenerationConfig(**fields, method=method, checks=checks, bundle=bundle)

    def generate(
        self,
        folder: Path,
        persona: str,
        *,
        external: bool = True,
        method: str = "memsteer",
        checks: bool = True,
        n: int | None = None,
    ) -> Generated:
        """Generate QA–evidence supervision from one persona's history into ``folder`` (as
        ``memsteer generate`` does; a rerun resumes). Items are tagged with the persona."""
        from memsteer_dspy.supervision.program import GENERATION_ROLES
        from memsteer_dspy.supervision.run import SupervisionSet, generate_supervision

        history = self.load(persona, external).history
        config = self.generation_config(history, method=method, checks=checks, n=n)
        lms = {role: self.lm.lm(role) for role in GENERATION_ROLES}
        summary = generate_supervision(
            history, lms, folder, config, lm_description=self.lm.describe(), progress=self.progress
        )
        sup = SupervisionSet.load(folder)
        return Generated(
            with_persona(sup.train, persona), with_persona(sup.val, persona), summary, [folder]
        )

    def generate_ragas(
        self, folder: Path, persona: str, *, checks: bool = True, external: bool = True
    ) -> Generated:
        """Ragas-QA (the ``[ragas]`` extra) on the seed records a MemSteer run of this study
        draws for ``persona`` (as many samples as it has candidates), then MemSteer's audit and
        blind read on its items (``checks``) — :func:`memsteer_dspy.systems.ragas_testset.ragas_items`
        into ``ragas/<persona>`` beside the conditions' folders (one run for both rows) and
        :func:`memsteer_dspy.supervision.external.check_external` into ``folder``. Ragas's LLM is
        the planner's: a server LM at its URL, the embedded model served by llama.cpp for the run."""
        from memsteer_dspy.bundles import sample_seeds
        from memsteer_dspy.lm.serve import llm_endpoint
        from memsteer_dspy.memory.embedders import load_embedder
        from memsteer_dspy.supervision.external import ExternalItem, check_external
        from memsteer_dspy.supervision.run import SupervisionSet
        from memsteer_dspy.systems.embed_server import EmbeddingServer
        from memsteer_dspy.systems.ragas_testset import ragas_items

        history = self.load(persona, external).history
        config = self.generation_config(history, method="memsteer", checks=True)
        seed = self.cfg.dataset.seed
        seeds = sample_seeds(
            history, config.candidate_limit, random.Random(f"seeds:{seed}"), config.bundle
        )
        records = list(dict.fromkeys(seeds))
        shared = folder.parent.parent / "ragas" / safe_name(persona)
        spec = self.lm.spec("planner")
        with contextlib.ExitStack() as stack:
            if not spec.in_process and not spec.api_base and spec.provider != "openai":
                raise ConfigError(
                    f"Ragas's LLM is the planner's, {spec.model}: Ragas calls it through an "
                    "OpenAI client, so it needs an OpenAI-compatible endpoint (openai/<name> "
                    "with an api_base, or OpenAI's own)"
                )
            endpoint = llm_endpoint(
                stack,
                shared.parent / "llm-server",
                api_base=None if spec.in_process else spec.api_base or "https://api.openai.com/v1",
                model=spec.model.split("/", 1)[-1],
                n_ctx=8192,
            )
            endpoint["lm_name"] = self.lm.describe()["planner"] if spec.in_process else spec.model
            if not spec.in_process and not spec.api_base:
                endpoint["api_key"] = os.environ.get("OPENAI_API_KEY", "")
            embed = stack.enter_context(EmbeddingServer(load_embedder("minilm")))
            before = _ragas_usage(shared)
            items, ragas_summary = ragas_items(
                history,
                records,
                shared,
                n=len(seeds),
                embed_api_base=embed.api_base,
                seed=seed,
                log=self.log,
                **endpoint,
            )
            after = _ragas_usage(shared)
            self.book_outside(
                after["lm_calls"] - before["lm_calls"],
                sum(after[k] - before[k] for k in ("prompt_tokens", "completion_tokens")),
            )
        external_items = [
            ExternalItem(it.id, it.question, it.answer, tuple(it.evidence_ids), it.synthesizer)
            for it in items
        ]
        summary = check_external(
            history,
            external_items,
            {r: self.lm.lm(r) for r in ("auditor", "blind_reader")},
            folder,
            method="ragas",
            checks=checks,
            seed=seed,
            train_fraction=self.cfg.budgets.train_fraction,
            bounded=self.lm.in_process("auditor", "blind_reader"),
            progress=bool(self.progress),
        )
        tokens = dict(summary.get("tokens_by_role") or {})
        tokens["ragas"] = {
            "calls": ragas_summary.get("lm_calls", 0),
            "prompt_tokens": ragas_summary.get("prompt_tokens", 0),
            "completion_tokens": ragas_summary.get("completion_tokens", 0),
        }
        summary.update(tokens_by_role=tokens, ragas=ragas_summary)
        sup = SupervisionSet.load(folder)
        return Generated(
            with_persona(sup.train, persona), with_persona(sup.val, persona), summary, [folder]
        )

    def optimize(
        self,
        folder: Path,
        histories: Mapping[str, History],
        train: list[QAItem],
        val: list[QAItem],
        *,
        init_design: MemoryDesign | None = None,
        feedback: str = "stratified",
        label: str = "",
    ) -> OptimizeResult:
        """MemSteer-Opt from ``init_design`` (default Base-BM25) on ``train``/``val``: over one
        persona's history, or with one design shared by several (:func:`shared_optimizer`).
        The optimization's MLflow run is nested under the study's."""
        b = self.cfg.budgets
        resolved = resolve_defaults(
            {"objective": b.objective, "feedback_tokens": b.feedback_tokens},
            proposer_in_process=self.lm.in_process("proposer"),
            answerer_in_process=self.lm.in_process("answerer"),
            paper=b.paper,
        )
        config = OptimizeConfig(
            iterations=b.iterations,
            feedback=feedback,
            seed=self.cfg.dataset.seed,
            protocol="as_of",
            threads=b.threads,
            max_resamples=b.max_resamples,
            # as `memsteer optimize` does: no LM-built store (facts) with an in-process LM
            max_build_calls=build_call_limit(
                None, answerer_in_process=self.lm.in_process("answerer")
            ),
            resolved=resolved.line(),
            **resolved.values,
        )
        self.log(f"  optimize {label or folder.name}: {resolved.line()}")
        kwargs = dict(
            config=config,
            lms=self.lm.lm,
            init_design=init_design or self.base_design(),
            tracker=self.tracker,
            cache_dir=self.cache_dir,
            usage=self.lm.usage_by_role,
            run_params={"study": self.name, "condition": label, "lm": self.lm.describe()},
            on_event=lambda e: self.log(f"  optimize {label or folder.name}: {progress_line(e)}"),
        )
        if len(histories) == 1:
            ((_, history),) = histories.items()
            opt: MemSteerOpt = MemSteerOpt(history, train, val, folder, **kwargs)
        else:
            opt = shared_optimizer(histories, train, val, folder, **kwargs)
        result = opt.run()
        if result.parent_run_id and self.run_id:
            self.tracker.set_tags(
                result.parent_run_id,
                {"mlflow.parentRunId": self.run_id, "memsteer.condition": label},
            )
        return result

    # -- finishing -----------------------------------------------------------------------------
    def header(self, title: str, extra: Sequence[str] = ()) -> list[str]:
        """The head of ``results.md``: what ran, on what, with which LMs and sizes."""
        c, b = self.cfg, self.cfg.budgets
        roles = ", ".join(f"{r}: `{m}`" for r, m in self.lm.describe().items())
        tested = f"{c.dataset.eval_items or 'all official'} per persona"
        if c.dataset.test_on == "unused":
            tested = (
                "the official items the Official-QA split leaves out (R@10 and delivered recall on "
                f"every one), answered on a stratified sample of {c.dataset.accuracy_items or 'all'}"
            )
        return [
            f"# {title}",
            "",
            f"- preset `{c.preset}`"
            + (f", config `{c.config_file}`" if c.config_file else "")
            + f", seed {c.dataset.seed}; written {datetime.now(UTC).isoformat(timespec='seconds')}",
            f"- LMs: {roles}",
            f"- test items: {tested}; context budget {b.context_tokens} "
            f"tokens; MemSteer-Opt iterations {b.iterations}; generated supervision {b.supervision} items per persona "
            f"({round(100 * b.train_fraction)}% train)",
            *extra,
            "",
        ]

    def checkpoint(self, markdown: str, results: Mapping[str, Any]) -> None:
        """Rewrite ``results.md`` and ``results.json`` with the stages finished so far (marked
        partial), so a long study can be read while it runs."""
        note = "> Partial: the study is still running; these tables hold the stages finished so far.\n\n"
        write_atomic(self.out / "results.md", note + markdown.rstrip() + "\n")
        payload = {
            "study": self.name,
            "preset": self.cfg.preset,
            "partial": True,
            **results,
            "stages": [s.__dict__ for s in self.stages],
        }
        write_atomic(
            self.out / "results.json",
            json.dumps(payload, indent=2, ensure_ascii=False, default=str) + "\n",
        )
        self.save_state()

    def save_state(self) -> None:
        """Copy the LM-paid files to the ``--state`` folder now (no-op without one); a failed
        copy is logged, never fatal: the output folder is intact."""
        if self.state is None:
            return
        with self._state_lock:
            try:
                _state.save_state(
                    self.out, self.state, study=self.name, config=_state.settings_of(self.cfg)
                )
            except (OSError, MemsteerError) as exc:
                self.log(f"(state not saved to {self.state}: {exc})")

    def keep_state(self, every_seconds: float = STATE_EVERY_SECONDS) -> None:
        """Save the state every ``every_seconds`` from a daemon thread while a long stage runs (a
        machine taken away mid-stage loses at most that much; a torn last log line is repaired
        on resume)."""
        if self.state is None or self._keeper is not None:
            return

        def loop() -> None:
            while not self._stop_keeping.wait(every_seconds):
                self.save_state()

        self._keeper = threading.Thread(target=loop, name="study-state", daemon=True)
        self._keeper.start()

    def finish(
        self, markdown: str, results: Mapping[str, Any], metrics: Mapping[str, float | None]
    ) -> Path:
        """Write ``results.md`` (with a cost table and where the MLflow runs are), ``results.json``
        and ``items.jsonl``; log the metrics and artifacts to the study's MLflow run."""
        wall = time.perf_counter() - self.started
        calls, tokens = self._usage()
        self._state["sessions"][-1]["wall_seconds"] = round(wall, 1)
        write_atomic(
            self.out / "run.json", json.dumps(self._state, indent=2, ensure_ascii=False) + "\n"
        )
        sessions = [
            x["wall_seconds"] for x in self._state["sessions"] if x.get("wall_seconds") is not None
        ]
        cost = md_table(
            ["stage", "LM calls", "tokens", "s", "error"], [s.row() for s in self.stages]
        )
        tail = [
            "",
            "## Cost",
            "",
            cost,
            "",
            f"Total this session: {calls} LM calls, {tokens:,} tokens, {wall:.0f}s wall time "
            "(stages resumed from disk cost nothing)"
            + (
                f"; {len(sessions)} sessions, {sum(sessions):.0f}s wall time in all."
                if len(sessions) > 1
                else "."
            ),
        ]
        if self.tracker.active:
            tail += [
                "",
                f"MLflow: `{self.tracker.ui_command()}` (experiment `memsteer-experiments/{self.name}`).",
            ]
        text = markdown.rstrip() + "\n" + "\n".join(tail) + "\n"
        write_atomic(self.out / "results.md", text)
        payload = {
            "study": self.name,
            "preset": self.cfg.preset,
            "lm": self.lm.describe(),
            **results,
            "stages": [s.__dict__ for s in self.stages],
            "wall_seconds": round(wall, 1),
            "lm_usage": self.lm.usage_by_role(),
        }
        write_atomic(
            self.out / "results.json",
            json.dumps(payload, indent=2, ensure_ascii=False, default=str) + "\n",
        )
        write_atomic(
            self.out / "items.jsonl",
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self.rows),
        )
        clean = {metric_name(k): v for k, v in metrics.items()}
        self.tracker.log_metrics(
            self.run_id, {**clean, "wall_seconds": wall, "lm_calls": calls, "lm_tokens": tokens}
        )
        for name in ("results.md", "results.json", "items.jsonl"):
            self.tracker.log_artifact(self.run_id, self.out / name)
        self.tracker.end_run(self.run_id)
        self.log(f"wrote {self.out / 'results.md'} ({wall:.0f}s)")
        return self.out / "results.md"


def summary_of(reports: Mapping[str, EvaluationReport]) -> MetricSummary:
    """Pooled means over the reports of several personas."""
    return summarize_items([r for rep in reports.values() for r in rep.items], "all")


def by_type_of(reports: Mapping[str, EvaluationReport]) -> dict[str, MetricSummary]:
    groups: dict[str, list[ItemResult]] = {}
    for rep in reports.values():
        for r in rep.items:
            groups.setdefault(r.question_type or "unknown", []).append(r)
    return {t: summarize_items(rs, "all") for t, rs in groups.items()}


def _scores(s: MetricSummary) -> dict[str, Any]:
    return {
        "n": s.n,
        "accuracy": s.accuracy,
        "qs": s.qs,
        "recall_at_10": s.recall_at_10,
        "delivered_recall": s.delivered_recall,
        "errors": s.errors,
    }


def report_dict(reports: Mapping[str, EvaluationReport]) -> dict[str, Any]:
    """A condition's test results: pooled scores, by question type and per persona."""
    return {
        **_scores(summary_of(reports)),
        "by_type": {t: _scores(s) for t, s in sorted(by_type_of(reports).items())},
        "per_persona": {p: _scores(rep.summary) for p, rep in reports.items()},
    }


def optimization_dict(result: OptimizeResult, n_train: int, n_val: int) -> dict[str, Any]:
    """What a results table says about one MemSteer-Opt run."""
    from memsteer_dspy.optimize.proposer import design_diff

    d0 = MemoryDesign.from_dict(result.entries[0].design)
    # a recall-objective run answers nothing: its validation score is delivered recall
    metric = "accuracy" if result.baseline_score.accuracy is not None else "delivered_recall"
    return {
        "n_train": n_train,
        "n_val": n_val,
        "iterations": len(result.entries) - 1,
        "val_metric": metric,
        "accepted_path": result.accepted_path,
        "val_initial": getattr(result.baseline_score, metric),
        "val_best": getattr(result.best_score, metric),
        "best_design_key": result.best_design.key(),
        "changes": design_diff(d0, result.best_design),
        "out_dir": result.out_dir,
        "statuses": [e.status for e in result.entries[1:]],
    }


def optimization_lines(label: str, opt: Mapping[str, Any]) -> list[str]:
    """One bullet per optimization: sizes, validation score, accepted path, final changes."""
    changes = "; ".join(opt["changes"]) or "none (the initial design stayed best)"
    metric = opt.get("val_metric", "accuracy").replace("_", " ")
    return [
        f"- **{label}**: {opt['n_train']} train / {opt['n_val']} val items; validation {metric} "
        f"{pct(opt['val_initial'])} → {pct(opt['val_best'])} over {opt['iterations']} iteration(s) "
        f"({', '.join(opt['statuses']) or 'none'}); best design `{opt['best_design_key']}`: {changes}"
    ]


# --------------------------------------------------------------------------------------------
# the command line every script shares
# --------------------------------------------------------------------------------------------


def parse_args(
    study: str, doc: str | None, argv: Sequence[str] | None = None
) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=f"python experiments/{study}.py",
        description=(doc or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="See experiments/README.md.",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="TOML file: [lm] role -> LM (as memsteer.example.toml), [dataset], [budgets], "
        "study tables. Examples in experiments/configs/. Default: $MEMSTEER_CONFIG or "
        "./memsteer.toml for the LMs, the preset for the rest.",
    )
    parser.add_argument(
        "--preset",
        choices=PRESETS,
        default="small",
        help="tiny (tests), small (embedded LM, one persona, ~30 min on 2 cores), cpu (main.py's "
        "Table 2 on the embedded LM, ten personas, resumable over sessions: see experiments/README.md), "
        "full (paper sizes).",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"Output folder (default experiments/runs/{study}-<preset>).",
    )
    parser.add_argument(
        "--persona", action="append", default=None, help="Persona(s) of the study (repeatable)."
    )
    parser.add_argument(
        "--lm", default=None, help="One LM for every role (overrides the config file)."
    )
    parser.add_argument("--rhelm-root", type=Path, default=None, help="The RHELM folder.")
    parser.add_argument(
        "--no-tracking", action="store_true", help="Write local files only; no MLflow."
    )
    parser.add_argument(
        "--state",
        type=Path,
        default=None,
        help="Keep a copy of what cost LM time (generation, optimization and evaluation folders) "
        "in this folder, small enough to commit, and restore it into --out before starting: a "
        "study carries on from another machine (see experiments/README.md).",
    )
    return parser.parse_args(argv)


def cli(
    study: str, doc: str | None, run: Callable[..., Path], argv: Sequence[str] | None = None
) -> int:
    """Parse the shared flags, run the study, print where the results are. Bad input or config
    exits with status 2 and a message saying what to fix."""
    args = parse_args(study, doc, argv)
    try:
        cfg = load_config(
            args.config,
            args.preset,
            lm=args.lm,
            overrides={"dataset": {"personas": args.persona, "rhelm_root": args.rhelm_root}},
        )
        out = args.out or Path(__file__).resolve().parent / "runs" / f"{study}-{args.preset}"
        settings = _state.settings_of(cfg)
        if args.state is not None:
            restored = _state.restore_state(args.state, out, study=study, config=settings)
            _state.say("restored from", restored, args.state)
        try:  # SIGTERM stops the study as Ctrl-C does: the state is saved below
            with sigterm_raises(lambda signum: KeyboardInterrupt(f"signal {signum}")):
                path = run(cfg, out, tracking=not args.no_tracking, state=args.state)
        finally:
            if args.state is not None and out.exists():
                saved = _state.save_state(out, args.state, study=study, config=settings)
                _state.say("saved to", saved, args.state)
    except MemsteerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    print(path.read_text(encoding="utf-8"))
    return 0


def ceil_div(a: int, b: float) -> int:
    return int(math.ceil(a / b))
