#!/usr/bin/env bash
# The public API check (issue 30, "a deliberate public API"); Scripts/test.sh runs it after the build.
#  1. Counts the public types an app sees through `import PeerSync`: PeerSync's own and those of
#     every module it re-exports (`@_exported import` in Sources/PeerSync/PeerSync.swift; for a
#     scoped one such as `@_exported import enum M.T`, just T). A type is a struct, class, actor,
#     enum or protocol, nested ones included (typealiases are not counted). The symbol graphs
#     come from the toolchain: `swift symbolgraph-extract` on the modules `swift build` made,
#     public symbols only.
#     Fails if the count is over the budget in docs/api-budget, or differs from the count written
#     there (update that line when the API deliberately shrinks or grows).
#  2. Fails if one of those types has no doc comment.
#  3. Fails if a library module other than PeerSyncNetwork imports NIO (the CLI, examples,
#     benchmarks and tests may).
# Needs only the toolchain and python3; with the build done (Scripts/test.sh builds first) it
# takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

status=0

echo "-- NIO only in PeerSyncNetwork"
nio=$(grep -rnE '^[[:space:]]*(@[_A-Za-z]+[[:space:]]+)*import[[:space:]]+(struct |class |enum |protocol |func |var |typealias )?_?NIO' \
        Sources/PeerSync*/ --include='*.swift' | grep -v '^Sources/PeerSyncNetwork/' || true)
if [ -n "$nio" ]; then
  echo "these library files import NIO; only PeerSyncNetwork may (move the code there):" >&2
  echo "$nio" >&2
  status=1
fi

echo "-- public types of \`import PeerSync\`"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# The search paths and C module maps the build used for a target that imports PeerSync (an
# example), so symbolgraph-extract loads exactly the modules the build made.
python3 - .build/debug.yaml >"$dir/flags" <<'EOF'
import re, sys
yaml = open(sys.argv[1]).read()
command = re.search(r'\n\s*"C\.example-settings-[^"]*\.module":', yaml)
if not command:
    sys.exit("api-check: no build plan in .build/debug.yaml; build first (swift build)")
line = yaml[yaml.find("args:", command.end()):]
args = re.findall(r'"((?:[^"\\]|\\.)*)"', line[:line.find("\n")])[1:]
flags, n = [], 0
while n < len(args):
    if args[n] in ("-I", "-target", "-sdk", "-Xcc"):
        flags += args[n:n + 2]
        n += 2
        continue
    if args[n].startswith("-I") or args[n].startswith("-fmodule-map-file"):
        flags.append(args[n])
    n += 1
print("\n".join(flags))
EOF
modules=$(sed -nE 's/^[[:space:]]*@_exported[[:space:]]+import[[:space:]]+([a-z]+[[:space:]]+)?([A-Za-z_]+).*/\2/p' Sources/PeerSync/PeerSync.swift | sort -u)
for module in PeerSync $modules; do
  if ! xargs -d '\n' swift symbolgraph-extract -module-name "$module" -minimum-access-level public -skip-synthesized-members \
         -module-cache-path "$dir/cache" -output-dir "$dir" <"$dir/flags" >"$dir/log" 2>&1; then
    cat "$dir/log" >&2
    echo "api-check: symbolgraph-extract failed for $module (is the build up to date?)" >&2
    exit 1
  fi
done

python3 - "$dir" Sources/PeerSync/PeerSync.swift docs/api-budget <<'EOF' || status=1
import json, pathlib, re, sys

graphs, umbrella, budget_file = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]

# Which modules (or single declarations) `import PeerSync` brings in.
modules = {"PeerSync": None}  # module -> None (all of it) or the set of top-level names re-exported
for line in open(umbrella):
    m = re.match(r"\s*@_exported\s+import\s+(?:(?:struct|class|enum|protocol|actor|typealias)\s+)?([\w]+)(?:\.(\w+))?", line)
    if not m:
        continue
    module, decl = m.group(1), m.group(2)
    if decl is None:
        modules[module] = None
    elif modules.get(module, set()) is not None:
        modules.setdefault(module, set()).add(decl)

kinds = {"swift.struct", "swift.class", "swift.actor", "swift.enum", "swift.protocol"}
types = {}  # precise identifier -> (qualified name, module, has doc comment)
for module, only in modules.items():
    files = [graphs / f"{module}.symbols.json"] + sorted(graphs.glob(f"{module}@*.symbols.json"))
    if not files[0].exists():
        print(f"api-check: no symbol graph for {module} in {graphs}", file=sys.stderr)
        sys.exit(1)
    for path in files:
        for symbol in json.load(open(path))["symbols"]:
            if symbol["kind"]["identifier"] not in kinds:
                continue
            names = symbol["pathComponents"]
            if only is not None and names[0] not in only:
                continue
            doc = symbol.get("docComment", {}).get("lines", [])
            documented = any(line.get("text", "").strip() for line in doc)
            types[symbol["identifier"]["precise"]] = (".".join(names), module, documented)

listing = sorted(types.values())
for name, module, documented in listing:
    print(f"   {module}.{name}" + ("" if documented else "   <- no doc comment"))
count = len(listing)

text = open(budget_file).read()
budget = int(re.search(r"^budget\s+(\d+)", text, re.M).group(1))
recorded = int(re.search(r"^current\s+(\d+)", text, re.M).group(1))
failed = False
undocumented = [name for name, _, documented in listing if not documented]
if undocumented:
    print(f"api-check: {len(undocumented)} public type(s) without a doc comment: {', '.join(undocumented)}", file=sys.stderr)
    failed = True
if count > budget:
    print(f"api-check: {count} public types, over the budget of {budget} ({budget_file}). Make the new ones "
          "`package` (the CLI, examples and tests still see them) or raise the budget deliberately.", file=sys.stderr)
    failed = True
elif count != recorded:
    print(f"api-check: {count} public types, but {budget_file} says {recorded}: update its `current` line.", file=sys.stderr)
    failed = True
print(f"   {count} public types (budget {budget}) from {', '.join(sorted(modules))}")
sys.exit(1 if failed else 0)
EOF

exit "$status"
