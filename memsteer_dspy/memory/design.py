"""A memory design d = (store, retrieve, context), plus the optional answer-verification step.

This is the design space of the paper's Section 3.3 as data: a person writes it as JSON, the
design proposer (a later stage) reads :meth:`MemoryDesign.model_json_schema` and writes a revised
one, and :class:`~memsteer_dspy.memory.system.MemorySystem` builds a working memory system from it.

* **store** — how the history is organised into memory units and which fields are indexed;
* **retrieve** — index (BM25 / dense / hybrid), query strategy, candidate pool, rerank, top-k,
  time filter and neighbour expansion;
* **context** — ordering, the (fixed) token budget, per-unit formatting, de-duplication;
* **answer** — the answerer and its prompt are fixed across designs; only an optional
  answer-verification step belongs to the design.

:meth:`MemoryDesign.base_bm25` is the paper's starting system (Base-BM25).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from memsteer_dspy.errors import InputError

# The answer-context budget is held fixed across designs (paper, Section 3.3).
DEFAULT_CONTEXT_BUDGET = 4000
# The default embedder for dense retrieval: packaged with its weights, loaded by path, offline.
DEFAULT_EMBEDDER = "minilm"
BUILTIN_EMBEDDERS = ("minilm", "wordllama")

MemoryUnitKind = Literal["record", "window", "thread", "section", "facts"]
IndexedField = Literal["text", "author", "date", "subject", "kind", "thread_title"]
IndexKind = Literal["bm25", "dense", "hybrid"]
QueryStrategy = Literal["raw", "rewrite", "decompose", "hyde", "multi_query"]
RerankKind = Literal["none", "cross_encoder", "llm"]
ContextOrder = Literal["rank", "chronological", "thread"]


_SCALARS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _scalar_type(annotation: Any) -> type | None:
    """``int``/``float``/``bool``/``str`` for a field annotated with one (optionally ``| None``)."""
    if annotation in _SCALARS:
        return annotation
    args = [a for a in get_args(annotation) if a is not type(None)]
    return args[0] if len(args) == 1 and args[0] in _SCALARS else None


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _strict_scalars(cls, value: Any, info: ValidationInfo) -> Any:
        """No silent coercion in a design: ``true`` is not the integer 1, ``"10"`` is not a
        number, ``1`` is not ``true`` (an integer is accepted where a number is expected)."""
        kind = _scalar_type(cls.model_fields[info.field_name].annotation)
        if kind is None or value is None:
            return value
        ok = (
            isinstance(value, bool)
            if kind is bool
            else isinstance(value, str)
            if kind is str
            else isinstance(value, int) and not isinstance(value, bool)
            if kind is int
            else isinstance(value, int | float) and not isinstance(value, bool)
        )
        if not ok:
            raise ValueError(f"expected {_SCALARS[kind]}, got {type(value).__name__} {value!r}")
        return value


def _digest(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# store
# --------------------------------------------------------------------------------------------


class StoreSpec(_Spec):
    """How the user's records are organised into memory units and what of them is indexed."""

    unit: MemoryUnitKind = Field(
        "record",
        description=(
            "The memory unit. 'record': one unit per history record (a conversation turn, an email, "
            "a document section). 'window': window_size consecutive records of one thread, moving "
            "by window_stride. 'thread': one unit per whole thread/session/document. 'section': "
            "each record cut at headings and paragraph breaks into pieces of at most "
            "section_max_tokens tokens. 'facts': short facts an LM extracts from the records, each "
            "keeping its source record ids (costs LM calls when the memory is built)."
        ),
    )
    window_size: int = Field(3, ge=1, le=64, description="unit='window': records per window.")
    window_stride: int = Field(
        2,
        ge=1,
        le=64,
        description="unit='window': records the window moves by; must be <= window_size so no record is skipped.",
    )
    section_max_tokens: int = Field(
        256, ge=32, le=8192, description="unit='section': the most tokens in one section piece."
    )
    facts_batch: int = Field(
        4,
        ge=1,
        le=32,
        description="unit='facts': consecutive records of a thread given to the extractor in one LM call.",
    )
    max_facts_per_record: int = Field(
        6, ge=1, le=50, description="unit='facts': the most facts kept per source record."
    )
    fields: list[IndexedField] = Field(
        default_factory=lambda: ["text", "author", "date", "subject", "kind", "thread_title"],
        description=(
            "What goes into each unit's indexed text: the record text and metadata fields. "
            "'text' is required. Metadata does not change what the answerer sees (see context)."
        ),
    )
    date_format: Literal["iso", "long", "none"] = Field(
        "iso",
        description="How dates are written into the indexed text: 'iso' 2024-05-30, 'long' 'Thursday 30 May 2024', or not at all.",
    )

    @field_validator("fields", mode="after")
    @classmethod
    def _canonical_order(cls, fields: list[str]) -> list[str]:
        """The indexed fields are a set (the store reads them as one): keep them in the schema's
        order, so that a reordering is the same design, with the same key. Seen on the shared
        RHELM run: the embedded proposer wrote ``store.fields`` with ``text`` moved to the end,
        which was scored as a new design with identical results — one iteration spent on nothing.
        The default order is the schema's, so no existing design's key changes unless it was a
        reordering."""
        order = get_args(IndexedField)
        return sorted(fields, key=lambda f: order.index(f) if f in order else len(order))

    @model_validator(mode="after")
    def _check(self) -> StoreSpec:
        if "text" not in self.fields:
            raise ValueError(
                "store.fields must include 'text' (the record content); "
                f"allowed values: {', '.join(get_args(IndexedField))}"
            )
        if len(set(self.fields)) != len(self.fields):
            raise ValueError("store.fields lists a field twice")
        if self.unit == "window" and self.window_stride > self.window_size:
            raise ValueError(
                f"store.window_stride ({self.window_stride}) must be <= store.window_size "
                f"({self.window_size}); a larger stride skips records, which then are never stored"
            )
        return self

    def key_params(self) -> dict[str, Any]:
        """The parameters that change the stored units (the unit-specific ones only)."""
        params: dict[str, Any] = {
            "unit": self.unit,
            "fields": sorted(self.fields),
            "date_format": self.date_format,
        }
        if self.unit == "window":
            params.update(window_size=self.window_size, window_stride=self.window_stride)
        elif self.unit == "section":
            params["section_max_tokens"] = self.section_max_tokens
        elif self.unit == "facts":
            params.update(
                facts_batch=self.facts_batch, max_facts_per_record=self.max_facts_per_record
            )
        return params


