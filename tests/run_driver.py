"""Runs one ``memsteer`` command in this process with deterministic scripted LMs, optionally
killing itself with SIGKILL at a chosen point — the subprocess half of the kill/resume suite.

    python tests/run_driver.py SCENARIO.json

The scenario names the CLI arguments (``argv``), the LM handlers (``lms``: ``generate`` or
``optimize``), an optional fault seed (``fault_seed``) and an optional ``kill``:

* ``{"at": "lm", "role": "planner", "n": 5}`` — SIGKILL inside the 5th call of that role's LM;
* ``{"at": "torn", "n": 3}`` — the 3rd append to a run log writes half its line, then SIGKILL;
* ``{"at": "replace", "n": 4}`` — SIGKILL at the 4th atomic rename (temporary written, target not
  yet replaced);
* ``{"at": "fsync", "n": 6}`` — SIGKILL at the 6th fsync (data written, not yet synced).

SIGKILL is sent by the process to itself at exactly that point: nothing (no ``finally``, no
atexit) runs after it, as with ``kill -9`` from outside, but the point is reproducible.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def install_kill(kill: dict | None) -> None:
    if not kill:
        return
    n = int(kill["n"])
    counter = {"k": 0}

    def hit() -> bool:
        counter["k"] += 1
        return counter["k"] == n

    at = kill["at"]
    if at == "torn":
        from memsteer_dspy import runfolder

        original = runfolder.JsonlLog.append

        def append(self, obj):
            if hit():
                line = obj if isinstance(obj, str) else json.dumps(obj)
                data = line.encode("utf-8")
                with open(self.path, "ab") as fh:
                    fh.write(data[: max(1, len(data) // 2)])
                    fh.flush()
                _die()
            return original(self, obj)

        runfolder.JsonlLog.append = append
    elif at == "replace":
        original_replace = os.replace

        def replace(src, dst, *a, **kw):
            if hit():
                _die()
            return original_replace(src, dst, *a, **kw)

        os.replace = replace
    elif at == "fsync":
        original_fsync = os.fsync

        def fsync(fd):
            if hit():
                _die()
            return original_fsync(fd)

        os.fsync = fsync
    elif at != "lm":
        raise SystemExit(f"unknown kill point {at!r}")


def main(path: str) -> int:
    scenario = json.loads(Path(path).read_text())
    import scripted_roles

    import memsteer_dspy.lm as lm_pkg

    lms = scripted_roles.role_lms(scenario["lms"], fault_seed=scenario.get("fault_seed"))
    kill = scenario.get("kill")
    if kill and kill["at"] == "lm":
        lm = lms[kill["role"]]
        inner = lm.reply_text
        count = {"k": 0}

        def reply_text(system, user):
            count["k"] += 1
            if count["k"] == int(kill["n"]):
                _die()
            return inner(system, user)

        lm.reply_text = reply_text

    lm_pkg.load_lm_config = scripted_roles.config_loader(lms)
    install_kill(kill)
    from memsteer_dspy.cli import app

    try:
        rc = app(scenario["argv"], standalone_mode=False)  # returns the exit status of typer.Exit
    except SystemExit as exc:
        return int(exc.code or 0)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
