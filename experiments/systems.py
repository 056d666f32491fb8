"""The systems a user would pick instead, side by side on the same RHELM items (issue #49).

Rows: Base-BM25, the paper's reference rows (RAG k = 20 / 50, Hybrid k = 5 / 20 / 50; see
``memsteer_dspy.systems.reference`` for what k means), the Oracle (gold evidence as the context:
an upper bound), any design given with ``--design`` (e.g. the best MemSteer-Opt designs of
``experiments/results/search_compare.md``, saved under ``experiments/configs/designs/``), and the
third-party memory systems asked for with ``--system`` (each through its own package, behind an
adapter in ``memsteer_dspy.systems``).

Every row is scored retrieval-only (no LM): R@10 and delivered recall per official item, as-of
protocol (no record dated on or after the question date can be retrieved), RHELM with external
sources. Differences are paired by item against Base-BM25 and against the ``--against`` design
(default: the first ``--design``), with 95% paired-bootstrap intervals (1,000 resamples, seed 0),
on all official items and on the held-out test split (the items the 40/20 official split of
``search_compare.py`` leaves out: the only items an optimized design never selected on).

    python experiments/systems.py --design experiments/configs/designs/opt-hill-bm25.json --out runs/systems
    python experiments/systems.py --persona Elena_Morales --system mempalace --out runs/systems-mp

Writes ``results.md`` (the tables), ``results.json`` and ``items.jsonl`` (one line per row,
persona and item) into ``--out``. Indexes are cached per history fingerprint (``--cache-dir``,
default the CLI's), so a rerun only scores.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_rhelm_args, resolve_rhelm_args, safe_name  # noqa: E402

import memsteer_dspy.memory.embedders as embedders  # noqa: E402
from memsteer_dspy.errors import ConfigError  # noqa: E402
from memsteer_dspy.evaluation import evaluate_design  # noqa: E402
from memsteer_dspy.loaders.rhelm import list_personas, load_rhelm  # noqa: E402
from memsteer_dspy.memory import MemoryDesign, MemorySystem  # noqa: E402
from memsteer_dspy.memory.answer import ANSWER_PROGRAM_VERSION  # noqa: E402
from memsteer_dspy.optimize.splits import official_test  # noqa: E402
from memsteer_dspy.runfolder import lm_identity  # noqa: E402
from memsteer_dspy.stats import paired_comparison, points, points_ci  # noqa: E402
from memsteer_dspy.systems import OracleSystem, record_store, reference_rows  # noqa: E402

METRICS = ("recall_at_10", "delivered_recall")
BASE = "base-bm25"
SYSTEMS = ("mempalace", "mem0", "a-mem")
LLM_SYSTEMS = ("mem0", "a-mem")  # their ingest calls an LLM: --llm-api-base, or the embedded one


class _QueryMemo:
    """One embedder per model for the whole run, each question embedded once: the rows share
    the packaged MiniLM and the same questions, so only the first dense row pays for them."""

    def __init__(self, inner: Any):
        self.inner = inner
        self._vectors: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def encode(self, texts: list[str], *, is_query: bool = False):
        if not is_query:
            return self.inner.encode(texts)
        missing = [t for t in dict.fromkeys(texts) if t not in self._vectors]
        if missing:
            self._vectors.update(
                zip(missing, self.inner.encode(missing, is_query=True), strict=True)
            )
        return np.stack([self._vectors[t] for t in texts])


def _share_embedders() -> None:
    load = embedders.load_embedder
    loaded: dict[tuple, _QueryMemo] = {}

    def shared(embedder: str, **kwargs: Any) -> _QueryMemo:
        key = (embedder, *sorted(kwargs.items()))
        if key not in loaded:
            loaded[key] = _QueryMemo(load(embedder, **kwargs))
        return loaded[key]

    embedders.load_embedder = shared


def _builders(args, designs: list[MemoryDesign]) -> list[tuple[str, Any]]:
    """(row name, build(history, items, cache_dir) -> system) in table order."""
    rows: list[tuple[str, Any]] = [(BASE, MemoryDesign.base_bm25())]
    budgets = ["k", "fixed"] if args.budget == "both" else [args.budget]
    for b in budgets:
        rows += [(d.name, d) for d in reference_rows(b)]
    rows += [(d.name, d) for d in designs]
    rows.append(("oracle", "oracle"))
    for s in args.system:
        rows.append((s, s))
    return rows


def _build(spec: Any, history, items, cache_dir, llm: dict[str, Any] | None = None, answerer=None):
    """The row's system over ``history`` (answering with ``answerer`` when given); for an LLM
    system, None while its ingest is unfinished (``--ingest-budget-s`` ran out: a rerun goes on
    where it stopped)."""
    system = _open(spec, history, items, cache_dir, llm, answerer)
    if system is not None and answerer is not None and not isinstance(system, MemorySystem):
        system.answerer.lm = answerer  # an external system answers with the same program
    return system


def _open(spec: Any, history, items, cache_dir, llm: dict[str, Any] | None, answerer=None):
    if isinstance(spec, MemoryDesign):
        lms = {"answerer": answerer} if answerer is not None else None
        return MemorySystem.from_design(spec, history, cache_dir=cache_dir, lms=lms)
    if spec == "oracle":
        return OracleSystem(history, items, store=record_store(history, cache_dir))
    if spec == "mempalace":
        from memsteer_dspy.systems.mempalace_adapter import MemPalaceSystem

        return MemPalaceSystem.open(history, cache_dir=cache_dir)
    if spec in LLM_SYSTEMS:
        assert llm is not None
        if spec == "mem0":
            from memsteer_dspy.systems.mem0_adapter import Mem0System as Adapter
        else:
            from memsteer_dspy.systems.amem_adapter import AMemSystem as Adapter
        opts = {k: v for k, v in llm.items() if k != "schema_form" or spec == "a-mem"}
        system = Adapter.open(history, cache_dir=cache_dir, log=print, **opts)
        info = system.build_info
        done = info.get("notes", info.get("batches"))
        print(f"{spec} ingest of {history.user_id}: {done} in memory, {info}", flush=True)
        return system if info.get("complete", True) else None
    raise SystemExit(f"unknown system {spec!r} (known: {', '.join(SYSTEMS)})")


def _compare(a: dict[str, list], b: dict[str, list]) -> dict[str, Any]:
    cmp = paired_comparison(a, b, "delivered_recall")
    return {"n": cmp.n, "diff": cmp.diff, "ci95": cmp.ci95}


def _table(rows: list[dict[str, Any]], against: str | None) -> str:
    head = ["row", "n", "R@10", "ΔR@10 vs Base [95% CI]", "delivered", "Δdeliv. vs Base [95% CI]"]
    if against:
        head += [f"ΔR@10 vs {against} [95% CI]", f"Δdeliv. vs {against} [95% CI]"]
    head += ["mean ctx tokens", "build s", "score s", "LM calls", "tokens"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["row"], str(r["n"]), f"{100 * r['recall_at_10']:.1f}"]
        vb = r["vs_base"]
        cells += [
            f"{points(vb['diff']['recall_at_10'])} {points_ci(vb['ci95']['recall_at_10'])}",
            f"{100 * r['delivered_recall']:.1f}",
            f"{points(vb['diff']['delivered_recall'])} {points_ci(vb['ci95']['delivered_recall'])}",
        ]
        if against:
            va = r["vs_against"]
            cells += [f"{points(va['diff'][m])} {points_ci(va['ci95'][m])}" for m in METRICS]
        cells += [
            f"{r['context_tokens']:,.0f}",
            *(_num(r[c]) for c in ("build_s", "score_s", "lm_calls", "tokens")),
        ]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:,.0f}"


def _rows(per_item: dict[str, dict[str, dict]], ids: list[str], names: list[str], costs, against):
    def vec(name: str, m: str) -> list:
        return [per_item[name][i][m] if i in per_item[name] else None for i in ids]

    out = []
    base = {m: vec(BASE, m) for m in METRICS}
    ref = {m: vec(against, m) for m in METRICS} if against else None
    for name in names:
        mine = {m: vec(name, m) for m in METRICS}
        vb = _compare(base, mine)
        ctx = [per_item[name][i]["context_tokens"] for i in ids if i in per_item[name]]
        out.append(
            {
                "row": name,
                "n": len([i for i in ids if i in per_item[name]]),
                **{m: _mean(mine[m]) for m in METRICS},
                "vs_base": vb,
                "vs_against": _compare(ref, mine) if ref else None,
                "context_tokens": sum(ctx) / len(ctx) if ctx else 0.0,
                **costs[name],
            }
        )
    return out


def _mean(v: list) -> float:
    vals = [x for x in v if x is not None]
    return sum(vals) / len(vals) if vals else 0.0


def tables_from_items(
    path: Path, against: str | None, seed: int = 0, root: Path | None = None
) -> str:
    """The tables of a run's ``items.jsonl`` — also of a run stopped part-way: only personas every
    row finished are compared (the paired intervals need the same items under every row)."""
    per_item: dict[str, dict[str, dict]] = {}
    personas: dict[str, set[str]] = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        item = per_item.setdefault(r["row"], {}).setdefault(f"{r['persona']}/{r['qa_id']}", {})
        item.update(r.get("answered") or r)  # an answered line adds accuracy to the item's scores
        personas.setdefault(r["persona"], set()).add(r["row"])
    names = list(per_item)
    done = [p for p, rows in personas.items() if rows == set(names)]
    ids = [i for i in per_item[BASE] if i.split("/", 1)[0] in done]
    test: list[str] = []
    for p in done:
        loaded = load_rhelm(root, p, external=True)
        test += [f"{p}/{q.id}" for q in official_test(loaded.qa_items, seed=seed)]
    costs = {
        n: dict.fromkeys(("build_s", "score_s", "lm_calls", "tokens")) for n in names
    }  # not logged per item
    out = [f"Personas: {', '.join(done)}\n"]
    for title, sub in (("all official items", ids), ("held-out test split", test)):
        out += [f"\n## {title}\n", _table(_rows(per_item, sub, names, costs, against), against), ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--persona", action="append", help="persona (repeatable; default all ten)")
    ap.add_argument(
        "--design", action="append", type=Path, default=[], help="a design JSON (repeatable)"
    )
    ap.add_argument(
        "--against", help="row the second Δ columns compare with (default: the first --design)"
    )
    ap.add_argument(
        "--system",
        action="append",
        default=[],
        choices=SYSTEMS,
        help="a third-party memory system (an extra; repeatable)",
    )
    ap.add_argument(
        "--budget",
        choices=["k", "fixed", "both"],
        default="k",
        help="reference rows: k units delivered (k), the 4,000-token budget (fixed), or both",
    )
    ap.add_argument("--no-reference", action="store_true", help="leave out the RAG/Hybrid rows")
    ap.add_argument(
        "--llm-api-base",
        help="mem0 / a-mem: an OpenAI-compatible URL for their LLM (default: the embedded model, "
        "served by llama.cpp for the run)",
    )
    ap.add_argument("--llm-model", default="qwen-server", help="the model name at --llm-api-base")
    ap.add_argument(
        "--llm-schema-form",
        choices=["json_object", "json_schema"],
        default=None,
        help="a-mem: how its JSON schema is sent (default: json_object for the embedded model's "
        "llama.cpp server, json_schema with --llm-api-base)",
    )
    ap.add_argument(
        "--batch", type=int, default=4, help="mem0 / a-mem: records per add() call (default 4)"
    )
    ap.add_argument(
        "--ingest-budget-s",
        type=float,
        default=None,
        help="mem0 / a-mem: stop adding to a memory after this many seconds per persona; the "
        "row is scored once its ingest is complete (a rerun resumes it)",
    )
    ap.add_argument("--seed", type=int, default=0, help="the official split's seed (test items)")
    ap.add_argument(
        "--accuracy-items",
        type=int,
        default=0,
        help="also answer and judge this many held-out items (stratified by question type and "
        "persona, seeded; the same items for every row) with the fixed answer program; each "
        "row's answers are a run folder under --out/answers that a rerun resumes",
    )
    ap.add_argument(
        "--config", type=Path, help="a memsteer TOML config for the answerer and judge LMs"
    )
    ap.add_argument(
        "--lm", help="one LM for the answerer and the judge (default: the embedded model)"
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--tables-only",
        action="store_true",
        help="only print the tables of --out/items.jsonl (a run stopped part-way)",
    )
    add_rhelm_args(ap)
    args = ap.parse_args(argv)
    root = resolve_rhelm_args(ap, args)
    if args.tables_only:
        against = args.against or (MemoryDesign.load(args.design[0]).name if args.design else None)
        print(tables_from_items(args.out / "items.jsonl", against, args.seed, root))
        return 0
    _share_embedders()
    designs = [MemoryDesign.load(p) for p in args.design]
    against = args.against or (designs[0].name if designs else None)
    builders = _builders(args, designs)
    if args.no_reference:
        keep = {BASE, "oracle", *(d.name for d in designs), *args.system}
        builders = [b for b in builders if b[0] in keep]
    names = [n for n, _ in builders]
    args.out.mkdir(parents=True, exist_ok=True)
    per_item: dict[str, dict[str, dict]] = {n: {} for n in names}
    costs = {n: {"build_s": 0.0, "score_s": 0.0, "lm_calls": 0, "tokens": 0} for n in names}
    all_ids: list[str] = []
    test_ids: list[str] = []
    t_all = time.perf_counter()
    answering = _answering(args, root) if args.accuracy_items else None
    with contextlib.ExitStack() as stack:
        llm = _llm(args, stack) if set(args.system) & set(LLM_SYSTEMS) else None
        unfinished = _score_all(
            args, root, builders, per_item, costs, all_ids, test_ids, llm, answering
        )
    if unfinished:
        print(
            f"not scored, their ingest is unfinished: {', '.join(sorted(unfinished))} "
            "(rerun the same command to go on)",
            flush=True,
        )
        names = [n for n in names if n not in unfinished]
    _report(args, root, names, per_item, costs, all_ids, test_ids, against, t_all, answering)
    return 0


def _llm(args, stack: contextlib.ExitStack) -> dict[str, Any]:
    """The LLM options of mem0 / a-mem: --llm-api-base, or the embedded model behind llama.cpp's
    server for the length of the run (stopped however the run ends)."""
    from memsteer_dspy.lm.serve import llm_endpoint

    opts: dict[str, Any] = {"batch": args.batch, "budget_s": args.ingest_budget_s}
    try:  # 16k tokens: an A-Mem evolution prompt holds the new note and five neighbours
        endpoint = llm_endpoint(
            stack,
            args.out / "llm-server",
            api_base=args.llm_api_base,
            model=args.llm_model,
            schema_form=args.llm_schema_form,
            n_ctx=16384,
        )
    except ConfigError as exc:  # the server extra is missing: say so, no traceback
        raise SystemExit(str(exc)) from None
    return {**opts, **endpoint}


def _answering(args, root) -> dict[str, Any]:
    """The answerer and judge LMs, and the accuracy sample: ``--accuracy-items`` of the held-out
    items of every persona, stratified by question type and persona (the cpu study's sampler)."""
    from _common import accuracy_sample, persona_of, with_persona

    from memsteer_dspy.lm import load_lm_config

    config = load_lm_config(args.config, lm=args.lm)
    held_out = []
    for persona in args.persona or list_personas(root):
        items = load_rhelm(root, persona, external=True).qa_items
        held_out += with_persona(official_test(items, seed=args.seed), persona)
    sample = accuracy_sample(held_out, args.accuracy_items, args.seed)
    answerer, judge = config.lm("answerer"), config.lm("judge")
    lms = {"answerer": lm_identity(answerer), "judge": lm_identity(judge)}
    return {
        "answerer": answerer,
        "judge": judge,
        "ids": {f"{persona_of(q)}/{q.id}" for q in sample},
        "tag": hashlib.sha256(json.dumps(lms, sort_keys=True).encode()).hexdigest()[:8],
        "describe": config.describe(),
    }


def _answer(args, system, name, persona, items, ids, answering) -> dict[str, dict]:
    """The row's answers to its share of the accuracy sample, judged; a run folder per (row,
    persona, LMs) under --out/answers that a rerun resumes (no LM call paid twice)."""
    mine = [q for q, i in zip(items, ids, strict=True) if i in answering["ids"]]
    if not mine:
        return {}
    folder = args.out / "answers" / f"{safe_name(name)}-{answering['tag']}" / safe_name(persona)
    rep = evaluate_design(
        system,
        mine,
        metrics="all",
        judge_lm=answering["judge"],
        protocol="as_of",
        out_dir=folder,
    )
    return {
        f"{persona}/{r.qa_id}": {
            "accuracy": None if r.error else float(bool(r.correct)),
            "exact": None if r.error else float(bool(r.exact)),
            "answer_error": r.error,
        }
        for r in rep.items
    }


def _score_all(
    args, root, builders, per_item, costs, all_ids, test_ids, llm, answering=None
) -> set[str]:
    """Score every row on every persona into ``per_item`` / ``costs`` and ``items.jsonl``; the
    names of the rows left unscored because an ingest is unfinished."""
    unfinished: set[str] = set()
    with (args.out / "items.jsonl").open("w", encoding="utf-8") as log:
        for persona in args.persona or list_personas(root):
            loaded = load_rhelm(root, persona, external=True)
            history, items = loaded.history, loaded.qa_items
            ids = [f"{persona}/{q.id}" for q in items]
            all_ids += ids
            test_ids += [f"{persona}/{q.id}" for q in official_test(items, seed=args.seed)]
            for name, spec in builders:
                t0 = time.perf_counter()
                answerer = answering["answerer"] if answering else None
                system = _build(spec, history, items, args.cache_dir, llm, answerer)
                t1 = time.perf_counter()
                if system is None:
                    unfinished.add(name)
                    continue
                rep = evaluate_design(system, items, metrics="recall", protocol="as_of")
                t2 = time.perf_counter()
                costs[name]["build_s"] += t1 - t0
                costs[name]["score_s"] += t2 - t1
                for key, value in getattr(system, "usage", dict)().items():
                    costs[name][key] += value
                errors = 0
                for i, r in zip(ids, rep.items, strict=True):
                    per_item[name][i] = {m: getattr(r, m) for m in METRICS}
                    per_item[name][i]["context_tokens"] = r.trace.context_tokens if r.trace else 0
                    errors += r.error is not None
                    log.write(
                        json.dumps(
                            {
                                "row": name,
                                "persona": persona,
                                "qa_id": r.qa_id,
                                **per_item[name][i],
                                "error": r.error,
                            }
                        )
                        + "\n"
                    )
                if answering:
                    answered = _answer(args, system, name, persona, items, ids, answering)
                    for i, scores in answered.items():
                        per_item[name][i].update(scores)
                        log.write(
                            json.dumps(
                                {
                                    "row": name,
                                    "persona": persona,
                                    "qa_id": i.split("/", 1)[1],
                                    "answered": scores,
                                }
                            )
                            + "\n"
                        )
                print(
                    f"{persona:30s} {name:26s} n={len(items)} R@10 {100 * (rep.summary.recall_at_10 or 0):.1f} "
                    f"deliv {100 * (rep.summary.delivered_recall or 0):.1f} errors {errors} "
                    f"build {t1 - t0:.0f}s score {t2 - t1:.0f}s",
                    flush=True,
                )
                if hasattr(system, "close"):
                    system.close()
                del system
    return unfinished


def _accuracy_rows(per_item, ids: list[str], names: list[str]) -> list[dict[str, Any]]:
    """Per row on the accuracy sample: accuracy (judge) with its 95% Wilson interval, exact
    agreement, items whose answering failed, and the paired difference from Base-BM25."""
    from scipy.stats import binomtest

    def vec(name: str, m: str) -> list:
        return [per_item[name].get(i, {}).get(m) for i in ids]

    base = {m: vec(BASE, m) for m in ("accuracy", "exact")}
    out = []
    for name in names:
        mine = {m: vec(name, m) for m in ("accuracy", "exact")}
        done = [x for x in mine["accuracy"] if x is not None]
        k, n = int(sum(done)), len(done)
        ci = binomtest(k, n).proportion_ci(method="wilson") if n else None
        cmp = paired_comparison(base, mine, "accuracy")
        out.append(
            {
                "row": name,
                "n": n,
                "failed": len(ids) - n,
                "accuracy": k / n if n else None,
                "wilson95": [ci.low, ci.high] if ci else None,
                "exact": _mean(mine["exact"]),
                "vs_base": {"diff": cmp.diff.get("accuracy"), "ci95": cmp.ci95.get("accuracy")},
            }
        )
    return out


def _accuracy_table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| row | answered | failed | accuracy [95% Wilson] | exact agreement | Δ vs Base [95% CI] |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        acc = "–" if r["accuracy"] is None else f"{100 * r['accuracy']:.1f}"
        ci = r["wilson95"]
        acc += f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]" if ci else ""
        d = r["vs_base"]
        out.append(
            f"| {r['row']} | {r['n']} | {r['failed']} | {acc} | {100 * r['exact']:.1f} | "
            f"{points(d['diff'])} {points_ci(d['ci95'])} |"
        )
    return "\n".join(out)