# --------------------------------------------------------------------------------------------
# retrieve
# --------------------------------------------------------------------------------------------


class BM25Params(_Spec):
    """BM25 (bm25s) scoring and tokenization."""

    k1: float = Field(1.5, gt=0, le=5, description="Term-frequency saturation.")
    b: float = Field(0.75, ge=0, le=1, description="Length normalisation.")
    method: Literal["lucene", "robertson", "atire", "bm25l", "bm25+"] = Field(
        "lucene", description="BM25 variant."
    )
    stemmer: Literal["english", "none"] = Field(
        "english", description="Snowball stemming of tokens."
    )
    stopwords: Literal["english", "none"] = Field(
        "english", description="Remove English stopwords."
    )
    min_token_chars: int = Field(
        1, ge=1, le=3, description="Shortest token kept (1 keeps single digits such as '3')."
    )


class DenseParams(_Spec):
    """Dense retrieval: the embedding model and how it is run."""

    embedder: str = Field(
        DEFAULT_EMBEDDER,
        description=(
            "'minilm' (all-MiniLM-L6-v2, packaged, 384-d), 'wordllama' (static embeddings, no torch), "
            "or the path of a local model folder: a sentence-transformers model, or a FlagEmbedding "
            "model such as BGE-M3. Hub names are not downloaded."
        ),
    )
    backend: Literal["auto", "sentence_transformers", "flagembedding"] = Field(
        "auto",
        description="How a local model path is loaded; 'auto' reads the folder (BGE-M3 -> flagembedding).",
    )
    query_instruction: str = Field(
        "", description="Text put before each query when embedding it (some models expect one)."
    )
    max_chars: int = Field(
        4000,
        ge=64,
        le=100_000,
        description="Unit text is cut to this many characters before embedding.",
    )


