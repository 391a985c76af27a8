#!/usr/bin/env python3
"""Reads a JUnit XML report with junitparser (a maintained JUnit/xUnit reader, not gpuval's
code) and prints what a CI system would take from it, as JSON: each suite with its counts and
each test case with its results (failure, error, skipped: type and message).

    junit-read.py REPORT.xml
"""
import json
import sys

from junitparser import JUnitXml, TestSuite


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    xml = JUnitXml.fromfile(sys.argv[1])
    suites = [xml] if isinstance(xml, TestSuite) else list(xml)
    out = []
    for suite in suites:
        cases = []
        for case in suite:
            cases.append({
                "classname": case.classname,
                "name": case.name,
                "results": [
                    {"kind": type(r).__name__.lower(), "type": r.type, "message": r.message}
                    for r in case.result
                ],
            })
        out.append({
            "name": suite.name,
            "tests": suite.tests,
            "failures": suite.failures,
            "errors": suite.errors,
            "skipped": suite.skipped,
            "cases": cases,
        })
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
