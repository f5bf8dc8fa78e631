#!/usr/bin/env python3
"""Usage: delete_all.py [N] [yjs|loro ...]. Issue 13 workload on Yjs (pycrdt) and Loro: three devices create N records (a map of three
fields each), sync, delete every record, sync; prints the full-state bytes of one replica
after deleting everything, beside an empty document's. Run by Benchmarks/compare/run.sh."""
import json, sys, time

N = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
DEVICES = 3


def rec(i):
    return {"name": f"shift {i}", "start": 1_700_000_000 + i, "minutes": 480}


def yjs():
    import pycrdt
    docs = [pycrdt.Doc(client_id=i + 1) for i in range(DEVICES)]
    maps = [d.get("records", type=pycrdt.Map) for d in docs]
    empty = len(pycrdt.Doc(client_id=99).get_update())
    for dev in range(DEVICES):
        with docs[dev].transaction():
            for i in range(dev, N, DEVICES):
                maps[dev][f"{i:08d}"] = pycrdt.Map(rec(i))

    def sync():
        for a in docs:
            for b in docs:
                if a is not b:
                    b.apply_update(a.get_update(b.get_state()))
    sync()
    created = len(docs[0].get_update())
    for dev in range(DEVICES):
        with docs[dev].transaction():
            for i in range(dev, N, DEVICES):
                del maps[dev][f"{i:08d}"]
    sync()
    assert len(maps[0]) == 0 and len(maps[2]) == 0
    return {"system": f"Yjs (pycrdt {pycrdt.__version__ if hasattr(pycrdt, '__version__') else ''})".replace(" )", ")"),
            "empty": empty, "created": created, "deleted": len(docs[0].get_update())}


def loro():
    import loro
    docs = [loro.LoroDoc() for _ in range(DEVICES)]  # random peer IDs
    empty = len(loro.LoroDoc().export(loro.ExportMode.Snapshot()))
    for dev in range(DEVICES):
        m = docs[dev].get_map("records")
        for i in range(dev, N, DEVICES):
            child = m.insert_container(f"{i:08d}", loro.LoroMap())
            for k, v in rec(i).items():
                child.insert(k, v)
        docs[dev].commit()

    def sync():
        for a in docs:
            for b in docs:
                if a is not b:
                    b.import_(a.export(loro.ExportMode.Updates(b.oplog_vv)))
    sync()
    created = len(docs[0].export(loro.ExportMode.Snapshot()))
    for dev in range(DEVICES):
        m = docs[dev].get_map("records")
        for i in range(dev, N, DEVICES):
            m.delete(f"{i:08d}")
        docs[dev].commit()
    sync()
    assert docs[0].get_map("records").is_empty()
    out = {"system": "Loro (loro 1.17.1)", "empty": empty, "created": created,
           "deleted": len(docs[0].export(loro.ExportMode.Snapshot()))}
    try:  # a shallow snapshot drops history before the given frontiers
        out["deleted_shallow"] = len(docs[0].export(loro.ExportMode.ShallowSnapshot(docs[0].state_frontiers)))
    except Exception as e:  # noqa: BLE001
        out["deleted_shallow_error"] = f"{type(e).__name__}: {e}"[:160]
    return out


ONLY = sys.argv[2:]  # optional: run only these ("yjs", "loro")
for fn in (yjs, loro):
    if ONLY and fn.__name__ not in ONLY:
        continue
    t = time.monotonic()
    try:
        r = fn()
    except Exception as e:  # noqa: BLE001
        r = {"system": fn.__name__, "error": f"{type(e).__name__}: {e}"[:300]}
    r["seconds"] = round(time.monotonic() - t, 1)
    r["records"] = N
    print(json.dumps(r), flush=True)