def _report(
    args, root, names, per_item, costs, all_ids, test_ids, against, t_all, answering=None
) -> None:
    tables = {
        "all official items": _rows(per_item, all_ids, names, costs, against),
        "held-out test split": _rows(per_item, test_ids, names, costs, against),
    }
    accuracy = None
    if answering:
        sample = [i for i in test_ids if i in answering["ids"]]
        accuracy = _accuracy_rows(per_item, sample, names)
    wall = time.perf_counter() - t_all
    meta = {
        "personas": args.persona or list_personas(root),
        "designs": [str(p) for p in args.design],
        "against": against,
        "budget": args.budget,
        "seed": args.seed,
        "wall_s": round(wall, 1),
        "machine": platform.processor() or platform.machine(),
        "argv": sys.argv[1:],
    }
    (args.out / "results.json").write_text(
        json.dumps({"meta": meta, "tables": tables, "accuracy": accuracy}, indent=2) + "\n"
    )
    md = [
        f"# Systems side by side\n\n`python experiments/systems.py {' '.join(sys.argv[1:])}` — "
        f"{len(meta['personas'])} persona(s), wall {wall:,.0f} s. Build/score seconds summed over personas; "
        "LM calls and tokens of building and retrieval (for mem0 and a-mem: their ingest, all "
        "sessions).\n"
    ]
    for title, rows in tables.items():
        md += [f"\n## {title}\n", _table(rows, against), ""]
    if accuracy is not None:
        md += [
            f"\n## accuracy on {len(answering['ids'])} held-out items (stratified; the same for every row)\n",
            f"Answerer and judge: {answering['describe']}; the fixed answer program "
            f"(`memsteer_dspy.memory.answer`, version {ANSWER_PROGRAM_VERSION}).\n",
            _accuracy_table(accuracy),
            "",
        ]
    (args.out / "results.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    sys.exit(main())
