"""Runs every comparison (W3 merge in memory, W2 apply of one-field deltas) whose library is
installed, each in its own process; prints one JSON object per library and writes them to the
file given with --json. `pip install pycrdt loro automerge` installs them."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = [("pycrdt", "pycrdt_bench.py"), ("loro", "loro_bench.py"), ("automerge", "automerge_bench.py")]


def main():
    args = sys.argv[1:]
    quick = ["--quick"] if "--quick" in args else []
    out = args[args.index("--json") + 1] if "--json" in args else None
    results = []
    for name, script in SCRIPTS:
        try:
            __import__(name)
        except ImportError:
            results.append({"library": name, "unavailable": "not installed (pip install %s)" % name})
            print(json.dumps(results[-1]), flush=True)
            continue
        run = subprocess.run([sys.executable, os.path.join(HERE, script)] + quick,
                             capture_output=True, text=True, timeout=900, cwd=HERE)
        if run.returncode != 0:
            results.append({"library": name, "unavailable": "failed: " + run.stderr.strip().splitlines()[-1]})
        else:
            results.append(json.loads(run.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    if out:
        with open(out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
