"""How ``memsteer batch`` scales with workers, and what one user task costs on top of its command.

Usage::

    python benchmarks/batch_scale.py                        # 8 users, 0.2 s per LM call, 1/2/4 workers
    python benchmarks/batch_scale.py --users 16 --latency 0.5 --workers 1 2 4 8
    python benchmarks/batch_scale.py --ray                  # also a local Ray cluster (4 CPUs)

Each synthetic user has a history of ``--records`` records (threads of turns with Zipf
vocabulary) and ``--items`` QA items whose answers lie in one record. The batch runs
``memsteer evaluate --metrics all`` per user with a scripted LM that waits ``--latency`` seconds per
call (an API LM's round trip), answers "unknown" and judges it wrong, so every item costs two calls.
Printed, all measured in this one run: wall time and users/s for each worker count with the ratio
to one worker (the ideal is the worker count: the per-user work is LM waiting), and the overhead per
task — a batch of the same users with no LM latency on one worker, minus the same commands run back
to back without the batch layer, divided by the users. Writes only into a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dspy.lm15 import Message, Response, Usage  # noqa: E402

import memsteer_dspy.lm as lm_pkg  # noqa: E402
from memsteer_dspy.batch import LocalExecutor, build_tasks, run_batch  # noqa: E402
from memsteer_dspy.batch.task import invoke_command, routed_output  # noqa: E402
from memsteer_dspy.lm import LMConfig  # noqa: E402
from memsteer_dspy.lm.config import RoleLM  # noqa: E402
from memsteer_dspy.records import QAItem, Record  # noqa: E402


class FixedLatencyEngine:
    """Waits ``latency`` seconds per call; the answerer says "unknown", the judge "wrong"."""

    supports_response_schema = True
    supported_params = frozenset({"temperature", "max_tokens", "response_format", "seed"})

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.calls = 0
        self._lock = threading.Lock()

    def complete(self, request):
        # the answerer and judge run under DSPy's JSONAdapter: a JSON object of the output fields
        text = request.messages[0].text if request.messages else ""
        judge = "`correct`" in str(request.system) or "`correct`" in text
        text = json.dumps({"correct": False} if judge else {"answer": "unknown"})
        time.sleep(self.latency)
        with self._lock:
            self.calls += 1
        return Response(
            id=None,
            model="fixed-latency",
            message=Message.assistant(text),
            finish_reason="stop",
            usage=Usage(input_tokens=100, output_tokens=5, total_tokens=105),
        )


def install_lm(engine: FixedLatencyEngine) -> None:
    def load(*_a, **_k):
        cfg = LMConfig.uniform("openai/fixed-latency")
        meter = cfg.meter
        for role in cfg.roles:
            lm = RoleLM(
                "scripted/fixed", role=role, meter=meter, engine=engine, num_retries=0, cache=False
            )
            cfg.set_lm(role, lm)
        return cfg

    lm_pkg.load_lm_config = load


def write_users(root: Path, users: int, records: int, items: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(3000)]
    weights = [1.0 / (i + 1) for i in range(len(vocab))]
    names = []
    for u in range(users):
        name = f"user{u:03d}"
        folder = root / name
        folder.mkdir(parents=True)
        start = datetime(2024, 1, 1)
        recs = []
        for i in range(records):
            words = " ".join(rng.choices(vocab, weights, k=30))
            recs.append(
                Record(
                    id=f"t{i // 8}:{i % 8}",
                    kind="conversation_turn",
                    thread_id=f"t{i // 8}",
                    position=i % 8,
                    timestamp=start + timedelta(hours=i),
                    text=f"User: {words} code{u}x{i}.",
                )
            )
        qa = [
            QAItem(
                id=f"{name}-q{k}",
                question=f"What is the code of {recs[j].text.split()[3]}?",
                answer=f"code{u}x{j}",
                evidence_ids=[recs[j].id],
            )
            for k, j in enumerate(rng.sample(range(records), items))
        ]
        (folder / "records.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in recs))
        (folder / "qa.jsonl").write_text("".join(q.to_json() + "\n" for q in qa))
        names.append(name)
    return names


def tasks_for(root: Path, users: list[str], out: Path):
    return build_tasks(
        "evaluate",
        users,
        out,
        format="jsonl",
        path=root,
        extra=["--qa", str(root / "{user}" / "qa.jsonl"), "--no-cache"],
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--records", type=int, default=200)
    ap.add_argument("--items", type=int, default=4)
    ap.add_argument("--latency", type=float, default=0.2, help="seconds per scripted LM call")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--ray", action="store_true", help="also run on a local Ray cluster (4 CPUs)")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    tmp = Path(tempfile.mkdtemp(prefix="memsteer-batch-scale-"))
    users = write_users(tmp / "users", args.users, args.records, args.items)
    engine = FixedLatencyEngine(args.latency)
    install_lm(engine)
    calls_per_user = 2 * args.items
    print(
        f"{args.users} users x {args.items} items ({calls_per_user} LM calls of {args.latency:.2f} s each per user), "
        f"{args.records} records each; memsteer evaluate --metrics all per user"
    )

    # overhead per task: the batch layer vs the same commands back to back, no LM latency
    engine.latency = 0.0
    with open("/dev/null", "w") as devnull, routed_output(devnull, devnull):
        for t in tasks_for(tmp / "users", users[:1], tmp / "warm-up"):  # imports, first index build
            invoke_command(list(t.argv))
        t0 = time.perf_counter()
        for t in tasks_for(tmp / "users", users, tmp / "direct"):
            code, err = invoke_command(list(t.argv))
            assert code == 0, err
        direct = time.perf_counter() - t0
    t0 = time.perf_counter()
    summary = run_batch(
        tasks_for(tmp / "users", users, tmp / "overhead"), LocalExecutor(1), progress=False
    )
    batched = time.perf_counter() - t0
    assert summary["statuses"] == {"ok": args.users}, summary["statuses"]
    print(
        f"\ncommands back to back: {direct:.2f} s; as a batch on 1 worker: {batched:.2f} s; "
        f"overhead per task {1000 * (batched - direct) / args.users:.1f} ms"
    )

    engine.latency = args.latency
    rows = []
    for w in args.workers:
        t0 = time.perf_counter()
        summary = run_batch(
            tasks_for(tmp / "users", users, tmp / f"w{w}"), LocalExecutor(w), progress=False
        )
        wall = time.perf_counter() - t0
        assert summary["statuses"] == {"ok": args.users}, summary["statuses"]
        rows.append(("local", w, wall))
    if args.ray:
        import os

        import ray

        path = os.pathsep.join(
            [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
        )
        ray.init(
            num_cpus=4,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            runtime_env={
                "worker_process_setup_hook": "batch_scale.ray_worker_setup",
                "env_vars": {"PYTHONPATH": path, "BATCH_SCALE_LATENCY": str(args.latency)},
            },
        )
        from memsteer_dspy.batch import RayExecutor

        ex = RayExecutor()
        run_batch(
            tasks_for(tmp / "users", users[:4], tmp / "ray-warm"), ex, progress=False
        )  # start the workers
        t0 = time.perf_counter()
        summary = run_batch(tasks_for(tmp / "users", users, tmp / "ray"), ex, progress=False)
        rows.append(("ray", 4, time.perf_counter() - t0))
        assert summary["statuses"] == {"ok": args.users}, summary["statuses"]
        ray.shutdown()
    base = rows[0][2]
    ideal = args.users * calls_per_user * args.latency
    print(
        f"\n{'executor':<9} {'workers':>7} {'wall s':>8} {'users/s':>8} {'vs 1 worker':>12}   (LM wait alone: {ideal:.1f} s on one worker)"
    )
    for name, w, wall in rows:
        print(f"{name:<9} {w:>7} {wall:>8.2f} {args.users / wall:>8.2f} {base / wall:>11.2f}x")
    print(f"\nscratch folder: {tmp}")


def ray_worker_setup() -> None:
    """worker_process_setup_hook of the --ray run: the same scripted LM in each worker."""
    import os

    install_lm(FixedLatencyEngine(float(os.environ.get("BATCH_SCALE_LATENCY", "0.2"))))


if __name__ == "__main__":
    main()
