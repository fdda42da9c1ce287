"""Test setup: verify every graph a pass emits; 8 host CPU devices for sharding tests."""
import os

os.environ.setdefault("JAXFORM_CHECK", "1")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()


def pytest_terminal_summary(terminalreporter, config):
    """Print the fuzzing report (tests/fuzz/report.py). Here, not in tests/fuzz/conftest.py: under
    pytest-xdist the controller does not collect, so it only loads the conftest files of its arguments."""
    if hasattr(config, "workerinput"):
        return
    from fuzz import report
    d = report.run_dir(controller=True)
    text = report.summary(d)
    if text:
        terminalreporter.write_sep("-", "fuzz report")
        terminalreporter.write_line(text)
        terminalreporter.write_line(f"  (written to {os.path.join(d, 'report.txt')})")