class RetrieveSpec(_Spec):
    """How relevant memory units are found for a question."""

    index: IndexKind = Field(
        "bm25",
        description="'bm25' lexical, 'dense' embeddings, or 'hybrid': both fused by weighted reciprocal rank fusion.",
    )
    bm25: BM25Params = Field(default_factory=BM25Params)
    dense: DenseParams = Field(default_factory=DenseParams)
    bm25_weight: float = Field(
        1.0, ge=0, le=10, description="index='hybrid': weight of the BM25 ranking in RRF."
    )
    dense_weight: float = Field(
        1.0, ge=0, le=10, description="index='hybrid': weight of the dense ranking in RRF."
    )
    rrf_k: int = Field(
        60, ge=1, le=1000, description="Reciprocal rank fusion constant (hybrid and multi-query)."
    )
    query: QueryStrategy = Field(
        "raw",
        description=(
            "How the question becomes search queries: 'raw' the question itself; 'rewrite' an LM "
            "rewrites it into one keyword query; 'decompose' an LM splits it into n_queries "
            "sub-questions; 'hyde' an LM writes n_queries hypothetical records that would answer it; "
            "'multi_query' an LM writes n_queries paraphrases. Several queries are fused by RRF."
        ),
    )
    n_queries: int = Field(
        3, ge=1, le=8, description="Sub-questions / hypothetical records / paraphrases."
    )
    keep_original_query: bool = Field(
        True,
        description="Also search with the question itself when the query strategy is not 'raw'.",
    )
    pool: int = Field(
        50,
        ge=1,
        le=2000,
        description="Candidate units taken from the index per query before rerank.",
    )
    rerank: RerankKind = Field(
        "none",
        description=(
            "'none'; 'cross_encoder' a local FlagEmbedding reranker (reranker_model); 'llm' an LM "
            "orders the rerank_top best candidates listwise."
        ),
    )
    reranker_model: str | None = Field(
        None,
        description="rerank='cross_encoder': path of a local reranker model folder (e.g. bge-reranker-v2-m3).",
    )
    rerank_top: int = Field(
        20, ge=2, le=500, description="How many of the best candidates are reranked."
    )
    top_k: int = Field(
        20,
        ge=1,
        le=1000,
        description="Units passed on to the context builder (clamped to what exists).",
    )
    time_filter: bool = Field(
        True, description="Only records dated strictly before the question date can be retrieved."
    )
    expand_neighbors: int = Field(
        0,
        ge=0,
        le=5,
        description="Also deliver this many neighbouring units on each side of every hit in its thread (conversation turns, document sections).",
    )

    @model_validator(mode="after")
    def _check(self) -> RetrieveSpec:
        if self.pool < self.top_k:
            raise ValueError(
                f"retrieve.pool ({self.pool}) must be >= retrieve.top_k ({self.top_k}): the top-k "
                "units are chosen from the candidate pool"
            )
        if self.rerank == "cross_encoder" and not self.reranker_model:
            raise ValueError(
                "retrieve.reranker_model is required when retrieve.rerank is 'cross_encoder' "
                "(the path of a local reranker model folder); or choose rerank 'none' or 'llm'"
            )
        if self.index == "hybrid" and self.bm25_weight == 0 and self.dense_weight == 0:
            raise ValueError(
                "retrieve.bm25_weight and retrieve.dense_weight cannot both be 0 for index 'hybrid'"
            )
        if self.query == "raw" and not self.keep_original_query:
            raise ValueError(
                "retrieve.keep_original_query cannot be false when retrieve.query is 'raw'"
            )
        return self

    def index_params(self) -> dict[str, Any]:
        """The parameters that change the built index (those of the chosen index kind only)."""
        params: dict[str, Any] = {"index": self.index}
        if self.index in ("bm25", "hybrid"):
            params["bm25"] = self.bm25.model_dump()
        if self.index in ("dense", "hybrid"):
            params["dense"] = self.dense.model_dump()
        return params


# --------------------------------------------------------------------------------------------
# context and answer
# --------------------------------------------------------------------------------------------


