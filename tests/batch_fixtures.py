"""Fixtures for the batch tests: three small users cut from the demo history, and a scripted LM
that plays every role — installed in this process by monkeypatching, and in Ray worker processes
by :func:`install_scripted_lm` (Ray's ``worker_process_setup_hook``), since a monkeypatch in the
test process does not reach them.

The scripted engine is the demo test's :class:`DemoEngine` with a proposer that is a function of
the current design (so every process proposes the same revision for the same design) and an
optional fixed latency per call (``MEMSTEER_TEST_LM_LATENCY`` seconds)."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from test_demo import DemoEngine, scripted_config

from memsteer_dspy.demo_data import load_demo

USERS = ("ana", "ben", "cleo")
LATENCY_ENV = "MEMSTEER_TEST_LM_LATENCY"


def write_users(root: Path, users=USERS) -> Path:
    """One folder per user (``records.jsonl`` and ``qa.jsonl``): the demo's threads dealt out in
    turn, and the demo QA items whose evidence all lies in that user's records."""
    loaded = load_demo()
    threads = list(dict.fromkeys(r.thread_id or r.id for r in loaded.history.records))
    owner = {t: users[i % len(users)] for i, t in enumerate(threads)}
    for user in users:
        folder = root / user
        folder.mkdir(parents=True, exist_ok=True)
        recs = [r for r in loaded.history.records if owner[r.thread_id or r.id] == user]
        ids = {r.id for r in recs}
        (folder / "records.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in recs))
        qa = [q for q in loaded.qa_items if q.evidence_ids and set(q.evidence_ids) <= ids]
        (folder / "qa.jsonl").write_text("".join(q.to_json() + "\n" for q in qa))
    return root


class BatchEngine(DemoEngine):
    """DemoEngine whose proposer depends only on the design it is shown, with a fixed latency."""

    def __init__(self) -> None:
        super().__init__({}, [])
        self.latency = float(os.environ.get(LATENCY_ENV, "0") or 0)

    def complete(self, request):
        if self.latency:
            time.sleep(self.latency)
        return super().complete(request)

    def reply(self, system: str, user: str):
        if "`design_space`" in system:
            from memory_fixtures import field_value

            design = json.loads(field_value(user, "current_design"))
            retrieve = design.setdefault("retrieve", {})
            if not retrieve.get("expand_neighbors"):
                retrieve["expand_neighbors"] = 1
                change = "retrieve.expand_neighbors=1"
            else:
                retrieve["top_k"] = max(1, int(retrieve.get("top_k", 10)) - 2)
                retrieve["pool"] = max(
                    retrieve["top_k"], int(retrieve.get("pool", retrieve["top_k"]))
                )
                change = f"retrieve.top_k={retrieve['top_k']}"
            return "proposer", {"rationale": f"scripted: {change}", "design": design}
        return super().reply(system, user)

    def question(self, user: str) -> dict:
        """As the demo engine's, but naming words of the answer's own sentence, so no two
        candidates share a question (the demo's hint is empty when every record is evidence, and
        equal questions make the duplicate checks depend on the order candidates finish in)."""
        from memory_fixtures import field_value
        from test_demo import LABEL, WORD, _contains

        answer = field_value(user, "answer")
        texts = dict((label, text) for label, text in LABEL.findall(field_value(user, "records")))
        fact_labels = re.findall(r"R\d+\.\d+", field_value(user, "facts"))
        holder = next((t for t in texts.values() if _contains(t, answer)), "")
        # three words: a question quoting more of its sentence is re-written (own words)
        hint = [w for w in WORD.findall(holder) if not _contains(w, answer)][:3]
        question = f"Which word did I note beside '{' '.join(hint)}'?"
        sentences = [holder] + [texts[f] for f in fact_labels if f in texts and texts[f] != holder]
        self.planned[question] = (answer, sentences)
        return {"question": question}


def scripted_lm_config(*_args, **_kwargs):
    """A fresh LM configuration (and engine) per command, as ``load_lm_config`` gives one."""
    return scripted_config(BatchEngine())


def install_scripted_lm() -> None:
    """Ray's worker_process_setup_hook: every ``--lm``/``--config`` in this worker resolves to the
    scripted configuration, with DSPy's caches off."""
    import dspy

    import memsteer_dspy.lm as lm_pkg

    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    lm_pkg.load_lm_config = scripted_lm_config


def jsonl_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def item_keys(folder: Path) -> dict[str, list[tuple]]:
    """What a generate run decided, per output file: id (or candidate index), question, answer,
    rejection stage and reason."""
    return {
        name: [
            (
                r.get("id", r.get("index")),
                r.get("question"),
                r.get("answer"),
                r.get("stage"),
                r.get("reason"),
            )
            for r in jsonl_rows(folder / name)
        ]
        for name in ("train.jsonl", "val.jsonl", "rejected.jsonl")
    }
