"""Print the fuzzing report (tests/fuzz/report.py) at the end of the session."""
import os

from fuzz import report


def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "workerinput"):
        return
    d = report.run_dir(controller=True)
    text = report.summary(d)
    if text:
        terminalreporter.write_sep("-", "fuzz report")
        terminalreporter.write_line(text)
        terminalreporter.write_line(f"  (written to {os.path.join(d, 'report.txt')})")