class ContextSpec(_Spec):
    """How retrieved units are assembled into the answerer's context."""

    order: ContextOrder = Field(
        "rank",
        description="'rank' best first; 'chronological' oldest first; 'thread' grouped by thread (threads in rank order of their best unit, units in time order).",
    )
    budget_tokens: int = Field(
        DEFAULT_CONTEXT_BUDGET,
        ge=64,
        le=1_000_000,
        description="Token budget of the context (cl100k tokens). Held fixed across designs by default, as in the paper.",
    )
    show_ids: bool = Field(True, description="Write each record's id in its header.")
    show_dates: bool = Field(True, description="Write each record's date in its header.")
    show_author: bool = Field(True, description="Write each record's author/speaker in its header.")
    show_kind: bool = Field(
        False, description="Write each record's kind (conversation_turn, email, ...) in its header."
    )
    dedupe: bool = Field(
        True, description="Deliver each record's content once even when several units contain it."
    )
    truncate_last: bool = Field(
        True, description="Cut the last unit to fit the budget instead of dropping it."
    )


class AnswerSpec(_Spec):
    """The answerer and its prompt are fixed across designs; only verification is a design choice."""

    verify: bool = Field(
        False,
        description="After answering, an LM checks the draft answer against the context and may revise it.",
    )


# --------------------------------------------------------------------------------------------
# the design
# --------------------------------------------------------------------------------------------


class MemoryDesign(_Spec):
    """A memory design d = (store, retrieve, context) with the answer-verification option."""

    name: str = Field("design", description="A short label; not part of the design's identity.")
    store: StoreSpec = Field(default_factory=StoreSpec)
    retrieve: RetrieveSpec = Field(default_factory=RetrieveSpec)
    context: ContextSpec = Field(default_factory=ContextSpec)
    answer: AnswerSpec = Field(default_factory=AnswerSpec)

    @classmethod
    def base_bm25(cls) -> MemoryDesign:
        """The paper's Base-BM25: record units with source text and metadata indexed, the raw
        question as the BM25 query, ranked order within the fixed context budget."""
        return cls(name="base-bm25")

    # -- identity ---------------------------------------------------------------------------
    def key(self) -> str:
        """A stable hash of everything that changes the system's behaviour (not ``name``)."""
        return _digest(self.model_dump(mode="json", exclude={"name"}))

    def store_key(self) -> str:
        """Hash of the store parameters: designs that share it share the stored units."""
        return _digest(self.store.key_params())

    def index_key(self) -> str:
        """Hash of the store and index parameters: designs that change only retrieval strategy,
        rerank, top-k or context reuse the built index."""
        return _digest({"store": self.store.key_params(), "index": self.retrieve.index_params()})

    # -- what needs an LM -------------------------------------------------------------------
    def lm_uses(self, *, answering: bool = True) -> list[str]:
        """The design fields whose behaviour needs an LM (the answerer itself when ``answering``)."""
        uses = []
        if self.store.unit == "facts":
            uses.append("store.unit=facts")
        if self.retrieve.query != "raw":
            uses.append(f"retrieve.query={self.retrieve.query}")
        if self.retrieve.rerank == "llm":
            uses.append("retrieve.rerank=llm")
        if answering:
            uses.append("answer")
            if self.answer.verify:
                uses.append("answer.verify")
        return uses

    def inert_fields(self) -> set[str]:
        """Fields that change nothing under this design's switches: the window sizes unless
        ``store.unit`` is 'window', the dense model's settings of a BM25 index, the fusion weights
        outside 'hybrid', … A proposer that changes one wastes an iteration on an identical
        system (measured: 8 of 20 embedded proposals changed only such a field)."""
        store, r = self.store, self.retrieve
        inert: set[str] = set()
        if store.unit != "window":
            inert |= {"store.window_size", "store.window_stride"}
        if store.unit != "section":
            inert.add("store.section_max_tokens")
        if store.unit != "facts":
            inert |= {"store.facts_batch", "store.max_facts_per_record"}
        if r.index == "dense":
            inert |= {f"retrieve.bm25.{k}" for k in BM25Params.model_fields}
        if r.index == "bm25":
            inert |= {f"retrieve.dense.{k}" for k in DenseParams.model_fields}
        if r.index != "hybrid":
            inert |= {"retrieve.bm25_weight", "retrieve.dense_weight"}
            if r.query == "raw":
                inert.add("retrieve.rrf_k")
        if r.query not in ("decompose", "hyde", "multi_query"):
            inert.add("retrieve.n_queries")
        if r.query == "raw":
            inert.add("retrieve.keep_original_query")
        if r.rerank != "cross_encoder":
            inert.add("retrieve.reranker_model")
        if r.rerank == "none":
            inert.add("retrieve.rerank_top")
        return inert

    def retrieval_needs_lm(self) -> bool:
        return bool(self.lm_uses(answering=False))

    # -- (de)serialisation ------------------------------------------------------------------
    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    @classmethod
    def from_json(cls, text: str, *, source: str | Path | None = None) -> MemoryDesign:
        """Parse and validate a design; errors name the field at fault and its allowed values."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"not valid JSON: {exc.msg}",
                file=source,
                line=exc.lineno,
                hint="a design is one JSON object with the sections store, retrieve, context, answer",
            ) from None
        return cls.from_dict(data, source=source)

    @classmethod
    def from_dict(cls, data: Any, *, source: str | Path | None = None) -> MemoryDesign:
        if not isinstance(data, dict):
            raise InputError(
                f"a design must be a JSON object, got {type(data).__name__}", file=source
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise design_error(exc, source=source) from None

    @classmethod
    def load(cls, path: str | Path) -> MemoryDesign:
        path = Path(path)
        if not path.is_file():
            raise InputError(
                "design file not found",
                file=path,
                hint="pass --design base-bm25 or the path of a design JSON (see `MemoryDesign.base_bm25().to_json()`)",
            )
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(
                f"not UTF-8 text (byte {exc.start}: {exc.reason})",
                file=path,
                hint="a design is a UTF-8 JSON file; re-encode it (e.g. iconv -t utf-8)",
            ) from None
        return cls.from_json(text, source=path)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n", encoding="utf-8")


def _allowed_fields(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names allowed at ``loc`` (for 'extra field' errors)."""
    current: Any = model
    for part in loc[:-1]:
        fields = getattr(current, "model_fields", {})
        if part not in fields:
            return []
        current = fields[part].annotation
    return list(getattr(current, "model_fields", {}))


