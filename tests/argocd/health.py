"""Runs Argo CD health Lua against objects, the way Argo CD's resource customizations do.

Usage: python health.py SCRIPT.lua < objects.jsonl > health.jsonl
Each input line is {"name": ..., "object": {...}}; each output line is
{"name": ..., "status": ..., "message": ...}. Lua comes from lupa (PyPI), an embedded Lua 5.4.
"""

import json
import sys

from lupa import LuaRuntime


def main() -> None:
    script = open(sys.argv[1], encoding="utf-8").read()
    lua = LuaRuntime(unpack_returned_tuples=True)
    # Argo CD gives the script the object as the global `obj` and reads the table it returns.
    health = lua.eval(
        "function(o, chunk) obj = o; local f = assert(load(chunk, 'health.lua')); return f() end"
    )
    for line in sys.stdin:
        if not line.strip():
            continue
        case = json.loads(line)
        table = lua.table_from(case["object"], recursive=True)
        result = health(table, script)
        print(json.dumps({
            "name": case["name"],
            "status": result["status"],
            "message": result["message"],
        }), flush=True)


if __name__ == "__main__":
    main()
