#!/usr/bin/env python3
"""Runs an Argo CD Lua health check on objects, the way Argo CD calls it.

Usage: argocd-health.py HEALTH.lua < objects.json  (a JSON list of Kubernetes objects)
Prints a JSON list with one {"status", "message"} per object. The script runs in Lua 5.1 (the
dialect of Argo CD's interpreter) from the lupa package, with the object as the global `obj`,
JSON null as nil and arrays as 1-based tables; whatever the chunk returns is the answer.
"""
import json
import sys

import lupa.lua51 as lua51


def to_lua(runtime, value):
    if isinstance(value, dict):
        table = runtime.table()
        for k, v in value.items():
            if v is not None:
                table[k] = to_lua(runtime, v)
        return table
    if isinstance(value, list):
        table = runtime.table()
        for i, v in enumerate(value, start=1):
            table[i] = to_lua(runtime, v)
        return table
    return value


def main():
    script = open(sys.argv[1], encoding="utf-8").read()
    objects = json.load(sys.stdin)
    answers = []
    for obj in objects:
        runtime = lua51.LuaRuntime(unpack_returned_tuples=True)
        runtime.globals().obj = to_lua(runtime, obj)
        chunk = runtime.execute(script)
        if chunk is None:
            raise SystemExit("the health script returned nothing")
        answers.append({"status": chunk["status"], "message": chunk["message"]})
    json.dump(answers, sys.stdout)


if __name__ == "__main__":
    main()
