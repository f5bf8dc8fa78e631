"""Automerge from PyPI (`automerge` 0.1.2, 2022) exposes only Doc(obj), Doc.json(), Doc.obj()
and Doc.merge(saved bytes): no edits to an existing document, no save, no sync messages. The
W2 and W3 shapes (edits on replicas, then exchanging what each lacks) cannot be written with it,
so this prints why instead of numbers."""
import json

try:
    from automerge import Doc

    api = sorted(name for name in dir(Doc) if not name.startswith("_"))
    reason = f"the PyPI binding exposes only Doc.{', Doc.'.join(api)}: no edit or sync API"
except ImportError as error:
    reason = f"not installed: {error}"
print(json.dumps({"library": "automerge", "unavailable": reason}))