def design_error(exc: ValidationError, *, source: str | Path | None = None) -> InputError:
    """An :class:`InputError` for the first problem of a design's ValidationError."""
    first = exc.errors()[0]
    loc = tuple(first.get("loc", ()))
    field = ".".join(str(p) for p in loc) or None
    message = first.get("msg", str(exc)).removeprefix("Value error, ")
    hint = None
    ctx = first.get("ctx") or {}
    if first.get("type") == "literal_error" and "expected" in ctx:
        hint = f"allowed values for {field}: {ctx['expected']}"
    elif first.get("type") == "extra_forbidden":
        allowed = _allowed_fields(MemoryDesign, loc)
        message = f"unknown field {loc[-1]!r}"
        hint = f"allowed fields here: {', '.join(allowed)}" if allowed else None
    elif first.get("type") == "value_error":
        # a combination check: the message names its fields; point at the first one it names
        words = [w.strip("(),;:'") for w in message.split()]
        named = [w for w in words if "." in w and w.split(".")[0] in MemoryDesign.model_fields]
        field = named[0] if named else field
    if hint is None:
        hint = "see MemoryDesign.model_json_schema() for every field, its meaning and its allowed values"
    return InputError(f"invalid memory design: {message}", file=source, field=field, hint=hint)


def design_json_schema() -> dict[str, Any]:
    """The JSON schema of :class:`MemoryDesign` (what the design proposer reads)."""
    return MemoryDesign.model_json_schema()


def store_build_calls(design: MemoryDesign, n_records: int) -> int:
    """LM calls building ``design``'s store over ``n_records`` records takes: fact extraction is
    one call per ``facts_batch`` records; every other unit needs none."""
    if design.store.unit != "facts":
        return 0
    return -(-n_records // design.store.facts_batch)
