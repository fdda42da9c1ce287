"""Merge a pytest --junitxml run into tests/durations.txt (what tests/conftest.py marks slow and heavy by).

    .venv/bin/python -m pytest -n 2 -q -m "not slow" --junitxml=/tmp/j.xml
    python3 .ci/durations.py /tmp/j.xml

Tests measured in the run take their new time (listed from KEEP_FROM seconds); listed tests the run did not
measure (the long tier's) keep theirs. The times are the call phase on 2 cores, as CI has.
"""
import os
import sys
import xml.etree.ElementTree as ET

KEEP_FROM = 3.0
HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "durations.txt")


def nodeid(classname: str, name: str) -> str | None:
    """junit's dotted classname back to pytest's node id (a class inside a module stays `::Class`)."""
    parts = classname.split(".")
    for k in range(len(parts), 0, -1):
        path = "/".join(parts[:k]) + ".py"
        if os.path.exists(os.path.join(os.path.dirname(HERE), "..", path)):
            return path + "".join("::" + p for p in parts[k:]) + "::" + name
    return None


def main(xml: str) -> None:
    header, old = [], {}
    for line in open(HERE):
        if line.startswith("#"):
            header.append(line)
        elif len(p := line.split()) == 2:
            old[p[1]] = float(p[0])
    new = {}
    for tc in ET.parse(xml).getroot().iter("testcase"):
        if (i := nodeid(tc.get("classname"), tc.get("name"))) is not None:
            new[i] = float(tc.get("time"))
    merged = {k: v for k, v in old.items() if k not in new}
    merged.update({k: v for k, v in new.items() if v >= KEEP_FROM})
    with open(HERE, "w") as f:
        f.writelines(header)
        f.writelines(f"{v:.2f} {k}\n" for k, v in sorted(merged.items(), key=lambda kv: -kv[1]))
    print(f"{len(new)} tests measured, {len(merged)} listed in {os.path.normpath(HERE)}")


if __name__ == "__main__":
    main(sys.argv[1])
