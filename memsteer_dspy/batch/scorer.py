"""Scoring one shared memory design across many users (the paper's transfer setting), in parallel.

:class:`CrossUserScorer` is an evaluator: ``score(design, users)`` returns each user's per-item
results (:class:`~memsteer_dspy.evaluation.ItemResult`, each answered from that user's own memory),
and ``pooled(...)`` the means over all their items, as the shared-design optimization needs them.
Users are split over shards; a shard is a :class:`UserShard` — in this process (``local``, a thread
each) or a Ray actor (``ray``) — that loads its users' histories and QA items once and keeps the
memory systems it built (stores and indexes) for the designs it scored last, so a candidate that
changes only retrieval or context reuses the indexes in the worker that already holds them (and the
on-disk index cache, when ``cache_dir`` is given, across workers). LMs are configured inside each
shard from LM strings and a config path; keys come from the worker's environment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from memsteer_dspy.evaluation import ItemResult, MetricSummary, summarize_items


@dataclass(frozen=True)
class UserSource:
    """Where one user's history and QA items come from (what the CLI's history options name)."""

    format: str
    path: str | None
    user: str
    external: bool = True
    qa: str = "official"  # or the path of a QA JSONL file
    limit: int | None = None


class UserShard:
    """Some users' histories and items, loaded once, and their built memory systems."""

    def __init__(
        self,
        sources: Mapping[str, UserSource],
        *,
        metrics: str = "recall",
        protocol: str | None = None,
        cache_dir: str | None = None,
        lm_args: Mapping[str, Any] | None = None,
        threads: int = 1,
        keep_designs: int = 2,
    ) -> None:
        from memsteer_dspy.evaluation import read_qa_jsonl
        from memsteer_dspy.loaders import load_history

        self.metrics, self.cache_dir, self.threads, self.keep = (
            metrics,
            cache_dir,
            threads,
            keep_designs,
        )
        self.histories, self.items, self.protocols = {}, {}, {}
        for name, s in sources.items():
            loaded = load_history(s.format, s.path, user=s.user, external=s.external)
            items = list(loaded.qa_items) if s.qa == "official" else read_qa_jsonl(s.qa)
            self.histories[name] = loaded.history
            self.items[name] = items[: s.limit] if s.limit else items
            self.protocols[name] = protocol or ("as_of" if s.format == "rhelm" else "full")
        self._lm_args = dict(lm_args or {})
        self._lm_config = None
        self._systems: dict[tuple[str, str], Any] = {}
        self.builds = 0  # memory systems built (a test and a benchmark read it)

    def _lm(self, role: str):
        if self._lm_config is None:
            from memsteer_dspy.lm import load_lm_config

            self._lm_config = load_lm_config(
                self._lm_args.get("config"),
                lm=self._lm_args.get("lm"),
                role_lms=self._lm_args.get("role_lms") or {},
            )
        return self._lm_config.lm(role)

    def system(self, design, user: str):
        from memsteer_dspy.memory import MemorySystem

        key = (design.key(), user)
        if key not in self._systems:
            lms = (
                {"answerer": self._lm("answerer")}
                if design.lm_uses(answering=self.metrics == "all")
                else {}
            )
            self._systems[key] = MemorySystem.from_design(
                design,
                self.histories[user],
                cache_dir=self.cache_dir,
                lms=lms,
                threads=self.threads,
            )
            self.builds += 1
            designs = list(dict.fromkeys(k[0] for k in self._systems))
            for old in designs[: -self.keep]:
                for k in [k for k in self._systems if k[0] == old]:
                    del self._systems[k]
        return self._systems[key]

    def score(
        self, design_json: str, users: Sequence[str] | None = None
    ) -> dict[str, list[dict[str, Any]]]:
        from memsteer_dspy.evaluation import evaluate_design
        from memsteer_dspy.memory import MemoryDesign

        design = MemoryDesign.model_validate_json(design_json)
        judge = self._lm("judge") if self.metrics == "all" else None
        out = {}
        for user in users if users is not None else list(self.histories):
            report = evaluate_design(
                self.system(design, user),
                self.items[user],
                metrics=self.metrics,
                judge_lm=judge,
                protocol=self.protocols[user],
                threads=self.threads,
            )
            out[user] = [r.model_dump(mode="json", exclude={"trace"}) for r in report.items]
        return out

    def stats(self) -> dict[str, int]:
        return {"builds": self.builds, "cached_systems": len(self._systems)}


class CrossUserScorer:
    """Score designs across users on shards in parallel (see the module docstring)."""

    def __init__(
        self,
        sources: Mapping[str, UserSource],
        *,
        executor: str = "local",
        shards: int = 2,
        metrics: str = "recall",
        protocol: str | None = None,
        cache_dir: str | None = None,
        lm_args: Mapping[str, Any] | None = None,
        threads: int = 1,
        ray_address: str | None = None,
    ) -> None:
        names = list(sources)
        n = max(1, min(shards, len(names)))
        groups = [names[i::n] for i in range(n)]
        self.owner = {u: i for i, g in enumerate(groups) for u in g}
        kwargs = {
            "metrics": metrics,
            "protocol": protocol,
            "cache_dir": None if cache_dir is None else str(cache_dir),
            "lm_args": lm_args,
            "threads": threads,
        }
        self.executor = executor
        if executor == "ray":
            from memsteer_dspy.batch.executors import require_ray

            ray = require_ray()
            if not ray.is_initialized():
                ray.init(
                    address=ray_address,
                    log_to_driver=False,
                    namespace="memsteer",
                    configure_logging=False,
                )
            actor = ray.remote(UserShard).options(num_cpus=1)
            self.shards = [actor.remote({u: sources[u] for u in g}, **kwargs) for g in groups]
        elif executor == "local":
            self.shards = [UserShard({u: sources[u] for u in g}, **kwargs) for g in groups]
            self._pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="memsteer-score")
        else:
            raise ValueError(f"unknown executor {executor!r}; choose 'local' or 'ray'")

    def score(self, design, users: Sequence[str] | None = None) -> dict[str, list[ItemResult]]:
        """``user → per-item results`` of ``design`` (every user when ``users`` is None)."""
        wanted = list(self.owner) if users is None else list(users)
        unknown = [u for u in wanted if u not in self.owner]
        if unknown:
            raise KeyError(f"users not in this scorer: {', '.join(unknown)}")
        by_shard: dict[int, list[str]] = {}
        for u in wanted:
            by_shard.setdefault(self.owner[u], []).append(u)
        text = design.to_json()
        if self.executor == "ray":
            import ray

            parts = ray.get([self.shards[i].score.remote(text, us) for i, us in by_shard.items()])
        else:
            parts = list(
                self._pool.map(lambda kv: self.shards[kv[0]].score(text, kv[1]), by_shard.items())
            )
        merged = {u: rows for part in parts for u, rows in part.items()}
        return {u: [ItemResult.model_validate(r) for r in merged[u]] for u in wanted}

    @staticmethod
    def pooled(scores: Mapping[str, list[ItemResult]], metrics: str = "recall") -> MetricSummary:
        """Means over every user's items together (the paper pools evaluation questions)."""
        return summarize_items([r for rows in scores.values() for r in rows], metrics)

    def stats(self) -> list[dict[str, int]]:
        if self.executor == "ray":
            import ray

            return ray.get([s.stats.remote() for s in self.shards])
        return [s.stats() for s in self.shards]

    def close(self) -> None:
        if self.executor == "ray":
            import ray

            for s in self.shards:
                ray.kill(s)
        else:
            self._pool.shutdown()
